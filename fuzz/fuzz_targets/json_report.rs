//! The JSON form of a snapshot: serde_json → document → typed snapshot → report; and the same
//! bytes the way the CLI reads them (`snapshot::load_bytes`: JSON when the first byte that is
//! not whitespace is `{` or `[`) must succeed or fail alike.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let direct = json_snapshot(data);
    let first = data.iter().copied().find(|b| !b.is_ascii_whitespace());
    if matches!(first, Some(b'{' | b'[')) {
        let cli = snapscan::snapshot::load_bytes("fuzz", data);
        match (&direct, &cli) {
            (Some(_), Ok(_)) | (None, Err(_)) => {}
            (Some(_), Err(e)) => panic!("the CLI's reader refused what parse_json read: {e}"),
            (None, Ok(_)) => panic!("the CLI's reader read what parse_json refused"),
        }
    }
    if let Some(snapshot) = direct {
        common::analyse(snapshot, data.len());
    }
});

/// `parse_json` then `decode`; `None` (with a message checked) when either fails.
fn json_snapshot(data: &[u8]) -> Option<snapscan::snapshot::Snapshot> {
    let doc = match snapscan::pickle::parse_json(data) {
        Ok(doc) => doc,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return None;
        }
    };
    match snapscan::snapshot::decode(&doc) {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(!e.to_string().is_empty());
            None
        }
    }
}

#[path = "common.rs"]
mod common;
