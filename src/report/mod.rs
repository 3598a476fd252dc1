//! The output structs: one serde-serialisable source for every textual format.
//! Field names marked "contract" in the issues are read by other tools: keep them stable.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::input::Compression;
use crate::snapshot::Layout;

pub mod replay;
pub mod whatif;

/// 2: call sites reference their stack by `stack_id` in a table (`stacks`) instead of
/// carrying it.
pub const SCHEMA_VERSION: u32 = 2;

/// Figures of the final allocator state (the dump itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalState {
    pub segments: u64,
    /// Σ segment `total_size` (what nvidia-smi shows, minus the CUDA context).
    pub reserved_bytes: u64,
    /// Σ requested bytes of `active_allocated` blocks (`_memory_viz stats` "total_allocated").
    pub requested_bytes: u64,
    /// Σ (size − requested) of `active_allocated` blocks: rounding waste.
    pub free_internal_bytes: u64,
    /// Σ size of blocks not `active_allocated` (cached free memory, pending frees included).
    pub free_external_bytes: u64,
    /// Σ block size of `active_allocated` blocks (`torch.cuda.memory_allocated()`).
    pub allocated_bytes: u64,
    /// Σ block size of active blocks (allocated + pending free).
    pub active_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// `segment_pool_id`; null in files older than torch 2.1.
    pub pool_id: Option<[i64; 2]>,
    pub segment_type: String,
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStats {
    pub stream: u64,
    pub segments: u64,
    pub reserved_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub device: i64,
    #[serde(rename = "final")]
    pub final_state: FinalState,
    pub blocks_by_state: BTreeMap<String, u64>,
    pub pools: Vec<PoolStats>,
    pub streams: Vec<StreamStats>,
    pub expandable_segments: u64,
    pub trace_entries: u64,
    pub trace_entries_by_action: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileStats {
    pub path: String,
    pub compression: Compression,
    pub layout: Layout,
    pub decoded_bytes: u64,
    pub stacks_recorded: bool,
    pub allocator_settings: Option<serde_json::Value>,
    pub devices: Vec<DeviceStats>,
    pub total: FinalState,
}

/// `snapscan stats --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsOutput {
    pub schema_version: u32,
    pub files: Vec<FileStats>,
}

/// `snapscan report --format json`: the contract other tools read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub files: Vec<FileReport>,
    /// Cross-file table when several files (the ranks of one job) were analysed together.
    pub ranks: Option<RankTable>,
    /// Inputs that could not be read (the others are reported; the exit code is 2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// An input `report` could not read, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unreadable {
    pub path: String,
    pub error: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileReport {
    pub path: String,
    pub stacks_recorded: bool,
    pub allocator_settings: Option<serde_json::Value>,
    /// The devices with a section: every device, or, when the file has more than
    /// `analysis::headline::MANY_DEVICES` (and `--all-devices` is not given), the interesting
    /// ones only (the first with an OOM, the highest peak, the outliers); `device_table` then
    /// has a row for every device.
    pub devices: Vec<DeviceReport>,
    /// The file-level headline: OOM devices, the peak device, imbalance. Absent in reports
    /// written before it existed.
    #[serde(default)]
    pub summary: FileSummary,
    /// One row per device, only when `devices` leaves some out (a file of many devices): the
    /// other devices' reports are made, reduced to this row and dropped, so that memory does
    /// not grow by a whole report per device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_table: Vec<DeviceRow>,
    /// The accelerator, the 2026 fields and what this version does not read. Absent in
    /// reports written before it existed.
    #[serde(default)]
    pub snapshot_fields: SnapshotFields,
    /// Pinned host memory, when the snapshot recorded it (torch 2.14+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory: Option<HostMemory>,
}

/// Pinned host memory (torch 2.14+, `record_pinned_host_memory=True`; `analysis::host`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostMemory {
    /// `host_segments` at the dump.
    pub segments: u64,
    /// `host_traces` entries.
    pub trace_entries: u64,
    pub reserved_bytes_at_dump: u64,
    pub allocated_bytes_at_dump: u64,
    /// Highest pinned bytes allocated over the trace (the dump's level when it has no trace).
    pub peak_allocated_bytes: u64,
    /// Index into `host_traces`; null = the level before the first entry.
    pub peak_event_index: Option<u32>,
    pub peak_time_us: Option<i64>,
    pub peak_reserved_bytes: u64,
    /// Alive at the peak, by call site (what the window started with is "(no stack recorded)").
    pub live_at_peak_by_call_site: Vec<CallSiteBytes>,
    /// Still allocated at the dump, by call site.
    pub held_at_dump_by_call_site: Vec<CallSiteBytes>,
    /// The stacks the two tables reference (`stack_id`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: StackTable,
}

