//! Shared pieces of the SVG pictures (`timeline`, `segments`): XML escaping, fixed number
//! formatting, the call-site palette, axis ticks, tooltips and the document frame.
//!
//! The XML is written by hand so that the bytes are fully under control: same input → same bytes
//! (no hash-map order, numbers always with at most one decimal), and nothing but plain SVG 1.1
//! shapes, `<title>` tooltips and one `<pattern>` (no script, no external resource).

use std::fmt::Write;

use crate::analysis::callsite::{call_site, code_path, stack_lines, CodePath, FrameClass};
use crate::analysis::category::{Categorizer, Category, Confidence};
use crate::analysis::lifetimes::Allocation;
use crate::analysis::phase::{Phase, Source};
use crate::snapshot::{Interner, Snapshot, StackId};
use crate::units::format_bytes;

/// Width of the picture in user units (the viewBox); it scales to 100% of its container.
pub const WIDTH: f64 = 1200.0;
/// Left margin: room for the y-axis labels.
pub const LEFT: f64 = 84.0;
/// Right margin.
pub const RIGHT: f64 = 24.0;
/// Width of the plotting area.
pub const PLOT_W: f64 = WIDTH - LEFT - RIGHT;

/// Fonts: a proportional one for prose, a monospace one for code (call sites), whose width per
/// character is predictable (0.6 em) so that labels can be cut to fit.
pub const SANS: &str = "Helvetica, Arial, 'DejaVu Sans', 'Liberation Sans', sans-serif";
pub const MONO: &str = "'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace";

/// Colours of call sites: distinct hues from the Tableau palettes, without reds (kept for OOM
/// and rounding waste) and greys (kept for the summarized band and merged shapes).
pub const PALETTE: [&str; 16] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#9c755f", "#ff9da7",
    "#a0cbe8", "#ffbe7d", "#8cd17d", "#d4a6c8", "#17becf", "#bcbd22", "#393b79", "#e377c2",
];
/// Summarized allocations, merged small shapes.
pub const GREY: &str = "#bab0ac";
/// OOM marks, failed requests, rounding waste.
pub const RED: &str = "#d62728";
pub const INK: &str = "#222";
pub const MUTED: &str = "#555";
pub const GRID: &str = "#e3e3e3";

/// Colours of memory categories: the Okabe–Ito palette (distinguishable with the common forms
/// of colour blindness), without its vermillion (too close to the OOM red) and yellow (too pale
/// on white); unknown is a mid grey, darker than the [`GREY`] of merged shapes.
pub fn category_colour(c: Category) -> &'static str {
    match c {
        Category::Weights => "#0072b2",
        Category::Activations => "#e69f00",
        Category::Gradients => "#009e73",
        Category::OptimizerState => "#cc79a7",
        Category::Temporary => "#56b4e9",
        Category::KvCache => "#d55e00",
        Category::Unknown => "#8c8c8c",
    }
}

/// Position of a category in [`Category::ALL`] (the fixed stacking and legend order).
pub fn category_index(c: Category) -> usize {
    Category::ALL.iter().position(|&x| x == c).unwrap_or(0)
}

/// `category: activations (confidence high)`.
pub fn category_line(c: (Category, Confidence)) -> String {
    format!("category: {} (confidence {})", c.0.name(), c.1.name())
}

/// Phases in the fixed order of legends and tooltips.
pub const PHASES: [Phase; 6] = Phase::ALL;

/// Colours of the phase band (Paul Tol's muted scheme, apart from the category colours) and
/// the colour of a label drawn on them.
pub fn phase_colour(p: Phase) -> (&'static str, &'static str) {
    match p {
        Phase::Load => ("#ddcc77", INK),
        Phase::Forward => ("#88ccee", INK),
        Phase::Backward => ("#44aa99", INK),
        Phase::Optimizer => ("#aa4499", "#ffffff"),
        Phase::Eval => ("#999933", INK),
        Phase::Unknown => ("#dddddd", INK),
    }
}

/// A phase's short name for narrow intervals.
pub fn phase_abbrev(p: Phase) -> &'static str {
    match p {
        Phase::Load => "load",
        Phase::Forward => "fwd",
        Phase::Backward => "bwd",
        Phase::Optimizer => "opt",
        Phase::Eval => "eval",
        Phase::Unknown => "?",
    }
}

