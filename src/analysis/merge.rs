//! `snapscan merge`: the cross-rank table from the JSON reports of many nodes
//! (`snapscan report --format json`, one per node or rank), without the snapshots.

use std::path::Path;

use rayon::prelude::*;
use serde::Deserialize;

use super::report::{rank_from_name, rank_row, rank_table_from_rows, unreadable_row, RankDevice};
use crate::input::{display_name, read_input, InputError};
use crate::report::{FileReport, MergeReport, RankRow, Report, Unreadable, SCHEMA_VERSION};

/// The few fields of a report that the rank table needs. Everything else is skipped, so reports
/// written by other versions of snapscan (same `schema_version`, other fields) merge, and
/// thousands of them fit in memory.
#[derive(Deserialize)]
struct SlimFile {
    path: String,
    devices: Vec<SlimDevice>,
    /// Every device's row when `devices` has the interesting ones only.
    #[serde(default)]
    device_table: Vec<crate::report::DeviceRow>,
}

#[derive(Deserialize)]
struct SlimDevice {
    #[serde(default)]
    device: i64,
    peak: SlimPeak,
    #[serde(default)]
    peak_reserved: SlimLevel,
    #[serde(rename = "final")]
    final_state: SlimFinal,
    oom: Vec<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct SlimPeak {
    requested_bytes: i64,
    #[serde(default)]
    reserved_bytes: i64,
}

#[derive(Default, Deserialize)]
struct SlimLevel {
    bytes: i64,
}

#[derive(Deserialize)]
struct SlimFinal {
    reserved_bytes: u64,
}

/// Reads a JSON document (plain, gzip or zstd; `-` = stdin) and checks that it is a report of
/// this schema version.
fn read_report_value(path: &Path) -> Result<serde_json::Value, InputError> {
    let name = display_name(path);
    let err = |message: String| InputError::Format {
        path: name.clone(),
        message,
    };
    let (bytes, _) = read_input(path)?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        err(format!(
            "not JSON ({e}); expected the output of `snapscan report --format json`"
        ))
    })?;
    match value.get("schema_version").and_then(|v| v.as_u64()) {
        // Version 1 differs only in how call sites carry their stacks, which merging and
        // diffing do not read.
        Some(v) if (1..=u64::from(SCHEMA_VERSION)).contains(&v) => Ok(value),
        Some(v) => Err(err(format!(
            "schema_version {v}: this snapscan reads reports of schema_version 1 to {SCHEMA_VERSION}"
        ))),
        None => Err(err(
            "no schema_version: not a report written by `snapscan report --format json`".into(),
        )),
    }
}

/// The rank-table rows of one JSON report (one row per analysed file).
pub fn read_report_rows(path: &Path) -> Result<Vec<RankRow>, InputError> {
    let mut value = read_report_value(path)?;
    let files: Vec<SlimFile> =
        serde_json::from_value(value["files"].take()).map_err(|e| InputError::Format {
            path: display_name(path),
            message: format!("not a `snapscan report --format json` output: {e}"),
        })?;
    let unreadable: Vec<Unreadable> =
        serde_json::from_value(value["unreadable"].take()).unwrap_or_default();
    let mut rows: Vec<RankRow> = files
        .iter()
        .map(|f| {
            rank_row(
                &f.path,
                f.device_table.iter().map(RankDevice::of_row).chain(
                    f.devices
                        .iter()
                        // With a table, the table has every device.
                        .filter(|_| f.device_table.is_empty())
                        .map(|d| RankDevice {
                            device: d.device,
                            peak_requested_bytes: d.peak.requested_bytes,
                            reserved_at_peak_bytes: d.peak.reserved_bytes,
                            max_reserved_bytes: RankDevice::max_reserved(
                                d.peak_reserved.bytes,
                                d.final_state.reserved_bytes,
                            ),
                            final_reserved_bytes: d.final_state.reserved_bytes,
                            oom: !d.oom.is_empty(),
                        }),
                ),
            )
        })
        .collect();
    // Inputs the node's own report could not read stay rows of the table.
    rows.extend(unreadable.iter().map(|u| unreadable_row(&u.path, &u.error)));
    Ok(rows)
}

/// Reads the files of one JSON report written by `snapscan report --format json`, in full (for
/// `diff` against a stored baseline).
pub fn read_full_report(path: &Path) -> Result<Vec<FileReport>, InputError> {
    let value = read_report_value(path)?;
    let report: Report = serde_json::from_value(value).map_err(|e| InputError::Format {
        path: display_name(path),
        message: format!(
            "not a complete `snapscan report --format json` output of this version: {e}"
        ),
    })?;
    Ok(report.files)
}