/// What the file's format says beyond the memory itself: the accelerator, the 2026 fields it
/// carries, and what this version does not read (named, never dropped silently).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotFields {
    /// `cuda` (ROCm builds write the same), or `xpu` (its `allocator_settings` hold only
    /// `PYTORCH_ALLOC_CONF` and `expandable_segments`).
    pub accelerator: String,
    /// Trace entries carry `pool_id` (torch 2.12+).
    pub pool_ids: bool,
    /// `annotate` entries (`_annotate_tensor`, torch 2.14+).
    pub annotations: u64,
    /// Distinct `user_metadata` texts (`_set_memory_metadata`), most entries first (capped).
    pub user_metadata: Vec<NameCount>,
    /// Distinct `internal_metadata` tags (the allocator's own, torch 2.15+).
    pub internal_metadata: Vec<NameCount>,
    /// Trace-entry keys this version does not read.
    pub unknown_entry_keys: Vec<NameCount>,
    /// Actions this version does not know (kept, shown raw).
    pub unknown_actions: Vec<NameCount>,
    /// Top-level keys this version does not read.
    pub other_top_level_keys: Vec<String>,
}

/// A name and how many trace entries have it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NameCount {
    pub name: String,
    pub entries: u64,
}

impl FileReport {
    /// A row per device: `device_table`, or the rows of `devices` when every device is there.
    pub fn rows(&self) -> std::borrow::Cow<'_, [DeviceRow]> {
        if self.device_table.is_empty() {
            self.devices
                .iter()
                .map(|d| DeviceRow::of(d, true))
                .collect()
        } else {
            std::borrow::Cow::Borrowed(&self.device_table)
        }
    }
}

/// The figures of one device that the device table, the budgets (`check`) and the cross-file
/// table need.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceRow {
    pub device: i64,
    /// `peak.requested_bytes` and `peak.event_index` of the device's report.
    pub peak_requested_bytes: i64,
    pub peak_event_index: Option<u32>,
    /// Reserved bytes at that peak.
    pub reserved_at_peak_bytes: i64,
    /// The highest reserved bytes: the trace's reserved peak, or the dump's reserved bytes
    /// where they are higher (`reserved_at`: `peak` or `end`).
    pub max_reserved_bytes: i64,
    pub max_reserved_at: Moment,
    pub max_reserved_event_index: Option<u32>,
    /// Reserved bytes at the dump.
    pub final_reserved_bytes: u64,
    pub oom_events: u64,
    pub first_oom_event_index: Option<u32>,
    /// The worst fragmentation ratio of the peak and the detailed OOMs, where and when.
    pub worst_fragmentation_ratio: f64,
    pub worst_fragmentation_at: Moment,
    pub worst_fragmentation_event_index: Option<u32>,
    /// Whether the device has a section (is in `devices`).
    pub detailed: bool,
}

impl DeviceRow {
    pub fn of(dev: &DeviceReport, detailed: bool) -> DeviceRow {
        let at_end = i64::try_from(dev.final_state.reserved_bytes).unwrap_or(i64::MAX);
        let (max_reserved_bytes, max_reserved_at, max_reserved_event_index) =
            if at_end > dev.peak_reserved.bytes {
                (at_end, Moment::End, None)
            } else {
                (
                    dev.peak_reserved.bytes,
                    Moment::Peak,
                    dev.peak_reserved.event_index,
                )
            };
        let mut worst = (
            dev.fragmentation_at_peak.fragmentation_ratio,
            Moment::Peak,
            dev.peak.event_index,
        );
        for o in &dev.oom {
            let r = fragmentation_ratio(&o.segments);
            if r > worst.0 {
                worst = (r, Moment::Oom, Some(o.event_index));
            }
        }
        DeviceRow {
            device: dev.device,
            peak_requested_bytes: dev.peak.requested_bytes,
            peak_event_index: dev.peak.event_index,
            reserved_at_peak_bytes: dev.peak.reserved_bytes,
            max_reserved_bytes,
            max_reserved_at,
            max_reserved_event_index,
            final_reserved_bytes: dev.final_state.reserved_bytes,
            oom_events: dev.oom_events(),
            first_oom_event_index: dev.oom.first().map(|o| o.event_index),
            worst_fragmentation_ratio: worst.0,
            worst_fragmentation_at: worst.1,
            worst_fragmentation_event_index: worst.2,
            detailed,
        }
    }
}