/// How a phase was found, for tooltips.
pub fn source_text(s: Source) -> &'static str {
    match s {
        Source::Annotation => "record_function annotations",
        Source::UserMetadata => "user metadata of the trace entries",
        Source::Frames => "the allocations' stack frames",
        Source::Position => "position (frameless allocations: autograd's backward thread)",
        Source::StepPosition => "position in the step only (no stacks; low confidence)",
        Source::None => "no evidence",
    }
}

/// What the allocations are coloured by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColourBy {
    /// Memory category (weights, activations, gradients, optimizer state, temporary, unknown),
    /// from the phases of the trace.
    Category,
    /// Call site (the innermost frame of user code).
    CallSite,
}

/// The colouring to use: the one asked for, else by category when at least one allocation has
/// a known category, else by call site.
pub fn choose_colour_by(
    asked: Option<ColourBy>,
    mut categories: impl Iterator<Item = Category>,
) -> ColourBy {
    match asked {
        Some(c) => c,
        None if categories.any(|c| c != Category::Unknown) => ColourBy::Category,
        None => ColourBy::CallSite,
    }
}

/// Escapes text for XML content and attribute values; drops characters XML 1.0 forbids.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' => out.push(c),
            '\r' => {}
            c if (c as u32) < 0x20 => out.push(' '),
            '\u{FFFE}' | '\u{FFFF}' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A coordinate with at most one decimal (`12`, `12.5`, `-3.1`); never `-0`, never NaN.
pub fn num(v: f64) -> String {
    let tenths = if v.is_finite() {
        (v * 10.0).round()
    } else {
        0.0
    };
    let tenths = tenths.clamp(-1e15, 1e15) as i64;
    let sign = if tenths < 0 { "-" } else { "" };
    let a = tenths.unsigned_abs();
    if a.is_multiple_of(10) {
        format!("{sign}{}", a / 10)
    } else {
        format!("{sign}{}.{}", a / 10, a % 10)
    }
}

/// Tenths of a user unit: the resolution every coordinate is written at.
pub fn tenths(v: f64) -> i64 {
    if v.is_finite() {
        (v * 10.0).round().clamp(-1e15, 1e15) as i64
    } else {
        0
    }
}

/// Writes a point list from tenths, dropping repeated points and the middle of collinear
/// vertical or horizontal runs.
pub fn points(out: &mut String, pts: &[(i64, i64)]) {
    let mut kept: Vec<(i64, i64)> = Vec::with_capacity(pts.len());
    for &p in pts {
        if kept.last() == Some(&p) {
            continue;
        }
        if kept.len() >= 2 {
            let a = kept[kept.len() - 2];
            let b = kept[kept.len() - 1];
            if (a.0 == b.0 && b.0 == p.0) || (a.1 == b.1 && b.1 == p.1) {
                let last = kept.len() - 1;
                kept[last] = p;
                continue;
            }
        }
        kept.push(p);
    }
    for (i, (x, y)) in kept.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{},{}", num(*x as f64 / 10.0), num(*y as f64 / 10.0));
    }
}

/// 64-bit FNV-1a: a stable hash (same text → same colour, on every machine, in every version).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The palette colour of a text (a call site).
pub fn colour_of_text(text: &str) -> &'static str {
    PALETTE[(fnv1a(text.as_bytes()) % PALETTE.len() as u64) as usize]
}

/// Call sites, categories and colours of allocations.
pub struct Colours<'a> {
    pub interner: &'a Interner,
    /// Colours given to the sites a legend shows, distinct from each other.
    assigned: std::collections::BTreeMap<String, &'static str>,
    categorizer: Option<Categorizer<'a>>,
    by: ColourBy,
    /// Call sites by stack, each worked out once (a long trace has millions of allocations
    /// and a few thousand stacks).
    sites: crate::analysis::callsite::CallSites<'a>,
}

impl<'a> Colours<'a> {
    /// Colours by call site, without categories.
    pub fn new(interner: &'a Interner) -> Self {
        Colours {
            interner,
            assigned: Default::default(),
            categorizer: None,
            by: ColourBy::CallSite,
            sites: crate::analysis::callsite::CallSites::new(interner),
        }
    }

    /// Colours by call site or category, with the categories of `categorizer`.
    pub fn with_categories(
        interner: &'a Interner,
        categorizer: Categorizer<'a>,
        by: ColourBy,
    ) -> Self {
        Colours {
            interner,
            assigned: Default::default(),
            categorizer: Some(categorizer),
            by,
            sites: crate::analysis::callsite::CallSites::new(interner),
        }
    }

