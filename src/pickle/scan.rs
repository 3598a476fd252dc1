//! Phase one of the parallel reader: cut a protocol 4/5 pickle into chunks at FRAME boundaries
//! (CPython's frames hold whole opcodes, ~64 KiB each) and walk the chunks' opcodes in parallel:
//! count MEMOIZE (a prefix sum then gives each chunk the memo index it starts at), find STOP or
//! the point where a cut file ends, and check that only plain-data opcodes occur.
//!
//! Anything this does not expect makes it return `None`; the caller then uses the sequential
//! reader, which gives the exact error or the result.

use rayon::prelude::*;

use super::opcodes as op;

/// A run of whole opcodes: one or more frames (the FRAME headers between them included).
#[derive(Clone, Debug)]
pub struct Chunk {
    pub start: usize,
    pub end: usize,
    /// Memo index assigned by the chunk's first MEMOIZE.
    pub memo_base: u32,
    pub memos: u32,
}

/// How the opcode stream ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Position of the STOP opcode.
    Stop(usize),
    /// The input ends before STOP: position of the first opcode that is not complete (the
    /// input length when it ends between opcodes).
    Truncated(usize),
}

#[derive(Clone, Debug)]
pub struct Scan {
    pub chunks: Vec<Chunk>,
    pub end: End,
}

/// One step of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Length of the opcode and its argument.
    Len(usize),
    /// The opcode or its argument runs past the end of the data.
    Cut,
    /// Not an opcode the parallel reader handles.
    Unsupported,
}

fn arg_len(data: &[u8], pos: usize, width: usize) -> Option<u64> {
    let b = data.get(pos + 1..pos + 1 + width)?;
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(b);
    Some(u64::from_le_bytes(v))
}

/// Length of the opcode at `pos` for the opcodes CPython writes for plain data.
#[inline]
pub fn op_len(data: &[u8], pos: usize) -> Step {
    let Some(&code) = data.get(pos) else {
        return Step::Cut;
    };
    let fixed = |n: usize| {
        if pos + n <= data.len() {
            Step::Len(n)
        } else {
            Step::Cut
        }
    };
    // Length-prefixed payloads: a length past the end of the data is a cut only when the
    // prefix itself is complete and plausible; the sequential reader words the other cases.
    let counted = |width: usize| match arg_len(data, pos, width) {
        None => Step::Cut,
        Some(n) => {
            // Saturating: an 8-byte length near 2^64 must not wrap to a short opcode.
            let total = n.saturating_add((1 + width) as u64);
            if (pos as u64).saturating_add(total) <= data.len() as u64 {
                Step::Len(total as usize)
            } else if width == 1 {
                Step::Cut
            } else {
                Step::Unsupported
            }
        }
    };
    match code {
        op::MARK
        | op::STOP
        | op::EMPTY_DICT
        | op::EMPTY_LIST
        | op::EMPTY_TUPLE
        | op::MEMOIZE
        | op::NONE
        | op::NEWTRUE
        | op::NEWFALSE
        | op::TUPLE
        | op::TUPLE1
        | op::TUPLE2
        | op::TUPLE3
        | op::APPEND
        | op::APPENDS
        | op::SETITEM
        | op::SETITEMS => Step::Len(1),
        op::BININT1 | op::BINGET | op::PROTO => fixed(2),
        op::BININT2 => fixed(3),
        op::BININT | op::LONG_BINGET => fixed(5),
        op::BINFLOAT | op::FRAME => fixed(9),
        op::LONG1 | op::SHORT_BINUNICODE => counted(1),
        op::BINUNICODE => counted(4),
        op::BINUNICODE8 => counted(8),
        _ => Step::Unsupported,
    }
}

/// What walking a range found.
#[derive(Clone, Copy, Debug, Default)]
pub struct Walk {
    /// MEMOIZE opcodes.
    pub memos: u32,
    /// Position of STOP, where the walk ended.
    pub stop: Option<usize>,
    /// Position of the first incomplete opcode.
    pub cut: Option<usize>,
    /// An opcode the parallel reader does not handle.
    pub unsupported: bool,
}

impl Walk {
    /// The range walked whole: no STOP, no cut, nothing the parallel reader does not handle.
    pub fn is_plain(&self) -> bool {
        !self.unsupported && self.stop.is_none() && self.cut.is_none()
    }
}

