//! What to change first, with the run's own numbers. Ordered by what helps most for the phase
//! where the peak (or the OOM) happened. `torch.cuda.empty_cache()` is never a fix: it returns
//! cached memory to the driver but cannot create a contiguous block or lower the peak.

use super::fields::Accelerator;
use crate::report::{Advice, AdviceCheck, DeviceReport};
use crate::units::format_bytes;

fn advice(action: &str, reason: String, saving: Option<u64>, caveat: &str) -> Advice {
    Advice {
        action: action.to_owned(),
        reason,
        estimated_saving_bytes: saving,
        caveat: caveat.to_owned(),
        checked: None,
    }
}

fn cat(dev: &DeviceReport, name: &str) -> u64 {
    dev.categories_at_peak.get(name).copied().unwrap_or(0)
}

const RECORD_THE_WHOLE_RUN: &str = "Record from before the model is loaded";

fn record_the_whole_run(reason: &str, accel: Accelerator) -> Advice {
    advice(
        &format!("{RECORD_THE_WHOLE_RUN}: call {}._record_memory_history(max_entries=…) first, with max_entries large enough for the whole run", accel.memory_module()),
        reason.to_owned(),
        None,
        "a long run needs a large max_entries (host memory while recording)",
    )
}

/// Why the memory at the peak is not told apart, when a sizeable share of it (a quarter or
/// more) has no category above low confidence.
/// `before_window`: bytes of it allocated before the window (no stack).
fn undecided_bytes(dev: &DeviceReport, peak: u64, before_window: u64) -> Option<String> {
    let unsure: Vec<(&String, u64)> = dev
        .categories_at_peak
        .iter()
        .filter(|(name, bytes)| {
            **bytes > 0
                && (name.as_str() == "unknown"
                    || dev
                        .category_confidence_at_peak
                        .get(*name)
                        .is_some_and(|c| c == "low"))
        })
        .map(|(n, b)| (n, *b))
        .collect();
    let total = unsure.iter().fold(0u64, |s, (_, b)| s.saturating_add(*b));
    if peak == 0 || (total as f64) < 0.25 * peak as f64 {
        return None;
    }
    let names: Vec<&str> = unsure.iter().map(|(n, _)| n.as_str()).collect();
    Some(format!(
        "{} of the memory at the peak ({:.0}%) is {} at low confidence or unknown, so no advice is sized on it{}",
        format_bytes(total),
        100.0 * total as f64 / peak as f64,
        names.join(", "),
        if before_window >= total / 2 {
            "; most of it was allocated before recording started, with no stack"
        } else {
            ""
        }
    ))
}

