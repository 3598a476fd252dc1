//! `snapscan diff` as terminal text and as Markdown ready to paste into a PR comment, both from
//! the same blocks.

use super::blocks::{self, code, left, right, Block, Cell};
use super::safe;
use super::style::Tone;
use crate::report::{Change, Delta, DeviceDiff, DiffReport, KeyDelta};
use crate::units::{format_bytes, format_bytes_signed};

/// What the reader asked to see.
#[derive(Clone, Copy, Debug)]
pub struct DiffView {
    /// Rows per call-site table.
    pub top: usize,
}

fn signed_bytes(b: i64) -> String {
    if b > 0 {
        format!("+{}", format_bytes(b as u64))
    } else {
        format_bytes_signed(i128::from(b))
    }
}

fn bytes(b: i64) -> String {
    format_bytes_signed(i128::from(b))
}

fn percent(r: f64) -> String {
    if r.is_infinite() {
        "new".to_owned()
    } else {
        format!("{}{:.1}%", if r > 0.0 { "+" } else { "" }, r * 100.0)
    }
}

fn change(d: &Delta) -> String {
    match (d.delta, d.ratio) {
        (0, _) => "0".to_owned(),
        (x, Some(r)) => format!("{} ({})", signed_bytes(x), percent(r)),
        (x, None) => signed_bytes(x),
    }
}

/// Growth is bad, shrinking good (memory).
fn tone_of(delta: i64) -> Option<Tone> {
    match delta {
        d if d > 0 => Some(Tone::Bad),
        d if d < 0 => Some(Tone::Good),
        _ => None,
    }
}

fn delta_row(name: &str, d: &Delta) -> Vec<Cell> {
    vec![
        Cell::from(name),
        Cell::from(bytes(d.base)),
        Cell::from(bytes(d.new)),
        Cell::toned(change(d), tone_of(d.delta)),
    ]
}

fn headline(d: &DeviceDiff) -> (String, Option<Tone>) {
    let p = &d.peak;
    let presence = match (d.in_base, d.in_new) {
        (false, true) => " (only in the new run)",
        (true, false) => " (only in the base run)",
        _ => "",
    };
    let verdict = match p.delta {
        x if x > 0 => "grew",
        x if x < 0 => "shrank",
        _ => "unchanged",
    };
    let line = if !(d.in_base && d.in_new) {
        // Only one run has the device: nothing to compare, never "unchanged".
        let (figure, other) = if d.in_new {
            (p.new, "the base run")
        } else {
            (p.base, "the new run")
        };
        format!(
            "Device {}{presence}: peak {}; {other} has no such device, so nothing to compare.",
            d.device,
            bytes(figure)
        )
    } else if p.delta == 0 {
        format!(
            "Device {}{presence}: peak {}, {verdict}.",
            d.device,
            bytes(p.new)
        )
    } else {
        format!(
            "Device {}{presence}: peak {} → {}, {}: {verdict}.",
            d.device,
            bytes(p.base),
            bytes(p.new),
            change(p)
        )
    };
    (line, tone_of(p.delta))
}

fn oom_line(d: &DeviceDiff) -> Option<(String, Tone)> {
    let verdict = d
        .oom
        .verdict
        .as_deref()
        .map(|v| format!(", verdict {}", safe::name(v)))
        .unwrap_or_default();
    match d.oom.change.as_str() {
        "appeared" => Some((
            format!(
                "Device {}: OOM appeared ({} event{}{verdict}).",
                d.device,
                d.oom.new,
                if d.oom.new == 1 { "" } else { "s" }
            ),
            Tone::Bad,
        )),
        "disappeared" => Some((
            format!(
                "Device {}: OOM disappeared (base run had {}{verdict}).",
                d.device, d.oom.base
            ),
            Tone::Good,
        )),
        "still" => Some((
            format!(
                "Device {}: OOM in both runs ({} → {}{verdict}).",
                d.device,
                d.oom.base,
                crate::units::counted(d.oom.new, "event", "events")
            ),
            Tone::Bad,
        )),
        _ => None,
    }
}