    pub fn by(&self) -> ColourBy {
        self.by
    }

    /// The category of an allocation (unknown without a categorizer).
    pub fn category(&self, a: &Allocation) -> (Category, Confidence) {
        match &self.categorizer {
            Some(c) => c.categorize(a),
            None => (Category::Unknown, Confidence::Low),
        }
    }

    /// Gives the legend's call sites (most important first) distinct colours: each starts at
    /// its hashed colour and takes the next one not yet taken. Other sites keep their hashed
    /// colour. Deterministic: depends only on the list.
    pub fn assign_distinct(&mut self, sites: &[String]) {
        for site in sites.iter().take(PALETTE.len()) {
            if self.assigned.contains_key(site) {
                continue;
            }
            let start = (fnv1a(site.as_bytes()) % PALETTE.len() as u64) as usize;
            let free = (0..PALETTE.len())
                .map(|k| PALETTE[(start + k) % PALETTE.len()])
                .find(|c| !self.assigned.values().any(|t| t == c));
            if let Some(c) = free {
                self.assigned.insert(site.clone(), c);
            }
        }
    }

    /// The colour of a call site.
    pub fn site_colour(&self, site: &str) -> &'static str {
        self.assigned
            .get(site)
            .copied()
            .unwrap_or_else(|| colour_of_text(site))
    }

    /// The call site of an allocation, if its stack was recorded.
    pub fn site(&self, a: &Allocation) -> Option<String> {
        self.sites.of(a.stack).map(|s| s.to_string())
    }

    /// The colour an allocation is drawn in: its category's ([`category_colour`]), or its call
    /// site (hashed into [`PALETTE`]); without a stack, its address and birth, so that
    /// neighbours still differ.
    pub fn colour_for(&self, a: &Allocation) -> &'static str {
        if self.by == ColourBy::Category {
            return category_colour(self.category(a).0);
        }
        match self.site(a) {
            Some(site) => self.site_colour(&site),
            None => self.colour_for_stackless(a.address, a.alloc_event),
        }
    }

    /// Colour of a block known only by its stack (a dump block with no allocation record):
    /// its call site's, or the unknown category's.
    pub fn colour_for_stack(&self, stack: StackId, address: u64) -> &'static str {
        if self.by == ColourBy::Category {
            return category_colour(Category::Unknown);
        }
        match call_site(self.interner, stack) {
            Some(site) => self.site_colour(&site),
            None => self.colour_for_stackless(address, None),
        }
    }

    fn colour_for_stackless(&self, address: u64, born: Option<u32>) -> &'static str {
        let mut key = address.to_le_bytes().to_vec();
        key.extend_from_slice(&born.map_or(u64::MAX, u64::from).to_le_bytes());
        PALETTE[(fnv1a(&key) % PALETTE.len() as u64) as usize]
    }
}

/// The devices a picture shows: those with segments or trace entries, or only `want`.
pub fn devices(snapshot: &Snapshot, want: Option<i64>) -> anyhow::Result<Vec<i64>> {
    let all: Vec<i64> = snapshot
        .devices()
        .into_iter()
        .filter(|&d| !snapshot.trace(d).is_empty() || snapshot.segments_of(d).next().is_some())
        .collect();
    match want {
        None => Ok(all),
        Some(d) if all.contains(&d) => Ok(vec![d]),
        Some(d) => {
            let list: Vec<String> = all.iter().map(|d| d.to_string()).collect();
            anyhow::bail!(
                "device {d} has no segments and no trace entries in this snapshot (devices: {})",
                if list.is_empty() {
                    "none".to_owned()
                } else {
                    list.join(", ")
                }
            )
        }
    }
}

/// Cuts `text` to at most `max` characters, keeping its end (the informative part of a path).
pub fn cut_left(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_owned();
    }
    let keep = max.saturating_sub(1);
    let tail: String = text.chars().skip(n - keep).collect();
    format!("…{tail}")
}

/// Cuts `text` to at most `max` characters, keeping its start.
pub fn cut_right(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{head}…")
}

