//! `snapscan report` as text (terminal) and Markdown (PR comments, bug reports), both built
//! from the same list of blocks so they always say the same thing.

use std::fmt::Write;

use super::safe;
use crate::report::{
    CallSiteBytes, DeviceReport, FileReport, FileSummary, LiveAllocation, OmittedSegments, Oom,
    OomHeadline, Report, SegmentReport, StepSummary,
};
use crate::units::{counted, format_bytes};

/// What the reader asked to see.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// Rows per table.
    pub top: usize,
    /// Whole stacks under each call site.
    pub stacks: bool,
    /// Only their Python frames (`--stacks python`).
    pub python_only: bool,
    /// Every row of the tables that are cut only for reading (`--full`: the training steps).
    pub full: bool,
    /// A section for every device even when a file has many (`--all-devices`; otherwise past
    /// `analysis::headline::MANY_DEVICES` a table of the devices and the interesting ones).
    pub all_devices: bool,
}

/// A stack line (`file:line:function`) of a Python frame.
fn is_python_frame(line: &str) -> bool {
    let file = line.split(':').next().unwrap_or("");
    file.ends_with(".py") || file.starts_with('<')
}

enum Block {
    /// A file's path and device (from the snapshot: a code span in Markdown).
    Heading(String),
    /// A heading of our own words.
    Section(&'static str),
    Para(String),
    /// A paragraph that must stand out (the OOM verdict): bold red on a colour terminal.
    Alert(String),
    Table {
        title: String,
        header: Vec<&'static str>,
        /// Columns that are right-aligned (numbers).
        right: Vec<bool>,
        rows: Vec<Vec<String>>,
    },
    /// Preformatted lines (stacks).
    Lines(Vec<String>),
    /// A numbered list of items, each a head line and wrapped detail paragraphs.
    Items(Vec<(String, Vec<String>)>),
}

fn bytes(b: i64) -> String {
    if b < 0 {
        format!("-{}", format_bytes(b.unsigned_abs()))
    } else {
        format_bytes(b as u64)
    }
}

fn pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

fn when(dev: &DeviceReport, event: Option<u32>, time_us: Option<i64>) -> String {
    match event {
        None => "at window start".to_owned(),
        Some(e) => {
            let mut s = format!("at event {e} of {}", dev.window.events);
            if let (Some(t), Some(t0)) = (time_us, dev.window.first_time_us) {
                let _ = write!(s, " (+{:.3}s)", t.saturating_sub(t0) as f64 / 1e6);
            }
            s
        }
    }
}

fn born(a: &LiveAllocation) -> String {
    match a.alloc_event {
        Some(e) => format!("event {e}"),
        None => "before trace".to_owned(),
    }
}

fn died(a: &LiveAllocation) -> String {
    match a.free_event {
        Some(e) => format!("event {e}"),
        None => "alive at end".to_owned(),
    }
}

/// The steps a table shows (indices, in order): all of them when they fit in `top` rows; else
/// the first ones, the step of the peak with its neighbours, and the last ones. A long run has
/// thousands of steps; the JSON keeps every one.
fn steps_shown(steps: &[StepSummary], peak_step: Option<u32>, top: usize) -> Vec<usize> {
    let n = steps.len();
    let top = top.max(3);
    if n <= top {
        return (0..n).collect();
    }
    let peak = peak_step
        .and_then(|p| steps.iter().position(|s| s.step == p))
        .unwrap_or_else(|| {
            // The first of the highest peaks.
            let max = steps
                .iter()
                .map(|s| s.peak_requested_bytes)
                .max()
                .unwrap_or(0);
            steps
                .iter()
                .position(|s| s.peak_requested_bytes == max)
                .unwrap_or(0)
        });
    let around = if top >= 6 { 3 } else { 1 };
    let first = (top - around) / 2;
    let last = top - around - first;
    let low = peak.saturating_sub(around / 2).min(n - around);
    let mut shown: Vec<usize> = (0..first)
        .chain(low..low + around)
        .chain(n - last..n)
        .collect();
    shown.sort_unstable();
    shown.dedup();
    // A gap of one step takes the line its "…" row would.
    let singles: Vec<usize> = shown
        .windows(2)
        .filter(|w| w[1] - w[0] == 2)
        .map(|w| w[0] + 1)
        .collect();
    shown.extend(singles);
    shown.sort_unstable();
    shown
}

/// A call site as the tables show it: the site, what the allocation went through below it, and
/// whose code it is when not the user's: "model.py:88:forward via torch.nn.functional.linear",
/// "…/modeling_llama.py:123:forward via torch.nn.functional.linear (package code, from your
/// train.py:40:main)".
fn site_cell(s: &CallSiteBytes) -> String {
    let mut out = safe::name(&s.call_site);
    if let Some(via) = &s.via {
        let _ = write!(out, " via {}", safe::name(via));
    }
    if s.code.as_deref() == Some("package") {
        match &s.your_code {
            Some(y) => {
                let _ = write!(out, " (package code, from your {})", safe::name(y));
            }
            None => out.push_str(" (package code only)"),
        }
    }
    out
}

fn call_site_table(
    title: String,
    sites: &[CallSiteBytes],
    stacks: &crate::report::StackTable,
    view: &View,
) -> Vec<Block> {
    let mut blocks = vec![Block::Table {
        title,
        header: vec!["bytes", "share", "count", "call site"],
        right: vec![true, true, true, false],
        rows: sites
            .iter()
            .take(view.top)
            .map(|s| {
                vec![
                    format_bytes(s.bytes),
                    pct(s.share),
                    s.count.to_string(),
                    site_cell(s),
                ]
            })
            .collect(),
    }];
    if view.stacks {
        for s in sites.iter().take(view.top) {
            let Some(stack) = s.stack_id.and_then(|i| stacks.get(i as usize)) else {
                continue;
            };
            let mut lines = vec![format!(
                "stack of the largest allocation from {}:",
                safe::name(&s.call_site)
            )];
            let shown = stack
                .iter()
                .filter(|l| !view.python_only || is_python_frame(l));
            lines.extend(shown.map(|l| format!("    {}", safe::name(l))));
            blocks.push(Block::Lines(lines));
        }
    }
    blocks
}

fn allocation_table(title: String, allocations: &[LiveAllocation], view: &View) -> Block {
    Block::Table {
        title,
        header: vec![
            "requested",
            "block",
            "born",
            "freed",
            "age (events)",
            "category",
            "call site",
        ],
        right: vec![true, true, false, false, true, false, false],
        rows: allocations
            .iter()
            .take(view.top)
            .map(|a| {
                vec![
                    format_bytes(a.requested_bytes),
                    format_bytes(a.block_bytes),
                    born(a),
                    died(a),
                    a.age_events
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "-".into()),
                    a.category.to_string(),
                    safe::name(&a.call_site),
                ]
            })
            .collect(),
    }
}

/// "in the backward pass (step 3)", with the confidence when it is not high; "in step 3 (phase
/// unknown)" or "" when the phase is unknown. A low-confidence phase is not stated as the
/// phase: "in step 3 (phase unknown; by its position perhaps the forward pass, low confidence)".
/// The frames a phase rests on, each name marked untrusted: "`training_step` (model.py:120)
/// in `lightning/pytorch/loops/fit_loop.py`".
fn phase_frames_text(frames: &[crate::report::PhaseFrame]) -> String {
    let mut out = String::new();
    for f in frames {
        let at = if f.line > 0 {
            format!("{}:{}", f.file, f.line)
        } else {
            f.file.clone()
        };
        match f.role.as_str() {
            "loop" => {
                let _ = write!(out, " in {}", safe::name(&f.file));
            }
            "context" => {
                let _ = write!(
                    out,
                    " under {} ({})",
                    safe::name(&f.function),
                    safe::name(&at)
                );
            }
            _ => {
                let _ = write!(out, "{} ({})", safe::name(&f.function), safe::name(&at));
            }
        }
    }
    out
}