fn status(k: &KeyDelta) -> &'static str {
    match k.change {
        Change::New => "new",
        Change::Gone => "gone",
        Change::Grew => "grew",
        Change::Shrank => "shrank",
        Change::Same => "same",
    }
}

fn key_table(title: String, first: &'static str, rows: &[&KeyDelta], with_counts: bool) -> Block {
    let mut columns = vec![right("change"), right("base"), right("new"), left("status")];
    if with_counts {
        columns.push(right("allocations"));
    }
    columns.push(if first == "call site" {
        code(first)
    } else {
        left(first)
    });
    Block::Table {
        title: Some(title),
        columns,
        rows: rows
            .iter()
            .map(|k| {
                let mut r = vec![
                    Cell::toned(signed_bytes(k.delta_bytes), tone_of(k.delta_bytes)),
                    Cell::from(format_bytes(k.base_bytes)),
                    Cell::from(format_bytes(k.new_bytes)),
                    Cell::from(status(k)),
                ];
                if with_counts {
                    r.push(Cell::from(match (k.base_count, k.new_count) {
                        (Some(b), Some(n)) => format!("{b} → {n}"),
                        _ => "-".to_owned(),
                    }));
                }
                r.push(Cell::from(safe::name(&k.key)));
                r
            })
            .collect(),
    }
}

fn device_blocks(d: &DeviceDiff, view: &DiffView, several: bool) -> Vec<Block> {
    let mut out = Vec::new();
    if several {
        out.push(Block::Heading(format!("device {}", d.device)));
    }
    let mut rows = vec![
        delta_row("peak (requested)", &d.peak),
        delta_row("peak allocated", &d.peak_allocated),
        delta_row("peak reserved", &d.peak_reserved),
        delta_row("reserved at the dump", &d.final_reserved),
    ];
    let f = &d.fragmentation_at_peak;
    let frag_tone = if f.delta > 0.0005 {
        Some(Tone::Bad)
    } else if f.delta < -0.0005 {
        Some(Tone::Good)
    } else {
        None
    };
    rows.push(vec![
        Cell::from("fragmentation at the peak"),
        Cell::from(format!("{:.3}", f.base)),
        Cell::from(format!("{:.3}", f.new)),
        Cell::toned(format!("{:+.3}", f.delta), frag_tone),
    ]);
    rows.push(vec![
        Cell::from("OOM events"),
        Cell::from(d.oom.base.to_string()),
        Cell::from(d.oom.new.to_string()),
        Cell::toned(
            d.oom.change.clone(),
            match d.oom.change.as_str() {
                "appeared" | "still" => Some(Tone::Bad),
                "disappeared" => Some(Tone::Good),
                _ => None,
            },
        ),
    ]);
    let phase = |p: &Option<String>| p.as_deref().map_or_else(|| "-".to_owned(), safe::name);
    if d.peak_phase.base.is_some() || d.peak_phase.new.is_some() {
        rows.push(vec![
            Cell::from("phase at the peak"),
            Cell::from(phase(&d.peak_phase.base)),
            Cell::from(phase(&d.peak_phase.new)),
            Cell::from(if d.peak_phase.base == d.peak_phase.new {
                "same"
            } else {
                "changed"
            }),
        ]);
    }
    out.push(Block::Table {
        title: None,
        columns: vec![left(""), right("base"), right("new"), right("change")],
        rows,
    });

    let grew: Vec<&KeyDelta> = d
        .call_sites_at_peak
        .iter()
        .filter(|k| k.delta_bytes > 0)
        .collect();
    let shrank: Vec<&KeyDelta> = d
        .call_sites_at_peak
        .iter()
        .rev()
        .filter(|k| k.delta_bytes < 0)
        .collect();
    let n = view.top;
    out.push(key_table(
        format!(
            "Call sites new or grown at the peak ({} of {})",
            grew.len().min(n),
            grew.len()
        ),
        "call site",
        &grew[..grew.len().min(n)],
        true,
    ));
    out.push(key_table(
        format!(
            "Call sites shrunk or gone at the peak ({} of {})",
            shrank.len().min(n),
            shrank.len()
        ),
        "call site",
        &shrank[..shrank.len().min(n)],
        true,
    ));
    if !d.phases_at_peak.is_empty() {
        let rows: Vec<&KeyDelta> = d.phases_at_peak.iter().collect();
        out.push(key_table(
            "Alive at the peak by the phase that allocated it".to_owned(),
            "phase",
            &rows,
            false,
        ));
    }
    if !d.categories_at_peak.is_empty() {
        let rows: Vec<&KeyDelta> = d.categories_at_peak.iter().collect();
        out.push(key_table(
            "Alive at the peak by category".to_owned(),
            "category",
            &rows,
            false,
        ));
    }
    out
}

