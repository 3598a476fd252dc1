//! `snapscan replay` as text and Markdown: how well the allocator model follows the real
//! allocator, where it parted, and why each request that did not fit failed.

use super::blocks::{self, code, left, right, Block, Cell};
use super::safe;
use super::style::Tone;
use crate::analysis::allocator_replay::summary;
use crate::report::replay::{ReplayDevice, ReplayOutput, WhyOut};
use crate::units::{counted, format_bytes};

fn pct(n: u64, of: u64) -> String {
    if of == 0 {
        "-".to_owned()
    } else {
        format!("{:.3}%", 100.0 * n as f64 / of as f64)
    }
}

fn addr(a: Option<u64>) -> String {
    a.map_or("none".to_owned(), |a| format!("{a:#x}"))
}

fn why_blocks(out: &mut Vec<Block>, w: &WhyOut, oom: bool) {
    out.push(Block::Para(
        format!("Why: {}.", summary(w, oom, &|c| safe::name(c))),
        None,
    ));
    if !w.pinners.is_empty() {
        out.push(Block::Table {
            title: Some(format!(
                "Pinning blocks in segment {} (freeing them makes a hole of {})",
                addr(w.pinned_segment),
                format_bytes(w.hole_if_freed_bytes)
            )),
            columns: vec![
                right("address"),
                right("size"),
                right("born"),
                right("age"),
                code("call site"),
            ],
            rows: w
                .pinners
                .iter()
                .map(|p| {
                    vec![
                        Cell::from(format!("{:#x}", p.address)),
                        Cell::from(format_bytes(p.size)),
                        Cell::from(
                            p.birth_event
                                .map_or("before window".to_owned(), |b| format!("event {b}")),
                        ),
                        Cell::from(match (p.age_s, p.age_events) {
                            (Some(s), _) => format!("{s:.3} s"),
                            (None, Some(e)) => counted(e, "event", "events"),
                            _ => "-".to_owned(),
                        }),
                        Cell::from(
                            p.call_site
                                .clone()
                                .unwrap_or_else(|| "(no stack)".to_owned()),
                        ),
                    ]
                })
                .collect(),
        });
    }
}

