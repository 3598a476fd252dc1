//! Phases of a training/inference run (load, forward, backward, optimizer, eval) as intervals of
//! a device trace, and how each was found.
//!
//! Evidence, strongest first: `external_annotations` (the optimizer's record_function ranges) and
//! `user_metadata`; then the allocation's own frames (design.md §4); then position — with
//! `stacks="python"` allocations on autograd's C++ thread have no frames at all, so frameless
//! allocations in a run that records stacks are backward. Frees carry no evidence of their own
//! (at context level "alloc" they repeat the allocation's stack) and take the phase around them.

use std::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::summary::piece_entries;
use crate::snapshot::{Action, Interner, Snapshot, StackId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Load,
    Forward,
    Backward,
    Optimizer,
    Eval,
    Unknown,
}

/// In the per-stack cache of `find_phases`: not looked at yet / no phase; else `Phase as u8`.
const STACK_UNSEEN: u8 = u8::MAX;
const STACK_NO_PHASE: u8 = u8::MAX - 1;

impl Phase {
    /// Every phase, in declaration order (`Phase::ALL[p as usize] == p`), the order of legends
    /// and tooltips.
    pub const ALL: [Phase; 6] = [
        Phase::Load,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::Eval,
        Phase::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Eval => "eval",
            Phase::Unknown => "unknown",
        }
    }
}

/// How a phase was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Annotation,
    UserMetadata,
    Frames,
    Position,
    None,
}

/// A run of consecutive events in one phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseInterval {
    pub name: Phase,
    /// Training step (0-based), counted by forward phases; null outside training steps.
    pub step: Option<u32>,
    pub first_event: u32,
    pub last_event: u32,
    pub source: Source,
}

/// Per-event phases of one device trace.
#[derive(Clone, Debug, Default)]
pub struct Phases {
    /// Phase of each event (same length as the trace).
    pub per_event: Vec<Phase>,
    pub source_per_event: Vec<Source>,
    pub intervals: Vec<PhaseInterval>,
    /// Why phases could not be found, when they could not.
    pub unknown_reason: Option<String>,
}

impl Phases {
    pub fn at(&self, event: Option<u32>) -> Phase {
        match event {
            Some(e) => self
                .per_event
                .get(e as usize)
                .copied()
                .unwrap_or(Phase::Unknown),
            None => Phase::Unknown,
        }
    }

    pub fn source_at(&self, event: Option<u32>) -> Source {
        match event {
            Some(e) => self
                .source_per_event
                .get(e as usize)
                .copied()
                .unwrap_or(Source::None),
            None => Source::None,
        }
    }

    /// Index of the interval containing `event`.
    pub fn interval_of(&self, event: u32) -> Option<usize> {
        let i = self.intervals.partition_point(|iv| iv.last_event < event);
        (i < self.intervals.len() && self.intervals[i].first_event <= event).then_some(i)
    }

    pub fn step_at(&self, event: Option<u32>) -> Option<u32> {
        event
            .and_then(|e| self.interval_of(e))
            .and_then(|i| self.intervals[i].step)
    }
}

/// What a stack says about the phase of the code that allocated.
pub fn phase_from_frames(interner: &Interner, stack: StackId) -> Option<Phase> {
    let frames = interner.get_stack(stack);
    if frames.is_empty() {
        return None;
    }
    let (mut optimizer, mut backward, mut load, mut eval, mut forward) =
        (false, false, false, false, false);
    for &id in frames {
        let f = interner.get_frame(id);
        let name = interner.get_text(f.name);
        let file = interner.get_text(f.filename).replace('\\', "/");
        if file.contains("torch/optim/")
            || file.contains("nn/utils/clip_grad")
            || name == "zero_grad"
            || name.starts_with("_multi_tensor_adam")
            || name.starts_with("_single_tensor_adam")
            || name == "optimizer_step"
        {
            optimizer = true;
        }
        if name == "backward"
            || name == "_engine_run_backward"
            || name.contains("autograd::Engine::evaluate_function")
            || name.contains("autograd::Engine::thread_main")
            || name.contains("AccumulateGrad")
            || file.contains("torch/autograd/__init__")
        {
            backward = true;
        }
        if matches!(
            name,
            "from_pretrained"
                | "load_state_dict"
                | "_load_from_state_dict"
                | "load_checkpoint"
                | "load_model"
                | "_load_state_dict_into_meta_model"
                | "dispatch_model"
        ) || file.contains("torch/serialization.py")
            || (file.contains("torch/nn/modules/module.py")
                && matches!(
                    name,
                    "to" | "cuda" | "_apply" | "convert" | "half" | "bfloat16"
                ))
        {
            load = true;
        }
        if matches!(
            name,
            "generate"
                | "evaluate"
                | "eval_step"
                | "evaluation_loop"
                | "validation_step"
                | "prediction_step"
                | "predict"
                | "sample"
                | "_sample"
                | "greedy_search"
                | "beam_search"
                | "run_eval"
                | "eval_loop"
                | "validate"
        ) || file.contains("transformers/cache_utils")
        {
            // KV caches (transformers' cache_utils) exist for generation.
            eval = true;
        }
        // Inference servers name their forward passes prefill/decode.
        if matches!(
            name,
            "forward" | "_call_impl" | "_wrapped_call_impl" | "prefill" | "decode_step"
        ) {
            forward = true;
        }
    }
    // The outermost intent wins over what it calls: an optimizer step calls kernels, eval calls
    // forward, and loading moves modules with `.to()`.
    if optimizer {
        Some(Phase::Optimizer)
    } else if backward {
        Some(Phase::Backward)
    } else if eval {
        Some(Phase::Eval)
    } else if load {
        Some(Phase::Load)
    } else if forward {
        Some(Phase::Forward)
    } else {
        None
    }
}

