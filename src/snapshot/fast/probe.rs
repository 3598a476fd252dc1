//! A chunk's memo base read from inside the chunk, without counting the MEMOIZEs before it.
//!
//! torch's trace pairs each `free_completed` with the `free_requested` before it at the same
//! address, and both dicts hold the same frames list object: the first writes it (`EMPTY_LIST
//! MEMOIZE ...`, the chunk's `k`-th MEMOIZE), the second fetches it (`BINGET g`). When both lie
//! in the chunk, its base is `g - k`. The probe is a guess that only saves a walk: the reader
//! checks it where the thread that counts from the front reaches the chunk, and reads the input
//! again the counted way when it is wrong.

use rustc_hash::FxHashMap;

use super::vm::memo_index;
use crate::pickle::opcodes as op;
use crate::pickle::scan::{op_len, Step};

/// Pairs that must agree before the probe gives a base.
const MIN_PAIRS: usize = 2;

/// What the probe keeps of a value on the pickle's stack.
#[derive(Clone, Copy)]
enum Item {
    /// A memo fetch, by memo index.
    Fetch(u32),
    /// An int, by its opcode's byte range (the same bytes are the same int).
    Int(usize, usize),
    /// An empty list and the chunk's MEMOIZE count when it was stored (`None`: not stored).
    List(Option<u32>),
    Dict,
    Other,
}

/// The memo base of the chunk `data[start..end]` from the frames lists its dicts store and
/// fetch again: `Some` when at least [`MIN_PAIRS`] pairs are found and all give the same base.
/// Dicts are matched on their second pair (the key fetched and the int's bytes: torch's
/// `addr`) and on the key of their last pair (`frames`).
pub fn memo_base(data: &[u8], start: usize, end: usize) -> Option<u32> {
    let data = data.get(..end)?;
    let mut stack: Vec<Item> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    // (second key, second value's bytes, last key) -> local memo index of the frames list.
    let mut stored: FxHashMap<(u32, &[u8], u32), u32> = FxHashMap::default();
    let mut base = None;
    let mut pairs = 0usize;
    let mut memos = 0u32;
    let mut pos = start;
    while pos < end {
        let Step::Len(n) = op_len(data, pos) else {
            return None;
        };
        let code = data[pos];
        // What the chunk began in the middle of (the probe starts with an empty stack) is
        // dropped whole: the dicts after it are complete.
        let mut lost = false;
        match code {
            op::MARK => marks.push(stack.len()),
            op::EMPTY_DICT => stack.push(Item::Dict),
            op::EMPTY_LIST => stack.push(Item::List(None)),
            op::MEMOIZE => {
                if let Some(Item::List(at @ None)) = stack.last_mut() {
                    *at = Some(memos);
                }
                memos = memos.checked_add(1)?;
            }
            op::BINGET | op::LONG_BINGET => stack.push(Item::Fetch(memo_index(data, pos)?.0)),
            op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                stack.push(Item::Int(pos, pos + n))
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let k = (code - op::TUPLE1 + 1) as usize;
                match stack.len().checked_sub(k) {
                    Some(at) if marks.last().is_none_or(|&m| m <= at) => {
                        stack.truncate(at);
                        stack.push(Item::Other);
                    }
                    _ => lost = true,
                }
            }
            op::APPEND | op::SETITEM => {
                let k = if code == op::APPEND { 1 } else { 2 };
                match stack.len().checked_sub(k) {
                    Some(at) if at > 0 && marks.last().is_none_or(|&m| m < at) => {
                        stack.truncate(at)
                    }
                    _ => lost = true,
                }
            }
            op::TUPLE | op::APPENDS | op::SETITEMS => match marks.pop() {
                Some(m) if code == op::TUPLE => {
                    stack.truncate(m);
                    stack.push(Item::Other);
                }
                Some(m) if m > 0 => {
                    if code == op::SETITEMS && matches!(stack[m - 1], Item::Dict) {
                        if let Some(b) = pair_base(data, &stack[m..], &mut stored) {
                            if base.is_some_and(|x| x != b) {
                                return None;
                            }
                            base = Some(b);
                            pairs += 1;
                        }
                    }
                    stack.truncate(m);
                }
                _ => lost = true,
            },
            op::FRAME | op::PROTO => {}
            op::STOP => break,
            _ => stack.push(Item::Other),
        }
        if lost {
            stack.clear();
            marks.clear();
        }
        pos += n;
    }
    base.filter(|_| pairs >= MIN_PAIRS)
}

/// The pairs of a dict (keys and values, in order): records its frames list when it stores
/// one, and gives the base when it fetches one recorded before.
fn pair_base<'d>(
    data: &'d [u8],
    items: &[Item],
    stored: &mut FxHashMap<(u32, &'d [u8], u32), u32>,
) -> Option<u32> {
    if items.len() < 4 || !items.len().is_multiple_of(2) {
        return None;
    }
    let (Item::Fetch(key), Item::Int(s, e)) = (items[2], items[3]) else {
        return None;
    };
    let Item::Fetch(last_key) = items[items.len() - 2] else {
        return None;
    };
    let id = (key, &data[s..e], last_key);
    match items[items.len() - 1] {
        Item::List(Some(k)) => {
            stored.insert(id, k);
            None
        }
        Item::Fetch(g) => g.checked_sub(*stored.get(&id)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pickle::scan;

    /// The probe's base against the counted one, for every chunk of one frame of a real
    /// fixture: never wrong where it gives one, and it gives one for most trace chunks.
    #[test]
    fn the_probe_gives_the_counted_base_or_none() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/real/notHanmin__assignment2-systems__memory_snapshot.pickle"
        );
        let data = std::fs::read(path).unwrap();
        let plan = scan::plan(&data, 1, &|p, b| crate::input::peek_slice(&data, p, b)).unwrap();
        let s = scan::scan(&data, plan, &|_, _| {}).unwrap();
        let mut found = 0;
        for c in &s.chunks {
            if let Some(b) = memo_base(&data, c.start, c.end) {
                assert_eq!(b, c.memo_base, "chunk at {}", c.start);
                found += 1;
            }
        }
        assert!(
            found * 2 > s.chunks.len(),
            "{found} of {} chunks",
            s.chunks.len()
        );
    }
}
