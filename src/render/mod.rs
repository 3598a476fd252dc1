//! Pure functions from output structs to bytes: text, Markdown, JSON.

pub mod blocks;
pub mod check_text;
pub mod diff_text;
pub mod explain_text;
pub mod html;
pub mod merge_text;
pub mod safe;
pub mod stats_text;
pub mod style;
pub mod svg;
pub mod svg_segments;
pub mod svg_timeline;
pub mod svg_whatif;

use serde::Serialize;

/// Pretty JSON with a trailing newline.
pub fn json<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_else(|e| {
        format!("{{\"error\": \"could not serialise output: {e}\"}}").into_bytes()
    });
    out.push(b'\n');
    out
}
pub mod replay_text;
pub mod report_text;
pub mod whatif_text;
