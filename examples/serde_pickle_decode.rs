//! serde-pickle's `Value` decoding of a snapshot, for `bench/run.sh` (a Rust peer: the generic
//! way to read a pickle from Rust). Prints the top-level keys, or serde-pickle's error.
//!
//! `cargo run --release --features bench --example serde_pickle_decode -- FILE`

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: serde_pickle_decode FILE");
        return ExitCode::from(2);
    };
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    match serde_pickle::value_from_slice(&data, serde_pickle::DeOptions::new()) {
        Ok(serde_pickle::Value::Dict(map)) => {
            let keys: Vec<String> = map.keys().map(|k| format!("{k:?}")).collect();
            println!("decoded: dict with keys {}", keys.join(", "));
            ExitCode::SUCCESS
        }
        Ok(_) => {
            println!("decoded: not a dict");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("serde-pickle: {e}");
            ExitCode::from(1)
        }
    }
}