/// Opcode lengths for the walk's fast step: the low four bits are the length (1..=9), `VAR1`
/// set adds the byte after the opcode (one-byte length prefix); 0 = the careful step decides
/// (other variable lengths, STOP, PROTO, anything unsupported).
const VAR1: u8 = 0x80;
static FAST_LEN: [u8; 256] = {
    let mut t = [0u8; 256];
    let ones = [
        op::MARK,
        op::EMPTY_DICT,
        op::EMPTY_LIST,
        op::EMPTY_TUPLE,
        op::MEMOIZE,
        op::NONE,
        op::NEWTRUE,
        op::NEWFALSE,
        op::TUPLE,
        op::TUPLE1,
        op::TUPLE2,
        op::TUPLE3,
        op::APPEND,
        op::APPENDS,
        op::SETITEM,
        op::SETITEMS,
    ];
    let mut i = 0;
    while i < ones.len() {
        t[ones[i] as usize] = 1;
        i += 1;
    }
    t[op::BININT1 as usize] = 2;
    t[op::BINGET as usize] = 2;
    t[op::BININT2 as usize] = 3;
    t[op::BININT as usize] = 5;
    t[op::LONG_BINGET as usize] = 5;
    t[op::BINFLOAT as usize] = 9;
    t[op::FRAME as usize] = 9;
    t[op::LONG1 as usize] = VAR1 | 2;
    t[op::SHORT_BINUNICODE as usize] = VAR1 | 2;
    t
};

/// Length of an opcode with table entry `t` (not 0) whose next byte is `next`: without
/// branches on the opcode's kind (they mispredict on every other opcode).
#[inline(always)]
fn table_len(t: u8, next: u8) -> usize {
    (t & 0x0f) as usize + (t >> 7) as usize * next as usize
}

/// One walk in progress (several run interleaved: each step waits on the previous one's
/// length, so walking four chunks at once keeps the core busy).
struct Cursor {
    pos: usize,
    end: usize,
    w: Walk,
    done: bool,
    /// Position of the range in the group.
    slot: usize,
}

impl Cursor {
    #[inline(always)]
    fn step(&mut self, data: &[u8]) {
        let p = self.pos;
        if p + 9 < self.end {
            let c = data[p];
            let t = FAST_LEN[c as usize];
            let q = p + table_len(t, data[p + 1]);
            if t != 0 && q <= self.end {
                self.w.memos += (c == op::MEMOIZE) as u32;
                self.pos = q;
                return;
            }
        }
        self.careful(data);
    }

    /// What the walk checks beyond counting: STOP, a cut and opcodes outside the table. Stray
    /// FRAME and PROTO opcodes are the chunk machine's to refuse (it runs every chunk).
    #[cold]
    fn careful(&mut self, data: &[u8]) {
        let data = &data[..self.end];
        let pos = self.pos;
        if pos >= self.end {
            self.done = true;
            return;
        }
        match op_len(data, pos) {
            Step::Len(n) => {
                match data[pos] {
                    op::MEMOIZE => self.w.memos += 1,
                    op::STOP => {
                        self.w.stop = Some(pos);
                        self.done = true;
                    }
                    _ => {}
                }
                self.pos = pos + n;
            }
            Step::Cut => {
                self.w.cut = Some(pos);
                self.done = true;
            }
            Step::Unsupported => {
                self.w.unsupported = true;
                self.done = true;
            }
        }
    }
}

/// Bytes the fast loop keeps clear of a range's end: an opcode with a one-byte length prefix
/// is at most 2 + 255 bytes, and every fixed one at most 9.
const FAST_MARGIN: usize = 2 + 255 + 9;

/// How many walks run interleaved: each step waits on the previous one's length (two loads
/// in a row), so one walk alone leaves the core idle most of the time. Eight walk a MiB in
/// 0.38 ms where four took 0.44 (the helper's walk on notHanmin x280, 480-504 chunks in
/// 186-204 ms against 468-476 in 208-238 ms).
pub const LANES: usize = 8;

/// Steps between checks in [`fast_lanes`].
const UNROLL: usize = 4;
/// The longest opcode the table steps over: one with a one-byte length prefix.
const MAX_STEP: usize = 2 + 255;

