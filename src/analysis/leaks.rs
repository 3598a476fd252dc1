//! Growth across training steps: the requested level at the same point of each step (its
//! start), whether it grows step after step, and the call sites of what one step allocates and
//! the next does not free (a loss kept with its graph, a list of outputs kept by the loop).
//! The first step is left out of the sites: optimizer state and gradients are created there once.

use rustc_hash::FxHashMap;

use super::callsite::CallSites;
use super::lifetimes::DeviceReplay;
use crate::report::{CallSiteBytes, StepGrowth, StepSummary};
use crate::snapshot::StackId;

/// Below this growth per step (bytes, and share of the peak) the level is steady.
const STEADY_BYTES: i64 = 2 << 20;
const STEADY_SHARE: f64 = 0.005;
/// Call sites listed.
const SITES: usize = 10;

pub fn step_growth(
    replay: &DeviceReplay,
    steps: &[StepSummary],
    sites: &CallSites,
) -> Option<StepGrowth> {
    // Three steps at least: two differences to call a trend.
    if steps.len() < 3 {
        return None;
    }
    let peak = replay.requested.peak().0.max(1);
    let noise = STEADY_BYTES.max((peak as f64 * STEADY_SHARE) as i64);
    // From the second step on (the first builds what every later step reuses).
    let diffs: Vec<i64> = steps
        .windows(2)
        .skip(1)
        .map(|w| w[1].start_requested_bytes - w[0].start_requested_bytes)
        .collect();
    let growing = !diffs.is_empty() && diffs.iter().all(|&d| d > noise);
    let total = steps.last().map_or(0, |s| s.start_requested_bytes)
        - steps.get(1).map_or(0, |s| s.start_requested_bytes);
    // What step k (k ≥ 1) allocated and step k+1 did not free.
    let step_of = |event: u32| -> Option<usize> {
        let i = steps.partition_point(|s| s.last_event < event);
        (i < steps.len() && steps[i].first_event <= event).then_some(i)
    };
    let mut by_stack: FxHashMap<StackId, (u64, u64, u32)> = FxHashMap::default();
    let mut steps_seen: FxHashMap<StackId, u64> = FxHashMap::default();
    for b in replay.allocations.births() {
        let Some(k) = step_of(b.born) else { continue };
        if k == 0 || k + 1 >= steps.len() {
            continue;
        }
        let kept = match b.free_event {
            None => true,
            Some(f) => f > steps[k + 1].last_event,
        };
        if kept {
            let g = by_stack.entry(b.stack).or_default();
            g.0 = g.0.saturating_add(b.requested_bytes);
            g.1 += 1;
            // A bit per step (steps past 64 share the last bit).
            *steps_seen.entry(b.stack).or_default() |= 1 << k.min(63);
        }
    }
    let mut by_site: FxHashMap<String, (u64, u64, u64, StackId)> = FxHashMap::default();
    for (stack, (bytes, count, _)) in by_stack {
        let site = sites
            .of(stack)
            .map_or_else(|| "(no stack recorded)".to_owned(), |s| s.to_string());
        let g = by_site.entry(site).or_insert((0, 0, 0, stack));
        g.0 = g.0.saturating_add(bytes);
        g.1 += count;
        g.2 |= steps_seen.get(&stack).copied().unwrap_or(0);
    }
    let kept_total: u64 = by_site.values().map(|g| g.0).fold(0, u64::saturating_add);
    let mut kept: Vec<CallSiteBytes> = by_site
        .into_iter()
        // Kept in two steps or more: a pattern, not a one-off.
        .filter(|(_, g)| g.2.count_ones() >= 2)
        .map(|(call_site, (bytes, count, _, stack))| CallSiteBytes {
            call_site,
            bytes,
            count,
            share: if kept_total == 0 {
                0.0
            } else {
                bytes as f64 / kept_total as f64
            },
            stack_id: (stack != StackId::EMPTY).then_some(stack.0),
            code: None,
            your_code: None,
            via: None,
        })
        .collect();
    kept.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then_with(|| a.call_site.cmp(&b.call_site))
    });
    kept.truncate(SITES);
    Some(StepGrowth {
        verdict: if growing { "growing" } else { "steady" }.to_owned(),
        start_levels: steps.iter().map(|s| s.start_requested_bytes).collect(),
        growth_from_second_step_bytes: total,
        noise_bytes: noise,
        kept_into_later_steps_by_call_site: kept,
    })
}
