//! Figures computed from the typed model.

pub mod stats;
