//! Why a request did not fit: where the free bytes were, which segments were split by live
//! blocks, and which live blocks kept the hole that would have served it from forming.

use rustc_hash::FxHashMap;

use super::state::{BlockState, PoolKey, State, NIL};
use crate::snapshot::{StackId, Trace};

/// How many segments and pinning blocks are listed.
const KEEP_SEGMENTS: usize = 8;
const KEEP_PINNERS: usize = 8;
const KEEP_HOLDERS: usize = 5;

/// Free bytes of the device that the request could not use, by reason.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unusable {
    /// Free blocks of the request's pool and stream smaller than the request.
    pub holes_too_small: u64,
    /// Free blocks large enough but refused by a `max_split_size` rule.
    pub oversize: u64,
    /// Free blocks of the same pool on other streams.
    pub other_streams: u64,
    /// Free blocks in other memory pools (CUDA graphs, MemPools, or the default pool).
    pub other_pools: u64,
    /// Free blocks of the other size class (small pool for a large request, or back).
    pub other_size_class: u64,
}

/// A segment of the request's pool whose free space is split by live blocks.
#[derive(Clone, Debug)]
pub struct SplitSegment {
    pub address: u64,
    pub size: u64,
    pub free_bytes: u64,
    pub largest_hole: u64,
    pub live_blocks: u64,
}

/// A live block whose freeing (with the others listed) would have made a big enough hole.
#[derive(Clone, Debug)]
pub struct Pinner {
    pub address: u64,
    pub size: u64,
    pub requested: u64,
    pub stack: StackId,
    /// The event that allocated it; `None` when it was alive before the window.
    pub birth: Option<u32>,
    pub birth_time_us: Option<i64>,
}