/// Splits `text` at spaces into lines of at most `max` characters (longer words stay whole).
pub fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > max {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// `12.0MiB (12582912 bytes)`.
pub fn bytes_exact(b: u64) -> String {
    format!("{} ({b} bytes)", format_bytes(b))
}

/// At most this many stack lines in a tooltip.
pub const STACK_LINES: usize = 6;
/// Longest line in a tooltip.
const TOOLTIP_LINE: usize = 120;

/// The call site and a short stack, as tooltip lines.
pub fn stack_tooltip(interner: &Interner, stack: StackId, fallback: &str) -> Vec<String> {
    let mut lines = Vec::new();
    match call_site(interner, stack) {
        Some(site) => lines.push(format!("call site: {}", cut_left(&site, TOOLTIP_LINE))),
        None => lines.push(fallback.to_owned()),
    }
    lines.extend(code_path_line(&code_path(interner, stack)));
    let stack = stack_lines(interner, stack);
    if !stack.is_empty() {
        lines.push("stack (innermost first):".to_owned());
        for l in stack.iter().take(STACK_LINES) {
            lines.push(format!("  {}", cut_left(l, TOOLTIP_LINE)));
        }
        if stack.len() > STACK_LINES {
            lines.push(format!("  … {} more frames", stack.len() - STACK_LINES));
        }
    }
    lines
}

/// Whose code made the allocation and what it went through, as the report's tables say it:
/// "your code, via transformers → torch.nn.functional.linear", "package code, from your
/// train.py:40:main", "package code only".
pub fn code_path_line(path: &CodePath) -> Option<String> {
    let whose = match (path.class?, &path.your_code) {
        (FrameClass::User, _) => "your code".to_owned(),
        (FrameClass::Package, Some(y)) => format!("package code, from your {y}"),
        (FrameClass::Package, None) => "package code only".to_owned(),
        (FrameClass::Runtime, _) => "runtime code only".to_owned(),
    };
    Some(match &path.via {
        Some(via) => cut_right(&format!("{whose}, via {via}"), TOOLTIP_LINE),
        None => cut_right(&whose, TOOLTIP_LINE),
    })
}

/// `<title>` element with the lines joined by newlines (browsers show them as a tooltip).
pub fn title(lines: &[String]) -> String {
    format!("<title>{}</title>", esc(&lines.join("\n")))
}

/// Byte ticks in binary units: a power-of-two step giving 3–8 ticks whose labels
/// ([`format_bytes`], one decimal) are exact. Returns (step, axis maximum).
pub fn byte_ticks(max: u64) -> (u64, u64) {
    let max = max.max(1024);
    let mut step: u64 = 1;
    while step.saturating_mul(8) < max {
        step = step.saturating_mul(2);
    }
    let exact = |v: u64| {
        let mut unit: u64 = 1;
        while v >= unit.saturating_mul(1024) && unit < (1u64 << 60) {
            unit *= 1024;
        }
        // One decimal is exact when v is a multiple of unit/10 … in binary: unit/2 always,
        // and any multiple of unit/1024 that prints back to itself.
        let tenths = (v as f64 / unit as f64 * 10.0).round();
        (tenths / 10.0 * unit as f64 - v as f64).abs() < 0.5
    };
    loop {
        let top = max.div_ceil(step).saturating_mul(step);
        let all_exact = (0..=top / step).all(|i| exact(i * step));
        if all_exact || step >= (1u64 << 62) {
            return (step, top);
        }
        step = step.saturating_mul(2);
    }
}

/// A "nice" step (1, 2 or 5 × 10ⁿ) giving at most `max_ticks` ticks over `[0, span]`.
pub fn nice_step(span: f64, max_ticks: usize) -> f64 {
    if span.is_nan() || span <= 0.0 {
        return 1.0;
    }
    let raw = span / max_ticks.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * mag >= raw {
            return m * mag;
        }
    }
    10.0 * mag
}

/// `950`, `12k`, `1.5M` for event counts.
pub fn fmt_count(v: f64) -> String {
    let v = v.round();
    if v.abs() < 10_000.0 {
        format!("{v:.0}")
    } else if v.abs() < 1e6 {
        trim_zero(format!("{:.1}", v / 1e3)) + "k"
    } else {
        trim_zero(format!("{:.1}", v / 1e6)) + "M"
    }
}

/// Seconds with as many decimals as the tick step needs.
pub fn fmt_seconds(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}s")
}

fn trim_zero(s: String) -> String {
    match s.strip_suffix(".0") {
        Some(t) => t.to_owned(),
        None => s,
    }
}

