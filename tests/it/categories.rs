//! Categories from lifetimes: each pattern on a small hand-built snapshot, checked allocation by
//! allocation (category, confidence) and, where nothing decides it, for an honest unknown.

use crate::synthetic::*;

const MIB: u64 = 1 << 20;

/// One training step with Python stacks: the forward's saved activations are freed by the
/// backward; backward allocations on autograd's thread have no frames; the optimizer creates
/// its state in the first step. Returns the addresses of the step's gradients.
struct Step {
    gradients: Vec<u64>,
}

fn forward_backward(s: &mut Snapshot, saved: u64, accumulate: bool) -> Step {
    let act = s.alloc(saved, FORWARD);
    let tmp = s.alloc(10 * MIB, FORWARD);
    s.free(tmp, FORWARD);
    let root = s.alloc(4, BACKWARD_CALL);
    let g1 = s.alloc(64 * MIB, NONE);
    let g2 = s.alloc(32 * MIB, if accumulate { ACCUMULATE_GRAD } else { NONE });
    let scratch = s.alloc(20 * MIB, NONE);
    s.free(scratch, NONE);
    s.free(act, NONE);
    s.free(root, NONE);
    Step {
        gradients: vec![g1, g2],
    }
}

#[test]
fn lifetimes_tell_weights_activations_gradients_optimizer_state_and_temporaries() {
    let mut s = Snapshot::default();
    let w1 = s.alloc(64 * MIB, LOAD);
    let w2 = s.alloc(32 * MIB, LOAD);
    // Step 0, with a buffer the forward builds and keeps across steps.
    let kept = s.alloc(3 * MIB, FORWARD);
    let step0 = forward_backward(&mut s, 100 * MIB, false);
    s.annotate("Optimizer.step#Adam.step", "START");
    let m = s.alloc(64 * MIB, ADAM_INIT);
    let v = s.alloc(32 * MIB, ADAM_INIT);
    let update = s.alloc(64 * MIB, ADAM_UPDATE);
    s.free(update, ADAM_UPDATE);
    s.annotate("Optimizer.step#Adam.step", "END");
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "START");
    for g in step0.gradients {
        s.free(g, ZERO_GRAD);
    }
    s.annotate("Optimizer.zero_grad#Adam.zero_grad", "END");
    // Step 1: the peak is in its backward, at a large scratch buffer.
    let act = s.alloc(100 * MIB, FORWARD);
    let root = s.alloc(4, BACKWARD_CALL);
    let g1 = s.alloc(64 * MIB, NONE);
    let g2 = s.alloc(32 * MIB, ACCUMULATE_GRAD);
    let scratch = s.alloc(200 * MIB, NONE);
    s.free(scratch, NONE);
    s.free(act, NONE);
    s.free(root, NONE);

    let dev = s.report("lifetimes.json");
    assert_eq!(dev.peak.phase, "backward");
    assert_eq!(dev.peak.step, Some(1));
    assert_eq!(category_at(&dev, w1), ("weights", "high"));
    assert_eq!(category_at(&dev, w2), ("weights", "high"));
    // Freed by the backward after its forward.
    assert_eq!(category_at(&dev, act), ("activations", "high"));
    // Frameless on autograd's thread: backward by position; alive past the backward.
    assert_eq!(category_at(&dev, g1), ("gradients", "medium"));
    // Named by its frames.
    assert_eq!(category_at(&dev, g2), ("gradients", "high"));
    // Born in the first optimizer step, alive across steps.
    assert_eq!(category_at(&dev, m), ("optimizer_state", "high"));
    assert_eq!(category_at(&dev, v), ("optimizer_state", "high"));
    // Freed within the backward it was born in.
    assert_eq!(category_at(&dev, scratch), ("temporary", "medium"));
    // Built in a forward and alive past its step: not decided.
    assert_eq!(category_at(&dev, kept), ("unknown", "low"));
    assert!(
        dev.category_evidence_at_peak["unknown"].contains("past its training step"),
        "{:?}",
        dev.category_evidence_at_peak
    );
}

#[test]
fn without_stacks_weights_are_what_lives_from_the_start_in_the_optimizer_states_sizes() {
    // context=None: nothing but the optimizer's ranges. What is allocated before the first
    // step and never freed, in the sizes the optimizer keeps state of, is the parameters;
    // another block alive as long, of another size, is not decided.
    let mut s = Snapshot::default();
    let w1 = s.alloc(64 * MIB, NONE);
    let w2 = s.alloc(32 * MIB, NONE);
    let other = s.alloc(3 * MIB, NONE);
    let act = s.alloc(100 * MIB, NONE);
    s.free(act, NONE);
    s.annotate("Optimizer.step#Adam.step", "START");
    let m = s.alloc(64 * MIB, NONE);
    let v = s.alloc(32 * MIB, NONE);
    s.annotate("Optimizer.step#Adam.step", "END");
    let act = s.alloc(150 * MIB, NONE);
    s.free(act, NONE);
    let dev = s.report("mirror.json");
    let at_end = |addr| {
        let a = dev
            .live_at_peak
            .iter()
            .find(|a| a.address == addr)
            .unwrap_or_else(|| panic!("{addr:#x}"));
        (a.category.as_ref(), a.confidence.as_ref())
    };
    assert_eq!(at_end(w1), ("weights", "medium"));
    assert_eq!(at_end(w2), ("weights", "medium"));
    assert_eq!(at_end(m), ("optimizer_state", "high"));
    assert_eq!(at_end(v), ("optimizer_state", "high"));
    assert_eq!(at_end(other), ("unknown", "low"));
}

