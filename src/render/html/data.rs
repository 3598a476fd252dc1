//! The data of `snapscan view`: per device, the allocations of the replay, the segment lifetimes
//! and the event times as columns of LEB128 varints (deltas where a column grows), with a JSON
//! header of everything small (stacks, call sites, phases, peak, OOMs). The page decodes the
//! columns into typed arrays; `view.js` documents the same layout.
//!
//! Allocations are in the order of their birth state (the state after `alloc_event + 1` events;
//! 0 for allocations made before the window). A state `k` is the allocator after `k` events: an
//! allocation is alive at `k` when `birth <= k < end` (`end` = `free_event + 1`, or `events + 1`
//! when it is never freed).

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use super::super::svg;
use crate::analysis::callsite::{
    call_site, code_path, format_frame, frame_class, is_native, viewer_shows, FrameClass,
};
use crate::analysis::category::{Categorizer, Category, Confidence};
use crate::analysis::layout::segment_lifetimes;
use crate::analysis::lifetimes::Origin;
use crate::analysis::phase::Phase;
use crate::analysis::report::DeviceParts;
use crate::snapshot::{Action, PoolKind, Snapshot, StackId};

/// Requests up to this size are served from the small pool (as the report's OOM figures).
const SMALL_REQUEST_LIMIT: u64 = 1 << 20;

/// Column bytes and their names, in the order the header lists them.
#[derive(Default)]
pub struct Columns {
    pub names: Vec<&'static str>,
    pub bytes: Vec<Vec<u8>>,
}

impl Columns {
    fn add(&mut self, name: &'static str, bytes: Vec<u8>) {
        self.names.push(name);
        self.bytes.push(bytes);
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// A column of varints.
struct Col(Vec<u8>);

impl Col {
    fn with_capacity(n: usize) -> Col {
        Col(Vec::with_capacity(n))
    }
    fn u(&mut self, v: u64) {
        varint(&mut self.0, v);
    }
    fn i(&mut self, v: i64) {
        varint(&mut self.0, zigzag(v));
    }
}

fn phase_index(p: Phase) -> usize {
    Phase::ALL.iter().position(|&x| x == p).unwrap_or(0)
}

fn confidence_index(c: Confidence) -> u8 {
    match c {
        Confidence::High => 0,
        Confidence::Medium => 1,
        Confidence::Low => 2,
    }
}

fn kind_name(k: PoolKind) -> &'static str {
    match k {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
        PoolKind::Unknown => "unknown",
    }
}

/// Big integers (stream handles, addresses) as JSON strings: a JavaScript number holds 53 bits.
fn big(v: u64) -> Value {
    if v < (1 << 53) {
        json!(v)
    } else {
        json!(v.to_string())
    }
}

/// Stacks of one device, numbered in order of first use (0 = no stack), with their frames.
struct Stacks<'a> {
    snapshot: &'a Snapshot,
    index: FxHashMap<StackId, u32>,
    ids: Vec<StackId>,
}

