//! Builds the [`Report`] from a loaded snapshot: replay, peak, live set, held-open, layout,
//! fragmentation and OOM verdicts, per device.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use rayon::prelude::*;

use super::callsite::{call_site, CallSites};
use super::category::{Categorizer, Category, Claim, Confidence};
use super::layout::{for_each_layout, Detail, Moment, SegmentLayout};
use super::lifetimes::{replay_device, Allocation, DeviceReplay, Origin};
use super::phase::{describe_frames, find_phases, frames_deciding, Phase, Phases, Source};
use super::stats::final_state;
use crate::report::*;
use crate::snapshot::{LoadedSnapshot, PoolKind, Snapshot, StackId};

const SMALL_REQUEST_LIMIT: u64 = 1 << 20;

/// Layouts whose sums are all a report reads of them.
const SUMS: Detail = Detail {
    blocks: false,
    small_hole_limit: 0,
};

/// Options that change what a report contains.
#[derive(Clone, Copy, Debug)]
pub struct ReportOptions {
    pub device: Option<i64>,
    /// How many held-open allocations to list.
    pub held_open_limit: usize,
    /// Entries kept of `live_at_peak` (the largest allocations) and of each `segments` list
    /// (the segments with the most free bytes, in their order); what a list leaves out is
    /// summed beside it (`live_at_peak_omitted`, `segments_omitted`), so the JSON report of a
    /// dump with 40,000 live tensors stays small enough for CI artifacts and `merge`. `None`:
    /// complete lists. Capped here, the allocations and segments left out are never described
    /// one by one.
    pub list_limit: Option<usize>,
    /// A section for every device even in a file of many devices (`--all-devices`); else past
    /// [`MANY_DEVICES`](super::headline::MANY_DEVICES) only the interesting ones have a report
    /// and the rest a row of `device_table`.
    pub all_devices: bool,
    /// Keep the allocator model's block of every allocation ([`DeviceParts::model_blocks`])
    /// where the model runs (a trace with an OOM): the page draws the same holes as the report.
    pub model_blocks: bool,
}

impl Default for ReportOptions {
    fn default() -> Self {
        ReportOptions {
            device: None,
            held_open_limit: 50,
            list_limit: None,
            all_devices: false,
            model_blocks: false,
        }
    }
}

fn site_of(sites: &CallSites, a: &Allocation) -> Arc<str> {
    site_text(sites, a.stack, a.origin.label())
}

/// The call site of `stack`, or `origin` (an [`Origin::label`]) where it names none: shared
/// text, as tens of thousands of allocations at a peak come from a few hundred sites.
fn site_text(sites: &CallSites, stack: StackId, origin: &'static str) -> Arc<str> {
    match sites.of(stack) {
        Some(s) => s,
        None => Arc::from(origin),
    }
}

/// What the report says about each allocation it lists.
struct Describe<'a> {
    sites: CallSites<'a>,
    trace: &'a crate::snapshot::Trace,
    phases: &'a Phases,
    categorizer: Categorizer<'a>,
}

/// The phase claimed for an event: how sure it is, what it rests on in words, the frames that
/// decided it, and a note (`training or eval: unclear`, `no backward yet`).
struct PhaseClaim {
    phase: Phase,
    confidence: &'static str,
    evidence: String,
    frames: Vec<PhaseFrame>,
    note: Option<&'static str>,
}

impl PhaseClaim {
    fn plain(phase: Phase, confidence: &'static str, evidence: String) -> PhaseClaim {
        PhaseClaim {
            phase,
            confidence,
            evidence,
            frames: Vec::new(),
            note: None,
        }
    }
}

fn phase_claim(
    snapshot: &Snapshot,
    trace: &crate::snapshot::Trace,
    phases: &Phases,
    event: Option<u32>,
) -> PhaseClaim {
    let phase = phases.at(event);
    let plain = |c, e: &str| PhaseClaim::plain(phase, c, e.to_owned());
    match (phase, phases.source_at(event)) {
        (Phase::Unknown, _) | (_, Source::None) => PhaseClaim::plain(
            Phase::Unknown,
            "low",
            phases.unknown_reason.clone().unwrap_or_else(|| {
                "no frame, annotation or metadata near the event points to a phase".to_owned()
            }),
        ),
        (_, Source::Frames) => {
            let frames = frames_evidence(snapshot, trace, phases, event);
            let mut words = if frames.is_empty() {
                "the stack frames of the allocations at and around the event".to_owned()
            } else {
                describe_frames(&frames)
            };
            let (confidence, note) = if phase == Phase::Forward && phases.forward_unclear {
                words.push_str(UNCLEAR_WHY);
                ("medium", Some(FORWARD_UNCLEAR))
            } else if phase == Phase::Forward && !phases.backward_in_window {
                words.push_str(", no backward yet");
                ("high", Some(NO_BACKWARD_YET))
            } else {
                ("high", None)
            };
            PhaseClaim {
                phase,
                confidence,
                evidence: words,
                frames,
                note,
            }
        }
        (_, Source::Annotation) => plain("high", "the optimizer's record_function range around the event"),
        (_, Source::UserMetadata) => plain("high", "the trace entries' user metadata"),
        (_, Source::Position) => plain(
            "medium",
            "position: frameless allocations in a run that records Python stacks come from autograd's backward thread",
        ),
        (_, Source::StepPosition) => plain(
            "low",
            "position only: the event lies between the optimizer's annotated ranges, on the rising (forward) or falling (backward) side of its step's memory; nothing in the trace names the phase",
        ),
    }
}

/// The note of a forward that nothing tells apart as training or evaluation, and why.
pub const FORWARD_UNCLEAR: &str = "training or eval: unclear";
pub const UNCLEAR_WHY: &str = "; no backward, optimizer or training loop in the window, and no \
    evaluation, generation or no_grad frame";
/// The note of a training forward before any backward in the window.
pub const NO_BACKWARD_YET: &str = "no backward yet";

/// The frames that decided the phase at `event`: of the event's own stack, or of the latest
/// allocation before it whose frames decided one (frees and segment events take the phase
/// around them). Looks back a bounded number of events.
fn frames_evidence(
    snapshot: &Snapshot,
    trace: &crate::snapshot::Trace,
    phases: &Phases,
    event: Option<u32>,
) -> Vec<PhaseFrame> {
    const LOOK_BACK: usize = 10_000;
    let (Some(e), Some(last)) = (event, trace.len().checked_sub(1)) else {
        return Vec::new();
    };
    let e = (e as usize).min(last);
    (e.saturating_sub(LOOK_BACK)..=e)
        .rev()
        .filter(|&i| phases.per_event.source(i) == Source::Frames)
        .map(|i| frames_deciding(&snapshot.interner, &phases.frame_marks, trace.at(i).frames))
        .find(|f| !f.is_empty())
        .unwrap_or_default()
}

/// The phase of a peak that is the state at window start (or of a dump without a trace): the
/// latest activity the stacks of the blocks alive then show. Loading comes first in any run,
/// so any other phase found is later.
fn state_phase(
    snapshot: &Snapshot,
    phases: &Phases,
    live: &[&Allocation],
) -> (Phase, &'static str, String) {
    let mut bytes = [0u64; Phase::ALL.len()];
    for a in live {
        if a.stack == StackId::EMPTY {
            continue;
        }
        if let Some(p) = phases.of_stack(&snapshot.interner, a.stack) {
            bytes[p as usize] = bytes[p as usize].saturating_add(a.requested_bytes);
        }
    }
    let later = [
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::Eval,
    ]
    .into_iter()
    .filter(|p| bytes[*p as usize] > 0)
    .max_by_key(|p| bytes[*p as usize]);
    let live_bytes = live
        .iter()
        .fold(0u64, |sum, a| sum.saturating_add(a.requested_bytes));
    let phase =
        match later {
            // A few bytes of a later phase (a cached cuBLAS workspace) do not say what was running.
            Some(p) if (bytes[p as usize] as f64) < 0.05 * live_bytes as f64 => {
                return (
                    Phase::Unknown,
                    "low",
                    format!(
                    "the peak is the state at the start of the window (or the dump's own state); \
                     only {:.1}% of the bytes alive then have stacks that point to a phase ({})",
                    100.0 * bytes[p as usize] as f64 / live_bytes.max(1) as f64,
                    p.name()
                ),
                )
            }
            Some(p) => p,
            None if bytes[Phase::Load as usize] > 0 => Phase::Load,
            None => return (
                Phase::Unknown,
                "low",
                "the peak is the state at the start of the window (or the dump's own state) and \
                 no stack of the blocks alive then points to a phase"
                    .to_owned(),
            ),
        };
    (
        phase,
        "medium",
        "the stacks of the blocks alive at the peak (the state at window start: no event of its \
         own), latest activity first"
            .to_owned(),
    )
}

