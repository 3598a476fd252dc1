//! `snapscan timeline`: the memory timeline as a self-contained SVG, like memory_viz's "Active
//! Memory Timeline" (snapshot-format.md §10.2).
//!
//! Each allocation is a band whose height is its requested size. Bands are stacked in allocation
//! order: allocations made before the trace window at the bottom (the ones freed last lowest),
//! then every traced allocation on top of what is alive when it is made. An allocation keeps its
//! height above the ground while alive; when one below it is freed, the ones above drop down
//! (memory_viz animates this over 3 steps; here it happens at the free). The `detail` largest
//! allocations (by requested bytes) get their own polygon with a tooltip; all the others are
//! summarized on top, whose upper edge is the total requested memory: one grey band when colouring
//! by call site, one striped band per memory category (stacked in [`Category::ALL`] order) when
//! colouring by category (the default when the phases give categories). The x axis counts trace
//! events (each entry is one step; the state after `k` events is drawn on `[k, k+1)`), or shows
//! seconds. Reserved bytes are a dashed line, the requested peak (including the level at window
//! start) is marked, and OOM entries are red vertical lines. Under the axis, a band shows the
//! phases (load, forward, backward, optimizer, eval) with the step numbers, or a line says why the
//! phases are unknown.
//!
//! Size is bounded whatever the input: at most [`MAX_DETAIL`] polygons per file, and every series
//! is reduced to its maximum per pixel column (coarser columns if a file would exceed
//! [`POINT_BUDGET`] points).

use std::fmt::Write;

use rayon::prelude::*;

use super::svg::{self, num, tenths, ColourBy, Colours, GREY, GRID, INK, LEFT, MUTED, PLOT_W, RED};
use crate::analysis::category::{Categorizer, Category, Confidence};
use crate::analysis::lifetimes::{replay_device, Allocation, DeviceReplay, Origin};
use crate::analysis::phase::{phases_of, Phases, Source};
use crate::snapshot::{Action, Snapshot};
use crate::units::format_bytes;

/// What the x axis shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XAxis {
    /// Trace events: one step per trace entry (as memory_viz, which counts allocs and frees).
    Events,
    /// Seconds since the first event (`time_us` of the trace entries); falls back to events when
    /// the trace has no timestamps.
    Time,
}

#[derive(Clone, Copy, Debug)]
pub struct TimelineOptions {
    pub device: Option<i64>,
    pub x: XAxis,
    /// How many of the largest allocations get their own polygon (per device).
    pub detail: usize,
    /// Colour by category or call site; `None`: by category when the trace gives categories.
    pub colour: Option<ColourBy>,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            device: None,
            x: XAxis::Events,
            detail: DEFAULT_DETAIL,
            colour: None,
        }
    }
}

pub const DEFAULT_DETAIL: usize = 200;
/// Polygons per file, all devices together (caps `--detail`).
pub const MAX_DETAIL: usize = 1000;
/// Points per file, all polygons and lines together (~13 bytes each).
pub const POINT_BUDGET: usize = 120_000;

const PLOT_TOP: f64 = 84.0;
const PLOT_H: f64 = 400.0;
const LEGEND_SITES: usize = 8;

/// Renders the timeline of every device (or only `options.device`) of a snapshot.
pub fn timeline(
    name: &str,
    snapshot: &Snapshot,
    options: &TimelineOptions,
) -> anyhow::Result<Vec<u8>> {
    let devices = svg::devices(snapshot, options.device)?;
    let panels_n = devices.len().max(1);
    let detail = options.detail.min(MAX_DETAIL / panels_n);
    let budget = POINT_BUDGET / panels_n;
    // The file's pinned host levels, found once and drawn under every device's panel.
    let host = crate::analysis::host::host_levels(snapshot);
    let view = PanelView {
        axis: options.x,
        detail,
        budget,
        colour: options.colour,
        host: host.as_ref(),
    };
    let panels: Vec<(String, f64)> = devices
        .par_iter()
        .map(|&d| panel(name, snapshot, d, &view))
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
        &format!("snapscan timeline: {name}"),
        y,
        &body,
    ))
}

/// x positions of the states: `pos[k]` = where the state after `k` events starts.
struct XScale {
    /// `None` = events (pos k = k); `Some` = seconds, `n + 1` entries.
    seconds: Option<Vec<f64>>,
    n: usize,
    max: f64,
}

impl XScale {
    fn new(replay: &DeviceReplay, snapshot: &Snapshot, axis: XAxis) -> (XScale, bool) {
        let trace = snapshot.trace(replay.device);
        let n = replay.events;
        let timed = trace.iter().any(|e| e.time_us.is_some());
        if axis == XAxis::Time && timed {
            let t0 = trace.iter().find_map(|e| e.time_us).unwrap_or(0);
            let mut out = Vec::with_capacity(n + 1);
            out.push(0.0);
            let mut last = 0.0f64;
            for e in trace {
                if let Some(t) = e.time_us {
                    last = last.max((t.saturating_sub(t0)) as f64 / 1e6);
                }
                out.push(last);
            }
            let max = if last > 0.0 { last } else { 1e-6 };
            (
                XScale {
                    seconds: Some(out),
                    n,
                    max,
                },
                false,
            )
        } else {
            (
                XScale {
                    seconds: None,
                    n,
                    max: (n + 1) as f64,
                },
                axis == XAxis::Time,
            )
        }
    }

    /// Start of the state after `k` events (`k = n + 1`: the right end).
    fn pos(&self, k: usize) -> f64 {
        match &self.seconds {
            None => k as f64,
            Some(s) => s[k.min(self.n)],
        }
    }

    fn px(&self, k: usize) -> f64 {
        LEFT + self.pos(k) / self.max * PLOT_W
    }

    fn px_of_value(&self, v: f64) -> f64 {
        LEFT + v / self.max * PLOT_W
    }
}

/// Pixel columns: each series keeps its maximum per column.
#[derive(Clone, Copy)]
struct Columns {
    width: f64,
    count: usize,
}

impl Columns {
    fn new(width: f64) -> Columns {
        Columns {
            width,
            count: (PLOT_W / width).ceil().max(1.0) as usize,
        }
    }

    fn of(&self, px: f64) -> usize {
        let c = ((px - LEFT) / self.width).floor();
        if c.is_nan() || c < 0.0 {
            0
        } else {
            (c as usize).min(self.count - 1)
        }
    }

    /// Columns touched by `[x0, x1)` (a zero-width range still touches the column of `x0`).
    fn range(&self, x0: f64, x1: f64) -> (usize, usize) {
        let c0 = self.of(x0);
        let c1 = if x1 > x0 {
            let e = ((x1 - LEFT) / self.width).ceil() - 1.0;
            if e.is_nan() || e < 0.0 {
                0
            } else {
                (e as usize).min(self.count - 1)
            }
        } else {
            c0
        };
        (c0, c1.max(c0))
    }

    fn left(&self, c: usize) -> f64 {
        LEFT + c as f64 * self.width
    }
}

/// One drawn allocation: its offset above the ground from state `changes[i].0` on.
struct Series {
    alloc: usize,
    changes: Vec<(usize, i64)>,
    /// First state where it is no longer alive (`n + 1` = alive at the end).
    end: usize,
}

