//! `snapscan whatif` as text and Markdown: the real run and the what-if side by side.

use super::blocks::{self, left, Block, Cell};
use super::safe;
use super::style::Tone;
use crate::report::whatif::{Scenario, WhatifDevice, WhatifOutput};
use crate::units::{counted, format_bytes, format_bytes_signed};

fn peak(p: &crate::report::whatif::PeakOut) -> String {
    match p.event {
        Some(e) => format!("{} (event {e}, {})", format_bytes(p.bytes), p.phase),
        None => format!("{} (at the window start)", format_bytes(p.bytes)),
    }
}

fn verdict(s: &Scenario) -> String {
    match s.first_oom_event {
        None => "fits".to_owned(),
        Some(e) => format!("out of memory at event {e}"),
    }
}

fn device_blocks(out: &mut Vec<Block>, path: &str, d: &WhatifDevice) {
    out.push(Block::Heading(format!(
        "{} — device {} (what if: {})",
        safe::name(path),
        d.device,
        d.changes.join("; ")
    )));
    let cap = |s: &Scenario| s.capacity_bytes.map_or("no limit".to_owned(), format_bytes);
    out.push(Block::Table {
        title: None,
        columns: vec![left(""), left("real run"), left("what if")],
        rows: vec![
            vec![
                Cell::from("settings"),
                Cell::from(safe::name(&d.real.settings.conf)),
                Cell::from(safe::name(&d.whatif.settings.conf)),
            ],
            vec![
                Cell::from("capacity"),
                Cell::from(cap(&d.real)),
                Cell::from(cap(&d.whatif)),
            ],
            vec![
                Cell::from("peak allocated"),
                Cell::from(peak(&d.real.peak_allocated)),
                Cell::from(peak(&d.whatif.peak_allocated)),
            ],
            vec![
                Cell::from("peak reserved"),
                Cell::from(peak(&d.real.peak_reserved)),
                Cell::from(peak(&d.whatif.peak_reserved)),
            ],
            vec![
                Cell::from("outcome"),
                Cell::from(verdict(&d.real)),
                Cell::toned(
                    verdict(&d.whatif),
                    Some(if d.whatif.first_oom_event.is_none() {
                        Tone::Good
                    } else {
                        Tone::Bad
                    }),
                ),
            ],
        ],
    });
    let real_ooms: Vec<_> = d.whatif.ooms.iter().filter(|o| o.real).collect();
    for o in &real_ooms {
        out.push(Block::Para(
            if o.fits {
                format!(
                    "The real OOM at event {} ({}) fits: {} to spare.",
                    o.event,
                    format_bytes(o.request_bytes),
                    format_bytes_signed(i128::from(o.margin_bytes))
                )
            } else {
                format!(
                    "The real OOM at event {} ({}) still fails: {} short.",
                    o.event,
                    format_bytes(o.request_bytes),
                    format_bytes_signed(-i128::from(o.margin_bytes))
                )
            },
            Some(if o.fits { Tone::Good } else { Tone::Bad }),
        ));
    }
    let new: Vec<_> = d.whatif.ooms.iter().filter(|o| !o.real).collect();
    if !new.is_empty() {
        out.push(Block::Para(
            format!(
                "The change causes {} where the real run fitted; the first at event {} ({}, {} short).",
                counted(new.len() as u64, "new OOM", "new OOMs"),
                new[0].event,
                format_bytes(new[0].request_bytes),
                format_bytes_signed(-i128::from(new[0].margin_bytes))
            ),
            Some(Tone::Bad),
        ));
    }
    if let Some(s) = &d.search {
        out.push(Block::Para(
            match (s.what.as_str(), s.value) {
                ("batch", Some(f)) => format!(
                    "Search: the run fits up to batch × {f} ({} replays).",
                    s.replays
                ),
                ("batch", None) => format!(
                    "Search: no batch factor down to 0 fits ({} replays): the memory that stays \
                     (weights, gradients, optimizer state) is already too much.",
                    s.replays
                ),
                (_, Some(c)) => format!(
                    "Search: the run fits in {} ({} replays).",
                    format_bytes(c as u64),
                    s.replays
                ),
                _ => "Search: nothing found.".to_owned(),
            },
            Some(Tone::Strong),
        ));
    }
    let id = &d.identity;
    out.push(Block::Para(
        format!(
            "Identity check (the model with no change against the real run): {} of {} segment \
             changes at their event with their size, {} of {} real OOMs reproduced{}.",
            id.segment_changes_matched,
            id.segment_changes_real,
            id.ooms_reproduced,
            id.ooms_real,
            id.first_difference
                .as_deref()
                .map_or(String::new(), |f| format!("; first difference: {f}"))
        ),
        None,
    ));
    for n in &d.notes {
        out.push(Block::Para(format!("Note: {n}"), None));
    }
}

fn document(r: &WhatifOutput) -> Vec<Block> {
    let mut out = Vec::new();
    for f in &r.files {
        if f.devices.is_empty() {
            out.push(Block::Heading(safe::name(&f.path)));
            out.push(Block::Para(
                "No device has a trace: there is nothing to replay.".to_owned(),
                None,
            ));
        }
        for d in &f.devices {
            device_blocks(&mut out, &f.path, d);
        }
    }
    out
}

pub fn text(r: &WhatifOutput, color: bool) -> String {
    blocks::text(&document(r), color)
}

pub fn markdown(r: &WhatifOutput) -> String {
    blocks::markdown(&document(r))
}
