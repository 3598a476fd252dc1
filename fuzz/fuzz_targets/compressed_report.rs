//! Compressed inputs: bytes → the CLI's gzip/zstd decompression (`input::decompress_bytes`:
//! the cap, gzip members one after another, zstd frames and skippable frames, and with
//! salvage the part of a cut stream before the cut) → the decompressed pickle or JSON, read as
//! the CLI reads it → the whole report, rendered as text and JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapscan::input;
use snapscan::progress::Loading;
use snapscan::snapshot::{self, LoadOptions};

/// The most an input may decompress to here. The CLI's default cap is 200 times the input and
/// at least 256 MiB, which a 64 kB zstd input can reach; a pickle that size is over the run's
/// memory limit (`-rss_limit_mb=256`) however well the readers do. The cap's own test is in
/// tests/it/hostile.rs.
const CAP: u64 = 8 << 20;

fuzz_target!(|data: &[u8]| {
    static SET_CAP: std::sync::Once = std::sync::Once::new();
    SET_CAP.call_once(|| input::set_max_decompressed(CAP));
    let Some((bytes, salvage)) = decompressed(data) else {
        return;
    };
    assert!(
        bytes.len() as u64 <= CAP,
        "{} bytes past the cap",
        bytes.len()
    );
    let opts = LoadOptions {
        salvage,
        hint_salvage: !salvage,
    };
    match snapshot::load_bytes_with("fuzz", &bytes, opts) {
        Ok(s) => common::analyse(s, bytes.len()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});

/// The decompressed bytes, and whether salvage was needed for them: as the CLI without
/// --salvage first; with it, only for what fails without it (the one case where it reads
/// otherwise). `None` for an input that is not compressed (the other targets read those) or
/// that fails both ways.
fn decompressed(data: &[u8]) -> Option<(Vec<u8>, bool)> {
    let hidden = &mut Loading::hidden();
    match input::decompress_bytes("fuzz", data, hidden, false) {
        Ok(Some(d)) => {
            assert!(d.note.is_none());
            Some((d.bytes, false))
        }
        Ok(None) => None,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            match input::decompress_bytes("fuzz", data, hidden, true) {
                Ok(Some(d)) => {
                    assert!(
                        d.note.is_some(),
                        "salvage kept a failing stream without a note"
                    );
                    Some((d.bytes, true))
                }
                Ok(None) => unreachable!("compressed without salvage, not with it"),
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    None
                }
            }
        }
    }
}

#[path = "common.rs"]
mod common;