fn in_phase(phase: &str, step: Option<u32>, confidence: &str, note: Option<&str>) -> String {
    let unclear = phase == "forward" && note == Some(crate::analysis::report::FORWARD_UNCLEAR);
    let what = match phase {
        "load" => "while loading the model",
        "forward" => "in the forward pass",
        "backward" => "in the backward pass",
        "optimizer" => "in the optimizer step",
        "eval" => "in evaluation",
        _ => "",
    };
    let step_text = |s: Option<u32>| s.map_or(String::new(), |s| format!(" in step {s}"));
    if what.is_empty() {
        return format!("{} (phase unknown)", step_text(step));
    }
    if confidence == "low" {
        let name = what.trim_start_matches("in ").trim_start_matches("while ");
        return format!(
            "{} (phase unknown; perhaps {name}, low confidence)",
            step_text(step)
        );
    }
    let mut notes = Vec::new();
    if let Some(s) = step.filter(|_| phase != "load") {
        notes.push(format!("step {s}"));
    }
    if confidence != "high" && !confidence.is_empty() {
        notes.push(format!("{confidence} confidence"));
    }
    if unclear {
        notes.insert(0, crate::analysis::report::FORWARD_UNCLEAR.to_owned());
    }
    if notes.is_empty() {
        format!(" {what}")
    } else {
        format!(" {what} ({})", notes.join(", "))
    }
}

fn oom_verdict(dev: &DeviceReport, o: &Oom) -> String {
    let step = dev
        .phases
        .iter()
        .find(|iv| iv.first_event <= o.event_index && o.event_index <= iv.last_event)
        .and_then(|iv| iv.step);
    let mut s = format!(
        "OUT OF MEMORY{} {}: a {} request ({} pool, stream {}) failed",
        in_phase(&o.phase, step, &o.phase_confidence, o.phase_note.as_deref()),
        when(dev, Some(o.event_index), o.time_us),
        format_bytes(o.requested_bytes),
        o.segment_type,
        o.stream
    );
    if let Some(site) = &o.call_site {
        let _ = write!(s, " at {}", safe::name(site));
    }
    s.push_str(". ");
    if o.verdict == "fragmentation" {
        let _ = write!(
            s,
            "Verdict: FRAGMENTATION. {} was reserved but unallocated, more than the request, \
             but the largest free hole that could serve it was only {}: enough free bytes in \
             total, no contiguous block big enough.",
            format_bytes(o.reserved_unallocated_bytes),
            format_bytes(o.largest_free_block_bytes)
        );
    } else {
        let _ = write!(
            s,
            "Verdict: FULL. PyTorch held {} reserved with {} allocated; only {} was reserved \
             but unallocated (largest usable hole {}), so the request needed new device memory",
            format_bytes(o.reserved_bytes),
            format_bytes(o.allocated_bytes),
            format_bytes(o.reserved_unallocated_bytes),
            format_bytes(o.largest_free_block_bytes)
        );
        match o.device_free_bytes {
            Some(free) => {
                let _ = write!(s, " and the device had only {} free.", format_bytes(free));
            }
            None => s.push('.'),
        }
    }
    if let Some(why) = &o.why {
        let _ = write!(
            s,
            " Allocator replay: {}.",
            crate::analysis::allocator_replay::summary(why, true, &|c| safe::name(c))
        );
    }
    s
}

/// `omitted`: what a capped list left out (counted in the title, never listed: the list keeps
/// the segments with the most free bytes).
fn segment_table(
    moment: &str,
    segments: &[SegmentReport],
    omitted: Option<&OmittedSegments>,
    view: &View,
) -> Option<Block> {
    let mut segs: Vec<&SegmentReport> = segments.iter().filter(|s| s.free_bytes > 0).collect();
    let with_holes = segs.len() as u64 + omitted.map_or(0, |o| o.count_with_free_bytes);
    if segs.is_empty() {
        return None;
    }
    segs.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    Some(Block::Table {
        title: format!(
            "Segments with the most free space at {moment} (top {} of {} with holes)",
            segs.len().min(view.top),
            counted(with_holes, "segment", "segments")
        ),
        header: vec![
            "segment",
            "size",
            "allocated",
            "free",
            "holes",
            "largest hole",
            "pool",
            "stream",
        ],
        right: vec![false, true, true, true, true, true, false, false],
        rows: segs
            .iter()
            .take(view.top)
            .map(|s| {
                vec![
                    format!("0x{:x}", s.address),
                    format_bytes(s.total_bytes),
                    format_bytes(s.allocated_bytes),
                    format_bytes(s.free_bytes),
                    s.holes.to_string(),
                    format_bytes(s.largest_hole_bytes),
                    format!(
                        "{}{}{}",
                        s.segment_type,
                        match s.pool {
                            Some([0, 0]) | None => String::new(),
                            Some([a, b]) => format!(" ({a},{b})"),
                        },
                        if s.expandable { " expandable" } else { "" }
                    ),
                    s.stream.to_string(),
                ]
            })
            .collect(),
    })
}

/// How many OOM events the report does not detail (a trace with very many).
fn omitted_ooms_line(dev: &DeviceReport) -> Option<Block> {
    let n = dev.oom_omitted.filter(|&n| n > 0)?;
    Some(Block::Para(format!(
        "{} OOM events in all: the first, the last and the {} worst are above; {} more are \
         not detailed.",
        dev.oom_events(),
        dev.oom.len().saturating_sub(2),
        n
    )))
}

