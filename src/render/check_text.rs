//! `snapscan check` as text (one line per crossed budget, for logs and scripts) and Markdown.

use std::fmt::Write;

use super::blocks::{self, code, left, right, Block, Cell};
use super::safe;
use super::style::{paint, Tone};
use crate::report::{Amount, Budget, Budgets, CheckReport, Moment, Violation};
use crate::units::format_bytes;

fn amount(budget: Budget, a: Amount) -> String {
    match (budget, a) {
        (Budget::FailOnOom, Amount::Int(n)) => {
            format!("{n} OOM event{}", if n == 1 { "" } else { "s" })
        }
        (_, Amount::Int(b)) if b < 0 => format!("-{}", format_bytes(b.unsigned_abs())),
        (_, Amount::Int(b)) => format!("{} ({b} bytes)", format_bytes(b as u64)),
        (_, Amount::Ratio(r)) => format!("{r:.3}"),
    }
}

fn short_amount(budget: Budget, a: Amount) -> String {
    match (budget, a) {
        (Budget::FailOnOom, Amount::Int(n)) => n.to_string(),
        (_, Amount::Int(b)) if b < 0 => format!("-{}", format_bytes(b.unsigned_abs())),
        (_, Amount::Int(b)) => format_bytes(b as u64),
        (_, Amount::Ratio(r)) => format!("{r:.3}"),
    }
}

fn moment(v: &Violation) -> String {
    let what = match (v.budget, v.at) {
        (Budget::MaxPeak, _) => "peak of requested bytes",
        (Budget::MaxReserved, Moment::End) => "reserved bytes at the dump",
        (Budget::MaxReserved, _) => "peak of reserved bytes",
        (Budget::FailOnOom, _) => "first OOM",
        (Budget::MaxFragmentation, Moment::Oom) => "fragmentation at the OOM",
        (Budget::MaxFragmentation, _) => "fragmentation at the peak",
    };
    match (v.at, v.event_index) {
        (Moment::End, _) => what.to_owned(),
        (_, Some(e)) => format!("{what}, event {e}"),
        (_, None) => format!("{what}, at window start"),
    }
}

/// The budgets in words: `max-peak 20.0GiB, fail-on-oom`.
pub fn budgets_line(b: &Budgets) -> String {
    let mut parts = Vec::new();
    if let Some(x) = b.max_peak_bytes {
        parts.push(format!("max-peak {}", format_bytes(x)));
    }
    if let Some(x) = b.max_reserved_bytes {
        parts.push(format!("max-reserved {}", format_bytes(x)));
    }
    if let Some(x) = b.max_fragmentation_ratio {
        parts.push(format!("max-fragmentation {x:.3}"));
    }
    if b.fail_on_oom {
        parts.push("fail-on-oom".to_owned());
    }
    parts.join(", ")
}

fn counts(r: &CheckReport) -> (usize, usize) {
    (
        r.files.len(),
        r.files.iter().map(|f| f.devices.len()).sum::<usize>(),
    )
}

/// One line per crossed budget — `FAIL FILE device N BUDGET: MEASURED > LIMIT (MOMENT)` — or
/// one `ok` line when all hold.
pub fn text(r: &CheckReport, color: bool) -> String {
    let mut out = String::new();
    let (files, devices) = counts(r);
    if r.passed {
        let _ = writeln!(
            out,
            "{} {files} file{}, {devices} device{} within budgets: {}",
            paint("ok:", Tone::Good, color),
            if files == 1 { "" } else { "s" },
            if devices == 1 { "" } else { "s" },
            budgets_line(&r.budgets)
        );
        return out;
    }
    for v in &r.violations {
        let _ = writeln!(
            out,
            "{} {} device {} {}: {} > {} ({})",
            paint("FAIL", Tone::Bad, color),
            safe::term(&v.path),
            v.device,
            v.budget.flag(),
            amount(v.budget, v.measured),
            amount(v.budget, v.limit),
            moment(v)
        );
    }
    out
}

/// A Markdown summary for a PR comment.
pub fn markdown(r: &CheckReport) -> String {
    let (files, devices) = counts(r);
    let mut doc = vec![Block::Title(
        if r.passed {
            "snapscan check: all budgets hold".to_owned()
        } else {
            format!(
                "snapscan check: {} budget{} crossed",
                r.violations.len(),
                if r.violations.len() == 1 { "" } else { "s" }
            )
        },
        None,
    )];
    doc.push(Block::Para(
        format!(
            "Budgets: {}. Checked {files} file{}, {devices} device{}.",
            budgets_line(&r.budgets),
            if files == 1 { "" } else { "s" },
            if devices == 1 { "" } else { "s" }
        ),
        None,
    ));
    if !r.violations.is_empty() {
        doc.push(Block::Table {
            title: None,
            columns: vec![
                code("file"),
                right("device"),
                left("budget"),
                right("measured"),
                right("limit"),
                left("where"),
            ],
            rows: r
                .violations
                .iter()
                .map(|v| {
                    vec![
                        Cell::from(safe::name(&v.path)),
                        Cell::from(v.device.to_string()),
                        Cell::from(format!("`{}`", v.budget.flag())),
                        Cell::from(short_amount(v.budget, v.measured)),
                        Cell::from(short_amount(v.budget, v.limit)),
                        Cell::from(moment(v)),
                    ]
                })
                .collect(),
        });
    }
    doc.push(Block::Table {
        title: Some("Measured".to_owned()),
        columns: vec![
            code("file"),
            right("device"),
            right("peak"),
            right("reserved"),
            right("fragmentation"),
            right("OOMs"),
        ],
        rows: r
            .files
            .iter()
            .flat_map(|f| {
                f.devices.iter().map(move |d| {
                    vec![
                        Cell::from(safe::name(&f.path)),
                        Cell::from(d.device.to_string()),
                        Cell::from(short_amount(
                            Budget::MaxPeak,
                            Amount::Int(d.peak_requested_bytes),
                        )),
                        Cell::from(short_amount(
                            Budget::MaxReserved,
                            Amount::Int(d.reserved_bytes),
                        )),
                        Cell::from(format!("{:.3}", d.fragmentation_ratio)),
                        Cell::from(d.oom_events.to_string()),
                    ]
                })
            })
            .collect(),
    });
    blocks::markdown(&doc)
}