struct YScale {
    max: u64,
}

impl YScale {
    fn py(&self, bytes: i64) -> f64 {
        let b = bytes.max(0) as f64;
        PLOT_TOP + PLOT_H - b / self.max.max(1) as f64 * PLOT_H
    }
}

/// Stack order and offsets of the drawn allocations, and the drawn total after each change.
fn stack_series(replay: &DeviceReplay, drawn: &[usize]) -> (Vec<Series>, Vec<(usize, i64)>) {
    let allocs = &replay.allocations;
    let n = replay.events;
    let mut slot = vec![usize::MAX; allocs.len()];
    // Before the window: the ones freed last (or never) lowest, as memory_viz.
    let mut pre: Vec<usize> = drawn
        .iter()
        .copied()
        .filter(|&i| allocs[i].alloc_event.is_none())
        .collect();
    pre.sort_by_key(|&i| {
        (
            std::cmp::Reverse(allocs[i].free_event.map_or(u64::MAX, u64::from)),
            i,
        )
    });
    let mut series: Vec<Series> = Vec::with_capacity(drawn.len());
    let mut stack: Vec<usize> = Vec::with_capacity(drawn.len());
    let mut offsets: Vec<i64> = Vec::with_capacity(drawn.len());
    let mut total: i64 = 0;
    for &i in &pre {
        slot[i] = series.len();
        series.push(Series {
            alloc: i,
            changes: vec![(0, total)],
            end: n + 1,
        });
        stack.push(i);
        offsets.push(total);
        total = total.saturating_add(bytes_i64(allocs[i].requested_bytes));
    }
    let mut drawn_total = vec![(0usize, total)];
    // (event, 0 = death / 1 = birth, allocation): deaths first at the same event.
    let mut events: Vec<(u32, u8, usize)> = Vec::with_capacity(drawn.len() * 2);
    for &i in drawn {
        if let Some(b) = allocs[i].alloc_event {
            events.push((b, 1, i));
        }
        if let Some(f) = allocs[i].free_event {
            events.push((f, 0, i));
        }
    }
    events.sort_unstable();
    for (e, kind, i) in events {
        let k = e as usize + 1;
        let size = bytes_i64(allocs[i].requested_bytes);
        if kind == 1 {
            slot[i] = series.len();
            series.push(Series {
                alloc: i,
                changes: vec![(k, total)],
                end: n + 1,
            });
            stack.push(i);
            offsets.push(total);
            total = total.saturating_add(size);
        } else if let Some(p) = stack.iter().position(|&s| s == i) {
            stack.remove(p);
            offsets.remove(p);
            if let Some(s) = series.get_mut(slot[i]) {
                s.end = k;
            }
            for q in p..stack.len() {
                offsets[q] = offsets[q].saturating_sub(size);
                if let Some(s) = series.get_mut(slot[stack[q]]) {
                    s.changes.push((k, offsets[q]));
                }
            }
            total = total.saturating_sub(size);
        }
        match drawn_total.last_mut() {
            Some(last) if last.0 == k => last.1 = total,
            _ => drawn_total.push((k, total)),
        }
    }
    (series, drawn_total)
}

/// Bytes as a signed level, saturating (hostile files can claim sizes beyond `i64::MAX`).
fn bytes_i64(b: u64) -> i64 {
    i64::try_from(b).unwrap_or(i64::MAX)
}

/// Column maxima of a level given per state (`level(k)` for k in 0..=n).
fn column_max(x: &XScale, cols: Columns, mut level: impl FnMut(usize) -> i64) -> Vec<i64> {
    let mut out = vec![i64::MIN; cols.count];
    for k in 0..=x.n {
        let (c0, c1) = cols.range(x.px(k), x.px(k + 1));
        let v = level(k);
        for slot in &mut out[c0..=c1] {
            if v > *slot {
                *slot = v;
            }
        }
    }
    // Columns no state reaches (time axis gaps cannot happen; keep the previous level).
    let mut prev = 0;
    for v in &mut out {
        if *v == i64::MIN {
            *v = prev;
        }
        prev = *v;
    }
    out
}

/// A curve's levels for `column_max`, which asks for them in order (k = 0: the start, k: after
/// event k − 1): one sweep of the curve. Reading each with `Curve::at` walked from a checkpoint
/// every time, most of the timeline's time on a long trace.
fn curve_levels(curve: &crate::analysis::lifetimes::Curve) -> impl FnMut(usize) -> i64 + '_ {
    let mut levels = std::iter::once(curve.start).chain(curve.levels());
    let mut last = curve.start;
    move |_| {
        if let Some(v) = levels.next() {
            last = v;
        }
        last
    }
}

/// Step edge in tenths from per-column values: from `xa` to `xb`, columns `c0..`.
fn step_edge(cols: Columns, xa: f64, xb: f64, c0: usize, ys: &[f64]) -> Vec<(i64, i64)> {
    let mut pts = Vec::with_capacity(ys.len() + 2);
    let Some(&first) = ys.first() else {
        return pts;
    };
    pts.push((tenths(xa), tenths(first)));
    for j in 1..ys.len() {
        if tenths(ys[j]) != tenths(ys[j - 1]) {
            let bx = cols.left(c0 + j).clamp(xa, xb);
            pts.push((tenths(bx), tenths(ys[j - 1])));
            pts.push((tenths(bx), tenths(ys[j])));
        }
    }
    pts.push((tenths(xb), tenths(ys[ys.len() - 1])));
    pts
}

/// The summarized allocations as stacked layers above the drawn ones: one layer when colouring
/// by call site, one per category (in [`Category::ALL`] order) when colouring by category.
struct RestLayers {
    /// Category of each layer (`None`: the single grey layer).
    layers: Vec<Option<Category>>,
    /// Level changes `(state, layer, bytes)`, sorted by state.
    deltas: Vec<(usize, usize, i64)>,
}

impl RestLayers {
    fn new(
        allocs: &[Allocation],
        rest: &[usize],
        cats: &[(Category, Confidence)],
        by: ColourBy,
    ) -> Self {
        if rest.is_empty() {
            return RestLayers {
                layers: Vec::new(),
                deltas: Vec::new(),
            };
        }
        let category_of = |i: usize| cats.get(i).map_or(Category::Unknown, |c| c.0);
        let layers: Vec<Option<Category>> = if by == ColourBy::Category {
            let mut present = [false; Category::ALL.len()];
            for &i in rest {
                present[svg::category_index(category_of(i))] = true;
            }
            Category::ALL
                .iter()
                .filter(|&&c| present[svg::category_index(c)])
                .map(|&c| Some(c))
                .collect()
        } else {
            vec![None]
        };
        let mut deltas = Vec::with_capacity(rest.len() * 2);
        for &i in rest {
            let a = &allocs[i];
            let layer = if by == ColourBy::Category {
                let c = category_of(i);
                layers.iter().position(|&l| l == Some(c)).unwrap_or(0)
            } else {
                0
            };
            let size = bytes_i64(a.requested_bytes);
            deltas.push((a.alloc_event.map_or(0, |e| e as usize + 1), layer, size));
            if let Some(f) = a.free_event {
                deltas.push((f as usize + 1, layer, -size));
            }
        }
        deltas.sort_unstable();
        RestLayers { layers, deltas }
    }

