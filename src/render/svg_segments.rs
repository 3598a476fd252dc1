//! `snapscan segments`: the allocator's segments at one moment as a self-contained SVG, like
//! memory_viz's "Allocator State History" (snapshot-format.md §10.5).
//!
//! Every segment is a bar whose length is its size; segments are sorted by size (largest first)
//! and packed left to right into rows as wide as the largest segment (wider when there would be
//! more than [`MAX_ROWS`] rows, or when a failed request is larger). Live blocks are coloured by
//! memory category or call site (pale while pending free), rounding waste (block − requested) is
//! red, free holes are
//! hatched, the largest hole is outlined and labelled, and at an OOM the failed request is drawn
//! to the same scale right under the largest hole that could have served it.
//!
//! Size is bounded: blocks and segments narrower than a threshold are merged into grey runs, the
//! threshold doubling until at most [`SHAPE_BUDGET`] shapes remain per file.

use std::collections::BTreeMap;
use std::fmt::Write;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::svg::{
    self, num, ColourBy, Colours, GREY, GRID, HATCH_ID, INK, LEFT, MUTED, PLOT_W, RED,
};
use crate::analysis::category::{Categorizer, Category};
use crate::analysis::layout::{layout_at, Moment, SegmentLayout};
use crate::analysis::lifetimes::{replay_device, Allocation, DeviceReplay};
use crate::analysis::phase::phases_of;
use crate::snapshot::{Action, BlockState, PoolKind, Snapshot, StackId};
use crate::units::format_bytes;

/// Which moment to draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The first OOM when the trace has one, else the peak.
    Auto,
    /// The peak of requested bytes (incl. the level at window start).
    Peak,
    /// The first OOM entry (an error when there is none).
    Oom,
    /// The dump itself.
    End,
    /// After the trace entry with this index.
    Event(u32),
}

/// Parses `--at`: `peak`, `oom`, `end`, `auto` or an event index.
pub fn parse_at(text: &str) -> Result<At, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(At::Auto),
        "peak" => Ok(At::Peak),
        "oom" => Ok(At::Oom),
        "end" | "dump" => Ok(At::End),
        other => other.parse::<u32>().map(At::Event).map_err(|_| {
            format!("`{text}` is not a moment: use peak, oom, end or a trace event index")
        }),
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SegmentsOptions {
    pub device: Option<i64>,
    pub at: At,
    /// Colour by category or call site; `None`: by category when the trace gives categories.
    pub colour: Option<ColourBy>,
}

impl Default for SegmentsOptions {
    fn default() -> Self {
        SegmentsOptions {
            device: None,
            at: At::Auto,
            colour: None,
        }
    }
}

/// Rows at most; the row width grows beyond the largest segment to keep to it.
pub const MAX_ROWS: u64 = 40;
/// Shapes with a tooltip per file, all devices together.
pub const SHAPE_BUDGET: usize = 2500;
/// Call sites in the legend.
const LEGEND_SITES: usize = 6;
/// Requests up to this size are served from the small pool.
const SMALL_REQUEST_LIMIT: u64 = 1 << 20;

/// Renders the segments of every device (or only `options.device`) at the chosen moment.
pub fn segments(
    name: &str,
    snapshot: &Snapshot,
    options: &SegmentsOptions,
) -> anyhow::Result<Vec<u8>> {
    let mut devices = svg::devices(snapshot, options.device)?;
    if options.at == At::Oom {
        let with_oom: Vec<i64> = devices
            .iter()
            .copied()
            .filter(|&d| snapshot.trace(d).iter().any(|e| e.action == Action::Oom))
            .collect();
        if with_oom.is_empty() {
            anyhow::bail!("--at oom: the trace has no OOM entry (use peak, end or an event index)");
        }
        devices = with_oom;
    }
    if let At::Event(e) = options.at {
        for &d in &devices {
            let n = snapshot.trace(d).len();
            if e as usize >= n {
                anyhow::bail!(
                    "--at {e}: device {d} has {n} trace entries (valid events: 0..{})",
                    n.saturating_sub(1)
                );
            }
        }
    }
    let panels_n = devices.len().max(1);
    let budget = SHAPE_BUDGET / panels_n;
    let panels: Vec<(String, f64)> = devices
        .par_iter()
        .map(|&d| panel(name, snapshot, d, options.at, budget, options.colour))
        .collect();
    let mut body = String::new();
    let mut y = 0.0;
    if panels.is_empty() {
        svg::heading(
            &mut body,
            40.0,
            16,
            name,
            ": no device has segments or trace entries; nothing to draw",
        );
        y = 64.0;
    }
    for (p, h) in &panels {
        let _ = writeln!(body, "<g transform=\"translate(0,{})\">", num(y));
        body.push_str(p);
        body.push_str("</g>\n");
        y += h;
    }
    Ok(svg::document(
        &format!("snapscan segments: {name}"),
        y,
        &body,
    ))
}

