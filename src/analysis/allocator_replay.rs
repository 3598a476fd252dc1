//! The allocator model's replay of a device, turned into the output of `snapscan replay` and
//! the causal chain of a request that did not fit (call sites named, sentence written).

use crate::allocator::{self, Rule, Settings, Simulation, WhyNoFit};
use crate::report::replay::*;
use crate::snapshot::{Interner, Snapshot};
use crate::units::{counted, format_bytes};

use super::callsite::call_site;

/// The replay of every device of a snapshot (or one).
pub fn replay_file(
    path: &str,
    snapshot: &Snapshot,
    device: Option<i64>,
    settings: &Settings,
    notes: &[String],
    full: bool,
) -> ReplayFile {
    let opts = allocator::Options {
        placements: full,
        only_ooms: None,
        block_sizes: false,
    };
    let devices: Vec<i64> = snapshot
        .devices()
        .into_iter()
        .filter(|d| device.is_none_or(|want| want == *d))
        .filter(|d| !snapshot.trace(*d).is_empty() || device.is_some())
        .collect();
    use rayon::prelude::*;
    let devices = devices
        .par_iter()
        .map(|&d| {
            let sim = allocator::simulate(snapshot, d, settings, &opts);
            let mut out = device_out(&sim, snapshot, full);
            out.notes.extend(notes.iter().cloned());
            out
        })
        .collect();
    ReplayFile {
        path: path.to_owned(),
        devices,
    }
}

fn device_out(sim: &Simulation, snapshot: &Snapshot, full: bool) -> ReplayDevice {
    let interner = &snapshot.interner;
    let trace = snapshot.trace(sim.device);
    let divergences: Vec<DivergenceOut> = sim.divergences.iter().map(divergence_out).collect();
    let exercised: Vec<RuleCount> = sim
        .rules
        .iter()
        .map(|(r, n)| RuleCount {
            rule: r.name().to_owned(),
            count: *n,
        })
        .collect();
    let not_exercised = Rule::ALL
        .iter()
        .filter(|r| !sim.rules.iter().any(|(x, _)| x == *r))
        .map(|r| r.name().to_owned())
        .collect();
    let time = |e: u32| trace.get(e as usize).and_then(|t| t.time_us);
    let ooms = sim
        .ooms
        .iter()
        .map(|o| OomOut {
            event: o.event,
            request_bytes: o.rounded,
            stream: o.stream,
            device_free: o.device_free,
            segment_bytes: o.segment_bytes,
            reproduced: o.reproduced,
            exceeds_device_free: o.device_free.map(|f| o.segment_bytes > f),
            why: why_out(&o.why, interner, o.event, &time, true),
        })
        .collect();
    let fragmentation_mallocs = sim
        .unfit
        .iter()
        .map(|u| UnfitMallocOut {
            event: u.event,
            segment_bytes: u.segment_bytes,
            why: why_out(&u.why, interner, u.event, &time, false),
        })
        .collect();
    let s = &sim.settings;
    ReplayDevice {
        device: sim.device,
        events: sim.events,
        settings: settings_out(s),
        allocs: sim.allocs,
        placed: sim.placed,
        placed_ratio: (sim.allocs > 0).then(|| sim.placed as f64 / sim.allocs as f64),
        segment_allocs: predicted(sim.mallocs),
        segment_frees: predicted(sim.frees),
        segment_maps: predicted(sim.maps),
        segment_unmaps: predicted(sim.unmaps),
        unexpected_mallocs: sim.unexpected_mallocs,
        unknown_frees: sim.unknown_frees,
        first_divergence: divergences.first().cloned(),
        divergences,
        divergence_count: sim.divergence_count,
        start: StartOut {
            segments: sim.start.segments,
            reserved_bytes: sim.start.reserved_bytes,
            live_blocks: sim.start.live_blocks,
            live_from_dump: sim.start.live_from_dump,
            pending_blocks: sim.start.pending_blocks,
            uncertain_blocks: sim.start.uncertain_blocks,
            uncertain_min_bytes: sim.start.uncertain_min_bytes,
            uncertain_max_bytes: sim.start.uncertain_max_bytes,
            problems: sim
                .start
                .problems
                .iter()
                .map(|(k, n, f)| ProblemOut {
                    kind: (*k).to_owned(),
                    count: *n,
                    first: f.clone(),
                })
                .collect(),
        },
        end: EndOut {
            dump_segments: sim.end.dump_segments,
            matching_segments: sim.end.matching_segments,
            dump_blocks: sim.end.dump_blocks,
            matching_blocks: sim.end.matching_blocks,
            first_mismatch: sim.end.first_mismatch.clone(),
        },
        rules: RulesOut {
            exercised,
            not_exercised,
        },
        ooms,
        oom_count: sim.oom_count,
        fragmentation_mallocs,
        fragmentation_malloc_count: sim.unfit_count,
        placements: full.then(|| {
            sim.placements
                .iter()
                .map(|&(event, address)| PlacementOut { event, address })
                .collect()
        }),
        notes: sim.notes.clone(),
    }
}

pub fn settings_out(s: &Settings) -> SettingsOut {
    SettingsOut {
        conf: s.describe(),
        source: s.source.to_owned(),
        expandable_segments: s.expandable_segments,
        max_split_size: s.max_split_size,
        max_non_split_rounding: s.max_non_split_rounding,
        roundup_power2_divisions: s.roundup_power2_divisions.to_vec(),
        garbage_collection_threshold: s.garbage_collection_threshold,
        large_segment_size: s.large_segment_size,
    }
}