fn device_blocks(out: &mut Vec<Block>, path: &str, d: &ReplayDevice) {
    out.push(Block::Heading(format!(
        "{} — device {} (allocator replay, {})",
        safe::name(path),
        d.device,
        counted(d.events, "event", "events")
    )));
    let tone = match d.placed_ratio {
        Some(r) if r >= 0.999 => Some(Tone::Good),
        Some(_) => Some(Tone::Bad),
        None => None,
    };
    out.push(Block::Para(
        format!(
            "Placed {} of {} at the address the real allocator chose ({}).",
            d.placed,
            counted(d.allocs, "alloc", "allocs"),
            pct(d.placed, d.allocs)
        ),
        tone,
    ));
    let seg = |name: &str, p: &crate::report::replay::Predicted, how: &str| {
        format!("{name}: {} of {} {how}", p.predicted, p.real)
    };
    let mut lines = Vec::new();
    if d.segment_allocs.real > 0 || d.unexpected_mallocs > 0 {
        lines.push(seg(
            "cudaMalloc (segment_alloc)",
            &d.segment_allocs,
            "predicted at their event with their size",
        ));
    }
    if d.segment_frees.real > 0 {
        lines.push(seg(
            "cudaFree (segment_free)",
            &d.segment_frees,
            "on a segment the model also held entirely free",
        ));
    }
    if d.segment_maps.real > 0 {
        lines.push(seg(
            "segment_map",
            &d.segment_maps,
            "predicted at their event",
        ));
    }
    if d.segment_unmaps.real > 0 {
        lines.push(seg(
            "segment_unmap",
            &d.segment_unmaps,
            "of a range the model also held free",
        ));
    }
    if d.unexpected_mallocs > 0 {
        lines.push(format!(
            "{} where the model needed a new segment and the real allocator used a cached block",
            counted(d.unexpected_mallocs, "request", "requests")
        ));
    }
    for l in lines {
        out.push(Block::Para(l, None));
    }
    let s = &d.start;
    let mut start = format!(
        "Window start (the dump with the trace undone): {} ({} reserved), {} alive then ({} of them \
         alive at the dump, {} waiting for their free).",
        counted(s.segments, "segment", "segments"),
        format_bytes(s.reserved_bytes),
        counted(s.live_blocks, "block", "blocks"),
        s.live_from_dump,
        s.pending_blocks
    );
    if s.uncertain_blocks > 0 {
        start.push_str(&format!(
            " {} of them are oversize and never split: their sizes are not in the trace (together \
             {} to {}).",
            counted(s.uncertain_blocks, "block", "blocks"),
            format_bytes(s.uncertain_min_bytes),
            format_bytes(s.uncertain_max_bytes)
        ));
    }
    out.push(Block::Para(start, None));
    for p in &s.problems {
        out.push(Block::Para(
            format!(
                "Start state: {} ({}): {}",
                p.kind,
                p.count,
                safe::name(&p.first)
            ),
            None,
        ));
    }
    let e = &d.end;
    out.push(Block::Para(
        match &e.first_mismatch {
            None => format!(
                "End state: all {} blocks of the dump's {} agree with the model (address, size, state).",
                e.dump_blocks,
                counted(e.dump_segments, "segment", "segments")
            ),
            Some(m) => format!(
                "End state: {} of {} blocks and {} of {} segments of the dump agree with the model; first \
                 difference: {}.",
                e.matching_blocks, e.dump_blocks, e.matching_segments, e.dump_segments, m
            ),
        },
        None,
    ));
    match &d.first_divergence {
        None => out.push(Block::Para("No divergence.".to_owned(), Some(Tone::Good))),
        Some(v) => {
            out.push(Block::Para(
                format!(
                    "First divergence ({} in all): event {}, {} of {} (rounded {}) on stream {:#x}: \
                     model {}, real {}; rule {}: {}.",
                    d.divergence_count,
                    v.event,
                    v.kind,
                    format_bytes(v.requested_bytes),
                    format_bytes(v.rounded_bytes),
                    v.stream,
                    addr(v.model_address),
                    addr(v.real_address),
                    v.rule,
                    v.detail
                ),
                None,
            ));
            if d.divergences.len() > 1 {
                out.push(Block::Table {
                    title: Some(format!(
                        "Divergences (first {} of {})",
                        d.divergences.len(),
                        d.divergence_count
                    )),
                    columns: vec![
                        right("event"),
                        left("kind"),
                        right("request"),
                        right("model"),
                        right("real"),
                        left("rule"),
                    ],
                    rows: d
                        .divergences
                        .iter()
                        .map(|v| {
                            vec![
                                Cell::from(v.event.to_string()),
                                Cell::from(v.kind.clone()),
                                Cell::from(format_bytes(v.rounded_bytes)),
                                Cell::from(addr(v.model_address)),
                                Cell::from(addr(v.real_address)),
                                Cell::from(v.rule.clone()),
                            ]
                        })
                        .collect(),
                });
            }
        }
    }
    for o in &d.ooms {
        out.push(Block::Para(
            format!(
                "OOM at event {}: {} on stream {:#x}{}. {}",
                o.event,
                format_bytes(o.request_bytes),
                o.stream,
                match (o.device_free, o.exceeds_device_free) {
                    (Some(f), Some(true)) => format!(
                        "; its cudaMalloc of {} exceeded the device's free {}",
                        format_bytes(o.segment_bytes),
                        format_bytes(f)
                    ),
                    (Some(f), _) => format!(
                        "; its cudaMalloc of {} was within the device's free {}, so a limit \
                         refused it (a per-process memory fraction, or {} already reserved \
                         against another cap)",
                        format_bytes(o.segment_bytes),
                        format_bytes(f),
                        format_bytes(o.why.reserved_bytes)
                    ),
                    _ => String::new(),
                },
                if o.reproduced {
                    "Reproduced: the model finds no cached block that fits."
                } else {
                    "Not reproduced: the model holds a cached block that fits (see the divergences)."
                }
            ),
            Some(Tone::Bad),
        ));
        why_blocks(out, &o.why, true);
    }
    if d.oom_count > d.ooms.len() as u64 {
        out.push(Block::Para(
            format!(
                "{} more OOMs not detailed.",
                d.oom_count - d.ooms.len() as u64
            ),
            None,
        ));
    }
    if d.fragmentation_malloc_count > 0 {
        out.push(Block::Para(
            format!(
                "{} made while the request's pool held at least the request in free bytes \
                 (fragmentation); the first:",
                counted(
                    d.fragmentation_malloc_count,
                    "cudaMalloc was",
                    "cudaMallocs were"
                )
            ),
            None,
        ));
        if let Some(u) = d.fragmentation_mallocs.first() {
            out.push(Block::Para(
                format!(
                    "Event {}: new segment of {}.",
                    u.event,
                    format_bytes(u.segment_bytes)
                ),
                None,
            ));
            why_blocks(out, &u.why, false);
        }
    }
    out.push(Block::Para(
        format!(
            "Settings ({}): {}.",
            d.settings.source,
            safe::name(&d.settings.conf)
        ),
        None,
    ));
    let exercised: Vec<String> = d
        .rules
        .exercised
        .iter()
        .map(|r| format!("{} ({})", r.rule, r.count))
        .collect();
    out.push(Block::Para(
        format!(
            "Rules exercised by this trace: {}. Not exercised (not checked by it): {}.",
            if exercised.is_empty() {
                "none".to_owned()
            } else {
                exercised.join(", ")
            },
            if d.rules.not_exercised.is_empty() {
                "none".to_owned()
            } else {
                d.rules.not_exercised.join(", ")
            }
        ),
        None,
    ));
    for n in &d.notes {
        out.push(Block::Para(format!("Note: {n}"), None));
    }
}

fn document(r: &ReplayOutput) -> Vec<Block> {
    let mut out = Vec::new();
    for f in &r.files {
        if f.devices.is_empty() {
            out.push(Block::Heading(safe::name(&f.path)));
            out.push(Block::Para(
                "No device has a trace: there is nothing to replay (record one with \
                 torch.cuda.memory._record_memory_history())."
                    .to_owned(),
                None,
            ));
        }
        for d in &f.devices {
            device_blocks(&mut out, &f.path, d);
        }
    }
    out
}

pub fn text(r: &ReplayOutput, color: bool) -> String {
    blocks::text(&document(r), color)
}

pub fn markdown(r: &ReplayOutput) -> String {
    blocks::markdown(&document(r))
}