fn phase_from_metadata(text: &str) -> Option<Phase> {
    let t = text.to_ascii_lowercase();
    if t.is_empty() {
        return None;
    }
    [
        ("optim", Phase::Optimizer),
        ("zero_grad", Phase::Optimizer),
        ("backward", Phase::Backward),
        ("eval", Phase::Eval),
        ("generat", Phase::Eval),
        ("valid", Phase::Eval),
        ("load", Phase::Load),
        ("forward", Phase::Forward),
    ]
    .iter()
    .find(|(k, _)| t.contains(k))
    .map(|(_, p)| *p)
}

/// Time ranges of the optimizer's record_function annotations (step, zero_grad).
fn annotated_ranges(snapshot: &Snapshot, device: i64) -> Vec<(i64, i64, Phase)> {
    let mut open: Vec<(String, i64)> = Vec::new();
    let mut ranges = Vec::new();
    for a in &snapshot.annotations {
        if a.device.is_some_and(|d| d != device) {
            continue;
        }
        let Some(t) = a.time_us else { continue };
        let Some(phase) = phase_from_metadata(&a.name) else {
            continue;
        };
        match a.stage.as_str() {
            "START" => open.push((a.name.clone(), t)),
            "END" => {
                if let Some(pos) = open.iter().rposition(|(n, _)| *n == a.name) {
                    let (_, start) = open.remove(pos);
                    ranges.push((start, t, phase));
                }
            }
            _ => {}
        }
    }
    ranges.sort_unstable();
    ranges
}

