//! `snapscan merge`: the cross-rank table as terminal text and Markdown.

use super::blocks::{self, code, left, right, Block, Cell};
use super::report_text::{outlier_note, RANK_COLUMNS_NOTE};
use super::safe;
use super::style::Tone;
use crate::report::MergeReport;
use crate::units::{format_bytes, format_bytes_signed};

fn bytes(b: i64) -> String {
    format_bytes_signed(i128::from(b))
}

fn rank_list(ranks: Vec<String>) -> String {
    if ranks.is_empty() {
        "none".to_owned()
    } else {
        ranks.join(", ")
    }
}

fn all_blocks(m: &MergeReport) -> Vec<Block> {
    let t = &m.ranks;
    let label = |r: &crate::report::RankRow| match r.rank {
        Some(n) => format!("rank {n}"),
        None => safe::name(&r.path),
    };
    let median = t.median_peak_requested_bytes;
    let oom: Vec<String> = t.rows.iter().filter(|r| r.oom).map(label).collect();
    let outliers: Vec<String> = t
        .rows
        .iter()
        .filter(|r| r.outlier)
        .map(|r| {
            let vs = if median > 0 {
                format!(
                    " ({:+.1}% vs median)",
                    (r.peak_requested_bytes - median) as f64 / median as f64 * 100.0
                )
            } else {
                String::new()
            };
            format!("{}{vs}", label(r))
        })
        .collect();
    let mut out = vec![Block::Title(
        format!(
            "snapscan merge: {} file{} from {} report{}, median peak {}",
            t.rows.len(),
            if t.rows.len() == 1 { "" } else { "s" },
            m.inputs.len(),
            if m.inputs.len() == 1 { "" } else { "s" },
            bytes(median)
        ),
        None,
    )];
    out.push(Block::Para(
        format!("OOM on: {}.", rank_list(oom.clone())),
        (!oom.is_empty()).then_some(Tone::Bad),
    ));
    out.push(Block::Para(
        format!(
            "Outliers: {}.",
            if t.ranks_of_one_job {
                rank_list(outliers.clone())
            } else {
                "not flagged".to_owned()
            }
        ),
        (!outliers.is_empty()).then_some(Tone::Bad),
    ));
    let dash = || Cell::from("-".to_owned());
    out.push(Block::Table {
        title: Some(format!("Columns: {RANK_COLUMNS_NOTE}")),
        columns: vec![
            right("rank"),
            right("device"),
            right("peak"),
            right("vs median"),
            right("reserved at peak"),
            right("max reserved"),
            left("OOM"),
            left("outlier"),
            code("file"),
        ],
        rows: t
            .rows
            .iter()
            .map(|r| {
                let rank = Cell::from(r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into()));
                if let Some(e) = &r.error {
                    return vec![
                        rank,
                        dash(),
                        dash(),
                        dash(),
                        dash(),
                        dash(),
                        Cell::toned("unreadable", Some(Tone::Bad)),
                        Cell::from(String::new()),
                        Cell::from(safe::name(e)),
                    ];
                }
                vec![
                    rank,
                    Cell::from(
                        r.peak_device
                            .map(|d| d.to_string())
                            .unwrap_or_else(|| "-".into()),
                    ),
                    Cell::from(bytes(r.peak_requested_bytes)),
                    Cell::from(if median > 0 {
                        format!(
                            "{:+.1}%",
                            (r.peak_requested_bytes - median) as f64 / median as f64 * 100.0
                        )
                    } else {
                        "-".to_owned()
                    }),
                    Cell::from(format_bytes(r.reserved_at_peak_bytes)),
                    Cell::from(format_bytes(r.max_reserved_bytes)),
                    Cell::toned(if r.oom { "yes" } else { "no" }, r.oom.then_some(Tone::Bad)),
                    Cell::toned(
                        if r.outlier { "OUTLIER" } else { "" },
                        r.outlier.then_some(Tone::Bad),
                    ),
                    Cell::from(safe::name(&r.path)),
                ]
            })
            .collect(),
    });
    out.push(Block::Para(outlier_note(t), None));
    out
}

/// Terminal text; colour only when `color`.
pub fn text(m: &MergeReport, color: bool) -> String {
    blocks::text(&all_blocks(m), color)
}

/// Markdown for a PR comment or an issue.
pub fn markdown(m: &MergeReport) -> String {
    blocks::markdown(&all_blocks(m))
}
