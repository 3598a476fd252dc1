//! Pinned host memory (torch 2.14+, `_record_memory_history(..., record_pinned_host_memory=True)`):
//! the host allocator's segments at the dump (`host_segments`) and its one flat trace
//! (`host_traces`, entries of the device traces' shape). Its peak, what was alive then by call
//! site, and what was still held at the dump.

use rustc_hash::FxHashMap;

use super::callsite::{stack_table, CallSites};
use crate::report::{CallSiteBytes, HostMemory};
use crate::snapshot::{Action, BlockState, Snapshot, StackId};

/// Call sites listed per table.
const SITES: usize = 10;

/// What the snapshot holds of pinned host memory; `None` when it recorded none.
pub fn host_memory(snapshot: &Snapshot) -> Option<HostMemory> {
    let empty = crate::snapshot::Trace::EMPTY;
    let trace = snapshot.host_trace.as_ref().unwrap_or(&empty);
    if snapshot.host_segments.is_empty() && trace.is_empty() {
        return None;
    }
    let interner = &snapshot.interner;
    let (mut reserved_at_dump, mut allocated_at_dump) = (0u64, 0u64);
    let mut held: Vec<(u64, StackId)> = Vec::new();
    for s in &snapshot.host_segments {
        reserved_at_dump = reserved_at_dump.saturating_add(s.total_size);
        for b in &s.blocks {
            if b.state == BlockState::ActiveAllocated {
                allocated_at_dump = allocated_at_dump.saturating_add(b.size);
                held.push((b.size, b.frames));
            }
        }
    }
    // Levels over the trace, from the dump's with the trace undone (clamped: a cut trace can
    // free what it never allocated).
    let (mut net_alloc, mut net_reserved) = (0i128, 0i128);
    let mut live: FxHashMap<u64, (u64, StackId)> = FxHashMap::default();
    for i in 0..trace.len() {
        let e = trace.at(i);
        match e.action {
            Action::Alloc => net_alloc += i128::from(e.size),
            Action::FreeCompleted => net_alloc -= i128::from(e.size),
            Action::SegmentAlloc => net_reserved += i128::from(e.size),
            Action::SegmentFree => net_reserved -= i128::from(e.size),
            _ => {}
        }
    }
    let start_alloc = (i128::from(allocated_at_dump) - net_alloc).max(0);
    let start_reserved = (i128::from(reserved_at_dump) - net_reserved).max(0);
    let (mut level, mut reserved) = (start_alloc, start_reserved);
    let (mut peak, mut peak_event, mut peak_reserved) = (start_alloc, None, start_reserved);
    for i in 0..trace.len() {
        let e = trace.at(i);
        match e.action {
            Action::Alloc => level += i128::from(e.size),
            Action::FreeCompleted => level -= i128::from(e.size),
            Action::SegmentAlloc => reserved += i128::from(e.size),
            Action::SegmentFree => reserved -= i128::from(e.size),
            _ => continue,
        }
        if level > peak {
            (peak, peak_event) = (level, Some(i as u32));
        }
        peak_reserved = peak_reserved.max(reserved);
    }
    // The live set at the peak: allocations made in the window and not freed by then, and
    // what the window started with (no stack known for it).
    let mut traced_live = 0i128;
    if let Some(p) = peak_event {
        for i in 0..=p as usize {
            let e = trace.at(i);
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, (e.size, e.frames));
                }
                Action::FreeCompleted => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        traced_live = live.values().map(|v| i128::from(v.0)).sum();
    }
    let sites = CallSites::new(interner);
    let by_site = |items: &mut dyn Iterator<Item = (u64, StackId)>, total: u64| {
        let mut groups: FxHashMap<String, (u64, u64, (u64, StackId))> = FxHashMap::default();
        for (bytes, stack) in items {
            let site = sites
                .of(stack)
                .map_or_else(|| "(no stack recorded)".to_owned(), |s| s.to_string());
            let g = groups.entry(site).or_insert((0, 0, (0, stack)));
            g.0 = g.0.saturating_add(bytes);
            g.1 += 1;
            if bytes > g.2 .0 {
                g.2 = (bytes, stack);
            }
        }
        let mut rows: Vec<CallSiteBytes> = groups
            .into_iter()
            .map(|(call_site, (bytes, count, (_, stack)))| CallSiteBytes {
                call_site,
                bytes,
                count,
                share: if total == 0 {
                    0.0
                } else {
                    bytes as f64 / total as f64
                },
                stack_id: (stack != StackId::EMPTY).then_some(stack.0),
                code: None,
                your_code: None,
                via: None,
            })
            .collect();
        rows.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| a.call_site.cmp(&b.call_site))
        });
        rows.truncate(SITES);
        rows
    };
    let peak_bytes = u64::try_from(peak).unwrap_or(u64::MAX);
    let before_window = u64::try_from((peak - traced_live).max(0)).unwrap_or(0);
    let mut at_peak: Vec<(u64, StackId)> = live.values().copied().collect();
    if peak_event.is_none() {
        at_peak = held.clone();
    } else if before_window > 0 {
        at_peak.push((before_window, StackId::EMPTY));
    }
    let mut live_at_peak_by_call_site = by_site(&mut at_peak.into_iter(), peak_bytes);
    let mut held_at_dump_by_call_site = by_site(&mut held.into_iter(), allocated_at_dump);
    let stacks = stack_table(
        interner,
        live_at_peak_by_call_site
            .iter_mut()
            .chain(held_at_dump_by_call_site.iter_mut()),
    );
    Some(HostMemory {
        segments: snapshot.host_segments.len() as u64,
        trace_entries: trace.len() as u64,
        reserved_bytes_at_dump: reserved_at_dump,
        allocated_bytes_at_dump: allocated_at_dump,
        peak_allocated_bytes: peak_bytes,
        peak_event_index: peak_event,
        peak_time_us: peak_event.and_then(|e| trace.at(e as usize).time_us),
        peak_reserved_bytes: u64::try_from(peak_reserved).unwrap_or(u64::MAX),
        live_at_peak_by_call_site,
        held_at_dump_by_call_site,
        stacks,
    })
}
