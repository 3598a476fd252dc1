//! The output structs: one serde-serialisable source for every textual format.
//! Field names marked "contract" in the issues are read by other tools: keep them stable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::input::Compression;
use crate::snapshot::Layout;

pub const SCHEMA_VERSION: u32 = 1;

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
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileReport {
    pub path: String,
    pub stacks_recorded: bool,
    pub allocator_settings: Option<serde_json::Value>,
    pub devices: Vec<DeviceReport>,
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
    pub peak: Peak,
    pub peak_allocated: LevelPeak,
    pub peak_reserved: LevelPeak,
    /// Every allocation alive at the peak, largest first.
    pub live_at_peak: Vec<LiveAllocation>,
    pub live_at_peak_by_call_site: Vec<CallSiteBytes>,
    pub held_open: HeldOpen,
    pub oom: Vec<Oom>,
    /// Layout at the peak.
    pub segments: Vec<SegmentReport>,
    pub fragmentation_at_peak: Fragmentation,
    pub fragmentation_at_end: Fragmentation,
    pub notes: Vec<String>,
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
    pub call_site: String,
    pub stream: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallSiteBytes {
    pub call_site: String,
    pub bytes: u64,
    pub count: u64,
    /// Share of the peak's requested bytes.
    pub share: f64,
    /// Whole stack of the largest allocation from this site (innermost first), when recorded.
    pub stack: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldOpen {
    pub definition: String,
    /// The low point before the peak (null = window start).
    pub low_point_event: Option<u32>,
    pub low_point_requested_bytes: i64,
    pub bytes: u64,
    pub count: u64,
    pub allocations: Vec<LiveAllocation>,
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
    pub call_site: Option<String>,
    pub live_by_call_site: Vec<CallSiteBytes>,
    pub segments: Vec<SegmentReport>,
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
    pub segment_type: String,
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
    pub peak_requested_bytes: i64,
    pub reserved_bytes: u64,
    pub oom: bool,
    pub outlier: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankTable {
    pub rows: Vec<RankRow>,
    pub median_peak_requested_bytes: i64,
}