/// The fragmentation ratio of a segment layout (the same formula as `fragmentation_at_peak`):
/// `1 − largest free hole / free bytes`, 0 when nothing is free.
pub fn fragmentation_ratio(segments: &[SegmentReport]) -> f64 {
    let free = segments
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.free_bytes));
    let largest = segments
        .iter()
        .map(|s| s.largest_hole_bytes)
        .max()
        .unwrap_or(0);
    if free > 0 {
        1.0 - largest as f64 / free as f64
    } else {
        0.0
    }
}

/// What the first lines of a file's report say (`analysis::headline`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileSummary {
    /// Devices analysed.
    pub devices: u64,
    /// The first OOM of each device that had one, by device.
    pub oom: Vec<OomHeadline>,
    /// The device with the highest peak of requested bytes (null: no device).
    pub peak_device: Option<i64>,
    pub peak_requested_bytes: i64,
    /// Set when the devices' peaks differ sharply (the rule is in `rule`).
    pub imbalance: Option<Imbalance>,
    /// Devices with no segments and no trace entries (an empty `device_traces` list only):
    /// named, not reported.
    #[serde(default)]
    pub empty_devices: Vec<i64>,
}

/// The first OOM of one device, in brief.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomHeadline {
    pub device: i64,
    /// OOM events of the device (this is the first).
    pub oom_events: u64,
    pub event_index: u32,
    pub requested_bytes: u64,
    pub phase: String,
    pub call_site: Option<String>,
    pub verdict: String,
    /// Roughly what must be freed for the request to fit: the request minus the larger of the
    /// device's free memory and the largest usable hole.
    pub shortfall_bytes: u64,
}

/// The highest and the lowest device peak of a file, when they differ sharply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Imbalance {
    pub highest_device: i64,
    pub highest_peak_bytes: i64,
    pub lowest_device: i64,
    pub lowest_peak_bytes: i64,
    /// highest / lowest (null when the lowest is 0).
    pub ratio: Option<f64>,
    /// The rule that flagged it, in words.
    pub rule: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    pub device: i64,
    #[serde(rename = "final")]
    pub final_state: FinalState,
    pub window: Window,
    /// The trace does not start at the beginning of the program (ring buffer overflow or
    /// recording started late): allocations made before it are only partly known.
    pub truncated: bool,
    /// In a salvaged file (`--salvage`): `cut` when this device's trace was cut (only its first
    /// entries arrived), `not_reached` when the cut came before it began; absent when whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_cut: Option<String>,
    pub peak: Peak,
    pub peak_allocated: LevelPeak,
    pub peak_reserved: LevelPeak,
    /// Every allocation alive at the peak, largest first (capped at [`JSON_LIST_LIMIT`], or at
    /// `--top` when that is more, unless `--full`).
    pub live_at_peak: Vec<LiveAllocation>,
    /// What a capped `live_at_peak` left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_at_peak_omitted: Option<OmittedAllocations>,
    pub live_at_peak_by_call_site: Vec<CallSiteBytes>,
    pub held_open: HeldOpen,
    pub oom: Vec<Oom>,
    /// OOM events not in `oom`: past `analysis::report::MAX_OOMS_DETAILED` OOMs (a batch-size
    /// finder that catches them), `oom` holds the first, the last and the worst few, in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_omitted: Option<u64>,
    /// Layout at the peak.
    pub segments: Vec<SegmentReport>,
    /// What a capped `segments` left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments_omitted: Option<OmittedSegments>,
    pub fragmentation_at_peak: Fragmentation,
    pub fragmentation_at_end: Fragmentation,
    /// Phases of the trace: load, forward, backward, optimizer, eval, unknown.
    pub phases: Vec<crate::analysis::phase::PhaseInterval>,
    /// Why phases are unknown, when they are.
    pub phases_unknown_reason: Option<String>,
    /// Requested bytes alive at the peak per category (every category name always present).
    pub categories_at_peak: BTreeMap<String, u64>,
    /// Per category with bytes at the peak: the confidence that holds most of its bytes
    /// (`high`, `medium`, `low`). Absent in reports written before it existed.
    #[serde(default)]
    pub category_confidence_at_peak: BTreeMap<String, String>,
    /// Per category with bytes at the peak: what the claim rests on (the evidence that holds
    /// most of its bytes; for `unknown`, why nothing decides it). Absent in reports written
    /// before it existed.
    #[serde(default)]
    pub category_evidence_at_peak: BTreeMap<String, String>,
    /// Per category: the call site with the most of its bytes alive at the peak (every live
    /// allocation counted, not only the listed ones). Absent in reports written before it.
    #[serde(default)]
    pub top_call_site_by_category_at_peak: BTreeMap<String, SiteBytes>,
    /// Requested bytes alive at the peak by the phase that allocated them.
    pub phases_at_peak: BTreeMap<String, u64>,
    /// Per training step: its peak and the level it started from.
    pub steps: Vec<StepSummary>,
    pub advice: Vec<Advice>,
    /// Growth across training steps (three or more steps): steady or growing, and what steps
    /// keep into later ones. Absent with fewer steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_growth: Option<StepGrowth>,
    /// Why the snapshot says little, each with the call that records what is missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recording: Vec<RecordingGap>,
    /// The stacks the call-site tables reference (`stack_id`), each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: StackTable,
    /// Call sites left out of `live_at_peak_by_call_site` (a default report lists the sites
    /// that matter; `--full` all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_at_peak_by_call_site_omitted: Option<OmittedSites>,
    /// Every memory pool of the device (the default pool, CUDA-graph pools, MemPools), with
    /// what it holds at the dump and its peak reserved bytes. Absent in reports written before
    /// it existed.
    #[serde(default)]
    pub pools: Vec<PoolReport>,
    pub notes: Vec<String>,
    /// Inconsistencies found in the data, each with the fields it can make wrong; empty for a
    /// clean dump. Absent in reports written before it existed.
    #[serde(default)]
    pub data_quality: Vec<QualityWarning>,
}