fn predicted(c: allocator::SegmentCounts) -> Predicted {
    Predicted {
        real: c.real,
        predicted: c.predicted,
    }
}

fn divergence_out(d: &allocator::Divergence) -> DivergenceOut {
    DivergenceOut {
        event: d.event,
        kind: d.kind.to_owned(),
        requested_bytes: d.requested,
        rounded_bytes: d.rounded,
        stream: d.stream,
        model_address: d.model,
        real_address: d.real,
        rule: d.rule.name().to_owned(),
        detail: d.detail.clone(),
    }
}

/// The causal chain of a request that did not fit.
pub fn why_out(
    w: &WhyNoFit,
    interner: &Interner,
    event: u32,
    time: &dyn Fn(u32) -> Option<i64>,
    oom: bool,
) -> WhyOut {
    let now = time(event);
    let pinners: Vec<PinnerOut> = w
        .pinners
        .iter()
        .map(|p| PinnerOut {
            address: p.address,
            size: p.size,
            requested_bytes: p.requested,
            call_site: call_site(interner, p.stack),
            birth_event: p.birth,
            age_events: p.birth.map(|b| u64::from(event.saturating_sub(b))),
            age_s: match (p.birth_time_us, now) {
                (Some(b), Some(n)) => Some(n.saturating_sub(b) as f64 / 1e6),
                _ => None,
            },
        })
        .collect();
    let holders: Vec<HolderOut> = w
        .holders
        .iter()
        .map(|h| HolderOut {
            call_site: call_site(interner, h.stack),
            blocks: h.blocks,
            bytes: h.bytes,
            first_birth_event: h.first_birth,
        })
        .collect();
    let mut out = WhyOut {
        request_bytes: w.rounded,
        pool: PoolOut {
            pool_id: [w.key.pool.0, w.key.pool.1],
            stream: w.key.stream,
            size_class: if w.key.small { "small" } else { "large" }.to_owned(),
        },
        reserved_bytes: w.reserved_bytes,
        free_bytes: w.free_bytes,
        pool_free_bytes: w.pool_free_bytes,
        pool_largest_free_bytes: w.pool_largest_free,
        unusable: UnusableOut {
            holes_too_small: w.unusable.holes_too_small,
            oversize: w.unusable.oversize,
            other_streams: w.unusable.other_streams,
            other_pools: w.unusable.other_pools,
            other_size_class: w.unusable.other_size_class,
        },
        split_segments: w
            .split_segments
            .iter()
            .map(|s| SplitSegmentOut {
                address: s.address,
                size: s.size,
                free_bytes: s.free_bytes,
                largest_hole_bytes: s.largest_hole,
                live_blocks: s.live_blocks,
            })
            .collect(),
        split_segment_count: w.split_segment_count,
        split_free_bytes: w.split_free_bytes,
        pinners,
        pinner_count: w.pinner_count,
        pinner_bytes: w.pinner_bytes,
        pinned_segment: w.pinned_segment,
        hole_if_freed_bytes: w.hole_if_freed,
        holders,
        summary: String::new(),
    };
    out.summary = summary(&out, oom, &|c| c.to_owned());
    out
}

/// One sentence: what the request could not use, and what held it. `quote` marks a call site
/// (the renderers make it safe for their format).
pub fn summary(w: &WhyOut, oom: bool, quote: &dyn Fn(&str) -> String) -> String {
    let request = format_bytes(w.request_bytes);
    let what = if oom {
        "request"
    } else {
        "request (a new segment was made)"
    };
    let mut s = if w.pool_free_bytes == 0 {
        format!(
            "the {request} {what} found no free bytes in its pool ({} pool, stream {:#x})",
            w.pool.size_class, w.pool.stream
        )
    } else {
        format!(
            "the {request} {what} could not use {} cached in its pool (largest free block {})",
            format_bytes(w.pool_free_bytes),
            format_bytes(w.pool_largest_free_bytes)
        )
    };
    if w.split_segment_count > 0 {
        s.push_str(&format!(
            ", {} of it in {} split by live blocks",
            format_bytes(w.split_free_bytes),
            counted(w.split_segment_count, "segment", "segments")
        ));
        if let Some(h) = w.holders.first() {
            s.push_str(&format!(
                ": held open mostly by {} ({} in {})",
                h.call_site
                    .as_deref()
                    .map_or("allocations without a stack".to_owned(), quote),
                format_bytes(h.bytes),
                counted(h.blocks, "block", "blocks")
            ));
        }
    }
    if w.pinner_count > 0 {
        s.push_str(&format!(
            "; freeing {} ({}) would have made a hole of {}",
            counted(w.pinner_count, "live block", "live blocks"),
            format_bytes(w.pinner_bytes),
            format_bytes(w.hole_if_freed_bytes)
        ));
    } else if w.pool_free_bytes > 0 {
        s.push_str("; no segment of the pool is large enough for it even if emptied");
    }
    let u = &w.unusable;
    let elsewhere = u
        .other_streams
        .saturating_add(u.other_pools)
        .saturating_add(u.other_size_class);
    if elsewhere > 0 {
        let mut parts = Vec::new();
        for (n, what) in [
            (u.other_streams, "other streams"),
            (u.other_pools, "other pools"),
            (u.other_size_class, "the other size class"),
        ] {
            if n > 0 {
                parts.push(format!("{} in {what}", format_bytes(n)));
            }
        }
        s.push_str(&format!(
            "; free elsewhere, unusable for it: {}",
            parts.join(", ")
        ));
    }
    s
}
