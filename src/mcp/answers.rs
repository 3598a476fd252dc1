//! What each tool answers, as JSON: the report's, the store's or the allocator model's own
//! figures, cut to what an agent asked for (`top`, `cursor`), never computed a second way.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use super::cache::Analysed;
use super::{
    AllocationArgs, CheckArgs, DeviceArgs, DiffArgs, ExplainArgs, LiveAtArgs, QueryArgs,
    ReportArgs, SegmentsAtArgs, State, WhatifArgs, WhyOomArgs,
};
use crate::analysis::layout::{Detail, Moment};
use crate::analysis::report::{call_site_table, DeviceParts};
use crate::report::{CallSiteBytes, DeviceReport, StackTable, SCHEMA_VERSION};

type Answer = Result<Value, String>;

fn to_json<T: serde::Serialize>(value: &T) -> Answer {
    serde_json::to_value(value).map_err(|e| e.to_string())
}

fn analysed(state: &State, path: &str) -> Result<std::sync::Arc<Analysed>, String> {
    let real = state.resolve(path)?;
    state.cache.get(&real)
}

/// The device asked for, or the report's first (the OOM device, else the highest peak).
fn device(a: &Analysed, want: Option<i64>) -> Result<(&DeviceReport, &DeviceParts), String> {
    let name = &a.loaded.name;
    let report = match want {
        Some(d) => a
            .report
            .devices
            .iter()
            .find(|r| r.device == d)
            .ok_or_else(|| {
                let known: Vec<String> = a
                    .report
                    .devices
                    .iter()
                    .map(|r| r.device.to_string())
                    .collect();
                format!(
                    "{name}: no device {d} in this snapshot (devices: {})",
                    known.join(", ")
                )
            })?,
        None => a.report.devices.first().ok_or_else(|| {
            format!("{name}: an empty snapshot (no segments, no trace): nothing to answer")
        })?,
    };
    let parts = a
        .parts
        .iter()
        .find(|p| p.replay.device == report.device)
        .ok_or_else(|| format!("{name}: device {} was not analysed", report.device))?;
    Ok((report, parts))
}

/// The stacks `sites` name, renumbered into a table of their own (a page of sites carries only
/// the stacks it uses).
fn own_stacks(sites: &mut [CallSiteBytes], table: &StackTable) -> StackTable {
    let mut out = Vec::new();
    let mut index = rustc_hash::FxHashMap::default();
    for s in sites {
        if let Some(id) = s.stack_id {
            let new = *index.entry(id).or_insert_with(|| {
                out.push(table.get(id as usize).cloned().unwrap_or_default());
                out.len() - 1
            });
            s.stack_id = Some(new as u32);
        }
    }
    out
}

/// A page of `items` from `cursor`, and the cursor of the next page if there is one.
fn page<T: Clone>(items: &[T], cursor: Option<usize>, top: usize) -> (Vec<T>, Option<usize>) {
    let start = cursor.unwrap_or(0).min(items.len());
    let end = start.saturating_add(top).min(items.len());
    (
        items[start..end].to_vec(),
        (end < items.len()).then_some(end),
    )
}

/// A device's report with each list cut to `top`.
fn cut(d: &mut DeviceReport, top: usize) {
    d.live_at_peak.truncate(top);
    d.live_at_peak_by_call_site.truncate(top);
    d.held_open.allocations.truncate(top);
    d.held_open.by_call_site.truncate(top);
    d.segments.truncate(top);
    d.oom.truncate(top);
    for o in &mut d.oom {
        o.live_by_call_site.truncate(top);
        o.segments.truncate(top);
    }
    if let Some(g) = &mut d.step_growth {
        g.kept_into_later_steps_by_call_site.truncate(top);
    }
}

pub fn report(state: &State, args: &ReportArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let top = args.top.unwrap_or(10);
    let mut file = a.report.clone();
    if let Some(d) = args.device {
        file.devices.retain(|r| r.device == d);
        if file.devices.is_empty() {
            device(&a, Some(d))?;
        }
        // The headline of that device alone, as the CLI's `report --device` gives it.
        let digests: Vec<crate::analysis::headline::DeviceDigest> = file
            .devices
            .iter()
            .map(|r| crate::analysis::headline::DeviceDigest::of(r, true))
            .collect();
        file.summary = crate::analysis::headline::file_summary(&digests);
        file.device_table.clear();
    }
    for d in &mut file.devices {
        cut(d, top);
    }
    let report = crate::report::Report {
        schema_version: SCHEMA_VERSION,
        files: vec![file],
        ranks: None,
        unreadable: Vec::new(),
    };
    let mut value = to_json(&report)?;
    value["lists_cut_to"] = top.into();
    Ok(value)
}

