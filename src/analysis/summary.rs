//! One pass over a device's trace, on every core, for the figures that look at each entry
//! alone: what the report and the data-quality checks would otherwise each read the whole
//! trace for.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::lifetimes::round_size;
use super::quality::MAX_PLAUSIBLE_BYTES;
use crate::snapshot::{Action, Snapshot, Trace, TraceCore};

/// Trace entries per piece of the passes that run on every core (by default).
pub const PIECE: usize = 1 << 16;

static PIECE_ENTRIES: AtomicUsize = AtomicUsize::new(PIECE);

/// Trace entries per piece of the passes that run on every core.
pub fn piece_entries() -> usize {
    PIECE_ENTRIES.load(Ordering::Relaxed)
}

/// Sets [`piece_entries`]: the tests cut small fixtures into many pieces with it, to check that
/// results do not depend on the cut (nor on the number of threads).
#[doc(hidden)]
pub fn set_piece_entries(entries: usize) {
    PIECE_ENTRIES.store(entries.max(1), Ordering::Relaxed);
}

/// What the pass finds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSummary {
    /// The largest request (rounded as the allocator rounds it) of an `alloc` or `oom`.
    pub largest_request: u64,
    /// Indices of the `oom` entries.
    pub ooms: Vec<u32>,
    /// `snapshot` entries: (index, size: the bytes the allocator held when it was written).
    pub snapshot_markers: Vec<(u32, u64)>,
    /// Address ranges of segment events (alloc, free, map, unmap), in trace order.
    pub segment_ranges: Vec<(u64, u64)>,
    /// Entries with sizes no device can hold: how many, and the first.
    pub implausible_sizes: u64,
    pub first_implausible: Option<u32>,
}

impl TraceSummary {
    fn add(&mut self, i: usize, e: TraceCore) {
        match e.action {
            Action::Alloc => self.largest_request = self.largest_request.max(round_size(e.size)),
            Action::Oom => {
                self.largest_request = self.largest_request.max(round_size(e.size));
                self.ooms.push(i as u32);
            }
            Action::Snapshot => self.snapshot_markers.push((i as u32, e.size)),
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => self
                .segment_ranges
                .push((e.addr, e.addr.saturating_add(e.size))),
            _ => {}
        }
        let sized = !matches!(e.action, Action::Annotate | Action::Other);
        if sized && e.size > MAX_PLAUSIBLE_BYTES {
            self.implausible_sizes += 1;
            self.first_implausible.get_or_insert(i as u32);
        }
    }

    /// `self` followed by `later`.
    fn then(mut self, later: TraceSummary) -> TraceSummary {
        self.largest_request = self.largest_request.max(later.largest_request);
        self.ooms.extend(later.ooms);
        self.snapshot_markers.extend(later.snapshot_markers);
        self.segment_ranges.extend(later.segment_ranges);
        self.implausible_sizes += later.implausible_sizes;
        self.first_implausible = self.first_implausible.or(later.first_implausible);
        self
    }
}

/// The summary of one device's trace.
pub fn summarize(snapshot: &Snapshot, device: i64) -> TraceSummary {
    summarize_trace(snapshot.trace(device))
}

fn summarize_trace(trace: &Trace) -> TraceSummary {
    trace
        .pieces(piece_entries())
        .into_par_iter()
        .map(|piece: Range<usize>| {
            let mut s = TraceSummary::default();
            trace.for_each_core(piece, |i, e| s.add(i, e));
            s
        })
        .reduce(TraceSummary::default, TraceSummary::then)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{StackId, TraceEntry};

    fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            action,
            action_text: None,
            addr,
            size,
            stream: 0,
            device_free: None,
            time_us: None,
            frames: StackId::EMPTY,
            user_metadata: None,
            compile_context: None,
            pool_id: None,
            internal_metadata: None,
        }
    }

    #[test]
    fn one_pass_in_pieces_equals_the_plain_loop() {
        // More entries than one piece, so that the pieces are merged in order.
        let entries: Vec<TraceEntry> = (0..(2 * PIECE as u64 + 17))
            .map(|i| match i % 7 {
                0 => entry(Action::SegmentAlloc, i << 20, 2 << 20),
                1 => entry(Action::Oom, 0, i * 1000 + 1),
                3 if i % 11 == 0 => entry(Action::Snapshot, 0, i),
                2 if i % 5 == 0 => entry(Action::Alloc, i, MAX_PLAUSIBLE_BYTES + i),
                _ => entry(Action::Alloc, i << 20, i * 3),
            })
            .collect();
        let got = summarize_trace(&Trace::from_entries(&entries));
        let mut want = TraceSummary::default();
        for (i, e) in entries.iter().enumerate() {
            let core = TraceCore {
                action: e.action,
                user_metadata: e.user_metadata,
                addr: e.addr,
                size: e.size,
                frames: e.frames,
            };
            want.add(i, core);
        }
        assert_eq!(got, want);
        assert!(got.snapshot_markers.len() > 100);
        assert_eq!(got.first_implausible, Some(30)); // i % 7 == 2 and i % 5 == 0
        assert_eq!(got.ooms[..2], [1, 8]);
        assert!(got.largest_request >= round_size(MAX_PLAUSIBLE_BYTES));
    }
}