/// Hatch pattern for free memory (holes).
pub const HATCH_ID: &str = "snapscan-hatch";
/// Stripes of several palette colours: the legend swatch of "colour by address".
pub const MIXED_ID: &str = "snapscan-mixed";
pub const MIXED_FILL: &str = "url(#snapscan-mixed)";
/// Stripes of a category's colour: its summarized allocations (`url(#snapscan-rest-weights)`).
pub const REST_ID: &str = "snapscan-rest-";
pub fn rest_fill(c: Category) -> String {
    format!("url(#{REST_ID}{})", c.name())
}
/// Legend text of allocations without a recorded stack.
pub const NO_STACK: &str = "<no stack recorded: colours by address>";

/// The outer document around panels of total height `height`. It is as wide as its container
/// (`width="100%"`) with the height following the viewBox's aspect ratio, so that a tall
/// picture opened on its own scrolls instead of shrinking to the window's height.
pub fn document(title_text: &str, height: f64, body: &str) -> Vec<u8> {
    let h = num(height);
    let mut out = String::with_capacity(body.len() + 1024);
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {} {h}\" width=\"100%\" \
         style=\"height:auto;aspect-ratio:{}/{h}\" \
         font-family=\"{}\" font-size=\"13\" fill=\"{INK}\">",
        num(WIDTH),
        num(WIDTH),
        esc(SANS)
    );
    let _ = writeln!(out, "<title>{}</title>", esc(title_text));
    let _ = write!(
        out,
        "<defs><pattern id=\"{HATCH_ID}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
         patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ffffff\"/>\
         <rect width=\"2\" height=\"6\" fill=\"#b4b4b4\"/></pattern>\
         <pattern id=\"{MIXED_ID}\" width=\"12\" height=\"12\" patternUnits=\"userSpaceOnUse\">\
         <rect width=\"3\" height=\"12\" fill=\"{}\"/><rect x=\"3\" width=\"3\" height=\"12\" fill=\"{}\"/>\
         <rect x=\"6\" width=\"3\" height=\"12\" fill=\"{}\"/><rect x=\"9\" width=\"3\" height=\"12\" fill=\"{}\"/>\
         </pattern>",
        PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3]
    );
    // Summarized allocations of a category: its colour, pale, with stripes of it.
    for c in Category::ALL {
        let _ = write!(
            out,
            "<pattern id=\"{REST_ID}{}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
             patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"{col}\" fill-opacity=\"0.35\"/>\
             <rect width=\"2\" height=\"6\" fill=\"{col}\"/></pattern>",
            c.name(),
            col = category_colour(c)
        );
    }
    out.push_str("</defs>\n");
    let _ = writeln!(
        out,
        "<rect width=\"{}\" height=\"{h}\" fill=\"#ffffff\"/>",
        num(WIDTH)
    );
    out.push_str(body);
    out.push_str("</svg>\n");
    out.into_bytes()
}

/// A text element.
pub fn text(out: &mut String, x: f64, y: f64, size: u32, attrs: &str, content: &str) {
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"{size}\"{}{attrs}>{}</text>",
        num(x),
        num(y),
        if attrs.is_empty() { "" } else { " " },
        esc(content)
    );
}

/// A generous estimate of the width of `content` in the proportional font (wider than
/// Helvetica, Arial and DejaVu Sans draw it, so that text estimated to fit does fit).
pub fn text_width(content: &str, size: u32, bold: bool) -> f64 {
    let em = if bold { 0.66 } else { 0.6 };
    content.chars().count() as f64 * f64::from(size) * em
}

/// A text element that never runs past the right margin: when it would, it is squeezed to the
/// room that is left (`textLength`), the way a long title must still end inside the picture.
pub fn text_fit(out: &mut String, x: f64, y: f64, size: u32, attrs: &str, content: &str) {
    let room = WIDTH - RIGHT - x;
    let bold = attrs.contains("bold");
    if text_width(content, size, bold) <= room {
        return text(out, x, y, size, attrs, content);
    }
    let squeeze = format!(
        "textLength=\"{}\" lengthAdjust=\"spacingAndGlyphs\"{}{attrs}",
        num(room),
        if attrs.is_empty() { "" } else { " " }
    );
    text(out, x, y, size, &squeeze, content)
}

