//! The output of `snapscan replay` (the allocator model against the real trace). The
//! `files[].devices[].placements` list (`--full`) is a contract: `{"event": <index into the
//! device's trace>, "address": <int or null>}` for every `alloc`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayOutput {
    pub schema_version: u32,
    pub files: Vec<ReplayFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayFile {
    pub path: String,
    pub devices: Vec<ReplayDevice>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SettingsOut {
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax of what the model followed.
    pub conf: String,
    /// `dump`, `default` (the dump has no `allocator_settings`) or `override`.
    pub source: String,
    pub expandable_segments: bool,
    /// Null: unlimited.
    pub max_split_size: Option<u64>,
    pub max_non_split_rounding: u64,
    pub roundup_power2_divisions: Vec<u64>,
    pub garbage_collection_threshold: f64,
    pub large_segment_size: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// In the trace.
    pub real: u64,
    /// Predicted by the model at the same event (with the same size for mallocs and maps; on
    /// a segment the model also held entirely free for frees and unmaps).
    pub predicted: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DivergenceOut {
    pub event: u32,
    pub kind: String,
    pub requested_bytes: u64,
    pub rounded_bytes: u64,
    pub stream: u64,
    pub model_address: Option<u64>,
    pub real_address: Option<u64>,
    /// The rule that decided the model's choice.
    pub rule: String,
    pub detail: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartOut {
    pub segments: u64,
    pub reserved_bytes: u64,
    pub live_blocks: u64,
    pub live_from_dump: u64,
    pub pending_blocks: u64,
    /// Blocks alive at the window start whose size the trace cannot decide, with the range of
    /// bytes they hold together.
    pub uncertain_blocks: u64,
    pub uncertain_min_bytes: u64,
    pub uncertain_max_bytes: u64,
    pub problems: Vec<ProblemOut>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProblemOut {
    pub kind: String,
    pub count: u64,
    pub first: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EndOut {
    pub dump_segments: u64,
    pub matching_segments: u64,
    pub dump_blocks: u64,
    /// Blocks of the dump that the model holds at the same address, with the same size and
    /// state, at the end of the trace.
    pub matching_blocks: u64,
    pub first_mismatch: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleCount {
    pub rule: String,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RulesOut {
    /// Rules that decided something in this trace, with how often.
    pub exercised: Vec<RuleCount>,
    /// Rules this trace never needed: the model's handling of them is not checked by it.
    pub not_exercised: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolOut {
    /// `(0, 0)` is the default pool.
    pub pool_id: [i64; 2],
    pub stream: u64,
    /// `small` (requests up to 1 MiB) or `large`.
    pub size_class: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UnusableOut {
    pub holes_too_small: u64,
    pub oversize: u64,
    pub other_streams: u64,
    pub other_pools: u64,
    pub other_size_class: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitSegmentOut {
    pub address: u64,
    pub size: u64,
    pub free_bytes: u64,
    pub largest_hole_bytes: u64,
    pub live_blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PinnerOut {
    pub address: u64,
    pub size: u64,
    pub requested_bytes: u64,
    pub call_site: Option<String>,
    /// Null: alive since before the window.
    pub birth_event: Option<u32>,
    pub age_events: Option<u64>,
    pub age_s: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HolderOut {
    pub call_site: Option<String>,
    pub blocks: u64,
    pub bytes: u64,
    pub first_birth_event: Option<u32>,
}

/// Why a request did not fit, from the model's exact layout at its event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhyOut {
    pub request_bytes: u64,
    pub pool: PoolOut,
    pub reserved_bytes: u64,
    pub free_bytes: u64,
    /// Free bytes in the request's pool and stream, and its largest free block.
    pub pool_free_bytes: u64,
    pub pool_largest_free_bytes: u64,
    /// Free bytes of the device the request could not use, by reason.
    pub unusable: UnusableOut,
    pub split_segments: Vec<SplitSegmentOut>,
    pub split_segment_count: u64,
    pub split_free_bytes: u64,
    /// The fewest live blocks whose freeing would have made a hole of at least the request.
    pub pinners: Vec<PinnerOut>,
    pub pinner_count: u64,
    pub pinner_bytes: u64,
    pub pinned_segment: Option<u64>,
    pub hole_if_freed_bytes: u64,
    /// Live blocks holding the split segments open, by call site.
    pub holders: Vec<HolderOut>,
    /// The causal chain in one sentence.
    pub summary: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomOut {
    pub event: u32,
    pub request_bytes: u64,
    pub stream: u64,
    pub device_free: Option<u64>,
    /// The `cudaMalloc` the allocator would have made for it.
    pub segment_bytes: u64,
    /// The model finds no block that fits, as the real allocator did.
    pub reproduced: bool,
    /// The `cudaMalloc` was larger than the device's free memory.
    pub exceeds_device_free: Option<bool>,
    pub why: WhyOut,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnfitMallocOut {
    pub event: u32,
    pub segment_bytes: u64,
    pub why: WhyOut,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementOut {
    pub event: u32,
    /// Null where the model asked for a new segment and the real allocator made none.
    pub address: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayDevice {
    pub device: i64,
    pub events: u64,
    pub settings: SettingsOut,
    pub allocs: u64,
    /// Allocs the model placed at the address the real allocator chose.
    pub placed: u64,
    pub placed_ratio: Option<f64>,
    pub segment_allocs: Predicted,
    pub segment_frees: Predicted,
    pub segment_maps: Predicted,
    pub segment_unmaps: Predicted,
    /// Requests where the model needed a new segment and the real allocator did not.
    pub unexpected_mallocs: u64,
    pub unknown_frees: u64,
    pub first_divergence: Option<DivergenceOut>,
    pub divergences: Vec<DivergenceOut>,
    pub divergence_count: u64,
    pub start: StartOut,
    pub end: EndOut,
    pub rules: RulesOut,
    pub ooms: Vec<OomOut>,
    pub oom_count: u64,
    /// `cudaMalloc`s made while the request's pool held at least the request in free bytes.
    pub fragmentation_mallocs: Vec<UnfitMallocOut>,
    pub fragmentation_malloc_count: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub placements: Option<Vec<PlacementOut>>,
    pub notes: Vec<String>,
}