pub fn peak(state: &State, args: &DeviceArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let (d, _) = device(&a, args.device)?;
    let mut sites = d.live_at_peak_by_call_site.clone();
    sites.truncate(args.top.unwrap_or(10));
    let stacks = own_stacks(&mut sites, &d.stacks);
    Ok(json!({
        "path": a.loaded.name,
        "device": d.device,
        "peak": d.peak,
        "peak_allocated": d.peak_allocated,
        "peak_reserved": d.peak_reserved,
        "categories_at_peak": d.categories_at_peak,
        "phases_at_peak": d.phases_at_peak,
        "live_at_peak_by_call_site": sites,
        "call_sites_at_peak": d.live_at_peak_by_call_site.len()
            + d.live_at_peak_by_call_site_omitted.as_ref().map_or(0, |o| o.count as usize),
        "stacks": stacks,
    }))
}

/// The event a question names: `event`, or the last event at or before `time_us`, or the peak.
fn event_of(
    a: &Analysed,
    d: &DeviceReport,
    event: Option<u32>,
    time_us: Option<i64>,
) -> Result<Option<u32>, String> {
    let trace = a.loaded.snapshot.trace(d.device);
    match (event, time_us) {
        (Some(e), _) if (e as usize) < trace.len() => Ok(Some(e)),
        (Some(e), _) => Err(format!(
            "{}: event {e} is past the trace of device {} ({} events)",
            a.loaded.name,
            d.device,
            trace.len()
        )),
        (None, Some(t)) => {
            let mut found = None;
            trace.for_each_time(0..trace.len(), |i, time| {
                if time.is_some_and(|x| x <= t) {
                    found = Some(i as u32);
                }
            });
            found.map(Some).ok_or_else(|| {
                format!(
                    "{}: no event of device {} at or before {t} µs",
                    a.loaded.name, d.device
                )
            })
        }
        (None, None) => Ok(d.peak.event_index),
    }
}

pub fn live_at(state: &State, args: &LiveAtArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let (d, parts) = device(&a, args.device)?;
    let event = event_of(&a, d, args.event, args.time_us)?;
    let live: Vec<_> = parts.replay.allocations.live(event).collect();
    let total: i64 = live
        .iter()
        .map(|x| x.requested_bytes as i64)
        .fold(0, i64::saturating_add);
    let (sites, table) = call_site_table(&a.loaded.snapshot, live.iter(), total);
    let (mut shown, next_cursor) = page(&sites, args.cursor, args.top.unwrap_or(20));
    let stacks = own_stacks(&mut shown, &table);
    let trace = a.loaded.snapshot.trace(d.device);
    Ok(json!({
        "path": a.loaded.name,
        "device": d.device,
        "event": event,
        "time_us": event.and_then(|e| trace.get(e as usize)).and_then(|t| t.time_us),
        "phase": parts.phases.at(event).name(),
        "requested_bytes": total,
        "allocations": live.len(),
        "call_sites": sites.len(),
        "by_call_site": shown,
        "stacks": stacks,
        "next_cursor": next_cursor,
    }))
}

fn parse_address(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("address {text:?}: expected a decimal or 0x-hex number"))
}

