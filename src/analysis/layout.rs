//! Segment layout at any point of the trace: live segments minus live allocations = holes.
//!
//! At the end of the trace the dump's block table is the layout, exactly. For an earlier event
//! the segments are found by undoing segment events from the end (as MemoryViz's "Allocator State
//! History" does) and filled with the allocations alive then; block sizes of allocations that died
//! inside the window are PyTorch's rounding of the request (the trace has no block sizes).

use std::collections::BTreeMap;

use super::replay::DeviceReplay;
use crate::snapshot::{Action, BlockState, PoolKind, Snapshot};

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
    /// Live blocks and holes in address order (holes have state `Inactive`).
    pub blocks: Vec<LayoutBlock>,
}

#[derive(Clone, Debug)]
struct SegInfo {
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

fn end_layout(snapshot: &Snapshot, device: i64) -> Vec<SegmentLayout> {
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
                blocks: Vec::with_capacity(seg.blocks.len()),
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
                    layout.blocks.push(LayoutBlock {
                        offset,
                        size: b.size,
                        requested: b.requested_size.min(b.size),
                        state: b.state,
                    });
                } else {
                    if !in_hole {
                        layout.holes += 1;
                        in_hole = true;
                        hole = 0;
                    }
                    hole = hole.saturating_add(b.size);
                    layout.free_bytes = layout.free_bytes.saturating_add(b.size);
                    layout.blocks.push(LayoutBlock {
                        offset,
                        size: b.size,
                        requested: 0,
                        state: BlockState::Inactive,
                    });
                }
            }
            if in_hole {
                layout.largest_hole_bytes = layout.largest_hole_bytes.max(hole);
            }
            layout
        })
        .collect()
}

/// Segments that existed at `moment`, undoing segment events from the end of the trace.
fn segments_at(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    moment: Moment,
) -> BTreeMap<u64, SegInfo> {
    let device = replay.device;
    let mut segs: BTreeMap<u64, SegInfo> = snapshot
        .segments_of(device)
        .map(|s| {
            (
                s.address,
                SegInfo {
                    address: s.address,
                    size: s.total_size,
                    stream: s.stream,
                    pool_id: s.pool_id,
                    pool_kind: s.pool_kind,
                    expandable: s.is_expandable,
                },
            )
        })
        .collect();
    let trace = snapshot.trace(device);
    let first_undone = match moment {
        Moment::End => trace.len(),
        Moment::WindowStart => 0,
        Moment::After(e) => e as usize + 1,
    };
    // Only segment events change the segments (the replay listed them): undo them in reverse.
    let events = &replay.segment_events;
    let from = events.partition_point(|&i| (i as usize) < first_undone);
    for e in events[from..].iter().rev().map(|&i| trace.at(i as usize)) {
        match e.action {
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(
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
                    segs.remove(&s.address);
                    let end = s.address.saturating_add(s.size);
                    let cut_end = e.addr.saturating_add(e.size).min(end);
                    if e.addr > s.address {
                        segs.insert(
                            s.address,
                            SegInfo {
                                size: e.addr - s.address,
                                ..s.clone()
                            },
                        );
                    }
                    if cut_end < end {
                        segs.insert(
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
                    segs.remove(&prev.address);
                    start = prev.address;
                }
                if let Some(next) = segs
                    .get(&end)
                    .cloned()
                    .filter(|n| n.expandable && n.stream == e.stream)
                {
                    segs.remove(&next.address);
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
                segs.insert(
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
    segs
}

/// Layout of every segment of `device` at `moment`.
pub fn layout_at(snapshot: &Snapshot, replay: &DeviceReplay, moment: Moment) -> Vec<SegmentLayout> {
    let device = replay.device;
    let moment = match moment {
        Moment::After(e) if dump_is_moment(snapshot, device, e) => Moment::End,
        m => m,
    };
    if moment == Moment::End {
        return end_layout(snapshot, device);
    }
    let segs = segments_at(snapshot, replay, moment);
    let event = match moment {
        Moment::After(e) => Some(e),
        _ => None,
    };
    let mut per_segment: BTreeMap<u64, Vec<(u64, u64, u64, bool)>> = BTreeMap::new();
    for a in replay.live(event) {
        if let Some((&start, s)) = segs.range(..=a.address).next_back() {
            if a.address < s.address.saturating_add(s.size) {
                let pending = a
                    .free_requested_event
                    .is_some_and(|f| event.is_some_and(|e| f <= e));
                per_segment.entry(start).or_default().push((
                    a.address,
                    a.block_bytes,
                    a.requested_bytes,
                    pending,
                ));
            }
        }
    }
    segs.values()
        .map(|s| {
            let mut allocs = per_segment.remove(&s.address).unwrap_or_default();
            allocs.sort_unstable();
            let end = s.address.saturating_add(s.size);
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
                blocks: Vec::with_capacity(allocs.len() * 2 + 1),
            };
            let mut cursor = s.address;
            let add_hole = |layout: &mut SegmentLayout, from: u64, to: u64| {
                if to > from {
                    layout.holes += 1;
                    layout.free_bytes += to - from;
                    layout.largest_hole_bytes = layout.largest_hole_bytes.max(to - from);
                    layout.blocks.push(LayoutBlock {
                        offset: from - s.address,
                        size: to - from,
                        requested: 0,
                        state: BlockState::Inactive,
                    });
                }
            };
            for (addr, block, requested, pending) in allocs {
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
                layout.blocks.push(LayoutBlock {
                    offset: start - s.address,
                    size,
                    requested: requested.min(size),
                    state: if pending {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::ActiveAllocated
                    },
                });
                cursor = stop;
            }
            add_hole(&mut layout, cursor, end);
            layout
        })
        .collect()
}