impl DeviceReport {
    /// OOM events of the device: those detailed in `oom` and those omitted.
    pub fn oom_events(&self) -> u64 {
        self.oom.len() as u64 + self.oom_omitted.unwrap_or(0)
    }
}

/// One kind of inconsistency in a snapshot (`analysis::quality`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QualityWarning {
    /// Stable name: `overlapping_blocks`, `blocks_do_not_tile`, `double_free`, …
    pub kind: String,
    /// What was found, with the first place it was found.
    pub message: String,
    /// How many segments, blocks or trace entries show it.
    pub count: u64,
    /// Report fields (JSON names) this can make wrong; empty when none.
    pub affects: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSummary {
    pub step: u32,
    pub first_event: u32,
    pub last_event: u32,
    pub peak_requested_bytes: i64,
    pub peak_event: u32,
    /// Requested bytes alive when the step began.
    pub start_requested_bytes: i64,
    /// Growth of the starting level against the previous step (a leak suspect when it keeps
    /// growing).
    pub start_growth_bytes: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    pub action: String,
    /// The figure behind it and the expected effect.
    pub reason: String,
    pub estimated_saving_bytes: Option<u64>,
    /// When it would not help.
    pub caveat: String,
    /// The change replayed through the allocator model (devices with an OOM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<AdviceCheck>,
}

/// An advice's change replayed: does the request that ran out of memory fit then?
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceCheck {
    /// The change as replayed (e.g. `expandable_segments:True`, `batch × 0.5`).
    pub change: String,
    /// The first real OOM's request fits.
    pub fits: bool,
    /// Capacity left after it (negative: how much it was short).
    pub margin_bytes: i64,
    /// Requests that fitted in the real run and fail under the change.
    pub new_ooms: u64,
    /// The verdict in one sentence.
    pub verdict: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub events: u64,
    pub first_time_us: Option<i64>,
    pub last_time_us: Option<i64>,
    pub duration_s: Option<f64>,
    pub unmatched_frees: u64,
    pub allocations_before_window: u64,
    pub ghost_blocks: u64,
    pub lost_frees: u64,
    pub requested_at_start_bytes: i64,
    pub allocated_at_start_bytes: i64,
    pub reserved_at_start_bytes: i64,
}