/// LLaMA-like parameter shapes for `layers` layers: four attention matrices and three MLP
/// matrices per layer, two embeddings, two norms per layer and a final one.
fn llama_like(s: &mut Snapshot, layers: usize) -> u64 {
    let mut bytes = 0;
    let mut add = |s: &mut Snapshot, size: u64, n: usize| {
        for _ in 0..n {
            s.before_window(size, NONE);
            bytes += size;
        }
    };
    add(s, 8 * MIB, 4 * layers);
    add(s, 22 * MIB, 3 * layers);
    add(s, 62 * MIB, 2);
    add(s, 8192, 2 * layers + 1);
    bytes
}

#[test]
fn frameless_blocks_from_before_recording_in_parameter_shapes_are_weights() {
    // Inference with a model loaded before recording started: its blocks have no stack.
    let mut s = Snapshot::default();
    let weights = llama_like(&mut s, 6);
    let out = s.alloc(40 * MIB, SERVE_FORWARD);
    s.free(out, SERVE_FORWARD);
    let dev = s.report("parameters.json");
    assert_eq!(dev.categories_at_peak["weights"], weights);
    assert_eq!(dev.category_confidence_at_peak["weights"], "medium");
    assert!(dev.category_evidence_at_peak["weights"].contains("layer groups"));
    assert_eq!(dev.categories_at_peak["unknown"], 0);
}

#[test]
fn frameless_blocks_from_before_recording_in_other_sizes_are_unknown_with_the_reason() {
    let mut s = Snapshot::default();
    for (size, n) in [(128 * MIB, 3), (56 * MIB, 5), (8 * MIB, 9), (3 * MIB, 2)] {
        for _ in 0..n {
            s.before_window(size, NONE);
        }
    }
    let out = s.alloc(40 * MIB, SERVE_FORWARD);
    s.free(out, SERVE_FORWARD);
    let dev = s.report("not-parameters.json");
    assert_eq!(dev.categories_at_peak["weights"], 0);
    assert_eq!(dev.category_confidence_at_peak["unknown"], "low");
    let why = &dev.category_evidence_at_peak["unknown"];
    assert!(why.contains("before the model is loaded"), "{why}");
    // Advice says what would decide it, and sizes nothing on the unknown bytes (the forward's
    // own activations are another matter).
    assert!(
        dev.advice.iter().any(|a| a
            .action
            .starts_with("Record from before the model is loaded")),
        "{:#?}",
        dev.advice
    );
    assert!(dev
        .advice
        .iter()
        .all(|a| !a.action.contains("lower precision")));
}

/// Frames of hand-written attention code that keeps its own cache (no name says "cache").
const ATTENTION: Stack = &[
    ("/home/me/attention.py", "forward"),
    (MODULE, "_call_impl"),
    ("/home/me/serve.py", "handle"),
];
const APPEND: Stack = &[
    ("/home/me/history.py", "append"),
    ("/home/me/serve.py", "handle"),
];

#[test]
fn kv_cache_from_growth_across_decode_steps() {
    // Two layers, a key and a value each: at every decode step each is replaced by a copy one
    // token longer (torch.cat), allocated just before the old one is freed.
    let per_token = 64 * 1024;
    let prompt = 16;
    let mut s = Snapshot::default();
    let mut cache: Vec<Option<u64>> = vec![None; 4];
    // A lone buffer growing the same way is not a KV cache: nothing alike runs beside it.
    let mut lone: Option<u64> = None;
    for step in 0..5u64 {
        for slot in cache.iter_mut() {
            let hidden = s.alloc(2 * MIB, ATTENTION);
            let grown = s.alloc((prompt + step + 1) * per_token, ATTENTION);
            if let Some(old) = slot.replace(grown) {
                s.free(old, ATTENTION);
            }
            s.free(hidden, ATTENTION);
        }
        let longer = s.alloc((step + 1) * 4096 + 100_000, APPEND);
        if let Some(old) = lone.replace(longer) {
            s.free(old, APPEND);
        }
    }
    let dev = s.report("kv-growth.json");
    for addr in cache.iter().flatten() {
        assert_eq!(category_at(&dev, *addr), ("kv_cache", "medium"));
    }
    let lone_at_peak = dev
        .live_at_peak
        .iter()
        .find(|a| a.call_site.contains("history.py"))
        .expect("the lone buffer is alive at the peak");
    assert_eq!(lone_at_peak.category, "activations");
    // At the peak the last layer's cache is being replaced: its old copy is alive too.
    assert_eq!(
        dev.categories_at_peak["kv_cache"],
        4 * (prompt + 5) * per_token + (prompt + 4) * per_token
    );
}