/// Advice for one device, most useful first. `unsure_before_window_bytes`: requested bytes of
/// the allocations alive at the peak that were allocated before the window and have no
/// category above low confidence (`live_at_peak` may be capped, so it is summed beforehand).
pub fn advise(
    dev: &DeviceReport,
    expandable_on: Option<bool>,
    stacks_recorded: bool,
    unsure_before_window_bytes: u64,
    accel: Accelerator,
) -> Vec<Advice> {
    let mut out = Vec::new();
    let record = format!("{}._record_memory_history", accel.memory_module());
    let frag_oom = dev.oom.iter().find(|o| o.verdict == "fragmentation");
    // The phase that matters: where the (first) OOM happened, else where the peak was. Advice
    // never rests on a phase the evidence does not decide.
    let (claimed, phase_confidence) = dev
        .oom
        .first()
        .map(|o| (o.phase.as_str(), o.phase_confidence.as_str()))
        .unwrap_or((dev.peak.phase.as_str(), dev.peak.phase_confidence.as_str()));
    let phase = if phase_confidence == "low" {
        "unknown"
    } else {
        claimed
    };
    let peak = dev.peak.requested_bytes.max(0) as u64;
    // Say which event the advice is about.
    let moment = if dev.oom.is_empty() {
        "the peak is"
    } else {
        "memory ran out"
    };

    if let Some(o) = frag_oom {
        if expandable_on != Some(true) {
            out.push(advice(
                &format!("Set {}", accel.set_conf("expandable_segments:True")),
                format!(
                    "the OOM was fragmentation: {} reserved but unallocated, yet no hole of {} on its stream; expandable segments map pages into one growing range, so freed space can be reused for large requests",
                    format_bytes(o.reserved_unallocated_bytes),
                    format_bytes(o.requested_bytes)
                ),
                Some(o.reserved_unallocated_bytes),
                match accel {
                    Accelerator::Cuda => "does not help when the peak itself exceeds the device; not available with cudaMallocAsync or in CUDA-graph private pools",
                    Accelerator::Xpu => "does not help when the peak itself exceeds the device; not available in graph private pools",
                },
            ));
        }
        out.push(advice(
            "Or set PYTORCH_ALLOC_CONF=max_split_size_mb:<size> (e.g. 128)",
            format!(
                "keeps large cached blocks from being split for small requests; the largest hole was only {}",
                format_bytes(o.largest_free_block_bytes)
            ),
            None,
            &format!("can raise the number of {} calls; pick a size above your typical large tensor", accel.device_malloc()),
        ));
    }

    // Sized advice only from categories of at least medium confidence.
    let sure = |name: &str| {
        if dev
            .category_confidence_at_peak
            .get(name)
            .is_some_and(|c| c == "low")
        {
            0
        } else {
            cat(dev, name)
        }
    };
    let activations = sure("activations").saturating_add(sure("kv_cache"));
    let weights = sure("weights");
    let optimizer_state = sure("optimizer_state");
    let gradients = sure("gradients");
    match phase {
        "load" if weights > 0 => {
                out.push(advice(
                    "Load the weights in lower precision: bf16/fp16, or 8-bit / 4-bit quantisation (bitsandbytes), or spread them with device_map=\"auto\"",
                    format!(
                        "{moment} in model loading and weights hold {} — about {:.1} billion parameters if they are stored in 16-bit; the same parameters take {} in fp32, {} in bf16/fp16, {} in 8-bit and {} in 4-bit",
                        format_bytes(weights),
                        weights as f64 / 2.0 / 1e9,
                        format_bytes(weights.saturating_mul(2)),
                        format_bytes(weights),
                        format_bytes(weights / 2),
                        format_bytes(weights / 4)
                    ),
                    Some(weights / 2),
                    "quantisation changes numerics; a model that does not fit even in 4-bit needs more devices (device_map, tensor parallelism)",
                ));
        }
        "forward" => out.push(advice(
            "Reduce the batch size (down to 1) or the sequence/context length, and use gradient accumulation to keep the effective batch",
            format!(
                "{moment} in the forward pass, where activations hold {} ({:.0}% of the peak); they grow linearly with batch × length, so halving the batch saves about {}",
                format_bytes(activations),
                100.0 * activations as f64 / peak.max(1) as f64,
                format_bytes(activations / 2)
            ),
            Some(activations / 2),
            "does not help if weights and optimizer state alone fill the device",
        )),
        "backward" => out.push(advice(
            "Enable activation checkpointing (torch.utils.checkpoint, or model.gradient_checkpointing_enable())",
            format!(
                "{moment} in the backward pass while {} of saved activations ({:.0}% of the peak) are still alive; checkpointing keeps only layer inputs and recomputes the rest",
                format_bytes(activations),
                100.0 * activations as f64 / peak.max(1) as f64
            ),
            Some(activations / 2),
            "costs roughly one extra forward pass of compute; a smaller batch has the same effect without the recompute",
        )),
        "optimizer" => {
            if optimizer_state > 0 {
                out.push(advice(
                    "Use an 8-bit optimizer (e.g. bitsandbytes AdamW8bit) or shard the optimizer state (ZeRO / FSDP)",
                    format!(
                        "{moment} in the optimizer step; optimizer state holds {} (Adam keeps two values per parameter) — 8-bit state saves about ¾ of it ({}), sharding over N devices saves (N−1)/N",
                        format_bytes(optimizer_state),
                        format_bytes(optimizer_state / 4 * 3)
                    ),
                    Some(optimizer_state / 4 * 3),
                    "8-bit optimizers can change convergence slightly; sharding needs several devices",
                ));
            }
            if gradients > 0 {
                out.push(advice(
                    "Free gradients early: optimizer.zero_grad(set_to_none=True), or fuse the step into backward",
                    format!("gradients hold {} at the peak", format_bytes(gradients)),
                    None,
                    "set_to_none is the default since torch 2.0",
                ));
            }
        }
        "eval" => out.push(advice(
            "Use a smaller eval batch, a shorter generation length, or compute logits/loss in chunks",
            format!(
                "{moment} in evaluation: activations (logits, KV caches) hold {} ({:.0}% of the peak); logits grow with batch × length × vocabulary, KV caches with batch × generated length",
                format_bytes(activations),
                100.0 * activations as f64 / peak.max(1) as f64
            ),
            Some(activations / 2),
            "training settings do not matter here: only the eval loop's shapes do",
        )),
        "unknown" if dev.window.events > 0 || dev.peak.event_index.is_none() => {
            let what = if dev.oom.is_empty() { "the peak" } else { "the OOM" };
            if !stacks_recorded {
                out.push(advice(
                    &format!("Record Python stacks: {record}(stacks=\"python\"), then rerun snapscan"),
                    format!(
                        "the phase of {what} is not decided by this trace, so no phase-specific fix is advised; with stacks each allocation names the code that made it"
                    ),
                    None,
                    "recording stacks slows allocations down a little and makes the dump bigger",
                ));
            } else if dev.peak.event_index.is_none() && dev.oom.is_empty() {
                out.push(record_the_whole_run(
                    "the peak is the state before the first recorded event, so no allocation of the peak shows what was running; no phase-specific fix is advised",
                    accel,
                ));
            }
        }
        _ => {}
    }
    // The memory the advice would be about is not decided: say what would decide it.
    if let Some(reason) = undecided_bytes(dev, peak, unsure_before_window_bytes) {
        if stacks_recorded {
            if !out
                .iter()
                .any(|a| a.action.starts_with(RECORD_THE_WHOLE_RUN))
            {
                out.push(record_the_whole_run(&reason, accel));
            }
        } else if !out.iter().any(|a| a.action.contains("stacks=")) {
            out.push(advice(
                &format!("Record Python stacks: {record}(stacks=\"python\"), then rerun snapscan"),
                reason,
                None,
                "recording stacks slows allocations down a little and makes the dump bigger",
            ));
        }
    }
    if dev.truncated {
        // The value that would have held the window, when the ring buffer wrapped.
        let action = match dev.recording.iter().find_map(|g| g.max_entries) {
            Some(n) => format!("Record more history: {record}(max_entries={n})"),
            None => format!("Record more history: {record}(max_entries=…) larger than now"),
        };
        out.push(advice(
            &action,
            format!(
                "the trace starts mid-run ({} of earlier allocations), so what happened before the window is only partly known",
                crate::units::counted(dev.window.unmatched_frees, "free", "frees")
            ),
            None,
            "each entry costs host memory while recording (hundreds of bytes with stacks)",
        ));
    }
    if !stacks_recorded && dev.window.events > 0 && phase != "unknown" {
        out.push(advice(
            &format!("Record stacks: {record}(stacks=\"python\") (or \"all\" for C++ frames)"),
            "no frames were recorded, so call sites and phases cannot be told".to_owned(),
            None,
            "\"all\" makes dumps much slower to write",
        ));
    }
    out
}