/// Steps all cursors while each is clear of its end and at an opcode of the table; positions
/// stay in registers (through memory, every step would wait on a store). A cursor at an
/// opcode outside the table steps by 0 and so stays on it; the loop stops after `UNROLL` steps
/// when one does (checking every step costs a branch per cursor and step).
fn fast_lanes(data: &[u8], cs: &mut [Cursor]) {
    match cs.len() {
        0 => {}
        1 => fast_lanes_of::<1>(data, cs),
        2 => fast_lanes_of::<2>(data, cs),
        3 => fast_lanes_of::<3>(data, cs),
        4 => fast_lanes_of::<4>(data, cs),
        5 => fast_lanes_of::<5>(data, cs),
        6 => fast_lanes_of::<6>(data, cs),
        7 => fast_lanes_of::<7>(data, cs),
        _ => fast_lanes_of::<LANES>(data, &mut cs[..LANES]),
    }
}

/// [`fast_lanes`] for `N` cursors.
#[inline(never)]
fn fast_lanes_of<const N: usize>(data: &[u8], cs: &mut [Cursor]) {
    let Ok(cs) = <&mut [Cursor; N]>::try_from(cs) else {
        return;
    };
    let mut p = [0usize; N];
    let mut lim = [0usize; N];
    let mut m = [0u32; N];
    for i in 0..N {
        p[i] = cs[i].pos;
        // From below `lim`, `UNROLL` steps read only inside the range and `data`.
        lim[i] = cs[i]
            .end
            .min(data.len())
            .saturating_sub(FAST_MARGIN + UNROLL * MAX_STEP);
    }
    loop {
        let mut stop = false;
        for i in 0..N {
            stop |= p[i] >= lim[i];
        }
        if stop {
            break;
        }
        for _ in 0..UNROLL {
            for i in 0..N {
                debug_assert!(p[i] + 1 < data.len());
                // SAFETY: p[i] < lim[i] + (UNROLL - 1) * MAX_STEP <= data.len() - FAST_MARGIN
                // (a step moves at most MAX_STEP), so p[i] and p[i] + 1 are in bounds.
                // Checked indexing here costs a third of the walk's time.
                let (c, next) =
                    unsafe { (*data.get_unchecked(p[i]), *data.get_unchecked(p[i] + 1)) };
                m[i] += (c == op::MEMOIZE) as u32;
                p[i] += table_len(FAST_LEN[c as usize], next);
            }
        }
        for i in 0..N {
            // SAFETY: as above, p[i] < lim[i] + UNROLL * MAX_STEP < data.len().
            stop |= FAST_LEN[unsafe { *data.get_unchecked(p[i]) } as usize] == 0;
        }
        if stop {
            break;
        }
    }
    for i in 0..N {
        cs[i].pos = p[i];
        cs[i].w.memos += m[i];
    }
}

/// Walks ranges `LANES` at a time; when one ends, the others go on interleaved (a walk
/// alone, one careful step at a time, took a quarter of the time on uneven ranges).
fn walk_group(data: &[u8], ranges: &[(usize, usize)]) -> Vec<Walk> {
    let mut cs: Vec<Cursor> = ranges
        .iter()
        .enumerate()
        .map(|(slot, &(s, e))| Cursor {
            pos: s,
            end: e,
            w: Walk::default(),
            done: s >= e,
            slot,
        })
        .collect();
    loop {
        // The walks still going first (a stable sort of a handful).
        cs.sort_by_key(|c| c.done);
        let going = cs.iter().take_while(|c| !c.done).count();
        if going == 0 {
            break;
        }
        fast_lanes(data, &mut cs[..going]);
        // One careful step each (the one that stopped the fast loop needs it).
        for c in &mut cs[..going] {
            c.step(data);
        }
    }
    cs.sort_by_key(|c| c.slot);
    cs.into_iter().map(|c| c.w).collect()
}

#[cfg(test)]
fn walk(data: &[u8], start: usize, end: usize) -> Walk {
    let data = &data[..end];
    let mut w = Walk::default();
    let mut pos = start;
    while pos < end {
        match op_len(data, pos) {
            Step::Len(n) => {
                match data[pos] {
                    op::MEMOIZE => w.memos += 1,
                    op::STOP => {
                        w.stop = Some(pos);
                        return w;
                    }
                    _ => {}
                }
                pos += n;
            }
            Step::Cut => {
                w.cut = Some(pos);
                return w;
            }
            Step::Unsupported => {
                w.unsupported = true;
                return w;
            }
        }
    }
    w
}

