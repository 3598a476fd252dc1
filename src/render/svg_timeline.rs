//! `snapscan timeline`: the memory timeline as a self-contained SVG, like memory_viz's "Active
//! Memory Timeline" (snapshot-format.md §10.2).
//!
//! Each allocation is a band whose height is its requested size. Bands are stacked in allocation
//! order: allocations made before the trace window at the bottom (the ones freed last lowest),
//! then every traced allocation on top of what is alive when it is made. An allocation keeps its
//! height above the ground while alive; when one below it is freed, the ones above drop down
//! (memory_viz animates this over 3 steps; here it happens at the free). The `detail` largest
//! allocations (by requested bytes) get their own polygon with a tooltip; all the others are
//! one grey band on top whose upper edge is the total requested memory. The x axis counts trace
//! events (each entry is one step; the state after `k` events is drawn on `[k, k+1)`), or shows
//! seconds. Reserved bytes are a dashed line, the requested peak (including the level at window
//! start) is marked, and OOM entries are red vertical lines.
//!
//! Size is bounded whatever the input: at most [`MAX_DETAIL`] polygons per file, and every series
//! is reduced to its maximum per pixel column (coarser columns if a file would exceed
//! [`POINT_BUDGET`] points).

use std::fmt::Write;

use rayon::prelude::*;

use super::svg::{self, num, tenths, Colours, GREY, GRID, INK, LEFT, MUTED, PLOT_W, RED};
use crate::analysis::replay::{replay_device, Allocation, DeviceReplay, Origin};
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
}

