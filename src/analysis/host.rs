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

/// Pinned host bytes over `host_traces`: the levels before the first entry and after each
/// entry that changes one (the timeline's host lane and the peak are read from these).
#[derive(Clone, Debug, Default)]
pub struct HostLevels {
    pub start_allocated: u64,
    pub start_reserved: u64,
    pub changes: Vec<HostChange>,
    /// The highest allocated level (the start's when no change passes it) and the entry that
    /// first reached it (`None`: the start).
    pub peak_allocated: u64,
    pub peak_entry: Option<u32>,
    pub peak_reserved: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct HostChange {
    /// Index into `host_traces`.
    pub entry: u32,
    pub time_us: Option<i64>,
    pub allocated: u64,
    pub reserved: u64,
}

/// The host levels of a snapshot that recorded pinned host memory with a trace.
pub fn host_levels(snapshot: &Snapshot) -> Option<HostLevels> {
    let trace = snapshot.host_trace.as_ref()?;
    if trace.is_empty() {
        return None;
    }
    let (allocated, reserved) = at_dump(snapshot);
    Some(levels(trace, allocated, reserved))
}

/// Pinned host bytes (allocated, reserved) in the dump's `host_segments`.
fn at_dump(snapshot: &Snapshot) -> (u64, u64) {
    let (mut allocated, mut reserved) = (0u64, 0u64);
    for s in &snapshot.host_segments {
        reserved = reserved.saturating_add(s.total_size);
        for b in &s.blocks {
            if b.state == BlockState::ActiveAllocated {
                allocated = allocated.saturating_add(b.size);
            }
        }
    }
    (allocated, reserved)
}

/// Levels over the trace, from the dump's with the trace undone (clamped at zero: a cut trace
/// can free what it never allocated).
fn levels(
    trace: &crate::snapshot::Trace,
    allocated_at_dump: u64,
    reserved_at_dump: u64,
) -> HostLevels {
    let (mut net_alloc, mut net_reserved) = (0i128, 0i128);
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
    let clamp = |v: i128| u64::try_from(v.max(0)).unwrap_or(u64::MAX);
    let mut changes = Vec::new();
    let (mut peak_allocated, mut peak_entry, mut peak_reserved) =
        (clamp(start_alloc), None, clamp(start_reserved));
    for i in 0..trace.len() {
        let e = trace.at(i);
        match e.action {
            Action::Alloc => level += i128::from(e.size),
            Action::FreeCompleted => level -= i128::from(e.size),
            Action::SegmentAlloc => reserved += i128::from(e.size),
            Action::SegmentFree => reserved -= i128::from(e.size),
            _ => continue,
        }
        let change = HostChange {
            entry: i as u32,
            time_us: e.time_us,
            allocated: clamp(level),
            reserved: clamp(reserved),
        };
        if change.allocated > peak_allocated {
            (peak_allocated, peak_entry) = (change.allocated, Some(change.entry));
        }
        peak_reserved = peak_reserved.max(change.reserved);
        changes.push(change);
    }
    HostLevels {
        start_allocated: clamp(start_alloc),
        start_reserved: clamp(start_reserved),
        changes,
        peak_allocated,
        peak_entry,
        peak_reserved,
    }
}

/// What the snapshot holds of pinned host memory; `None` when it recorded none.
pub fn host_memory(snapshot: &Snapshot) -> Option<HostMemory> {
    let empty = crate::snapshot::Trace::EMPTY;
    let trace = snapshot.host_trace.as_ref().unwrap_or(&empty);
    if snapshot.host_segments.is_empty() && trace.is_empty() {
        return None;
    }
    let interner = &snapshot.interner;
    let (allocated_at_dump, reserved_at_dump) = at_dump(snapshot);
    let held: Vec<(u64, StackId)> = snapshot
        .host_segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.size, b.frames))
        .collect();
    let levels = levels(trace, allocated_at_dump, reserved_at_dump);
    let mut live: FxHashMap<u64, (u64, StackId)> = FxHashMap::default();
    let (peak, peak_event) = (i128::from(levels.peak_allocated), levels.peak_entry);
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
        peak_reserved_bytes: levels.peak_reserved,
        live_at_peak_by_call_site,
        held_at_dump_by_call_site,
        stacks,
    })
}

