//! Figures computed from the typed model.

pub mod callsite;
pub mod layout;
pub mod replay;
pub mod report;
pub mod stats;
