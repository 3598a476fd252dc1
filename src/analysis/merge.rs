//! `snapscan merge`: the cross-rank table from the JSON reports of many nodes
//! (`snapscan report --format json`, one per node or rank), without the snapshots.

use std::path::Path;

use rayon::prelude::*;

use super::report::{rank_from_name, rank_table};
use crate::input::{display_name, read_input, InputError};
use crate::report::{FileReport, MergeReport, Report, SCHEMA_VERSION};

/// Reads one JSON report (plain, gzip or zstd; `-` = stdin) and keeps what the rank table needs:
/// the per-allocation and per-segment lists are dropped so that thousands of reports fit in
/// memory.
pub fn read_report(path: &Path) -> Result<Vec<FileReport>, InputError> {
    let mut files = read_full_report(path)?;
    for f in &mut files {
        for d in &mut f.devices {
            d.live_at_peak = Vec::new();
            d.held_open.allocations = Vec::new();
            d.segments = Vec::new();
            for o in &mut d.oom {
                o.segments = Vec::new();
                o.live_by_call_site = Vec::new();
            }
        }
    }
    Ok(files)
}

/// Reads the files of one JSON report written by `snapscan report --format json`.
pub fn read_full_report(path: &Path) -> Result<Vec<FileReport>, InputError> {
    let name = display_name(path);
    let err = |message: String| InputError::Format {
        path: name.clone(),
        message,
    };
    let (bytes, _) = read_input(path)?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        err(format!(
            "not JSON ({e}); merge reads the output of `snapscan report --format json`"
        ))
    })?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => {}
        Some(v) => {
            return Err(err(format!(
                "schema_version {v}: this snapscan reads reports of schema_version {SCHEMA_VERSION}"
            )))
        }
        None => {
            return Err(err(
                "no schema_version: not a report written by `snapscan report --format json`".into(),
            ))
        }
    }
    let report: Report = serde_json::from_value(value)
        .map_err(|e| err(format!("not a `snapscan report --format json` output: {e}")))?;
    Ok(report.files)
}

/// Reads every report in parallel (in the order given) and builds the table.
pub fn merge_files(paths: &[std::path::PathBuf]) -> Result<MergeReport, InputError> {
    let read: Vec<_> = paths.par_iter().map(|p| read_report(p)).collect();
    let mut inputs = Vec::with_capacity(paths.len());
    for (p, r) in paths.iter().zip(read) {
        inputs.push((display_name(p), r?));
    }
    Ok(merge(inputs))
}

/// The cross-rank table of the files of several reports. Ranks come from the snapshot names
/// (`rank3.pickle`), else from the report's name (`reports/rank3.json`) when it holds one file.
/// Snapshot paths that occur in several reports (every node wrote `snapshot.pickle`) are shown
/// as `REPORT: PATH`. Rows are ordered by rank, then path.
pub fn merge(inputs: Vec<(String, Vec<FileReport>)>) -> MergeReport {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for (_, files) in &inputs {
        for f in files {
            *seen.entry(f.path.clone()).or_default() += 1;
        }
    }
    let mut files = Vec::new();
    let mut fallback_ranks = Vec::new();
    let names: Vec<String> = inputs.iter().map(|(n, _)| n.clone()).collect();
    for (name, report_files) in inputs {
        let single = report_files.len() == 1;
        for mut f in report_files {
            let fallback = if single { rank_from_name(&name) } else { None };
            if seen.get(&f.path).copied().unwrap_or(0) > 1 {
                f.path = format!("{name}: {}", f.path);
            }
            fallback_ranks.push(fallback);
            files.push(f);
        }
    }
    let mut table = rank_table(&files);
    for (row, fallback) in table.rows.iter_mut().zip(fallback_ranks) {
        if row.rank.is_none() {
            row.rank = fallback;
        }
    }
    table.rows.sort_by(|a, b| {
        (a.rank.is_none(), a.rank, &a.path).cmp(&(b.rank.is_none(), b.rank, &b.path))
    });
    MergeReport {
        schema_version: SCHEMA_VERSION,
        inputs: names,
        ranks: table,
    }
}
