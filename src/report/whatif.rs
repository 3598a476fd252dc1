//! The output of `snapscan whatif`. `files[].devices[].whatif` and `.real` are a contract:
//! `{settings, capacity_bytes, peak_allocated, peak_reserved, ooms: [{event, fits,
//! margin_bytes}], first_oom_event}`, the two in the same shape.

use serde::{Deserialize, Serialize};

use super::replay::SettingsOut;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatifOutput {
    pub schema_version: u32,
    pub files: Vec<WhatifFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatifFile {
    pub path: String,
    pub devices: Vec<WhatifDevice>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakOut {
    pub bytes: u64,
    /// The event after which it was reached; null: at the window start.
    pub event: Option<u32>,
    pub phase: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomFit {
    pub event: u32,
    pub fits: bool,
    /// Capacity left after the request; negative: how much it was short.
    pub margin_bytes: i64,
    /// A real OOM of the trace (else a request that fitted in the real run and not here).
    pub real: bool,
    pub request_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    pub settings: SettingsOut,
    /// What PyTorch could reserve; null: no limit known.
    pub capacity_bytes: Option<u64>,
    pub peak_allocated: PeakOut,
    pub peak_reserved: PeakOut,
    pub ooms: Vec<OomFit>,
    pub first_oom_event: Option<u32>,
    /// Reserved bytes after each event where they changed (`--full`; the picture draws it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_curve: Option<Vec<(u32, u64)>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// The model, free of the real allocator's choices and under the real settings, made
    /// every real segment change at its event with its size.
    pub segment_changes_real: u64,
    pub segment_changes_matched: u64,
    pub ooms_reproduced: u64,
    pub ooms_real: u64,
    pub first_difference: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhatifDevice {
    pub device: i64,
    /// Events in the device's trace, and reserved bytes at its start (both runs start there).
    pub events: u64,
    pub real_start_reserved: u64,
    /// What the change is, in words.
    pub changes: Vec<String>,
    pub real: Scenario,
    pub whatif: Scenario,
    /// The model run with no change against the real run: how far the what-if can be trusted.
    pub identity: Identity,
    /// `--search`: the largest batch factor (or smallest capacity) at which the run fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchOut>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchOut {
    /// `batch` or `capacity`.
    pub what: String,
    /// The batch factor, or the capacity in bytes; null when even the smallest tried fails.
    pub value: Option<f64>,
    pub replays: u32,
}
