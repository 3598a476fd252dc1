//! Figures computed from the typed model.

pub mod advice;
pub mod allocator_replay;
pub mod annotations;
pub mod callsite;
pub mod category;
pub mod check;
pub mod diff;
pub mod fields;
pub mod headline;
pub mod host;
pub mod layout;
pub mod leaks;
pub mod lifetimes;
pub mod merge;
pub mod outlier;
pub mod phase;
pub mod pools;
pub mod quality;
pub mod recording;
pub mod report;
pub mod stats;
pub mod summary;
pub mod whatif;
