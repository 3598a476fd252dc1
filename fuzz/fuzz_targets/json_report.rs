//! The JSON form of a snapshot: serde_json → document → typed snapshot → report.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let doc = match snapscan::pickle::parse_json(data) {
        Ok(doc) => doc,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let snapshot = match snapscan::snapshot::decode(&doc) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    drop(doc);
    common::analyse(snapshot, data.len());
});

#[path = "common.rs"]
mod common;