fn live_allocation(d: &Describe, a: &Allocation, at: Option<u32>) -> LiveAllocation {
    let claim = d.categorizer.categorize(a);
    let mut live = described(&d.sites, d.trace, d.phases, a, claim, at);
    live.annotations = annotation_texts(&d.categorizer, a);
    live
}

/// The user's annotations of `a`, as text.
fn annotation_texts(categorizer: &Categorizer, a: &Allocation) -> Vec<String> {
    categorizer
        .annotations
        .of_allocation(a)
        .iter()
        .map(|&t| categorizer.interner.get_text(t).to_owned())
        .collect()
}

/// [`live_allocation`] with the category already claimed (and call sites of this thread).
fn described(
    sites: &CallSites,
    trace: &crate::snapshot::Trace,
    phases: &Phases,
    a: &Allocation,
    (category, confidence): (Category, Confidence),
    at: Option<u32>,
) -> LiveAllocation {
    LiveAllocation {
        address: a.address,
        requested_bytes: a.requested_bytes,
        block_bytes: a.block_bytes,
        alloc_event: a.alloc_event,
        free_event: a.free_event,
        alloc_time_us: a
            .alloc_event
            .and_then(|e| trace.get(e as usize))
            .and_then(|e| e.time_us),
        age_events: match (a.alloc_event, at) {
            (Some(b), Some(p)) => Some(p - b),
            _ => None,
        },
        call_site: site_of(sites, a),
        stream: a.stream,
        phase: Cow::Borrowed(phases.at(a.alloc_event).name()),
        category: Cow::Borrowed(category.name()),
        confidence: Cow::Borrowed(confidence.name()),
        annotations: Vec::new(),
    }
}

/// Bytes, count, the largest allocation (bytes, position) and its stack, of one call site.
type SiteGroup = (u64, u64, (u64, usize), StackId);

/// Allocations grouped by call site as the report groups its live set at the peak (largest
/// first, `share` of `total`), each site's stack named by `stack_id` in the returned table.
pub fn call_site_table<'a>(
    snapshot: &Snapshot,
    allocations: impl Iterator<Item = &'a Allocation>,
    total: i64,
) -> (Vec<CallSiteBytes>, crate::report::StackTable) {
    let mut sites = by_call_site(&CallSites::new(&snapshot.interner), allocations, total);
    let stacks = super::callsite::stack_table(&snapshot.interner, sites.iter_mut());
    (sites, stacks)
}

/// Per category, the call site holding most of its bytes among `live` (claimed as `claims`,
/// in the same order); of equal sites the first by text.
fn top_sites_by_category(
    sites: &CallSites,
    live: &[&Allocation],
    claims: &[(Category, Confidence)],
) -> std::collections::BTreeMap<String, SiteBytes> {
    // By (category, stack, origin) first: the site's text is made once per group.
    let mut by_stack: rustc_hash::FxHashMap<(Category, StackId, Origin), u64> = Default::default();
    for (a, &(category, _)) in live.iter().zip(claims) {
        let b = by_stack.entry((category, a.stack, a.origin)).or_insert(0);
        *b = b.saturating_add(a.requested_bytes);
    }
    let mut by_site: HashMap<(Category, Arc<str>), u64> = HashMap::new();
    for ((category, stack, origin), bytes) in by_stack {
        let b = by_site
            .entry((category, site_text(sites, stack, origin.label())))
            .or_insert(0);
        *b = b.saturating_add(bytes);
    }
    let mut top: std::collections::BTreeMap<String, SiteBytes> = Default::default();
    for ((category, site), bytes) in by_site {
        let slot = top.entry(category.name().to_owned()).or_insert(SiteBytes {
            call_site: String::new(),
            bytes: 0,
        });
        if (bytes, std::cmp::Reverse(&*site)) > (slot.bytes, std::cmp::Reverse(&*slot.call_site)) {
            *slot = SiteBytes {
                call_site: site.to_string(),
                bytes,
            };
        }
    }
    top.retain(|_, s| s.bytes > 0);
    top
}

/// Groups allocations by call site, largest first.
fn by_call_site<'a>(
    sites: &CallSites,
    allocations: impl Iterator<Item = &'a Allocation>,
    total: i64,
) -> Vec<CallSiteBytes> {
    // By stack and origin first (cheap keys; the site text is made once per group): bytes,
    // count, and the largest allocation as (bytes, position) — the last of equals wins, as
    // it did when grouping by text directly. The origin is keyed as itself: hashing its
    // label's text for each of the hundreds of thousands of allocations at a big peak was
    // most of this.
    type Group = (u64, u64, (u64, usize));
    let mut by_stack: rustc_hash::FxHashMap<(StackId, Origin), Group> = Default::default();
    for (i, a) in allocations.enumerate() {
        let g = by_stack
            .entry((a.stack, a.origin))
            .or_insert((0, 0, (0, 0)));
        g.0 = g.0.saturating_add(a.requested_bytes);
        g.1 += 1;
        if (a.requested_bytes, i) >= g.2 {
            g.2 = (a.requested_bytes, i);
        }
    }
    let mut groups: HashMap<Arc<str>, SiteGroup> = HashMap::new();
    for ((stack, origin), (bytes, count, largest)) in by_stack {
        let g = groups
            .entry(site_text(sites, stack, origin.label()))
            .or_insert((0, 0, (0, 0), StackId::EMPTY));
        g.0 = g.0.saturating_add(bytes);
        g.1 += count;
        if largest >= g.2 {
            g.2 = largest;
            g.3 = stack;
        }
    }
    let mut out: Vec<CallSiteBytes> = groups
        .into_iter()
        .map(|(site, (bytes, count, _, stack))| CallSiteBytes {
            call_site: site.to_string(),
            bytes,
            count,
            share: if total > 0 {
                bytes as f64 / total as f64
            } else {
                0.0
            },
            // The interner's id until `finish_call_sites` numbers the report's table.
            stack_id: (stack != StackId::EMPTY).then_some(stack.0),
            code: None,
            your_code: None,
            via: None,
        })
        .collect();
    out.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| a.call_site.cmp(&b.call_site))
    });
    out
}

/// The segments a report lists, gathered one layout at a time: the `limit` with the most free
/// bytes (ties: the bigger, then the earlier), in address order, and the sums of the rest. Only
/// the kept ones become reports: a big dump has tens of thousands of segments.
struct SegmentList {
    limit: usize,
    seen: usize,
    /// The kept segments, the least free on top.
    kept: std::collections::BinaryHeap<std::cmp::Reverse<Ranked>>,
    omitted: OmittedSegments,
}

/// A kept segment and its rank (greater is kept first).
struct Ranked {
    rank: (u64, u64, std::cmp::Reverse<usize>),
    report: SegmentReport,
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank
    }
}
impl Eq for Ranked {}
impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank.cmp(&other.rank)
    }
}

impl SegmentList {
    /// `None`: every segment, nothing omitted.
    fn new(limit: Option<usize>) -> SegmentList {
        SegmentList {
            limit: limit.unwrap_or(usize::MAX),
            seen: 0,
            kept: Default::default(),
            omitted: OmittedSegments::default(),
        }
    }

    fn add(&mut self, s: &SegmentLayout) {
        let rank = (s.free_bytes, s.total_bytes, std::cmp::Reverse(self.seen));
        self.seen += 1;
        if self.kept.len() < self.limit {
            self.kept.push(std::cmp::Reverse(Ranked {
                rank,
                report: segment_report(s),
            }));
            return;
        }
        match self.kept.peek() {
            Some(least) if rank > least.0.rank => {
                if let Some(out) = self.kept.pop() {
                    self.omit(&out.0.report);
                }
                self.kept.push(std::cmp::Reverse(Ranked {
                    rank,
                    report: segment_report(s),
                }));
            }
            _ => self.omit(&segment_report(s)),
        }
    }