/// Walks the chunks of `plan` in parallel. `None` when the input is not made of the
/// plain-data opcodes, or uses memo opcodes with explicit indices: the sequential reader
/// handles those.
pub fn scan(data: &[u8], plan: Plan, release: &(dyn Fn(usize, usize) + Sync)) -> Option<Scan> {
    let walks: Vec<Walk> = plan
        .ranges
        .par_chunks(LANES)
        .flat_map_iter(|group| {
            let w = walk_group(data, group);
            for &(s, e) in group {
                release(s, e);
            }
            w
        })
        .collect();
    let mut chunks = Vec::with_capacity(plan.ranges.len());
    let mut memos: u64 = 0;
    for ((s, e), w) in plan.ranges.into_iter().zip(walks) {
        if w.unsupported && w.stop.is_none() {
            return None;
        }
        if memos + w.memos as u64 > u32::MAX as u64 {
            return None;
        }
        chunks.push(Chunk {
            start: s,
            end: w.stop.map_or(w.cut.unwrap_or(e), |p| p + 1),
            memo_base: memos as u32,
            memos: w.memos,
        });
        memos += w.memos as u64;
        if let Some(stop) = w.stop {
            return Some(Scan {
                chunks,
                end: End::Stop(stop),
            });
        }
        if let Some(cut) = w.cut {
            // A cut inside a frame that is not the last one: opcodes span frames.
            if e != data.len() {
                return None;
            }
            return Some(Scan {
                chunks,
                end: End::Truncated(cut),
            });
        }
    }
    Some(Scan {
        chunks,
        end: End::Truncated(plan.header_cut.unwrap_or(data.len())),
    })
}

/// The chunks of an input before they are walked.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Byte ranges of whole opcodes, about `chunk_bytes` each, in order.
    pub ranges: Vec<(usize, usize)>,
    /// Positions of the FRAME headers between frames, in order.
    pub headers: Vec<usize>,
    /// A frame header cut off by the end of the input.
    pub header_cut: Option<usize>,
}

/// Cuts `data` into ranges of whole opcodes of about `chunk_bytes` by hopping over the FRAME
/// headers. `None` when the input is not a protocol 4/5 pickle (or its frames run far past its
/// end).
///
/// `peek(pos, buf)` copies the bytes at `pos` (as [`crate::input::InputBytes::peek`]): the
/// frame headers are read with it, not through `data`, so that hopping from one to the next
/// does not map the whole file page by page before the walks map it again.
pub fn plan(
    data: &[u8],
    chunk_bytes: usize,
    peek: &dyn Fn(usize, &mut [u8]) -> usize,
) -> Option<Plan> {
    if data.len() < 2 || data[0] != op::PROTO || !(4..=5).contains(&data[1]) {
        return None;
    }
    // Hop over the frame headers (sequential, one read per ~64 KiB).
    let mut units: Vec<(usize, usize)> = Vec::new();
    let mut headers: Vec<usize> = Vec::new();
    let mut pos = 2;
    let mut header_cut = None;
    // Start of the unit that runs to the end because it could not be parsed.
    let mut rest: Option<usize> = None;
    let mut head = [0u8; 9];
    while pos < data.len() {
        let got = peek(pos, &mut head);
        if got >= 1 && head[0] == op::FRAME {
            let Some(n) = arg_len(&head[..got], 0, 8) else {
                header_cut = Some(pos);
                break;
            };
            headers.push(pos);
            let body = pos + 9;
            if (body as u64).saturating_add(n)
                > (data.len() as u64).saturating_add(super::reader::MAX_CUT_FRAME)
            {
                return None;
            }
            let end = (body as u64).saturating_add(n).min(data.len() as u64) as usize;
            units.push((body, end));
            pos = end;
        } else {
            // Opcodes outside frames (CPython writes big strings that way): walk to the next
            // FRAME, STOP or the end.
            let start = pos;
            loop {
                if pos >= data.len() || data[pos] == op::FRAME {
                    break;
                }
                match op_len(data, pos) {
                    Step::Len(n) => {
                        let stop = data[pos] == op::STOP;
                        pos += n;
                        if stop {
                            break;
                        }
                    }
                    Step::Cut => {
                        pos = data.len();
                        break;
                    }
                    // Junk after STOP is allowed (as pickle.load ignores it), and so is what
                    // the parallel reader does not take (a BINBYTES8): the walk below decides.
                    // Nothing here can be parsed further, so the rest of the input is one
                    // unit, joined to the chunk before it (one step: hopping on byte by byte
                    // made a unit and a read per byte, 8.3 s and 353 MB for 20 MiB of zero
                    // bytes after STOP).
                    Step::Unsupported => {
                        pos = data.len();
                        rest = Some(start);
                        break;
                    }
                }
            }
            units.push((start, pos));
        }
    }
    // Group frames into chunks.
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (s, e) in units {
        match ranges.last_mut() {
            Some(last) if (last.1 - last.0 < chunk_bytes || rest == Some(s)) && s >= last.1 => {
                last.1 = e
            }
            _ => ranges.push((s, e)),
        }
    }
    Some(Plan {
        ranges,
        headers,
        header_cut,
    })
}