/// The peak of requested bytes (what memory_viz draws), including the level at window start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    pub requested_bytes: i64,
    /// Block bytes alive at the same moment.
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    /// First event after which the peak is reached; null = already at window start.
    pub event_index: Option<u32>,
    pub time_us: Option<i64>,
    /// Phase at the peak (`unknown` when it cannot be told).
    pub phase: String,
    pub step: Option<u32>,
    /// How sure `phase` is: `high` (frames, annotations, metadata), `medium` (by position, or
    /// from the stacks of the blocks alive when the peak is the state at window start), `low`
    /// (unknown or a guess). Absent in reports written before it existed.
    #[serde(default = "low")]
    pub phase_confidence: String,
    /// What `phase` rests on, in words; why it is unknown when it is.
    #[serde(default)]
    pub phase_evidence: String,
    /// The frames `phase` rests on when frames decided it: the innermost frame that stands for
    /// a phase, the training or evaluation frame outside it, the training loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_frames: Vec<PhaseFrame>,
    /// `training or eval: unclear` (a forward that nothing tells apart), `no backward yet` (a
    /// forward of a training run before any backward in the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_note: Option<String>,
}

/// A frame that a phase verdict rests on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PhaseFrame {
    /// `phase` (the innermost frame that stands for one), `context` (the training, evaluation
    /// or `no_grad` frame outside it) or `loop` (the training loop it ran in).
    pub role: String,
    pub function: String,
    /// From the package folder on (`lightning/pytorch/loops/fit_loop.py`), else the last two
    /// path components.
    pub file: String,
    pub line: i64,
}