    fn omit(&mut self, s: &SegmentReport) {
        let rest = &mut self.omitted;
        rest.count += 1;
        rest.total_bytes = rest.total_bytes.saturating_add(s.total_bytes);
        rest.allocated_bytes = rest.allocated_bytes.saturating_add(s.allocated_bytes);
        rest.free_bytes = rest.free_bytes.saturating_add(s.free_bytes);
        rest.count_with_free_bytes += u64::from(s.free_bytes > 0);
    }

    /// The kept reports in address order, and the sums of the rest when any were left out.
    fn finish(self) -> (Vec<SegmentReport>, Option<OmittedSegments>) {
        let mut kept: Vec<Ranked> = self.kept.into_iter().map(|r| r.0).collect();
        kept.sort_unstable_by_key(|r| std::cmp::Reverse(r.rank.2));
        let omitted = (self.seen > self.limit).then_some(self.omitted);
        (kept.into_iter().map(|r| r.report).collect(), omitted)
    }
}

fn segment_report(s: &SegmentLayout) -> SegmentReport {
    SegmentReport {
        address: s.address,
        total_bytes: s.total_bytes,
        allocated_bytes: s.allocated_bytes,
        holes: s.holes,
        largest_hole_bytes: s.largest_hole_bytes,
        free_bytes: s.free_bytes,
        internal_waste_bytes: s.internal_waste_bytes,
        stream: s.stream,
        pool: s.pool_id.map(|(a, b)| [a, b]),
        segment_type: Cow::Borrowed(kind_name(s.pool_kind)),
        expandable: s.expandable,
    }
}

fn kind_name(kind: PoolKind) -> &'static str {
    match kind {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
        PoolKind::Unknown => "unknown",
    }
}

/// The figures of a layout laid out with `largest_request` as its small-hole limit, summed
/// one segment at a time.
#[derive(Default)]
struct LayoutSums {
    reserved: u64,
    allocated: u64,
    free: u64,
    largest_hole: u64,
    unusable: u64,
    holes: u64,
}

impl LayoutSums {
    // Saturating sums: a corrupt file can hold sizes near 2^64 (flagged by `quality`).
    fn add(&mut self, s: &SegmentLayout) {
        self.reserved = self.reserved.saturating_add(s.total_bytes);
        self.allocated = self.allocated.saturating_add(s.allocated_bytes);
        self.free = self.free.saturating_add(s.free_bytes);
        self.largest_hole = self.largest_hole.max(s.largest_hole_bytes);
        self.unusable = self.unusable.saturating_add(s.small_hole_bytes);
        self.holes += s.holes;
    }

    fn fragmentation(&self, largest_request: u64) -> Fragmentation {
        Fragmentation {
            reserved_bytes: self.reserved,
            allocated_bytes: self.allocated,
            reserved_unallocated_bytes: self.reserved.saturating_sub(self.allocated),
            holes: self.holes,
            largest_hole_bytes: self.largest_hole,
            largest_request_bytes: largest_request,
            unusable_for_largest_request_bytes: self.unusable,
            fragmentation_ratio: if self.free > 0 {
                1.0 - self.largest_hole as f64 / self.free as f64
            } else {
                0.0
            },
        }
    }
}

/// The low point of the valley just before the peak's "hill": walking back from the peak, the
/// hill is where requested bytes stay at or above half-way between the lowest level before the
/// peak and the peak; the valley is the run below that before it; its (latest) minimum is the
/// low point. Allocations alive there carried over into the peak's build-up.
fn low_point_before(replay: &DeviceReplay, peak_event: Option<u32>) -> (Option<u32>, i64) {
    let curve = &replay.requested;
    let Some(p) = peak_event else {
        return (None, curve.start);
    };
    let before = || curve.levels().take(p as usize);
    let floor = before().chain([curve.start]).min().unwrap_or(curve.start);
    let peak = curve.at(Some(p));
    let half = floor + (peak - floor) / 2;
    let mut in_valley = false;
    let mut best: Option<(Option<u32>, i64)> = None;
    for (i, v) in before().enumerate().rev() {
        if v < half {
            in_valley = true;
            if best.is_none_or(|(_, b)| v < b) {
                best = Some((Some(i as u32), v));
            }
        } else if in_valley {
            return best.unwrap_or((None, curve.start));
        }
    }
    match best {
        Some(b) if curve.start >= b.1 => b,
        _ => (None, curve.start),
    }
}

/// Past this many OOM events on one device, the report details [`OOMS_WORST`] of them besides
/// the first and the last, and counts the rest (each detail reconstructs the layout at its
/// moment, a walk of the trace: 25 000 OOMs of a batch-size finder took 14.7 s).
pub const MAX_OOMS_DETAILED: usize = 16;
/// The worst OOMs detailed past [`MAX_OOMS_DETAILED`]: those that missed most (the request
/// minus the device's free memory, then the request).
pub const OOMS_WORST: usize = 6;

/// The OOM events to detail (in trace order) and how many are left out (`None`: none).
fn ooms_detailed(trace: &crate::snapshot::Trace, ooms: &[u32]) -> (Vec<u32>, Option<u64>) {
    if ooms.len() <= MAX_OOMS_DETAILED {
        return (ooms.to_vec(), None);
    }
    let (first, last) = (ooms[0], ooms[ooms.len() - 1]);
    let mut middle: Vec<(u64, u64, u32)> = ooms[1..ooms.len() - 1]
        .iter()
        .map(|&i| {
            let e = trace.at(i as usize);
            let missed = e.size.saturating_sub(e.device_free.unwrap_or(0));
            (missed, e.size, i)
        })
        .collect();
    // Worst first; of equal ones the earliest.
    let worst = OOMS_WORST.min(middle.len());
    if worst > 0 {
        middle.select_nth_unstable_by(worst - 1, |a, b| (b.0, b.1, a.2).cmp(&(a.0, a.1, b.2)));
    }
    let mut keep: Vec<u32> = middle[..worst].iter().map(|m| m.2).collect();
    keep.push(first);
    keep.push(last);
    keep.sort_unstable();
    let omitted = (ooms.len() - keep.len()) as u64;
    (keep, Some(omitted))
}

fn oom_report(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    phases: &Phases,
    event: u32,
    list_limit: Option<usize>,
) -> Oom {
    let entry = &snapshot.trace(replay.device).at(event as usize);
    let request = entry.size;
    let wanted_kind = if request <= SMALL_REQUEST_LIMIT {
        PoolKind::Small
    } else {
        PoolKind::Large
    };
    let (mut reserved, mut allocated, mut largest) = (0u64, 0u64, 0u64);
    // The request's pool: the entry's `pool_id` (torch 2.12+), else the default pool.
    let request_pool = entry.pool_id.unwrap_or(super::pools::DEFAULT_POOL);
    let mut other_pools = 0u64;
    let mut listed = SegmentList::new(list_limit);
    for_each_layout(snapshot, replay, Moment::After(event), SUMS, &mut |s| {
        reserved = reserved.saturating_add(s.total_bytes);
        allocated = allocated.saturating_add(s.allocated_bytes);
        let same_pool = s.pool_id.unwrap_or(super::pools::DEFAULT_POOL) == request_pool;
        if !same_pool {
            other_pools = other_pools.saturating_add(s.total_bytes);
        }
        if s.stream == entry.stream
            && same_pool
            && (s.pool_kind == wanted_kind || s.pool_kind == PoolKind::Unknown)
        {
            largest = largest.max(s.largest_hole_bytes);
        }
        listed.add(&s);
    });
    let unallocated = reserved.saturating_sub(allocated);
    let verdict = if unallocated >= request && largest < request {
        "fragmentation"
    } else {
        "full"
    };
    let live_total = replay.requested.at(Some(event));
    let (segments, segments_omitted) = listed.finish();
    let oom_phase = phase_claim(snapshot, snapshot.trace(replay.device), phases, Some(event));
    Oom {
        reserved_in_other_pools_bytes: other_pools,
        event_index: event,
        time_us: entry.time_us,
        requested_bytes: request,
        device_free_bytes: entry.device_free,
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        reserved_unallocated_bytes: unallocated,
        largest_free_block_bytes: largest,
        segment_type: kind_name(wanted_kind).to_owned(),
        stream: entry.stream,
        verdict: verdict.to_owned(),
        phase: oom_phase.phase.name().to_owned(),
        phase_confidence: oom_phase.confidence.to_owned(),
        phase_evidence: oom_phase.evidence,
        phase_frames: oom_phase.frames,
        phase_note: oom_phase.note.map(str::to_owned),
        call_site: call_site(&snapshot.interner, entry.frames),
        live_by_call_site: by_call_site(
            &CallSites::new(&snapshot.interner),
            replay.live(Some(event)).collect::<Vec<_>>().iter(),
            live_total,
        ),
        segments,
        segments_omitted,
        why: None,
        reproduced_by_model: None,
    }
}