/// A heading `{name}{suffix}` that fits the width: the file name is cut at its start (`…`) so
/// that the suffix (which device, which picture) always shows, then [`text_fit`].
pub fn heading(out: &mut String, y: f64, size: u32, name: &str, suffix: &str) {
    let room = WIDTH - RIGHT - LEFT;
    let per_char = text_width("x", size, true);
    let fits = (room / per_char).floor() as usize;
    let keep = fits.saturating_sub(suffix.chars().count()).max(12);
    let content = format!("{}{suffix}", cut_left(name, keep));
    text_fit(out, LEFT, y, size, "font-weight=\"bold\"", &content);
}

/// Font size of legend entries, and the width of one monospace character at that size.
pub const LEGEND_FONT: u32 = 13;
pub const LEGEND_CHAR_W: f64 = 7.9;

/// A legend entry: swatch (`fill` or a pattern URL) and label.
pub fn legend_swatch(out: &mut String, x: f64, y: f64, fill: &str, label: &str, mono: bool) {
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"14\" fill=\"{}\" stroke=\"{MUTED}\" stroke-width=\"0.5\"/>",
        num(x),
        num(y - 11.0),
        esc(fill)
    );
    let attrs = if mono {
        format!("font-family=\"{}\"", esc(MONO))
    } else {
        String::new()
    };
    text(out, x + 20.0, y, LEGEND_FONT, &attrs, label);
}

/// The legend of memory categories: a bold `heading`, then each category present in three
/// columns with its bytes and share of `total`. Returns the y below it.
pub fn category_legend(
    out: &mut String,
    mut y: f64,
    heading: &str,
    present: &[bool],
    bytes: &[u64],
    total: u64,
) -> f64 {
    text(out, LEFT, y, 13, "font-weight=\"bold\"", heading);
    y += 22.0;
    let col_w = PLOT_W / 3.0;
    let mut j = 0;
    for (k, &c) in Category::ALL.iter().enumerate() {
        if !present[k] {
            continue;
        }
        let share = if total > 0 {
            format!(" ({:.0}%)", bytes[k] as f64 / total as f64 * 100.0)
        } else {
            String::new()
        };
        legend_swatch(
            out,
            LEFT + (j % 3) as f64 * col_w,
            y + (j / 3) as f64 * 20.0,
            category_colour(c),
            &format!("{}  {}{share}", c.name(), format_bytes(bytes[k])),
            false,
        );
        j += 1;
    }
    y + (j as f64 / 3.0).ceil() * 20.0
}

/// Entry `j` of the two-column call-site legend whose first row is at `y`: the site's colour,
/// the site cut from the left to fit, then `suffix`.
pub fn site_legend_entry(
    out: &mut String,
    colours: &Colours<'_>,
    j: usize,
    y: f64,
    site: &str,
    suffix: &str,
) {
    let colour = if site == NO_STACK {
        MIXED_FILL
    } else {
        colours.site_colour(site)
    };
    let col_w = PLOT_W / 2.0;
    let room = ((col_w - 30.0) / LEGEND_CHAR_W) as usize;
    let label = format!(
        "{}{suffix}",
        cut_left(site, room.saturating_sub(suffix.chars().count()))
    );
    legend_swatch(
        out,
        LEFT + (j % 2) as f64 * col_w,
        y + (j / 2) as f64 * 20.0,
        colour,
        &label,
        true,
    );
}

