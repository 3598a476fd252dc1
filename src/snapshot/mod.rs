//! The typed model of a memory snapshot and its decoder.

mod decode;
mod intern;
mod model;
mod trace;

pub use decode::{decode, SchemaError};
pub use intern::{Frame, FrameId, Interner, StackId, TextId};
pub use model::*;
pub use trace::{Iter as TraceIter, Trace};

use std::path::Path;

use crate::input::{self, Compression, InputError};

/// Any error while loading a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("{file}: {source}")]
    Schema { file: String, source: SchemaError },
}

/// A loaded snapshot with what we know about the file it came from.
#[derive(Debug)]
pub struct LoadedSnapshot {
    pub name: String,
    /// Bytes after decompression.
    pub decoded_bytes: u64,
    pub compression: Compression,
    pub snapshot: Snapshot,
}

/// Reads, decompresses, decodes and types one snapshot file (`-` = stdin).
pub fn load(path: &Path) -> Result<LoadedSnapshot, LoadError> {
    let name = input::display_name(path);
    // Cleared when it goes out of scope, on success and on error.
    let mut progress = crate::progress::Loading::new(&name);
    let (bytes, compression) = input::read_input_with(path, &mut progress)?;
    let doc = input::decode_document_with(&name, &bytes, &mut progress)?;
    let decoded_bytes = bytes.len() as u64;
    drop(bytes);
    progress.phase("building the snapshot model", None);
    let snapshot = decode(&doc).map_err(|source| LoadError::Schema {
        file: name.clone(),
        source,
    })?;
    Ok(LoadedSnapshot {
        name,
        decoded_bytes,
        compression,
        snapshot,
    })
}

/// Decodes a snapshot from bytes already in memory (tests, fuzzing).
pub fn load_bytes(name: &str, bytes: &[u8]) -> Result<Snapshot, LoadError> {
    let doc = input::decode_document(name, bytes)?;
    decode(&doc).map_err(|source| LoadError::Schema {
        file: name.to_owned(),
        source,
    })
}