/// The moment and how to say it.
fn resolve(snapshot: &Snapshot, replay: &DeviceReplay, at: At) -> (Moment, String, Option<u32>) {
    let trace = snapshot.trace(replay.device);
    let first_oom = trace
        .iter()
        .position(|e| e.action == Action::Oom)
        .map(|i| i as u32);
    let peak = || match replay.requested.peak().1 {
        Some(e) => (
            Moment::After(e),
            format!("At the peak (after event {e})"),
            None,
        ),
        None => (
            Moment::WindowStart,
            "At the peak (window start)".to_owned(),
            None,
        ),
    };
    match at {
        At::Auto => match first_oom {
            Some(e) => (Moment::After(e), format!("At the OOM (event {e})"), Some(e)),
            None => peak(),
        },
        At::Oom => match first_oom {
            Some(e) => (Moment::After(e), format!("At the OOM (event {e})"), Some(e)),
            None => peak(),
        },
        At::Peak => peak(),
        At::End => (Moment::End, "At the end (the dump itself)".to_owned(), None),
        At::Event(e) => {
            let oom = (trace.get(e as usize).map(|t| t.action) == Some(Action::Oom)).then_some(e);
            (Moment::After(e), format!("After event {e}"), oom)
        }
    }
}

/// What is known about a live block: its allocation and/or the dump's stack.
struct BlockInfo<'a> {
    alloc: Option<&'a Allocation>,
    stack: StackId,
}

fn block_infos<'a>(
    snapshot: &'a Snapshot,
    replay: &'a DeviceReplay,
    moment: Moment,
) -> FxHashMap<u64, BlockInfo<'a>> {
    let mut map: FxHashMap<u64, BlockInfo> = FxHashMap::default();
    let live: Vec<&Allocation> = match moment {
        Moment::End => replay
            .allocations
            .iter()
            .filter(|a| a.free_event.is_none())
            .collect(),
        Moment::WindowStart => replay.live_after(None).collect(),
        Moment::After(e) => replay.live_after(Some(e)).collect(),
    };
    for a in live {
        map.insert(
            a.address,
            BlockInfo {
                alloc: Some(a),
                stack: a.stack,
            },
        );
    }
    // The dump's stacks for blocks alive at the end (pending frees the trace never allocated).
    if moment == Moment::End || replay.events == 0 {
        for seg in snapshot.segments_of(replay.device) {
            for b in &seg.blocks {
                if b.state.is_active() {
                    map.entry(b.address).or_insert(BlockInfo {
                        alloc: None,
                        stack: b.frames,
                    });
                }
            }
        }
    }
    map
}

fn pool_text(s: &SegmentLayout) -> String {
    let mut t = match s.pool_kind {
        PoolKind::Small => "small pool".to_owned(),
        PoolKind::Large => "large pool".to_owned(),
        PoolKind::Unknown => "pool of unknown kind".to_owned(),
    };
    if let Some(p) = s.pool_id {
        if p != (0, 0) {
            let _ = write!(t, ", private pool ({},{})", p.0, p.1);
        }
    }
    if s.expandable {
        t.push_str(", expandable");
    }
    t
}

fn segment_tooltip(s: &SegmentLayout) -> Vec<String> {
    vec![
        format!(
            "segment 0x{:x}: {}, {}, stream {}",
            s.address,
            svg::bytes_exact(s.total_bytes),
            pool_text(s),
            s.stream
        ),
        format!(
            "{} allocated in {} ({} requested, {} rounding waste)",
            format_bytes(s.allocated_bytes),
            crate::units::counted(
                s.blocks.iter().filter(|b| b.state.is_active()).count() as u64,
                "block",
                "blocks"
            ),
            format_bytes(s.requested_bytes),
            format_bytes(s.internal_waste_bytes)
        ),
        format!(
            "{} free in {}, largest {}",
            format_bytes(s.free_bytes),
            crate::units::counted(s.holes, "hole", "holes"),
            format_bytes(s.largest_hole_bytes)
        ),
    ]
}

/// A sum that saturates instead of overflowing (hostile files can claim any size).
fn sat_sum(values: impl Iterator<Item = u64>) -> u64 {
    values.fold(0u64, |a, b| a.saturating_add(b))
}

/// Where the failed request and the largest hole are drawn.
struct Focus {
    segment: usize,
    offset: u64,
    size: u64,
    /// `true`: the largest hole that could serve the failed request.
    usable: bool,
}

