//! Figures computed from the typed model.

pub mod callsite;
pub mod check;
pub mod diff;
pub mod layout;
pub mod merge;
pub mod replay;
pub mod report;
pub mod stats;
pub mod phase;
pub mod advice;
pub mod category;
