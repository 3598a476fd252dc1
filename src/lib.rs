//! snapscan: answers from PyTorch CUDA memory snapshots.
//!
//! Data flows one way: [`input`] (bytes) → [`pickle`] (plain values, nothing executed) →
//! [`snapshot`] (typed model) → [`analysis`] (figures) → [`report`] (one serde struct) →
//! [`render`] (text, Markdown, JSON). [`store`] writes the analysis's rows into SQLite;
//! [`mcp`] serves the same answers to agents, as the CLI ([`cli`]) does to people.

pub mod allocator;
pub mod analysis;
pub mod cli;
pub mod explain;
pub mod guard;
pub mod input;
pub mod mcp;
pub mod pickle;
pub mod progress;
pub mod render;
pub mod report;
pub mod snapshot;
pub mod store;
mod timing;
pub mod units;
pub mod work;
