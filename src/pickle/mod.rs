//! Safe reader for the pickles PyTorch writes with `_dump_snapshot`, and for the JSON form of
//! the same data. Produces a [`Document`]; never imports or calls anything.

mod json;
pub mod opcodes;
pub(crate) mod reader;
pub(crate) mod scan;
mod value;

pub use json::parse_json;
pub use reader::{parse, parse_salvage, parse_with_progress};
pub use value::{DictId, Document, SeqId, StrId, StringTable, Value};

/// Benchmarks only: the MEMOIZEs of `data` (a protocol 4/5 pickle) as the reader's walk
/// counts them, over ranges of about `chunk_bytes`; `None` where the reader would not walk it.
#[cfg(feature = "bench")]
pub fn walk_memos(data: &[u8], chunk_bytes: usize) -> Option<u64> {
    let plan = scan::plan(data, chunk_bytes, &|p, b| {
        crate::input::peek_slice(data, p, b)
    })?;
    let walks = scan::walk_in_order(data, &plan.ranges);
    Some(walks.iter().map(|w| w.memos as u64).sum())
}

/// What went wrong while decoding, with the byte offset into the (decompressed) input.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PickleError {
    #[error("refusing opcode {opcode} at byte {offset}: a memory snapshot holds only plain data")]
    Refused { offset: u64, opcode: &'static str },
    /// The input ends before STOP. `inside` names the value that was being built when it
    /// ended (`device_traces[0]`), when the machine's state tells.
    #[error("truncated at byte {offset} of {len}{}", inside_text(.inside))]
    Truncated {
        offset: u64,
        len: u64,
        needed: u64,
        inside: Option<String>,
    },
    /// A FRAME claiming far more bytes than the input has (not a dump cut short: those are
    /// read on, see `Truncated`).
    #[error("truncated at byte {offset} of {len}: the FRAME there claims {claimed} bytes")]
    FrameTooLong { offset: u64, len: u64, claimed: u64 },
    #[error("invalid pickle at byte {offset}: {message}")]
    Invalid { offset: u64, message: String },
    /// The values read so far take more memory than a snapshot of this size needs (see
    /// `reader::BYTES_PER_INPUT_BYTE`): many tiny containers or values, not a memory snapshot.
    #[error(
        "stopped at byte {offset} of {len}: the values read so far take more than {} MiB \
         ({per_byte} bytes per input byte), far more than a memory snapshot of this size \
         needs: the pickle is made of tiny containers or values",
        budget >> 20
    )]
    TooManyValues {
        offset: u64,
        len: u64,
        budget: u64,
        per_byte: u64,
    },
    #[error("invalid JSON: {0}")]
    Json(String),
}

fn inside_text(inside: &Option<String>) -> String {
    match inside {
        Some(path) => format!(" (inside {path})"),
        None => String::new(),
    }
}

impl PickleError {
    pub fn offset(&self) -> Option<u64> {
        match self {
            PickleError::Refused { offset, .. }
            | PickleError::Truncated { offset, .. }
            | PickleError::FrameTooLong { offset, .. }
            | PickleError::Invalid { offset, .. }
            | PickleError::TooManyValues { offset, .. } => Some(*offset),
            PickleError::Json(_) => None,
        }
    }
}
