//! The pickle reader alone: any byte string gives a document or an error, never a panic, a
//! hang or unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match snapscan::pickle::parse(data) {
        Ok(doc) => {
            // Walk the result a little: converting to JSON touches every container once per
            // reference, bounded by the depth limit.
            if let Some(root) = doc.root {
                let _ = doc.to_json(root, 4);
            }
        }
        Err(e) => {
            // Every pickle error but JSON carries an offset inside (or just past) the input.
            if let Some(offset) = e.offset() {
                assert!(offset <= data.len() as u64, "{e}");
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
