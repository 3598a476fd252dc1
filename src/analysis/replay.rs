//! Per-device replay of the trace: allocation lifetimes and the requested / allocated / reserved
//! curves, each including the level at window start (snapshot-format.md §9.10, design §4).
//!
//! Lifetime = from `alloc` to `free_completed` (MemoryViz's definition): a block is unusable and
//! still counts between `free_requested` and `free_completed`.

use rustc_hash::FxHashMap;

use crate::snapshot::{Action, BlockState, Snapshot, StackId};

/// Where an allocation's record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Its `alloc` is in the trace.
    Traced,
    /// Allocated before the window: only its free is in the trace.
    FreedInWindow,
    /// Allocated before the window and still allocated in the dump, no trace event at all.
    Ghost,
}

#[derive(Clone, Debug)]
pub struct Allocation {
    pub address: u64,
    pub requested_bytes: u64,
    /// Block bytes: exact from the dump's block table when the block survived to the dump,
    /// else PyTorch's `round_size` of the request.
    pub block_bytes: u64,
    pub block_bytes_exact: bool,
    /// Index of the `alloc` entry; `None` = allocated before the window.
    pub alloc_event: Option<u32>,
    pub free_requested_event: Option<u32>,
    /// Index of the `free_completed` entry (or of the `alloc` that reused the address when a free
    /// was lost); `None` = alive at the end of the trace.
    pub free_event: Option<u32>,
    /// Allocation stack (for `FreedInWindow`: the free's stack, the only one recorded).
    pub stack: StackId,
    pub stream: u64,
    pub origin: Origin,
}

impl Allocation {
    /// Alive after event `event` was applied (`None` = at window start).
    pub fn alive_after(&self, event: Option<u32>) -> bool {
        let born = match (self.alloc_event, event) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(e)) => a <= e,
        };
        let dead = match (self.free_event, event) {
            (None, _) => false,
            (Some(_), None) => false,
            (Some(f), Some(e)) => f <= e,
        };
        born && !dead
    }
}

/// A level over the trace: `start` before the first event, `after[i]` after event i.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    pub start: i64,
    pub after: Vec<i64>,
}

impl Curve {
    /// Level after `event` (`None` = window start).
    pub fn at(&self, event: Option<u32>) -> i64 {
        match event {
            None => self.start,
            Some(e) => self.after.get(e as usize).copied().unwrap_or(self.start),
        }
    }

    /// The maximum including the level at window start, and the first event after which it is
    /// reached (`None` = already at window start).
    pub fn peak(&self) -> (i64, Option<u32>) {
        let mut best = (self.start, None);
        for (i, &v) in self.after.iter().enumerate() {
            if v > best.0 {
                best = (v, Some(i as u32));
            }
        }
        best
    }
}