    fn layer_of(&self, c: Option<Category>) -> usize {
        self.layers.iter().position(|&l| l == c).unwrap_or(0)
    }

    /// Column maxima of the upper edge of every layer, stacked on `drawn_at` (per state).
    fn tops(&self, x: &XScale, cols: Columns, drawn_at: &[i64]) -> Vec<Vec<i64>> {
        let n = self.layers.len();
        let mut out = vec![vec![i64::MIN; cols.count]; n];
        let mut level = vec![0i64; n];
        let mut d = 0;
        for k in 0..=x.n {
            while let Some(&(state, layer, bytes)) = self.deltas.get(d) {
                if state > k {
                    break;
                }
                if let Some(l) = level.get_mut(layer) {
                    *l = l.saturating_add(bytes);
                }
                d += 1;
            }
            let (c0, c1) = cols.range(x.px(k), x.px(k + 1));
            let mut cum = drawn_at.get(k).copied().unwrap_or(0);
            for (l, column) in level.iter().zip(out.iter_mut()) {
                cum = cum.saturating_add(*l);
                for slot in &mut column[c0..=c1] {
                    if cum > *slot {
                        *slot = cum;
                    }
                }
            }
        }
        for column in &mut out {
            let mut prev = 0;
            for v in column.iter_mut() {
                if *v == i64::MIN {
                    *v = prev;
                }
                prev = *v;
            }
        }
        out
    }
}

/// The drawn total per state (`0..=n`) from its changes.
fn drawn_levels(n: usize, drawn_total: &[(usize, i64)]) -> Vec<i64> {
    let mut idx = 0usize;
    let mut out = Vec::with_capacity(n + 1);
    for k in 0..=n {
        while idx + 1 < drawn_total.len() && drawn_total[idx + 1].0 <= k {
            idx += 1;
        }
        out.push(drawn_total.get(idx).map_or(0, |d| d.1));
    }
    out
}

struct Shapes {
    /// (points, allocation index) of drawn allocations, in stack order of birth.
    polygons: Vec<(Vec<(i64, i64)>, usize)>,
    /// One polygon per layer of the summarized allocations (bottom layer first).
    bands: Vec<Vec<(i64, i64)>>,
    reserved: Vec<(i64, i64)>,
    points: usize,
}

fn shapes(
    replay: &DeviceReplay,
    x: &XScale,
    y: &YScale,
    series: &[Series],
    drawn_total: &[(usize, i64)],
    rest: &RestLayers,
    cols: Columns,
) -> Shapes {
    let allocs = &replay.allocations;
    let right = LEFT + PLOT_W;
    let mut polygons = Vec::with_capacity(series.len());
    let mut count = 0;
    for s in series {
        let Some(&(k_first, _)) = s.changes.first() else {
            continue;
        };
        let x_start = x.px(k_first);
        let x_end = x.px(s.end);
        let (c0, c1) = cols.range(x_start, x_end);
        let mut best = vec![i64::MIN; c1 - c0 + 1];
        for (i, &(k, off)) in s.changes.iter().enumerate() {
            let k_next = s.changes.get(i + 1).map_or(s.end, |c| c.0);
            let (a, b) = cols.range(x.px(k), x.px(k_next));
            for slot in &mut best[a.clamp(c0, c1) - c0..=b.clamp(c0, c1) - c0] {
                *slot = (*slot).max(off);
            }
        }
        let mut prev = s.changes[0].1;
        for v in &mut best {
            if *v == i64::MIN {
                *v = prev;
            }
            prev = *v;
        }
        // At least 1 px wide, so that short-lived allocations stay visible.
        let (mut xa, mut xb) = (x_start, x_end);
        if xb - xa < 1.0 {
            if xa + 1.0 <= right {
                xb = xa + 1.0;
            } else {
                xa = xb - 1.0;
            }
        }
        let size = bytes_i64(allocs[s.alloc].requested_bytes);
        let tops: Vec<f64> = best.iter().map(|&o| y.py(o.saturating_add(size))).collect();
        let bottoms: Vec<f64> = best.iter().map(|&o| y.py(o)).collect();
        let mut pts = step_edge(cols, xa, xb, c0, &tops);
        let mut bottom = step_edge(cols, xa, xb, c0, &bottoms);
        bottom.reverse();
        pts.extend(bottom);
        count += pts.len();
        polygons.push((pts, s.alloc));
    }

    let edge = |vals: &[i64]| -> Vec<(i64, i64)> {
        let ys: Vec<f64> = vals.iter().map(|&v| y.py(v)).collect();
        step_edge(cols, LEFT, right, 0, &ys)
    };
    let mut bands = Vec::with_capacity(rest.layers.len());
    if !rest.layers.is_empty() {
        let drawn_at = drawn_levels(x.n, drawn_total);
        let mut below = column_max(x, cols, |k| drawn_at[k]);
        for top in rest.tops(x, cols, &drawn_at) {
            let mut pts = edge(&top);
            let mut b = edge(&below);
            b.reverse();
            pts.extend(b);
            count += pts.len();
            bands.push(pts);
            below = top;
        }
    }
    let reserved = edge(&column_max(x, cols, curve_levels(&replay.reserved)));
    count += reserved.len();
    Shapes {
        polygons,
        bands,
        reserved,
        points: count,
    }
}

fn when(replay: &DeviceReplay, snapshot: &Snapshot, event: Option<u32>) -> String {
    let trace = snapshot.trace(replay.device);
    match event {
        None => "at window start".to_owned(),
        Some(e) => {
            let mut s = format!("at event {e}");
            let t0 = trace.iter().find_map(|t| t.time_us);
            if let (Some(t), Some(t0)) = (trace.get(e as usize).and_then(|t| t.time_us), t0) {
                let _ = write!(s, " (+{:.3}s)", (t - t0) as f64 / 1e6);
            }
            s
        }
    }
}

fn tooltip(
    snapshot: &Snapshot,
    replay: &DeviceReplay,
    a: &Allocation,
    category: (Category, Confidence),
) -> Vec<String> {
    let mut lines = Vec::new();
    let mut head = format!("{} requested", svg::bytes_exact(a.requested_bytes));
    if a.block_bytes != a.requested_bytes {
        let _ = write!(head, ", block {}", format_bytes(a.block_bytes));
    }
    lines.push(head);
    lines.push(svg::category_line(category));
    lines.push(match a.alloc_event {
        Some(e) => format!("born {}", when(replay, snapshot, Some(e))),
        None => match a.origin {
            Origin::Ghost => {
                "born before the trace window (still allocated at the dump)".to_owned()
            }
            _ => "born before the trace window".to_owned(),
        },
    });
    lines.push(match a.free_event {
        Some(e) => format!("freed {}", when(replay, snapshot, Some(e))),
        None => "alive at the end of the trace".to_owned(),
    });
    let mut where_ = format!("address 0x{:x}", a.address);
    if a.stream != 0 {
        let _ = write!(where_, ", stream {}", a.stream);
    }
    lines.push(where_);
    let fallback =
        if a.origin == Origin::FreedInWindow && a.stack != crate::snapshot::StackId::EMPTY {
            "stack of its free (its allocation was not recorded)"
        } else {
            a.origin.label()
        };
    lines.extend(svg::stack_tooltip(&snapshot.interner, a.stack, fallback));
    if a.origin == Origin::FreedInWindow && a.stack != crate::snapshot::StackId::EMPTY {
        lines.push("(allocated before the window: the stack is the free's)".to_owned());
    }
    lines
}

