//! Data quality: is the snapshot consistent with itself and with its own replay?
//!
//! PyTorch writes dumps that satisfy a set of invariants (snapshot-format.md §2, §3, §6): blocks
//! tile their segment, segment sums equal block sums, segments of a device do not overlap, a free
//! follows an allocation, `snapshot` markers record the active bytes of the moment. A corrupted,
//! hand-edited or badly converted file breaks them, and a figure computed from broken data can be
//! wrong without anything failing. Each check here is a pure function of the snapshot and the
//! device's replay; it yields at most one [`QualityWarning`] per kind, with how often the problem
//! occurs, the first place it occurs, and the report fields it can make wrong. Clean dumps (every
//! fixture) yield none.
//!
//! Frees of allocations made before the trace window are not a quality problem (the ring buffer
//! wrapped, or recording started late): the notes and `window.unmatched_frees` cover them.

use rayon::prelude::*;

use super::lifetimes::{round_size, Curve, DeviceReplay};
use super::summary::{piece_entries, TraceSummary};
use crate::report::QualityWarning;
use crate::snapshot::{Action, BlockState, Layout, Segment, Snapshot, Trace, TraceCore};
use crate::units::format_bytes;

/// Sizes above this (256 TiB) exceed any device memory: a corrupt value, or a negative number
/// written as unsigned. The replay adds them as signed 64-bit numbers.
pub const MAX_PLAUSIBLE_BYTES: u64 = 1 << 48;

/// Largest extra a block can hold beyond the default rounding of its request when the replay has
/// to estimate it (an unsplit large-pool remainder, `max_non_split_rounding`): the slack of the
/// `snapshot` marker check, per live allocation, on top of doubling the estimate.
const BLOCK_SLACK_BYTES: u64 = 20 << 20;

/// Report fields a kind of problem can make wrong (JSON names, as in docs/json-schema.md).
const AFFECTS_BLOCK_TOTALS: &[&str] = &[
    "final.allocated_bytes",
    "final.active_bytes",
    "final.requested_bytes",
    "final.free_internal_bytes",
    "final.free_external_bytes",
    "segments",
    "fragmentation_at_end",
];
const AFFECTS_LAYOUT: &[&str] = &[
    "final.free_external_bytes",
    "segments",
    "fragmentation_at_peak",
    "fragmentation_at_end",
];
const AFFECTS_RESERVED: &[&str] = &[
    "final.reserved_bytes",
    "peak.reserved_bytes",
    "peak_reserved",
    "window.reserved_at_start_bytes",
    "segments",
    "fragmentation_at_peak",
    "fragmentation_at_end",
];
const AFFECTS_CURVES: &[&str] = &[
    "peak.requested_bytes",
    "peak.allocated_bytes",
    "peak_allocated",
    "window.requested_at_start_bytes",
    "window.allocated_at_start_bytes",
    "live_at_peak",
    "held_open",
    "steps",
];