pub fn allocation(state: &State, args: &AllocationArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let (d, parts) = device(&a, args.device)?;
    let address = args.address.as_deref().map(parse_address).transpose()?;
    if address.is_none() && args.event.is_none() {
        return Err("give an address or an event".into());
    }
    let mut found: Vec<(usize, crate::analysis::lifetimes::Allocation)> = parts
        .replay
        .allocations
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, x)| address.is_none_or(|ad| x.address == ad))
        .filter(|(_, x)| {
            args.event.is_none_or(|e| {
                x.alloc_event == Some(e)
                    || x.free_event == Some(e)
                    || x.free_requested_event == Some(e)
            })
        })
        .collect();
    found.sort_by_key(|(_, x)| (x.alloc_event.map_or(-1, i64::from), x.address));
    let (shown, next_cursor) = page(&found, args.cursor, args.top.unwrap_or(10));
    let snapshot = &a.loaded.snapshot;
    let trace = snapshot.trace(d.device);
    let claims = a.claims(parts);
    let sites = crate::analysis::callsite::CallSites::new(&snapshot.interner);
    let time = |e: Option<u32>| {
        e.and_then(|i| trace.get(i as usize))
            .and_then(|t| t.time_us)
    };
    let lives: Vec<Value> = shown
        .iter()
        .map(|(i, x)| {
            let claim = claims.claims[*i];
            let annotations: Vec<&str> = claims
                .annotations
                .of_allocation(x)
                .iter()
                .map(|&t| snapshot.interner.get_text(t))
                .collect();
            json!({
                "address": x.address,
                "requested_bytes": x.requested_bytes,
                "block_bytes": x.block_bytes,
                "alloc_event": x.alloc_event,
                "alloc_time_us": time(x.alloc_event),
                "free_requested_event": x.free_requested_event,
                "free_event": x.free_event,
                "free_time_us": time(x.free_event),
                "stream": x.stream,
                "origin": x.origin.name(),
                "category": claim.category.name(),
                "confidence": claim.confidence.name(),
                "category_evidence": claim.evidence,
                "phase": parts.phases.at(x.alloc_event).name(),
                "step": parts.phases.step_at(x.alloc_event),
                "call_site": sites.of(x.stack).map_or_else(|| x.origin.label().to_owned(), |s| s.to_string()),
                "stack": crate::analysis::callsite::stack_lines(&snapshot.interner, x.stack),
                "annotations": annotations,
            })
        })
        .collect();
    if found.is_empty() {
        return Err(format!(
            "{}: no allocation of device {} {}",
            a.loaded.name,
            d.device,
            match (address, args.event) {
                (Some(ad), _) => format!("at address {ad:#x}"),
                (None, Some(e)) => format!("made or freed at event {e}"),
                (None, None) => String::new(),
            }
        ));
    }
    Ok(json!({
        "path": a.loaded.name,
        "device": d.device,
        "found": found.len(),
        "allocations": lives,
        "next_cursor": next_cursor,
    }))
}

/// The layouts' indices, most free bytes first (then by address): the keys are sorted, not the
/// layouts (sorting those moved each of a big dump's hundreds of thousands of layouts many
/// times, more than half the answer's time).
fn most_free_first(layouts: &[crate::analysis::layout::SegmentLayout]) -> Vec<u32> {
    use rayon::prelude::*;
    let mut keys: Vec<(std::cmp::Reverse<u64>, u64, u32)> = layouts
        .iter()
        .enumerate()
        .map(|(i, l)| (std::cmp::Reverse(l.free_bytes), l.address, i as u32))
        .collect();
    // The index makes every key distinct: the unstable sort gives one order.
    keys.par_sort_unstable();
    keys.into_iter().map(|(_, _, i)| i).collect()
}