/// Most buckets of states a host lane keeps (two points each at most): more changes are merged,
/// keeping each bucket's highest levels (the peak stays exact) and its last ones.
const LANE_POINTS: usize = 20_000;

/// The host levels placed on a device's timeline: `states[i]` is the device state (events
/// done) when `allocated[i]`/`reserved[i]` began. Placed by time where both traces have times,
/// else spread in order over the device's events (`by_time` false).
#[derive(Clone, Debug, Default)]
pub struct HostLane {
    pub by_time: bool,
    pub start_allocated: u64,
    pub start_reserved: u64,
    pub states: Vec<u32>,
    /// µs since the device trace's first timed entry (where `by_time`).
    pub times_us: Vec<i64>,
    pub allocated: Vec<u64>,
    pub reserved: Vec<u64>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

/// Places `levels` on the timeline of a device whose trace is `device_trace`: one walk over
/// both traces, each in its own time order.
pub fn host_lane(levels: &HostLevels, device_trace: &crate::snapshot::Trace) -> HostLane {
    let n = device_trace.len();
    let t0 = (0..n).find_map(|i| device_trace.at(i).time_us);
    let by_time = t0.is_some()
        && !levels.changes.is_empty()
        && levels.changes.iter().all(|c| c.time_us.is_some());
    let mut lane = HostLane {
        by_time,
        start_allocated: levels.start_allocated,
        start_reserved: levels.start_reserved,
        peak_allocated: levels.peak_allocated,
        peak_reserved: levels.peak_reserved,
        ..HostLane::default()
    };
    let bucket = (n + 1).div_ceil(LANE_POINTS).max(1) as u64;
    let m = levels.changes.len().max(1) as u64;
    // Device events done by the host change's time (the device's times, as a running
    // maximum: a trace out of order by a few µs does not move the pointer back).
    let mut done = 0usize;
    let mut latest = i64::MIN;
    let mut bucket_first: Option<usize> = None;
    for (k, c) in levels.changes.iter().enumerate() {
        let state = if by_time {
            let t = c.time_us.unwrap_or(i64::MIN);
            while done < n {
                let dt = device_trace.at(done).time_us.unwrap_or(latest).max(latest);
                if dt > t {
                    break;
                }
                latest = dt;
                done += 1;
            }
            done as u64
        } else {
            (k as u64 + 1) * (n as u64 + 1) / (m + 1)
        };
        let state = u32::try_from(state).unwrap_or(u32::MAX);
        let time = match (c.time_us, t0) {
            (Some(t), Some(t0)) => t.saturating_sub(t0),
            _ => 0,
        };
        // In the same bucket of states as the point before: the bucket keeps two points, its
        // highest levels (drawn) and its last ones (where the next bucket starts from).
        if let Some(j) = bucket_first
            .filter(|&j| u64::from(lane.states[j]) / bucket == u64::from(state) / bucket)
        {
            lane.allocated[j] = lane.allocated[j].max(c.allocated);
            lane.reserved[j] = lane.reserved[j].max(c.reserved);
            if lane.states.len() == j + 1 {
                lane.states.push(lane.states[j]);
                lane.times_us.push(time);
                lane.allocated.push(c.allocated);
                lane.reserved.push(c.reserved);
            } else {
                lane.times_us[j + 1] = time;
                lane.allocated[j + 1] = c.allocated;
                lane.reserved[j + 1] = c.reserved;
            }
            continue;
        }
        bucket_first = Some(lane.states.len());
        lane.states.push(state);
        lane.times_us.push(time);
        lane.allocated.push(c.allocated);
        lane.reserved.push(c.reserved);
    }
    lane
}