fn largest_hole(
    layout: &[SegmentLayout],
    filter: impl Fn(&SegmentLayout) -> bool,
) -> Option<Focus> {
    let mut best: Option<Focus> = None;
    for (i, s) in layout.iter().enumerate() {
        if !filter(s) {
            continue;
        }
        // Adjacent free entries form one hole.
        let mut run: Option<(u64, u64)> = None;
        let consider = |run: Option<(u64, u64)>, best: &mut Option<Focus>| {
            if let Some((off, size)) = run {
                if best.as_ref().is_none_or(|b| size > b.size) {
                    *best = Some(Focus {
                        segment: i,
                        offset: off,
                        size,
                        usable: false,
                    });
                }
            }
        };
        for b in &s.blocks {
            if b.state.is_active() {
                consider(run.take(), &mut best);
            } else {
                run = Some(match run {
                    Some((off, size)) => (off, size.saturating_add(b.size)),
                    None => (b.offset, b.size),
                });
            }
        }
        consider(run, &mut best);
    }
    best
}

/// Runs of at least this many alike segments are folded into one row.
pub const FOLD_MIN: usize = 3;

/// A run of alike segments drawn as one: the first is drawn, the label says how many.
struct Fold {
    /// Every segment of the run (the drawn one first).
    members: Vec<usize>,
}

/// Size, pool kind, pool, stream, holes, free bytes in 32ths of the size, colour.
type AlikeKey = (u64, u8, Option<(i64, i64)>, u64, u64, u64, String);

/// What makes segments alike in the picture: the same size, pool, stream and number of holes,
/// free bytes within 1/32 of the size, and the same colour for their largest live block.
fn alike_key(s: &SegmentLayout, infos: &FxHashMap<u64, BlockInfo>, colours: &Colours) -> AlikeKey {
    let kind = match s.pool_kind {
        PoolKind::Small => 0,
        PoolKind::Large => 1,
        PoolKind::Unknown => 2,
    };
    let largest = s
        .blocks
        .iter()
        .filter(|b| b.state.is_active())
        .max_by_key(|b| (b.size, std::cmp::Reverse(b.offset)));
    let colour = largest.map_or(String::new(), |b| {
        let address = s.address.saturating_add(b.offset);
        match infos.get(&address) {
            Some(BlockInfo { alloc: Some(a), .. }) => colours.colour_for(a).to_string(),
            Some(BlockInfo { stack, .. }) => colours.colour_for_stack(*stack, address).to_string(),
            None => colours
                .colour_for_stack(StackId::EMPTY, address)
                .to_string(),
        }
    });
    let free_32ths = s.free_bytes.saturating_mul(32) / s.total_bytes.max(1);
    (
        s.total_bytes,
        kind,
        s.pool_id,
        s.stream,
        s.holes,
        free_32ths,
        colour,
    )
}

/// Orders the segments largest first, alike ones next to each other, and folds runs of at
/// least [`FOLD_MIN`] alike segments (never the one holding `keep`, the labelled hole). Returns
/// the segments to draw, in order, and the fold of each drawn segment that stands for a run.
fn fold_alike(
    layout: &[SegmentLayout],
    infos: &FxHashMap<u64, BlockInfo>,
    colours: &Colours,
    keep: Option<usize>,
) -> (Vec<usize>, Vec<Option<Fold>>) {
    let keys: Vec<_> = layout
        .iter()
        .map(|s| alike_key(s, infos, colours))
        .collect();
    let mut order: Vec<usize> = (0..layout.len()).collect();
    order.sort_by(|&a, &b| {
        keys[b]
            .0
            .cmp(&keys[a].0)
            .then_with(|| keys[a].cmp(&keys[b]))
            .then(layout[a].address.cmp(&layout[b].address))
    });
    let mut drawn = Vec::with_capacity(order.len());
    let mut folds: Vec<Option<Fold>> = (0..layout.len()).map(|_| None).collect();
    let mut j = 0;
    while j < order.len() {
        let mut k = j + 1;
        while k < order.len() && keys[order[k]] == keys[order[j]] {
            k += 1;
        }
        let run: Vec<usize> = order[j..k]
            .iter()
            .copied()
            .filter(|&i| Some(i) != keep)
            .collect();
        if let Some(kept) = keep.filter(|i| order[j..k].contains(i)) {
            drawn.push(kept);
        }
        if run.len() >= FOLD_MIN {
            let first = run[0];
            drawn.push(first);
            folds[first] = Some(Fold { members: run });
        } else {
            drawn.extend(run);
        }
        j = k;
    }
    (drawn, folds)
}

