//! Work counters: opcodes stepped and memo values looked up by the readers, events stepped by
//! the analysis. A test reads them to check that work grows linearly with the input, which
//! timings are too noisy to show. Each loop adds its count once when it ends, so the counter
//! costs nothing measurable.

use std::sync::atomic::{AtomicU64, Ordering};

static UNITS: AtomicU64 = AtomicU64::new(0);

/// Adds `n` units of work.
#[inline]
pub fn add(n: u64) {
    UNITS.fetch_add(n, Ordering::Relaxed);
}

/// Units of work done by this process so far.
pub fn units() -> u64 {
    UNITS.load(Ordering::Relaxed)
}