/// Live blocks by call site that hold the request's pool's segments open.
#[derive(Clone, Debug)]
pub struct Holder {
    pub stack: StackId,
    pub blocks: u64,
    pub bytes: u64,
    pub first_birth: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct WhyNoFit {
    pub rounded: u64,
    pub key: PoolKey,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    /// Free bytes in the request's pool and stream, and its largest free block.
    pub pool_free_bytes: u64,
    pub pool_largest_free: u64,
    pub unusable: Unusable,
    /// Segments of the request's pool with free bytes and live blocks, most free first.
    pub split_segments: Vec<SplitSegment>,
    pub split_segment_count: u64,
    pub split_free_bytes: u64,
    /// The fewest live bytes whose freeing would have made a hole of at least the request,
    /// in one segment; empty when no segment of the pool is large enough.
    pub pinners: Vec<Pinner>,
    pub pinner_count: u64,
    pub pinner_bytes: u64,
    pub pinned_segment: Option<u64>,
    /// The hole that freeing the pinners would have made.
    pub hole_if_freed: u64,
    /// Live blocks in the split segments, by call site, most bytes first.
    pub holders: Vec<Holder>,
    pub event_time_us: Option<i64>,
}

pub fn why_no_fit(state: &State, key_id: u32, rounded: u64, trace: &Trace, event: u32) -> WhyNoFit {
    let key = state.keys[key_id as usize];
    let time = |e: u32| trace.get(e as usize).and_then(|t| t.time_us);
    let mut w = WhyNoFit {
        rounded,
        key,
        reserved_bytes: 0,
        free_bytes: 0,
        pool_free_bytes: 0,
        pool_largest_free: 0,
        unusable: Unusable::default(),
        split_segments: Vec::new(),
        split_segment_count: 0,
        split_free_bytes: 0,
        pinners: Vec::new(),
        pinner_count: 0,
        pinner_bytes: 0,
        pinned_segment: None,
        hole_if_freed: 0,
        holders: Vec::new(),
        event_time_us: time(event),
    };
    let mut holders: FxHashMap<StackId, Holder> = FxHashMap::default();
    // The best window found: (live bytes, segment, first block, last block, hole).
    let mut best: Option<(u64, u32, u32, u32, u64)> = None;
    for (&addr, &s) in &state.seg_at {
        let seg = &state.segs[s as usize];
        w.reserved_bytes = w.reserved_bytes.saturating_add(seg.size);
        let same = seg.key == key;
        let (mut free, mut largest, mut live) = (0u64, 0u64, 0u64);
        for (_, b) in state.seg_blocks(s) {
            if b.state != BlockState::Free {
                live += 1;
                continue;
            }
            free = free.saturating_add(b.size);
            largest = largest.max(b.size);
            let unusable = &mut w.unusable;
            let slot = if same {
                if b.size >= rounded {
                    &mut unusable.oversize
                } else {
                    &mut unusable.holes_too_small
                }
            } else if seg.key.pool != key.pool {
                &mut unusable.other_pools
            } else if seg.key.small != key.small {
                &mut unusable.other_size_class
            } else {
                &mut unusable.other_streams
            };
            *slot = slot.saturating_add(b.size);
        }
        w.free_bytes = w.free_bytes.saturating_add(free);
        if !same {
            continue;
        }
        w.pool_free_bytes = w.pool_free_bytes.saturating_add(free);
        w.pool_largest_free = w.pool_largest_free.max(largest);
        if free > 0 && live > 0 {
            w.split_segment_count += 1;
            w.split_free_bytes = w.split_free_bytes.saturating_add(free);
            w.split_segments.push(SplitSegment {
                address: addr,
                size: seg.size,
                free_bytes: free,
                largest_hole: largest,
                live_blocks: live,
            });
            for (_, b) in state.seg_blocks(s) {
                if b.state == BlockState::Free {
                    continue;
                }
                let h = holders.entry(b.stack).or_insert(Holder {
                    stack: b.stack,
                    blocks: 0,
                    bytes: 0,
                    first_birth: None,
                });
                h.blocks += 1;
                h.bytes = h.bytes.saturating_add(b.size);
                let birth = (b.birth != NIL).then_some(b.birth);
                h.first_birth = match (h.first_birth, birth) {
                    (Some(a), Some(c)) => Some(a.min(c)),
                    (a, c) => a.or(c),
                };
            }
        }
        if seg.size >= rounded {
            if let Some(found) = min_window(state, s, rounded) {
                if best.is_none_or(|b| found.0 < b.0) {
                    best = Some(found);
                }
            }
        }
    }
    w.split_segments.sort_unstable_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    w.split_segments.truncate(KEEP_SEGMENTS);
    let mut holders: Vec<Holder> = holders.into_values().collect();
    holders.sort_unstable_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.0.cmp(&b.stack.0)));
    holders.truncate(KEEP_HOLDERS);
    w.holders = holders;
    if let Some((_, s, first, last, hole)) = best {
        w.pinned_segment = Some(state.segs[s as usize].addr);
        w.hole_if_freed = hole;
        let mut b = first;
        loop {
            let blk = &state.blocks[b as usize];
            if blk.state != BlockState::Free {
                w.pinner_count += 1;
                w.pinner_bytes = w.pinner_bytes.saturating_add(blk.size);
                if w.pinners.len() < KEEP_PINNERS {
                    let birth = (blk.birth != NIL).then_some(blk.birth);
                    w.pinners.push(Pinner {
                        address: blk.addr,
                        size: blk.size,
                        requested: blk.requested,
                        stack: blk.stack,
                        birth,
                        birth_time_us: birth.and_then(time),
                    });
                }
            }
            if b == last {
                break;
            }
            b = blk.next;
        }
    }
    w
}

/// The run of consecutive blocks of segment `s` spanning at least `rounded` bytes with the
/// fewest live bytes: (live bytes, segment, first, last, span). Two pointers over the list.
fn min_window(state: &State, s: u32, rounded: u64) -> Option<(u64, u32, u32, u32, u64)> {
    let blocks: Vec<(u32, u64, bool)> = state
        .seg_blocks(s)
        .map(|(id, b)| (id, b.size, b.state != BlockState::Free))
        .collect();
    let (mut lo, mut span, mut live) = (0usize, 0u64, 0u64);
    let mut best: Option<(u64, usize, usize, u64)> = None;
    for hi in 0..blocks.len() {
        span = span.saturating_add(blocks[hi].1);
        if blocks[hi].2 {
            live = live.saturating_add(blocks[hi].1);
        }
        while lo < hi && span.saturating_sub(blocks[lo].1) >= rounded {
            span = span.saturating_sub(blocks[lo].1);
            if blocks[lo].2 {
                live = live.saturating_sub(blocks[lo].1);
            }
            lo += 1;
        }
        // Pinners hold a hole open: fewer live bytes than the request they keep out.
        if span >= rounded && live > 0 && live < rounded && best.is_none_or(|b| live < b.0) {
            best = Some((live, lo, hi, span));
        }
    }
    best.map(|(live, lo, hi, span)| (live, s, blocks[lo].0, blocks[hi].0, span))
}
