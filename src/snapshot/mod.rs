//! The typed model of a memory snapshot and its decoder.

mod decode;
mod fast;
mod intern;
mod model;
mod trace;

pub use decode::{decode, SchemaError};
pub use intern::{Frame, FrameId, Interner, StackId, TextId};
pub use model::*;
pub use trace::{Combination, Core as TraceCore, Iter as TraceIter, Trace};

use std::path::Path;

use crate::input::{self, Compression, InputError};
use crate::pickle::PickleError;

/// Any error while loading a snapshot file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Input(#[from] InputError),
    // The schema error is part of the message, not a `source()` (`{:#}` would repeat it).
    #[error("{file}: {error}")]
    Schema { file: String, error: SchemaError },
    /// A pickle cut short; `hint` adds "; try --salvage" (for commands that have it).
    #[error("{file}: {error}{}", if *hint { "; try --salvage" } else { "" })]
    Truncated {
        file: String,
        error: PickleError,
        hint: bool,
    },
}

/// How to load a snapshot file.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// Recover what is complete from a pickle cut short (a dump killed while writing) instead
    /// of failing; the snapshot's `salvaged` says where it was cut.
    pub salvage: bool,
    /// Without `salvage`: end the error for a cut pickle with "; try --salvage".
    pub hint_salvage: bool,
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
    load_with(path, LoadOptions::default())
}

/// [`load`] with options (salvage of cut pickles).
pub fn load_with(path: &Path, opts: LoadOptions) -> Result<LoadedSnapshot, LoadError> {
    let name = input::display_name(path);
    // Cleared when it goes out of scope, on success and on error.
    let mut progress = crate::progress::Loading::new(&name);
    heap_for_the_reader();
    let (bytes, compression, stream_cut) =
        input::read_input_salvage(path, &mut progress, opts.salvage)?;
    let decoded_bytes = bytes.len() as u64;
    // The parallel reader takes what CPython writes; anything else goes the sequential way.
    let done = progress.parallel_phase("parsing", decoded_bytes);
    let (mut snapshot, cut) = match fast::load(
        &bytes,
        &|start, end| bytes.release(start, end),
        &|pos, buf| bytes.peek(pos, buf),
        &done,
        opts.salvage,
    ) {
        Ok(loaded) => loaded,
        Err(fast::Fail::Truncated(error)) => return Err(truncated(&name, error, opts)),
        Err(fast::Fail::Unsupported) => sequential(&name, &bytes, opts, &mut progress)?,
    };
    snapshot.salvaged = cut.and_then(salvaged);
    if let Some(note) = stream_cut {
        // A cut gzip/zstd stream whose pickle happens to be whole is still a salvaged input.
        snapshot
            .salvaged
            .get_or_insert(Salvaged {
                offset: decoded_bytes,
                len: decoded_bytes,
                inside: None,
                stream: None,
            })
            .stream = Some(note);
    }
    drop(bytes);
    hand_back_free_memory();
    Ok(LoadedSnapshot {
        name,
        decoded_bytes,
        compression,
        snapshot,
    })
}

/// Returns the heap memory freed by the reader to the system. glibc keeps what is freed in its
/// heaps, where the chunks' containers leave holes the analysis does not fill: resident memory
/// would be the reader's peak plus the analysis (notHanmin x28: peak 61 -> 51 MB, in ~2 ms).
///
/// From here on, blocks of 256 KiB and more get pages of their own, given back when freed: the
/// analysis makes few of them (per-event and per-allocation tables), and its temporary ones
/// would otherwise stay in the heaps beside the next (MAGMA27 x200: peak 63.7 -> 58 MB). The
/// reader's many growing containers are not affected (for them it costs a quarter of its
/// speed).
fn hand_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only gives free pages of the allocator's own heaps back; it takes
    // no pointer and touches no memory in use. mallopt only changes where later blocks come
    // from.
    unsafe {
        libc::malloc_trim(0);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
    HEAP_SET_FOR_ANALYSIS.store(true, std::sync::atomic::Ordering::Relaxed);
}

static HEAP_SET_FOR_ANALYSIS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A second load (`diff`, `merge`) after [`hand_back_free_memory`]: big blocks come from the
/// heaps again, as glibc's own threshold has them once it has grown.
fn heap_for_the_reader() {
    if HEAP_SET_FOR_ANALYSIS.load(std::sync::atomic::Ordering::Relaxed) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes where later blocks come from.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        }
    }
}

fn truncated(name: &str, error: PickleError, opts: LoadOptions) -> LoadError {
    LoadError::Truncated {
        file: name.to_owned(),
        error,
        hint: opts.hint_salvage,
    }
}

fn salvaged(cut: PickleError) -> Option<Salvaged> {
    match cut {
        PickleError::Truncated {
            offset,
            len,
            inside,
            ..
        } => Some(Salvaged {
            offset,
            len,
            inside,
            stream: None,
        }),
        _ => None,
    }
}

