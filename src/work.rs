//! Work counters: bytes stepped over by the readers' opcode walks (the chunk machines, the
//! index of a chunk's memo sources, the sequential reader), memo values looked up across chunks,
//! stitch macros and events replayed by the analysis. A test reads them to check that work grows
//! linearly with the input, which timings are too noisy to show. Each loop adds its count once
//! when it ends, so counting costs nothing measurable. The chunk plan's walk is not counted: it
//! steps over every byte once by construction.

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

static DOC_VALUES: AtomicU64 = AtomicU64::new(0);

/// Adds `n` values of a generic document handed to the decoder by the parallel reader (what it
/// could not turn into typed rows in its chunks: the skeleton, settings, odd shapes).
pub fn add_document_values(n: u64) {
    DOC_VALUES.fetch_add(n, Ordering::Relaxed);
}

/// Values of generic documents the parallel reader built so far.
pub fn document_values() -> u64 {
    DOC_VALUES.load(Ordering::Relaxed)
}

static MACHINE_OPCODES: AtomicU64 = AtomicU64::new(0);

/// Adds `n` opcodes the parallel reader's chunk machines ran one by one (what the shapes read
/// whole, trace entries and the dicts of segments, left to the stack machine).
pub fn add_machine_opcodes(n: u64) {
    MACHINE_OPCODES.fetch_add(n, Ordering::Relaxed);
}

/// Opcodes the chunk machines ran one by one so far.
pub fn machine_opcodes() -> u64 {
    MACHINE_OPCODES.load(Ordering::Relaxed)
}