impl Default for TimelineOptions {
    fn default() -> Self {
        TimelineOptions {
            device: None,
            x: XAxis::Events,
            detail: DEFAULT_DETAIL,
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
    let panels: Vec<(String, f64)> = devices
        .par_iter()
        .map(|&d| panel(name, snapshot, d, options.x, detail, budget))
        .collect();
    let mut body = String::new();
    let mut y = 0.0;
    if panels.is_empty() {
        svg::text(
            &mut body,
            LEFT,
            40.0,
            16,
            "font-weight=\"bold\"",
            &format!("{name}: no device has segments or trace entries; nothing to draw"),
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
fn column_max(x: &XScale, cols: Columns, level: impl Fn(usize) -> i64) -> Vec<i64> {
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

struct Shapes {
    /// (points, allocation index) of drawn allocations, in stack order of birth.
    polygons: Vec<(Vec<(i64, i64)>, usize)>,
    band: Vec<(i64, i64)>,
    reserved: Vec<(i64, i64)>,
    points: usize,
}

fn shapes(
    replay: &DeviceReplay,
    x: &XScale,
    y: &YScale,
    series: &[Series],
    drawn_total: &[(usize, i64)],
    summarized: bool,
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
    let band = if summarized {
        let requested = |k: usize| replay.requested.at(k.checked_sub(1).map(|e| e as u32));
        let mut idx = 0usize;
        let mut drawn_at = Vec::with_capacity(x.n + 1);
        for k in 0..=x.n {
            while idx + 1 < drawn_total.len() && drawn_total[idx + 1].0 <= k {
                idx += 1;
            }
            drawn_at.push(drawn_total.get(idx).map_or(0, |d| d.1));
        }
        let top = column_max(x, cols, requested);
        let bottom = column_max(x, cols, |k| drawn_at[k]);
        let mut pts = edge(&top);
        let mut b = edge(&bottom);
        b.reverse();
        pts.extend(b);
        pts
    } else {
        Vec::new()
    };
    let reserved = edge(&column_max(x, cols, |k| {
        replay.reserved.at(k.checked_sub(1).map(|e| e as u32))
    }));
    count += band.len() + reserved.len();
    Shapes {
        polygons,
        band,
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

fn tooltip(snapshot: &Snapshot, replay: &DeviceReplay, a: &Allocation) -> Vec<String> {
    let mut lines = Vec::new();
    let mut head = format!("{} requested", svg::bytes_exact(a.requested_bytes));
    if a.block_bytes != a.requested_bytes {
        let _ = write!(head, ", block {}", format_bytes(a.block_bytes));
    }
    lines.push(head);
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
            svg::origin_label(a)
        };
    lines.extend(svg::stack_tooltip(&snapshot.interner, a.stack, fallback));
    if a.origin == Origin::FreedInWindow && a.stack != crate::snapshot::StackId::EMPTY {
        lines.push("(allocated before the window: the stack is the free's)".to_owned());
    }
    lines
}

fn panel(
    name: &str,
    snapshot: &Snapshot,
    device: i64,
    axis: XAxis,
    detail: usize,
    budget: usize,
) -> (String, f64) {
    let replay = replay_device(snapshot, device);
    let trace = snapshot.trace(device);
    let allocs = &replay.allocations;
    let mut colours = Colours::new(&snapshot.interner);
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

    let (peak, peak_event) = replay.requested.peak();
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
        !rest.is_empty(),
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
            !rest.is_empty(),
            Columns::new(width),
        );
    }

    let mut out = String::new();
    let right = LEFT + PLOT_W;
    let bottom = PLOT_TOP + PLOT_H;

    // Heading.
    svg::text(
        &mut out,
        LEFT,
        26.0,
        17,
        "font-weight=\"bold\"",
        &format!(
            "{} — device {device}: memory timeline",
            svg::cut_left(name, 90)
        ),
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
    svg::text(&mut out, LEFT, 48.0, 13, "", &line1);
    let mut line2 = format!(
        "Stacked requested bytes of live allocations: the {} largest of {} drawn one by one (≥ {}), ",
        drawn.len(),
        allocs.len(),
        format_bytes(smallest_drawn)
    );
    if rest.is_empty() {
        line2.push_str("none summarized. ");
    } else {
        let _ = write!(line2, "{} smaller ones in the grey band. ", rest.len());
    }
    line2.push_str("Hover a shape for size, lifetime and stack.");
    if time_missing {
        line2.push_str(" (No timestamps: x in events.)");
    }
    svg::text(
        &mut out,
        LEFT,
        67.0,
        13,
        &format!("fill=\"{MUTED}\""),
        &line2,
    );

    // Grid and y axis.
    let mut v = 0u64;
    while v <= ymax {
        let py = y.py(bytes_i64(v));
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{GRID}\"/>",
            num(LEFT),
            num(py),
            num(right),
            num(py)
        );
        svg::text(
            &mut out,
            LEFT - 6.0,
            py + 4.0,
            12,
            "text-anchor=\"end\"",
            &format_bytes(v),
        );
        v = match v.checked_add(ystep) {
            Some(n) => n,
            None => break,
        };
    }
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
        bottom + 38.0,
        13,
        &format!("text-anchor=\"middle\" fill=\"{MUTED}\""),
        xtitle,
    );
    let _ = writeln!(
        out,
        "<text transform=\"translate(16,{}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" fill=\"{MUTED}\">bytes (binary units)</text>",
        num(PLOT_TOP + PLOT_H / 2.0)
    );

    // Allocations.
    out.push_str("<g stroke=\"#ffffff\" stroke-width=\"0.3\" stroke-opacity=\"0.7\">\n");
    for (pts, a) in &sh.polygons {
        let alloc = &allocs[*a];
        out.push_str("<polygon points=\"");
        svg::points(&mut out, pts);
        let _ = write!(out, "\" fill=\"{}\">", colours.colour_for(alloc));
        out.push_str(&svg::title(&tooltip(snapshot, &replay, alloc)));
        out.push_str("</polygon>\n");
    }
    out.push_str("</g>\n");
    if !sh.band.is_empty() {
        let largest_rest = rest.first().map_or(0, |&i| allocs[i].requested_bytes);
        out.push_str("<polygon points=\"");
        svg::points(&mut out, &sh.band);
        let _ = write!(out, "\" fill=\"{GREY}\" fill-opacity=\"0.85\">");
        let mut tip = vec![
            format!(
                "{} smaller allocations summarized (each ≤ {})",
                rest.len(),
                format_bytes(largest_rest)
            ),
            "the band's upper edge is the total requested memory".to_owned(),
        ];
        // Who is in the band at the peak.
        let mut at_peak: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for &i in &rest {
            let a = &allocs[i];
            if a.alive_after(peak_event) {
                let key = colours
                    .site(a)
                    .unwrap_or_else(|| svg::origin_label(a).to_owned());
                let g = at_peak.entry(key).or_insert((0, 0));
                g.0 = g.0.saturating_add(a.requested_bytes);
                g.1 += 1;
            }
        }
        let mut at_peak: Vec<(String, (u64, u64))> = at_peak.into_iter().collect();
        at_peak.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(&b.0)));
        if !at_peak.is_empty() {
            tip.push("in the band at the peak, by call site:".to_owned());
            for (site, (bytes, count)) in at_peak.iter().take(svg::STACK_LINES) {
                tip.push(format!(
                    "  {} in {count}: {}",
                    format_bytes(*bytes),
                    svg::cut_left(site, 100)
                ));
            }
            if at_peak.len() > svg::STACK_LINES {
                tip.push(format!(
                    "  … {} more call sites",
                    at_peak.len() - svg::STACK_LINES
                ));
            }
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
    let ly = if py_peak - 8.0 < PLOT_TOP + 14.0 {
        py_peak + 18.0
    } else {
        py_peak - 8.0
    };
    svg::text(
        &mut out,
        lx,
        ly,
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

    // Legend: the top call sites of the drawn allocations, then the other marks.
    let mut ly = bottom + 66.0;
    svg::text(
        &mut out,
        LEFT,
        ly,
        13,
        "font-weight=\"bold\"",
        "Colour = call site (largest drawn allocations first):",
    );
    ly += 22.0;
    let col_w = PLOT_W / 2.0;
    let shown = sites.len().min(LEGEND_SITES);
    for (j, (site, (_, count, largest))) in sites.iter().take(shown).enumerate() {
        let colour = if site == svg::NO_STACK {
            svg::MIXED_FILL
        } else {
            colours.site_colour(site)
        };
        let cx = LEFT + (j % 2) as f64 * col_w;
        let cy = ly + (j / 2) as f64 * 20.0;
        let suffix = format!("  ({count}×, largest {})", format_bytes(*largest));
        let room = ((col_w - 30.0) / svg::LEGEND_CHAR_W) as usize;
        let label = format!(
            "{}{suffix}",
            svg::cut_left(site, room.saturating_sub(suffix.chars().count()))
        );
        svg::legend_swatch(&mut out, cx, cy, colour, &label, true);
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
    // Marks.
    let mut mx = LEFT;
    if !rest.is_empty() {
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
    let height = ly + 22.0;
    (out, height)
}
