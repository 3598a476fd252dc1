//! The allocator's state at the window start: the dump with the trace undone. Segments come
//! from undoing the segment events from the end; the blocks alive then are the ones the trace
//! frees without allocating them and the dump's live blocks the trace never touched, with
//! free space between them (free neighbours are always merged, so the gaps are the free blocks).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::rules::{self, SMALL_BUFFER, SMALL_SIZE};
use super::settings::Settings;
use super::state::{free_block, Block, BlockState, PoolKey, State, NIL};
use crate::snapshot::{Action, BlockState as DumpState, PoolKind, Snapshot, StackId};

/// What the start state rests on, and what it could not decide.
#[derive(Clone, Debug, Default)]
pub struct StartInfo {
    pub segments: u64,
    pub reserved_bytes: u64,
    /// Blocks alive at the window start: freed inside the window, or alive at the dump.
    pub live_blocks: u64,
    pub live_from_dump: u64,
    /// Blocks whose `free_requested` came before the window (their `free_completed` is in it).
    pub pending_blocks: u64,
    /// Blocks alive at the start whose size the trace cannot decide (oversize blocks, which
    /// are never split), with the least and most bytes they can hold.
    pub uncertain_blocks: u64,
    pub uncertain_min_bytes: u64,
    pub uncertain_max_bytes: u64,
    /// Problems found (a free of an address in no segment, overlapping blocks …), counted.
    pub problems: Vec<(&'static str, u64, String)>,
    /// The pool of the segment each `segment_alloc` event made: the dump's segment it became,
    /// or the default pool for one released inside the window.
    pub new_segment_keys: FxHashMap<u32, PoolKey>,
}

impl StartInfo {
    fn problem(&mut self, kind: &'static str, first: impl FnOnce() -> String) {
        match self.problems.iter_mut().find(|p| p.0 == kind) {
            Some(p) => p.1 += 1,
            None => self.problems.push((kind, 1, first())),
        }
    }
}

#[derive(Clone, Copy)]
struct SegInfo {
    size: u64,
    key: PoolKey,
}

/// A block alive at the window start, before it is sized.
struct Live {
    addr: u64,
    /// Exact (from the dump), or the request that the trace frees.
    size: Option<u64>,
    requested: u64,
    pending: bool,
    stack: StackId,
    /// The event of its first free (`u32::MAX` for blocks alive at the dump).
    freed_at: u32,
    /// Where the trace shows the next block starting while this one lives (its end, unsplit
    /// remainder included).
    decided_end: Option<u64>,
}

/// The pool kind of a segment of `size` bytes when the dump does not say it.
fn small_of(kind: PoolKind, size: u64, expandable: bool) -> bool {
    match kind {
        PoolKind::Small => true,
        PoolKind::Large => false,
        PoolKind::Unknown => !expandable && size == SMALL_BUFFER,
    }
}

pub fn build(snapshot: &Snapshot, device: i64, settings: &Settings) -> (State, StartInfo) {
    let trace = snapshot.trace(device);

    // Segments at the start (the dump's with the trace's segment events undone from the end)
    // and the blocks alive then are found side by side: each reads the whole trace.
    let segments_at_start = || {
        let mut info = StartInfo::default();
        let mut plain: BTreeMap<u64, SegInfo> = BTreeMap::new();
        let mut mapped: BTreeMap<u64, SegInfo> = BTreeMap::new();
        for s in snapshot.segments_of(device) {
            let key = PoolKey {
                pool: s.pool_id.unwrap_or((0, 0)),
                stream: s.stream,
                small: small_of(s.pool_kind, s.total_size, s.is_expandable),
            };
            let info_ = SegInfo {
                size: s.total_size,
                key,
            };
            if s.is_expandable {
                mapped.insert(s.address, info_);
            } else {
                plain.insert(s.address, info_);
            }
        }
        let mut segment_events: Vec<u32> = Vec::new();
        trace.for_each_core(0..trace.len(), |i, c| {
            if matches!(
                c.action,
                Action::SegmentAlloc
                    | Action::SegmentFree
                    | Action::SegmentMap
                    | Action::SegmentUnmap
            ) {
                segment_events.push(i as u32);
            }
        });
        for &i in segment_events.iter().rev() {
            let e = trace.at(i as usize);
            match e.action {
                Action::SegmentAlloc => {
                    if let Some(seg) = plain.remove(&e.addr) {
                        info.new_segment_keys.insert(i, seg.key);
                    } else {
                        info.problem("segment_alloc_unknown", || {
                            format!(
                                "segment_alloc at {:#x} of a segment that is neither in the dump nor freed later",
                                e.addr
                            )
                        });
                    }
                }
                Action::SegmentFree => {
                    // A segment made and released inside the window: which pool it served is not
                    // recorded (before the 2026 `pool_id`); the default pool is the common case.
                    let key = PoolKey {
                        pool: (0, 0),
                        stream: e.stream,
                        small: e.size == SMALL_BUFFER,
                    };
                    if plain
                        .insert(e.addr, SegInfo { size: e.size, key })
                        .is_some()
                    {
                        info.problem("segment_free_twice", || {
                            format!(
                                "segment_free at {:#x} of a segment that is still there after it",
                                e.addr
                            )
                        });
                    }
                }
                Action::SegmentMap => unmap_range(&mut mapped, e.addr, e.size),
                Action::SegmentUnmap => {
                    let small = !e.size.is_multiple_of(settings.large_segment_size);
                    map_range(&mut mapped, e.addr, e.size, e.stream, small);
                }
                _ => {}
            }
        }

        (plain, mapped, info)
    };
    let live_at_start = || {
        let mut pending_blocks = 0u64;
        let mut live_from_dump = 0u64;
        #[derive(Clone, Copy, PartialEq)]
        enum Open {
            Allocated,
            Requested,
        }
        let mut open: FxHashMap<u64, Open> = FxHashMap::default();
        let mut live: Vec<Live> = Vec::new();
        trace.for_each_core(0..trace.len(), |i, e| {
            let i = i as u32;
            match e.action {
                Action::Alloc => {
                    open.insert(e.addr, Open::Allocated);
                }
                Action::FreeRequested => {
                    // A free of a block the window did not allocate: alive at the start.
                    let before_window = open.insert(e.addr, Open::Requested).is_none();
                    if before_window {
                        live.push(Live {
                            addr: e.addr,
                            size: None,
                            requested: e.size,
                            pending: false,
                            stack: e.frames,
                            freed_at: i,
                            decided_end: None,
                        });
                    }
                }
                Action::FreeCompleted => {
                    // Its free_requested came before the window too: pending at the start.
                    let before_window = open.remove(&e.addr).is_none();
                    if before_window {
                        live.push(Live {
                            addr: e.addr,
                            size: None,
                            requested: e.size,
                            pending: true,
                            stack: e.frames,
                            freed_at: i,
                            decided_end: None,
                        });
                        pending_blocks += 1;
                    }
                }
                _ => {}
            }
        });
        for s in snapshot.segments_of(device) {
            for b in &s.blocks {
                if b.state.is_active() && !open.contains_key(&b.address) {
                    live.push(Live {
                        addr: b.address,
                        size: Some(b.size),
                        requested: b.requested_size,
                        pending: b.state == DumpState::ActivePendingFree,
                        stack: b.frames,
                        freed_at: u32::MAX,
                        decided_end: None,
                    });
                    live_from_dump += 1;
                }
            }
        }
        drop(open);
        decide_remainders(&mut live, trace, settings);
        (live, pending_blocks, live_from_dump)
    };
    let ((plain, mapped, mut info), (mut live, pending_blocks, live_from_dump)) =
        rayon::join(segments_at_start, live_at_start);
    info.pending_blocks = pending_blocks;
    info.live_from_dump = live_from_dump;
    live.sort_unstable_by_key(|l| l.addr);
    info.live_blocks = live.len() as u64;

    // Each segment with its live blocks, the gaps free.
    let mut built: Vec<(u64, u64, PoolKey, bool, Vec<Block>)> = Vec::new();
    let mut prev_end = 0u64;
    let mut live = live.into_iter().peekable();
    let mut segments: Vec<(u64, SegInfo, bool)> = plain
        .into_iter()
        .map(|(a, s)| (a, s, false))
        .chain(mapped.into_iter().map(|(a, s)| (a, s, true)))
        .collect();
    segments.sort_unstable_by_key(|s| s.0);
    for (addr, seg, expandable) in segments {
        let end = addr.saturating_add(seg.size);
        // Live blocks before this segment are in none.
        while let Some(l) = live.peek() {
            if l.addr >= addr {
                break;
            }
            let a = l.addr;
            info.problem("free_outside_segments", || {
                format!("the block at {a:#x} alive at the window start is in no segment")
            });
            live.next();
        }
        if addr < prev_end {
            info.problem("overlapping_segments", || {
                format!("segment {addr:#x} overlaps another segment")
            });
            continue;
        }
        let mut mine: Vec<Live> = Vec::new();
        while let Some(l) = live.peek() {
            if l.addr >= end {
                break;
            }
            mine.push(live.next().expect("peeked"));
        }
        let blocks = tile(
            addr,
            end,
            seg.key.small || expandable,
            &mine,
            settings,
            &mut info,
        );
        let blocks = if blocks.is_empty() {
            vec![free_block(addr, seg.size)]
        } else {
            blocks
        };
        built.push((addr, seg.size, seg.key, expandable, blocks));
        prev_end = end;
        info.segments += 1;
        info.reserved_bytes = info.reserved_bytes.saturating_add(seg.size);
    }
    for l in live {
        let a = l.addr;
        info.problem("free_outside_segments", || {
            format!("the block at {a:#x} alive at the window start is in no segment")
        });
    }
    (State::build(built), info)
}

/// The blocks of one segment `[addr, end)`: the live ones sized, the gaps free.
fn tile(
    addr: u64,
    end: u64,
    split_any: bool,
    live: &[Live],
    settings: &Settings,
    info: &mut StartInfo,
) -> Vec<Block> {
    let mut out = Vec::with_capacity(live.len() * 2 + 1);
    let mut at = addr;
    for (i, l) in live.iter().enumerate() {
        if l.addr < at {
            let a = l.addr;
            info.problem("overlapping_blocks", || {
                format!("the block at {a:#x} alive at the window start overlaps the one before it")
            });
            continue;
        }
        let boundary = live.get(i + 1).map_or(end, |n| n.addr.min(end));
        let size = match l.size {
            Some(s) => s,
            None => {
                let rounded = rules::round_size(l.requested, settings);
                let gap = boundary.saturating_sub(l.addr.saturating_add(rounded));
                if split_any {
                    // Small pool and expandable segments split any remainder of 512 or more.
                    rounded
                } else if rounded >= settings.max_split() {
                    // Oversize blocks are never split: the block may reach the next live one.
                    info.uncertain_blocks += 1;
                    info.uncertain_min_bytes = info.uncertain_min_bytes.saturating_add(rounded);
                    info.uncertain_max_bytes = info.uncertain_max_bytes.saturating_add(
                        rounded.saturating_add(gap.min(settings.max_non_split_rounding)),
                    );
                    rounded
                } else if let Some(end) = l.decided_end.filter(|&e| {
                    let end = l.addr.saturating_add(rounded);
                    e > end && e <= end.saturating_add(SMALL_SIZE)
                }) {
                    // A block the trace shows starting within 1 MiB after it while it lived.
                    end - l.addr
                } else if gap > 0 && gap <= SMALL_SIZE {
                    // Every free block of a large pool is over 1 MiB (a split leaves more, and
                    // blocks are over 1 MiB): a gap this small is the block's unsplit remainder.
                    rounded.saturating_add(gap)
                } else {
                    rounded
                }
            }
        };
        if l.addr > at {
            out.push(free_block(at, l.addr - at));
        }
        let size = size.min(end - l.addr).max(1);
        out.push(Block {
            addr: l.addr,
            size,
            seg: NIL,
            prev: NIL,
            next: NIL,
            state: if l.pending {
                BlockState::Pending
            } else {
                BlockState::Allocated
            },
            requested: l.requested,
            stack: l.stack,
            birth: NIL,
            // Pending since before the window: its completion in the window is a delayed free.
            freed_at: if l.pending { NIL - 1 } else { NIL },
        });
        at = l.addr + size;
    }
    if at < end {
        out.push(free_block(at, end - at));
    }
    out
}

/// A large-pool block alive before the window may hold an unsplit remainder of up to 1 MiB
/// after its request. An `alloc` that lands within 1 MiB after the request's end while the
/// block lives decides it: the space between cannot be free (a large pool's free blocks are
/// over 1 MiB) nor another block (over 1 MiB too), so it is the remainder.
fn decide_remainders(live: &mut [Live], trace: &crate::snapshot::Trace, settings: &Settings) {
    // Candidates by the MiB their request ends in: an alloc looks in its MiB and the one before.
    let mut ends: FxHashMap<u64, Vec<(u64, usize)>> = FxHashMap::default();
    for (k, l) in live.iter().enumerate() {
        if l.size.is_none() {
            let rounded = rules::round_size(l.requested, settings);
            if !rules::is_small(rounded) {
                let end = l.addr.saturating_add(rounded);
                ends.entry(end >> 20).or_default().push((end, k));
            }
        }
    }
    if ends.is_empty() {
        return;
    }
    trace.for_each_core(0..trace.len(), |i, e| {
        if e.action != Action::Alloc {
            return;
        }
        let mib = e.addr >> 20;
        for bucket in [mib, mib.wrapping_sub(1)] {
            let Some(list) = ends.get(&bucket) else {
                continue;
            };
            for &(end, k) in list.iter().take(8) {
                let l = &mut live[k];
                if end < e.addr
                    && e.addr - end <= SMALL_SIZE
                    && (i as u32) < l.freed_at
                    && l.decided_end.is_none()
                {
                    l.decided_end = Some(e.addr);
                }
            }
        }
    });
}

/// Removes `[addr, addr + size)` from the mapped ranges (undoing a `segment_map`).
fn unmap_range(mapped: &mut BTreeMap<u64, SegInfo>, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    let Some((&start, &seg)) = mapped.range(..=addr).next_back() else {
        return;
    };
    let seg_end = start.saturating_add(seg.size);
    if seg_end <= addr {
        return;
    }
    mapped.remove(&start);
    if start < addr {
        mapped.insert(
            start,
            SegInfo {
                size: addr - start,
                ..seg
            },
        );
    }
    if end < seg_end {
        mapped.insert(
            end,
            SegInfo {
                size: seg_end - end,
                ..seg
            },
        );
    }
}

/// Adds `[addr, addr + size)` to the mapped ranges (undoing a `segment_unmap`), joined with
/// the ranges it touches.
fn map_range(mapped: &mut BTreeMap<u64, SegInfo>, addr: u64, size: u64, stream: u64, small: bool) {
    let mut start = addr;
    let mut end = addr.saturating_add(size);
    let mut key = PoolKey {
        pool: (0, 0),
        stream,
        small,
    };
    if let Some((&s, &seg)) = mapped.range(..=addr).next_back() {
        if s.saturating_add(seg.size) == addr {
            mapped.remove(&s);
            start = s;
            key = seg.key;
        }
    }
    if let Some(&seg) = mapped.get(&end) {
        mapped.remove(&end);
        end = end.saturating_add(seg.size);
        key = seg.key;
    }
    mapped.insert(
        start,
        SegInfo {
            size: end - start,
            key,
        },
    );
}