/// The label of a folded run, right of its bar when there is room, else inside it at the
/// right end on a pale background. Returns the shapes with a tooltip (1).
fn fold_label(
    out: &mut String,
    layout: &[SegmentLayout],
    fold: &Fold,
    bar_end: f64,
    y: f64,
    h: f64,
) -> usize {
    let first = &layout[fold.members[0]];
    let n = fold.members.len() as u64;
    let sum = |f: fn(&SegmentLayout) -> u64| sat_sum(fold.members.iter().map(|&i| f(&layout[i])));
    let label = format!(
        "× {n} alike: {} each, {} in all ({} allocated, {} free)",
        format_bytes(first.total_bytes),
        format_bytes(sum(|s| s.total_bytes)),
        format_bytes(sum(|s| s.allocated_bytes)),
        format_bytes(sum(|s| s.free_bytes)),
    );
    let right = LEFT + PLOT_W;
    // The text is set to this width (`textLength`), so the box always holds it.
    let width = label.chars().count() as f64 * 12.0 * 0.58;
    let inside = bar_end + 8.0 + width > right;
    let (tx, anchor) = if inside {
        (right - 6.0, "end")
    } else {
        (bar_end + 8.0, "start")
    };
    let box_x = if inside { tx - width - 5.0 } else { tx - 5.0 };
    let _ = write!(
        out,
        "<g><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"{MUTED}\" stroke-width=\"0.5\" rx=\"3\">",
        num(box_x.max(LEFT)),
        num(y + 2.0),
        num((width + 10.0).min(right - box_x.max(LEFT))),
        num((h - 4.0).max(4.0)),
    );
    let mut tip = vec![format!(
        "{n} segments alike in size, pool, stream, holes, free bytes and colour: one is drawn"
    )];
    let addresses: Vec<String> = fold
        .members
        .iter()
        .take(12)
        .map(|&i| format!("0x{:x}", layout[i].address))
        .collect();
    tip.push(format!(
        "at {}{}",
        addresses.join(", "),
        if fold.members.len() > 12 { ", …" } else { "" }
    ));
    out.push_str(&svg::title(&tip));
    out.push_str("</rect>\n");
    svg::text(
        out,
        tx,
        y + h / 2.0 + 4.0,
        12,
        &format!(
            "text-anchor=\"{anchor}\" font-weight=\"bold\" textLength=\"{}\" lengthAdjust=\"spacing\"",
            num(width)
        ),
        &label,
    );
    out.push_str("</g>\n");
    1
}

struct Geometry {
    scale: f64,
    row_of: Vec<usize>,
    x_of: Vec<f64>,
    rows: usize,
    capacity: u64,
}

/// Lays the segments of `order` out in rows; a folded run's segment (`alone`) takes a row of its
/// own, with room for its label. Rows end on a gridline: the width is rounded up to the ticks.
fn pack(layout: &[SegmentLayout], order: &[usize], min_capacity: u64, alone: &[bool]) -> Geometry {
    let largest = order.first().map_or(0, |&i| layout[i].total_bytes);
    let total = sat_sum(order.iter().map(|&i| layout[i].total_bytes));
    let capacity = largest
        .max(total.div_ceil(MAX_ROWS))
        .max(min_capacity)
        .max(1);
    let capacity = svg::byte_ticks(capacity).1.max(capacity);
    let scale = PLOT_W / capacity as f64;
    let mut row_of = vec![0; layout.len()];
    let mut x_of = vec![0.0; layout.len()];
    let mut row = 0usize;
    let mut fill: u64 = 0;
    for (j, &i) in order.iter().enumerate() {
        let size = layout[i].total_bytes;
        if j > 0 && (fill.saturating_add(size) > capacity || (alone[i] && fill > 0)) {
            row += 1;
            fill = 0;
        }
        row_of[i] = row;
        x_of[i] = LEFT + fill as f64 * scale;
        fill = fill.saturating_add(size);
        if alone[i] {
            fill = capacity;
        }
    }
    Geometry {
        scale,
        row_of,
        x_of,
        rows: if order.is_empty() { 0 } else { row + 1 },
        capacity,
    }
}

struct Rows {
    height: f64,
    top: Vec<f64>,
}

fn rows_geometry(rows: usize, top: f64, extra_after: Option<(usize, f64)>) -> Rows {
    let height = if rows <= 12 {
        30.0
    } else {
        (420.0 / rows as f64).floor().max(14.0)
    };
    let gap = 8.0;
    let mut y = top;
    let mut tops = Vec::with_capacity(rows);
    for r in 0..rows {
        tops.push(y);
        y += height + gap;
        if let Some((row, extra)) = extra_after {
            if row == r {
                y += extra;
            }
        }
    }
    Rows { height, top: tops }
}