impl<'a> Stacks<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        let mut s = Stacks {
            snapshot,
            index: FxHashMap::default(),
            ids: Vec::new(),
        };
        s.of(StackId::EMPTY);
        s
    }

    fn of(&mut self, id: StackId) -> u32 {
        if let Some(&i) = self.index.get(&id) {
            return i;
        }
        let i = self.ids.len() as u32;
        self.index.insert(id, i);
        self.ids.push(id);
        i
    }

    /// The stacks as JSON ([`StacksJson`]).
    fn to_json(&self) -> StacksJson {
        let interner = &self.snapshot.interner;
        let mut frame_index: FxHashMap<String, u32> = FxHashMap::default();
        let mut frames: Vec<Value> = Vec::new();
        let mut stacks: Vec<Value> = Vec::with_capacity(self.ids.len());
        let mut site_index: FxHashMap<String, u32> = FxHashMap::default();
        let mut sites: Vec<String> = Vec::new();
        let mut stack_site: Vec<i64> = Vec::with_capacity(self.ids.len());
        let mut path_index: FxHashMap<Value, u32> = FxHashMap::default();
        let mut code_paths: Vec<Value> = Vec::new();
        let mut stack_code: Vec<i64> = Vec::with_capacity(self.ids.len());
        for &id in &self.ids {
            let mut list: Vec<u32> = Vec::new();
            for &fid in interner.get_stack(id) {
                let f = interner.get_frame(fid);
                let (name, file) = (interner.get_text(f.name), interner.get_text(f.filename));
                if !viewer_shows(name, file) {
                    continue;
                }
                let text = format_frame(interner, f);
                let next = frame_index.len() as u32;
                let k = *frame_index.entry(text.clone()).or_insert_with(|| {
                    let class = match frame_class(name, file) {
                        FrameClass::User => 0u8,
                        FrameClass::Package => 1,
                        FrameClass::Runtime => 2,
                    };
                    frames.push(json!([text, is_native(name, file) as u8, class]));
                    next
                });
                list.push(k);
            }
            stacks.push(json!(list));
            stack_site.push(match call_site(interner, id) {
                Some(site) => {
                    let next = site_index.len() as u32;
                    let k = *site_index.entry(site.clone()).or_insert_with(|| {
                        sites.push(site);
                        next
                    });
                    k as i64
                }
                None => -1,
            });
            let path = code_path(interner, id);
            stack_code.push(match path.class {
                None => -1,
                Some(class) => {
                    let key = json!([class.name(), path.your_code, path.via]);
                    let next = path_index.len() as u32;
                    i64::from(*path_index.entry(key.clone()).or_insert_with(|| {
                        code_paths.push(key);
                        next
                    }))
                }
            });
        }
        StacksJson {
            frames: json!(frames),
            stacks: json!(stacks),
            sites: json!(sites),
            stack_site: json!(stack_site),
            code_paths: json!(code_paths),
            stack_code: json!(stack_code),
            site_names: sites,
        }
    }
}

/// The page's stacks: `frames[i] = [text, native, class]` (class 0 the user's code, 1 a
/// package, 2 the runtime), `stacks[i]` its frames innermost first (the capture machinery left
/// out), `stack_site[i]` its call site in `sites`, and `stack_code[i]` whose code it is in
/// `code_paths`: `[class, your_code, via]` as the report's call sites say it.
struct StacksJson {
    frames: Value,
    stacks: Value,
    sites: Value,
    stack_site: Value,
    code_paths: Value,
    stack_code: Value,
    site_names: Vec<String>,
}

