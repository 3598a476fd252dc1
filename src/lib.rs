//! snapscan: answers from PyTorch CUDA memory snapshots.
//!
//! Data flows one way: [`input`] (bytes) → [`pickle`] (plain values, nothing executed) →
//! [`snapshot`] (typed model) → [`analysis`] (figures) → [`report`] (one serde struct) →
//! [`render`] (text, Markdown, JSON).

pub mod allocator;
pub mod analysis;
pub mod cli;
pub mod explain;
pub mod guard;
pub mod input;
pub mod pickle;
pub mod progress;
pub mod render;
pub mod report;
pub mod snapshot;
mod timing;
pub mod units;
pub mod work;
