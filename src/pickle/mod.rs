//! Safe reader for the pickles PyTorch writes with `_dump_snapshot`, and for the JSON form of
//! the same data. Produces a [`Document`]; never imports or calls anything.

mod json;
pub mod opcodes;
mod reader;
pub(crate) mod scan;
mod value;

pub use json::parse_json;
pub use reader::{parse, parse_with_progress};
pub use value::{DictId, Document, SeqId, StrId, StringTable, Value};

/// What went wrong while decoding, with the byte offset into the (decompressed) input.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum PickleError {
    #[error("refusing opcode {opcode} at byte {offset}: a memory snapshot holds only plain data")]
    Refused { offset: u64, opcode: &'static str },
    #[error("truncated at byte {offset} of {len}: {needed} more bytes were expected")]
    Truncated { offset: u64, len: u64, needed: u64 },
    #[error("invalid pickle at byte {offset}: {message}")]
    Invalid { offset: u64, message: String },
    #[error("invalid JSON: {0}")]
    Json(String),
}

impl PickleError {
    pub fn offset(&self) -> Option<u64> {
        match self {
            PickleError::Refused { offset, .. }
            | PickleError::Truncated { offset, .. }
            | PickleError::Invalid { offset, .. } => Some(*offset),
            PickleError::Json(_) => None,
        }
    }
}