/// Whether an (uncompressed) file starts like a `snapscan report --format json` output.
pub fn looks_like_json_report(path: &Path) -> bool {
    use std::io::Read;
    if path.as_os_str() == "-" {
        return false;
    }
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = String::from_utf8_lossy(&head[..n]);
    head.trim_start().starts_with('{') && head.contains("\"schema_version\"")
}

/// The one file of a stored JSON report (`diff`'s baseline); a report of several files is
/// refused.
pub fn read_one_report(path: &Path) -> anyhow::Result<FileReport> {
    let mut files = read_full_report(path)?;
    if files.len() != 1 {
        anyhow::bail!(
            "{}: the report holds {} files; diff compares one run with one run",
            path.display(),
            files.len()
        );
    }
    Ok(files.remove(0))
}

/// Reads every report in parallel (in the order given) and builds the table; a report that
/// cannot be read is a row of its own (with its error) and is listed in `unreadable`. An error
/// only when no report could be read. `ranks`: the inputs are ranks of one job (`--ranks`).
pub fn merge_files(paths: &[std::path::PathBuf], ranks: bool) -> Result<MergeReport, InputError> {
    let read: Vec<_> = paths.par_iter().map(|p| read_report_rows(p)).collect();
    if read.iter().all(Result::is_err) {
        if let Some(Err(e)) = read.into_iter().next() {
            return Err(e);
        }
        return Ok(merge(Vec::new(), ranks));
    }
    let mut inputs = Vec::with_capacity(paths.len());
    let mut unreadable = Vec::new();
    for (p, r) in paths.iter().zip(read) {
        let name = display_name(p);
        match r {
            Ok(rows) => inputs.push((name, rows)),
            Err(e) => {
                let error = e.to_string();
                inputs.push((name.clone(), vec![unreadable_row(&name, &error)]));
                unreadable.push(Unreadable { path: name, error });
            }
        }
    }
    let mut m = merge(inputs, ranks);
    m.unreadable = unreadable;
    Ok(m)
}

/// The cross-rank table of the rows of several reports (`(report name, rows)`). Ranks come from
/// the snapshot names (`rank3.pickle`), else from the report's name (`reports/rank3.json`) when
/// it holds one file. Snapshot paths that occur in several reports (every node wrote
/// `snapshot.pickle`) are shown as `REPORT: PATH`. Rows are ordered by rank, then path.
pub fn merge(inputs: Vec<(String, Vec<RankRow>)>, ranks: bool) -> MergeReport {
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for (_, rows) in &inputs {
        for r in rows {
            *seen.entry(r.path.clone()).or_default() += 1;
        }
    }
    let names: Vec<String> = inputs.iter().map(|(n, _)| n.clone()).collect();
    let mut rows = Vec::new();
    for (name, report_rows) in inputs {
        let single = report_rows.len() == 1;
        for mut r in report_rows {
            if seen.get(&r.path).copied().unwrap_or(0) > 1 {
                r.path = format!("{name}: {}", r.path);
            }
            if r.rank.is_none() && single {
                r.rank = rank_from_name(&name);
            }
            rows.push(r);
        }
    }
    let mut table = rank_table_from_rows(rows, ranks);
    table.rows.sort_by(|a, b| {
        (a.rank.is_none(), a.rank, &a.path).cmp(&(b.rank.is_none(), b.rank, &b.path))
    });
    MergeReport {
        schema_version: SCHEMA_VERSION,
        inputs: names,
        ranks: table,
        unreadable: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, peak: i64) -> RankRow {
        rank_row(
            path,
            [RankDevice {
                peak_requested_bytes: peak,
                final_reserved_bytes: 10,
                ..Default::default()
            }]
            .into_iter(),
        )
    }

    #[test]
    fn ranks_fall_back_to_the_report_name_and_clashing_paths_get_it_as_prefix() {
        let m = merge(
            vec![
                (
                    "reports/rank1.json".into(),
                    vec![row("snapshot.pickle", 100)],
                ),
                (
                    "reports/rank0.json".into(),
                    vec![row("snapshot.pickle", 100)],
                ),
                (
                    "reports/other.json".into(),
                    vec![row("run_rank2.pickle", 200)],
                ),
            ],
            false,
        );
        let got: Vec<(Option<u64>, &str)> = m
            .ranks
            .rows
            .iter()
            .map(|r| (r.rank, r.path.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(0), "reports/rank0.json: snapshot.pickle"),
                (Some(1), "reports/rank1.json: snapshot.pickle"),
                (Some(2), "run_rank2.pickle"),
            ]
        );
        assert_eq!(m.ranks.median_peak_requested_bytes, 100);
        assert!(m.ranks.rows[2].outlier);
    }
}