/// Height of the phase band, and the narrowest interval drawn on its own (narrower neighbours
/// are merged into one shape, which bounds the shapes to about one per 3 px).
const BAND_H: f64 = 14.0;
const MIN_BAND_W: f64 = 3.0;
/// Width of a character of the band's 10 px labels.
const BAND_CHAR_W: f64 = 6.0;

/// The phase band under the x axis (top edge at `top`) and the step numbers under it; returns
/// whether there are steps.
fn phase_band(
    out: &mut String,
    snapshot: &Snapshot,
    device: i64,
    x: &XScale,
    phases: &Phases,
    top: f64,
) -> bool {
    let trace = snapshot.trace(device);
    let t0 = trace.iter().find_map(|e| e.time_us);
    let secs = |e: u32| -> Option<f64> {
        let t = trace.get(e as usize)?.time_us?;
        Some(t.saturating_sub(t0?) as f64 / 1e6)
    };
    let events_text = |first: u32, last: u32| -> String {
        let n = u64::from(last.saturating_sub(first)) + 1;
        let mut s = format!(
            "events {first}–{last} ({n} event{})",
            if n == 1 { "" } else { "s" }
        );
        if let (Some(a), Some(b)) = (secs(first), secs(last)) {
            let _ = write!(s, ", +{a:.3}s to +{b:.3}s");
        }
        s
    };
    let right = LEFT + PLOT_W;
    let ivs = &phases.intervals;
    // Interval i covers the states after its events; the first one also the state before them.
    let span = |i: usize| -> (f64, f64) {
        let iv = &ivs[i];
        let x0 = if i == 0 {
            x.px(0)
        } else {
            x.px(iv.first_event as usize + 1)
        };
        let x1 = x.px(iv.last_event as usize + 2);
        (x0, x1.max(x0))
    };
    // Groups of intervals: wide ones alone, runs of narrow ones merged.
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut open: Option<(usize, f64)> = None;
    for i in 0..ivs.len() {
        let (x0, x1) = span(i);
        if x1 - x0 >= MIN_BAND_W {
            if let Some((f, _)) = open.take() {
                groups.push((f, i - 1));
            }
            groups.push((i, i));
        } else {
            let (f, gx0) = *open.get_or_insert((i, x0));
            if x1 - gx0 >= MIN_BAND_W {
                groups.push((f, i));
                open = None;
            }
        }
    }
    if let Some((f, _)) = open {
        groups.push((f, ivs.len() - 1));
    }
    svg::text(
        out,
        LEFT - 6.0,
        top + BAND_H / 2.0 + 4.0,
        11,
        &format!("text-anchor=\"end\" fill=\"{MUTED}\""),
        "phase",
    );
    for &(f, l) in &groups {
        let x0 = span(f).0;
        let x1 = span(l).1;
        let (first, last) = (ivs[f].first_event, ivs[l].last_event);
        let (phase, tip) = if f == l {
            let iv = &ivs[f];
            let mut head = iv.name.name().to_owned();
            if let Some(s) = iv.step {
                let _ = write!(head, ", step {s}");
            }
            let mut sources: Vec<Source> = Vec::new();
            for s in phases
                .per_event
                .sources(iv.first_event as usize..=iv.last_event as usize)
            {
                if !sources.contains(&s) {
                    sources.push(s);
                }
            }
            if sources.is_empty() {
                sources.push(iv.source);
            }
            let found: Vec<&str> = sources.iter().map(|&s| svg::source_text(s)).collect();
            (
                iv.name,
                vec![
                    head,
                    events_text(first, last),
                    format!("found from: {}", found.join("; ")),
                ],
            )
        } else {
            let mut events = [0u64; svg::PHASES.len()];
            let mut counts = [0usize; svg::PHASES.len()];
            let mut steps: Option<(u32, u32)> = None;
            for iv in &ivs[f..=l] {
                let p = svg::PHASES.iter().position(|&p| p == iv.name).unwrap_or(0);
                events[p] += u64::from(iv.last_event.saturating_sub(iv.first_event)) + 1;
                counts[p] += 1;
                if let Some(s) = iv.step {
                    steps = Some(steps.map_or((s, s), |(a, b)| (a.min(s), b.max(s))));
                }
            }
            let mut best = 0;
            for p in 1..events.len() {
                if events[p] > events[best] {
                    best = p;
                }
            }
            let mut tip = vec![
                format!(
                    "{} short phase intervals, drawn merged (mostly {})",
                    l - f + 1,
                    svg::PHASES[best].name()
                ),
                events_text(first, last),
            ];
            for (p, phase) in svg::PHASES.iter().enumerate() {
                if counts[p] > 0 {
                    tip.push(format!(
                        "  {}: {} interval{}, {} events",
                        phase.name(),
                        counts[p],
                        if counts[p] == 1 { "" } else { "s" },
                        events[p]
                    ));
                }
            }
            if let Some((a, b)) = steps {
                tip.push(if a == b {
                    format!("step {a}")
                } else {
                    format!("steps {a}–{b}")
                });
            }
            (svg::PHASES[best], tip)
        };
        let (fill, ink) = svg::phase_colour(phase);
        let w = (x1 - x0).max(0.5);
        let _ = write!(
            out,
            "<g>{}<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"/>",
            svg::title(&tip),
            num(x0),
            num(top),
            num(w),
            num(BAND_H)
        );
        if f == l {
            let label = [phase.name(), svg::phase_abbrev(phase)]
                .into_iter()
                .find(|t| w >= t.chars().count() as f64 * BAND_CHAR_W + 6.0);
            if let Some(label) = label {
                let _ = write!(
                    out,
                    "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" fill=\"{ink}\">{}</text>",
                    num(x0 + w / 2.0),
                    num(top + BAND_H / 2.0 + 3.5),
                    svg::esc(label)
                );
            }
        }
        out.push_str("</g>\n");
    }
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\" stroke-width=\"0.5\"/>",
        num(LEFT),
        num(top),
        num(PLOT_W),
        num(BAND_H)
    );

    // Steps: where each starts, numbered where there is room.
    let mut starts: Vec<(u32, f64, u32, u32)> = Vec::new(); // step, x, first event, last event
    for (i, iv) in ivs.iter().enumerate() {
        let Some(s) = iv.step else { continue };
        match starts.last_mut() {
            Some(last) if last.0 == s => last.3 = iv.last_event,
            _ => starts.push((s, span(i).0, iv.first_event, iv.last_event)),
        }
    }
    if starts.is_empty() {
        return false;
    }
    let tick_top = top + BAND_H;
    let label_y = tick_top + 13.0;
    svg::text(
        out,
        LEFT - 6.0,
        label_y,
        10,
        &format!("text-anchor=\"end\" fill=\"{MUTED}\""),
        "step",
    );
    let widest = starts
        .iter()
        .map(|s| s.0)
        .max()
        .unwrap_or(0)
        .to_string()
        .len() as f64;
    let label_w = widest * BAND_CHAR_W + 6.0;
    let avg = match (starts.first(), starts.last()) {
        (Some(a), Some(b)) if starts.len() > 1 => (b.1 - a.1) / (starts.len() - 1) as f64,
        _ => PLOT_W,
    };
    let mut every: u32 = 1;
    for k in [
        1u32, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000,
    ] {
        every = k;
        if avg * k as f64 >= label_w {
            break;
        }
    }
    let all_ticks = starts.len() as f64 <= PLOT_W / MIN_BAND_W;
    let mut last_end = f64::NEG_INFINITY;
    for &(s, sx, first, last) in &starts {
        let text = s.to_string();
        let w = text.len() as f64 * BAND_CHAR_W;
        let labelled = s % every == 0 && sx + 2.0 >= last_end && sx + 2.0 + w <= right;
        if !labelled && !all_ticks {
            continue;
        }
        let _ = write!(
            out,
            "<g>{}<line x1=\"{p}\" y1=\"{}\" x2=\"{p}\" y2=\"{}\" stroke=\"{INK}\" stroke-width=\"{}\"/>",
            svg::title(&[format!("step {s}: {}", events_text(first, last))]),
            num(tick_top),
            num(tick_top + if labelled { 5.0 } else { 3.0 }),
            if labelled { "1" } else { "0.6" },
            p = num(sx)
        );
        if labelled {
            let _ = write!(
                out,
                "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"{MUTED}\">{}</text>",
                num(sx + 2.0),
                num(label_y),
                text
            );
            last_end = sx + 2.0 + w + 4.0;
        }
        out.push_str("</g>\n");
    }
    true
}

