//! Figures computed from the typed model.

pub mod stats;
pub mod callsite;
pub mod layout;
pub mod replay;
pub mod report;