pub fn segments_at(state: &State, args: &SegmentsAtArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let (d, parts) = device(&a, args.device)?;
    let (moment, event) = match args.event.as_deref().map(str::trim) {
        Some("dump") => (Moment::End, None),
        Some(text) => {
            let e: u32 = text
                .parse()
                .map_err(|_| format!("event {text:?}: expected a trace index or `dump`"))?;
            let e = event_of(&a, d, Some(e), None)?;
            (e.map_or(Moment::WindowStart, Moment::After), e)
        }
        None => (
            d.peak
                .event_index
                .map_or(Moment::WindowStart, Moment::After),
            d.peak.event_index,
        ),
    };
    let detail = Detail {
        blocks: false,
        small_hole_limit: 0,
    };
    let key = (d.device, moment);
    let kept = a
        .last_layout
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .filter(|(k, _)| *k == key)
        .map(|(_, l)| l.clone());
    let layouts = match kept {
        Some(l) => l,
        None => {
            let layouts = crate::analysis::layout::layout_from_lifetimes(
                &a.loaded.snapshot,
                &parts.replay,
                a.segment_lives(parts),
                moment,
                detail,
            );
            let fresh = std::sync::Arc::new(super::cache::SegmentsByFree {
                most_free_first: most_free_first(&layouts),
                layouts,
            });
            *a.last_layout.lock().unwrap_or_else(|e| e.into_inner()) = Some((key, fresh.clone()));
            fresh
        }
    };
    let sum = |f: fn(&crate::analysis::layout::SegmentLayout) -> u64| {
        layouts
            .layouts
            .iter()
            .map(f)
            .fold(0u64, u64::saturating_add)
    };
    let totals = json!({
        "segments": layouts.layouts.len(),
        "reserved_bytes": sum(|s| s.total_bytes),
        "allocated_bytes": sum(|s| s.allocated_bytes),
        "requested_bytes": sum(|s| s.requested_bytes),
        "free_bytes": sum(|s| s.free_bytes),
        "largest_hole_bytes": layouts.layouts.iter().map(|s| s.largest_hole_bytes).max().unwrap_or(0),
    });
    let (shown, next_cursor) = page(
        &layouts.most_free_first,
        args.cursor,
        args.top.unwrap_or(10),
    );
    let segments: Vec<Value> = shown
        .iter()
        .filter_map(|&i| layouts.layouts.get(i as usize))
        .map(|s| {
            json!({
                "address": s.address,
                "total_bytes": s.total_bytes,
                "allocated_bytes": s.allocated_bytes,
                "requested_bytes": s.requested_bytes,
                "free_bytes": s.free_bytes,
                "holes": s.holes,
                "largest_hole_bytes": s.largest_hole_bytes,
                "internal_waste_bytes": s.internal_waste_bytes,
                "stream": s.stream,
                "pool_id": s.pool_id,
                "pool_kind": s.pool_kind,
                "expandable": s.expandable,
            })
        })
        .collect();
    Ok(json!({
        "path": a.loaded.name,
        "device": d.device,
        "moment": match moment { Moment::End => "dump", Moment::WindowStart => "window_start", Moment::After(_) => "after_event" },
        "event": event,
        "totals": totals,
        "segments": segments,
        "next_cursor": next_cursor,
    }))
}

pub fn why_oom(state: &State, args: &WhyOomArgs) -> Answer {
    let a = analysed(state, &args.path)?;
    let (d, _) = device(&a, args.device)?;
    if d.oom.is_empty() {
        return Err(format!(
            "{}: device {} had no OOM in the trace; its peak was {} bytes requested at event {}",
            a.loaded.name,
            d.device,
            d.peak.requested_bytes,
            d.peak
                .event_index
                .map_or("(window start)".into(), |e| e.to_string())
        ));
    }
    let i = args.index.unwrap_or(0);
    let mut oom = d.oom.get(i).cloned().ok_or_else(|| {
        format!(
            "{}: device {} has {} OOMs described (index {i} asked)",
            a.loaded.name,
            d.device,
            d.oom.len()
        )
    })?;
    oom.live_by_call_site.truncate(20);
    oom.segments.truncate(10);
    let stacks = own_stacks(&mut oom.live_by_call_site, &d.stacks);
    Ok(json!({
        "path": a.loaded.name,
        "device": d.device,
        "ooms": d.oom.len() as u64 + d.oom_omitted.unwrap_or(0),
        "index": i,
        "oom": oom,
        "stacks": stacks,
        "advice": d.advice,
    }))
}

/// A file's full report for `diff`: from a snapshot, or from a JSON report of one file.
fn full_report(state: &State, path: &str) -> Result<crate::report::FileReport, String> {
    let real = state.resolve(path)?;
    if crate::analysis::merge::looks_like_json_report(&real) {
        return crate::analysis::merge::read_one_report(&real).map_err(|e| format!("{e:#}"));
    }
    Ok(state.cache.get(&real)?.full_report().clone())
}

pub fn diff(state: &State, args: &DiffArgs) -> Answer {
    let mut base = full_report(state, &args.base)?;
    let mut new = full_report(state, &args.new)?;
    if let Some(d) = args.device {
        base.devices.retain(|x| x.device == d);
        new.devices.retain(|x| x.device == d);
    }
    let mut out = crate::analysis::diff::diff(&base, &new, None);
    let top = args.top.unwrap_or(10);
    for d in &mut out.devices {
        d.call_sites_at_peak.truncate(top);
    }
    to_json(&out)
}

pub fn explain_message(args: &ExplainArgs) -> Answer {
    to_json(&crate::explain::scan_str(&args.message))
}