/// The what-if that checks an advice, when its change can be replayed: (request, change text).
fn replayable(action: &str) -> Option<(super::whatif::Request, String)> {
    use super::whatif::Request;
    let scale = |what: &str, f: f64, text: &str| {
        Some((
            Request {
                scales: vec![(what.to_owned(), f)],
                ..Request::default()
            },
            text.to_owned(),
        ))
    };
    if action.contains("expandable_segments:True") {
        return Some((
            Request {
                set: Some("expandable_segments:True".to_owned()),
                ..Request::default()
            },
            "expandable_segments:True".to_owned(),
        ));
    }
    if action.contains("max_split_size_mb") {
        return Some((
            Request {
                set: Some("max_split_size_mb:128".to_owned()),
                ..Request::default()
            },
            "max_split_size_mb:128".to_owned(),
        ));
    }
    if action.starts_with("Reduce the batch size") {
        return scale("batch", 0.5, "batch × 0.5");
    }
    if action.starts_with("Enable activation checkpointing") {
        // Checkpointing keeps the layer inputs, a fraction of what the layers save.
        return scale(
            "activations",
            0.25,
            "saved activations × 0.25 (checkpointing)",
        );
    }
    if action.starts_with("Use an 8-bit optimizer") {
        return Some((
            Request {
                optimizer: Some("8bit".to_owned()),
                ..Request::default()
            },
            "optimizer state in 8 bits".to_owned(),
        ));
    }
    if action.starts_with("Use a smaller eval batch") {
        return Some((
            Request {
                scales: vec![
                    ("activations".to_owned(), 0.5),
                    ("kv_cache".to_owned(), 0.5),
                ],
                ..Request::default()
            },
            "eval activations and KV cache × 0.5".to_owned(),
        ));
    }
    if action.starts_with("Load the weights in lower precision") {
        return scale("weights", 0.5, "weights × 0.5 (8-bit from 16-bit)");
    }
    None
}