/// Safe file-name stems for the pictures of several input files: `timeline-<stem>.svg`.
/// Names are made of `[A-Za-z0-9._-]`; duplicates get `-2`, `-3`, …
pub fn picture_stems(names: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    let mut taken: rustc_hash::FxHashSet<String> = Default::default();
    let mut next: rustc_hash::FxHashMap<String, usize> = Default::default();
    for name in names {
        let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
        let mut stem = base.to_owned();
        for ext in [".gz", ".zst", ".zstd", ".pickle", ".pkl", ".json"] {
            if let Some(s) = stem.strip_suffix(ext) {
                stem = s.to_owned();
            }
        }
        let mut stem: String = stem
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        stem = stem.trim_matches('.').to_owned();
        if stem.is_empty() {
            stem = "snapshot".to_owned();
        }
        // The names taken, and per stem the next number to try (the numbers below it are taken
        // and stay taken): linear in the names, where searching `out` for each candidate took
        // 3.5 s for 2 000 inputs `rankN/x.pickle`.
        let n = next.entry(stem.clone()).or_insert(2);
        let mut candidate = stem.clone();
        while taken.contains(&candidate) {
            candidate = format!("{stem}-{n}");
            *n += 1;
        }
        taken.insert(candidate.clone());
        out.push(candidate);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_one_decimal_at_most() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(-0.04), "0");
        assert_eq!(num(12.25), "12.3");
        assert_eq!(num(-3.26), "-3.3");
        assert_eq!(num(7.0), "7");
        assert_eq!(num(f64::NAN), "0");
    }

    #[test]
    fn escapes_markup_and_control_characters() {
        assert_eq!(esc("a<b>&\"c'\u{1}"), "a&lt;b&gt;&amp;&quot;c&#39; ");
    }

    #[test]
    fn byte_ticks_are_exact() {
        let gib = 1u64 << 30;
        assert_eq!(byte_ticks(13 * gib + gib / 5), (2 * gib, 14 * gib));
        let (step, top) = byte_ticks(gib + gib / 3);
        assert_eq!(step, gib / 2);
        assert_eq!(top, 3 * gib / 2);
        assert_eq!(byte_ticks(0).0, 128);
    }

    #[test]
    fn counts_and_steps() {
        assert_eq!(fmt_count(950.0), "950");
        assert_eq!(fmt_count(12_000.0), "12k");
        assert_eq!(fmt_count(1_500_000.0), "1.5M");
        assert_eq!(nice_step(5163.0, 10), 1000.0);
        assert_eq!(nice_step(0.9, 10), 0.1);
        assert_eq!(fmt_seconds(0.25, 0.05), "0.25s");
    }

    #[test]
    fn collinear_points_merge() {
        let mut s = String::new();
        points(
            &mut s,
            &[(0, 0), (10, 0), (20, 0), (20, 10), (20, 20), (20, 20)],
        );
        assert_eq!(s, "0,0 2,0 2,2");
    }

    #[test]
    fn stems_are_safe_and_unique() {
        let names = vec![
            "runs/rank0.pickle".to_owned(),
            "other/rank0.pickle.gz".to_owned(),
            "<stdin>".to_owned(),
        ];
        assert_eq!(picture_stems(&names), vec!["rank0", "rank0-2", "_stdin_"]);
        let names: Vec<String> = ["a/x", "b/x", "c/x-2", "d/x", "e/x-2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            picture_stems(&names),
            vec!["x", "x-2", "x-2-2", "x-3", "x-2-3"]
        );
    }

    #[test]
    fn legend_colours_are_distinct() {
        let interner = Interner::default();
        let mut c = Colours::new(&interner);
        let sites: Vec<String> = (0..20).map(|i| format!("model.py:{i}:forward")).collect();
        c.assign_distinct(&sites);
        let mut used: Vec<&str> = sites.iter().take(16).map(|s| c.site_colour(s)).collect();
        used.sort_unstable();
        used.dedup();
        assert_eq!(used.len(), 16);
    }

    #[test]
    fn wraps_at_spaces() {
        assert_eq!(wrap("aa bb cc dd", 5), vec!["aa bb", "cc dd"]);
        assert_eq!(wrap("abcdefgh ij", 4), vec!["abcdefgh", "ij"]);
        assert!(wrap("", 10).is_empty());
    }

    #[test]
    fn category_colours_are_distinct_and_default_follows_categories() {
        let mut c: Vec<&str> = Category::ALL.iter().map(|&c| category_colour(c)).collect();
        c.sort_unstable();
        c.dedup();
        assert_eq!(c.len(), Category::ALL.len());
        assert!(!c.contains(&RED) && !c.contains(&GREY));
        assert_eq!(
            choose_colour_by(None, [Category::Unknown].into_iter()),
            ColourBy::CallSite
        );
        assert_eq!(
            choose_colour_by(None, [Category::Unknown, Category::Weights].into_iter()),
            ColourBy::Category
        );
        assert_eq!(
            choose_colour_by(Some(ColourBy::CallSite), [Category::Weights].into_iter()),
            ColourBy::CallSite
        );
    }

    #[test]
    fn colours_are_stable() {
        assert_eq!(
            colour_of_text("train.py:42:step"),
            colour_of_text("train.py:42:step")
        );
        assert!(PALETTE.contains(&colour_of_text("x")));
    }
}