/// Walks `ranges` on this thread, `LANES` at a time.
pub fn walk_in_order(data: &[u8], ranges: &[(usize, usize)]) -> Vec<Walk> {
    ranges
        .chunks(LANES)
        .flat_map(|group| walk_group(data, group))
        .collect()
}

/// A MEMOIZE with no value before it in its range.
pub const NO_SOURCE: u32 = u32::MAX;

/// For each MEMOIZE of `start..end` in order, the offset from `start` of the opcode whose value
/// it stored (`NO_SOURCE` when that is not in the range). Empty when the range does not walk
/// cleanly or is too long for 32-bit offsets: its references are then left unresolved, and the
/// caller falls back to the sequential reader.
pub fn memo_sources_in(data: &[u8], start: usize, end: usize) -> Box<[u32]> {
    let Some(data) = data.get(..end) else {
        return Box::new([]);
    };
    if end - start.min(end) >= NO_SOURCE as usize {
        return Box::new([]);
    }
    let mut sources = Vec::new();
    let mut prev = NO_SOURCE;
    let mut pos = start;
    // Clear of the end, an opcode of the table is stepped over by its entry (as the walk does);
    // `op_len` takes the rest and the end.
    let clear = end.saturating_sub(FAST_MARGIN);
    while pos < end {
        let t = FAST_LEN[data[pos] as usize];
        let n = if t != 0 && pos < clear {
            table_len(t, data[pos + 1])
        } else {
            let Step::Len(n) = op_len(data, pos) else {
                return Box::new([]);
            };
            n
        };
        match data[pos] {
            op::MEMOIZE => sources.push(prev),
            op::FRAME => {}
            _ => prev = (pos - start) as u32,
        }
        pos += n;
    }
    // Work in bytes stepped over, as every opcode walk counts it.
    crate::work::add((end - start) as u64);
    sources.into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(data: &[u8]) -> Option<Scan> {
        let plan = plan(data, 1 << 20, &|p, b| crate::input::peek_slice(data, p, b))?;
        scan(data, plan, &|_, _| {})
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut p = vec![0x80, 4, op::FRAME];
        p.extend_from_slice(&(body.len() as u64).to_le_bytes());
        p.extend_from_slice(body);
        p
    }

    #[test]
    fn counts_memos_and_finds_stop() {
        let p = framed(b"]\x94(\x8c\x01a\x94K\x01e.");
        let s = scan_all(&p).unwrap();
        assert_eq!(s.chunks.iter().map(|c| c.memos).sum::<u32>(), 2);
        assert_eq!(s.end, End::Stop(p.len() - 1));
        let c = &s.chunks[0];
        // EMPTY_LIST at 11 and the string at 14 are what the two MEMOIZEs store.
        let at = |pos: usize| (pos - c.start) as u32;
        assert_eq!(&memo_sources_in(&p, c.start, c.end)[..], [at(11), at(14)]);
    }

    #[test]
    fn what_follows_stop_is_one_unit() {
        let mut p = framed(b"]\x94(\x8c\x01a\x94K\x01e.");
        let stop = p.len() - 1;
        p.extend(std::iter::repeat_n(0u8, 3 << 20));
        let first = plan(&p, 1 << 20, &|q, b| crate::input::peek_slice(&p, q, b)).unwrap();
        assert_eq!(first.ranges, [(11, p.len())]);
        assert_eq!(scan_all(&p).unwrap().end, End::Stop(stop));
        // A BINBYTES8 outside frames (not taken here): one unit to the end, left to the
        // sequential reader.
        let mut q = framed(b"]\x94(");
        q.push(0x8e);
        q.extend_from_slice(&(1u64 << 20).to_le_bytes());
        q.extend(std::iter::repeat_n(0u8, 1 << 20));
        q.extend_from_slice(b"e.");
        let second = plan(&q, 1 << 20, &|x, b| crate::input::peek_slice(&q, x, b)).unwrap();
        assert_eq!(second.ranges, [(11, q.len())]);
        assert!(scan_all(&q).is_none());
    }

    #[test]
    fn cut_inputs_report_the_first_incomplete_opcode() {
        let p = framed(b"]\x94(\x8c\x05abcde\x94e.");
        let cut = &p[..16];
        let s = scan_all(cut).unwrap();
        assert_eq!(s.end, End::Truncated(14));
        let s = scan_all(&p[..14]).unwrap();
        assert_eq!(s.end, End::Truncated(14));
    }

    #[test]
    fn interleaved_walks_match_single_walks() {
        let body: Vec<u8> =
            b"]\x94(\x8c\x01a\x94K\x01\x8a\x02\x94\x94J\x94\x94\x94\x94e".repeat(50);
        let mut p = framed(&body);
        p.push(b'.');
        let n = p.len();
        let ranges = [(11, 200), (200, 211), (211, 700), (700, n), (n, n)];
        for group in [&ranges[..], &ranges[..4], &ranges[1..]] {
            let w = walk_group(&p, group);
            for (got, &(s, e)) in w.iter().zip(group.iter()) {
                let want = walk(&p, s, e);
                assert_eq!(
                    (got.memos, got.stop, got.cut, got.unsupported),
                    (want.memos, want.stop, want.cut, want.unsupported)
                );
            }
        }
    }

    /// Ranges long enough for the interleaved fast loop, of uneven lengths, so that lanes end
    /// one after another and the rest go on as fewer (all eight ranges: seven down to one):
    /// each range's walk is its own.
    #[test]
    fn uneven_long_ranges_walk_as_single_walks() {
        // 19 bytes of whole opcodes: two MEMOIZE, and 0x94 bytes inside arguments.
        let unit = b"]\x94(\x8c\x01a\x94K\x01\x8a\x02\x94\x94J\x94\x94\x94\x94e";
        assert_eq!(unit.len(), 19);
        let mut p = framed(&unit.repeat(20_000));
        p.push(b'.');
        let at = |units: usize| 11 + 19 * units;
        let cuts = [0, 150, 2_150, 2_500, 9_000, 9_100, 15_000, 20_000];
        let mut ranges: Vec<(usize, usize)> =
            cuts.windows(2).map(|w| (at(w[0]), at(w[1]))).collect();
        ranges.push((at(20_000), p.len()));
        for group in [&ranges[..4], &ranges[4..], &ranges[1..3], &ranges[..]] {
            let w = walk_group(&p, group);
            assert_eq!(w.len(), group.len());
            for (got, &(s, e)) in w.iter().zip(group.iter()) {
                let want = walk(&p, s, e);
                assert_eq!(
                    (got.memos, got.stop, got.cut, got.unsupported),
                    (want.memos, want.stop, want.cut, want.unsupported)
                );
            }
        }
        let all = walk_in_order(&p, &ranges);
        assert_eq!(all.iter().map(|w| w.memos).sum::<u32>(), 2 * 20_000);
        assert_eq!(all.last().and_then(|w| w.stop), Some(p.len() - 1));
    }

    #[test]
    fn code_and_explicit_memo_indices_are_left_to_the_sequential_reader() {
        assert!(scan_all(&framed(b"\x8c\x02os\x8c\x06system\x93.")).is_none());
        assert!(scan_all(&framed(b"]q\x00.")).is_none());
        assert!(scan_all(b"\x80\x02]q\x00.").is_none());
    }
}