fn low() -> String {
    "low".to_owned()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelPeak {
    pub bytes: i64,
    pub event_index: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LiveAllocation {
    pub address: u64,
    pub requested_bytes: u64,
    pub block_bytes: u64,
    /// null = allocated before the trace window.
    pub alloc_event: Option<u32>,
    /// `free_completed` event; null = alive at the end of the trace.
    pub free_event: Option<u32>,
    pub alloc_time_us: Option<i64>,
    /// Events between birth and the peak; null when born before the window.
    pub age_events: Option<u32>,
    /// Shared by the allocations of one site (a peak holds tens of thousands).
    pub call_site: Arc<str>,
    pub stream: u64,
    /// Phase that allocated it (`unknown` before the window).
    pub phase: Cow<'static, str>,
    pub category: Cow<'static, str>,
    /// `high` (phase seen in frames/annotations), `medium` (by position), `low` (a guess).
    pub confidence: Cow<'static, str>,
    /// The user's `_annotate_tensor` texts on it (torch 2.14+), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallSiteBytes {
    pub call_site: String,
    pub bytes: u64,
    pub count: u64,
    /// Share of the peak's requested bytes.
    pub share: f64,
    /// The stack of the largest allocation from this site: an index into the device's
    /// `stacks` (each stack once however many tables name it); absent when none was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack_id: Option<u32>,
    /// Whose code the call site is: `user`, `package` (site-packages, dist-packages) or
    /// `runtime` (torch, C++, CPython); absent without a stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The innermost frame of the user's code in that stack; absent when the whole stack is
    /// packages and runtime (a library's training loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub your_code: Option<String>,
    /// What the allocation went through below the user's code: the packages, outermost
    /// first, then the innermost torch function (`transformers → torch.nn.functional.linear`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// A call site and bytes of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SiteBytes {
    pub call_site: String,
    pub bytes: u64,
}

/// Stacks as the call-site tables reference them (`stack_id`), each once: its lines, innermost
/// first.
pub type StackTable = Vec<Vec<String>>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldOpen {
    pub definition: String,
    /// `step_start` (left over from before the peak's step), `phase_start` (allocated before
    /// the peak's phase began, when steps are unknown) or `low_point` (before the last low point
    /// of requested memory, when phases are unknown).
    pub boundary: String,
    /// Last event before the boundary (null = window start).
    pub boundary_event: Option<u32>,
    pub boundary_requested_bytes: i64,
    pub bytes: u64,
    pub count: u64,
    pub allocations: Vec<LiveAllocation>,
    /// `bytes` / the peak's requested bytes. Absent in reports written before it existed.
    #[serde(default)]
    pub share_of_peak: f64,
    /// The same allocations grouped by call site, largest first.
    #[serde(default)]
    pub by_call_site: Vec<CallSiteBytes>,
    /// Bytes by where they came from: `before_window`, `step N`, or a phase name.
    #[serde(default)]
    pub by_step: BTreeMap<String, u64>,
    /// Optimizer state freed by a later optimizer step: re-created every step instead of updated
    /// in place, so old and new copies are alive together.
    #[serde(default)]
    pub reallocated_state_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Oom {
    pub event_index: u32,
    pub time_us: Option<i64>,
    /// The rounded request (`round_size`), as the `oom` entry records it.
    pub requested_bytes: u64,
    pub device_free_bytes: Option<u64>,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_unallocated_bytes: u64,
    /// Largest free hole that could have served the request: same stream, same small/large pool,
    /// default pool.
    pub largest_free_block_bytes: u64,
    pub segment_type: String,
    pub stream: u64,
    pub verdict: String,
    pub phase: String,
    /// How sure `phase` is (as `Peak::phase_confidence`).
    #[serde(default = "low")]
    pub phase_confidence: String,
    /// What `phase` rests on, in words; why it is unknown when it is.
    #[serde(default)]
    pub phase_evidence: String,
    /// The frames `phase` rests on when frames decided it: the innermost frame that stands for
    /// a phase, the training or evaluation frame outside it, the training loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_frames: Vec<PhaseFrame>,
    /// `training or eval: unclear` (a forward that nothing tells apart), `no backward yet` (a
    /// forward of a training run before any backward in the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_note: Option<String>,
    pub call_site: Option<String>,
    /// Reserved bytes in pools other than the request's at the OOM: out of its reach (a free
    /// block in one pool never serves another). Absent in reports written before it existed.
    #[serde(default)]
    pub reserved_in_other_pools_bytes: u64,
    pub live_by_call_site: Vec<CallSiteBytes>,
    pub segments: Vec<SegmentReport>,
    /// What a capped `segments` left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segments_omitted: Option<OmittedSegments>,
    /// Why the request did not fit, from the allocator model's exact layout at this event
    /// (as `snapscan replay` gives it); absent where the model did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<replay::WhyOut>,
    /// Whether the model, too, found no cached block that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproduced_by_model: Option<bool>,
}

/// Growth across training steps (`analysis::leaks`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepGrowth {
    /// `growing` (the level at the start of each step rose by more than `noise_bytes` every
    /// step from the second on) or `steady`.
    pub verdict: String,
    /// Requested bytes alive at the start of each step, in order.
    pub start_levels: Vec<i64>,
    /// Last step's starting level less the second step's.
    pub growth_from_second_step_bytes: i64,
    pub noise_bytes: i64,
    /// Call sites of what a step (from the second on) allocated and the next step did not
    /// free, seen in two steps or more; `share` is of all such bytes.
    pub kept_into_later_steps_by_call_site: Vec<CallSiteBytes>,
}

/// What a snapshot's recording left out (`analysis::recording`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordingGap {
    /// `no_trace`, `state_only`, `ring_buffer_wrapped`, `late_start`, `no_stacks`,
    /// `no_python_frames`.
    pub kind: String,
    pub what: String,
    /// The exact call that records what is missing.
    pub fix: String,
    /// For `ring_buffer_wrapped`: the `max_entries` suggested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
}

/// Call sites a capped table left out, summed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OmittedSites {
    pub count: u64,
    pub bytes: u64,
}