/// The sequential reader (and decoder), salvaging a cut pickle when asked to.
fn sequential(
    name: &str,
    bytes: &[u8],
    opts: LoadOptions,
    progress: &mut crate::progress::Loading,
) -> Result<(Snapshot, Option<PickleError>), LoadError> {
    let schema = |error| LoadError::Schema {
        file: name.to_owned(),
        error,
    };
    match input::decode_document_with(name, bytes, progress) {
        Ok(doc) => {
            progress.phase("building the snapshot model", None);
            let mut s = decode(&doc).map_err(schema)?;
            s.after_stop = doc.end.and_then(|e| AfterStop::of(e, bytes.len()));
            Ok((s, None))
        }
        Err(InputError::Pickle {
            error: error @ PickleError::Truncated { .. },
            ..
        }) => {
            if !opts.salvage {
                return Err(truncated(name, error, opts));
            }
            let (doc, cut) =
                crate::pickle::parse_salvage(bytes).map_err(|error| InputError::Pickle {
                    path: name.to_owned(),
                    error,
                })?;
            Ok((decode(&doc).map_err(schema)?, cut))
        }
        Err(e) => Err(e.into()),
    }
}

/// Decodes a snapshot from bytes already in memory (tests, fuzzing).
pub fn load_bytes(name: &str, bytes: &[u8]) -> Result<Snapshot, LoadError> {
    load_bytes_with(name, bytes, LoadOptions::default())
}

/// [`load_bytes`] with options.
pub fn load_bytes_with(name: &str, bytes: &[u8], opts: LoadOptions) -> Result<Snapshot, LoadError> {
    match load_bytes_parallel_with(bytes, 0, opts) {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(match e {
            LoadError::Truncated { error, .. } => truncated(name, error, opts),
            other => other,
        }),
        None => load_bytes_sequential_with(name, bytes, opts),
    }
}

/// [`load_bytes`] with the parallel reader only: `None` when it leaves the input to the
/// sequential reader (tests compare the two).
#[doc(hidden)]
pub fn load_bytes_parallel(bytes: &[u8]) -> Option<Snapshot> {
    load_bytes_parallel_with(bytes, 0, LoadOptions::default()).and_then(Result::ok)
}

/// Tests: with two threads, the chunk from which the second one reads (`None`: the one at five
/// eighths of the bytes).
#[doc(hidden)]
pub fn force_in_order_split(chunk: Option<usize>) {
    fast::force_split(chunk);
}

/// Tests: with two threads, added to the memo base the second one probes for its first chunk
/// (0: none), so that a wrong one must be caught.
#[doc(hidden)]
pub fn force_probe_error(by: u32) {
    fast::force_probe_error(by);
}

/// Tests: whether the parallel reader's chunks hand on the bytes of the short opcodes left
/// to the stitch (`false`: the stitch reads every one back from the input).
#[doc(hidden)]
pub fn keep_raw_opcode_bytes(keep: bool) {
    fast::keep_raw_bytes(keep);
}

/// [`load_bytes_parallel`] with chunks of about `chunk_bytes` instead of the default 1 MiB.
#[doc(hidden)]
pub fn load_bytes_parallel_chunked(bytes: &[u8], chunk_bytes: usize) -> Option<Snapshot> {
    load_bytes_parallel_with(bytes, chunk_bytes, LoadOptions::default()).and_then(Result::ok)
}

/// The parallel reader with options; `chunk_bytes` 0 = the default. `None`: left to the
/// sequential reader.
#[doc(hidden)]
pub fn load_bytes_parallel_with(
    bytes: &[u8],
    chunk_bytes: usize,
    opts: LoadOptions,
) -> Option<Result<Snapshot, LoadError>> {
    let r = if chunk_bytes == 0 {
        fast::load(
            bytes,
            &|_, _| {},
            &|p, b| crate::input::peek_slice(bytes, p, b),
            &Default::default(),
            opts.salvage,
        )
    } else {
        fast::load_chunked(bytes, chunk_bytes, opts.salvage)
    };
    match r {
        Ok((mut s, cut)) => {
            s.salvaged = cut.and_then(salvaged);
            Some(Ok(s))
        }
        Err(fast::Fail::Truncated(error)) => Some(Err(truncated("", error, opts))),
        Err(fast::Fail::Unsupported) => None,
    }
}

/// [`load_bytes`] with the sequential reader only.
#[doc(hidden)]
pub fn load_bytes_sequential(name: &str, bytes: &[u8]) -> Result<Snapshot, LoadError> {
    load_bytes_sequential_with(name, bytes, LoadOptions::default())
}

/// [`load_bytes_sequential`] with options.
#[doc(hidden)]
pub fn load_bytes_sequential_with(
    name: &str,
    bytes: &[u8],
    opts: LoadOptions,
) -> Result<Snapshot, LoadError> {
    let (mut s, cut) = sequential(name, bytes, opts, &mut crate::progress::Loading::hidden())?;
    s.salvaged = cut.and_then(salvaged);
    Ok(s)
}