/// Evidence that the trace does not start at the beginning of the program.
#[derive(Clone, Debug, Default)]
pub struct WindowStart {
    /// Frees whose allocation happened before the window.
    pub unmatched_frees: u64,
    /// Dump blocks allocated before the window, never touched in it.
    pub ghosts: u64,
    /// `segment_free`/`segment_unmap` of segments created before the window.
    pub unmatched_segment_frees: u64,
    /// `alloc` on an address that was still allocated (a lost free: `skip_actions` or corruption).
    pub lost_frees: u64,
    /// Blocks pending free at the dump that the trace never allocated: not counted in the curves
    /// (MemoryViz does not count them either).
    pub uncounted_pending_blocks: u64,
    pub uncounted_pending_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct DeviceReplay {
    pub device: i64,
    pub events: usize,
    pub allocations: Vec<Allocation>,
    /// Σ requested bytes of live allocations (what MemoryViz draws).
    pub requested: Curve,
    /// Σ block bytes of live allocations.
    pub allocated: Curve,
    /// Σ segment bytes (segment_alloc/free/map/unmap).
    pub reserved: Curve,
    pub window: WindowStart,
}

/// PyTorch's default request rounding (`round_size` without power-of-two divisions).
pub fn round_size(requested: u64) -> u64 {
    if requested < 512 {
        512
    } else {
        requested.div_ceil(512).saturating_mul(512)
    }
}

pub fn replay_device(snapshot: &Snapshot, device: i64) -> DeviceReplay {
    let trace = snapshot.trace(device);
    let mut allocations: Vec<Allocation> = Vec::new();
    let mut open: FxHashMap<u64, usize> = FxHashMap::default();
    let mut window = WindowStart::default();
    // Deltas per event; levels are computed once the start levels are known.
    let mut requested_delta = vec![0i64; trace.len()];
    let mut allocated_delta = vec![0i64; trace.len()];
    let mut reserved_delta = vec![0i64; trace.len()];
    let mut requested_start: i64 = 0;
    let mut allocated_start: i64 = 0;
    let mut known_segments: rustc_hash::FxHashSet<u64> = Default::default();
    let mut unmatched_requests: FxHashMap<u64, u32> = FxHashMap::default();

    let close = |alloc: &mut Allocation, event: usize, rd: &mut [i64], ad: &mut [i64]| {
        alloc.free_event = Some(event as u32);
        rd[event] -= alloc.requested_bytes as i64;
        ad[event] -= alloc.block_bytes as i64;
    };

    for (i, e) in trace.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                if let Some(old) = open.remove(&e.addr) {
                    window.lost_frees += 1;
                    close(
                        &mut allocations[old],
                        i,
                        &mut requested_delta,
                        &mut allocated_delta,
                    );
                }
                let block = round_size(e.size);
                requested_delta[i] += e.size as i64;
                allocated_delta[i] += block as i64;
                open.insert(e.addr, allocations.len());
                allocations.push(Allocation {
                    address: e.addr,
                    requested_bytes: e.size,
                    block_bytes: block,
                    block_bytes_exact: false,
                    alloc_event: Some(i as u32),
                    free_requested_event: None,
                    free_event: None,
                    stack: e.frames,
                    stream: e.stream,
                    origin: Origin::Traced,
                });
            }
            Action::FreeRequested => match open.get(&e.addr) {
                Some(&idx) => {
                    allocations[idx]
                        .free_requested_event
                        .get_or_insert(i as u32);
                }
                // Allocated before the window; counted once its free completes (as MemoryViz
                // does: a lone free_requested is not an allocation event).
                None => {
                    unmatched_requests.entry(e.addr).or_insert(i as u32);
                }
            },
            Action::FreeCompleted => match open.remove(&e.addr) {
                Some(idx) => {
                    close(
                        &mut allocations[idx],
                        i,
                        &mut requested_delta,
                        &mut allocated_delta,
                    );
                }
                None => {
                    // Allocated before the window: alive from the start until this free.
                    window.unmatched_frees += 1;
                    let block = round_size(e.size);
                    requested_start += e.size as i64;
                    allocated_start += block as i64;
                    let mut a = Allocation {
                        address: e.addr,
                        requested_bytes: e.size,
                        block_bytes: block,
                        block_bytes_exact: false,
                        alloc_event: None,
                        free_requested_event: unmatched_requests.remove(&e.addr),
                        free_event: None,
                        stack: e.frames,
                        stream: e.stream,
                        origin: Origin::FreedInWindow,
                    };
                    close(&mut a, i, &mut requested_delta, &mut allocated_delta);
                    allocations.push(a);
                }
            },
            Action::SegmentAlloc | Action::SegmentMap => {
                reserved_delta[i] += e.size as i64;
                known_segments.insert(e.addr);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                reserved_delta[i] -= e.size as i64;
                if e.action == Action::SegmentFree && !known_segments.remove(&e.addr) {
                    window.unmatched_segment_frees += 1;
                }
            }
            _ => {}
        }
    }

    // The dump's block table: exact sizes for survivors, and ghosts for blocks never traced.
    for seg in snapshot.segments_of(device) {
        for b in &seg.blocks {
            if !b.state.is_active() {
                continue;
            }
            match open.get(&b.address) {
                Some(&idx) => {
                    let a = &mut allocations[idx];
                    let exact = b.size as i64 - a.block_bytes as i64;
                    if exact != 0 {
                        // Correct the estimate where it entered the curve.
                        match a.alloc_event {
                            Some(ev) => allocated_delta[ev as usize] += exact,
                            None => allocated_start += exact,
                        }
                    }
                    a.block_bytes = b.size;
                    a.block_bytes_exact = true;
                    open.remove(&b.address);
                }
                None if b.state == BlockState::ActiveAllocated => {
                    window.ghosts += 1;
                    requested_start += b.requested_size as i64;
                    allocated_start += b.size as i64;
                    allocations.push(Allocation {
                        address: b.address,
                        requested_bytes: b.requested_size,
                        block_bytes: b.size,
                        block_bytes_exact: true,
                        alloc_event: None,
                        free_requested_event: None,
                        free_event: None,
                        stack: b.frames,
                        stream: seg.stream,
                        origin: Origin::Ghost,
                    });
                }
                None => {
                    window.uncounted_pending_blocks += 1;
                    window.uncounted_pending_bytes += b.size;
                }
            }
        }
    }

    let final_reserved: i64 = snapshot
        .segments_of(device)
        .map(|s| s.total_size as i64)
        .sum();
    let reserved_start = final_reserved - reserved_delta.iter().sum::<i64>();

    DeviceReplay {
        device,
        events: trace.len(),
        allocations,
        requested: accumulate(requested_start, &requested_delta),
        allocated: accumulate(allocated_start, &allocated_delta),
        reserved: accumulate(reserved_start, &reserved_delta),
        window,
    }
}

fn accumulate(start: i64, deltas: &[i64]) -> Curve {
    let mut level = start;
    let after = deltas
        .iter()
        .map(|d| {
            level += d;
            level
        })
        .collect();
    Curve { start, after }
}

impl DeviceReplay {
    /// Allocations alive after `event` (`None` = window start).
    pub fn live_after(&self, event: Option<u32>) -> impl Iterator<Item = &Allocation> {
        self.allocations
            .iter()
            .filter(move |a| a.alive_after(event))
    }

    /// True when the trace shows that allocations were made before its first event.
    pub fn starts_mid_run(&self) -> bool {
        self.window.unmatched_frees > 0 || self.window.unmatched_segment_frees > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_size_matches_pytorch_default() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(3 << 20), 3 << 20);
    }

    #[test]
    fn peak_includes_start_level() {
        let c = Curve {
            start: 10,
            after: vec![5, 7, 10],
        };
        assert_eq!(c.peak(), (10, None));
        let c = Curve {
            start: 0,
            after: vec![5, 7, 7],
        };
        assert_eq!(c.peak(), (7, Some(1)));
    }
}