fn warning(kind: &str, count: u64, message: String, affects: &[&str]) -> QualityWarning {
    QualityWarning {
        kind: kind.to_owned(),
        count,
        message,
        affects: affects.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// Counts occurrences and keeps the description of the first one.
#[derive(Default)]
struct Tally {
    count: u64,
    first: Option<String>,
}

impl Tally {
    fn add(&mut self, describe: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(describe());
        }
    }

    fn first(&self) -> &str {
        self.first.as_deref().unwrap_or("")
    }
}

/// How many trace entries match, and the first (by index).
struct Matches {
    count: u64,
    first: Option<usize>,
}

impl Matches {
    fn tally(self, describe: impl FnOnce(usize) -> String) -> Tally {
        Tally {
            count: self.count,
            first: self.first.map(describe),
        }
    }
}

/// Counts the entries of `trace` that match, on every core. Each piece of the trace gets its
/// own `state` (a lookup's memory of where the last entry was found).
fn count_events<S>(
    trace: &Trace,
    state: impl Fn() -> S + Sync,
    matches: impl Fn(&mut S, &TraceCore) -> bool + Sync,
) -> Matches {
    trace
        .pieces(piece_entries())
        .into_par_iter()
        .map(|piece| {
            let mut m = Matches {
                count: 0,
                first: None,
            };
            let mut st = state();
            trace.for_each_core(piece, |i, e| {
                if matches(&mut st, &e) {
                    m.count += 1;
                    m.first.get_or_insert(i);
                }
            });
            m
        })
        .reduce(
            || Matches {
                count: 0,
                first: None,
            },
            |a, b| Matches {
                count: a.count + b.count,
                first: a.first.or(b.first),
            },
        )
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The checks that need no replay: they run beside it, where a core is free (the report's
/// second stage waited on the segment checks, ~20 ms on notHanmin x280's 277k segments).
/// Fields in the order [`device_quality`] reports them; of the replay's own checks, double
/// frees go between `segment_checks` and `addresses_outside_segments`, the rest after.
pub struct TraceChecks {
    device_out_of_range: Option<QualityWarning>,
    implausible_dump_sizes: Option<QualityWarning>,
    implausible_sizes: Option<QualityWarning>,
    segment_checks: Vec<QualityWarning>,
    addresses_outside_segments: Option<QualityWarning>,
}

/// Runs the [`TraceChecks`] of one device (those of the trace on every core).
pub fn trace_checks(snapshot: &Snapshot, device: i64, summary: &TraceSummary) -> TraceChecks {
    let segments: Vec<&Segment> = snapshot.segments_of(device).collect();
    let mut segment_checks = Vec::new();
    segment_checks.extend(duplicate_and_overlapping_segments(&segments));
    segment_checks.extend(blocks_within_segments(&segments));
    segment_checks.extend(segment_sums(&segments));
    segment_checks.extend(unknown_block_states(&segments));
    TraceChecks {
        device_out_of_range: device_out_of_range(snapshot, device, segments.len()),
        implausible_dump_sizes: implausible_dump_sizes(&segments),
        implausible_sizes: implausible_trace_sizes(snapshot, device, summary),
        segment_checks,
        addresses_outside_segments: addresses_outside_segments(
            snapshot, device, &segments, summary,
        ),
    }
}

/// Every check, for one device, in a stable order.
pub fn device_quality(
    replay: &DeviceReplay,
    trace: TraceChecks,
    summary: &TraceSummary,
) -> Vec<QualityWarning> {
    let mut out = Vec::new();
    out.extend(trace.device_out_of_range);
    out.extend(trace.implausible_dump_sizes);
    out.extend(trace.implausible_sizes);
    out.extend(trace.segment_checks);
    out.extend(double_frees(replay));
    out.extend(trace.addresses_outside_segments);
    out.extend(negative_levels(replay));
    out.extend(snapshot_markers(replay, &summary.snapshot_markers));
    out
}

/// Bytes after the pickle's STOP (a dump written over a longer file, files joined, padding):
/// ignored, as `pickle.load` ignores them. One warning for the file, on each device.
pub fn bytes_after_stop(snapshot: &Snapshot) -> Option<QualityWarning> {
    let a = snapshot.after_stop?;
    Some(warning(
        "bytes_after_stop",
        a.len,
        format!(
            "{} follow the end of the pickle (its STOP, at byte {}) and were ignored, as \
             pickle.load ignores them; the file may have been written over a longer one or \
             joined to another",
            plural(a.len, "byte", "bytes"),
            a.offset.saturating_sub(1)
        ),
        &[],
    ))
}

/// Segments of a device that is no CUDA ordinal, or that has no `device_traces` list while
/// other devices have one.
fn device_out_of_range(
    snapshot: &Snapshot,
    device: i64,
    segments: usize,
) -> Option<QualityWarning> {
    let lists = snapshot.device_traces.len();
    if device < 0 {
        return Some(warning(
            "device_out_of_range",
            segments as u64,
            format!(
                "device {device} is not a CUDA ordinal ({} name it); it has no trace, so its \
                 peak is the dump's own state",
                plural(segments as u64, "segment", "segments")
            ),
            &["peak", "window"],
        ));
    }
    let beyond = usize::try_from(device).map_or(true, |d| d >= lists);
    if snapshot.layout == Layout::Dict && lists > 0 && beyond && segments > 0 {
        return Some(warning(
            "device_out_of_range",
            segments as u64,
            format!(
                "device {device} owns {} but device_traces has lists for devices 0 to {} only: \
                 its trace is missing, so its peak is the dump's own state",
                plural(segments as u64, "segment", "segments"),
                lists - 1
            ),
            &["peak", "window"],
        ));
    }
    None
}

/// Sizes no device can hold (corrupt, or negative numbers written as unsigned), in the dump.
fn implausible_dump_sizes(segments: &[&Segment]) -> Option<QualityWarning> {
    let mut dump = Tally::default();
    for s in segments {
        if s.total_size > MAX_PLAUSIBLE_BYTES {
            dump.add(|| format!("segment {:#x} has total_size {}", s.address, s.total_size));
        }
        for b in &s.blocks {
            if b.size > MAX_PLAUSIBLE_BYTES || b.requested_size > MAX_PLAUSIBLE_BYTES {
                dump.add(|| {
                    format!(
                        "block {:#x} of segment {:#x} has size {} and requested_size {}",
                        b.address, s.address, b.size, b.requested_size
                    )
                });
            }
        }
    }
    if dump.count > 0 {
        let mut affects = AFFECTS_BLOCK_TOTALS.to_vec();
        affects.extend(AFFECTS_RESERVED);
        affects.extend(AFFECTS_CURVES);
        affects.sort_unstable();
        affects.dedup();
        return Some(warning(
            "implausible_size",
            dump.count,
            format!(
                "{} in the dump larger than {} (any device memory); first: {}",
                plural(dump.count, "size", "sizes"),
                format_bytes(MAX_PLAUSIBLE_BYTES),
                dump.first()
            ),
            &affects,
        ));
    }
    None
}

/// Trace entries with sizes no device can hold.
fn implausible_trace_sizes(
    snapshot: &Snapshot,
    device: i64,
    summary: &TraceSummary,
) -> Option<QualityWarning> {
    let trace = snapshot.trace(device);
    let traced = Matches {
        count: summary.implausible_sizes,
        first: summary.first_implausible.map(|i| i as usize),
    }
    .tally(|i| {
        let e = trace.at(i);
        format!("event {i} ({}) has size {}", e.action.name(), e.size)
    });
    (traced.count > 0).then(|| {
        let mut affects = AFFECTS_CURVES.to_vec();
        affects.extend(["peak.reserved_bytes", "peak_reserved", "oom"]);
        warning(
            "implausible_size",
            traced.count,
            format!(
                "{} larger than {} (any device memory); the replay adds sizes as signed \
                 64-bit numbers, so the curves are meaningless around them; first: {}",
                plural(
                    traced.count,
                    "trace entry has a size",
                    "trace entries have sizes"
                ),
                format_bytes(MAX_PLAUSIBLE_BYTES),
                traced.first()
            ),
            &affects,
        )
    })
}

/// Two segment dicts for one address range: the dump's totals count both, the layouts keep one.
fn duplicate_and_overlapping_segments(segments: &[&Segment]) -> Vec<QualityWarning> {
    let mut sorted: Vec<&Segment> = segments.to_vec();
    sorted.sort_by_key(|s| (s.address, s.total_size));
    let mut duplicates = Tally::default();
    let mut duplicate_bytes = 0u64;
    let mut overlaps = Tally::default();
    let mut reach: Option<(u64, u64)> = None; // (start, end) of the segment reaching furthest
    for pair in sorted.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.address == b.address {
            duplicates.add(|| {
                format!(
                    "segment {:#x} ({} bytes) is listed twice",
                    b.address, b.total_size
                )
            });
            duplicate_bytes = duplicate_bytes.saturating_add(b.total_size.min(a.total_size));
        }
    }
    for s in &sorted {
        if let Some((start, end)) = reach {
            if s.address != start && s.address < end {
                overlaps.add(|| {
                    format!(
                        "segment {:#x} starts inside segment {:#x}, which ends at {:#x}",
                        s.address, start, end
                    )
                });
            }
        }
        if reach.is_none_or(|(_, end)| s.end() > end) {
            reach = Some((s.address, s.end()));
        }
    }
    let mut out = Vec::new();
    if duplicates.count > 0 {
        out.push(warning(
            "duplicate_segments",
            duplicates.count,
            format!(
                "{} share the address of another segment ({} counted twice in the dump's \
                 reserved bytes; the layouts keep one of them); first: {}",
                plural(duplicates.count, "segment", "segments"),
                format_bytes(duplicate_bytes),
                duplicates.first()
            ),
            AFFECTS_RESERVED,
        ));
    }
    if overlaps.count > 0 {
        out.push(warning(
            "overlapping_segments",
            overlaps.count,
            format!(
                "{} overlap the address range of another segment of the device; first: {}",
                plural(overlaps.count, "segment", "segments"),
                overlaps.first()
            ),
            AFFECTS_RESERVED,
        ));
    }
    out
}

/// Blocks must tile their segment: start at its address, follow each other without gap or
/// overlap, and end at its end.
fn blocks_within_segments(segments: &[&Segment]) -> Vec<QualityWarning> {
    let mut overlapping = Tally::default();
    let mut overlapping_segments = 0u64;
    let mut untiled = Tally::default();
    let mut blocks: Vec<(u64, u64)> = Vec::new();
    for s in segments {
        if s.blocks.is_empty() {
            if s.total_size > 0 {
                untiled.add(|| format!("segment {:#x} has no blocks", s.address));
            }
            continue;
        }
        blocks.clear();
        blocks.extend(
            s.blocks
                .iter()
                .map(|b| (b.address, b.address.saturating_add(b.size))),
        );
        blocks.sort_unstable();
        let mut cursor = s.address;
        let mut gap: Option<String> = None;
        let mut overlap_here = 0u64;
        for &(start, end) in &blocks {
            if start < cursor {
                overlap_here += 1;
                if overlapping.first.is_none() {
                    overlapping.first = Some(format!(
                        "in segment {:#x}, the block at {start:#x} starts before {cursor:#x}, \
                         where the previous block (or the segment) begins or ends",
                        s.address
                    ));
                }
            } else if start > cursor && gap.is_none() {
                gap = Some(format!(
                    "segment {:#x}: no block covers {cursor:#x} to {start:#x}",
                    s.address
                ));
            }
            cursor = cursor.max(end);
        }
        let sum: u64 = s.blocks.iter().fold(0u64, |a, b| a.saturating_add(b.size));
        if gap.is_none() && cursor != s.end() {
            gap = Some(format!(
                "segment {:#x} of {} bytes: its blocks end at {cursor:#x}, the segment at {:#x}",
                s.address,
                s.total_size,
                s.end()
            ));
        }
        if gap.is_none() && overlap_here == 0 && sum != s.total_size {
            gap = Some(format!(
                "segment {:#x}: its blocks sum to {sum} bytes, its total_size is {}",
                s.address, s.total_size
            ));
        }
        if overlap_here > 0 {
            overlapping.count += overlap_here;
            overlapping_segments += 1;
        }
        if let Some(g) = gap {
            untiled.add(|| g);
        }
    }
    let mut out = Vec::new();
    if overlapping.count > 0 {
        out.push(warning(
            "overlapping_blocks",
            overlapping.count,
            format!(
                "{} overlap another block (or start before their segment) in {}: their bytes \
                 are counted twice; first: {}",
                plural(overlapping.count, "block", "blocks"),
                plural(overlapping_segments, "segment", "segments"),
                overlapping.first()
            ),
            AFFECTS_BLOCK_TOTALS,
        ));
    }
    if untiled.count > 0 {
        out.push(warning(
            "blocks_do_not_tile",
            untiled.count,
            format!(
                "in {} the blocks leave bytes uncovered or run past the end, so reserved bytes \
                 differ from allocated + free; first: {}",
                plural(untiled.count, "segment", "segments"),
                untiled.first()
            ),
            AFFECTS_LAYOUT,
        ));
    }
    out
}

/// The segment's own `allocated_size`, `active_size` and `requested_size` against its blocks.
fn segment_sums(segments: &[&Segment]) -> Option<QualityWarning> {
    let mut t = Tally::default();
    for s in segments {
        let (mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64);
        for b in &s.blocks {
            if b.state == BlockState::ActiveAllocated {
                allocated = allocated.saturating_add(b.size);
            }
            if b.state.is_active() {
                active = active.saturating_add(b.size);
                requested = requested.saturating_add(b.requested_size);
            }
        }
        let mut wrong = Vec::new();
        if s.allocated_size != allocated {
            wrong.push(format!(
                "allocated_size {} (blocks: {allocated})",
                s.allocated_size
            ));
        }
        if s.active_size != active {
            wrong.push(format!("active_size {} (blocks: {active})", s.active_size));
        }
        if s.requested_size != requested {
            wrong.push(format!(
                "requested_size {} (blocks: {requested})",
                s.requested_size
            ));
        }
        if !wrong.is_empty() {
            t.add(|| format!("segment {:#x}: {}", s.address, wrong.join(", ")));
        }
    }
    (t.count > 0).then(|| {
        warning(
            "segment_sums_disagree",
            t.count,
            format!(
                "{} state sums that disagree with their blocks; this report uses the blocks \
                 (`snapscan stats` pool figures use the segment fields); first: {}",
                plural(t.count, "segment", "segments"),
                t.first()
            ),
            &[],
        )
    })
}

/// Block states this version does not know are counted as free.
fn unknown_block_states(segments: &[&Segment]) -> Option<QualityWarning> {
    let mut t = Tally::default();
    for s in segments {
        for b in &s.blocks {
            if b.state == BlockState::Unknown {
                t.add(|| format!("block {:#x} of segment {:#x}", b.address, s.address));
            }
        }
    }
    (t.count > 0).then(|| {
        warning(
            "unknown_block_state",
            t.count,
            format!(
                "{} an unknown state and {} counted as free; first: {}",
                plural(t.count, "block has", "blocks have"),
                if t.count == 1 { "is" } else { "are" },
                t.first()
            ),
            AFFECTS_BLOCK_TOTALS,
        )
    })
}

/// `free_completed` of an address the trace already freed, with no `alloc` in between: the
/// replay takes each for an allocation made before the window, alive from the start.
fn double_frees(replay: &DeviceReplay) -> Option<QualityWarning> {
    let found = &replay.double_frees;
    let t = Tally {
        count: found.count,
        first: found
            .first
            .map(|(i, addr)| format!("event {i} frees {addr:#x} again")),
    };
    let bytes = found.bytes;
    (t.count > 0).then(|| {
        warning(
            "double_free",
            t.count,
            format!(
                "{} an address the trace had already freed (no alloc in between); the replay \
                 counts each as an allocation made before the window, overstating the start \
                 level and the curves by up to {}; first: {}",
                plural(t.count, "free_completed of", "free_completed events of"),
                format_bytes(bytes),
                t.first()
            ),
            AFFECTS_CURVES,
        )
    })
}

/// Allocations and frees at addresses that lie in no segment the dump or the trace knows.
fn addresses_outside_segments(
    snapshot: &Snapshot,
    device: i64,
    segments: &[&Segment],
    summary: &TraceSummary,
) -> Option<QualityWarning> {
    let trace = snapshot.trace(device);
    let mut ranges: Vec<(u64, u64)> = segments.iter().map(|s| (s.address, s.end())).collect();
    ranges.extend_from_slice(&summary.segment_ranges);
    if ranges.is_empty() {
        return None; // nothing to compare with (a trace recorded without segment events)
    }
    let segments = AddressRanges::new(ranges);
    let t = count_events(trace, TableHint::default, |hint, e| {
        matches!(
            e.action,
            Action::Alloc | Action::FreeRequested | Action::FreeCompleted
        ) && !segments.contains(hint, e.addr)
    })
    .tally(|i| {
        let e = trace.at(i);
        format!("event {i} ({}) at {:#x}", e.action.name(), e.addr)
    });
    (t.count > 0).then(|| {
        warning(
            "address_outside_segments",
            t.count,
            format!(
                "{} at addresses inside no segment of the dump or the trace; the layouts \
                 leave them out; first: {}",
                plural(t.count, "trace entry is", "trace entries are"),
                t.first()
            ),
            &["segments", "fragmentation_at_peak"],
        )
    })
}

/// Address ranges (merged), asked for millions of trace addresses. Tables of 2 MiB granules
/// answer most questions with one load: a granule lies wholly inside one range, wholly outside
/// them all, or (the few at range ends) is searched for. Ranges far apart (other devices' or
/// processes' address spaces, a long run's shifted ranges) get a table each, found by a search
/// over the tables, so that the granules cover where the ranges are, not the span between.
struct AddressRanges {
    merged: Vec<(u64, u64)>,
    /// Per table: its first address, the end of its last range and where its granules start.
    tables: Vec<(u64, u64, usize)>,
    granules: Vec<Granule>,
}

/// The table (first address, end, granule offset) [`AddressRanges::contains`] last used.
#[derive(Default)]
struct TableHint(Option<(u64, u64, usize)>);

#[derive(Clone, Copy, PartialEq)]
enum Granule {
    Outside,
    Inside,
    Search,
}

const GRANULE_SHIFT: u32 = 21;
/// A gap this wide between ranges starts a new table.
const TABLE_GAP: u64 = 1 << 30;
/// Most granules in all: 1 MiB of table, or 32 per range where there are more ranges (a long
/// run's hundreds of thousands of segments); beyond, every address is searched.
const MAX_GRANULES: u64 = 1 << 20;
const MAX_GRANULES_PER_RANGE: u64 = 32;

impl AddressRanges {
    fn new(mut ranges: Vec<(u64, u64)>) -> AddressRanges {
        let max_granules = MAX_GRANULES.max(MAX_GRANULES_PER_RANGE * ranges.len() as u64);
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        let mut tables: Vec<(u64, u64, usize)> = Vec::new();
        let mut total: u64 = 0;
        for &(start, end) in merged.iter().filter(|r| r.0 < r.1) {
            match tables.last_mut() {
                Some(t) if start - t.1 < TABLE_GAP => t.1 = end,
                _ => tables.push((start, end, 0)),
            }
        }
        for t in &mut tables {
            t.2 = total as usize;
            total = total.saturating_add((t.1 - t.0).div_ceil(1 << GRANULE_SHIFT));
        }
        let mut granules = Vec::new();
        if total <= max_granules {
            granules = vec![Granule::Outside; total as usize];
            let mut k = 0;
            for &(start, end) in merged.iter().filter(|r| r.0 < r.1) {
                while tables[k].1 < end {
                    k += 1;
                }
                let (first, _, offset) = tables[k];
                let (a, b) = (start - first, end - first);
                for g in a >> GRANULE_SHIFT..=(b - 1) >> GRANULE_SHIFT {
                    let (lo, hi) = (g << GRANULE_SHIFT, (g + 1) << GRANULE_SHIFT);
                    granules[offset + g as usize] = if a <= lo && hi <= b {
                        Granule::Inside
                    } else {
                        Granule::Search
                    };
                }
            }
        } else {
            tables.clear();
        }
        AddressRanges {
            merged,
            tables,
            granules,
        }
    }

    /// Whether a range holds `addr`. `hint` is the table the last address was in: a trace's
    /// addresses stay in one table for long runs, and the search over hundreds of tables (a
    /// long run's shifted ranges) took most of the time.
    fn contains(&self, hint: &mut TableHint, addr: u64) -> bool {
        if !self.tables.is_empty() {
            let (first, end, offset) = match hint.0 {
                Some(t @ (first, end, _)) if first <= addr && addr < end => t,
                _ => {
                    let t = self.tables.partition_point(|&(first, _, _)| first <= addr);
                    let Some(&t) = t.checked_sub(1).and_then(|t| self.tables.get(t)) else {
                        return false;
                    };
                    hint.0 = Some(t);
                    t
                }
            };
            if addr >= end {
                return false;
            }
            let g = offset + ((addr - first) >> GRANULE_SHIFT) as usize;
            match self.granules.get(g) {
                Some(Granule::Inside) => return true,
                Some(Granule::Outside) | None => return false,
                Some(Granule::Search) => {}
            }
        }
        let i = self.merged.partition_point(|&(start, _)| start <= addr);
        i > 0 && addr < self.merged[i - 1].1
    }
}

/// A level below zero: the trace removes more than the dump and the trace ever held.
fn negative_levels(replay: &DeviceReplay) -> Vec<QualityWarning> {
    let curves: [(&str, &Curve, &[&str], &str); 3] = [
        (
            "requested",
            &replay.requested,
            &[
                "peak.requested_bytes",
                "window.requested_at_start_bytes",
                "live_at_peak",
            ],
            "frees larger than their allocations",
        ),
        (
            "allocated",
            &replay.allocated,
            &[
                "peak.allocated_bytes",
                "peak_allocated",
                "window.allocated_at_start_bytes",
            ],
            "frees larger than their allocations",
        ),
        (
            "reserved",
            &replay.reserved,
            &[
                "peak.reserved_bytes",
                "peak_reserved",
                "window.reserved_at_start_bytes",
            ],
            "segment events that do not add up to the dump's segments (a segment_alloc or \
             segment_map whose segment is neither in the dump nor freed)",
        ),
    ];
    let mut out = Vec::new();
    for (name, curve, affects, cause) in curves {
        // Past the 64-bit range the levels saturate: they are no figures, and a level below
        // zero then says nothing more.
        if let Some(at) = curve.overflow() {
            let when = match at {
                None => "at window start (the dump's figures less what the trace adds)".to_owned(),
                Some(e) => format!("at event {e}"),
            };
            let mut affects = affects.to_vec();
            affects.extend(AFFECTS_CURVES);
            affects.sort_unstable();
            affects.dedup();
            out.push(warning(
                "sums_overflow",
                1,
                format!(
                    "{name} bytes add up past what a signed 64-bit number holds (8 EiB) {when}: \
                     the trace's sizes cannot all be true, so its {name} levels and peaks are \
                     not given"
                ),
                &affects,
            ));
            continue;
        }
        if let Some((at, level)) = curve.first_below_zero() {
            let count = curve.below_zero_count();
            let when = match at {
                None => "at window start".to_owned(),
                Some(e) => format!("after event {e}"),
            };
            out.push(warning(
                "negative_level",
                count,
                format!(
                    "{name} bytes replay to {level} {when} ({}): {cause}",
                    plural(count, "moment below zero", "moments below zero")
                ),
                affects,
            ));
        }
    }
    out
}

/// `snapshot` entries record the device's active bytes at that moment; the replay must agree
/// within what it has to estimate.
fn snapshot_markers(replay: &DeviceReplay, markers: &[(u32, u64)]) -> Option<QualityWarning> {
    if markers.is_empty() {
        return None;
    }
    // Upper slack: each live estimated block may be larger than its estimate. Summed at the
    // markers only, from (event, change) pairs of the estimated allocations (no per-event
    // table: traces run to millions of events).
    let mut changes: Vec<(u32, i64)> = Vec::new();
    let mut slack_start = 0i64;
    for a in replay.allocations.values() {
        if a.block_bytes_exact {
            continue;
        }
        let slack = round_size(a.requested_bytes)
            .saturating_add(BLOCK_SLACK_BYTES)
            .min(i64::MAX as u64 / 4) as i64;
        match a.alloc_event {
            Some(ev) => changes.push((ev, slack)),
            None => slack_start = slack_start.saturating_add(slack),
        }
        if let Some(ev) = a.free_event {
            changes.push((ev, -slack));
        }
    }
    changes.sort_unstable_by_key(|c| c.0);
    let mut next = changes.iter().peekable();
    let mut slack = slack_start;
    // Markers are in event order; the slack after event `ev` includes the changes at `ev`.
    let slack_at: Vec<i64> = markers
        .iter()
        .map(|&(ev, _)| {
            while let Some(&&(at, d)) = next.peek() {
                if at > ev {
                    break;
                }
                slack = slack.saturating_add(d);
                next.next();
            }
            slack
        })
        .collect();
    let pending = replay.window.uncounted_pending_bytes.min(i64::MAX as u64) as i64;
    let mut t = Tally::default();
    for (&(ev, recorded), &slack) in markers.iter().zip(&slack_at) {
        let lo = replay.allocated.at(Some(ev));
        let hi = lo.saturating_add(slack).saturating_add(pending);
        let recorded_i = recorded.min(i64::MAX as u64) as i64;
        if recorded_i < lo || recorded_i > hi {
            t.add(|| {
                if lo == hi {
                    format!("event {ev} records {recorded} active bytes, the replay has {lo}")
                } else {
                    format!(
                        "event {ev} records {recorded} active bytes, the replay has {lo} to {hi}"
                    )
                }
            });
        }
    }
    (t.count > 0).then(|| {
        let mut affects = AFFECTS_CURVES.to_vec();
        affects.push("oom");
        warning(
            "snapshot_marker_mismatch",
            t.count,
            format!(
                "{} the allocator's active bytes at an earlier snapshot, and the replay of the \
                 trace disagrees: events are missing or altered; first: {}",
                plural(t.count, "snapshot entry records", "snapshot entries record"),
                t.first()
            ),
            &affects,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{AddressRanges, TableHint};

    /// Far-apart clusters of many ranges keep granule tables beyond the flat limit (at most 32
    /// granules per range), and they answer right.
    #[test]
    fn many_far_clusters_keep_their_granule_tables() {
        // A long run repeated in shifted address ranges: 600 clusters a TiB apart, each of 100
        // segments of 2 MiB over 4 GiB.
        const MIB: u64 = 1 << 20;
        let ranges: Vec<(u64, u64)> = (0..600u64)
            .flat_map(|c| {
                (0..100u64).map(move |k| {
                    let start = 0x7f00_0000_0000 + (c << 40) + k * 40 * MIB;
                    (start, start + 2 * MIB)
                })
            })
            .collect();
        let set = AddressRanges::new(ranges.clone());
        assert!(set.granules.len() as u64 > super::MAX_GRANULES);
        assert_eq!(set.tables.len(), 600);
        // One hint across all probes (it moves from table to table) and a fresh one each.
        let mut hint = TableHint::default();
        for &(s, e) in ranges.iter().step_by(37) {
            for (addr, want) in [(s - 1, false), (s, true), (e - 1, true), (e, false)] {
                assert_eq!(set.contains(&mut hint, addr), want, "{addr:#x}");
                assert_eq!(set.contains(&mut TableHint::default(), addr), want);
            }
        }
    }

    /// The granule table answers as a plain scan of the ranges would, wherever ranges start and
    /// end inside granules, touch, overlap or lie far apart (a span too wide for a table).
    #[test]
    fn address_ranges_answer_as_a_scan_does() {
        const MIB: u64 = 1 << 20;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let base = 0x7f00_0000_0000u64;
        for case in 0..200 {
            let far = case % 10 == 0;
            let ranges: Vec<(u64, u64)> = (0..1 + next() % 12)
                .map(|_| {
                    let start = base + next() % (64 * MIB) / 512 * 512;
                    let start = if far && next() % 2 == 0 {
                        start + (8 << 40)
                    } else {
                        start
                    };
                    let end = start + next() % (6 * MIB) / 512 * 512;
                    // Some ends on a granule boundary or one byte either side of it.
                    match next() % 4 {
                        0 => (start, (end >> 21 << 21) + next() % 3 - 1),
                        1 => ((start >> 21 << 21) + next() % 3 - 1, end),
                        _ => (start, end),
                    }
                })
                .collect();
            let set = AddressRanges::new(ranges.clone());
            let filled: Vec<&(u64, u64)> = ranges.iter().filter(|r| r.0 < r.1).collect();
            // Ranges far apart get tables of their own, not one over the span between.
            match (
                filled.iter().map(|r| r.0).min(),
                filled.iter().map(|r| r.1).max(),
            ) {
                (Some(lo), Some(hi)) => {
                    assert!(!set.granules.is_empty(), "case {case}");
                    assert_eq!(set.tables.len() > 1, hi - lo > 2 << 40, "case {case}");
                }
                _ => assert!(set.tables.is_empty(), "case {case}"),
            }
            let mut probes: Vec<u64> = vec![0, base - 1, u64::MAX];
            for &(s, e) in &ranges {
                probes.extend([s.wrapping_sub(1), s, s + 1, e.wrapping_sub(1), e, e + 1]);
            }
            probes.extend((0..500).map(|_| base + next() % (72 * MIB)));
            let mut hint = TableHint::default();
            for addr in probes {
                let want = ranges.iter().any(|&(s, e)| s <= addr && addr < e);
                assert_eq!(set.contains(&mut TableHint::default(), addr), want);
                assert_eq!(
                    set.contains(&mut hint, addr),
                    want,
                    "case {case}: {addr:#x} in {ranges:x?}"
                );
            }
        }
    }
}
