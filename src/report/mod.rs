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