fn device_blocks(file: &FileReport, dev: &DeviceReport, view: &View) -> Vec<Block> {
    let mut out = Vec::new();
    out.push(Block::Heading(format!(
        "{} — device {}",
        safe::name(&file.path),
        dev.device
    )));

    // Sizes that add up past 64 bits: the saturated levels would print figures that
    // contradict each other ("16 EiB reserved, peak before that 8 EiB"), so none is printed.
    if dev.data_quality.iter().any(|w| w.kind == "sums_overflow") {
        out.push(Block::Alert(format!(
            "The trace is inconsistent: its sizes add up past what a signed 64-bit number \
             holds (8 EiB; sums_overflow below). No peak, level or fragmentation of this device \
             is reported; {} {} recorded.",
            counted(dev.window.events, "event", "events"),
            if dev.window.events == 1 {
                "was"
            } else {
                "were"
            }
        )));
        out.extend(quality_blocks(dev));
        return out;
    }

    // 1. The verdict.
    if dev.oom.is_empty() {
        let none = match dev.trace_cut.as_deref() {
            Some("cut") => "No OOM in the part of the trace that arrived (the trace was cut).",
            Some(_) => "No trace arrived (the file was cut before it): no OOM can be told.",
            None => "No OOM recorded.",
        };
        let mut s = format!(
            "{none} Peak {} requested by tensors ({} in allocator blocks){} {}; {} reserved at that moment.",
            bytes(dev.peak.requested_bytes),
            bytes(dev.peak.allocated_bytes),
            in_phase(&dev.peak.phase, dev.peak.step, &dev.peak.phase_confidence, dev.peak.phase_note.as_deref()),
            when(dev, dev.peak.event_index, dev.peak.time_us),
            bytes(dev.peak.reserved_bytes),
        );
        if dev.window.events == 0 && dev.trace_cut.is_none() {
            s.push_str(" (No trace was recorded: these are the dump's own figures.)");
        } else if dev.window.events == 0 {
            s.push_str(" (These are the dump's own figures.)");
        }
        if dev.held_open.share_of_peak >= 0.1 && dev.peak.event_index.is_some() {
            let _ = write!(
                s,
                " {} of it ({}) need not have been there: left over from earlier (held the peak open, below).",
                format_bytes(dev.held_open.bytes),
                pct(dev.held_open.share_of_peak)
            );
        }
        out.push(Block::Para(s));
    } else {
        for o in &dev.oom {
            out.push(Block::Alert(oom_verdict(dev, o)));
        }
        out.extend(omitted_ooms_line(dev));
        out.push(Block::Para(format!(
            "Peak before that: {} requested ({} in blocks){} {}.",
            bytes(dev.peak.requested_bytes),
            bytes(dev.peak.allocated_bytes),
            in_phase(
                &dev.peak.phase,
                dev.peak.step,
                &dev.peak.phase_confidence,
                dev.peak.phase_note.as_deref()
            ),
            when(dev, dev.peak.event_index, dev.peak.time_us)
        )));
    }

    // How the phase of the headline was found.
    let (phase, confidence, evidence, frames, note) = match dev.oom.first() {
        Some(o) => (
            &o.phase,
            &o.phase_confidence,
            &o.phase_evidence,
            &o.phase_frames,
            &o.phase_note,
        ),
        None => (
            &dev.peak.phase,
            &dev.peak.phase_confidence,
            &dev.peak.phase_evidence,
            &dev.peak.phase_frames,
            &dev.peak.phase_note,
        ),
    };
    if phase == "unknown" && !evidence.is_empty() {
        out.push(Block::Para(format!("Phase unknown: {evidence}.")));
    } else if confidence == "low" && !evidence.is_empty() {
        out.push(Block::Para(format!(
            "Phase not decided: perhaps {phase} (low confidence), from {evidence}."
        )));
    } else if !frames.is_empty() {
        let unclear = note.as_deref() == Some(crate::analysis::report::FORWARD_UNCLEAR);
        let how = if unclear {
            format!(
                "{} — {confidence} confidence",
                crate::analysis::report::FORWARD_UNCLEAR
            )
        } else {
            format!("{confidence} confidence")
        };
        let tail = match note.as_deref() {
            Some(crate::analysis::report::FORWARD_UNCLEAR) => {
                crate::analysis::report::UNCLEAR_WHY.to_owned()
            }
            Some(n) => format!(", {n}"),
            None => String::new(),
        };
        out.push(Block::Para(format!(
            "Phase: {phase} ({how}), from {}{tail}.",
            phase_frames_text(frames)
        )));
    } else if !evidence.is_empty() {
        out.push(Block::Para(format!(
            "Phase: {phase} ({confidence} confidence), from {evidence}."
        )));
    }

    // 2. Window and final state.
    let mut window = format!("Trace: {}", counted(dev.window.events, "event", "events"));
    if let Some(d) = dev.window.duration_s {
        let _ = write!(window, " over {d:.3} s");
    }
    if dev.window.allocations_before_window == 0 {
        window.push_str("; no allocation predates the window");
    } else {
        let _ = write!(
            window,
            "; {} the window ({} no event at all: still allocated at the dump)",
            match dev.window.allocations_before_window {
                1 => "1 allocation predates".to_owned(),
                n => format!("{n} allocations predate"),
            },
            match (
                dev.window.allocations_before_window,
                dev.window.ghost_blocks
            ) {
                (1, 1) => "it has".to_owned(),
                (_, g) => format!("{g} of them {}", if g == 1 { "has" } else { "have" }),
            }
        );
    }
    let _ = write!(
        window,
        ". Reserved: peak {}, at the dump {}; allocated at the dump {} ({} requested).",
        bytes(dev.peak_reserved.bytes),
        format_bytes(dev.final_state.reserved_bytes),
        format_bytes(dev.final_state.allocated_bytes),
        format_bytes(dev.final_state.requested_bytes),
    );
    out.push(Block::Para(window));
    if !dev.recording.is_empty() {
        out.push(Block::Para("Why this snapshot says little:".to_owned()));
        out.push(Block::Items(
            dev.recording
                .iter()
                .map(|g| {
                    (
                        format!("{} ({})", capitalized(&g.what), g.kind),
                        vec![format!("Record it: {}", g.fix)],
                    )
                })
                .collect(),
        ));
    }

    // 3. What to change first, then where the memory went.
    if !dev.advice.is_empty() {
        let items = dev
            .advice
            .iter()
            .map(|a| {
                let mut details = vec![format!("Why: {}.", a.reason)];
                if let Some(b) = a.estimated_saving_bytes {
                    details.push(format!("Expected saving: about {}.", format_bytes(b)));
                }
                details.push(format!("Not a fix when: {}.", a.caveat));
                if let Some(c) = &a.checked {
                    details.push(format!("{}.", c.verdict));
                }
                (a.action.clone(), details)
            })
            .collect();
        out.push(Block::Para("What to change first:".to_owned()));
        out.push(Block::Items(items));
        if let Some(c) = dev
            .advice
            .iter()
            .filter_map(|a| a.checked.as_ref())
            .find(|c| c.fits)
        {
            out.push(Block::Para(format!(
                "Replay verdict: the first change above that fits is {} ({} to spare).",
                c.change,
                format_bytes(c.margin_bytes.max(0) as u64)
            )));
        }
    }
    let total: u64 = dev
        .categories_at_peak
        .values()
        .fold(0u64, |sum, v| sum.saturating_add(*v));
    let mut cats: Vec<(&String, &u64)> = dev
        .categories_at_peak
        .iter()
        .filter(|(_, b)| **b > 0)
        .collect();
    cats.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    if !cats.is_empty() {
        let mut phases: Vec<(&String, &u64)> =
            dev.phases_at_peak.iter().filter(|(_, b)| **b > 0).collect();
        phases.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let share = |b: u64| pct(b as f64 / total.max(1) as f64);
        out.push(Block::Table {
            title: "Where the memory went at the peak (by category, and by the phase that allocated it)".to_owned(),
            header: vec!["category", "bytes", "share", "confidence", "", "allocated in", "bytes", "share"],
            right: vec![false, true, true, false, false, false, true, true],
            rows: (0..cats.len().max(phases.len()))
                .map(|i| {
                    let (c, cb) = cats.get(i).map_or((String::new(), String::new()), |(c, b)| ((*c).clone(), format_bytes(**b)));
                    let cs = cats.get(i).map_or(String::new(), |(_, b)| share(**b));
                    let cc = cats
                        .get(i)
                        .and_then(|(c, _)| dev.category_confidence_at_peak.get(*c))
                        .cloned()
                        .unwrap_or_default();
                    let (p, pb) = phases.get(i).map_or((String::new(), String::new()), |(p, b)| (p.replace('_', " "), format_bytes(**b)));
                    let ps = phases.get(i).map_or(String::new(), |(_, b)| share(**b));
                    vec![c, cb, cs, cc, String::new(), p, pb, ps]
                })
                .collect(),
        });
        // What the claims that are not certain rest on, largest first.
        let unsure: Vec<String> = cats
            .iter()
            .filter(|(_, b)| **b as f64 >= 0.01 * total as f64)
            .filter_map(|(c, _)| {
                let confidence = dev.category_confidence_at_peak.get(*c)?;
                let evidence = dev.category_evidence_at_peak.get(*c)?;
                (confidence != "high").then(|| format!("{c} ({confidence}): {evidence}"))
            })
            .collect();
        if !unsure.is_empty() {
            out.push(Block::Para(format!("Not certain: {}.", unsure.join("; "))));
        }
    }
    if dev.steps.len() > 1 {
        let growing = match &dev.step_growth {
            Some(g) => g.verdict == "growing",
            None => dev
                .steps
                .windows(2)
                .all(|w| w[1].start_requested_bytes > w[0].start_requested_bytes),
        };
        let growth = dev.steps.last().map_or(0, |l| l.start_requested_bytes)
            - dev.steps.first().map_or(0, |f| f.start_requested_bytes);
        let rows_for_steps = if view.full { usize::MAX } else { view.top };
        let shown = steps_shown(&dev.steps, dev.peak.step, rows_for_steps);
        let which = (shown.len() < dev.steps.len()).then(|| {
            format!(
                "{} of {}: the first, those around the peak and the last",
                shown.len(),
                dev.steps.len()
            )
        });
        let title = if growing && dev.steps.len() > 2 && growth > 0 {
            let leak = format!(
                "Training steps — LEAK SUSPECT: memory at the start of each step grew every step, {} in total",
                bytes(growth)
            );
            match which {
                Some(which) => format!("{leak} ({which})"),
                None => leak,
            }
        } else {
            let what = "peak of each, and memory alive when it started";
            match which {
                Some(which) => format!("Training steps ({which}; {what})"),
                None => format!("Training steps ({what})"),
            }
        };
        let mut rows = Vec::with_capacity(shown.len() + 2);
        for (k, &i) in shown.iter().enumerate() {
            let skipped = i - k.checked_sub(1).map_or(0, |j| shown[j] + 1);
            if skipped > 0 {
                rows.push(vec![
                    "…".to_owned(),
                    counted(skipped as u64, "step", "steps"),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
            let st = &dev.steps[i];
            rows.push(vec![
                st.step.to_string(),
                format!("{}-{}", st.first_event, st.last_event),
                bytes(st.peak_requested_bytes),
                bytes(st.start_requested_bytes),
                bytes(st.start_growth_bytes),
            ]);
        }
        out.push(Block::Table {
            title,
            header: vec!["step", "events", "peak", "at start", "growth"],
            right: vec![true, false, true, true, true],
            rows,
        });
        if let Some(g) = &dev.step_growth {
            out.push(Block::Para(if g.verdict == "growing" {
                format!(
                    "Across steps: GROWING — from step 1 on, the memory alive at the start of each \
                     step rose every step, {} in all: something keeps what a step allocated.",
                    bytes(g.growth_from_second_step_bytes)
                )
            } else {
                format!(
                    "Across steps: steady — from step 1 on, the memory alive at the start of a step \
                     does not rise every step ({} from step 1 to the last; a rise under {} a \
                     step counts as steady).",
                    bytes(g.growth_from_second_step_bytes),
                    format_bytes(g.noise_bytes.unsigned_abs())
                )
            }));
            if !g.kept_into_later_steps_by_call_site.is_empty() {
                out.extend(call_site_table(
                    "Allocated in one step and not freed by the next (in two steps or more), by \
                     call site"
                        .to_owned(),
                    &g.kept_into_later_steps_by_call_site,
                    &dev.stacks,
                    view,
                ));
            }
        }
    }

    // 4. What was alive at the peak.
    out.extend(call_site_table(
        format!(
            "Alive at the peak, by call site ({} of {}, {})",
            dev.live_at_peak_by_call_site.len().min(view.top),
            counted(
                dev.live_at_peak_by_call_site.len() as u64
                    + dev
                        .live_at_peak_by_call_site_omitted
                        .as_ref()
                        .map_or(0, |o| o.count),
                "site",
                "sites"
            ),
            counted(
                dev.live_at_peak.len() as u64
                    + dev.live_at_peak_omitted.as_ref().map_or(0, |o| o.count),
                "allocation",
                "allocations"
            )
        ),
        &dev.live_at_peak_by_call_site,
        &dev.stacks,
        view,
    ));
    out.push(allocation_table(
        "Largest allocations alive at the peak".to_owned(),
        &dev.live_at_peak,
        view,
    ));

    // 4. Held open.
    if dev.peak.event_index.is_some()
        && dev.held_open.count > 0
        && dev.held_open.share_of_peak < 0.01
    {
        out.push(Block::Para(format!(
            "Held the peak open: nothing sizeable ({} in {}, under 1% of the peak, is left over from earlier).",
            format_bytes(dev.held_open.bytes),
            counted(dev.held_open.count, "allocation", "allocations")
        )));
    } else if dev.peak.event_index.is_some() && dev.held_open.count > 0 {
        let h = &dev.held_open;
        let mut from: Vec<(&String, &u64)> = h.by_step.iter().collect();
        from.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let from = from
            .iter()
            .map(|(k, b)| format!("{} {}", k.replace('_', " "), format_bytes(**b)))
            .collect::<Vec<_>>()
            .join(", ");
        let mut title = format!(
            "Held the peak open: {} ({}) in {} — {} (at that point {} was requested). From: {from}",
            format_bytes(h.bytes),
            pct(h.share_of_peak),
            counted(h.count, "allocation", "allocations"),
            h.definition,
            bytes(h.boundary_requested_bytes),
        );
        if h.reallocated_state_bytes > 0 {
            let _ = write!(
                title,
                ". {} of it is optimizer state re-created every step instead of updated in place: \
                 the old tensors stay alive until the next step replaces them",
                format_bytes(h.reallocated_state_bytes)
            );
        }
        out.extend(call_site_table(title, &h.by_call_site, &dev.stacks, view));
        out.push(allocation_table(
            "Largest allocations that held the peak open".to_owned(),
            &h.allocations,
            view,
        ));
    }

    // 5. Fragmentation.
    let f = &dev.fragmentation_at_peak;
    let e = &dev.fragmentation_at_end;
    // "… sits in holes smaller than the largest request" only when the window had a request.
    let unusable = if f.largest_request_bytes > 0 {
        format!(
            "; {} sits in holes smaller than the largest request ({})",
            format_bytes(f.unusable_for_largest_request_bytes),
            format_bytes(f.largest_request_bytes)
        )
    } else {
        String::new()
    };
    out.push(Block::Para(format!(
        "Fragmentation at the peak: {} reserved − {} allocated = {} cached in {}, largest hole {}{unusable}. \
         At the dump: {} cached in {}, largest {}.",
        format_bytes(f.reserved_bytes),
        format_bytes(f.allocated_bytes),
        format_bytes(f.reserved_unallocated_bytes),
        counted(f.holes, "hole", "holes"),
        format_bytes(f.largest_hole_bytes),
        format_bytes(e.reserved_unallocated_bytes),
        counted(e.holes, "hole", "holes"),
        format_bytes(e.largest_hole_bytes),
    )));
    // The layout that matters most: at the (first) OOM when there is one, else at the peak.
    match dev.oom.first() {
        Some(o) => out.extend(segment_table(
            &format!("the OOM (event {})", o.event_index),
            &o.segments,
            o.segments_omitted.as_ref(),
            view,
        )),
        None => out.extend(segment_table(
            "the peak",
            &dev.segments,
            dev.segments_omitted.as_ref(),
            view,
        )),
    }

    // 6. Live set at each OOM.
    for o in &dev.oom {
        out.extend(call_site_table(
            format!("Alive at the OOM (event {}), by call site", o.event_index),
            &o.live_by_call_site,
            &dev.stacks,
            view,
        ));
    }

    out.extend(pool_blocks(dev));
    out.extend(annotated_blocks(dev));
    out.extend(quality_blocks(dev));
    for n in &dev.notes {
        out.push(Block::Para(format!("Note: {n}")));
    }
    out
}

/// `s` with its first letter upper-case.
fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The pool's name as the text shows it: its kind, its id and, when given, its name.
fn pool_label(p: &crate::report::PoolReport) -> String {
    let kind = match p.kind.as_str() {
        "default" => "default pool",
        "cuda_graph" => "CUDA graph pool",
        "cudagraph_trees" => "cudagraph trees pool",
        "mempool" => "MemPool",
        "symmetric_memory" => "symmetric memory",
        _ => "private pool",
    };
    let mut s = format!("{kind} ({}, {})", p.pool_id[0], p.pool_id[1]);
    if let Some(n) = &p.name {
        let _ = write!(s, " {}", safe::name(n));
    }
    s
}

/// Memory by pool, when the device has more than the default pool.
fn pool_blocks(dev: &DeviceReport) -> Vec<Block> {
    if dev.pools.len() < 2 && dev.pools.iter().all(|p| p.kind == "default") {
        return Vec::new();
    }
    vec![Block::Table {
        title: "Memory pools (at the dump; peak over the window; a free block in one pool never \
                serves another)"
            .to_owned(),
        header: vec![
            "pool",
            "segments",
            "reserved",
            "allocated",
            "free",
            "largest free",
            "peak reserved",
        ],
        right: vec![false, true, true, true, true, true, true],
        rows: dev
            .pools
            .iter()
            .map(|p| {
                vec![
                    pool_label(p),
                    p.segments.to_string(),
                    format_bytes(p.reserved_bytes),
                    format_bytes(p.allocated_bytes),
                    format_bytes(p.free_bytes),
                    format_bytes(p.largest_free_block_bytes),
                    format_bytes(p.peak_reserved_bytes),
                ]
            })
            .collect(),
    }]
}

/// Allocations alive at the peak that the user annotated (`_annotate_tensor`).
fn annotated_blocks(dev: &DeviceReport) -> Vec<Block> {
    let rows: Vec<Vec<String>> = dev
        .live_at_peak
        .iter()
        .filter(|a| !a.annotations.is_empty())
        .take(10)
        .map(|a| {
            vec![
                format_bytes(a.requested_bytes),
                format!("{:#x}", a.address),
                a.category.to_string(),
                a.annotations
                    .iter()
                    .map(|t| safe::name(t))
                    .collect::<Vec<_>>()
                    .join("; "),
                safe::name(&a.call_site),
            ]
        })
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    vec![Block::Table {
        title: "Alive at the peak and annotated by you (_annotate_tensor)".to_owned(),
        header: vec![
            "requested",
            "address",
            "category",
            "annotation",
            "call site",
        ],
        right: vec![true, false, false, false, false],
        rows,
    }]
}

/// `allocator_settings` as the dump recorded them (torch 2.3+), in one line: the option string,
/// the device allocator's knobs and the pinned host allocator's (2.13+). Keys this version
/// does not know are listed too, so that nothing the dump says is hidden.
fn settings_line(raw: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    let o = raw.as_object()?;
    if o.is_empty() {
        return None;
    }
    // -1 (SIZE_MAX written as int64), or SIZE_MAX itself: no limit.
    let limit = |v: &Value| match (v.as_i64(), v.as_u64()) {
        (Some(n), _) if n < 0 => "unlimited".to_owned(),
        (_, Some(n)) if n >= u64::MAX / 2 => "unlimited".to_owned(),
        (_, Some(n)) => format_bytes(n),
        _ => safe::name(&v.to_string()),
    };
    let plain = |v: &Value| match v {
        Value::Bool(true) => "on".to_owned(),
        Value::Bool(false) => "off".to_owned(),
        Value::String(t) => format!("\"{}\"", safe::name(t)),
        other => safe::name(&other.to_string()),
    };
    let mut device = Vec::new();
    let mut host = Vec::new();
    let mut other = Vec::new();
    // Knobs at their defaults are counted, not listed, but for the ones every reader asks about.
    let mut defaults = 0usize;
    for (k, v) in o {
        let key = safe::name(k);
        let is_default = match k.as_str() {
            "garbage_collection_threshold" => v.as_f64() == Some(0.0),
            "release_lock_on_cudamalloc"
            | "graph_capture_record_stream_reuse"
            | "pinned_use_cuda_host_register" => v.as_bool() == Some(false),
            "pinned_num_register_threads" => v.as_u64() == Some(1),
            "roundup_power2_divisions" => v
                .as_object()
                .is_some_and(|d| d.values().all(|n| n.as_u64() == Some(0))),
            _ => false,
        };
        if is_default {
            defaults += 1;
            continue;
        }
        match k.as_str() {
            "PYTORCH_CUDA_ALLOC_CONF" | "PYTORCH_ALLOC_CONF" => device.insert(
                0,
                match v.as_str() {
                    Some("") => format!("{key} not set"),
                    _ => format!("{key} {}", plain(v)),
                },
            ),
            "max_split_size" => device.push(format!("{key} {}", limit(v))),
            "roundup_power2_divisions" => {
                let mut on: Vec<(u64, String)> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, n)| n.as_u64().is_some_and(|n| n > 0))
                    .map(|(mb, n)| {
                        let start = mb.parse::<u64>().unwrap_or(u64::MAX);
                        (start, format!("{} from {}MiB", plain(n), safe::name(mb)))
                    })
                    .collect();
                on.sort();
                let on: Vec<String> = on.into_iter().map(|x| x.1).collect();
                device.push(format!("{key} {}", on.join(", ")));
            }
            "expandable_segments"
            | "garbage_collection_threshold"
            | "release_lock_on_cudamalloc"
            | "graph_capture_record_stream_reuse" => device.push(format!("{key} {}", plain(v))),
            "max_round_threshold" | "max_cached_size" => host.push(format!("{key} {}", limit(v))),
            "pinned_num_register_threads" | "pinned_use_cuda_host_register" => {
                host.push(format!("{key} {}", plain(v)))
            }
            _ => other.push(format!("{key} {}", plain(v))),
        }
    }
    let mut line = format!("Allocator settings: {}", device.join(", "));
    if !host.is_empty() {
        let _ = write!(line, "; pinned host allocator: {}", host.join(", "));
    }
    if !other.is_empty() {
        let _ = write!(line, "; other keys: {}", other.join(", "));
    }
    if defaults > 0 {
        let _ = write!(
            line,
            "; {} at {}",
            counted(defaults as u64, "other", "others"),
            if defaults == 1 {
                "its default"
            } else {
                "their defaults"
            }
        );
    }
    line.push('.');
    Some(line)
}

/// The file's pinned host memory (torch 2.14+), and what its format says: the 2026 fields and
/// what this version does not read, in one line each.
fn file_blocks(file: &FileReport) -> Vec<Block> {
    let mut out = Vec::new();
    if let Some(h) = &file.host_memory {
        out.push(Block::Section("Pinned host memory"));
        let peak_at = match h.peak_event_index {
            Some(e) => format!("at host event {e} of {}", h.trace_entries),
            None if h.trace_entries == 0 => "at the dump (no host trace)".to_owned(),
            None => "at the start of the host trace".to_owned(),
        };
        out.push(Block::Para(format!(
            "Peak {} pinned {peak_at} ({} reserved at most); at the dump {} still pinned of {} \
             reserved in {}.",
            format_bytes(h.peak_allocated_bytes),
            format_bytes(h.peak_reserved_bytes),
            format_bytes(h.allocated_bytes_at_dump),
            format_bytes(h.reserved_bytes_at_dump),
            counted(h.segments, "segment", "segments"),
        )));
        let table = |title: &str, rows: &[crate::report::CallSiteBytes]| Block::Table {
            title: title.to_owned(),
            header: vec!["bytes", "share", "count", "call site"],
            right: vec![true, true, true, false],
            rows: rows
                .iter()
                .map(|r| {
                    vec![
                        format_bytes(r.bytes),
                        pct(r.share),
                        r.count.to_string(),
                        safe::name(&r.call_site),
                    ]
                })
                .collect(),
        };
        if !h.live_at_peak_by_call_site.is_empty() && h.peak_event_index.is_some() {
            out.push(table(
                "Pinned at the host peak, by call site",
                &h.live_at_peak_by_call_site,
            ));
        }
        if !h.held_at_dump_by_call_site.is_empty() {
            out.push(table(
                "Still pinned at the dump, by call site",
                &h.held_at_dump_by_call_site,
            ));
        }
    }
    if let Some(line) = file.allocator_settings.as_ref().and_then(settings_line) {
        out.push(Block::Para(line));
    }
    let f = &file.snapshot_fields;
    let mut said = Vec::new();
    if f.accelerator != "cuda" && !f.accelerator.is_empty() {
        said.push(format!(
            "written by the {} allocator",
            f.accelerator.to_uppercase()
        ));
    }
    if f.pool_ids {
        said.push("trace entries carry their pool (pool_id)".to_owned());
    }
    if f.annotations > 0 {
        said.push(counted(
            f.annotations,
            "annotation (_annotate_tensor)",
            "annotations (_annotate_tensor)",
        ));
    }
    if !f.user_metadata.is_empty() {
        let shown: Vec<String> = f
            .user_metadata
            .iter()
            .take(3)
            .map(|m| format!("{} ({})", safe::name(&m.name), m.entries))
            .collect();
        said.push(format!("user metadata: {}", shown.join(", ")));
    }
    if !f.internal_metadata.is_empty() {
        let shown: Vec<String> = f
            .internal_metadata
            .iter()
            .map(|m| format!("{} ({})", safe::name(&m.name), m.entries))
            .collect();
        said.push(format!(
            "allocator tags (internal_metadata): {}",
            shown.join(", ")
        ));
    }
    if !said.is_empty() {
        out.push(Block::Para(format!("Snapshot: {}.", said.join("; "))));
    }
    let mut ignored = Vec::new();
    for k in &f.unknown_entry_keys {
        ignored.push(format!(
            "{} with key {}",
            counted(k.entries, "entry", "entries"),
            safe::name(&k.name)
        ));
    }
    for a in &f.unknown_actions {
        ignored.push(format!(
            "{} with action {}",
            counted(a.entries, "entry", "entries"),
            safe::name(&a.name)
        ));
    }
    for k in &f.other_top_level_keys {
        ignored.push(format!("top-level key {}", safe::name(k)));
    }
    if !ignored.is_empty() {
        out.push(Block::Para(format!(
            "Not read by this version of snapscan: {}.",
            ignored.join("; ")
        )));
    }
    out
}

/// The data-quality findings of a device, each with the figures it affects.
fn quality_blocks(dev: &DeviceReport) -> Vec<Block> {
    let mut out = Vec::new();
    if !dev.data_quality.is_empty() {
        out.push(Block::Para(
            "Data quality: the file is inconsistent; the figures listed under each finding may be \
             wrong:"
                .to_owned(),
        ));
        let items = dev
            .data_quality
            .iter()
            .map(|w| {
                let affects = if w.affects.is_empty() {
                    "no figure of this report".to_owned()
                } else {
                    w.affects.join(", ")
                };
                (
                    format!("{} ({}): {}", w.kind, w.count, w.message),
                    vec![format!("Affects: {affects}.")],
                )
            })
            .collect();
        out.push(Block::Items(items));
    }
    out
}

/// The column heads of the cross-file table and what they mean (report and merge).
pub const RANK_COLUMNS_NOTE: &str = "peak and reserved at peak: the device with the highest peak, \
     at the moment of that peak; max reserved: the highest reserved bytes of any device";

/// What the outlier column means for this table, in words.
pub fn outlier_note(t: &crate::report::RankTable) -> String {
    if t.ranks_of_one_job {
        format!("Outliers: {}.", t.outlier_rule)
    } else {
        "Outliers: not flagged, the files are not ranks of one job (no rank number in every \
         name; --ranks says they are)."
            .to_owned()
    }
}

fn rank_blocks(report: &Report) -> Vec<Block> {
    let Some(t) = &report.ranks else {
        return Vec::new();
    };
    let dash = || "-".to_owned();
    vec![
        Block::Table {
            title: format!(
                "{} files, median peak {} ({RANK_COLUMNS_NOTE})",
                t.rows.len(),
                bytes(t.median_peak_requested_bytes)
            ),
            header: vec![
                "file",
                "rank",
                "device",
                "peak",
                "reserved at peak",
                "max reserved",
                "OOM",
                "outlier",
            ],
            right: vec![false, true, true, true, true, true, false, false],
            rows: t
                .rows
                .iter()
                .map(|r| {
                    let rank = r.rank.map(|x| x.to_string()).unwrap_or_else(dash);
                    if r.error.is_some() {
                        return vec![
                            safe::name(&r.path),
                            rank,
                            dash(),
                            dash(),
                            dash(),
                            dash(),
                            "unreadable".to_owned(),
                            String::new(),
                        ];
                    }
                    vec![
                        safe::name(&r.path),
                        rank,
                        r.peak_device.map(|d| d.to_string()).unwrap_or_else(dash),
                        bytes(r.peak_requested_bytes),
                        format_bytes(r.reserved_at_peak_bytes),
                        format_bytes(r.max_reserved_bytes),
                        if r.oom { "yes" } else { "no" }.to_owned(),
                        if r.outlier { "OUTLIER" } else { "" }.to_owned(),
                    ]
                })
                .collect(),
        },
        Block::Para(outlier_note(t)),
    ]
    .into_iter()
    .chain(t.rows.iter().filter_map(|r| {
        let reason = r.outlier_reason.as_ref()?;
        let who = match r.rank {
            Some(k) => format!("Rank {k} ({})", safe::name(&r.path)),
            None => safe::name(&r.path),
        };
        Some(Block::Para(crate::analysis::outlier::reason_text(
            &who,
            reason,
            safe::name,
        )))
    }))
    .collect()
}

/// How a device with no segments and no trace entries is shown, in `report` and `stats` alike.
pub fn empty_device_line(device: i64) -> String {
    format!("Device {device}: nothing recorded (no segments, no trace entries).")
}

/// "device 1 of 3", or "device 0" when the file has one device.
fn device_of(device: i64, devices: u64) -> String {
    if devices > 1 {
        format!("device {device} of {devices}")
    } else {
        format!("device {device}")
    }
}

/// "750.0MiB request in the forward pass at x.py:12:f, FULL; about 558.6MiB must be freed for
/// it to fit".
fn oom_brief(h: &OomHeadline) -> String {
    let mut s = format!(
        "{} request{}",
        format_bytes(h.requested_bytes),
        in_phase(&h.phase, None, "", None)
    );
    if let Some(site) = &h.call_site {
        let _ = write!(s, " at {}", safe::name(site));
    }
    let _ = write!(s, ", {}", h.verdict.to_uppercase());
    if h.oom_events > 1 {
        let _ = write!(s, " (the first of {} OOMs)", h.oom_events);
    }
    if h.shortfall_bytes > 0 {
        let _ = write!(
            s,
            "; about {} must be freed for it to fit",
            format_bytes(h.shortfall_bytes)
        );
    }
    s
}

/// The first lines of a file with several devices: which devices ran out of memory and where,
/// the others' peaks, and an imbalance of the peaks.
fn file_headline(path: &str, sum: &FileSummary, devices: &[DeviceReport]) -> Vec<Block> {
    let mut out = vec![Block::Heading(format!(
        "{} — {} devices",
        safe::name(path),
        sum.devices
    ))];
    for h in &sum.oom {
        out.push(Block::Alert(format!(
            "OOM on {}: {}.",
            device_of(h.device, sum.devices),
            oom_brief(h)
        )));
    }
    let fine: Vec<String> = devices
        .iter()
        .filter(|d| d.oom.is_empty())
        .map(|d| {
            let cut = match d.trace_cut.as_deref() {
                Some("cut") => " (its trace was cut)",
                Some(_) => " (its trace did not arrive)",
                None => "",
            };
            format!(
                "device {} peak {}{cut}",
                d.device,
                bytes(d.peak.requested_bytes)
            )
        })
        .collect();
    if sum.oom.is_empty() {
        out.push(Block::Para(format!(
            "No OOM on any of the {} devices: {}.",
            sum.devices,
            fine.join(", ")
        )));
    } else if !fine.is_empty() {
        out.push(Block::Para(format!("No OOM on: {}.", fine.join(", "))));
    }
    if let Some(i) = &sum.imbalance {
        let times = i.ratio.map(|r| format!("{r:.1}× ")).unwrap_or_default();
        out.push(Block::Para(format!(
            "Imbalance: device {} peaks at {}, {times}device {}'s {} (flagged when the {}).",
            i.highest_device,
            bytes(i.highest_peak_bytes),
            i.lowest_device,
            bytes(i.lowest_peak_bytes),
            i.rule
        )));
    }
    out
}

/// `report --brief`: one line per file (OOM device, failing call site, how much must go; or
/// the peak), then one per unreadable input.
pub fn brief(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.files {
        let sum = &f.summary;
        let line = match sum.oom.first() {
            _ if f.devices.is_empty() => "nothing to report (no segments and no trace)".to_owned(),
            Some(h) => {
                let mut s = format!(
                    "OOM on {}: {}",
                    device_of(h.device, sum.devices),
                    oom_brief(h)
                );
                if sum.oom.len() > 1 {
                    let others: Vec<String> =
                        sum.oom[1..].iter().map(|o| o.device.to_string()).collect();
                    let _ = write!(s, "; OOM on device {} too", others.join(", "));
                }
                s
            }
            None => format!(
                "no OOM; peak {} on {}",
                bytes(sum.peak_requested_bytes),
                device_of(sum.peak_device.unwrap_or(0), sum.devices)
            ),
        };
        let mut flags = String::new();
        if sum.imbalance.is_some() {
            flags.push_str(" [imbalance]");
        }
        let cut: Vec<String> = f
            .devices
            .iter()
            .filter_map(|d| {
                let how = match d.trace_cut.as_deref()? {
                    "cut" => "cut",
                    _ => "not reached",
                };
                Some(format!("device {} trace {how}", d.device))
            })
            .collect();
        if !cut.is_empty() {
            let _ = write!(flags, " [salvaged: {}]", cut.join(", "));
        }
        let _ = writeln!(out, "{}: {line}{flags}", safe::name(&f.path));
    }
    for u in &report.unreadable {
        let _ = writeln!(
            out,
            "{}: could not read: {}",
            safe::name(&u.path),
            safe::name(&u.error)
        );
    }
    safe::text(&out).into_owned()
}

fn all_blocks(report: &Report, view: &View) -> Vec<Block> {
    let mut blocks = rank_blocks(report);
    for file in &report.files {
        // A file of many devices: a table of every device, then the detailed ones.
        if !file.device_table.is_empty() {
            blocks.extend(many_devices_blocks(file));
            for dev in &file.devices {
                blocks.extend(device_blocks(file, dev, view));
            }
            blocks.extend(file_blocks(file));
            continue;
        }
        if file.devices.len() > 1 {
            blocks.extend(file_headline(&file.path, &file.summary, &file.devices));
        }
        if file.devices.is_empty() {
            blocks.push(Block::Heading(safe::name(&file.path)));
            // The module follows the dump's allocator (an XPU dump is told torch.xpu).
            let accel =
                crate::analysis::fields::Accelerator::named(&file.snapshot_fields.accelerator);
            blocks.push(Block::Para(format!(
                "No segments and no trace: nothing to report. Either recording started after \
                 the allocations were freed, or the dump came after {device}.empty_cache() \
                 (which returns every cached segment to the driver). Record with \
                 {memory}._record_memory_history(max_entries=100000) before the \
                 work and call {memory}._dump_snapshot(path) before any \
                 empty_cache().",
                device = accel.device_module(),
                memory = accel.memory_module(),
            )));
        }
        for dev in &file.devices {
            blocks.extend(device_blocks(file, dev, view));
        }
        if !file.devices.is_empty() {
            for d in &file.summary.empty_devices {
                blocks.push(Block::Para(empty_device_line(*d)));
            }
        }
        blocks.extend(file_blocks(file));
    }
    blocks
}

impl Block {
    /// The block as a terminal shows it: the untrusted strings in it unmarked, every control
    /// character as a visible escape ([`safe::text`]).
    fn for_terminal(self) -> Block {
        let t = |s: String| safe::text(&s).into_owned();
        match self {
            Block::Heading(h) => Block::Heading(t(h)),
            Block::Section(h) => Block::Section(h),
            Block::Para(p) => Block::Para(t(p)),
            Block::Alert(p) => Block::Alert(t(p)),
            Block::Table {
                title,
                header,
                right,
                rows,
            } => Block::Table {
                title: t(title),
                header,
                right,
                rows: rows
                    .into_iter()
                    .map(|r| r.into_iter().map(t).collect())
                    .collect(),
            },
            Block::Lines(lines) => Block::Lines(lines.into_iter().map(t).collect()),
            Block::Items(items) => Block::Items(
                items
                    .into_iter()
                    .map(|(head, details)| (t(head), details.into_iter().map(t).collect()))
                    .collect(),
            ),
        }
    }
}

/// The head of a file with more than `analysis::headline::MANY_DEVICES` devices: how many ran
/// out of memory, a table of every device (peak, OOMs, reserved, what marks it) and which are
/// detailed below (those in `file.devices`); the devices with nothing recorded in one line.
fn many_devices_blocks(file: &FileReport) -> Vec<Block> {
    let sum = &file.summary;
    let mut out = vec![Block::Heading(format!(
        "{} — {} devices",
        safe::name(&file.path),
        sum.devices
    ))];
    match sum.oom.first() {
        Some(h) => out.push(Block::Alert(format!(
            "OOM on {} of the {} devices; the first: device {}: {}.",
            sum.oom.len(),
            sum.devices,
            h.device,
            oom_brief(h)
        ))),
        None => out.push(Block::Para(format!(
            "No OOM on any of the {} devices; the highest peak is {} on device {}.",
            sum.devices,
            bytes(sum.peak_requested_bytes),
            sum.peak_device.unwrap_or(0)
        ))),
    }
    if let Some(i) = &sum.imbalance {
        let times = i.ratio.map(|r| format!("{r:.1}× ")).unwrap_or_default();
        out.push(Block::Para(format!(
            "Imbalance: device {} peaks at {}, {times}device {}'s {} (flagged when the {}).",
            i.highest_device,
            bytes(i.highest_peak_bytes),
            i.lowest_device,
            bytes(i.lowest_peak_bytes),
            i.rule
        )));
    }
    let listed: Vec<String> = file.devices.iter().map(|d| d.device.to_string()).collect();
    out.push(Block::Para(format!(
        "More devices than one can read through: each is one row below, and only devices {} \
         (the first with an OOM, the highest peak, the outliers) have a section; \
         --all-devices gives every device one.",
        listed.join(", ")
    )));
    let outlier = sum
        .imbalance
        .as_ref()
        .map(|i| (i.highest_device, i.lowest_device));
    let rows = file
        .device_table
        .iter()
        .map(|d| {
            let mut marks = Vec::new();
            if sum.peak_device == Some(d.device) {
                marks.push("highest peak");
            }
            match outlier {
                Some((h, _)) if h == d.device => marks.push("outlier (high)"),
                Some((_, l)) if l == d.device => marks.push("outlier (low)"),
                _ => {}
            }
            if d.detailed {
                marks.push("detailed below");
            }
            vec![
                d.device.to_string(),
                bytes(d.peak_requested_bytes),
                d.oom_events.to_string(),
                format_bytes(d.max_reserved_bytes.max(0) as u64),
                marks.join(", "),
            ]
        })
        .collect();
    out.push(Block::Table {
        title: format!("Devices ({})", file.device_table.len()),
        header: vec!["device", "peak", "OOMs", "reserved", ""],
        right: vec![true, true, true, true, false],
        rows,
    });
    if !sum.empty_devices.is_empty() {
        let list: Vec<String> = sum.empty_devices.iter().map(|d| d.to_string()).collect();
        out.push(Block::Para(format!(
            "{} with nothing recorded (no segments, no trace entries): {}.",
            counted(sum.empty_devices.len() as u64, "device", "devices"),
            list.join(", ")
        )));
    }
    out
}

/// Wraps a paragraph at `width` columns.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
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

pub fn text(report: &Report, view: &View) -> String {
    text_styled(report, view, false)
}

/// [`text`] with the OOM verdicts in bold red when `color` is on (a terminal).
/// A heading of the text report, a blank line above it but at the top.
fn text_heading(out: &mut String, heading: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(out, "== {heading}");
}

pub fn text_styled(report: &Report, view: &View, color: bool) -> String {
    let mut out = String::new();
    for block in all_blocks(report, view)
        .into_iter()
        .map(Block::for_terminal)
    {
        match block {
            Block::Alert(p) => {
                for line in wrap(&p, 100) {
                    let _ = writeln!(
                        out,
                        "{}",
                        super::style::paint(&line, super::style::Tone::Bad, color)
                    );
                }
            }
            Block::Heading(h) => text_heading(&mut out, &h),
            Block::Section(h) => text_heading(&mut out, h),
            Block::Para(p) => {
                for line in wrap(&p, 100) {
                    let _ = writeln!(out, "{line}");
                }
            }
            Block::Lines(lines) => {
                for l in lines {
                    let _ = writeln!(out, "  {l}");
                }
            }
            Block::Items(items) => {
                for (i, (head, details)) in items.iter().enumerate() {
                    let lead = format!("  {}. ", i + 1);
                    for (j, line) in wrap(head, 100 - lead.len()).iter().enumerate() {
                        let prefix = if j == 0 {
                            lead.clone()
                        } else {
                            " ".repeat(lead.len())
                        };
                        let _ = writeln!(out, "{prefix}{line}");
                    }
                    for d in details {
                        for line in wrap(d, 100 - lead.len()) {
                            let _ = writeln!(out, "{}{line}", " ".repeat(lead.len()));
                        }
                    }
                }
            }
            Block::Table {
                title,
                header,
                right,
                rows,
            } => {
                let title_lines = wrap(&title, 100);
                let last = title_lines.len().saturating_sub(1);
                for (i, line) in title_lines.iter().enumerate() {
                    let colon = if i == last { ":" } else { "" };
                    let _ = writeln!(out, "{line}{colon}");
                }
                if rows.is_empty() {
                    let _ = writeln!(out, "  (none)");
                    continue;
                }
                let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
                for r in &rows {
                    for (w, c) in widths.iter_mut().zip(r) {
                        *w = (*w).max(c.chars().count());
                    }
                }
                let fmt_row = |cells: Vec<String>| {
                    let mut line = String::from(" ");
                    let last = cells.len().saturating_sub(1);
                    for (i, c) in cells.into_iter().enumerate() {
                        line.push(' ');
                        let pad = widths[i].saturating_sub(c.chars().count());
                        if right[i] {
                            line.push_str(&" ".repeat(pad));
                            line.push_str(&c);
                        } else if i == last {
                            line.push_str(&c);
                        } else {
                            line.push_str(&c);
                            line.push_str(&" ".repeat(pad));
                        }
                    }
                    line
                };
                let _ = writeln!(
                    out,
                    "{}",
                    fmt_row(header.iter().map(|h| h.to_string()).collect())
                );
                for r in rows {
                    let _ = writeln!(out, "{}", fmt_row(r));
                }
            }
        }
    }
    out
}

pub fn markdown(report: &Report, view: &View) -> String {
    let mut out = String::from("# snapscan report\n\n");
    for block in all_blocks(report, view) {
        match block {
            // The heading (a file's path and its device) is one code span.
            Block::Heading(h) => {
                let _ = writeln!(out, "## {}\n", safe::md_code(&safe::text(&h), false));
            }
            Block::Section(h) => {
                let _ = writeln!(out, "## {h}\n");
            }
            Block::Para(p) | Block::Alert(p) => {
                let _ = writeln!(out, "{}\n", safe::markdown(&p, false));
            }
            Block::Items(items) => {
                for (i, (head, details)) in items.iter().enumerate() {
                    let _ = writeln!(out, "{}. **{}**", i + 1, safe::markdown(head, false));
                    for d in details {
                        let _ = writeln!(out, "   - {}", safe::markdown(d, false));
                    }
                }
                out.push('\n');
            }
            Block::Lines(lines) => {
                let (fence, lines) = safe::md_fence(&lines);
                let _ = writeln!(out, "{fence}");
                for l in lines {
                    let _ = writeln!(out, "{l}");
                }
                let _ = writeln!(out, "{fence}\n");
            }
            Block::Table {
                title,
                header,
                right,
                rows,
            } => {
                let _ = writeln!(out, "**{}**\n", safe::markdown(&title, false));
                if rows.is_empty() {
                    out.push_str("(none)\n\n");
                    continue;
                }
                let _ = writeln!(out, "| {} |", header.join(" | "));
                let aligns: Vec<&str> = right
                    .iter()
                    .map(|r| if *r { "---:" } else { "---" })
                    .collect();
                let _ = writeln!(out, "| {} |", aligns.join(" | "));
                for r in rows {
                    let cells: Vec<String> = r
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            let code = header[i] == "call site" || header[i] == "file";
                            if code && !safe::has_names(c) && !c.is_empty() {
                                safe::md_code(c, true)
                            } else {
                                safe::markdown(c, true)
                            }
                        })
                        .collect();
                    let _ = writeln!(out, "| {} |", cells.join(" | "));
                }
                out.push('\n');
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Pictures (`report --svg DIR`): links to the SVG files, shown at the top of the Markdown report.
// Kept separate from the blocks above; written by the pictures work (render/svg_*.rs).

/// The pictures written for one input file, as links relative to the report.
#[derive(Clone, Debug)]
pub struct PictureLinks {
    pub file: String,
    pub timeline: String,
    pub segments: String,
}

/// [`markdown`] with a "Pictures" section right under the title.
pub fn markdown_with_pictures(report: &Report, view: &View, pictures: &[PictureLinks]) -> String {
    let body = markdown(report, view);
    if pictures.is_empty() {
        return body;
    }
    let mut section = String::from("## Pictures\n\n");
    for p in pictures {
        if pictures.len() > 1 {
            let _ = writeln!(section, "**{}**\n", safe::md_code(&p.file, false));
        }
        let _ = writeln!(
            section,
            "[![memory timeline]({t})]({t})\n\n[![segments]({s})]({s})\n",
            t = md_link(&p.timeline),
            s = md_link(&p.segments)
        );
    }
    match body.split_once("\n\n") {
        Some((title, rest)) => format!("{title}\n\n{section}{rest}"),
        None => format!("{body}\n{section}"),
    }
}

/// A link target safe in Markdown: spaces and parentheses escaped.
fn md_link(target: &str) -> String {
    target
        .replace('%', "%25")
        .replace(' ', "%20")
        .replace('(', "%28")
        .replace(')', "%29")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(peaks: &[i64]) -> Vec<StepSummary> {
        peaks
            .iter()
            .enumerate()
            .map(|(i, &peak)| StepSummary {
                step: i as u32 + 100,
                first_event: i as u32 * 10,
                last_event: i as u32 * 10 + 9,
                peak_requested_bytes: peak,
                peak_event: i as u32 * 10 + 5,
                start_requested_bytes: 0,
                start_growth_bytes: 0,
            })
            .collect()
    }

    #[test]
    fn long_runs_show_the_first_steps_those_around_the_peak_and_the_last() {
        let mut peaks = vec![10; 556];
        peaks[17] = 99;
        let all = steps(&peaks);
        // The report's peak step, by its number.
        assert_eq!(
            steps_shown(&all, Some(117), 8),
            vec![0, 1, 16, 17, 18, 553, 554, 555]
        );
        // Without it, the first of the highest step peaks.
        assert_eq!(
            steps_shown(&all, None, 8),
            vec![0, 1, 16, 17, 18, 553, 554, 555]
        );
        // A peak at either end, and a step number the list does not hold.
        assert_eq!(
            steps_shown(&all, Some(100), 8),
            vec![0, 1, 2, 553, 554, 555]
        );
        assert_eq!(steps_shown(&all, Some(655), 8), vec![0, 1, 553, 554, 555]);
        assert_eq!(
            steps_shown(&all, Some(7), 8),
            vec![0, 1, 16, 17, 18, 553, 554, 555]
        );
        // What fits is shown whole; a one-step gap shows its step instead of "…".
        assert_eq!(steps_shown(&all[..8], None, 8), (0..8).collect::<Vec<_>>());
        assert_eq!(
            steps_shown(&all[..9], Some(104), 8),
            (0..9).collect::<Vec<_>>()
        );
    }
}