/// One memory pool of a device (`analysis::pools`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolReport {
    /// `segment_pool_id`/`pool_id`: `[0, 0]` is the default pool.
    pub pool_id: [i64; 2],
    /// `default`, `cuda_graph` (`(n, 0)`), `cudagraph_trees`, `mempool` (`(0, n)`),
    /// `symmetric_memory`, `private`.
    pub kind: String,
    /// From the `pool` or `name` key of the JSON `user_metadata` its allocations ran under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// At the dump.
    pub segments: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// Over the window (reserved at the window start with the trace's segment events applied).
    pub peak_reserved_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentReport {
    pub address: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub holes: u64,
    pub largest_hole_bytes: u64,
    pub free_bytes: u64,
    pub internal_waste_bytes: u64,
    pub stream: u64,
    pub pool: Option<[i64; 2]>,
    pub segment_type: Cow<'static, str>,
    pub expandable: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fragmentation {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_unallocated_bytes: u64,
    pub holes: u64,
    pub largest_hole_bytes: u64,
    /// Largest request (rounded) seen in the trace window.
    pub largest_request_bytes: u64,
    /// Free bytes in holes too small for that request.
    pub unusable_for_largest_request_bytes: u64,
    /// 1 − largest hole / free bytes (0 = all free space in one hole).
    pub fragmentation_ratio: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    pub path: String,
    pub rank: Option<u64>,
    /// The highest peak of requested bytes of any device (that of `peak_device`).
    pub peak_requested_bytes: i64,
    /// Reserved bytes at the dump, summed over the devices (kept for older readers; the table
    /// shows `reserved_at_peak_bytes` and `max_reserved_bytes`).
    pub reserved_bytes: u64,
    pub oom: bool,
    pub outlier: bool,
    /// The device with the highest peak (null: no device, or unreadable).
    #[serde(default)]
    pub peak_device: Option<i64>,
    /// Reserved bytes on `peak_device` at the moment of its peak.
    #[serde(default)]
    pub reserved_at_peak_bytes: u64,
    /// The highest reserved bytes of any device (over its trace, or at the dump when higher).
    #[serde(default)]
    pub max_reserved_bytes: u64,
    /// Why the input could not be read (its figures are then 0); absent for readable files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why an outlier stands out (absent for the others, and where its device has no report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_reason: Option<OutlierReason>,
}

/// The category of memory at an outlier's peak that is furthest from the median of its job,
/// and the call site that holds most of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutlierReason {
    pub category: String,
    /// Bytes of `category` alive at this rank's peak.
    pub bytes: u64,
    /// The median of the same over the job's ranks.
    pub median_bytes: u64,
    /// The call site with the most bytes of `category` alive at that peak, and those bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_site: Option<String>,
    #[serde(default)]
    pub call_site_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankTable {
    pub rows: Vec<RankRow>,
    /// Median of the readable rows' peaks.
    pub median_peak_requested_bytes: i64,
    /// The rows are ranks of one job (a rank number in every readable name, or `--ranks`):
    /// only then are outliers flagged.
    #[serde(default)]
    pub ranks_of_one_job: bool,
    /// How `outlier` is decided, in words.
    #[serde(default)]
    pub outlier_rule: String,
}

// ---------------------------------------------------------------------------------------------
// `snapscan check`, `snapscan diff` and `snapscan merge` (CI workflow).

/// The budgets `snapscan check` was given (null = not checked).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budgets {
    /// `--max-peak`: limit on the peak of requested bytes (`peak.requested_bytes`).
    pub max_peak_bytes: Option<u64>,
    /// `--max-reserved`: limit on the highest reserved bytes (`peak_reserved.bytes`, or the
    /// dump's reserved bytes when higher).
    pub max_reserved_bytes: Option<u64>,
    /// `--max-fragmentation`: limit on the fragmentation ratio at the peak and at every OOM.
    pub max_fragmentation_ratio: Option<f64>,
    /// `--fail-on-oom`: any `oom` event is a violation.
    pub fail_on_oom: bool,
}

/// Which budget a violation crossed; serialised as the command-line flag's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Budget {
    MaxPeak,
    MaxReserved,
    MaxFragmentation,
    FailOnOom,
}

impl Budget {
    /// The flag's name, as in `--max-peak`.
    pub fn flag(self) -> &'static str {
        match self {
            Budget::MaxPeak => "max-peak",
            Budget::MaxReserved => "max-reserved",
            Budget::MaxFragmentation => "max-fragmentation",
            Budget::FailOnOom => "fail-on-oom",
        }
    }
}

/// A measured value or a limit: bytes and event counts are integers, ratios are floats.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    Int(i64),
    Ratio(f64),
}

/// The moment of the trace a value was measured at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Moment {
    /// The peak of requested bytes (or of reserved bytes for `max-reserved`).
    Peak,
    /// An `oom` event.
    Oom,
    /// The dump (end of the trace).
    End,
}

/// One budget crossed on one device of one file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub path: String,
    pub device: i64,
    pub budget: Budget,
    /// Bytes (`max-peak`, `max-reserved`), ratio (`max-fragmentation`) or number of `oom`
    /// events (`fail-on-oom`).
    pub measured: Amount,
    /// The budget's limit (0 events for `fail-on-oom`).
    pub limit: Amount,
    pub at: Moment,
    /// Trace event of that moment; null = window start or the dump.
    pub event_index: Option<u32>,
}