pub fn check(state: &State, args: &CheckArgs) -> Answer {
    let size = |s: &Option<String>, what: &str| {
        s.as_deref()
            .map(|t| crate::units::parse_size(t).map_err(|e| format!("{what} {t}: {e}")))
            .transpose()
    };
    let budgets = crate::report::Budgets {
        max_peak_bytes: size(&args.max_peak, "max_peak")?,
        max_reserved_bytes: size(&args.max_reserved, "max_reserved")?,
        max_fragmentation_ratio: args
            .max_fragmentation
            .as_deref()
            .map(|t| {
                crate::analysis::check::parse_ratio(t)
                    .map_err(|e| format!("max_fragmentation {t}: {e}"))
            })
            .transpose()?,
        fail_on_oom: args.fail_on_oom.unwrap_or(false),
    };
    if budgets.max_peak_bytes.is_none()
        && budgets.max_reserved_bytes.is_none()
        && budgets.max_fragmentation_ratio.is_none()
        && !budgets.fail_on_oom
    {
        return Err(
            "give at least one budget: max_peak, max_reserved, max_fragmentation or fail_on_oom"
                .into(),
        );
    }
    let a = analysed(state, &args.path)?;
    let mut file = a.report.clone();
    if let Some(d) = args.device {
        file.devices.retain(|x| x.device == d);
    }
    if file.devices.is_empty() {
        device(&a, args.device)?;
    }
    let report = crate::report::Report {
        schema_version: SCHEMA_VERSION,
        files: vec![file],
        ranks: None,
        unreadable: Vec::new(),
    };
    to_json(&crate::analysis::check::check(&report, &budgets))
}

pub fn whatif(state: &State, args: &WhatifArgs) -> Answer {
    let scales = args
        .scale
        .iter()
        .map(|s| crate::analysis::whatif::parse_scale(s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("scale {e}"))?;
    let capacity = args
        .capacity
        .as_deref()
        .map(|t| crate::units::parse_size(t).map_err(|e| format!("capacity {t}: {e}")))
        .transpose()?;
    let request = crate::analysis::whatif::Request {
        set: args.set.clone(),
        capacity,
        gpu: args.gpu.clone(),
        scales,
        drops: args.drop.clone(),
        optimizer: args.optimizer.clone(),
        search: args.search,
        full: false,
    };
    crate::analysis::whatif::validate(&request)?;
    let a = analysed(state, &args.path)?;
    let mut file = crate::analysis::whatif::whatif_file(
        &a.loaded.name,
        &a.loaded.snapshot,
        args.device,
        &request,
    );
    for d in &mut file.devices {
        d.real.reserved_curve = None;
        d.whatif.reserved_curve = None;
    }
    to_json(&crate::report::whatif::WhatifOutput {
        schema_version: SCHEMA_VERSION,
        files: vec![file],
    })
}

pub fn query(state: &State, args: &QueryArgs) -> Answer {
    let real = state.resolve(&args.path)?;
    let limit = args.limit.unwrap_or(100).min(10_000);
    let time_limit = Duration::from_secs(30);
    let answer = if crate::store::is_database(&real) {
        let mut conn = crate::store::query::open(&real).map_err(|e| format!("{e:#}"))?;
        crate::store::query::run(&mut conn, &args.sql, limit, time_limit)
    } else {
        let a = state.cache.get(&real)?;
        let db = a.database.get_or_init(|| {
            let mut conn = rusqlite::Connection::open_in_memory().map_err(|e| e.to_string())?;
            crate::store::fill(&mut conn, std::slice::from_ref(&a.loaded), None)
                .map_err(|e| format!("{}: building its database: {e}", a.loaded.name))?;
            let bytes: i64 = conn
                .query_row(
                    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                    [],
                    |r| r.get(0),
                )
                .unwrap_or(0);
            a.database_bytes
                .store(bytes.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
            crate::store::query::lock_down(&mut conn).map_err(|e| e.to_string())?;
            Ok(Mutex::new(conn))
        });
        let db = db.as_ref().map_err(Clone::clone)?;
        let mut conn = db.lock().unwrap_or_else(|e| e.into_inner());
        crate::store::query::run(&mut conn, &args.sql, limit, time_limit)
    };
    to_json(&answer.map_err(|e| format!("{e:#}"))?)
}