/// The allocator model at the detailed OOMs: its exact largest usable hole (same pool, stream
/// and size class) replaces the layout's estimate, and its causal chain is added.
fn allocator_at_ooms(
    snapshot: &Snapshot,
    device: i64,
    events: Vec<u32>,
    block_sizes: bool,
) -> crate::allocator::Simulation {
    let (settings, _) = crate::allocator::Settings::from_snapshot(snapshot);
    let opts = crate::allocator::Options {
        placements: false,
        only_ooms: Some(events),
        block_sizes,
    };
    crate::allocator::simulate(snapshot, device, &settings, &opts)
}

fn apply_allocator(
    report: &mut DeviceReport,
    sim: &crate::allocator::Simulation,
    snapshot: &Snapshot,
) {
    let trace = snapshot.trace(sim.device);
    let time = |e: u32| trace.get(e as usize).and_then(|t| t.time_us);
    for o in &mut report.oom {
        let Some(m) = sim.ooms.iter().find(|m| m.event == o.event_index) else {
            continue;
        };
        let why =
            super::allocator_replay::why_out(&m.why, &snapshot.interner, m.event, &time, true);
        o.largest_free_block_bytes = why.pool_largest_free_bytes;
        o.verdict = if o.reserved_unallocated_bytes >= o.requested_bytes
            && o.largest_free_block_bytes < o.requested_bytes
        {
            "fragmentation"
        } else {
            "full"
        }
        .to_owned();
        o.reproduced_by_model = Some(m.reproduced);
        o.why = Some(why);
    }
}

pub fn device_report(snapshot: &Snapshot, device: i64, options: &ReportOptions) -> DeviceReport {
    analyse_device(snapshot, device, options).report
}

/// A device's report with what it was made from, kept for the questions it does not answer
/// (the SQL store's rows, the MCP server's live sets at any event).
pub struct DeviceAnalysis {
    pub report: DeviceReport,
    pub parts: DeviceParts,
}

/// What a device's report was made from.
pub struct DeviceParts {
    pub replay: DeviceReplay,
    /// With the training steps' positions filled in, as the report read them.
    pub phases: Phases,
    /// With [`ReportOptions::model_blocks`] and an OOM: the block the allocator model handed
    /// each alloc (by event, its unsplit remainder included) and the blocks alive at the window
    /// start (by address).
    pub model_blocks: Option<ModelBlocks>,
}

/// Block sizes from the allocator model (see [`DeviceParts::model_blocks`]).
#[derive(Default)]
pub struct ModelBlocks {
    pub by_alloc_event: rustc_hash::FxHashMap<u32, u64>,
    pub at_start: rustc_hash::FxHashMap<u64, u64>,
}

/// [`device_report`], keeping its replay and phases.
pub fn analyse_device(snapshot: &Snapshot, device: i64, options: &ReportOptions) -> DeviceAnalysis {
    // The replay, the phases and the data-quality checks each read the whole trace: on big
    // traces they run side by side.
    let mut timer = crate::timing::Timer::new();
    // The replay reads the trace in order, on one core; the others find phases, summarize
    // the trace and run the checks that need no replay.
    let (replay, (mut phases, (summary, checks, (dump, pools)))) = rayon::join(
        || replay_device(snapshot, device),
        || {
            rayon::join(
                || find_phases(snapshot, device),
                || {
                    let summary = super::summary::summarize(snapshot, device);
                    let checks = super::quality::trace_checks(snapshot, device, &summary);
                    // The dump's sums need no replay either (the replay takes longer).
                    let dump = final_state(snapshot.segments_of(device));
                    let pools = super::pools::at_dump(snapshot, device);
                    (summary, checks, (dump, pools))
                },
            )
        },
    );
    timer.lap("replay, phases and trace summary");
    phases.fill_by_step_position(snapshot.trace(device), &replay.requested);
    // The allocator model runs only where there is an OOM to explain, beside the rest.
    let (detailed, _) = ooms_detailed(snapshot.trace(device), &summary.ooms);
    let (mut report, sim) = rayon::join(
        || {
            device_report_with(
                snapshot,
                device,
                options,
                &replay,
                &phases,
                &summary,
                (dump, pools),
            )
        },
        || {
            (!detailed.is_empty()).then(|| {
                allocator_at_ooms(snapshot, device, detailed.clone(), options.model_blocks)
            })
        },
    );
    let mut model_blocks = None;
    if let Some(mut sim) = sim {
        if options.model_blocks {
            model_blocks = Some(ModelBlocks {
                by_alloc_event: std::mem::take(&mut sim.block_sizes),
                at_start: std::mem::take(&mut sim.start_block_sizes),
            });
        }
        apply_allocator(&mut report, &sim, snapshot);
        super::advice::check_advice(&mut report, snapshot, sim);
    }
    report.data_quality = super::quality::device_quality(&replay, checks, &summary);
    report
        .data_quality
        .extend(super::quality::bytes_after_stop(snapshot));
    finish_call_sites(&mut report, snapshot, options);
    timer.lap("the rest of the report");
    DeviceAnalysis {
        report,
        parts: DeviceParts {
            replay,
            phases,
            model_blocks,
        },
    }
}

/// Call sites listed by default: the largest, and every other that holds this share or more.
const SITES_LISTED: usize = 50;
const SITE_SHARE_LISTED: f64 = 0.01;

/// The call-site tables as the report gives them: capped (unless complete lists were asked
/// for) at the sites that matter, their stacks in one table, each once (a forward-only dump
/// of 646 sites with whole C++ stacks gave a 2.4 MB report).
fn finish_call_sites(report: &mut DeviceReport, snapshot: &Snapshot, options: &ReportOptions) {
    if options.list_limit.is_some() {
        let sites = &mut report.live_at_peak_by_call_site;
        let keep = sites
            .iter()
            .enumerate()
            .take_while(|(i, s)| *i < SITES_LISTED || s.share >= SITE_SHARE_LISTED)
            .count();
        if keep < sites.len() {
            let rest = sites.split_off(keep);
            report.live_at_peak_by_call_site_omitted = Some(OmittedSites {
                count: rest.len() as u64,
                bytes: rest.iter().map(|s| s.bytes).fold(0, u64::saturating_add),
            });
        }
    }
    let tables = report
        .live_at_peak_by_call_site
        .iter_mut()
        .chain(report.held_open.by_call_site.iter_mut())
        .chain(
            report
                .oom
                .iter_mut()
                .flat_map(|o| o.live_by_call_site.iter_mut()),
        )
        .chain(
            report
                .step_growth
                .iter_mut()
                .flat_map(|g| g.kept_into_later_steps_by_call_site.iter_mut()),
        );
    report.stacks = super::callsite::stack_table(&snapshot.interner, tables);
}

/// What the report sums of the claims on the allocations alive at the peak (requested bytes).
#[derive(Default)]
struct ClaimSums {
    /// Allocated before the window, of unknown category or low confidence.
    unsure_before_window: u64,
    by_category: rustc_hash::FxHashMap<Category, u64>,
    /// By the phase of the allocation (`before_window` when before the window).
    by_phase: rustc_hash::FxHashMap<&'static str, u64>,
    /// By claim, the evidence keyed by where its text lies: hashing the text (up to a hundred
    /// bytes) for each allocation took most of the summing. See [`ClaimSums::by_claim`].
    by_claim: rustc_hash::FxHashMap<(Category, Confidence, usize, usize), (&'static str, u64)>,
}

impl ClaimSums {
    fn add(&mut self, a: &Allocation, c: &Claim, phases: &Phases) {
        let bytes = a.requested_bytes;
        let add = |slot: &mut u64| *slot = slot.saturating_add(bytes);
        if a.alloc_event.is_none()
            && (c.category == Category::Unknown || c.confidence == Confidence::Low)
        {
            add(&mut self.unsure_before_window);
        }
        add(self.by_category.entry(c.category).or_default());
        let phase = match a.alloc_event {
            None => "before_window",
            Some(_) => phases.at(a.alloc_event).name(),
        };
        add(self.by_phase.entry(phase).or_default());
        let e = c.evidence;
        let key = (c.category, c.confidence, e.as_ptr() as usize, e.len());
        add(&mut self.by_claim.entry(key).or_insert((e, 0)).1);
    }