/// Call sites of allocations, by requested bytes: (site, (bytes, count)), most bytes first.
fn sites_by_bytes<'a>(
    colours: &Colours,
    allocs: impl Iterator<Item = &'a Allocation>,
) -> Vec<(String, (u64, u64))> {
    let mut map: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for a in allocs {
        let key = colours
            .site(a)
            .unwrap_or_else(|| a.origin.label().to_owned());
        let g = map.entry(key).or_insert((0, 0));
        g.0 = g.0.saturating_add(a.requested_bytes);
        g.1 += 1;
    }
    let mut v: Vec<(String, (u64, u64))> = map.into_iter().collect();
    v.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    v
}

/// Tooltip lines `  12.0MiB in 3: site` for the first sites, and how many more there are.
fn site_lines(tip: &mut Vec<String>, sites: &[(String, (u64, u64))]) {
    for (site, (bytes, count)) in sites.iter().take(svg::STACK_LINES) {
        tip.push(format!(
            "  {} in {count}: {}",
            format_bytes(*bytes),
            svg::cut_left(site, 100)
        ));
    }
    if sites.len() > svg::STACK_LINES {
        tip.push(format!(
            "  … {} more call sites",
            sites.len() - svg::STACK_LINES
        ));
    }
}

/// How one device's panel is drawn, and the file's host levels drawn under it.
struct PanelView<'a> {
    axis: XAxis,
    detail: usize,
    budget: usize,
    colour: Option<ColourBy>,
    host: Option<&'a crate::analysis::host::HostLevels>,
}