fn check_of(
    outcome: &crate::allocator::Outcome,
    oom_event: u32,
    request: u64,
    change: &str,
) -> AdviceCheck {
    let real = outcome.ooms.iter().find(|o| o.real && o.event == oom_event);
    let new: Vec<&crate::allocator::WhatifOom> = outcome.ooms.iter().filter(|o| !o.real).collect();
    let (fits, margin) = real.map_or((true, 0), |o| (o.fits, o.margin));
    let req = format_bytes(request);
    let verdict = match (fits, new.first()) {
        (true, None) => format!(
            "Checked by replay: with {change} the {req} request fits, {} to spare",
            format_bytes(margin.max(0) as u64)
        ),
        (true, Some(first)) => format!(
            "Checked by replay: with {change} the {req} request fits, but {} that fitted before would fail (the first at event {})",
            crate::units::counted(new.len() as u64, "request", "requests"),
            first.event
        ),
        (false, _) => format!(
            "Checked by replay: not enough on its own: with {change} the {req} request is still {} short",
            format_bytes(margin.unsigned_abs())
        ),
    };
    AdviceCheck {
        change: change.to_owned(),
        fits: fits && new.is_empty(),
        margin_bytes: margin,
        new_ooms: new.len() as u64,
        verdict,
    }
}

