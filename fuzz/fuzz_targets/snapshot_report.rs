//! Bytes → document (pickle or JSON, as the CLI detects) → typed snapshot → the whole report,
//! rendered as text and JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    common::report(data);
});

#[path = "common.rs"]
mod common;