    /// Bytes by category, confidence and evidence text (equal texts at two places are one).
    fn by_claim(&self) -> HashMap<(Category, Confidence, &'static str), u64> {
        let mut out: HashMap<(Category, Confidence, &'static str), u64> = HashMap::new();
        for (&(category, confidence, _, _), &(evidence, bytes)) in &self.by_claim {
            let slot = out.entry((category, confidence, evidence)).or_default();
            *slot = slot.saturating_add(bytes);
        }
        out
    }

    /// These sums and `other`'s (saturating sums of bytes: in any order alike).
    fn then(mut self, other: ClaimSums) -> ClaimSums {
        let add = |slot: &mut u64, bytes: u64| *slot = slot.saturating_add(bytes);
        add(&mut self.unsure_before_window, other.unsure_before_window);
        for (k, v) in other.by_category {
            add(self.by_category.entry(k).or_default(), v);
        }
        for (k, v) in other.by_phase {
            add(self.by_phase.entry(k).or_default(), v);
        }
        for (k, (e, v)) in other.by_claim {
            add(&mut self.by_claim.entry(k).or_insert((e, 0)).1, v);
        }
        self
    }
}

/// The report of one device, but its data-quality checks.
fn device_report_with(
    snapshot: &Snapshot,
    device: i64,
    options: &ReportOptions,
    replay: &DeviceReplay,
    phases: &Phases,
    summary: &super::summary::TraceSummary,
    (dump, pools_at_dump): (FinalState, super::pools::AtDump),
) -> DeviceReport {
    let trace = snapshot.trace(device);
    let (peak_requested, peak_event) = replay.requested.peak();
    let (peak_allocated, peak_allocated_event) = replay.allocated.peak();
    let (peak_reserved, peak_reserved_event) = replay.reserved.peak();
    // The categorizer, the two layouts and the allocations alive at the peak each read every
    // allocation: side by side. Sums only, with the holes too small for the largest request
    // counted.
    let detail = Detail {
        blocks: false,
        small_hole_limit: summary.largest_request,
    };
    // Each layout is folded into what the report keeps of it at once (a big dump has
    // hundreds of thousands of segments).
    let layouts = || {
        rayon::join(
            || {
                let mut sums = LayoutSums::default();
                let mut listed = SegmentList::new(options.list_limit);
                let moment = match peak_event {
                    Some(e) => Moment::After(e),
                    None => Moment::WindowStart,
                };
                for_each_layout(snapshot, replay, moment, detail, &mut |s| {
                    sums.add(&s);
                    listed.add(&s);
                });
                (listed.finish(), sums.fragmentation(detail.small_hole_limit))
            },
            || {
                let mut sums = LayoutSums::default();
                for_each_layout(snapshot, replay, Moment::End, detail, &mut |s| sums.add(&s));
                sums.fragmentation(detail.small_hole_limit)
            },
        )
    };
    // Largest first, then by address, then in the replay's order (traced ones by birth, then
    // the dump's): a total order, so the sort needs no scratch copy of the live set.
    let live_sorted = || {
        let mut live = replay.live_map(peak_event, |a| a);
        live.par_sort_unstable_by(|a, b| {
            b.requested_bytes
                .cmp(&a.requested_bytes)
                .then(a.address.cmp(&b.address))
                .then(a.alloc_event.is_none().cmp(&b.alloc_event.is_none()))
                .then(a.alloc_event.cmp(&b.alloc_event))
                .then(a.free_event.is_none().cmp(&b.free_event.is_none()))
                .then(a.free_event.cmp(&b.free_event))
        });
        live
    };
    let (categorizer, (((segments, fragmentation_at_peak), fragmentation_at_end), live_owned)) =
        rayon::join(
            || Categorizer::new(snapshot, phases, replay),
            || rayon::join(layouts, live_sorted),
        );
    let describe = Describe {
        sites: CallSites::new(&snapshot.interner),
        trace,
        phases,
        categorizer,
    };
    let time_at = |e: Option<u32>| {
        e.and_then(|i| trace.get(i as usize))
            .and_then(|t| t.time_us)
    };

    let live: Vec<&Allocation> = live_owned.iter().collect();
    // Claimed once for every live allocation (tens of thousands at a real peak), on every core,
    // and summed as they come: what is kept of each claim is its category and confidence.
    let categorizer = &describe.categorizer;
    let (claims, claim_sums): (Vec<(Category, Confidence)>, ClaimSums) = live
        .par_iter()
        .with_min_len(4096)
        .fold(
            || (Vec::new(), ClaimSums::default()),
            |(mut claims, mut sums), a| {
                let c = categorizer.claim(a);
                sums.add(a, &c, phases);
                claims.push((c.category, c.confidence));
                (claims, sums)
            },
        )
        .reduce(
            || (Vec::new(), ClaimSums::default()),
            |(mut claims, sums), (more, more_sums)| {
                claims.extend(more);
                (claims, sums.then(more_sums))
            },
        );
    let unsure_before_window_bytes = claim_sums.unsure_before_window;
    let top_call_site_by_category_at_peak = top_sites_by_category(&describe.sites, &live, &claims);
    let listed = options.list_limit.unwrap_or(usize::MAX).min(live.len());
    let live_at_peak_omitted = (listed < live.len()).then(|| {
        let rest = &live[listed..];
        OmittedAllocations {
            count: rest.len() as u64,
            requested_bytes: rest.iter().map(|a| a.requested_bytes).sum(),
            block_bytes: rest.iter().map(|a| a.block_bytes).sum(),
        }
    });
    let live_at_peak: Vec<LiveAllocation> = live[..listed]
        .par_iter()
        .zip(&claims)
        .map_init(
            || CallSites::new(&snapshot.interner),
            |sites, (a, &claim)| {
                let mut live = described(sites, trace, phases, a, claim, peak_event);
                live.annotations = annotation_texts(categorizer, a);
                live
            },
        )
        .collect();

    // Held open: what was alive at the peak but did not have to be: left over from an earlier
    // step (last step's gradients, activations, replaced optimizer tensors, kept eval outputs)
    // or from before the window, and not weights or optimizer state kept across steps. Without
    // steps, "earlier" is before the peak's phase began, or before the last low point of the
    // requested curve when phases are unknown.
    let peak_step = phases.step_at(peak_event);
    let step_start = peak_step.and_then(|st| {
        phases
            .intervals
            .iter()
            .find(|iv| iv.step == Some(st))
            .map(|iv| iv.first_event)
    });
    let phase_start = peak_event
        .and_then(|e| phases.interval_of(e))
        .map(|i| &phases.intervals[i])
        .filter(|iv| iv.name != Phase::Unknown);
    let (boundary, boundary_event, definition) = match (step_start, peak_step, phase_start) {
        // The step's own activations are what its backward needs; only what is older counts.
        (Some(first), Some(st), _) => (
            "step_start",
            first.checked_sub(1),
            format!(
                "alive at the peak but left over from before step {st} began (event {first}) or \
                 from before the window, and neither weights nor optimizer state kept across \
                 steps: earlier steps' gradients, activations or replaced optimizer tensors; \
                 releasing them earlier would lower the peak"
            ),
        ),
        (_, _, Some(iv)) => (
            "phase_start",
            iv.first_event.checked_sub(1),
            format!(
                "alive at the peak, allocated before the {} phase that contains it began (event \
                 {}), and not weights or optimizer state kept across steps: releasing these \
                 earlier would lower the peak",
                iv.name.name(),
                iv.first_event
            ),
        ),
        _ => {
            let (low_event, _) = low_point_before(replay, peak_event);
            (
                "low_point",
                low_event,
                "alive at the peak, already allocated at the last low point of requested memory \
                 before it, and not weights: the peak was built on top of these"
                    .to_owned(),
            )
        }
    };
    let categories: Vec<Category> = claims.iter().map(|c| c.0).collect();
    let held: Vec<(&Allocation, Category)> = live
        .iter()
        .copied()
        .zip(categories.iter().copied())
        .filter(|(a, category)| {
            // Weights must be there; optimizer state updated in place is read by the next step.
            if *category == Category::Weights
                || (*category == Category::OptimizerState && a.free_event.is_none())
            {
                return false;
            }
            match (a.alloc_event, boundary_event) {
                (None, _) => peak_event.is_some(),
                (Some(_), None) => false,
                (Some(b), Some(l)) => b <= l,
            }
        })
        .collect();
    // Optimizer state freed by a later optimizer step: re-created each step instead of updated
    // in place, so the old and the new copy are alive together.
    let reallocated_state_bytes = held
        .iter()
        .filter(|(a, c)| {
            *c == Category::OptimizerState
                && a.free_event
                    .is_some_and(|d| phases.at(Some(d)) == Phase::Optimizer)
        })
        .fold(0u64, |sum, (a, _)| sum.saturating_add(a.requested_bytes));
    let mut held_by_step: std::collections::BTreeMap<String, u64> =
        std::collections::BTreeMap::new();
    for (a, _) in &held {
        let key = match a.alloc_event {
            None => "before_window".to_owned(),
            Some(b) => match phases.step_at(Some(b)) {
                Some(st) => format!("step {st}"),
                None => phases.at(Some(b)).name().to_owned(),
            },
        };
        let slot = held_by_step.entry(key).or_default();
        *slot = slot.saturating_add(a.requested_bytes);
    }
    let held_bytes = held
        .iter()
        .fold(0u64, |sum, (a, _)| sum.saturating_add(a.requested_bytes));
    let held_open = HeldOpen {
        definition,
        boundary: boundary.to_owned(),
        boundary_event,
        boundary_requested_bytes: replay.requested.at(boundary_event),
        bytes: held_bytes,
        count: held.len() as u64,
        allocations: held
            .iter()
            .take(options.held_open_limit)
            .map(|(a, _)| live_allocation(&describe, a, peak_event))
            .collect(),
        share_of_peak: if peak_requested > 0 {
            held_bytes as f64 / peak_requested as f64
        } else {
            0.0
        },
        by_call_site: by_call_site(
            &describe.sites,
            held.iter().map(|(a, _)| *a),
            peak_requested,
        ),
        by_step: held_by_step,
        reallocated_state_bytes,
    };

    let (segments, segments_omitted) = segments;

    let (detailed_ooms, oom_omitted) = ooms_detailed(snapshot.trace(device), &summary.ooms);
    let oom: Vec<Oom> = detailed_ooms
        .iter()
        .map(|&i| oom_report(snapshot, replay, phases, i, options.list_limit))
        .collect();

    let first_time = trace.iter().find_map(|e| e.time_us);
    let last_time = trace.iter().rev().find_map(|e| e.time_us);
    // Newer allocators may flag a wrapped ring buffer in `allocator_settings`; no released
    // version examined does, so any boolean key mentioning an overflow counts.
    let overflow_flag = snapshot
        .allocator_settings
        .as_ref()
        .and_then(|s| s.raw.as_object())
        .is_some_and(|o| {
            o.iter()
                .any(|(k, v)| k.contains("overflow") && v.as_bool() == Some(true))
        });
    let truncated = replay.starts_mid_run() || overflow_flag;
    let mut notes = Vec::new();
    if let Some(s) = &snapshot.salvaged {
        notes.push(s.describe(snapshot));
    }
    // The allocator that wrote the dump decides the API the notes and the advice name.
    let accel = super::fields::Accelerator::of(snapshot);
    let trace_cut = snapshot
        .salvaged
        .as_ref()
        .and_then(|s| s.trace_cut(snapshot, device));
    match trace_cut {
        Some(crate::snapshot::TraceCut::Cut) => notes.push(format!(
            "this device's trace was cut after {} (the file was salvaged): what happened \
             later, an OOM included, is not in the report",
            crate::units::counted(trace.len() as u64, "entry", "entries")
        )),
        Some(crate::snapshot::TraceCut::NotReached) => notes.push(
            "this device's trace was cut off before it began (the file was salvaged), so the \
             peak is the dump's own state; the trace may have held an OOM"
                .to_owned(),
        ),
        None if trace.is_empty() => notes.push(format!(
            "no trace entries for this device: memory history was not recorded \
             ({}._record_memory_history), so the peak is the dump's own state",
            accel.memory_module()
        )),
        None => {}
    }
    if truncated {
        notes.push(format!(
            "the trace starts mid-run: {} of allocations made before the first event; \
             either the ring buffer overflowed (raise max_entries in _record_memory_history) or \
             recording started late",
            crate::units::counted(replay.window.unmatched_frees, "free", "frees")
        ));
    }
    if let Some(note) = cached_remark(&dump, accel) {
        notes.push(note);
    }
    if replay.window.lost_frees > 0 {
        notes.push(format!(
            "{} an address that was never freed in the trace (frees were skipped or lost); the \
             old allocation was closed at the reuse",
            match replay.window.lost_frees {
                1 => "1 allocation reused".to_owned(),
                n => format!("{n} allocations reused"),
            }
        ));
    }
    if replay.window.uncounted_pending_blocks > 0 {
        notes.push(format!(
            "{} ({} bytes) pending free at the dump with no allocation in the trace; not \
             counted in the curves (as in memory_viz)",
            crate::units::counted(replay.window.uncounted_pending_blocks, "block", "blocks"),
            replay.window.uncounted_pending_bytes
        ));
    }

    let mut categories_at_peak: std::collections::BTreeMap<String, u64> = Category::ALL
        .iter()
        .map(|c| (c.name().to_owned(), 0))
        .collect();
    let mut phases_at_peak: std::collections::BTreeMap<String, u64> =
        std::collections::BTreeMap::new();
    // Summed by category and phase first (a real peak holds hundreds of thousands of
    // allocations), named after.
    let claim_bytes = claim_sums.by_claim();
    let ClaimSums {
        by_category,
        by_phase,
        ..
    } = claim_sums;
    for (category, bytes) in by_category {
        let slot = categories_at_peak
            .entry(category.name().to_owned())
            .or_default();
        *slot = slot.saturating_add(bytes);
    }
    for (phase, bytes) in by_phase {
        let slot = phases_at_peak.entry(phase.to_owned()).or_default();
        *slot = slot.saturating_add(bytes);
    }
    // Confidence and evidence per category: the ones that hold most of its bytes.
    let mut by_confidence: HashMap<(Category, Confidence), u64> = HashMap::new();
    let mut by_evidence: HashMap<Category, (u64, &'static str)> = HashMap::new();
    for (&(category, confidence, evidence), &b) in &claim_bytes {
        let slot = by_confidence.entry((category, confidence)).or_default();
        *slot = slot.saturating_add(b);
        let best = by_evidence.entry(category).or_insert((0, evidence));
        if (b, evidence) > *best {
            *best = (b, evidence);
        }
    }
    let mut category_confidence_at_peak: std::collections::BTreeMap<String, String> =
        std::collections::BTreeMap::new();
    for category in Category::ALL {
        let best = [Confidence::High, Confidence::Medium, Confidence::Low]
            .into_iter()
            .filter_map(|c| by_confidence.get(&(category, c)).map(|&b| (b, c)))
            .max_by_key(|&(b, c)| (b, std::cmp::Reverse(c)));
        if let Some((_, c)) = best {
            category_confidence_at_peak.insert(category.name().to_owned(), c.name().to_owned());
        }
    }
    let category_evidence_at_peak = by_evidence
        .into_iter()
        .map(|(c, (_, e))| (c.name().to_owned(), e.to_owned()))
        .collect();
    let peak_phase = if peak_event.is_none() {
        let (p, c, e) = state_phase(snapshot, phases, &live);
        PhaseClaim::plain(p, c, e)
    } else {
        phase_claim(snapshot, snapshot.trace(device), phases, peak_event)
    };
    if let Some(reason) = &phases.unknown_reason {
        notes.push(format!("phases unknown: {reason}"));
    }
    let steps = step_summaries(replay, phases);
    let step_growth = super::leaks::step_growth(replay, &steps, &describe.sites);

    let mut report = DeviceReport {
        device,
        final_state: dump,
        window: Window {
            events: trace.len() as u64,
            first_time_us: first_time,
            last_time_us: last_time,
            duration_s: match (first_time, last_time) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e6),
                _ => None,
            },
            unmatched_frees: replay.window.unmatched_frees,
            allocations_before_window: replay.allocations.before_window() as u64,
            ghost_blocks: replay.window.ghosts,
            lost_frees: replay.window.lost_frees,
            requested_at_start_bytes: replay.requested.start,
            allocated_at_start_bytes: replay.allocated.start,
            reserved_at_start_bytes: replay.reserved.start,
        },
        truncated,
        trace_cut: trace_cut.map(|c| c.name().to_owned()),
        peak: Peak {
            requested_bytes: peak_requested,
            allocated_bytes: replay.allocated.at(peak_event),
            reserved_bytes: replay.reserved.at(peak_event),
            event_index: peak_event,
            time_us: time_at(peak_event),
            phase: peak_phase.phase.name().to_owned(),
            step: phases.step_at(peak_event),
            phase_confidence: peak_phase.confidence.to_owned(),
            phase_evidence: peak_phase.evidence,
            phase_frames: peak_phase.frames,
            phase_note: peak_phase.note.map(str::to_owned),
        },
        peak_allocated: LevelPeak {
            bytes: peak_allocated,
            event_index: peak_allocated_event,
        },
        peak_reserved: LevelPeak {
            bytes: peak_reserved,
            event_index: peak_reserved_event,
        },
        top_call_site_by_category_at_peak,
        live_at_peak_by_call_site: by_call_site(
            &describe.sites,
            live.iter().copied(),
            peak_requested,
        ),
        live_at_peak,
        live_at_peak_omitted,
        held_open,
        oom,
        oom_omitted,
        segments,
        segments_omitted,
        fragmentation_at_peak,
        fragmentation_at_end,
        phases: phases.intervals.clone(),
        phases_unknown_reason: phases.unknown_reason.clone(),
        categories_at_peak,
        category_confidence_at_peak,
        category_evidence_at_peak,
        phases_at_peak,
        steps,
        advice: Vec::new(),
        recording: Vec::new(),
        step_growth,
        stacks: Vec::new(),
        live_at_peak_by_call_site_omitted: None,
        pools: super::pools::pools_of(snapshot, device, replay, pools_at_dump),
        notes,
        data_quality: Vec::new(),
    };
    report.recording = super::recording::recording_gaps(snapshot, &report);
    report.advice = super::advice::advise(
        &report,
        snapshot
            .allocator_settings
            .as_ref()
            .and_then(|s| s.expandable_segments),
        snapshot.has_stacks(),
        unsure_before_window_bytes,
        accel,
    );
    report
}

/// Peak and starting level of each training step (steps are numbered by the phase finder).
fn step_summaries(replay: &DeviceReplay, phases: &Phases) -> Vec<StepSummary> {
    let mut out: Vec<StepSummary> = Vec::new();
    for iv in &phases.intervals {
        let Some(step) = iv.step else { continue };
        if !matches!(
            iv.name,
            Phase::Forward | Phase::Backward | Phase::Optimizer | Phase::Eval
        ) {
            continue;
        }
        let (peak, at) = replay
            .requested
            .peak_between(iv.first_event as usize, iv.last_event as usize);
        match out.last_mut() {
            Some(s) if s.step == step => {
                s.last_event = iv.last_event;
                if peak > s.peak_requested_bytes {
                    s.peak_requested_bytes = peak;
                    s.peak_event = at;
                }
            }
            _ => {
                let start = replay.requested.at(iv.first_event.checked_sub(1));
                let growth = out.last().map_or(0, |p| start - p.start_requested_bytes);
                out.push(StepSummary {
                    step,
                    first_event: iv.first_event,
                    last_event: iv.last_event,
                    peak_requested_bytes: peak,
                    peak_event: at,
                    start_requested_bytes: start,
                    start_growth_bytes: growth,
                });
            }
        }
    }
    out
}

/// The dump holds at least this share of its reserved bytes cached and unallocated …
const CACHED_SHARE: f64 = 0.5;
/// … and at least this many bytes, for the report to remark on it.
const CACHED_MIN_BYTES: u64 = 256 << 20;

/// A remark when most of the reserved memory at the dump is cached and unused.
fn cached_remark(dump: &FinalState, accel: super::fields::Accelerator) -> Option<String> {
    let cached = dump.reserved_bytes.saturating_sub(dump.allocated_bytes);
    let share = cached as f64 / dump.reserved_bytes.max(1) as f64;
    (cached >= CACHED_MIN_BYTES && share >= CACHED_SHARE).then(|| {
        format!(
            "most of the reserved memory is cached and unused: {} reserved, {} allocated at the \
             dump, so {} ({:.0}%) is held by PyTorch's caching allocator for reuse; {} \
             counts it as used and other processes cannot have it \
             ({}.empty_cache() gives it back)",
            crate::units::format_bytes(dump.reserved_bytes),
            crate::units::format_bytes(dump.allocated_bytes),
            crate::units::format_bytes(cached),
            share * 100.0,
            accel.smi(),
            accel.device_module()
        )
    })
}

pub fn file_report(loaded: &LoadedSnapshot, options: &ReportOptions) -> FileReport {
    file_report_by(loaded, options, &|d| {
        device_report(&loaded.snapshot, d, options)
    })
}

/// [`file_report`], keeping the replay and phases of each device it reported on (for the
/// questions asked of it later: the live set at any event, an allocation's life).
pub fn file_report_keeping(
    loaded: &LoadedSnapshot,
    options: &ReportOptions,
) -> (FileReport, Vec<DeviceParts>) {
    let kept = std::sync::Mutex::new(Vec::new());
    let report = file_report_by(loaded, options, &|d| {
        let a = analyse_device(&loaded.snapshot, d, options);
        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
        // A device reported twice (the many-devices path) keeps its latest parts.
        kept.retain(|p: &DeviceParts| p.replay.device != d);
        kept.push(a.parts);
        a.report
    });
    let mut kept = kept.into_inner().unwrap_or_else(|e| e.into_inner());
    kept.sort_by_key(|p| p.replay.device);
    (report, kept)
}

fn file_report_by(
    loaded: &LoadedSnapshot,
    options: &ReportOptions,
    device_report: &(dyn Fn(i64) -> DeviceReport + Sync),
) -> FileReport {
    let snapshot = &loaded.snapshot;
    let (devices, empty): (Vec<i64>, Vec<i64>) = snapshot
        .devices()
        .into_iter()
        .filter(|d| options.device.is_none_or(|want| want == *d))
        // A device with neither segments nor trace has nothing to report: it is named in one
        // line (`summary.empty_devices`), the same way in every file.
        .partition(|d| !snapshot.trace(*d).is_empty() || snapshot.segments_of(*d).next().is_some());
    use super::headline::{file_summary, interesting_devices, DeviceDigest, MANY_DEVICES};
    let (devices, summary, device_table) = if options.all_devices || devices.len() <= MANY_DEVICES {
        let devices: Vec<DeviceReport> = devices.par_iter().map(|&d| device_report(d)).collect();
        let digests: Vec<DeviceDigest> =
            devices.iter().map(|d| DeviceDigest::of(d, true)).collect();
        (devices, file_summary(&digests), Vec::new())
    } else {
        // Many devices: each report is reduced to its digest as soon as it is made, so memory
        // grows by a row per device, not by a report (a few KB) per device; the devices worth
        // a section are then reported again.
        let mut digests: Vec<DeviceDigest> = devices
            .par_iter()
            .map(|&d| DeviceDigest::of(&device_report(d), false))
            .collect();
        let summary = file_summary(&digests);
        let keep = interesting_devices(&digests, &summary);
        for d in &mut digests {
            d.row.detailed = keep.binary_search(&d.row.device).is_ok();
        }
        let detailed: Vec<DeviceReport> = keep.par_iter().map(|&d| device_report(d)).collect();
        let rows = digests.into_iter().map(|d| d.row).collect();
        (detailed, summary, rows)
    };
    FileReport {
        path: loaded.name.clone(),
        stacks_recorded: snapshot.has_stacks(),
        allocator_settings: snapshot.allocator_settings.as_ref().map(|s| s.raw.clone()),
        summary: FileSummary {
            empty_devices: empty,
            ..summary
        },
        devices,
        device_table,
        snapshot_fields: super::fields::snapshot_fields(snapshot),
        host_memory: super::host::host_memory(snapshot),
    }
}

/// Rank number from a file name such as `rank3.pickle` or `snapshot_rank_12.pickle`.
pub fn rank_from_name(path: &str) -> Option<u64> {
    let name = path.rsplit(['/', '\\']).next()?.to_ascii_lowercase();
    let pos = name.find("rank")?;
    let digits: String = name[pos + 4..]
        .trim_start_matches(['_', '-'])
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// The figures of one device that the cross-file table needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankDevice {
    pub device: i64,
    /// Peak of requested bytes.
    pub peak_requested_bytes: i64,
    /// Reserved bytes at that peak.
    pub reserved_at_peak_bytes: i64,
    /// Highest reserved bytes of the device (over the trace, or the dump when higher).
    pub max_reserved_bytes: u64,
    /// Reserved bytes at the dump.
    pub final_reserved_bytes: u64,
    pub oom: bool,
}

impl RankDevice {
    pub fn of_row(d: &DeviceRow) -> RankDevice {
        RankDevice {
            device: d.device,
            peak_requested_bytes: d.peak_requested_bytes,
            reserved_at_peak_bytes: d.reserved_at_peak_bytes,
            max_reserved_bytes: d.max_reserved_bytes.max(0) as u64,
            final_reserved_bytes: d.final_reserved_bytes,
            oom: d.oom_events > 0,
        }
    }

