//! Segment layout at any point of the trace: live segments minus live allocations = holes.
//!
//! At the end of the trace the dump's block table is the layout, exactly. For an earlier event
//! the segments are found by undoing segment events from the end (as MemoryViz's "Allocator State
//! History" does) and filled with the allocations alive then; block sizes of allocations that died
//! inside the window are PyTorch's rounding of the request (the trace has no block sizes).

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::lifetimes::DeviceReplay;
use crate::snapshot::{Action, BlockState, PoolKind, Snapshot, TraceEntry};

/// The moment a layout describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moment {
    WindowStart,
    /// After the trace entry with this index was applied.
    After(u32),
    /// The dump itself.
    End,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayoutBlock {
    pub offset: u64,
    pub size: u64,
    pub requested: u64,
    pub state: BlockState,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SegmentLayout {
    pub address: u64,
    pub total_bytes: u64,
    /// Σ block bytes of live allocations (pending frees included: they still hold the space).
    pub allocated_bytes: u64,
    pub requested_bytes: u64,
    pub holes: u64,
    pub largest_hole_bytes: u64,
    /// Bytes in holes (external waste).
    pub free_bytes: u64,
    /// Σ (block − requested) of live allocations.
    pub internal_waste_bytes: u64,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    pub pool_kind: PoolKind,
    pub expandable: bool,
    /// Live blocks and holes in address order (holes have state `Inactive`); empty when the
    /// layout was asked for without blocks ([`Detail::blocks`]).
    pub blocks: Vec<LayoutBlock>,
    /// Bytes in holes smaller than [`Detail::small_hole_limit`] (free space a request of that
    /// size cannot use).
    pub small_hole_bytes: u64,
}

/// What a layout keeps of each segment. Reports need only the sums: the blocks of a big dump's
/// hundreds of thousands of segments are tens of MB.
#[derive(Clone, Copy, Debug)]
pub struct Detail {
    pub blocks: bool,
    pub small_hole_limit: u64,
}

impl Detail {
    /// Every block and hole (pictures, the viewer).
    pub const BLOCKS: Detail = Detail {
        blocks: true,
        small_hole_limit: 0,
    };
}

impl SegmentLayout {
    fn add(&mut self, block: LayoutBlock, detail: Detail) {
        if block.state == BlockState::Inactive && block.size < detail.small_hole_limit {
            self.small_hole_bytes = self.small_hole_bytes.saturating_add(block.size);
        }
        if detail.blocks {
            self.blocks.push(block);
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct SegInfo {
    address: u64,
    size: u64,
    stream: u64,
    pool_id: Option<(i64, i64)>,
    pool_kind: PoolKind,
    expandable: bool,
}

fn guess_kind(size: u64) -> PoolKind {
    if size == 2 << 20 {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

/// True when nothing after `event` changes blocks or segments, so the dump is that moment.
fn dump_is_moment(snapshot: &Snapshot, device: i64, event: u32) -> bool {
    let trace = snapshot.trace(device);
    trace.range(event as usize + 1..trace.len()).all(|e| {
        matches!(
            e.action,
            Action::Oom | Action::Snapshot | Action::Annotate | Action::Other
        )
    })
}

fn end_layout(snapshot: &Snapshot, device: i64, detail: Detail, f: &mut dyn FnMut(SegmentLayout)) {
    snapshot
        .segments_of(device)
        .map(|seg| {
            let mut layout = SegmentLayout {
                address: seg.address,
                total_bytes: seg.total_size,
                allocated_bytes: 0,
                requested_bytes: 0,
                holes: 0,
                largest_hole_bytes: 0,
                free_bytes: 0,
                internal_waste_bytes: 0,
                stream: seg.stream,
                pool_id: seg.pool_id,
                pool_kind: seg.pool_kind,
                expandable: seg.is_expandable,
                blocks: Vec::with_capacity(if detail.blocks { seg.blocks.len() } else { 0 }),
                small_hole_bytes: 0,
            };
            let mut in_hole = false;
            let mut hole = 0u64;
            for b in &seg.blocks {
                let offset = b.address.saturating_sub(seg.address);
                if b.state.is_active() {
                    if in_hole {
                        layout.largest_hole_bytes = layout.largest_hole_bytes.max(hole);
                        in_hole = false;
                    }
                    layout.allocated_bytes = layout.allocated_bytes.saturating_add(b.size);
                    layout.requested_bytes =
                        layout.requested_bytes.saturating_add(b.requested_size);
                    layout.internal_waste_bytes = layout
                        .internal_waste_bytes
                        .saturating_add(b.size.saturating_sub(b.requested_size));
                    layout.add(
                        LayoutBlock {
                            offset,
                            size: b.size,
                            requested: b.requested_size.min(b.size),
                            state: b.state,
                        },
                        detail,
                    );
                } else {
                    if !in_hole {
                        layout.holes += 1;
                        in_hole = true;
                        hole = 0;
                    }
                    hole = hole.saturating_add(b.size);
                    layout.free_bytes = layout.free_bytes.saturating_add(b.size);
                    layout.add(
                        LayoutBlock {
                            offset,
                            size: b.size,
                            requested: 0,
                            state: BlockState::Inactive,
                        },
                        detail,
                    );
                }
            }
            if in_hole {
                layout.largest_hole_bytes = layout.largest_hole_bytes.max(hole);
            }
            layout
        })
        .for_each(f)
}

/// The dump's segments of `device`, by address (a later one at the same address wins).
fn dump_segments(snapshot: &Snapshot, device: i64) -> impl Iterator<Item = SegInfo> + '_ {
    snapshot.segments_of(device).map(|s| SegInfo {
        address: s.address,
        size: s.total_size,
        stream: s.stream,
        pool_id: s.pool_id,
        pool_kind: s.pool_kind,
        expandable: s.is_expandable,
    })
}

/// The dump's segments as a map by address, for undoing segment events.
fn dump_segment_map(snapshot: &Snapshot, device: i64) -> BTreeMap<u64, SegInfo> {
    dump_segments(snapshot, device)
        .map(|s| (s.address, s))
        .collect()
}

/// Segments that existed at `moment`, by address, undoing segment events from the end of the
/// trace.
fn segments_at(snapshot: &Snapshot, replay: &DeviceReplay, moment: Moment) -> Vec<SegInfo> {
    let device = replay.device;
    let trace = snapshot.trace(device);
    let first_undone = match moment {
        Moment::End => trace.len(),
        Moment::WindowStart => 0,
        Moment::After(e) => e as usize + 1,
    };
    // Only segment events change the segments (the replay listed them): undo them in reverse.
    let events = &replay.segment_events;
    let from = events.partition_point(|&i| (i as usize) < first_undone);
    if from == events.len() {
        // Nothing to undo (a peak after the last segment event, or a trace without any): a
        // sorted list takes a third of a map's room, and a big dump has tens of thousands.
        let mut segs: Vec<SegInfo> = dump_segments(snapshot, device).collect();
        segs.sort_by_key(|s| s.address);
        // Stable sort: of equal addresses the dump's last comes last, and is kept.
        segs.dedup_by(|later, earlier| {
            let same = later.address == earlier.address;
            if same {
                std::mem::swap(later, earlier);
            }
            same
        });
        return segs;
    }
    let mut segs = dump_segment_map(snapshot, device);
    for e in events[from..].iter().rev().map(|&i| trace.at(i as usize)) {
        undo_segment_event(&mut segs, &e, &mut |_| {});
    }
    segs.into_values().collect()
}

/// How a segment took part in undoing a segment event.
pub(crate) enum SegChange<'a> {
    /// It existed after the event, not before it.
    Removed(&'a SegInfo),
    /// It existed before the event, not after it.
    Inserted(&'a SegInfo),
}

fn remove(segs: &mut BTreeMap<u64, SegInfo>, addr: u64, change: &mut dyn FnMut(SegChange)) {
    if let Some(s) = segs.remove(&addr) {
        change(SegChange::Removed(&s));
    }
}

fn insert(
    segs: &mut BTreeMap<u64, SegInfo>,
    change: &mut dyn FnMut(SegChange),
    addr: u64,
    info: SegInfo,
) {
    if let Some(old) = segs.insert(addr, info) {
        change(SegChange::Removed(&old));
    }
    if let Some(new) = segs.get(&addr) {
        change(SegChange::Inserted(new));
    }
}

/// Undoes one segment event: `segs` goes from the segments after `e` to those before it;
/// `change` hears of every segment removed or inserted on the way.
fn undo_segment_event(
    segs: &mut BTreeMap<u64, SegInfo>,
    e: &TraceEntry,
    change: &mut dyn FnMut(SegChange),
) {
    match e.action {
        Action::SegmentAlloc => {
            remove(segs, e.addr, change);
        }
        Action::SegmentFree => {
            insert(
                segs,
                change,
                e.addr,
                SegInfo {
                    address: e.addr,
                    size: e.size,
                    stream: e.stream,
                    pool_id: None,
                    pool_kind: guess_kind(e.size),
                    expandable: false,
                },
            );
        }
        Action::SegmentMap => {
            // Carve the mapped range out of the run that contains it.
            let containing = segs
                .range(..=e.addr)
                .next_back()
                .map(|(_, s)| s.clone())
                .filter(|s| e.addr < s.address.saturating_add(s.size));
            if let Some(s) = containing {
                remove(segs, s.address, change);
                let end = s.address.saturating_add(s.size);
                let cut_end = e.addr.saturating_add(e.size).min(end);
                if e.addr > s.address {
                    insert(
                        segs,
                        change,
                        s.address,
                        SegInfo {
                            size: e.addr - s.address,
                            ..s.clone()
                        },
                    );
                }
                if cut_end < end {
                    insert(
                        segs,
                        change,
                        cut_end,
                        SegInfo {
                            address: cut_end,
                            size: end - cut_end,
                            ..s
                        },
                    );
                }
            }
        }
        Action::SegmentUnmap => {
            let mut start = e.addr;
            let mut end = e.addr.saturating_add(e.size);
            let template = segs.range(..=e.addr).next_back().map(|(_, s)| s.clone());
            // Merge with touching expandable runs of the same stream.
            if let Some(prev) = segs
                .range(..e.addr)
                .next_back()
                .map(|(_, s)| s.clone())
                .filter(|p| {
                    p.address.saturating_add(p.size) == e.addr
                        && p.expandable
                        && p.stream == e.stream
                })
            {
                remove(segs, prev.address, change);
                start = prev.address;
            }
            if let Some(next) = segs
                .get(&end)
                .cloned()
                .filter(|n| n.expandable && n.stream == e.stream)
            {
                remove(segs, next.address, change);
                end = next.address.saturating_add(next.size);
            }
            let t = template.unwrap_or(SegInfo {
                address: start,
                size: 0,
                stream: e.stream,
                pool_id: None,
                pool_kind: guess_kind(e.size),
                expandable: true,
            });
            insert(
                segs,
                change,
                start,
                SegInfo {
                    address: start,
                    size: end - start,
                    stream: e.stream,
                    expandable: true,
                    ..t
                },
            );
        }
        _ => {}
    }
}

/// A segment and the states it existed in: from the state after `first_state` events to the
/// state after `last_state` events, both included (state 0 = window start; the dump is the state
/// after every event).
#[derive(Clone, Debug, PartialEq)]
pub struct SegmentLife {
    pub address: u64,
    pub size: u64,
    pub stream: u64,
    pub pool_id: Option<(i64, i64)>,
    pub pool_kind: PoolKind,
    pub expandable: bool,
    pub first_state: u32,
    pub last_state: u32,
}

/// Every segment of `device` over the whole trace, found as [`layout_at`] finds the segments of
/// one moment (undoing segment events from the dump), in one pass: the segments at state `k` are
/// those with `first_state <= k <= last_state`.
pub fn segment_lifetimes(snapshot: &Snapshot, replay: &DeviceReplay) -> Vec<SegmentLife> {
    let trace = snapshot.trace(replay.device);
    let n = trace.len() as u32;
    let mut segs = dump_segment_map(snapshot, replay.device);
    // Last state of each segment now in `segs`.
    let mut last: BTreeMap<u64, u32> = segs.keys().map(|&a| (a, n)).collect();
    let mut out = Vec::new();
    let life = |s: &SegInfo, first: u32, last: u32| SegmentLife {
        address: s.address,
        size: s.size,
        stream: s.stream,
        pool_id: s.pool_id,
        pool_kind: s.pool_kind,
        expandable: s.expandable,
        first_state: first,
        last_state: last,
    };
    for &i in replay.segment_events.iter().rev() {
        let e = trace.at(i as usize);
        // Undoing event `i` goes from the state after it (i + 1) to the state before it (i).
        let mut changes: Vec<(bool, SegInfo)> = Vec::new();
        undo_segment_event(&mut segs, &e, &mut |c| match c {
            SegChange::Removed(s) => changes.push((false, s.clone())),
            SegChange::Inserted(s) => changes.push((true, s.clone())),
        });
        for (inserted, s) in changes {
            if inserted {
                last.insert(s.address, i);
            } else if let Some(l) = last.remove(&s.address) {
                if l > i {
                    out.push(life(&s, i + 1, l));
                }
            }
        }
    }
    for (a, s) in &segs {
        out.push(life(s, 0, last.get(a).copied().unwrap_or(n)));
    }
    out.sort_by_key(|s| (s.address, s.first_state));
    out
}

/// Layout of every segment of `device` at `moment`, with every block.
pub fn layout_at(snapshot: &Snapshot, replay: &DeviceReplay, moment: Moment) -> Vec<SegmentLayout> {
    layout_with(snapshot, replay, moment, Detail::BLOCKS)
}

/// Layout of every segment of `device` at `moment`, keeping what `detail` asks for.
pub fn layout_with(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    moment: Moment,
    detail: Detail,
) -> Vec<SegmentLayout> {
    let mut out = Vec::new();
    for_each_layout(snapshot, replay, moment, detail, &mut |l| out.push(l));
    out
}

/// [`layout_with`], one segment at a time and in address order, for callers that fold the
/// layouts into sums (a big dump has tens of thousands of segments).
pub fn for_each_layout(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    moment: Moment,
    detail: Detail,
    f: &mut dyn FnMut(SegmentLayout),
) {
    layouts_of(
        snapshot,
        replay,
        moment,
        detail,
        |m| segments_at(snapshot, replay, m),
        f,
    );
}

/// [`layout_with`] with the segments read from the device's [`segment_lifetimes`] (made once by
/// a caller that asks about many moments) instead of undoing segment events from the dump.
pub fn layout_from_lifetimes(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    lifetimes: &[SegmentLife],
    moment: Moment,
    detail: Detail,
) -> Vec<SegmentLayout> {
    let mut out = Vec::new();
    layouts_of(
        snapshot,
        replay,
        moment,
        detail,
        |m| segments_from_lifetimes(lifetimes, m),
        &mut |l| out.push(l),
    );
    out
}

/// The layouts at `moment`: the dump's own at the dump, else those of the segments that
/// `segments` gives for the moment, with the allocations alive then.
fn layouts_of(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    moment: Moment,
    detail: Detail,
    segments: impl FnOnce(Moment) -> Vec<SegInfo>,
    f: &mut dyn FnMut(SegmentLayout),
) {
    let device = replay.device;
    let moment = match moment {
        Moment::After(e) if dump_is_moment(snapshot, device, e) => Moment::End,
        m => m,
    };
    if moment == Moment::End {
        return end_layout(snapshot, device, detail, f);
    }
    let segs = segments(moment);
    walk_layouts(replay, &segs, moment, detail, f);
}

/// The segments alive at `moment` (not the dump), from their lives: sorted by address, one per
/// address at any state.
fn segments_from_lifetimes(lifetimes: &[SegmentLife], moment: Moment) -> Vec<SegInfo> {
    // State k is the state after k events (0: the window start).
    let state = match moment {
        Moment::After(e) => e.saturating_add(1),
        _ => 0,
    };
    lifetimes
        .iter()
        .filter(|l| l.first_state <= state && state <= l.last_state)
        .map(|l| SegInfo {
            address: l.address,
            size: l.size,
            stream: l.stream,
            pool_id: l.pool_id,
            pool_kind: l.pool_kind,
            expandable: l.expandable,
        })
        .collect()
}

/// The layouts of `segs` (in address order) at `moment`, with the allocations alive then.
fn walk_layouts(
    replay: &DeviceReplay,
    segs: &[SegInfo],
    moment: Moment,
    detail: Detail,
    f: &mut dyn FnMut(SegmentLayout),
) {
    let event = match moment {
        Moment::After(e) => Some(e),
        _ => None,
    };
    // The live allocations by address, walked beside the segments (also by address): each
    // belongs to the last segment starting at or below it, if it lies inside it. At a real
    // peak there are hundreds of thousands of both; one sort beats a tree search for each.
    let mut live: Vec<(u64, u64, u64, bool)> = replay.live_map(event, |a| {
        let pending = a
            .free_requested_event
            .is_some_and(|f| event.is_some_and(|e| f <= e));
        (a.address, a.block_bytes, a.requested_bytes, pending)
    });
    // Tuples sort by all their fields: the unstable sort gives one order.
    live.par_sort_unstable();
    // A segment's allocations are a run of `live`: from its start up to its end or the next
    // segment's start, whichever comes first (an allocation belongs to the last segment that
    // starts at or below it, if it lies inside it).
    let mut next_live = 0;
    let mut segments = segs.iter().peekable();
    while let Some(s) = segments.next() {
        let end = s.address.saturating_add(s.size);
        let bound = match segments.peek() {
            Some(next) => end.min(next.address),
            None => end,
        };
        while next_live < live.len() && live[next_live].0 < s.address {
            next_live += 1;
        }
        let first = next_live;
        while next_live < live.len() && live[next_live].0 < bound {
            next_live += 1;
        }
        let allocs = &live[first..next_live];
        f({
            let mut layout = SegmentLayout {
                address: s.address,
                total_bytes: s.size,
                allocated_bytes: 0,
                requested_bytes: 0,
                holes: 0,
                largest_hole_bytes: 0,
                free_bytes: 0,
                internal_waste_bytes: 0,
                stream: s.stream,
                pool_id: s.pool_id,
                pool_kind: s.pool_kind,
                expandable: s.expandable,
                blocks: Vec::with_capacity(if detail.blocks {
                    allocs.len() * 2 + 1
                } else {
                    0
                }),
                small_hole_bytes: 0,
            };
            let mut cursor = s.address;
            let add_hole = |layout: &mut SegmentLayout, from: u64, to: u64| {
                if to > from {
                    layout.holes += 1;
                    layout.free_bytes += to - from;
                    layout.largest_hole_bytes = layout.largest_hole_bytes.max(to - from);
                    layout.add(
                        LayoutBlock {
                            offset: from - s.address,
                            size: to - from,
                            requested: 0,
                            state: BlockState::Inactive,
                        },
                        detail,
                    );
                }
            };
            for &(addr, block, requested, pending) in allocs {
                let start = addr.max(cursor);
                let stop = addr.saturating_add(block).min(end);
                if stop <= start {
                    continue; // overlapping estimate: the space is already counted
                }
                add_hole(&mut layout, cursor, start);
                let size = stop - start;
                layout.allocated_bytes += size;
                layout.requested_bytes += requested.min(size);
                layout.internal_waste_bytes += size.saturating_sub(requested);
                layout.add(
                    LayoutBlock {
                        offset: start - s.address,
                        size,
                        requested: requested.min(size),
                        state: if pending {
                            BlockState::ActivePendingFree
                        } else {
                            BlockState::ActiveAllocated
                        },
                    },
                    detail,
                );
                cursor = stop;
            }
            add_hole(&mut layout, cursor, end);
            layout
        });
    }
}

/// The allocator model's layout at `moment`: every block at its exact size, unsplit
/// remainders included, as the replay that places allocs at their real addresses has them.
/// `None` at the dump (which is exact as it is) or without a trace.
pub fn model_layout(
    snapshot: &Snapshot,
    device: i64,
    moment: Moment,
) -> Option<Vec<SegmentLayout>> {
    use crate::allocator::state::BlockState as ModelState;
    let event = match moment {
        Moment::End => return None,
        Moment::After(e) if dump_is_moment(snapshot, device, e) => return None,
        Moment::After(e) => Some(e),
        Moment::WindowStart => None,
    };
    if snapshot.trace(device).is_empty() {
        return None;
    }
    let (settings, _) = crate::allocator::Settings::from_snapshot(snapshot);
    let state = crate::allocator::state_after(snapshot, device, &settings, event);
    let mut out = Vec::with_capacity(state.seg_at.len());
    for (&address, &s) in &state.seg_at {
        let seg = &state.segs[s as usize];
        let mut layout = SegmentLayout {
            address,
            total_bytes: seg.size,
            allocated_bytes: 0,
            requested_bytes: 0,
            holes: 0,
            largest_hole_bytes: 0,
            free_bytes: 0,
            internal_waste_bytes: 0,
            stream: seg.key.stream,
            pool_id: Some(seg.key.pool),
            pool_kind: if seg.key.small {
                PoolKind::Small
            } else {
                PoolKind::Large
            },
            expandable: seg.expandable,
            blocks: Vec::new(),
            small_hole_bytes: 0,
        };
        for (_, b) in state.seg_blocks(s) {
            let offset = b.addr.saturating_sub(address);
            let dump_state = match b.state {
                // Free neighbours are always merged: each free block is one hole.
                ModelState::Free => {
                    layout.holes += 1;
                    layout.largest_hole_bytes = layout.largest_hole_bytes.max(b.size);
                    layout.free_bytes = layout.free_bytes.saturating_add(b.size);
                    BlockState::Inactive
                }
                live => {
                    let requested = b.requested.min(b.size);
                    layout.allocated_bytes = layout.allocated_bytes.saturating_add(b.size);
                    layout.requested_bytes = layout.requested_bytes.saturating_add(requested);
                    layout.internal_waste_bytes = layout
                        .internal_waste_bytes
                        .saturating_add(b.size - requested);
                    if live == ModelState::Pending {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::ActiveAllocated
                    }
                }
            };
            let requested = if dump_state == BlockState::Inactive {
                0
            } else {
                b.requested.min(b.size)
            };
            layout.add(
                LayoutBlock {
                    offset,
                    size: b.size,
                    requested,
                    state: dump_state,
                },
                Detail::BLOCKS,
            );
        }
        out.push(layout);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::lifetimes::replay_device;

    /// The lifetimes give, at every sampled state, the segments `layout_at` undoes its way to.
    #[test]
    fn lifetimes_agree_with_segments_at_every_moment() {
        for name in [
            "train-oom-expandable",
            "multi-stream",
            "truncated",
            "fragmented",
            "graphs-stacks-none",
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("fixtures/synth/{name}.pickle"));
            let loaded = crate::snapshot::load(&path).expect("fixture");
            let snapshot = &loaded.snapshot;
            for device in snapshot.devices() {
                let replay = replay_device(snapshot, device);
                let lives = segment_lifetimes(snapshot, &replay);
                let n = snapshot.trace(device).len();
                let step = (n / 97).max(1);
                let mut states: Vec<usize> = (0..=n).step_by(step).collect();
                states.extend(replay.segment_events.iter().map(|&e| e as usize + 1));
                states.push(n);
                for k in states {
                    let moment = match k {
                        0 => Moment::WindowStart,
                        k => Moment::After(k as u32 - 1),
                    };
                    let want: Vec<(u64, u64, u64, bool)> = segments_at(snapshot, &replay, moment)
                        .iter()
                        .map(|s| (s.address, s.size, s.stream, s.expandable))
                        .collect();
                    let got: Vec<(u64, u64, u64, bool)> = lives
                        .iter()
                        .filter(|l| l.first_state as usize <= k && k <= l.last_state as usize)
                        .map(|l| (l.address, l.size, l.stream, l.expandable))
                        .collect();
                    assert_eq!(got, want, "{name} device {device} state {k}");
                }
            }
        }
    }
}