fn panel(name: &str, snapshot: &Snapshot, device: i64, view: &PanelView) -> (String, f64) {
    let &PanelView {
        axis,
        detail,
        budget,
        colour,
        host,
    } = view;
    let replay = replay_device(snapshot, device);
    let trace = snapshot.trace(device);
    let allocs = &replay.allocations;
    let phases = phases_of(snapshot, device, &replay);
    let (peak, peak_event) = replay.requested.peak();
    let categorizer = Categorizer::new(snapshot, &phases, &replay);
    let cats: Vec<(Category, Confidence)> =
        allocs.iter().map(|a| categorizer.categorize(a)).collect();
    let by = svg::choose_colour_by(colour, cats.iter().map(|c| c.0));
    let by_category = by == ColourBy::Category;
    let mut colours = Colours::with_categories(&snapshot.interner, categorizer, by);
    let (x, time_missing) = XScale::new(&replay, snapshot, axis);

    // The `detail` largest allocations get their own polygon.
    let mut order: Vec<usize> = (0..allocs.len())
        .filter(|&i| allocs[i].requested_bytes > 0)
        .collect();
    order.sort_by(|&a, &b| {
        allocs[b]
            .requested_bytes
            .cmp(&allocs[a].requested_bytes)
            .then(a.cmp(&b))
    });
    let rest = order.split_off(detail.min(order.len()));
    let mut drawn = order;
    drawn.sort_unstable();
    let smallest_drawn = drawn
        .iter()
        .map(|&i| allocs[i].requested_bytes)
        .min()
        .unwrap_or(0);
    let (series, drawn_total) = stack_series(&replay, &drawn);
    let rest_layers = RestLayers::new(allocs.as_slice(), &rest, &cats, by);
    // Call sites of the drawn allocations, largest first; the legend's get distinct colours.
    let mut by_site: std::collections::BTreeMap<String, (u64, u64, u64)> =
        std::collections::BTreeMap::new();
    for &i in &drawn {
        let a = &allocs[i];
        let key = colours.site(a).unwrap_or_else(|| svg::NO_STACK.to_owned());
        let g = by_site.entry(key).or_insert((0, 0, 0));
        g.0 = g.0.saturating_add(a.requested_bytes);
        g.1 += 1;
        g.2 = g.2.max(a.requested_bytes);
    }
    let mut sites: Vec<(String, (u64, u64, u64))> = by_site.into_iter().collect();
    sites.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
    let legend_sites: Vec<String> = sites
        .iter()
        .take(LEGEND_SITES)
        .map(|s| s.0.clone())
        .filter(|s| s != svg::NO_STACK)
        .collect();
    colours.assign_distinct(&legend_sites);

    let (reserved_peak, _) = replay.reserved.peak();
    let top = peak.max(reserved_peak).max(0) as u64;
    let (ystep, ymax) = svg::byte_ticks(top.saturating_add(top / 16));
    let y = YScale { max: ymax };

    let mut width = 1.0;
    let mut sh = shapes(
        &replay,
        &x,
        &y,
        &series,
        &drawn_total,
        &rest_layers,
        Columns::new(width),
    );
    while sh.points > budget && width < 64.0 {
        width *= 2.0;
        sh = shapes(
            &replay,
            &x,
            &y,
            &series,
            &drawn_total,
            &rest_layers,
            Columns::new(width),
        );
    }

    let mut out = String::new();
    let right = LEFT + PLOT_W;
    let bottom = PLOT_TOP + PLOT_H;

    // Heading.
    svg::heading(
        &mut out,
        26.0,
        17,
        name,
        &format!(" — device {device}: memory timeline"),
    );
    let ooms: Vec<usize> = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Oom)
        .map(|(i, _)| i)
        .collect();
    let mut line1 = format!(
        "Peak {} requested {}; reserved peak {}.",
        format_bytes(peak.max(0) as u64),
        when(&replay, snapshot, peak_event),
        format_bytes(reserved_peak.max(0) as u64)
    );
    if !ooms.is_empty() {
        let _ = write!(
            line1,
            " {} OOM{} (first at event {}).",
            ooms.len(),
            if ooms.len() == 1 { "" } else { "s" },
            ooms[0]
        );
    }
    if replay.events == 0 {
        line1.push_str(" No trace recorded: the dump's allocations at one moment.");
    } else if replay.starts_mid_run() {
        line1.push_str(" The trace starts mid-run: earlier allocations start at x = 0.");
    }
    svg::text_fit(&mut out, LEFT, 48.0, 13, "", &line1);
    let mut line2 = format!(
        "Stacked requested bytes of live allocations: the {} largest of {} drawn one by one (≥ {}), ",
        drawn.len(),
        allocs.len(),
        format_bytes(smallest_drawn)
    );
    if rest.is_empty() {
        line2.push_str("none summarized. ");
    } else if by_category {
        let _ = write!(line2, "{} smaller ones striped, by category. ", rest.len());
    } else {
        let _ = write!(line2, "{} smaller ones in the grey band. ", rest.len());
    }
    line2.push_str("Hover a shape for size, lifetime and stack.");
    if time_missing {
        line2.push_str(" (No timestamps: x in events.)");
    }
    svg::text_fit(
        &mut out,
        LEFT,
        67.0,
        13,
        &format!("fill=\"{MUTED}\""),
        &line2,
    );

    // Grid and y axis.
    byte_grid(&mut out, (ystep, ymax), 12, |v| y.py(bytes_i64(v)));
    // x ticks.
    let xstep = match x.seconds {
        Some(_) => svg::nice_step(x.max, 10),
        None => svg::nice_step(x.max, 10).max(1.0),
    };
    let mut i = 0u64;
    loop {
        let xv = i as f64 * xstep;
        if xv > x.max + xstep * 1e-9 {
            break;
        }
        let px = x.px_of_value(xv);
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{GRID}\"/>",
            num(px),
            num(PLOT_TOP),
            num(px),
            num(bottom + 4.0)
        );
        let label = if x.seconds.is_some() {
            svg::fmt_seconds(xv, xstep)
        } else {
            svg::fmt_count(xv)
        };
        svg::text(
            &mut out,
            px,
            bottom + 18.0,
            12,
            "text-anchor=\"middle\"",
            &label,
        );
        i += 1;
        if i > 1000 {
            break;
        }
    }
    // Phases under the axis: a band of intervals, or why there is none.
    let band = phases.unknown_reason.is_none() && !phases.intervals.is_empty();
    let xtitle_y = if band {
        if phase_band(&mut out, snapshot, device, &x, &phases, bottom + 26.0) {
            bottom + 74.0
        } else {
            bottom + 60.0
        }
    } else {
        bottom + 38.0
    };
    let xtitle = if x.seconds.is_some() {
        "seconds since the first trace entry"
    } else if x.n == 0 {
        "no trace events: the allocations of the dump"
    } else {
        "trace events (every alloc, free and segment entry is one step; before the first event at 0)"
    };
    svg::text(
        &mut out,
        LEFT + PLOT_W / 2.0,
        xtitle_y,
        13,
        &format!("text-anchor=\"middle\" fill=\"{MUTED}\""),
        xtitle,
    );
    let mut ly = xtitle_y + 28.0;
    if !band {
        let reason = phases
            .unknown_reason
            .as_deref()
            .unwrap_or("no phase could be found");
        let lines = svg::wrap(&format!("No phase band: {reason}."), 190);
        for (j, l) in lines.iter().enumerate() {
            svg::text(
                &mut out,
                LEFT,
                xtitle_y + 20.0 + j as f64 * 15.0,
                12,
                &format!("fill=\"{MUTED}\" font-style=\"italic\""),
                l,
            );
        }
        ly += lines.len() as f64 * 15.0;
    }
    let _ = writeln!(
        out,
        "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" fill=\"{MUTED}\">bytes (binary units)</text>",
        num(PLOT_TOP + PLOT_H / 2.0)
    );

    // Allocations.
    out.push_str("<g stroke=\"#ffffff\" stroke-width=\"0.3\" stroke-opacity=\"0.7\">\n");
    for (pts, a) in &sh.polygons {
        let alloc = &allocs[*a];
        let category = cats
            .get(*a)
            .copied()
            .unwrap_or((Category::Unknown, Confidence::Low));
        out.push_str("<polygon points=\"");
        svg::points(&mut out, pts);
        let _ = write!(out, "\" fill=\"{}\">", colours.colour_for(alloc));
        out.push_str(&svg::title(&tooltip(snapshot, &replay, alloc, category)));
        out.push_str("</polygon>\n");
    }
    out.push_str("</g>\n");
    // The summarized allocations: one band, or one per category.
    let layer_count = rest_layers.layers.len();
    let mut in_layer: Vec<Vec<usize>> = vec![Vec::new(); layer_count];
    for &i in &rest {
        let c = cats.get(i).map_or(Category::Unknown, |c| c.0);
        let l = rest_layers.layer_of(by_category.then_some(c));
        if let Some(v) = in_layer.get_mut(l) {
            v.push(i);
        }
    }
    for (l, pts) in sh.bands.iter().enumerate() {
        let members = in_layer.get(l).map_or(&[][..], |v| &v[..]);
        let largest = members
            .iter()
            .map(|&i| allocs[i].requested_bytes)
            .max()
            .unwrap_or(0);
        let alive: Vec<&Allocation> = members
            .iter()
            .map(|&i| &allocs[i])
            .filter(|a| a.alive_after(peak_event))
            .collect();
        let at_peak = sites_by_bytes(&colours, alive.iter().copied());
        let bytes_at_peak = at_peak.iter().fold(0u64, |s, x| s.saturating_add(x.1 .0));
        let category = rest_layers.layers.get(l).copied().flatten();
        let fill = match category {
            Some(c) => format!("fill=\"{}\"", svg::rest_fill(c)),
            None => format!("fill=\"{GREY}\" fill-opacity=\"0.85\""),
        };
        out.push_str("<polygon points=\"");
        svg::points(&mut out, pts);
        let _ = write!(out, "\" {fill}>");
        let mut tip = vec![match category {
            Some(c) => format!(
                "{}: {} smaller allocations summarized (each ≤ {})",
                c.name(),
                members.len(),
                format_bytes(largest)
            ),
            None => format!(
                "{} smaller allocations summarized (each ≤ {})",
                members.len(),
                format_bytes(largest)
            ),
        }];
        if l + 1 == layer_count {
            tip.push(if layer_count == 1 {
                "the band's upper edge is the total requested memory".to_owned()
            } else {
                "the upper edge of this top band is the total requested memory".to_owned()
            });
        }
        if !at_peak.is_empty() {
            tip.push(format!(
                "in the band at the peak: {} in {}, by call site:",
                format_bytes(bytes_at_peak),
                crate::units::counted(alive.len() as u64, "allocation", "allocations")
            ));
            site_lines(&mut tip, &at_peak);
        }
        out.push_str(&svg::title(&tip));
        out.push_str("</polygon>\n");
    }
    // Reserved.
    out.push_str("<polyline points=\"");
    svg::points(&mut out, &sh.reserved);
    let _ = write!(
        out,
        "\" fill=\"none\" stroke=\"{INK}\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\">"
    );
    out.push_str(&svg::title(&[format!(
        "reserved by the caching allocator (Σ segment bytes); peak {}",
        svg::bytes_exact(reserved_peak.max(0) as u64)
    )]));
    out.push_str("</polyline>\n");

    // OOM marks.
    let mut last_label = f64::NEG_INFINITY;
    for &i in &ooms {
        let e = &trace.at(i);
        let px = x.px(i + 1);
        let mut tip = vec![format!(
            "OOM at event {i}: a {} request failed",
            svg::bytes_exact(e.size)
        )];
        if let Some(free) = e.device_free {
            tip.push(format!("the device had {} free", format_bytes(free)));
        }
        tip.extend(svg::stack_tooltip(
            &snapshot.interner,
            e.frames,
            "<no stack recorded>",
        ));
        let _ = writeln!(
            out,
            "<line x1=\"{p}\" y1=\"{}\" x2=\"{p}\" y2=\"{}\" stroke=\"{RED}\" stroke-width=\"2\">{}</line>",
            num(PLOT_TOP),
            num(bottom),
            svg::title(&tip),
            p = num(px)
        );
        if px - last_label >= 40.0 {
            let anchor = if px > right - 30.0 { "end" } else { "middle" };
            svg::text(
                &mut out,
                px,
                PLOT_TOP - 4.0,
                12,
                &format!("text-anchor=\"{anchor}\" fill=\"{RED}\" font-weight=\"bold\""),
                "OOM",
            );
            last_label = px;
        }
    }

    // Peak.
    let peak_k = peak_event.map_or(0, |e| e as usize + 1);
    let px_peak = (x.px(peak_k) + x.px(peak_k + 1)) / 2.0;
    let py_peak = y.py(peak);
    let _ = writeln!(
        out,
        "<line x1=\"{}\" y1=\"{p}\" x2=\"{}\" y2=\"{p}\" stroke=\"{INK}\" stroke-width=\"0.8\" stroke-dasharray=\"2 3\"/>",
        num(LEFT),
        num(right),
        p = num(py_peak)
    );
    let peak_text = format!(
        "peak {} {}",
        format_bytes(peak.max(0) as u64),
        when(&replay, snapshot, peak_event)
    );
    let _ = writeln!(
        out,
        "<circle cx=\"{}\" cy=\"{}\" r=\"4.5\" fill=\"#ffffff\" stroke=\"{INK}\" stroke-width=\"2\">{}</circle>",
        num(px_peak),
        num(py_peak),
        svg::title(&[format!(
            "peak of requested memory (incl. the level at window start): {} {}",
            svg::bytes_exact(peak.max(0) as u64),
            when(&replay, snapshot, peak_event)
        )])
    );
    let label_w = peak_text.chars().count() as f64 * 7.2;
    let (lx, anchor) = if px_peak + 10.0 + label_w <= right {
        (px_peak + 10.0, "start")
    } else {
        (px_peak - 10.0, "end")
    };
    let label_y = if py_peak - 8.0 < PLOT_TOP + 14.0 {
        py_peak + 18.0
    } else {
        py_peak - 8.0
    };
    svg::text(
        &mut out,
        lx,
        label_y,
        13,
        &format!("text-anchor=\"{anchor}\" font-weight=\"bold\" stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\""),
        &peak_text,
    );
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
        num(LEFT),
        num(PLOT_TOP),
        num(PLOT_W),
        num(PLOT_H)
    );

    if by_category {
        // Legend: the categories, with their bytes at the peak.
        let mut at_peak = [0u64; Category::ALL.len()];
        let mut present = [false; Category::ALL.len()];
        for (a, c) in allocs.iter().zip(&cats) {
            if a.requested_bytes == 0 {
                continue;
            }
            let k = svg::category_index(c.0);
            present[k] = true;
            if a.alive_after(peak_event) {
                at_peak[k] = at_peak[k].saturating_add(a.requested_bytes);
            }
        }
        let total = at_peak.iter().fold(0u64, |s, &b| s.saturating_add(b));
        ly = svg::category_legend(
            &mut out,
            ly,
            &format!(
                "Colour = memory category, from the phases (bytes alive at the peak, {} in all; hover a shape for its confidence):",
                format_bytes(total)
            ),
            &present,
            &at_peak,
            total,
        );
    } else {
        // Legend: the top call sites of the drawn allocations.
        svg::text(
            &mut out,
            LEFT,
            ly,
            13,
            "font-weight=\"bold\"",
            "Colour = call site (largest drawn allocations first):",
        );
        ly += 22.0;
        let shown = sites.len().min(LEGEND_SITES);
        for (j, (site, (_, count, largest))) in sites.iter().take(shown).enumerate() {
            let suffix = format!("  ({count}×, largest {})", format_bytes(*largest));
            svg::site_legend_entry(&mut out, &colours, j, ly, site, &suffix);
        }
        ly += shown.div_ceil(2) as f64 * 20.0;
        if sites.len() > shown {
            svg::text(
                &mut out,
                LEFT,
                ly,
                12,
                &format!("fill=\"{MUTED}\""),
                &format!(
                    "… and {} more call sites (hover the shapes)",
                    sites.len() - shown
                ),
            );
            ly += 20.0;
        }
    }
    // Phases of the band.
    if band {
        let mut mx = LEFT;
        svg::text(&mut out, mx, ly, 12, "", "Phase band:");
        mx += 78.0;
        for p in svg::PHASES {
            if !phases.intervals.iter().any(|iv| iv.name == p) {
                continue;
            }
            svg::legend_swatch(&mut out, mx, ly, svg::phase_colour(p).0, p.name(), false);
            mx += 30.0 + p.name().len() as f64 * 7.0 + 14.0;
        }
        svg::text(
            &mut out,
            mx,
            ly,
            12,
            &format!("fill=\"{MUTED}\""),
            "(hover for the step, events and how each was found)",
        );
        ly += 22.0;
    }
    // Marks.
    let mut mx = LEFT;
    if !rest.is_empty() {
        if by_category {
            svg::legend_swatch(
                &mut out,
                mx,
                ly,
                &svg::rest_fill(
                    rest_layers
                        .layers
                        .first()
                        .copied()
                        .flatten()
                        .unwrap_or(Category::Activations),
                ),
                "striped = smaller allocations, summarized",
                false,
            );
            mx += 320.0;
        } else {
            svg::legend_swatch(
                &mut out,
                mx,
                ly,
                GREY,
                "smaller allocations, summarized",
                false,
            );
            mx += 250.0;
        }
    }
    let _ = writeln!(
        out,
        "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{INK}\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\"/>",
        num(mx),
        num(mx + 24.0),
        y = num(ly - 4.0)
    );
    svg::text(&mut out, mx + 30.0, ly, 12, "", "reserved (segments)");
    mx += 170.0;
    let _ = writeln!(
        out,
        "<circle cx=\"{}\" cy=\"{}\" r=\"4.5\" fill=\"#ffffff\" stroke=\"{INK}\" stroke-width=\"2\"/>",
        num(mx + 6.0),
        num(ly - 4.0)
    );
    svg::text(&mut out, mx + 18.0, ly, 12, "", "peak of requested bytes");
    mx += 190.0;
    if !ooms.is_empty() {
        let _ = writeln!(
            out,
            "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\" stroke=\"{RED}\" stroke-width=\"2\"/>",
            num(ly - 12.0),
            num(ly + 2.0),
            x = num(mx + 6.0)
        );
        svg::text(&mut out, mx + 14.0, ly, 12, "", "OOM (failed request)");
    }
    let mut height = ly + 22.0;
    if let Some(levels) = host {
        let lane = crate::analysis::host::host_lane(levels, trace);
        height = host_lane(&mut out, &lane, &x, height + 8.0);
    }
    (out, height)
}