    pub fn of(d: &DeviceReport) -> RankDevice {
        RankDevice {
            device: d.device,
            peak_requested_bytes: d.peak.requested_bytes,
            reserved_at_peak_bytes: d.peak.reserved_bytes,
            max_reserved_bytes: Self::max_reserved(
                d.peak_reserved.bytes,
                d.final_state.reserved_bytes,
            ),
            final_reserved_bytes: d.final_state.reserved_bytes,
            oom: !d.oom.is_empty(),
        }
    }

    /// The highest reserved bytes of a device: the trace's reserved peak, or the dump's reserved
    /// bytes where they are higher (a device without a trace has only the dump).
    pub fn max_reserved(peak_reserved: i64, final_reserved: u64) -> u64 {
        (peak_reserved.max(0) as u64).max(final_reserved)
    }
}

/// One row of the cross-file table: the device with the highest peak, its peak and the reserved
/// bytes at that same moment, the highest reserved bytes of any device, and whether any device
/// ran out of memory (`reserved_bytes` keeps its old meaning: the dump's reserved bytes summed
/// over the devices). The outlier flag is set by [`rank_table_from_rows`].
pub fn rank_row(path: &str, devices: impl Iterator<Item = RankDevice>) -> RankRow {
    let mut row = RankRow {
        path: path.to_owned(),
        rank: rank_from_name(path),
        peak_requested_bytes: 0,
        reserved_bytes: 0,
        oom: false,
        outlier: false,
        peak_device: None,
        reserved_at_peak_bytes: 0,
        max_reserved_bytes: 0,
        error: None,
        outlier_reason: None,
    };
    for d in devices {
        if row.peak_device.is_none() || d.peak_requested_bytes > row.peak_requested_bytes {
            row.peak_device = Some(d.device);
            row.peak_requested_bytes = d.peak_requested_bytes;
            row.reserved_at_peak_bytes = d.reserved_at_peak_bytes.max(0) as u64;
        }
        row.max_reserved_bytes = row.max_reserved_bytes.max(d.max_reserved_bytes);
        row.reserved_bytes = row.reserved_bytes.saturating_add(d.final_reserved_bytes);
        row.oom |= d.oom;
    }
    row
}

/// The row of an input that could not be read.
pub fn unreadable_row(path: &str, error: &str) -> RankRow {
    let mut row = rank_row(path, std::iter::empty());
    row.error = Some(error.to_owned());
    row
}

/// The cross-file table of `report`: one row per file, then one per unreadable input; outliers
/// only when the files are ranks of one job (`ranks`: the user said so with `--ranks`).
pub fn rank_table(files: &[FileReport], unreadable: &[Unreadable], ranks: bool) -> RankTable {
    let mut rows: Vec<RankRow> = files
        .iter()
        .map(|f| rank_row(&f.path, f.rows().iter().map(RankDevice::of_row)))
        .collect();
    rows.extend(unreadable.iter().map(|u| unreadable_row(&u.path, &u.error)));
    let mut table = rank_table_from_rows(rows, ranks);
    // The first rows are the files', in order (the unreadable ones follow).
    let peak_devices: Vec<Option<i64>> = table.rows.iter().map(|r| r.peak_device).collect();
    super::outlier::explain_outliers(&mut table, |i| {
        let want = peak_devices.get(i).copied().flatten()?;
        files.get(i)?.devices.iter().find(|d| d.device == want)
    });
    table
}

/// The devices of one file as the ranks of a job (the page's overview of a many-device
/// snapshot): a row per device, outliers among them, and why.
pub fn device_table_as_ranks(file: &FileReport) -> RankTable {
    let rows: Vec<RankRow> = file
        .rows()
        .iter()
        .map(|d| {
            let mut row = rank_row(&file.path, std::iter::once(RankDevice::of_row(d)));
            row.rank = u64::try_from(d.device).ok();
            row
        })
        .collect();
    let mut table = rank_table_from_rows(rows, true);
    let devices: Vec<Option<i64>> = table.rows.iter().map(|r| r.peak_device).collect();
    super::outlier::explain_outliers(&mut table, |i| {
        let want = devices.get(i).copied().flatten()?;
        file.devices.iter().find(|d| d.device == want)
    });
    table
}

/// Peaks this far from the median (as a fraction of it) flag a rank as an outlier.
pub const OUTLIER_DEVIATION: f64 = 0.2;

/// The outlier rule, in words (printed under the table and stored with it).
pub fn outlier_rule() -> String {
    format!(
        "a rank is an outlier when its peak is ≥ {:.1}× or ≤ {:.1}× the median peak of the \
         readable ranks; only among {} ranks or more of one job (a rank number in every file \
         name, or --ranks)",
        1.0 + OUTLIER_DEVIATION,
        1.0 - OUTLIER_DEVIATION,
        MIN_RANKS
    )
}

/// [`rank_table`] from rows made elsewhere (`merge` reads them from JSON reports): the median
/// of the readable rows and, when they are ranks of one job, the outliers.
pub fn rank_table_from_rows(mut rows: Vec<RankRow>, ranks: bool) -> RankTable {
    let readable = || rows.iter().filter(|r| r.error.is_none());
    let mut peaks: Vec<i64> = readable().map(|r| r.peak_requested_bytes).collect();
    peaks.sort_unstable();
    let median = peaks.get(peaks.len() / 2).copied().unwrap_or(0);
    let one_job = ranks || readable().all(|r| r.rank.is_some());
    let several = rows_len_ok(peaks.len());
    for r in &mut rows {
        let p = r.peak_requested_bytes as f64;
        let m = median as f64;
        r.outlier = one_job
            && several
            && r.error.is_none()
            && m > 0.0
            && (p >= (1.0 + OUTLIER_DEVIATION) * m || p <= (1.0 - OUTLIER_DEVIATION) * m);
    }
    RankTable {
        rows,
        median_peak_requested_bytes: median,
        ranks_of_one_job: one_job,
        outlier_rule: outlier_rule(),
    }
}

/// Fewest readable ranks for outliers to mean anything.
const MIN_RANKS: usize = 3;

fn rows_len_ok(n: usize) -> bool {
    n >= MIN_RANKS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_numbers_from_names() {
        assert_eq!(rank_from_name("out/rank3.pickle"), Some(3));
        assert_eq!(rank_from_name("snap_rank_12.pickle.gz"), Some(12));
        assert_eq!(rank_from_name("snapshot.pickle"), None);
    }
}