/// What `snapscan check` measured on one device (whether or not a budget was given for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckedDevice {
    pub device: i64,
    pub peak_requested_bytes: i64,
    pub reserved_bytes: i64,
    /// The worst fragmentation ratio of the peak and every OOM.
    pub fragmentation_ratio: f64,
    pub oom_events: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckedFile {
    pub path: String,
    pub devices: Vec<CheckedDevice>,
}

/// `snapscan check --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub schema_version: u32,
    pub budgets: Budgets,
    /// No violation (exit code 0).
    pub passed: bool,
    pub violations: Vec<Violation>,
    pub files: Vec<CheckedFile>,
}

/// A figure in the base and the new run. `ratio` = delta / base (null when base is 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    pub base: i64,
    pub new: i64,
    pub delta: i64,
    pub ratio: Option<f64>,
}

/// A ratio (fragmentation) in the base and the new run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatioDelta {
    pub base: f64,
    pub new: f64,
    pub delta: f64,
}

/// How one key of a breakdown (a call site, and any later breakdown) changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Only in the new run.
    New,
    /// Only in the base run.
    Gone,
    Grew,
    Shrank,
    Same,
}

/// Bytes of one key (call site, …) in both runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyDelta {
    pub key: String,
    pub change: Change,
    pub base_bytes: u64,
    pub new_bytes: u64,
    pub delta_bytes: i64,
    /// Allocations behind the bytes; null for breakdowns that do not count them.
    pub base_count: Option<u64>,
    pub new_count: Option<u64>,
}

/// OOM events in both runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomDelta {
    pub base: u64,
    pub new: u64,
    /// `appeared` (none in base, some in new), `disappeared`, `still` (both), `none` (neither).
    pub change: String,
    /// Verdict of the first OOM of the new run (or of the base run when it disappeared).
    pub verdict: Option<String>,
}

/// One device compared across the two runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceDiff {
    pub device: i64,
    pub in_base: bool,
    pub in_new: bool,
    /// Peak of requested bytes.
    pub peak: Delta,
    pub peak_allocated: Delta,
    pub peak_reserved: Delta,
    /// Reserved bytes at the dump.
    pub final_reserved: Delta,
    pub fragmentation_at_peak: RatioDelta,
    pub oom: OomDelta,
    /// Phase at the peak in each run (`forward`, `backward`, `eval`, …; null = device absent).
    pub peak_phase: TextChange,
    /// Every call site alive at either peak whose bytes changed, largest growth first (new and
    /// grown sites first, then shrunk and gone ones).
    pub call_sites_at_peak: Vec<KeyDelta>,
    /// Bytes alive at the peak by the phase that allocated them (`phases_at_peak`), same order.
    pub phases_at_peak: Vec<KeyDelta>,
    /// Bytes alive at the peak by category (`categories_at_peak`), same order.
    pub categories_at_peak: Vec<KeyDelta>,
}

/// A label in the base and the new run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextChange {
    pub base: Option<String>,
    pub new: Option<String>,
}

/// `snapscan diff --format json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffReport {
    pub schema_version: u32,
    pub base: String,
    pub new: String,
    pub devices: Vec<DeviceDiff>,
    /// Largest peak growth of any device (delta / base); null when no device has a base peak.
    pub peak_growth: Option<f64>,
    /// `--fail-on-growth` as a fraction (0.05 = 5 %); null when not given.
    pub fail_on_growth: Option<f64>,
    /// The peak grew by more than `fail_on_growth` (exit code 1).
    pub failed: bool,
}

/// `snapscan merge --format json`: the cross-rank table from JSON reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergeReport {
    pub schema_version: u32,
    /// The JSON report files that were read.
    pub inputs: Vec<String>,
    pub ranks: RankTable,
    /// Reports that could not be read (each is also a row with its `error`; exit code 2).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
}

/// Entries a default JSON report keeps of each long list (`report --full` keeps them all).
pub const JSON_LIST_LIMIT: usize = 100;

/// What a capped `live_at_peak` left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OmittedAllocations {
    pub count: u64,
    pub requested_bytes: u64,
    pub block_bytes: u64,
}

/// What a capped `segments` list left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OmittedSegments {
    pub count: u64,
    pub total_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// How many of them have free bytes (holes).
    #[serde(default)]
    pub count_with_free_bytes: u64,
}
