//! Getting the bytes of a snapshot: memory-mapped files, gzip/zstd detected by magic bytes,
//! stdin (`-`), and recognising inputs that are not snapshots at all.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::pickle::{self, Document, PickleError};

/// Bytes of one input, either mapped from disk or decompressed/read into memory.
pub enum InputBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for InputBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            InputBytes::Mapped(m) => m,
            InputBytes::Owned(v) => v,
        }
    }
}

/// How the input was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// An error while getting or decoding an input, always naming the input.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
    #[error("{path}: {source}")]
    Pickle { path: String, source: PickleError },
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// Display name of an input path (`-` is stdin).
pub fn display_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Reads (maps) an input and undoes gzip/zstd compression, detected by magic bytes.
pub fn read_input(path: &Path) -> Result<(InputBytes, Compression), InputError> {
    let name = display_name(path);
    let io_err = |source| InputError::Io {
        path: name.clone(),
        source,
    };
    let raw = if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .lock()
            .read_to_end(&mut buf)
            .map_err(io_err)?;
        InputBytes::Owned(buf)
    } else {
        let file = std::fs::File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(InputError::Format {
                path: name,
                message: "is a directory, not a snapshot file".into(),
            });
        }
        if meta.len() == 0 {
            InputBytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only; a file truncated underneath us by another process
            // is the usual mmap caveat, accepted by every mmap-based reader.
            match unsafe { memmap2::Mmap::map(&file) } {
                Ok(m) => InputBytes::Mapped(m),
                Err(_) => {
                    let mut buf = Vec::new();
                    std::fs::File::open(path)
                        .and_then(|mut f| f.read_to_end(&mut buf))
                        .map_err(io_err)?;
                    InputBytes::Owned(buf)
                }
            }
        }
    };
    if raw.starts_with(GZIP_MAGIC) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| InputError::Format {
                path: name.clone(),
                message: format!("gzip data is corrupt: {e}"),
            })?;
        return Ok((InputBytes::Owned(out), Compression::Gzip));
    }
    if raw.starts_with(ZSTD_MAGIC) {
        let mut out = Vec::new();
        let mut decoder =
            ruzstd::decoding::StreamingDecoder::new(&raw[..]).map_err(|e| InputError::Format {
                path: name.clone(),
                message: format!("zstd data is corrupt: {e}"),
            })?;
        decoder
            .read_to_end(&mut out)
            .map_err(|e| InputError::Format {
                path: name.clone(),
                message: format!("zstd data is corrupt: {e}"),
            })?;
        return Ok((InputBytes::Owned(out), Compression::Zstd));
    }
    Ok((raw, Compression::None))
}

/// Decodes the bytes of an input as a pickle or as JSON, with a clear message for inputs that
/// are neither (empty files, `torch.save` zip archives, text).
pub fn decode_document(name: &str, data: &[u8]) -> Result<Document, InputError> {
    let format_err = |message: &str| InputError::Format {
        path: name.to_owned(),
        message: message.to_owned(),
    };
    if data.is_empty() {
        return Err(format_err(
            "the file is empty (expected a pickle written by torch.cuda.memory._dump_snapshot)",
        ));
    }
    if data.starts_with(ZIP_MAGIC) {
        return Err(format_err(
            "this is a zip archive (as torch.save writes), not a memory snapshot from torch.cuda.memory._dump_snapshot",
        ));
    }
    let first = data
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    let result = if data[0] == pickle::opcodes::PROTO {
        pickle::parse(data)
    } else if first == b'{' || first == b'[' {
        pickle::parse_json(data)
    } else if data[0] == pickle::opcodes::EMPTY_DICT
        || data[0] == pickle::opcodes::EMPTY_LIST
        || data[0] == pickle::opcodes::MARK
    {
        // Protocol 0/1 pickles have no PROTO header.
        pickle::parse(data)
    } else {
        return Err(format_err(&format!(
            "not a memory snapshot: expected a pickle (first byte 0x80) or JSON, found first byte 0x{:02x}",
            data[0]
        )));
    };
    result.map_err(|source| InputError::Pickle {
        path: name.to_owned(),
        source,
    })
}

/// Expands directories into the snapshot files inside them (sorted), keeps files as they are.
pub fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|source| InputError::Io {
                path: display_name(p),
                source,
            })?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && looks_like_snapshot_name(f))
                .collect();
            files.sort();
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn looks_like_snapshot_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    [
        ".pickle",
        ".pkl",
        ".pickle.gz",
        ".pickle.zst",
        ".pkl.gz",
        ".pkl.zst",
        ".json",
    ]
    .iter()
    .any(|ext| name.ends_with(ext))
}