pub fn find_phases(snapshot: &Snapshot, device: i64) -> Phases {
    let trace = snapshot.trace(device);
    let interner = &snapshot.interner;
    let has_stacks = snapshot.has_stacks();
    let ranges = annotated_ranges(snapshot, device);
    // Evidence per event, written in place (`Source::None`: no evidence yet); the events
    // without any take their phase from the evidence before them at the end.
    let mut per_event: Vec<Phase> = vec![Phase::Unknown; trace.len()];
    let mut source_per_event: Vec<Source> = vec![Source::None; trace.len()];
    // Read once: the evidence and the trace are cut alike.
    let piece = piece_entries();
    // Annotated time ranges cover every event inside them, frees included. A cursor over the
    // ranges follows the time; it only moves forward, so where it stands at an event depends
    // on the latest time before it alone: each piece starts it from the latest time of the
    // pieces before (and the pieces run on every core).
    if !ranges.is_empty() {
        let advance = |mut idx: usize, t: i64| {
            while idx < ranges.len() && ranges[idx].1 < t {
                idx += 1;
            }
            idx
        };
        let latest: Vec<Option<i64>> = trace
            .pieces(piece)
            .into_par_iter()
            .map(|p| {
                let mut latest = None;
                trace.for_each_time(p, |_, t| latest = latest.max(t));
                latest
            })
            .collect();
        let mut before = None;
        let starts: Vec<Option<i64>> = latest
            .iter()
            .map(|&l| {
                let start = before;
                before = before.max(l);
                start
            })
            .collect();
        per_event
            .par_chunks_mut(piece)
            .zip(source_per_event.par_chunks_mut(piece))
            .zip(trace.pieces(piece))
            .zip(starts)
            .for_each(|(((phases, sources), p), start_time)| {
                let first = p.start;
                let mut range_idx = start_time.map_or(0, |t| advance(0, t));
                trace.for_each_time(p, |i, t| {
                    let Some(t) = t else { return };
                    range_idx = advance(range_idx, t);
                    if let Some(&(start, end, phase)) = ranges.get(range_idx) {
                        if start <= t && t <= end {
                            phases[i - first] = phase;
                            sources[i - first] = Source::Annotation;
                        }
                    }
                });
            });
    }
    // Metadata and frames say something of each event alone: on every core, with the phase of
    // each stack found once (benign races: two threads may both work it out).
    let stack_phase: Vec<AtomicU8> = (0..interner.stack_count())
        .map(|_| AtomicU8::new(STACK_UNSEEN))
        .collect();
    let phase_of_stack = |id: StackId| -> Option<Phase> {
        let Some(cell) = stack_phase.get(id.0 as usize) else {
            return phase_from_frames(interner, id);
        };
        match cell.load(Ordering::Relaxed) {
            STACK_UNSEEN => {
                let p = phase_from_frames(interner, id);
                cell.store(p.map_or(STACK_NO_PHASE, |p| p as u8), Ordering::Relaxed);
                p
            }
            STACK_NO_PHASE => None,
            k => Some(Phase::ALL[k as usize]),
        }
    };
    per_event
        .par_chunks_mut(piece)
        .zip(source_per_event.par_chunks_mut(piece))
        .zip(trace.pieces(piece))
        .for_each(|((phases, sources), piece)| {
            let start = piece.start;
            trace.for_each_core(piece, |i, e| {
                let k = i - start;
                if sources[k] != Source::None {
                    return;
                }
                if let Some(p) = e
                    .user_metadata
                    .and_then(|m| phase_from_metadata(interner.get_text(m)))
                {
                    phases[k] = p;
                    sources[k] = Source::UserMetadata;
                    return;
                }
                if !matches!(
                    e.action,
                    Action::Alloc | Action::SegmentAlloc | Action::SegmentMap | Action::Oom
                ) {
                    return;
                }
                let evidence = match phase_of_stack(e.frames) {
                    Some(p) => Some((p, Source::Frames)),
                    // A frameless allocation in a run that records Python stacks comes from
                    // autograd's backward thread. Segment events repeat the stack of the
                    // malloc that needed them.
                    None if has_stacks
                        && e.frames == StackId::EMPTY
                        && e.action != Action::SegmentAlloc =>
                    {
                        Some((Phase::Backward, Source::Position))
                    }
                    None => None,
                };
                if let Some((p, s)) = evidence {
                    phases[k] = p;
                    sources[k] = s;
                }
            });
        });

    // Events without evidence take the phase of the last evidence before them; events before
    // the first evidence take the first one.
    let first = source_per_event
        .iter()
        .position(|&s| s != Source::None)
        .map(|i| (per_event[i], source_per_event[i]));
    let mut current = first.unwrap_or((Phase::Unknown, Source::None));
    for (p, s) in per_event.iter_mut().zip(source_per_event.iter_mut()) {
        if *s == Source::None {
            (*p, *s) = current;
        } else {
            current = (*p, *s);
        }
    }

    // Intervals and step numbers: a new step starts at a forward phase that follows a backward or
    // optimizer phase (eval and load in between do not count); the first training phase is step 0.
    let mut intervals: Vec<PhaseInterval> = Vec::new();
    let mut step: Option<u32> = None;
    let mut last_training: Option<Phase> = None;
    for (i, (&p, &s)) in per_event.iter().zip(&source_per_event).enumerate() {
        if let Some(last) = intervals.last_mut() {
            if last.name == p {
                last.last_event = i as u32;
                continue;
            }
        }
        if matches!(p, Phase::Forward | Phase::Backward | Phase::Optimizer) {
            let new_step = match step {
                None => true,
                Some(_) => {
                    p == Phase::Forward
                        && matches!(last_training, Some(Phase::Backward | Phase::Optimizer))
                }
            };
            if new_step {
                step = Some(step.map_or(0, |s| s + 1));
            }
            last_training = Some(p);
        }
        intervals.push(PhaseInterval {
            name: p,
            step: if matches!(p, Phase::Load | Phase::Unknown) {
                None
            } else {
                step
            },
            first_event: i as u32,
            last_event: i as u32,
            source: s,
        });
    }
    let unknown_reason = if trace.is_empty() {
        Some("no trace was recorded for this device (memory history off), so there is no timeline to cut into phases".to_owned())
    } else if first.is_none() {
        Some(if has_stacks {
            "no stack, annotation or metadata in the trace points to a phase".to_owned()
        } else {
            "the trace has no stacks (context=None or stacks not recorded) and no annotations; \
             record with torch.cuda.memory._record_memory_history(stacks=\"python\") to get phases"
                .to_owned()
        })
    } else {
        None
    };
    Phases {
        per_event,
        source_per_event,
        intervals,
        unknown_reason,
    }
}