/// Draws the segments; returns the number of shapes with a tooltip.
#[allow(clippy::too_many_arguments)]
fn draw_segments(
    out: &mut String,
    snapshot: &Snapshot,
    layout: &[SegmentLayout],
    order: &[usize],
    geo: &Geometry,
    rows: &Rows,
    infos: &FxHashMap<u64, BlockInfo>,
    colours: &Colours,
    threshold: f64,
    folds: &[Option<Fold>],
) -> usize {
    let mut shapes = 0;
    let h = rows.height;
    // Runs of tiny segments are merged per row.
    let mut run: Option<(usize, f64, f64, u64, u64, u64, usize)> = None; // row, x0, x1, reserved, allocated, largest, count
    let flush = |out: &mut String,
                 run: &mut Option<(usize, f64, f64, u64, u64, u64, usize)>,
                 shapes: &mut usize| {
        if let Some((row, x0, x1, reserved, allocated, largest, count)) = run.take() {
            let _ = write!(
                out,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{GREY}\" stroke=\"{MUTED}\" stroke-width=\"0.5\">",
                num(x0),
                num(rows.top[row]),
                num((x1 - x0).max(0.5)),
                num(h)
            );
            out.push_str(&svg::title(&[
                format!(
                    "{count} small segments (each ≤ {}), drawn merged",
                    format_bytes(largest)
                ),
                format!(
                    "{} reserved, {} allocated, {} free",
                    format_bytes(reserved),
                    format_bytes(allocated),
                    format_bytes(reserved.saturating_sub(allocated))
                ),
            ]));
            out.push_str("</rect>\n");
            *shapes += 1;
        }
    };
    for &i in order {
        let s = &layout[i];
        let row = geo.row_of[i];
        let x0 = geo.x_of[i];
        let w = s.total_bytes as f64 * geo.scale;
        let y = rows.top[row];
        if w < threshold * 2.0 && folds[i].is_none() {
            match &mut run {
                Some(r) if r.0 == row => {
                    r.2 = x0 + w;
                    r.3 = r.3.saturating_add(s.total_bytes);
                    r.4 = r.4.saturating_add(s.allocated_bytes);
                    r.5 = r.5.max(s.total_bytes);
                    r.6 += 1;
                }
                _ => {
                    flush(out, &mut run, &mut shapes);
                    run = Some((
                        row,
                        x0,
                        x0 + w,
                        s.total_bytes,
                        s.allocated_bytes,
                        s.total_bytes,
                        1,
                    ));
                }
            }
            continue;
        }
        flush(out, &mut run, &mut shapes);
        // The segment: hatched (free) background with its tooltip.
        let _ = write!(
            out,
            "<g><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#{HATCH_ID})\" stroke=\"{MUTED}\" stroke-width=\"0.8\">",
            num(x0),
            num(y),
            num(w),
            num(h)
        );
        out.push_str(&svg::title(&segment_tooltip(s)));
        out.push_str("</rect>\n");
        shapes += 1;
        // Blocks; small consecutive ones merged into one grey run.
        let mut small: Option<(f64, f64, u64, usize)> = None; // x0, x1, bytes, count
        let flush_small =
            |out: &mut String, small: &mut Option<(f64, f64, u64, usize)>, shapes: &mut usize| {
                if let Some((bx0, bx1, bytes, count)) = small.take() {
                    let _ = write!(
                        out,
                        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{GREY}\">",
                        num(bx0),
                        num(y + 1.0),
                        num((bx1 - bx0).max(0.3)),
                        num(h - 2.0)
                    );
                    out.push_str(&svg::title(&[format!(
                        "{count} small blocks, {} in total, drawn merged",
                        format_bytes(bytes)
                    )]));
                    out.push_str("</rect>\n");
                    *shapes += 1;
                }
            };
        for b in &s.blocks {
            let bx = x0 + b.offset as f64 * geo.scale;
            let bw = b.size as f64 * geo.scale;
            if !b.state.is_active() {
                flush_small(out, &mut small, &mut shapes);
                continue;
            }
            if bw < threshold {
                match &mut small {
                    Some(r) => {
                        r.1 = bx + bw;
                        r.2 = r.2.saturating_add(b.size);
                        r.3 += 1;
                    }
                    None => small = Some((bx, bx + bw, b.size, 1)),
                }
                continue;
            }
            flush_small(out, &mut small, &mut shapes);
            let address = s.address.saturating_add(b.offset);
            let info = infos.get(&address);
            let colour = match info {
                Some(BlockInfo { alloc: Some(a), .. }) => colours.colour_for(a),
                Some(BlockInfo { stack, .. }) => colours.colour_for_stack(*stack, address),
                None => colours.colour_for_stack(StackId::EMPTY, address),
            };
            let waste = b.size.saturating_sub(b.requested);
            let mut waste_w = waste as f64 * geo.scale;
            // Waste of at least 5% of a visible block is marked even when under a pixel.
            if waste.saturating_mul(20) >= b.size && bw >= 4.0 {
                waste_w = waste_w.max(1.0);
            }
            let req_w = (bw - waste_w).max(0.0);
            let pending = b.state == BlockState::ActivePendingFree;
            let _ = write!(
                out,
                "<g><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{colour}\"{}/>",
                num(bx),
                num(y + 1.0),
                num(req_w.max(0.3)),
                num(h - 2.0),
                if pending { " fill-opacity=\"0.4\"" } else { "" }
            );
            if waste_w >= 0.3 {
                let _ = write!(
                    out,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{RED}\"/>",
                    num(bx + req_w),
                    num(y + 1.0),
                    num(waste_w),
                    num(h - 2.0)
                );
            }
            let mut tip = vec![
                format!(
                    "{} requested, block {}{}",
                    svg::bytes_exact(b.requested),
                    format_bytes(b.size),
                    if waste > 0 {
                        format!(" ({} rounding waste)", format_bytes(waste))
                    } else {
                        String::new()
                    }
                ),
                format!(
                    "address 0x{address:x}, {}",
                    if pending {
                        "pending free (freed, waiting for its stream's work to finish)"
                    } else {
                        "allocated"
                    }
                ),
            ];
            if let Some(BlockInfo { alloc: Some(a), .. }) = info {
                tip.push(svg::category_line(colours.category(a)));
                tip.push(match a.alloc_event {
                    Some(e) => format!("born at event {e}"),
                    None => "born before the trace window".to_owned(),
                });
                tip.push(match a.free_event {
                    Some(e) => format!("freed at event {e}"),
                    None => "alive at the end of the trace".to_owned(),
                });
            }
            let stack = info.map_or(StackId::EMPTY, |i| i.stack);
            let fallback = match info {
                Some(BlockInfo { alloc: Some(a), .. }) => a.origin.label(),
                _ => "<no stack recorded>",
            };
            tip.extend(svg::stack_tooltip(&snapshot.interner, stack, fallback));
            out.push_str(&svg::title(&tip));
            out.push_str("</g>\n");
            shapes += 1;
        }
        flush_small(out, &mut small, &mut shapes);
        out.push_str("</g>\n");
        // Over the bar when it has to go inside it.
        if let Some(fold) = &folds[i] {
            shapes += fold_label(out, layout, fold, x0 + w, y, h);
        }
    }
    flush(out, &mut run, &mut shapes);
    shapes
}