/// Header and columns of one device, from what its report was made of (`parts`: the replay,
/// the phases and, where the report ran the allocator model, its block sizes).
pub fn device_data(
    name: &str,
    snapshot: &Snapshot,
    device: i64,
    parts: &DeviceParts,
    host: Option<&crate::analysis::host::HostLevels>,
) -> (Value, Columns) {
    let replay = &parts.replay;
    let phases = &parts.phases;
    let trace = snapshot.trace(device);
    // Where the report explains an OOM with the allocator model, the page's allocator state
    // uses its exact block sizes too (unsplit remainders included), so that both show the
    // same holes; elsewhere the block sizes are the requests rounded, as before.
    let block_of = |a: &crate::analysis::lifetimes::Allocation| -> u64 {
        let Some(model) = &parts.model_blocks else {
            return a.block_bytes;
        };
        let size = match a.alloc_event {
            Some(e) => model.by_alloc_event.get(&e),
            None => model.at_start.get(&a.address),
        };
        size.copied().unwrap_or(a.block_bytes)
    };
    let n = replay.events;
    let (peak, peak_event) = replay.requested.peak();
    let (reserved_peak, reserved_peak_event) = replay.reserved.peak();
    let mut timer = crate::timing::Timer::new();
    let categorizer = Categorizer::new(snapshot, phases, replay);
    timer.lap("view: categorizer");
    let mut stacks = Stacks::new(snapshot);
    let mut streams: Vec<u64> = vec![0];
    let stream_of = |s: u64, streams: &mut Vec<u64>| -> u64 {
        match streams.iter().position(|&x| x == s) {
            Some(i) => i as u64,
            None => {
                streams.push(s);
                (streams.len() - 1) as u64
            }
        }
    };

    // Allocations, in order of birth state.
    let count = replay.allocations.len();
    let mut rows: Vec<(u64, usize)> = Vec::with_capacity(count);
    let mut all = Vec::with_capacity(count);
    for (i, a) in replay.allocations.values().enumerate() {
        rows.push((a.alloc_event.map_or(0, |e| u64::from(e) + 1), i));
        all.push(a);
    }
    rows.sort_unstable();
    let mut birth = Col::with_capacity(count * 2);
    let mut life = Col::with_capacity(count * 2);
    let mut req = Col::with_capacity(count * 3);
    let mut blk = Col::with_capacity(count);
    let mut addr = Col::with_capacity(count * 3);
    let mut stack = Col::with_capacity(count);
    let mut stream = Col::with_capacity(count);
    let mut flags: Vec<u8> = Vec::with_capacity(count);
    let mut pend = Col::with_capacity(count);
    let (mut last_birth, mut last_addr) = (0u64, 0u64);
    let mut categories_present = [false; Category::ALL.len()];
    // The user's `_annotate_tensor` texts, by row (few: the page lists them sparsely).
    let mut annotations: Vec<Value> = Vec::new();
    for (row, &(b, i)) in rows.iter().enumerate() {
        let a = &all[i];
        let texts = categorizer.annotations.of_allocation(a);
        if !texts.is_empty() {
            let texts: Vec<&str> = texts
                .iter()
                .map(|&t| snapshot.interner.get_text(t))
                .collect();
            annotations.push(json!([row, texts.join("; ")]));
        }
        let end = a.free_event.map_or(n as u64 + 1, |f| u64::from(f) + 1);
        birth.u(b - last_birth);
        last_birth = b;
        life.u(end.saturating_sub(b));
        req.u(a.requested_bytes);
        blk.i(block_of(a).wrapping_sub(a.requested_bytes) as i64);
        addr.i(a.address.wrapping_sub(last_addr) as i64);
        last_addr = a.address;
        stack.u(u64::from(stacks.of(a.stack)));
        stream.u(stream_of(a.stream, &mut streams));
        let (cat, conf) = categorizer.categorize(a);
        let c = svg::category_index(cat);
        categories_present[c] |= a.requested_bytes > 0;
        let origin = match a.origin {
            Origin::Traced => 0u8,
            Origin::FreedInWindow => 1,
            Origin::Ghost => 2,
        };
        flags.push(c as u8 | confidence_index(conf) << 3 | origin << 5);
        // A free requested but not completed: the block is pending from that state on.
        pend.u(match a.free_requested_event {
            Some(r) if a.free_event.is_none_or(|f| r < f) => {
                end.saturating_sub(u64::from(r) + 1) + 1
            }
            _ => 0,
        });
    }

    timer.lap("view: allocation columns");
    // Event times (µs since the first timed event), and the events with a stack of their own.
    let t0 = trace.iter().find_map(|e| e.time_us);
    let mut times = Col::with_capacity(n);
    let mut last_t = 0i64;
    let mut ooms = Vec::new();
    for (i, e) in trace.iter().enumerate() {
        if let (Some(t), Some(t0)) = (e.time_us, t0) {
            let rel = t.saturating_sub(t0);
            times.i(rel.saturating_sub(last_t));
            last_t = rel;
        } else {
            times.i(0);
        }
        if e.action == Action::Oom {
            let kind = if e.size <= SMALL_REQUEST_LIMIT {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            ooms.push(json!({
                "event": i,
                "size": e.size,
                "stream": stream_of(e.stream, &mut streams),
                "device_free": e.device_free,
                "stack": stacks.of(e.frames),
                "kind": kind_name(kind),
            }));
        }
    }

    // Segments over the trace.
    timer.lap("view: event columns");
    let lives = segment_lifetimes(snapshot, replay);
    timer.lap("view: segment lifetimes");
    let mut pools: Vec<Option<(i64, i64)>> = vec![None];
    let mut s_addr = Col::with_capacity(lives.len() * 3);
    let mut s_size = Col::with_capacity(lives.len() * 3);
    let mut s_stream = Col::with_capacity(lives.len());
    let mut s_pool = Col::with_capacity(lives.len());
    let mut s_kind: Vec<u8> = Vec::with_capacity(lives.len());
    let mut s_first = Col::with_capacity(lives.len() * 2);
    let mut s_span = Col::with_capacity(lives.len() * 2);
    let mut prev = 0u64;
    for s in &lives {
        s_addr.i(s.address.wrapping_sub(prev) as i64);
        prev = s.address;
        s_size.u(s.size);
        s_stream.u(stream_of(s.stream, &mut streams));
        let p = match pools.iter().position(|&x| x == s.pool_id) {
            Some(p) => p,
            None => {
                pools.push(s.pool_id);
                pools.len() - 1
            }
        };
        s_pool.u(p as u64);
        let kind = match s.pool_kind {
            PoolKind::Small => 0u8,
            PoolKind::Large => 1,
            PoolKind::Unknown => 2,
        };
        s_kind.push(kind | (s.expandable as u8) << 2);
        s_first.u(u64::from(s.first_state));
        s_span.u(u64::from(s.last_state.saturating_sub(s.first_state)));
    }

    let stacks = stacks.to_json();
    let site_names = &stacks.site_names;
    let site_colours: Vec<&str> = {
        let mut colours = svg::Colours::new(&snapshot.interner);
        colours.assign_distinct(&site_names[..site_names.len().min(svg::PALETTE.len())]);
        site_names.iter().map(|s| colours.site_colour(s)).collect()
    };
    let intervals: Vec<Value> = phases
        .intervals
        .iter()
        .map(|iv| {
            json!([
                phase_index(iv.name),
                iv.step.map_or(-1, i64::from),
                iv.first_event,
                iv.last_event
            ])
        })
        .collect();
    let mut columns = Columns::default();
    for (name, col) in [
        ("birth", birth),
        ("life", life),
        ("req", req),
        ("blk", blk),
        ("addr", addr),
        ("stack", stack),
        ("stream", stream),
        ("pend", pend),
        ("time", times),
        ("seg_addr", s_addr),
        ("seg_size", s_size),
        ("seg_stream", s_stream),
        ("seg_pool", s_pool),
        ("seg_first", s_first),
        ("seg_span", s_span),
    ] {
        columns.add(name, col.0);
    }
    columns.add("flags", flags);
    columns.add("seg_kind", s_kind);
    let header = json!({
        "file": name,
        "device": device,
        "events": n,
        "allocations": count,
        "segments": lives.len(),
        "timed": t0.is_some(),
        "peak": {
            "bytes": peak.max(0),
            "event": peak_event,
            "time_s": peak_event
                .and_then(|e| Some((trace.get(e as usize)?.time_us? - t0?) as f64 / 1e6)),
        },
        "reserved_peak": {
            "bytes": reserved_peak.max(0),
            "event": reserved_peak_event,
        },
        "starts_mid_run": replay.starts_mid_run(),
        "annotations": annotations,
        "ooms": ooms,
        "phases": intervals,
        "phases_unknown_reason": phases.unknown_reason,
        "categories_present": categories_present,
        "streams": streams.iter().map(|&s| big(s)).collect::<Vec<_>>(),
        "pools": pools
            .iter()
            .map(|p| p.map(|(a, b)| format!("({a},{b})")))
            .collect::<Vec<_>>(),
        // What each pool is (no pool id: the default pool), for the segments' pool filter.
        "pool_kinds": pools
            .iter()
            .map(|p| crate::analysis::pools::kind_of(
                p.unwrap_or(crate::analysis::pools::DEFAULT_POOL),
                crate::analysis::pools::FrameHint::Nothing,
            ))
            .collect::<Vec<_>>(),
        "small_request_limit": SMALL_REQUEST_LIMIT,
        "frames": stacks.frames,
        "stacks": stacks.stacks,
        "sites": stacks.sites,
        "stack_site": stacks.stack_site,
        "code_paths": stacks.code_paths,
        "stack_code": stacks.stack_code,
        "site_colours": site_colours,
        "host": host.map_or(Value::Null, |levels| host_lane(levels, trace)),
    });
    (header, columns)
}

/// The pinned host memory lane (torch 2.14+ `host_traces`) on this device's states (the page
/// has `null` where the dump recorded no host trace).
fn host_lane(levels: &crate::analysis::host::HostLevels, trace: &crate::snapshot::Trace) -> Value {
    let lane = crate::analysis::host::host_lane(levels, trace);
    json!({
        "by_time": lane.by_time,
        "start": [lane.start_allocated, lane.start_reserved],
        "state": lane.states,
        "allocated": lane.allocated,
        "reserved": lane.reserved,
        "peak_allocated": lane.peak_allocated,
        "peak_reserved": lane.peak_reserved,
    })
}

/// Names and colours shared by every device (categories, confidences, phases).
pub fn legend() -> Value {
    json!({
        "categories": Category::ALL.iter().map(|c| c.name()).collect::<Vec<_>>(),
        "category_colours": Category::ALL.iter().map(|&c| svg::category_colour(c)).collect::<Vec<_>>(),
        "confidences": ["high", "medium", "low"],
        "phases": Phase::ALL.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "phase_colours": Phase::ALL.iter().map(|&p| svg::phase_colour(p).0).collect::<Vec<_>>(),
        "phase_ink": Phase::ALL.iter().map(|&p| svg::phase_colour(p).1).collect::<Vec<_>>(),
        "palette": svg::PALETTE,
    })
}

/// The page's overview of a job (a row per rank file, or per device of one file): its figures,
/// the outliers and why, and the panel each row opens (`-1`: none on this page).
pub fn overview(
    table: &crate::report::RankTable,
    by_device: bool,
    panels: &[(&str, i64)],
) -> Value {
    let panel_of: rustc_hash::FxHashMap<(&str, i64), usize> = panels
        .iter()
        .enumerate()
        .rev()
        .map(|(i, &key)| (key, i))
        .collect();
    let rows: Vec<Value> = table
        .rows
        .iter()
        .map(|r| {
            let panel = r
                .peak_device
                .and_then(|d| panel_of.get(&(r.path.as_str(), d)))
                .map_or(-1, |&i| i as i64);
            let who = match (by_device, r.rank) {
                (true, _) => format!("device {}", r.peak_device.unwrap_or(-1)),
                (false, Some(k)) => format!("rank {k}"),
                (false, None) => r.path.clone(),
            };
            json!({
                "label": who,
                "path": r.path,
                "device": r.peak_device,
                "peak": r.peak_requested_bytes.max(0),
                "reserved_at_peak": r.reserved_at_peak_bytes,
                "max_reserved": r.max_reserved_bytes,
                "oom": r.oom,
                "outlier": r.outlier,
                "error": r.error,
                "reason": r.outlier_reason.as_ref().map(|why| {
                    crate::analysis::outlier::reason_text(&who, why, |s| format!("`{s}`"))
                }),
                "panel": panel,
            })
        })
        .collect();
    json!({
        "kind": if by_device { "devices" } else { "ranks" },
        "median_peak": table.median_peak_requested_bytes.max(0),
        "one_job": table.ranks_of_one_job,
        "rule": table.outlier_rule,
        "rows": rows,
    })
}

/// Points per run of the compare page's curves: each the highest level of its range of events
/// (so the peak is exact at any zoom of that picture).
const COMPARE_POINTS: usize = 1500;

/// `(first event, highest requested, highest reserved)` per range of events, ranges of equal
/// length; the level at window start first (event -1).
fn curve_points(replay: &crate::analysis::lifetimes::DeviceReplay) -> Vec<Value> {
    let n = replay.events;
    let mut out = vec![json!([
        -1,
        replay.requested.start.max(0),
        replay.reserved.start.max(0)
    ])];
    let buckets = n.min(COMPARE_POINTS);
    for b in 0..buckets {
        let (first, last) = (b * n / buckets, ((b + 1) * n / buckets).saturating_sub(1));
        let (req, _) = replay.requested.peak_between(first, last);
        let (res, _) = replay.reserved.peak_between(first, last);
        out.push(json!([first, req.max(0), res.max(0)]));
    }
    out
}

/// Where each training step begins, then where the last one ends (one past its last event):
/// the knots that line the two runs' steps up on the compare page. Empty without steps.
fn step_knots(steps: &[crate::report::StepSummary]) -> Vec<u32> {
    let mut knots: Vec<u32> = steps.iter().map(|s| s.first_event).collect();
    if let Some(last) = steps.last() {
        knots.push(last.last_event.saturating_add(1));
    }
    knots
}

/// The allocator's state at a run's peak, as its report gives it: the figures the compare page
/// puts side by side.
fn state_at_peak(report: &crate::report::DeviceReport) -> Value {
    let (peak, frag) = (&report.peak, &report.fragmentation_at_peak);
    json!({
        "requested": peak.requested_bytes.max(0),
        "allocated": peak.allocated_bytes.max(0),
        "reserved": peak.reserved_bytes.max(0),
        "cached_free": frag.reserved_unallocated_bytes,
        "free_blocks": frag.holes,
        "largest_free_block": frag.largest_hole_bytes,
        "fragmentation": frag.fragmentation_ratio,
        "phase": peak.phase,
        "step": peak.step,
        "peak_reserved": report.peak_reserved.bytes.max(0),
        "ooms": report.oom_events(),
    })
}

/// The compare page's section: both runs' curves, peaks, step starts and allocator state at
/// the peak, and the call sites and categories at the peak that changed, from the diff of their
/// reports. `panels` are the base's and the new run's, `reports` their devices' reports.
pub fn compare(
    diff: &crate::report::DiffReport,
    panels: &[super::Panel],
    reports: &[&crate::report::DeviceReport],
) -> Value {
    use crate::report::{Change, KeyDelta};
    let runs: Vec<Value> = panels
        .iter()
        .zip(reports)
        .enumerate()
        .map(|(i, (p, report))| {
            let replay = &p.parts.replay;
            let (peak, peak_event) = replay.requested.peak();
            json!({
                "file": p.name,
                "device": p.device,
                "panel": i,
                "events": replay.events,
                "peak": peak.max(0),
                "peak_event": peak_event,
                "points": curve_points(replay),
                "steps": step_knots(&report.steps),
                "state": state_at_peak(report),
            })
        })
        .collect();
    let device = diff
        .devices
        .iter()
        .find(|d| panels.first().is_some_and(|p| p.device == d.device))
        .or(diff.devices.first());
    let rows = |list: &[KeyDelta], keep: usize| -> Vec<Value> {
        let mut changed: Vec<&KeyDelta> =
            list.iter().filter(|k| k.change != Change::Same).collect();
        changed.sort_by_key(|k| std::cmp::Reverse(k.delta_bytes.unsigned_abs()));
        changed
            .into_iter()
            .take(keep)
            .map(|k| {
                json!({
                    "key": k.key,
                    "change": k.change,
                    "base": k.base_bytes,
                    "new": k.new_bytes,
                    "delta": k.delta_bytes,
                })
            })
            .collect()
    };
    json!({
        "runs": runs,
        "peak_delta": device.map(|d| d.peak.delta),
        "sites": device.map(|d| rows(&d.call_sites_at_peak, 40)).unwrap_or_default(),
        "categories": device.map(|d| rows(&d.categories_at_peak, 20)).unwrap_or_default(),
    })
}