/// Horizontal grid lines across the plot at every `step` bytes up to `max`, each labelled
/// left of the plot in `font`-pixel text; `y` places a byte level.
fn byte_grid(out: &mut String, (step, max): (u64, u64), font: u32, y: impl Fn(u64) -> f64) {
    let mut v = 0u64;
    while v <= max {
        let py = y(v);
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{GRID}\"/>",
            num(LEFT),
            num(py),
            num(LEFT + PLOT_W),
            num(py)
        );
        svg::text(
            out,
            LEFT - 6.0,
            py + 4.0,
            font,
            "text-anchor=\"end\"",
            &format_bytes(v),
        );
        v = match v.checked_add(step) {
            Some(n) => n,
            None => break,
        };
    }
}

fn in_tenths(pts: &[(f64, f64)]) -> Vec<(i64, i64)> {
    pts.iter()
        .map(|&(x, y)| (svg::tenths(x), svg::tenths(y)))
        .collect()
}

/// Height of the pinned host memory lane (torch 2.14+ `host_traces`) under a device's plot.
const LANE_H: f64 = 90.0;

/// The pinned host memory lane at `top`, on the device plot's x axis: host bytes pinned
/// (filled) and reserved (dashed) on their own byte scale. Returns the panel's new height.
fn host_lane(
    out: &mut String,
    lane: &crate::analysis::host::HostLane,
    x: &XScale,
    top: f64,
) -> f64 {
    let right = LEFT + PLOT_W;
    let (mut ystep, mut ymax) = svg::byte_ticks(lane.peak_allocated.max(lane.peak_reserved));
    // At most four gaps in the lane's few pixels.
    while ymax / ystep.max(1) > 4 {
        ystep = ystep.saturating_mul(2);
        ymax = ymax.div_ceil(ystep).saturating_mul(ystep);
    }
    let py = |b: u64| top + 26.0 + LANE_H - b as f64 / ymax.max(1) as f64 * LANE_H;
    // Where a point starts: its device state, or its time on a time axis.
    let px = |j: usize| match (&x.seconds, lane.by_time) {
        (Some(_), true) => x.px_of_value(lane.times_us[j] as f64 / 1e6),
        _ => x.px(lane.states[j] as usize),
    };
    let how = if lane.by_time {
        "placed by time on the device's axis"
    } else {
        "no times to align by: its entries spread in order over the device's axis"
    };
    svg::text(
        out,
        LEFT,
        top + 14.0,
        13,
        "font-weight=\"bold\"",
        &format!(
            "Pinned host memory (host_traces): peak {} pinned, {} reserved; {how}",
            format_bytes(lane.peak_allocated),
            format_bytes(lane.peak_reserved)
        ),
    );
    let bottom = top + 26.0 + LANE_H;
    byte_grid(out, (ystep, ymax), 11, py);
    // Step curves: each level holds from its point to the next (the last to the right edge).
    let steps = |levels: &[u64], start: u64| {
        let mut pts: Vec<(f64, f64)> = vec![(LEFT, py(start))];
        for (j, &l) in levels.iter().enumerate() {
            let xj = px(j).clamp(LEFT, right);
            let prev = pts.last().map_or(py(start), |p| p.1);
            pts.push((xj, prev));
            pts.push((xj, py(l)));
        }
        let last = pts.last().map_or(py(start), |p| p.1);
        pts.push((right, last));
        pts
    };
    let mut fill = steps(&lane.allocated, lane.start_allocated);
    fill.push((right, bottom));
    fill.push((LEFT, bottom));
    // A shape with its tooltip.
    let shape = |out: &mut String, tag: &str, pts: &[(f64, f64)], attrs: &str, tip: String| {
        let _ = write!(out, "<{tag} points=\"");
        svg::points(out, &in_tenths(pts));
        let _ = writeln!(out, "\" {attrs}>{}</{tag}>", svg::title(&[tip]));
    };
    shape(
        out,
        "polygon",
        &fill,
        "fill=\"#9ecae1\" stroke=\"#3182bd\" stroke-width=\"1\"",
        format!(
            "pinned host memory allocated; peak {}",
            svg::bytes_exact(lane.peak_allocated)
        ),
    );
    shape(
        out,
        "polyline",
        &steps(&lane.reserved, lane.start_reserved),
        &format!("fill=\"none\" stroke=\"{INK}\" stroke-width=\"1.2\" stroke-dasharray=\"6 3\""),
        format!(
            "pinned host memory reserved (host segments); peak {}",
            svg::bytes_exact(lane.peak_reserved)
        ),
    );
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>",
        num(LEFT),
        num(top + 26.0),
        num(PLOT_W),
        num(LANE_H)
    );
    bottom + 24.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The category layers of the summarized allocations stack up to the requested total.
    #[test]
    fn category_layers_reach_the_requested_total() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/synth/train-oom-forward.pickle");
        let loaded = crate::snapshot::load(&path).expect("fixture");
        let snapshot = &loaded.snapshot;
        let replay = replay_device(snapshot, 0);
        let allocs = &replay.allocations;
        let phases = phases_of(snapshot, 0, &replay);
        let categorizer = Categorizer::new(snapshot, &phases, &replay);
        let cats: Vec<_> = allocs.iter().map(|a| categorizer.categorize(a)).collect();
        let mut order: Vec<usize> = (0..allocs.len())
            .filter(|&i| allocs[i].requested_bytes > 0)
            .collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(allocs[i].requested_bytes), i));
        let rest = order.split_off(50);
        let mut drawn = order;
        drawn.sort_unstable();
        let (_, drawn_total) = stack_series(&replay, &drawn);
        let layers = RestLayers::new(allocs.as_slice(), &rest, &cats, ColourBy::Category);
        assert!(layers.layers.len() >= 3, "{:?}", layers.layers);
        let (x, _) = XScale::new(&replay, snapshot, XAxis::Events);
        let cols = Columns::new(1.0);
        let drawn_at = drawn_levels(x.n, &drawn_total);
        let tops = layers.tops(&x, cols, &drawn_at);
        let requested = column_max(&x, cols, curve_levels(&replay.requested));
        assert_eq!(tops.last(), Some(&requested));
        for pair in tops.windows(2) {
            assert!(pair[0].iter().zip(&pair[1]).all(|(a, b)| a <= b));
        }
    }
}