fn panel(
    name: &str,
    snapshot: &Snapshot,
    device: i64,
    at: At,
    budget: usize,
    colour: Option<ColourBy>,
) -> (String, f64) {
    let replay = replay_device(snapshot, device);
    let trace = snapshot.trace(device);
    let phases = phases_of(snapshot, device, &replay);
    let categorizer = Categorizer::new(snapshot, &phases, &replay);
    let by = svg::choose_colour_by(
        colour,
        replay
            .allocations
            .iter()
            .map(|a| categorizer.categorize(a).0),
    );
    let by_category = by == ColourBy::Category;
    let mut colours = Colours::with_categories(&snapshot.interner, categorizer, by);
    let (moment, moment_text, oom_event) = resolve(snapshot, &replay, at);
    // The allocator model's exact layout where the trace can be replayed; the estimate (block
    // sizes from the request) where it cannot.
    let layout = crate::analysis::layout::model_layout(snapshot, device, moment)
        .unwrap_or_else(|| layout_at(snapshot, &replay, moment));
    let infos = block_infos(snapshot, &replay, moment);
    // Call sites and categories by live bytes; the legend's sites get distinct colours.
    let mut by_site: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_category_bytes = [0u64; Category::ALL.len()];
    let mut category_present = [false; Category::ALL.len()];
    for s in &layout {
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            let address = s.address.saturating_add(b.offset);
            let category = match infos.get(&address) {
                Some(BlockInfo { alloc: Some(a), .. }) => colours.category(a).0,
                _ => Category::Unknown,
            };
            let k = svg::category_index(category);
            category_present[k] = true;
            by_category_bytes[k] = by_category_bytes[k].saturating_add(b.requested);
            let site = match infos.get(&address) {
                Some(BlockInfo { alloc: Some(a), .. }) => colours.site(a),
                Some(BlockInfo { stack, .. }) => {
                    crate::analysis::callsite::call_site(&snapshot.interner, *stack)
                }
                None => None,
            };
            let key = site.unwrap_or_else(|| svg::NO_STACK.to_owned());
            let g = by_site.entry(key).or_insert(0);
            *g = g.saturating_add(b.requested);
        }
    }
    let mut sites: Vec<(String, u64)> = by_site.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let legend_sites: Vec<String> = sites
        .iter()
        .take(LEGEND_SITES)
        .map(|s| s.0.clone())
        .filter(|s| s != svg::NO_STACK)
        .collect();
    colours.assign_distinct(&legend_sites);

    let oom = oom_event.and_then(|e| trace.get(e as usize));
    let request = oom.map_or(0, |e| e.size);
    let focus = match oom {
        Some(e) => {
            let wanted = if e.size <= SMALL_REQUEST_LIMIT {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            largest_hole(&layout, |s| {
                s.stream == e.stream
                    && !matches!(s.pool_id, Some(p) if p != (0, 0))
                    && (s.pool_kind == wanted || s.pool_kind == PoolKind::Unknown)
            })
            .map(|f| Focus { usable: true, ..f })
            .or_else(|| largest_hole(&layout, |_| true))
        }
        None => largest_hole(&layout, |_| true),
    };

    let reserved = sat_sum(layout.iter().map(|s| s.total_bytes));
    let allocated = sat_sum(layout.iter().map(|s| s.allocated_bytes));
    let requested = sat_sum(layout.iter().map(|s| s.requested_bytes));
    let free = sat_sum(layout.iter().map(|s| s.free_bytes));
    let holes = sat_sum(layout.iter().map(|s| s.holes));
    let waste = sat_sum(layout.iter().map(|s| s.internal_waste_bytes));

    let (order, folds) = fold_alike(&layout, &infos, &colours, focus.as_ref().map(|f| f.segment));
    let alone: Vec<bool> = folds.iter().map(Option::is_some).collect();
    let folded: usize = folds.iter().flatten().map(|f| f.members.len() - 1).sum();
    let geo = pack(&layout, &order, request, &alone);

    let mut out = String::new();
    svg::heading(
        &mut out,
        26.0,
        17,
        name,
        &format!(" — device {device}: segments"),
    );
    svg::text_fit(
        &mut out,
        LEFT,
        48.0,
        13,
        "",
        &format!(
            "{moment_text}: {}, {} reserved; {} in live blocks ({} requested, {} rounding); {} free in {}.",
            crate::units::counted(layout.len() as u64, "segment", "segments"),
            format_bytes(reserved),
            format_bytes(allocated),
            format_bytes(requested),
            format_bytes(waste),
            format_bytes(free),
            crate::units::counted(holes, "hole", "holes")
        ),
    );
    svg::text_fit(
        &mut out,
        LEFT,
        67.0,
        13,
        &format!("fill=\"{MUTED}\""),
        &format!(
            "Each bar is one segment, its length its size: largest first, rows {} wide{}. Hover blocks and segments for details.",
            format_bytes(geo.capacity),
            if folded > 0 {
                format!(
                    "; {} alike segments folded into the row of one like them (× N)",
                    folded
                )
            } else {
                String::new()
            }
        ),
    );
    let mut header = 67.0;
    if let Some(e) = oom {
        let largest_usable = focus.as_ref().filter(|f| f.usable).map_or(0, |f| f.size);
        let unallocated = reserved.saturating_sub(allocated);
        let verdict = if unallocated >= request && largest_usable < request {
            "enough free bytes in total, but no hole big enough: fragmentation"
        } else {
            "not enough free reserved memory: the allocator needed new device memory"
        };
        header += 19.0;
        svg::text_fit(
            &mut out,
            LEFT,
            header,
            13,
            &format!("fill=\"{RED}\" font-weight=\"bold\""),
            &format!(
                "Failed request {} vs largest usable hole {} ({} reserved but unallocated): {verdict}.",
                format_bytes(e.size),
                format_bytes(largest_usable),
                format_bytes(unallocated)
            ),
        );
    }

    // Scale: byte ticks across the row width.
    let axis_y = header + 24.0;
    let (tick, _) = svg::byte_ticks(geo.capacity);
    let mut v = 0u64;
    let right = LEFT + PLOT_W;
    let rows_top = axis_y + 10.0;
    let focus_row = focus.as_ref().map(|f| geo.row_of[f.segment]);
    let extra = if oom.is_some() { 52.0 } else { 22.0 };
    let rows = rows_geometry(geo.rows, rows_top, focus_row.map(|r| (r, extra)));
    let rows_bottom = rows.top.last().map_or(rows_top, |t| {
        t + rows.height
            + 8.0
            + if focus_row.is_some() && focus_row == geo.rows.checked_sub(1) {
                extra
            } else {
                0.0
            }
    });
    while v <= geo.capacity {
        let px = LEFT + v as f64 * geo.scale;
        let _ = writeln!(
            out,
            "<line x1=\"{p}\" y1=\"{}\" x2=\"{p}\" y2=\"{}\" stroke=\"{GRID}\"/>",
            num(axis_y + 3.0),
            num(rows_bottom),
            p = num(px)
        );
        let anchor = if v == 0 {
            "start"
        } else if px > right - 30.0 {
            "end"
        } else {
            "middle"
        };
        svg::text(
            &mut out,
            px,
            axis_y,
            12,
            &format!("text-anchor=\"{anchor}\" fill=\"{MUTED}\""),
            &format_bytes(v),
        );
        v = match v.checked_add(tick) {
            Some(n) => n,
            None => break,
        };
    }
    if layout.is_empty() {
        svg::text(
            &mut out,
            LEFT,
            rows_top + 20.0,
            13,
            "",
            "No segments at this moment.",
        );
    }

    let mut threshold = 0.5;
    let mut body = String::new();
    loop {
        body.clear();
        let n = draw_segments(
            &mut body, snapshot, &layout, &order, &geo, &rows, &infos, &colours, threshold, &folds,
        );
        if n <= budget || threshold > 1e6 {
            break;
        }
        threshold *= 2.0;
    }
    out.push_str(&body);

    // The largest hole, and the failed request under it.
    if let Some(f) = &focus {
        let s = &layout[f.segment];
        let row = geo.row_of[f.segment];
        let hx = geo.x_of[f.segment] + f.offset as f64 * geo.scale;
        let hw = (f.size as f64 * geo.scale).max(1.0);
        let ty = rows.top[row];
        let _ = writeln!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"{INK}\" stroke-width=\"2\"/>",
            num(hx),
            num(ty),
            num(hw),
            num(rows.height)
        );
        let label = format!(
            "{} {} (segment 0x{:x})",
            if f.usable {
                "largest usable hole"
            } else {
                "largest hole"
            },
            format_bytes(f.size),
            s.address
        );
        let ly = ty + rows.height + 18.0;
        let est = svg::text_width(&label, 13, true);
        let lx = hx.min(right - est).max(LEFT);
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{INK}\" stroke-width=\"2\"/>",
            num(hx),
            num(hx + hw),
            y = num(ty + rows.height + 3.0)
        );
        svg::text(&mut out, lx, ly, 13, "font-weight=\"bold\"", &label);
        if let Some(e) = oom {
            let rw = (request as f64 * geo.scale).max(1.0);
            let rx = hx.min(right - rw).max(LEFT);
            let ry = ly + 8.0;
            let _ = write!(
                out,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"18\" fill=\"{RED}\" fill-opacity=\"0.2\" stroke=\"{RED}\" stroke-width=\"2\">",
                num(rx),
                num(ry),
                num(rw)
            );
            let mut tip = vec![format!(
                "the failed request at event {}: {}",
                oom_event.unwrap_or(0),
                svg::bytes_exact(e.size)
            )];
            tip.extend(svg::stack_tooltip(
                &snapshot.interner,
                e.frames,
                "<no stack recorded>",
            ));
            out.push_str(&svg::title(&tip));
            out.push_str("</rect>\n");
            let rlabel = format!("failed request {} (same scale)", format_bytes(e.size));
            let rest = svg::text_width(&rlabel, 13, true);
            // Inside the bar when it is long enough, else beside it.
            let (tx, anchor) = if rw >= rest + 16.0 {
                (rx + 8.0, "start")
            } else if rx + rw + 8.0 + rest <= right {
                (rx + rw + 8.0, "start")
            } else {
                (rx - 8.0, "end")
            };
            svg::text(
                &mut out,
                tx,
                ry + 14.0,
                13,
                &format!("text-anchor=\"{anchor}\" fill=\"#8b0000\" font-weight=\"bold\""),
                &rlabel,
            );
        }
    }

    // Legend.
    let mut ly = rows_bottom + 26.0;
    if by_category {
        ly = svg::category_legend(
            &mut out,
            ly,
            &format!(
                "Colour = memory category, from the phases (requested bytes in live blocks at this moment, {} in all):",
                format_bytes(requested)
            ),
            &category_present,
            &by_category_bytes,
            requested,
        );
    }
    let shown = if by_category {
        0
    } else {
        svg::text(
            &mut out,
            LEFT,
            ly,
            13,
            "font-weight=\"bold\"",
            "Colour = call site (most requested bytes at this moment first):",
        );
        ly += 22.0;
        sites.len().min(LEGEND_SITES)
    };
    for (j, (site, bytes)) in sites.iter().take(shown).enumerate() {
        let suffix = format!("  ({})", format_bytes(*bytes));
        svg::site_legend_entry(&mut out, &colours, j, ly, site, &suffix);
    }
    ly += shown.div_ceil(2) as f64 * 20.0;
    if !by_category && sites.len() > shown {
        svg::text(
            &mut out,
            LEFT,
            ly,
            12,
            &format!("fill=\"{MUTED}\""),
            &format!(
                "… and {} more call sites (hover the blocks)",
                sites.len() - shown
            ),
        );
        ly += 20.0;
    }
    let mut mx = LEFT;
    svg::legend_swatch(
        &mut out,
        mx,
        ly,
        &format!("url(#{HATCH_ID})"),
        "free (cached, unallocated)",
        false,
    );
    mx += 210.0;
    svg::legend_swatch(
        &mut out,
        mx,
        ly,
        RED,
        "rounding waste (block − request)",
        false,
    );
    mx += 250.0;
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\" fill-opacity=\"0.4\" stroke=\"{MUTED}\" stroke-width=\"0.5\"/>",
        num(mx),
        num(ly - 11.0),
        if by_category {
            svg::category_colour(Category::Activations)
        } else {
            svg::PALETTE[0]
        }
    );
    svg::text(&mut out, mx + 20.0, ly, 12, "", "pale = pending free");
    mx += 150.0;
    svg::legend_swatch(
        &mut out,
        mx,
        ly,
        GREY,
        "small blocks / segments, merged",
        false,
    );
    let height = ly + 22.0;
    (out, height)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_moments() {
        assert_eq!(parse_at("peak"), Ok(At::Peak));
        assert_eq!(parse_at("OOM"), Ok(At::Oom));
        assert_eq!(parse_at("end"), Ok(At::End));
        assert_eq!(parse_at("1234"), Ok(At::Event(1234)));
        assert!(parse_at("-1").is_err());
        assert!(parse_at("soon").is_err());
    }
}