fn all_blocks(r: &DiffReport, view: &DiffView, markdown: bool) -> Vec<Block> {
    // The title names the device whose peak changed most.
    let main = r
        .devices
        .iter()
        .max_by_key(|d| (d.peak.delta.unsigned_abs(), std::cmp::Reverse(d.device)));
    let several = r.devices.len() > 1;
    let title = match main {
        Some(d) if d.peak.delta != 0 => format!(
            "snapscan diff: peak {}{}",
            change(&d.peak),
            if several {
                format!(" on device {}", d.device)
            } else {
                String::new()
            }
        ),
        Some(_) => "snapscan diff: peak unchanged".to_owned(),
        None => "snapscan diff: no device in either run".to_owned(),
    };
    let mut out = vec![Block::Title(
        title,
        Some(match main.map(|d| d.peak.delta) {
            Some(x) if x > 0 => Tone::Bad,
            Some(x) if x < 0 => Tone::Good,
            _ => Tone::Strong,
        }),
    )];
    out.push(Block::Para(
        if markdown {
            format!("{} → {}", safe::name(&r.base), safe::name(&r.new))
        } else {
            format!(
                "base: {}\nnew:  {}",
                safe::name(&r.base),
                safe::name(&r.new)
            )
        },
        None,
    ));
    for d in &r.devices {
        let (line, tone) = headline(d);
        out.push(Block::Para(line, tone));
        if let Some((line, tone)) = oom_line(d) {
            out.push(Block::Para(line, Some(tone)));
        }
    }
    if let Some(limit) = r.fail_on_growth {
        let growth = r.peak_growth.map(percent).unwrap_or_else(|| "-".into());
        let over: Vec<String> = r
            .devices
            .iter()
            .filter(|d| d.peak.delta > 0 && d.peak.ratio.is_none_or(|x| x > limit))
            .map(|d| match d.peak.ratio {
                Some(x) => format!("device {} {}", d.device, percent(x)),
                None => format!("device {} from nothing to {}", d.device, bytes(d.peak.new)),
            })
            .collect();
        out.push(if r.failed {
            Block::Para(
                format!(
                    "FAILED: the peak grew by more than {} (--fail-on-growth): {}.",
                    percent(limit).trim_start_matches('+'),
                    over.join(", ")
                ),
                Some(Tone::Bad),
            )
        } else {
            Block::Para(
                format!(
                    "Within --fail-on-growth {} (largest peak change {growth}).",
                    percent(limit).trim_start_matches('+')
                ),
                Some(Tone::Good),
            )
        });
    }
    for d in &r.devices {
        out.extend(device_blocks(d, view, several));
    }
    out
}

/// Terminal text; colour only when `color`.
pub fn text(r: &DiffReport, view: &DiffView, color: bool) -> String {
    blocks::text(&all_blocks(r, view, false), color)
}

/// Markdown for a PR comment.
pub fn markdown(r: &DiffReport, view: &DiffView) -> String {
    blocks::markdown(&all_blocks(r, view, true))
}
