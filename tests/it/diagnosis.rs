//! Phases, categories and advice against the simulator's truth and on real training snapshots.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::report::{DeviceReport, FileReport};
use snapscan::snapshot;

use crate::common;
use crate::synthetic;

fn report_of(rel: &str) -> FileReport {
    let loaded = snapshot::load(&common::fixture(rel)).unwrap_or_else(|e| panic!("{e}"));
    file_report(&loaded, &ReportOptions::default())
}

fn truth(rel: &str) -> serde_json::Value {
    let p = common::fixture(rel)
        .to_string_lossy()
        .replace(".pickle", ".truth.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn phase_of_the_peak_and_of_each_oom_and_categories_match_the_truth() {
    for rel in [
        "synth/train.pickle",
        "synth/train-oom-forward.pickle",
        "synth/train-oom-backward.pickle",
        "synth/train-oom-expandable.pickle",
        "synth/eval-peak.pickle",
        "synth/load-oom.pickle",
        "synth/load-oom-2dev.pickle",
        "synth/fragmented.pickle",
        "synth/multi-stream.pickle",
        "synth/truncated.pickle",
        "synth/truncated-stacks-all.pickle",
    ] {
        let t = truth(rel);
        for dev in &report_of(rel).devices {
            let td = &t["devices"][dev.device.to_string()];
            assert_eq!(
                dev.peak.phase,
                td["peak_requested_phase"].as_str().unwrap(),
                "{rel}"
            );
            let oom_phases: Vec<&str> = dev.oom.iter().map(|o| o.phase.as_str()).collect();
            let truth_phases: Vec<&str> = td["oom"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["phase"].as_str().unwrap())
                .collect();
            assert_eq!(oom_phases, truth_phases, "{rel}");
            // Bytes per category at the peak within 5 % of the peak.
            let mut want = std::collections::BTreeMap::<String, u64>::new();
            for a in td["live_at_peak"].as_array().unwrap() {
                *want
                    .entry(a["category"].as_str().unwrap().to_owned())
                    .or_default() += a["requested_bytes"].as_u64().unwrap();
            }
            let total = dev.peak.requested_bytes as f64;
            for (name, got) in &dev.categories_at_peak {
                let w = want.get(name).copied().unwrap_or(0);
                let err = (*got as f64 - w as f64).abs() / total;
                assert!(
                    err <= 0.05,
                    "{rel}: {name} {got} vs truth {w} ({:.1}%)",
                    err * 100.0
                );
            }
            // Every category name is present in the JSON map.
            assert_eq!(
                dev.categories_at_peak.len(),
                snapscan::analysis::category::Category::ALL.len(),
                "{rel}"
            );
        }
    }
}

#[test]
fn the_training_step_repeats_and_is_numbered() {
    let dev = &report_of("synth/train.pickle").devices[0];
    let names: Vec<&str> = dev.phases.iter().map(|p| p.name.name()).collect();
    assert_eq!(names[0], "load");
    assert_eq!(&names[1..4], ["forward", "backward", "optimizer"]);
    assert_eq!(dev.steps.len(), 4);
    assert_eq!(
        dev.steps.iter().map(|s| s.step).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    // Truth intervals, allowing a one-event difference at a boundary (frees carry no evidence).
    let t = truth("synth/train.pickle");
    for (ours, theirs) in dev
        .phases
        .iter()
        .zip(t["devices"]["0"]["phases"].as_array().unwrap())
    {
        assert_eq!(ours.name.name(), theirs["name"].as_str().unwrap());
        assert_eq!(ours.step.map(|s| s as u64), theirs["step"].as_u64());
        let first = theirs["first_event"].as_u64().unwrap() as i64;
        assert!(
            (ours.first_event as i64 - first).abs() <= 1,
            "{ours:?} vs {theirs}"
        );
    }
}

fn phase_names(dev: &DeviceReport) -> Vec<(&str, &str)> {
    dev.phases
        .iter()
        .map(|p| {
            (
                p.name.name(),
                match p.source {
                    snapscan::analysis::phase::Source::Annotation => "annotation",
                    snapscan::analysis::phase::Source::UserMetadata => "user_metadata",
                    snapscan::analysis::phase::Source::Frames => "frames",
                    snapscan::analysis::phase::Source::Position => "position",
                    snapscan::analysis::phase::Source::StepPosition => "step_position",
                    snapscan::analysis::phase::Source::None => "none",
                },
            )
        })
        .collect()
}

#[test]
fn real_cs336_training_snapshots_have_forward_backward_and_optimizer() {
    let w = report_of(
        "real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle",
    );
    assert_eq!(
        phase_names(&w.devices[0]),
        [
            ("forward", "frames"),
            ("backward", "frames"),
            // The hand-written AdamW in cs336_basics/optimizer.py, inside its annotation.
            ("optimizer", "frames")
        ]
    );
    let n = report_of("real/notHanmin__assignment2-systems__memory_snapshot.pickle");
    assert_eq!(
        phase_names(&n.devices[0]),
        [
            ("forward", "frames"),
            ("optimizer", "annotation"), // zero_grad
            ("backward", "frames"),
            ("optimizer", "frames")
        ]
    );
    let m = report_of("real/MAGMA27__assignment2-systems__memory_snapshot.pickle");
    assert_eq!(
        phase_names(&m.devices[0]),
        [("forward", "frames"), ("backward", "frames")]
    );
    assert_eq!(m.devices[0].peak.phase, "forward");
}

#[test]
fn snapshots_without_a_trace_say_why_phases_are_unknown() {
    // No timeline: the peak is the dump's own state. Where the stacks of the blocks alive then
    // point to a phase, that is the peak's phase (the hand label of the verl dump is `load`,
    // medium); where they do not, it stays unknown with the reason.
    for rel in [
        "real/ZijianDu__Attention__memory.pickle",
        "real/volcengine__verl__mem_mempools.pickle",
    ] {
        let dev = &report_of(rel).devices[0];
        let reason = dev.phases_unknown_reason.as_deref().unwrap();
        assert!(reason.contains("no trace was recorded"), "{rel}: {reason}");
    }
    let zijian = &report_of("real/ZijianDu__Attention__memory.pickle").devices[0];
    assert_eq!(zijian.peak.phase, "unknown");
    assert_eq!(zijian.peak.phase_confidence, "low");
    assert!(
        zijian.peak.phase_evidence.contains("0.1%"),
        "{}",
        zijian.peak.phase_evidence
    );
    let verl = &report_of("real/volcengine__verl__mem_mempools.pickle").devices[0];
    assert_eq!(verl.peak.phase, "load");
    assert_eq!(verl.peak.phase_confidence, "medium");
    let none = &report_of("synth/graphs-stacks-none.pickle").devices[0];
    assert!(none
        .phases_unknown_reason
        .as_deref()
        .unwrap()
        .contains("no stacks"));
}

#[test]
fn advice_is_tied_to_the_phase_and_never_offers_empty_cache() {
    let frag = &report_of("synth/fragmented.pickle").devices[0];
    assert!(frag.advice[0].action.contains("expandable_segments:True"));
    assert_eq!(
        frag.advice[0].estimated_saving_bytes,
        Some(frag.oom[0].reserved_unallocated_bytes)
    );
    let load = &report_of("synth/load-oom.pickle").devices[0];
    assert!(load.advice[0].action.contains("lower precision"));
    let weights = load.categories_at_peak["weights"];
    assert!(load.advice[0]
        .reason
        .contains(&snapscan::units::format_bytes(weights)));
    let fwd = &report_of("synth/train-oom-forward.pickle").devices[0];
    assert!(fwd.advice[0].action.contains("batch size"));
    let bwd = &report_of("synth/train-oom-backward.pickle").devices[0];
    assert!(bwd.advice[0].action.contains("activation checkpointing"));
    let eval = &report_of("synth/eval-peak.pickle").devices[0];
    assert!(eval.advice[0].action.contains("eval batch"));
    let trunc = &report_of("synth/truncated.pickle").devices[0];
    assert!(trunc
        .advice
        .iter()
        .any(|a| a.action.contains("max_entries")));
    for rel in [
        "synth/fragmented.pickle",
        "synth/train.pickle",
        "synth/load-oom.pickle",
    ] {
        for dev in &report_of(rel).devices {
            for a in &dev.advice {
                assert!(!a.action.contains("empty_cache"), "{rel}: {a:?}");
                assert!(!a.caveat.is_empty() && !a.reason.is_empty());
            }
        }
    }
}

#[test]
fn optimizer_annotations_without_stacks_mark_only_their_ranges() {
    // context=None: the only evidence is the `Optimizer.step`/`zero_grad` ranges. The OOM is in
    // the forward of the last step. Nothing names a phase there: the forward is claimed by the
    // OOM's position in its step, at low confidence, and nothing outside the ranges is the
    // optimizer.
    let rel = "diagnosis/train-oom-stacks-none.pickle";
    let t = truth(rel);
    let td = &t["devices"]["0"];
    let dev = &report_of(rel).devices[0];
    assert_eq!(dev.oom.len(), 1);
    let oom = &dev.oom[0];
    assert_eq!(oom.phase, td["oom"][0]["phase"].as_str().unwrap());
    assert_eq!(oom.phase_confidence, "low");
    assert!(
        oom.phase_evidence.contains("position"),
        "{}",
        oom.phase_evidence
    );
    assert!(dev
        .phases_unknown_reason
        .as_deref()
        .unwrap()
        .contains("stacks=\"python\""));
    assert_ne!(dev.peak.phase, "optimizer");
    // Steps are counted from the annotated ranges: the OOM's step is the truth's.
    let step_of = |e: u32| {
        dev.phases
            .iter()
            .find(|iv| iv.first_event <= e && e <= iv.last_event)
            .and_then(|iv| iv.step)
    };
    assert_eq!(
        step_of(oom.event_index).map(u64::from),
        td["oom"][0]["step"].as_u64()
    );
    // Events called optimizer lie inside the truth's optimizer phases; events placed by
    // position are the truth's forward where called forward, and its backward where called
    // backward, but for the gradient clipping that runs before `Optimizer.step` unannotated:
    // the end of the backward's fall and the clipping are not told apart.
    let truth_phases = td["phases"].as_array().unwrap();
    let truth_at = |e: u32| {
        truth_phases
            .iter()
            .find(|p| {
                p["first_event"].as_u64().unwrap() <= u64::from(e)
                    && u64::from(e) <= p["last_event"].as_u64().unwrap()
            })
            .map(|p| p["name"].as_str().unwrap())
    };
    for iv in &dev.phases {
        for e in iv.first_event..=iv.last_event {
            let want = truth_at(e);
            match (iv.name.name(), iv.source) {
                ("optimizer", _) => assert_eq!(want, Some("optimizer"), "event {e}"),
                ("forward", _) => assert_eq!(want, Some("forward"), "event {e}"),
                ("backward", _) => assert!(
                    matches!(want, Some("backward" | "optimizer")),
                    "event {e}: {want:?}"
                ),
                (_, s) => assert_eq!(s, snapscan::analysis::phase::Source::None),
            }
        }
    }
    // Allocations before the first step that live to the end, in the optimizer state's sizes,
    // are the weights.
    let truth_bytes = |category: &str| -> u64 {
        td["live_at_peak"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["category"] == category)
            .map(|a| a["requested_bytes"].as_u64().unwrap())
            .sum()
    };
    let close = |ours: u64, truth: u64| (ours as f64 - truth as f64).abs() <= 0.05 * truth as f64;
    for category in ["weights", "optimizer_state", "activations"] {
        assert!(
            close(dev.categories_at_peak[category], truth_bytes(category)),
            "{category}: {} vs {}",
            dev.categories_at_peak[category],
            truth_bytes(category)
        );
    }
    assert_eq!(dev.category_confidence_at_peak["weights"], "medium");
    // Activations by position are low confidence: no advice is sized on them, and none on
    // the optimizer; the first advice says what would decide the phase.
    assert_eq!(dev.category_confidence_at_peak["activations"], "low");
    assert!(dev
        .advice
        .iter()
        .all(|a| !a.action.contains("8-bit optimizer") && !a.action.contains("batch size")));
    assert!(dev.advice[0].action.contains("stacks=\"python\""));
}

#[test]
fn held_open_is_what_need_not_be_there_grouped_by_call_site() {
    // One CS336 training step: the peak is in backward. Everything alive then is not the
    // answer (11.4 of 11.6 GiB); what need not be there is last step's Adam moments, which
    // cs336_basics/optimizer.py:73/74 re-creates every step (about 3 GiB, freed only when the
    // step replaces them).
    let w = &report_of(
        "real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle",
    )
    .devices[0];
    let h = &w.held_open;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    assert!((2.5..3.5).contains(&gib(h.bytes)), "{}", gib(h.bytes));
    assert!(h.share_of_peak < 0.5);
    assert_eq!(h.boundary, "step_start");
    let top: Vec<&str> = h.by_call_site[..2]
        .iter()
        .map(|c| c.call_site.as_str())
        .collect();
    assert!(
        top.iter()
            .all(|s| s.contains("cs336_basics/optimizer.py:7")),
        "{top:?}"
    );
    assert!(gib(h.reallocated_state_bytes) > 2.5);
    assert!(h.by_step.contains_key("before_window"));
    assert!(h.allocations.iter().all(|a| a.category != "weights"));
    // A forward peak of a single step built on weights and gradients only: nothing to release.
    let m = &report_of("real/MAGMA27__assignment2-systems__memory_snapshot.pickle").devices[0];
    assert!(
        m.held_open.share_of_peak < 0.01,
        "{}",
        m.held_open.share_of_peak
    );
    // Last step's gradients alive in this step's forward (freed later by zero_grad) are named.
    let n = &report_of("real/notHanmin__assignment2-systems__memory_snapshot.pickle").devices[0];
    assert!(n.held_open.share_of_peak > 0.1);
    assert!(n.held_open.by_call_site[0]
        .call_site
        .contains("benchmarking_script.py:105"));
}

/// A snapshot in its JSON form (the dict `_dump_snapshot` pickles), written to a scratch file.
fn report_of_json(name: &str, doc: &serde_json::Value) -> FileReport {
    let dir = std::env::temp_dir().join(format!("snapscan-diagnosis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(doc).unwrap()).unwrap();
    let loaded = snapshot::load(&path).unwrap_or_else(|e| panic!("{e}"));
    file_report(&loaded, &ReportOptions::default())
}

fn frames(stack: &[(&str, &str)]) -> serde_json::Value {
    stack
        .iter()
        .map(|(file, name)| serde_json::json!({"filename": file, "line": 1, "name": name}))
        .collect()
}

#[test]
fn lightning_oom_in_the_forward_inside_optimizer_step_is_forward() {
    // Lightning's automatic optimization: training_step (forward and backward) runs inside
    // `optimizer.step(closure)`, inside the `Optimizer.step#Adam.step` annotation.
    let closure = [
        (
            "/venv/site-packages/lightning/pytorch/loops/optimization/automatic.py",
            "closure",
        ),
        ("/venv/site-packages/torch/optim/optimizer.py", "wrapper"),
        ("/venv/site-packages/torch/optim/adam.py", "step"),
        (
            "/venv/site-packages/lightning/pytorch/core/module.py",
            "optimizer_step",
        ),
        (
            "/venv/site-packages/lightning/pytorch/trainer/trainer.py",
            "fit",
        ),
    ];
    let forward: Vec<(&str, &str)> = [
        (
            "/venv/site-packages/timm/models/vision_transformer.py",
            "forward",
        ),
        (
            "/venv/site-packages/torch/nn/modules/module.py",
            "_call_impl",
        ),
        ("/home/me/dit.py", "forward"),
        ("/home/me/model.py", "training_step"),
    ]
    .into_iter()
    .chain(closure)
    .collect();
    let adam = frames(&[
        (
            "/venv/site-packages/torch/optim/adam.py",
            "_multi_tensor_adam",
        ),
        ("/venv/site-packages/torch/optim/adam.py", "step"),
        (
            "/venv/site-packages/lightning/pytorch/core/module.py",
            "optimizer_step",
        ),
    ]);
    let fwd = frames(&forward);
    let gib: u64 = 1 << 30;
    let e = |action: &str, addr: u64, size: u64, t: i64, f: &serde_json::Value| {
        serde_json::json!({"action": action, "addr": addr, "size": size, "stream": 0,
                           "time_us": t, "frames": f})
    };
    let none = serde_json::json!([]);
    let trace = vec![
        e("alloc", 0x1000, gib, 101, &fwd),
        e("alloc", 0x0002_0000_0000, gib, 102, &fwd),
        e("free_requested", 0x0002_0000_0000, gib, 103, &fwd),
        e("free_completed", 0x0002_0000_0000, gib, 103, &fwd),
        // Backward on autograd's thread: no frames with stacks="python".
        e("alloc", 0x0003_0000_0000, gib / 2, 104, &none),
        e("free_requested", 0x1000, gib, 105, &fwd),
        e("free_completed", 0x1000, gib, 105, &fwd),
        e("alloc", 0x0004_0000_0000, gib / 2, 106, &adam),
        // Step 1: the forward runs out of memory.
        e("alloc", 0x0005_0000_0000, 2 * gib, 201, &fwd),
        e("oom", 0, 8 * gib, 202, &fwd),
    ];
    let annotation = |stage: &str, t: i64| {
        serde_json::json!({"name": "Optimizer.step#Adam.step", "stage": stage, "device": 0,
                           "time_us": t})
    };
    let doc = serde_json::json!({
        "segments": [],
        "device_traces": [trace],
        "external_annotations": [annotation("START", 100), annotation("END", 107),
                                 annotation("START", 200)],
    });
    let report = report_of_json("lightning.json", &doc);
    let dev = &report.devices[0];
    assert_eq!(dev.oom.len(), 1);
    assert_eq!(dev.oom[0].phase, "forward");
    assert_eq!(dev.oom[0].phase_confidence, "high");
    let names: Vec<&str> = dev.phases.iter().map(|p| p.name.name()).collect();
    assert_eq!(names, ["forward", "backward", "optimizer", "forward"]);
    let steps: Vec<Option<u32>> = dev.phases.iter().map(|p| p.step).collect();
    assert_eq!(steps, [Some(0), Some(0), Some(0), Some(1)]);
    assert!(
        dev.advice[0].action.contains("batch size"),
        "{:?}",
        dev.advice
    );
    assert!(dev.advice.iter().all(|a| !a.action.contains("8-bit")));
}

/// One training step without stacks: a forward of 20 saved activations (each with a
/// temporary), a backward that starts with the loss gradient (the step's highest level) and
/// frees them, then the optimizer's annotated ranges. Returns the event of the loss gradient.
fn unstacked_step(s: &mut synthetic::Snapshot, first: bool) -> u32 {
    use synthetic::NONE;
    const MIB: u64 = 1 << 20;
    let mut saved = Vec::new();
    for _ in 0..20 {
        let t = s.alloc(MIB, NONE);
        saved.push(s.alloc(10 * MIB, NONE));
        s.free(t, NONE);
    }
    let turn = s.next_event();
    let loss_grad = s.alloc(30 * MIB, NONE);
    for a in saved.into_iter().rev() {
        let g = s.alloc(2 * MIB, NONE);
        s.free(a, NONE);
        s.free(g, NONE);
    }
    s.free(loss_grad, NONE);
    s.annotate("Optimizer.step#Adam.step", "START");
    if first {
        s.alloc(8 * MIB, NONE);
    }
    let t = s.alloc(4 * MIB, NONE);
    s.free(t, NONE);
    s.annotate("Optimizer.step#Adam.step", "END");
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "START");
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "END");
    turn
}

#[test]
fn without_stacks_forward_and_backward_by_position_in_the_step_at_low_confidence() {
    use synthetic::NONE;
    const MIB: u64 = 1 << 20;
    // Three steps, then a fourth whose forward runs out of memory early on.
    let run = |oom_after: usize| {
        let mut s = synthetic::Snapshot::default();
        let turns: Vec<u32> = (0..3).map(|k| unstacked_step(&mut s, k == 0)).collect();
        for _ in 0..oom_after {
            s.alloc(10 * MIB, NONE);
        }
        s.oom(10 * MIB, NONE);
        (s, turns)
    };
    let (s, turns) = run(5);
    let dev = s.report("position.json");
    assert_eq!(dev.oom[0].phase, "forward");
    assert_eq!(dev.oom[0].phase_confidence, "low");
    assert!(dev.oom[0].phase_evidence.contains("position"));
    // The first stretch (before any range: loading and step 0 together) stays unknown; in the
    // later steps the events before the turn are forward and after it backward, and the turn
    // itself is not decided.
    let phase_at = |e: u32| {
        let iv = dev
            .phases
            .iter()
            .find(|iv| iv.first_event <= e && e <= iv.last_event)
            .unwrap();
        (iv.name.name(), iv.step)
    };
    assert_eq!(phase_at(turns[0]).0, "unknown");
    assert_eq!(phase_at(turns[1] - 10), ("forward", Some(1)));
    assert_eq!(phase_at(turns[1]), ("unknown", Some(1)));
    assert_eq!(phase_at(turns[1] + 20), ("backward", Some(1)));
    // The headline does not state the phase, and the advice rests on no phase.
    assert!(dev.advice[0].action.contains("stacks=\"python\""));
    assert!(dev.advice.iter().all(|a| !a.action.contains("batch size")));
    let out = common::snapscan()
        .arg("report")
        .arg(synthetic::write_json("position.json", &s.json()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(phase unknown; perhaps the forward pass, low confidence)"),
        "{text}"
    );
    // An OOM at the turn of the step (the 41st request, where the loss gradient of the other
    // steps is: the backward's first allocations usually are) is not decided.
    let (s, _) = run(40);
    let dev = s.report("position-turn.json");
    assert_eq!(dev.oom[0].phase, "unknown");
}

#[test]
fn without_stacks_a_last_stretch_that_no_oom_ends_is_not_placed() {
    // After the last step the run evaluates: the same rise and fall, but no step follows and
    // nothing ended it early, so position does not claim it.
    use synthetic::NONE;
    const MIB: u64 = 1 << 20;
    let mut s = synthetic::Snapshot::default();
    for k in 0..3 {
        unstacked_step(&mut s, k == 0);
    }
    let mut outs = Vec::new();
    for _ in 0..30 {
        outs.push(s.alloc(10 * MIB, NONE));
    }
    for a in outs {
        s.free(a, NONE);
    }
    let dev = s.report("position-eval.json");
    assert_eq!(dev.peak.phase, "unknown");
    assert_eq!(dev.phases.last().unwrap().name.name(), "unknown");
}

#[test]
fn inference_without_backward_anywhere_is_eval() {
    // A serving loop: module forwards with no frame of no_grad (a `with torch.no_grad():`
    // block shows none) and generation elsewhere in the trace, no backward, no optimizer.
    use synthetic::{GENERATE, SERVE_FORWARD};
    const MIB: u64 = 1 << 20;
    let mut s = synthetic::Snapshot::default();
    let logits = s.alloc(500 * MIB, SERVE_FORWARD);
    let probs = s.alloc(2 * MIB, GENERATE);
    s.free(probs, GENERATE);
    s.free(logits, SERVE_FORWARD);
    let big = s.alloc(900 * MIB, SERVE_FORWARD);
    s.free(big, SERVE_FORWARD);
    let dev = s.report("inference.json");
    assert_eq!(dev.peak.phase, "eval");
    assert_eq!(dev.peak.phase_confidence, "high");
    assert!(dev.phases.iter().all(|p| p.name.name() == "eval"));
    assert!(dev.advice[0].action.contains("eval batch"));
    // A training run that runs out of memory in its first forward has no backward yet either,
    // but nothing in it is generation or evaluation: it stays forward.
    let mut s = synthetic::Snapshot::default();
    s.alloc(500 * MIB, synthetic::FORWARD);
    s.oom(900 * MIB, synthetic::FORWARD);
    let dev = s.report("first-forward.json");
    assert_eq!(dev.oom[0].phase, "forward");
}

/// Lightning 2.x frames, innermost first, as a real dump has them (`stacks="python"`).
const LT: &str = "/opt/conda/lib/python3.11/site-packages/lightning/pytorch";
const TORCH: &str = "/opt/conda/lib/python3.11/site-packages/torch";

fn lightning_fit_outer() -> Vec<(String, &'static str)> {
    [
        ("trainer/call.py", "_call_strategy_hook"),
        ("loops/optimization/automatic.py", "_training_step"),
        ("loops/optimization/automatic.py", "closure"),
        ("@torch/utils/_contextlib.py", "decorate_context"),
        ("loops/optimization/automatic.py", "__call__"),
        ("@torch/optim/optimizer.py", "_use_grad"),
        ("@torch/optim/adamw.py", "step"),
        ("@torch/optim/optimizer.py", "wrapper"),
        ("core/optimizer.py", "step"),
        ("strategies/strategy.py", "optimizer_step"),
        ("core/module.py", "optimizer_step"),
        ("trainer/call.py", "_call_lightning_module_hook"),
        ("loops/optimization/automatic.py", "_optimizer_step"),
        ("loops/optimization/automatic.py", "run"),
        ("loops/training_epoch_loop.py", "advance"),
        ("loops/training_epoch_loop.py", "run"),
        ("loops/fit_loop.py", "advance"),
        ("loops/fit_loop.py", "run"),
        ("trainer/trainer.py", "_run_stage"),
        ("trainer/trainer.py", "_run"),
        ("trainer/trainer.py", "_fit_impl"),
        ("trainer/call.py", "_call_and_handle_interrupt"),
        ("trainer/trainer.py", "fit"),
    ]
    .into_iter()
    .map(|(f, n)| match f.strip_prefix('@') {
        Some(t) => (format!("{TORCH}/{}", t.trim_start_matches("torch/")), n),
        None => (format!("{LT}/{f}"), n),
    })
    .collect()
}

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

/// A stack of `inner` user/module frames inside `outer`, as a `Stack`.
fn stack_of(
    inner: &[(&str, &'static str)],
    outer: Vec<(String, &'static str)>,
) -> synthetic::Stack<'static> {
    let v: Vec<(&'static str, &'static str)> = inner
        .iter()
        .map(|&(f, n)| (&*Box::leak(f.to_owned().into_boxed_str()), n))
        .chain(
            outer
                .into_iter()
                .map(|(f, n)| (&*Box::leak(f.into_boxed_str()), n)),
        )
        .collect();
    leak(v)
}

#[test]
fn lightning_first_forward_oom_after_the_sanity_check_is_training_forward() {
    // Lightning runs two validation batches (the sanity check, under no_grad) before fitting;
    // the first training forward then runs out of memory before any backward. The closure that
    // runs training_step is decorated with `@torch.enable_grad()`, which shows the same
    // `decorate_context` frame as `no_grad`.
    const MIB: u64 = 1 << 20;
    let linear = format!("{TORCH}/nn/modules/linear.py");
    let module = format!("{TORCH}/nn/modules/module.py");
    let user_fwd: Vec<(&str, &'static str)> = vec![
        (&*Box::leak(linear.into_boxed_str()), "forward"),
        (&*Box::leak(module.clone().into_boxed_str()), "_call_impl"),
        ("/home/me/project/model.py", "forward"),
        (&*Box::leak(module.into_boxed_str()), "_call_impl"),
    ];
    let mut train_inner = user_fwd.clone();
    train_inner.push(("/home/me/project/model.py", "training_step"));
    train_inner.push((
        &*Box::leak(format!("{LT}/strategies/strategy.py").into_boxed_str()),
        "training_step",
    ));
    let train = stack_of(&train_inner, lightning_fit_outer());
    let mut val_inner = user_fwd.clone();
    val_inner.push(("/home/me/project/model.py", "validation_step"));
    let val_outer: Vec<(String, &'static str)> = [
        ("strategies/strategy.py", "validation_step"),
        ("trainer/call.py", "_call_strategy_hook"),
        ("loops/evaluation_loop.py", "_evaluation_step"),
        ("loops/utilities.py", "_decorator"),
        ("loops/evaluation_loop.py", "run"),
        ("trainer/trainer.py", "_run_sanity_check"),
        ("trainer/trainer.py", "_run_stage"),
        ("trainer/trainer.py", "_run"),
        ("trainer/trainer.py", "fit"),
    ]
    .into_iter()
    .map(|(f, n)| (format!("{LT}/{f}"), n))
    .collect();
    let val = stack_of(&val_inner, val_outer);
    let mut s = synthetic::Snapshot::default();
    let load = s.alloc(400 * MIB, synthetic::LOAD);
    let _ = load;
    for _ in 0..2 {
        let a = s.alloc(30 * MIB, val);
        let b = s.alloc(2 * MIB, val);
        s.free(b, val);
        s.free(a, val);
    }
    let mut saved = Vec::new();
    for _ in 0..40 {
        saved.push(s.alloc(60 * MIB, train));
    }
    s.oom(900 * MIB, train);
    let dev = s.report("lightning-first-forward.json");
    let o = &dev.oom[0];
    assert_eq!(o.phase, "forward", "{}", o.phase_evidence);
    assert_eq!(o.phase_confidence, "high");
    assert!(
        o.phase_evidence.contains("training_step"),
        "{}",
        o.phase_evidence
    );
    assert!(
        o.phase_evidence.contains("no backward yet"),
        "{}",
        o.phase_evidence
    );
    assert_eq!(o.phase_note.as_deref(), Some("no backward yet"));
    // The frames it rests on: the user's training_step (not the validation), and the loop.
    let roles: Vec<(&str, &str)> = o
        .phase_frames
        .iter()
        .map(|f| (f.role.as_str(), f.function.as_str()))
        .collect();
    assert!(roles.contains(&("context", "training_step")), "{roles:?}");
    assert!(
        o.phase_frames
            .iter()
            .any(|f| f.role == "loop" && f.file == "lightning/pytorch/loops/fit_loop.py"),
        "{:?}",
        o.phase_frames
    );
    // What the forward saved is activations, not temporaries, and the advice is the
    // training batch, not an eval batch.
    let (cat, _) = synthetic::category_at(&dev, saved[0]);
    assert_eq!(cat, "activations");
    assert!(
        dev.advice.iter().all(|a| !a.action.contains("eval batch")),
        "{:?}",
        dev.advice
    );
}

#[test]
fn a_forward_with_neither_training_nor_eval_evidence_is_not_a_confident_guess() {
    // A bare script: module forwards under `<module>`, no backward, no optimizer, no
    // validation or generation, no no_grad frame.
    const MIB: u64 = 1 << 20;
    const BARE: synthetic::Stack = &[
        ("/home/me/model.py", "forward"),
        (synthetic::MODULE, "_call_impl"),
        ("/home/me/run.py", "<module>"),
    ];
    let mut s = synthetic::Snapshot::default();
    s.alloc(500 * MIB, BARE);
    s.oom(900 * MIB, BARE);
    let dev = s.report("bare-forward.json");
    let o = &dev.oom[0];
    assert_eq!(o.phase, "forward");
    assert_ne!(o.phase_confidence, "high");
    assert_eq!(o.phase_note.as_deref(), Some("training or eval: unclear"));
    assert!(
        o.phase_evidence
            .contains("no backward, optimizer or training loop"),
        "{}",
        o.phase_evidence
    );
}

/// One training step with stacks: a forward of 10 activations freed by the backward, a loss
/// the loop keeps (`losses.append(loss)`, with its graph's last activation) when `leak`, a
/// gradient and the optimizer's annotated step.
fn training_step(s: &mut synthetic::Snapshot, leak: bool) {
    const MIB: u64 = 1 << 20;
    const KEEP: synthetic::Stack = &[
        ("/home/me/train.py", "compute_loss"),
        ("/home/me/train.py", "train_step"),
        ("/home/me/train.py", "main"),
    ];
    let acts: Vec<u64> = (0..10)
        .map(|_| s.alloc(40 * MIB, synthetic::FORWARD))
        .collect();
    let loss = s.alloc(24 * MIB, KEEP);
    let grad = s.alloc(8 * MIB, synthetic::BACKWARD_CALL);
    for a in acts {
        s.free(a, synthetic::BACKWARD_CALL);
    }
    if !leak {
        s.free(loss, synthetic::BACKWARD_CALL);
    }
    s.annotate("Optimizer.step#Adam.step", "START");
    let tmp = s.alloc(4 * MIB, synthetic::ADAM_UPDATE);
    s.free(tmp, synthetic::ADAM_UPDATE);
    s.annotate("Optimizer.step#Adam.step", "END");
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "START");
    s.free(grad, synthetic::ZERO_GRAD);
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "END");
}

#[test]
fn growth_across_steps_names_what_each_step_keeps_and_a_steady_run_is_steady() {
    let mut s = synthetic::Snapshot::default();
    for _ in 0..6 {
        training_step(&mut s, true);
    }
    let dev = s.report("leaking-loop.json");
    let g = dev.step_growth.as_ref().expect("steps");
    assert_eq!(g.verdict, "growing", "{:?}", g.start_levels);
    let site = &g.kept_into_later_steps_by_call_site[0];
    assert!(
        site.call_site.contains("train.py:1:compute_loss"),
        "{}",
        site.call_site
    );
    assert_eq!(
        site.count, 4,
        "steps 1-4 each keep their loss into the next"
    );
    let mut s = synthetic::Snapshot::default();
    for _ in 0..6 {
        training_step(&mut s, false);
    }
    let dev = s.report("steady-loop.json");
    let g = dev.step_growth.as_ref().expect("steps");
    assert_eq!(g.verdict, "steady", "{:?}", g.start_levels);
    assert!(g.kept_into_later_steps_by_call_site.is_empty());
}