/// Replays the change of every advice that has one (in parallel) and marks each with the
/// verdict; when none fits, finds what would (a batch factor, with expandable segments for a
/// fragmentation OOM) and adds it first. Only for devices with an OOM.
pub fn check_advice(
    dev: &mut DeviceReport,
    snapshot: &crate::snapshot::Snapshot,
    sim: crate::allocator::Simulation,
) {
    use rayon::prelude::*;
    let Some(oom) = dev.oom.first() else { return };
    let (event, request) = (oom.event_index, oom.requested_bytes);
    let fragmentation = oom.verdict == "fragmentation";
    let phases = super::phase::find_phases(snapshot, dev.device);
    let base = super::whatif::Base::from_sim(snapshot, dev.device, sim, phases);
    let jobs: Vec<(usize, super::whatif::Request, String)> = dev
        .advice
        .iter()
        .enumerate()
        .filter_map(|(k, a)| replayable(&a.action).map(|(r, t)| (k, r, t)))
        .collect();
    let checks: Vec<(usize, AdviceCheck)> = jobs
        .par_iter()
        .map(|(k, r, t)| (*k, check_of(&base.outcome(r), event, request, t)))
        .collect();
    let any_fits = checks.iter().any(|(_, c)| c.fits);
    for (k, c) in checks {
        dev.advice[k].checked = Some(c);
    }
    if any_fits || dev.advice.iter().all(|a| a.checked.is_none()) {
        return;
    }
    // No single change fits. In the forward or backward pass: the largest batch factor that
    // does, by bisection; elsewhere (a batch does not scale what is there): the capacity.
    let set = fragmentation.then(|| "expandable_segments:True".to_owned());
    let with = if fragmentation {
        " with expandable_segments:True"
    } else {
        ""
    };
    let batch_phase = matches!(oom.phase.as_str(), "forward" | "backward");
    let fits_all = |o: &crate::allocator::Outcome| o.ooms.iter().all(|x| x.fits);
    let (action, check) = if batch_phase {
        let run = |f: f64| {
            base.outcome(&super::whatif::Request {
                set: set.clone(),
                scales: vec![("batch".to_owned(), f)],
                ..Default::default()
            })
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        let mut best: Option<(f64, crate::allocator::Outcome)> = None;
        for _ in 0..8 {
            let mid = (lo + hi) / 2.0;
            let o = run(mid);
            if fits_all(&o) {
                lo = mid;
                best = Some((mid, o));
            } else {
                hi = mid;
            }
        }
        match best {
            Some((f, o)) => {
                let f = (f * 100.0).floor() / 100.0;
                let change = format!("batch × {f}{with}");
                (
                    format!("What it takes, found by replay: a batch of {:.0}% of this one{with}", f * 100.0),
                    check_of(&o, event, request, &change),
                )
            }
            None => (
                "No batch size fits, found by replay: what stays (weights, gradients, optimizer state) is more than the device holds; shard or quantise them".to_owned(),
                AdviceCheck {
                    change: format!("batch × 0.004{with}"),
                    fits: false,
                    margin_bytes: 0,
                    new_ooms: 0,
                    verdict: "Checked by replay: even a batch of under 1% of this one runs out of memory".to_owned(),
                },
            ),
        }
    } else {
        let had = base.real_capacity.unwrap_or(0);
        let run = |c: u64| {
            base.outcome(&super::whatif::Request {
                set: set.clone(),
                capacity: Some(c),
                ..Default::default()
            })
        };
        let (mut lo, mut hi) = (had, had.saturating_mul(4).max(1 << 30));
        let mut best = None;
        for _ in 0..12 {
            let mid = lo + (hi - lo) / 2;
            let o = run(mid);
            if fits_all(&o) {
                hi = mid;
                best = Some((mid, o));
            } else {
                lo = mid;
            }
        }
        let Some((c, o)) = best else { return };
        let change = format!("a capacity of {}{with}", format_bytes(c));
        (
            format!(
                "What it takes, found by replay: {} that PyTorch can reserve ({} more than this run had){with}",
                format_bytes(c),
                format_bytes(c.saturating_sub(had))
            ),
            check_of(&o, event, request, &change),
        )
    };
    dev.advice.insert(
        0,
        Advice {
            action,
            reason: "no single change above makes the request fit in the replay".to_owned(),
            estimated_saving_bytes: None,
            caveat: if batch_phase {
                "a smaller batch also changes the number of steps, which the trace cannot know; the batch factor scales the forward and backward passes' activations and temporaries".to_owned()
            } else {
                format!("the capacity is what PyTorch may reserve: the card's memory less the {} and other processes", Accelerator::of(snapshot).context())
            },
            checked: Some(check),
        },
    );
}
