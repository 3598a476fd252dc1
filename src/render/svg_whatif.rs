//! `snapscan whatif --svg`: the reserved memory of the real run and of the what-if over the
//! trace's events, on one byte axis, with the capacity and every OOM marked.

use std::fmt::Write;

use super::svg::{self, esc, num, GRID, INK, LEFT, MUTED, PLOT_W, RED};
use crate::report::whatif::{WhatifDevice, WhatifOutput};
use crate::units::format_bytes;

const PANEL_H: f64 = 380.0;
const PLOT_TOP: f64 = 64.0;
const PLOT_H: f64 = 260.0;
const REAL: &str = "#4e79a7";
const WHATIF: &str = "#f28e2b";

/// Points of a step line from (event, level after it) pairs starting at `start`.
fn steps(
    start: u64,
    curve: &[(u32, u64)],
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(u64) -> f64,
    end: f64,
) -> String {
    let mut pts = String::new();
    let mut level = start;
    let _ = write!(pts, "{},{}", num(x(0.0)), num(y(level)));
    for &(e, v) in curve {
        let at = x(f64::from(e) + 1.0);
        let _ = write!(
            pts,
            " {},{} {},{}",
            num(at),
            num(y(level)),
            num(at),
            num(y(v))
        );
        level = v;
    }
    let _ = write!(pts, " {},{}", num(x(end)), num(y(level)));
    pts
}

fn panel(out: &mut String, top: f64, path: &str, d: &WhatifDevice, events: u64) {
    let y0 = top + PLOT_TOP;
    svg::heading(
        out,
        top + 24.0,
        15,
        path,
        &format!(
            " — device {}: reserved memory, real run and what if ({})",
            d.device,
            d.changes.join("; ")
        ),
    );
    let real = d.real.reserved_curve.as_deref().unwrap_or(&[]);
    let what = d.whatif.reserved_curve.as_deref().unwrap_or(&[]);
    let start = d.real_start_reserved;
    let top_bytes = [
        d.real.peak_reserved.bytes,
        d.whatif.peak_reserved.bytes,
        d.real.capacity_bytes.unwrap_or(0),
        d.whatif.capacity_bytes.unwrap_or(0),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let (ystep, ymax) = svg::byte_ticks(top_bytes.saturating_add(top_bytes / 16));
    let n = events.max(1) as f64;
    let x = |e: f64| LEFT + PLOT_W * (e / n).clamp(0.0, 1.0);
    let y = |b: u64| y0 + PLOT_H * (1.0 - b as f64 / ymax.max(1) as f64);
    let mut v = 0u64;
    while v <= ymax {
        let _ = writeln!(
            out,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{GRID}\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\" fill=\"{MUTED}\">{}</text>",
            num(LEFT),
            num(y(v)),
            num(LEFT + PLOT_W),
            num(y(v)),
            num(LEFT - 6.0),
            num(y(v) + 4.0),
            esc(&format_bytes(v))
        );
        v = match v.checked_add(ystep.max(1)) {
            Some(next) => next,
            None => break,
        };
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"11\" fill=\"{MUTED}\">trace event {}</text>",
        num(LEFT + PLOT_W),
        num(y0 + PLOT_H + 18.0),
        events
    );
    for (cap, label) in [
        (d.whatif.capacity_bytes, "capacity (what if)"),
        (d.real.capacity_bytes, "limit of the real run"),
    ] {
        if let Some(c) = cap {
            let _ = writeln!(
                out,
                "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{RED}\" stroke-dasharray=\"6 4\"><title>{} {}</title></line>",
                num(LEFT),
                num(y(c)),
                num(LEFT + PLOT_W),
                num(y(c)),
                esc(label),
                esc(&format_bytes(c))
            );
        }
    }
    for (curve, colour, name) in [(real, REAL, "real run"), (what, WHATIF, "what if")] {
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"><title>{name}</title></polyline>",
            steps(start, curve, &x, &y, n)
        );
    }
    for (ooms, colour) in [(&d.real.ooms, REAL), (&d.whatif.ooms, WHATIF)] {
        for o in ooms.iter().filter(|o| !o.fits) {
            let cx = x(f64::from(o.event) + 1.0);
            let _ = writeln!(
                out,
                "<path d=\"M{} {} l8 8 m0 -8 l-8 8\" stroke=\"{colour}\" stroke-width=\"2.5\"><title>OOM at event {}: {} request</title></path>",
                num(cx - 4.0),
                num(y0 - 12.0),
                o.event,
                esc(&format_bytes(o.request_bytes))
            );
        }
    }
    let legend_y = y0 + PLOT_H + 40.0;
    for (k, (colour, label)) in [
        (
            REAL,
            format!(
                "real run: peak {}",
                format_bytes(d.real.peak_reserved.bytes)
            ),
        ),
        (
            WHATIF,
            format!(
                "what if: peak {}",
                format_bytes(d.whatif.peak_reserved.bytes)
            ),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let lx = LEFT + k as f64 * 360.0;
        let _ = writeln!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\" fill=\"{INK}\">{}</text>",
            num(lx),
            num(legend_y - 6.0),
            num(lx + 20.0),
            num(legend_y),
            esc(&label)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" fill=\"{MUTED}\">✕ an OOM; dashed: the capacity</text>",
        num(LEFT + 720.0),
        num(legend_y)
    );
}

/// The picture of every device of every file, one panel each.
pub fn picture(r: &WhatifOutput) -> Vec<u8> {
    let mut body = String::new();
    let mut top = 0.0;
    for f in &r.files {
        for d in &f.devices {
            panel(&mut body, top, &f.path, d, d.events);
            top += PANEL_H;
        }
    }
    svg::document("snapscan what-if: reserved memory", top.max(PANEL_H), &body)
}
