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

use super::lifetimes::{Curve, DeviceReplay};
use super::summary::piece_entries;
use crate::snapshot::{Action, FrameId, Interner, Snapshot, StackId, Trace};

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

/// In a [`OnceBytes`] cache: not looked at yet; in [`PerStack`]: nothing found; else the value.
const STACK_UNSEEN: u8 = u8::MAX;
const STACK_NO_PHASE: u8 = u8::MAX - 1;

/// One byte per id, worked out on first use and kept. Shared by threads (benign races: two may
/// both work the same id out).
#[derive(Default)]
struct OnceBytes(Vec<AtomicU8>);

impl OnceBytes {
    fn new(len: usize) -> OnceBytes {
        OnceBytes((0..len).map(|_| AtomicU8::new(STACK_UNSEEN)).collect())
    }

    /// The byte of `id`: `f()` the first time (below `STACK_UNSEEN`); ids beyond the table are
    /// worked out every time.
    fn get(&self, id: usize, f: impl FnOnce() -> u8) -> u8 {
        let Some(cell) = self.0.get(id) else {
            return f();
        };
        match cell.load(Ordering::Relaxed) {
            STACK_UNSEEN => {
                let v = f();
                cell.store(v, Ordering::Relaxed);
                v
            }
            v => v,
        }
    }
}

impl Clone for OnceBytes {
    fn clone(&self) -> Self {
        OnceBytes(
            self.0
                .iter()
                .map(|c| AtomicU8::new(c.load(Ordering::Relaxed)))
                .collect(),
        )
    }
}

impl std::fmt::Debug for OnceBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ids", self.0.len())
    }
}

/// A small answer (a phase, a category) worked out once per distinct stack: reading a stack's
/// frames is string matching, and real dumps have 10,000s of allocations per stack.
#[derive(Clone, Debug, Default)]
pub struct PerStack(OnceBytes);

impl PerStack {
    pub fn new(interner: &Interner) -> PerStack {
        PerStack(OnceBytes::new(interner.stack_count()))
    }

    /// `f(stack)` as an index below `STACK_NO_PHASE` (`None`: nothing), computed once.
    pub fn get(&self, id: StackId, f: impl FnOnce() -> Option<u8>) -> Option<u8> {
        match self.0.get(id.0 as usize, || f().unwrap_or(STACK_NO_PHASE)) {
            STACK_NO_PHASE => None,
            k => Some(k),
        }
    }
}

/// What each distinct frame says ([`frame_mark`]): stacks share most of their frames (a real
/// dump has 100,000s of stacks over a few thousand frames), and reading one is string matching.
#[derive(Clone, Debug, Default)]
pub struct PerFrame(OnceBytes);

/// In a [`PerFrame`] cache: a `no_grad` context, a training loop (phases are stored by index).
const FRAME_NO_GRAD: u8 = u8::MAX - 2;
const FRAME_TRAIN: u8 = u8::MAX - 3;

impl PerFrame {
    pub fn new(interner: &Interner) -> PerFrame {
        PerFrame(OnceBytes::new(interner.frame_count()))
    }

    fn mark(&self, interner: &Interner, id: FrameId) -> Option<Mark> {
        let code = self.0.get(id.0 as usize, || {
            let f = interner.get_frame(id);
            let raw = interner.get_text(f.filename);
            let file = if raw.contains('\\') {
                std::borrow::Cow::Owned(raw.replace('\\', "/"))
            } else {
                std::borrow::Cow::Borrowed(raw)
            };
            match frame_mark(interner.get_text(f.name), &file) {
                None => STACK_NO_PHASE,
                Some(Mark::NoGrad) => FRAME_NO_GRAD,
                Some(Mark::Train) => FRAME_TRAIN,
                Some(Mark::Is(p)) => p as u8,
            }
        });
        match code {
            STACK_NO_PHASE => None,
            FRAME_NO_GRAD => Some(Mark::NoGrad),
            FRAME_TRAIN => Some(Mark::Train),
            k => Some(Mark::Is(Phase::ALL[k as usize])),
        }
    }
}

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
    /// Where the event lies in a training step between the optimizer's annotated ranges: the
    /// step's memory rises through the forward and falls through the backward (low confidence).
    StepPosition,
    None,
}

/// The phase and source of each event in one byte (a long trace has millions of events): the
/// phase in bits 0-2, the source in bits 3-5. [`find_phases`] marks events in the top two bits
/// while it works (no tables of its own as long as the trace).
#[derive(Clone, Debug, Default)]
pub struct PerEvent(Vec<u8>);

const SOURCE_SHIFT: u32 = 3;
const PHASE_AND_SOURCE: u8 = 0b11_1111;
/// In an annotated range (set by [`find_phases`], cleared before it returns).
const IN_RANGE: u8 = 0x40;
/// Took its phase from the evidence before it (as above).
const FILLED: u8 = 0x80;

fn pack(p: Phase, s: Source) -> u8 {
    p as u8 | (s as u8) << SOURCE_SHIFT
}

/// By the three bits of a phase (all eight: no bounds check; codes past the phases are not
/// written).
const PHASE_OF_BITS: [Phase; 8] = {
    let mut table = [Phase::Unknown; 8];
    let mut i = 0;
    while i < Phase::ALL.len() {
        table[i] = Phase::ALL[i];
        i += 1;
    }
    table
};
/// Every source by its three bits (in declaration order: `s as u8` indexes it).
const SOURCE_OF_BITS: [Source; 8] = [
    Source::Annotation,
    Source::UserMetadata,
    Source::Frames,
    Source::Position,
    Source::StepPosition,
    Source::None,
    Source::None,
    Source::None,
];
const SOURCE_BITS: u8 = 0b111 << SOURCE_SHIFT;
const SOURCE_NONE: u8 = (Source::None as u8) << SOURCE_SHIFT;
const SOURCE_ANNOTATION: u8 = (Source::Annotation as u8) << SOURCE_SHIFT;

fn phase_of_byte(b: u8) -> Phase {
    PHASE_OF_BITS[(b & 0b111) as usize]
}

fn source_of_byte(b: u8) -> Source {
    SOURCE_OF_BITS[((b >> SOURCE_SHIFT) & 0b111) as usize]
}

/// Sets phase and source in a byte of [`PerEvent`], keeping its marks.
fn set_byte(b: &mut u8, p: Phase, s: Source) {
    *b = (*b & !PHASE_AND_SOURCE) | pack(p, s);
}

impl PerEvent {
    /// `n` events of unknown phase, no evidence.
    fn new(n: usize) -> PerEvent {
        PerEvent(vec![pack(Phase::Unknown, Source::None); n])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn source(&self, i: usize) -> Source {
        source_of_byte(self.0[i])
    }

    pub fn get(&self, i: usize) -> Option<(Phase, Source)> {
        self.0
            .get(i)
            .map(|&b| (phase_of_byte(b), source_of_byte(b)))
    }

    fn set(&mut self, i: usize, p: Phase, s: Source) {
        set_byte(&mut self.0[i], p, s);
    }

    /// Phase and source of each event, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Phase, Source)> + '_ {
        self.0
            .iter()
            .map(|&b| (phase_of_byte(b), source_of_byte(b)))
    }

    /// The sources of events `range` (none when it reaches past the end).
    pub fn sources(
        &self,
        range: std::ops::RangeInclusive<usize>,
    ) -> impl Iterator<Item = Source> + '_ {
        let bytes = self.0.get(range).unwrap_or(&[]);
        bytes.iter().map(|&b| source_of_byte(b))
    }
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
    /// Phase and source of each event (same length as the trace).
    pub per_event: PerEvent,
    pub intervals: Vec<PhaseInterval>,
    /// Why phases could not be found, when they could not.
    pub unknown_reason: Option<String>,
    /// The phase each stack's frames show, once looked at.
    pub stack_phases: PerStack,
    /// What each frame shows, once looked at.
    pub frame_marks: PerFrame,
    /// Ends (time) of the `Optimizer.step` ranges, in order: steps are counted from them.
    pub step_ends: Vec<i64>,
    /// Inference only: eval evidence and neither backward frames nor an optimizer anywhere in
    /// the trace, so a forward is evaluation.
    pub inference: bool,
    /// No backward, optimizer or training loop, and no evaluation frame anywhere: a forward
    /// could be training or evaluation, and nothing says which.
    pub forward_unclear: bool,
    /// A backward (by frames, metadata or position) somewhere in the window.
    pub backward_in_window: bool,
}

impl Phases {
    /// [`phase_from_frames`], once per stack.
    pub fn of_stack(&self, interner: &Interner, stack: StackId) -> Option<Phase> {
        self.stack_phases
            .get(stack, || {
                phase_of_frames(interner, &self.frame_marks, stack).map(|p| p as u8)
            })
            .map(|k| match Phase::ALL[k as usize] {
                Phase::Forward if self.inference => Phase::Eval,
                p => p,
            })
    }

    /// [`optimizer_code_while_loading`] with this trace's frame marks.
    pub fn optimizer_code_while_loading(&self, interner: &Interner, stack: StackId) -> bool {
        optimizer_code_while_loading_in(interner, &self.frame_marks, stack)
    }

    pub fn at(&self, event: Option<u32>) -> Phase {
        match event {
            Some(e) => self
                .per_event
                .get(e as usize)
                .map_or(Phase::Unknown, |(p, _)| p),
            None => Phase::Unknown,
        }
    }

    pub fn source_at(&self, event: Option<u32>) -> Source {
        match event {
            Some(e) => self
                .per_event
                .get(e as usize)
                .map_or(Source::None, |(_, s)| s),
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

/// What one frame says about the phase of the code running under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// The frame is code of that phase.
    Is(Phase),
    /// Only a context: `no_grad`/`inference_mode` decorators turn a forward under them into
    /// evaluation, but say nothing alone. (`decorate_context` is also what `enable_grad`
    /// shows: a training loop inside it wins.)
    NoGrad,
    /// A training step or loop (`training_step`, Lightning's fit loop, HF's
    /// `_inner_training_loop`): the forward under it is a training forward, whatever
    /// `no_grad`-like frame lies further out.
    Train,
}

/// The phase a frame stands for, by its function and file names.
fn frame_mark(name: &str, file: &str) -> Option<Mark> {
    let lower = name.to_ascii_lowercase();
    let stem = file.rsplit('/').next().unwrap_or(file).to_ascii_lowercase();
    // Loading first: `optimizer.load_state_dict` loads, it does not step.
    let loads = matches!(
        name,
        "from_pretrained"
            | "load_state_dict"
            | "_load_from_state_dict"
            | "load_checkpoint"
            | "load_model"
            | "load_weights"
            | "_load_pretrained_model"
            | "_load_state_dict_into_meta_model"
            | "dispatch_model"
            | "init_model"
            | "build_model"
            | "initialize_model"
            | "init_all_weights"
    ) || name.starts_with("init_weight")
        || file.contains("torch/serialization.py")
        || (file.contains("torch/nn/modules/module.py")
            && matches!(
                name,
                "to" | "cuda" | "_apply" | "convert" | "half" | "bfloat16" | "float"
            ));
    if loads {
        return Some(Mark::Is(Phase::Load));
    }
    // Backward: autograd's engine (C++ frames with stacks="all"), autograd nodes
    // (`AddmmBackward0`), `loss.backward()`, `accelerator.backward`, DeepSpeed's and Lightning's
    // backward, FSDP/DeepSpeed backward hooks (reduce-scatter after backward) and the
    // recomputation of activation checkpointing, which runs inside backward.
    let backward = (lower.contains("backward") && !lower.starts_with("register"))
        || name == "_engine_run_backward"
        || name.contains("autograd::Engine::")
        || name.contains("AccumulateGrad")
        || file.contains("torch/autograd/__init__")
        || (file.contains("torch/utils/checkpoint.py")
            && matches!(name, "unpack_hook" | "recompute_fn" | "_recompute"))
        || matches!(
            name,
            "reduce_ready_partitions_and_remove_grads"
                | "reduce_partition_and_remove_grads"
                | "allreduce_gradients"
        );
    if backward {
        return Some(Mark::Is(Phase::Backward));
    }
    // The optimizer: torch.optim, gradient clipping, zero_grad, fused/foreach kernels, the
    // DeepSpeed engine's step, and hand-written optimizers in files named after them
    // (`optimizer.py`, `adam_forward.py`).
    let optimizer = file.contains("torch/optim/")
        || file.contains("nn/utils/clip_grad")
        || lower.contains("zero_grad")
        || name.starts_with("_multi_tensor_")
        || name.starts_with("_single_tensor_")
        || name.starts_with("_fused_adam")
        || matches!(name, "optimizer_step" | "_take_model_step")
        || (name == "step" && file.contains("deepspeed/runtime/zero"))
        || (!file.contains("/torch/")
            && !file.starts_with("torch/")
            && (stem.contains("optim") || stem.contains("adam")));
    if optimizer {
        return Some(Mark::Is(Phase::Optimizer));
    }
    // A training step or loop: a context like evaluation, checked first because Lightning runs
    // its validation inside the fit loop (an evaluation frame inside wins, see
    // `phase_of_frames`).
    let train = matches!(
        name,
        "training_step"
            | "_training_step"
            | "train_step"
            | "training_step_and_backward"
            | "train_one_epoch"
            | "train_epoch"
            | "_train_epoch"
            | "run_training_epoch"
            | "run_training_batch"
            | "_inner_training_loop"
            | "train_batch"
            | "training_loop"
            | "train_loop"
    ) || file.contains("lightning/pytorch/loops/fit_loop.py")
        || file.contains("lightning/pytorch/loops/training_epoch_loop.py")
        || file.contains("lightning/pytorch/loops/optimization/")
        || file.contains("pytorch_lightning/loops/fit_loop.py")
        || file.contains("pytorch_lightning/loops/epoch/training_epoch_loop.py")
        || file.contains("pytorch_lightning/loops/optimization/")
        || (name == "fit" && file.contains("lightning"))
        || (name == "train" && file.contains("transformers/trainer.py"));
    if train {
        return Some(Mark::Train);
    }
    // Evaluation: generation (KV caches exist for it), validation and prediction loops,
    // inference servers' model execution.
    let eval = matches!(
        name,
        "generate"
            | "evaluate"
            | "eval_step"
            | "evaluation_loop"
            | "_evaluation_loop"
            | "validation_step"
            | "test_step"
            | "predict_step"
            | "prediction_step"
            | "prediction_loop"
            | "predict"
            | "sample"
            | "_sample"
            | "greedy_search"
            | "beam_search"
            | "run_eval"
            | "eval_loop"
            | "validate"
            | "execute_model"
    ) || file.contains("cache_utils");
    if eval {
        return Some(Mark::Is(Phase::Eval));
    }
    if file.contains("torch/utils/_contextlib.py") && name == "decorate_context" {
        return Some(Mark::NoGrad);
    }
    // Forward: module calls, training_step/compute_loss (HF Trainer, Lightning), FSDP's
    // pre-forward all-gather, DeepSpeed's pre-forward fetch; inference servers name their passes
    // prefill/decode.
    let forward = matches!(
        name,
        "forward"
            | "_call_impl"
            | "_wrapped_call_impl"
            | "prefill"
            | "decode_step"
            | "compute_loss"
            | "forward_step"
            | "_pre_forward"
            | "_pre_forward_unshard"
            | "pre_forward"
            | "pre_sub_module_forward_function"
    );
    forward.then_some(Mark::Is(Phase::Forward))
}

/// What a stack says about the phase of the code that allocated: the innermost frame that stands
/// for a phase decides, because frameworks nest phases (Lightning runs forward and backward
/// inside `optimizer.step(closure)`, HF's `training_step` calls both). Outer frames only refine
/// it: recomputation under backward (activation checkpointing) is backward, a forward under
/// generation, validation or `no_grad` is evaluation, and anything under loading (a profiling
/// forward at init, optimizer buffers built by `init_model`) is loading.
pub fn phase_from_frames(interner: &Interner, stack: StackId) -> Option<Phase> {
    phase_of_frames(interner, &PerFrame::default(), stack)
}

/// [`phase_from_frames`] with the frames' marks cached in `marks`.
fn phase_of_frames(interner: &Interner, marks: &PerFrame, stack: StackId) -> Option<Phase> {
    let (phase, context) = read_frames(interner, marks, stack);
    match (phase, context) {
        (Some(Phase::Forward), Some(Context::Eval)) => Some(Phase::Eval),
        (p, _) => p,
    }
}

/// What made a forward a training or an evaluation forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Context {
    Train,
    Eval,
}

/// The phase of the innermost frame that stands for one (refined by the frames outside it, as
/// [`phase_from_frames`] says), and the context of a forward: the innermost training-loop,
/// evaluation or `no_grad` frame outside it. The innermost context wins: Lightning validates
/// inside its fit loop (evaluation inside training), and runs `training_step` inside a closure
/// decorated with `@torch.enable_grad()`, whose `decorate_context` frame reads like `no_grad`.
fn read_frames(
    interner: &Interner,
    marks: &PerFrame,
    stack: StackId,
) -> (Option<Phase>, Option<Context>) {
    let mut phase: Option<Phase> = None;
    let mut context: Option<Context> = None;
    for &id in interner.get_stack(stack) {
        let Some(mark) = marks.mark(interner, id) else {
            continue;
        };
        phase = match (phase, mark) {
            // Generation and validation code are contexts too: a `sample()` inside a training
            // forward is not evaluation.
            (None, Mark::Is(Phase::Eval)) => {
                context = Some(Context::Eval);
                Some(Phase::Forward)
            }
            (None, Mark::Train) => {
                context = Some(Context::Train);
                Some(Phase::Forward)
            }
            (None, Mark::Is(p)) => Some(p),
            (None, Mark::NoGrad) => None,
            (Some(Phase::Forward), Mark::Is(p @ (Phase::Backward | Phase::Load))) => Some(p),
            (Some(Phase::Forward), Mark::Is(Phase::Eval) | Mark::NoGrad) => {
                context = context.or(Some(Context::Eval));
                Some(Phase::Forward)
            }
            (Some(Phase::Forward), Mark::Train) => {
                context = context.or(Some(Context::Train));
                Some(Phase::Forward)
            }
            // A module forward outside a context: the context was local to it
            // (`@torch.no_grad()` on a rotary embedding inside a training forward).
            (Some(Phase::Forward), Mark::Is(Phase::Forward)) => {
                if context == Some(Context::Eval) {
                    context = None;
                }
                Some(Phase::Forward)
            }
            // Everything under loading is loading: optimizer and gradient buffers built in
            // `init_model`, a profiling forward at start-up.
            (Some(_), Mark::Is(Phase::Load)) => Some(Phase::Load),
            (p, _) => p,
        };
    }
    (phase, context)
}

/// The frames a stack's phase rests on: the innermost frame that stands for a phase, the
/// training or evaluation frame outside it, and the training loop it ran in. Empty when no
/// frame decides.
pub fn frames_deciding(
    interner: &Interner,
    marks: &PerFrame,
    stack: StackId,
) -> Vec<crate::report::PhaseFrame> {
    let frames = interner.get_stack(stack);
    let mut decided: Option<usize> = None;
    let mut context: Option<usize> = None;
    let mut loop_frame: Option<usize> = None;
    for (i, &id) in frames.iter().enumerate() {
        let Some(mark) = marks.mark(interner, id) else {
            continue;
        };
        match mark {
            Mark::Is(_) if decided.is_none() => decided = Some(i),
            Mark::Train | Mark::NoGrad | Mark::Is(Phase::Eval) if context.is_none() => {
                context = Some(i);
                decided.get_or_insert(i);
            }
            _ => {}
        }
        // The outermost frame of a training loop names where the step ran.
        if mark == Mark::Train {
            let f = interner.get_frame(id);
            if interner.get_text(f.filename).contains("loop") {
                loop_frame = Some(i);
            }
        }
    }
    let Some(d) = decided else {
        return Vec::new();
    };
    let frame = |role: &str, i: usize| {
        let f = interner.get_frame(frames[i]);
        crate::report::PhaseFrame {
            role: role.to_owned(),
            function: interner.get_text(f.name).to_owned(),
            file: short_path(interner.get_text(f.filename)),
            line: f.line,
        }
    };
    let mut out = vec![frame("phase", d)];
    if let Some(c) = context.filter(|&c| c != d) {
        out.push(frame("context", c));
    }
    if let Some(l) = loop_frame.filter(|&l| l != d && Some(l) != context) {
        out.push(frame("loop", l));
    }
    out
}

/// Deciding frames in words: "`training_step` (model.py:120) in
/// `lightning/pytorch/loops/fit_loop.py`".
pub fn describe_frames(frames: &[crate::report::PhaseFrame]) -> String {
    let mut out = String::new();
    for f in frames {
        let at = if f.line > 0 {
            format!("{}:{}", f.file, f.line)
        } else {
            f.file.clone()
        };
        match f.role.as_str() {
            "loop" => out.push_str(&format!(" in `{}`", f.file)),
            "context" => out.push_str(&format!(" under `{}` ({at})", f.function)),
            _ => out.push_str(&format!("`{}` ({at})", f.function)),
        }
    }
    out
}

/// A source path without its environment: from the package folder on
/// (`lightning/pytorch/loops/fit_loop.py`), else the last two components.
pub fn short_path(file: &str) -> String {
    let file = file.replace('\\', "/");
    for marker in ["site-packages/", "dist-packages/"] {
        if let Some(i) = file.rfind(marker) {
            return file[i + marker.len()..].to_owned();
        }
    }
    let parts: Vec<&str> = file.rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// Is the innermost frame of the stack that stands for a phase the optimizer's, with loading
/// outside it? Optimizer buffers built while the model is set up (Megatron's distributed
/// optimizer building its fp32 main parameters in `init_model`): loading by phase, optimizer
/// state by what they are.
pub fn optimizer_code_while_loading(interner: &Interner, stack: StackId) -> bool {
    optimizer_code_while_loading_in(interner, &PerFrame::default(), stack)
}

fn optimizer_code_while_loading_in(interner: &Interner, marks: &PerFrame, stack: StackId) -> bool {
    let mut marks =
        interner
            .get_stack(stack)
            .iter()
            .filter_map(|&id| match marks.mark(interner, id) {
                Some(Mark::Is(p)) => Some(p),
                _ => None,
            });
    marks.next() == Some(Phase::Optimizer) && marks.any(|p| p == Phase::Load)
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

/// Time ranges of the optimizer's record_function annotations (`Optimizer.step#AdamW.step`,
/// `Optimizer.zero_grad#…`), sorted, each with whether it is a step. Other annotations (the
/// DataLoader's `enumerate(DataLoader)#…`) say nothing about the phase.
fn annotated_ranges(snapshot: &Snapshot, device: i64) -> Vec<(i64, i64, bool)> {
    // The open STARTs of each name, innermost last (a map: a file of many names that never
    // END must not be searched once per annotation).
    let mut open: rustc_hash::FxHashMap<crate::snapshot::TextId, Vec<i64>> =
        rustc_hash::FxHashMap::default();
    let mut ranges = Vec::new();
    let texts = &snapshot.interner;
    for a in &snapshot.annotations {
        if a.device.is_some_and(|d| d != device) {
            continue;
        }
        let Some(t) = a.time_us else { continue };
        let name = texts.get_text(a.name);
        if !name.starts_with("Optimizer.") {
            continue;
        }
        match texts.get_text(a.stage) {
            "START" => open.entry(a.name).or_default().push(t),
            "END" => {
                if let Some(start) = open.get_mut(&a.name).and_then(Vec::pop) {
                    ranges.push((start, t, name.starts_with("Optimizer.step")));
                }
            }
            _ => {}
        }
    }
    ranges.sort_unstable();
    ranges
}

/// [`find_phases`], then [`Phases::fill_by_step_position`] with the device's replay.
pub fn phases_of(snapshot: &Snapshot, device: i64, replay: &DeviceReplay) -> Phases {
    let mut phases = find_phases(snapshot, device);
    phases.fill_by_step_position(snapshot.trace(device), &replay.requested);
    phases
}

pub fn find_phases(snapshot: &Snapshot, device: i64) -> Phases {
    let trace = snapshot.trace(device);
    let interner = &snapshot.interner;
    let has_stacks = snapshot.has_stacks();
    let ranges = annotated_ranges(snapshot, device);
    // Evidence per event, written in place (`Source::None`: no evidence yet); the events
    // without any take their phase from the evidence before them at the end.
    let mut per_event = PerEvent::new(trace.len());
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
            .0
            .par_chunks_mut(piece)
            .zip(trace.pieces(piece))
            .zip(starts)
            .for_each(|((events, p), start_time)| {
                let first = p.start;
                let mut range_idx = start_time.map_or(0, |t| advance(0, t));
                trace.for_each_time(p, |i, t| {
                    let Some(t) = t else { return };
                    range_idx = advance(range_idx, t);
                    if let Some(&(start, end, _)) = ranges.get(range_idx) {
                        if start <= t && t <= end {
                            events[i - first] =
                                pack(Phase::Optimizer, Source::Annotation) | IN_RANGE;
                        }
                    }
                });
            });
    }
    // Metadata and frames say something of each event alone: on every core, with the phase of
    // each stack found once (benign races: two threads may both work it out).
    let stack_phases = PerStack::new(interner);
    let frame_marks = PerFrame::new(interner);
    let phase_of_stack = |id: StackId| -> Option<Phase> {
        stack_phases
            .get(id, || {
                phase_of_frames(interner, &frame_marks, id).map(|p| p as u8)
            })
            .map(|k| Phase::ALL[k as usize])
    };
    per_event
        .0
        .par_chunks_mut(piece)
        .zip(trace.pieces(piece))
        .for_each(|(events, piece)| {
            let start = piece.start;
            // Metadata, frames and position override an annotation: Lightning runs forward and
            // backward inside the `Optimizer.step` range.
            trace.for_each_core(piece, |i, e| {
                let k = i - start;
                if let Some(p) = e
                    .user_metadata
                    .and_then(|m| phase_from_metadata(interner.get_text(m)))
                {
                    set_byte(&mut events[k], p, Source::UserMetadata);
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
                    set_byte(&mut events[k], p, s);
                }
            });
        });

    // Inference: the trace shows generation, validation or no_grad code and neither a backward
    // frame nor an optimizer anywhere, so every forward in it is evaluation (a forward under
    // `with torch.no_grad():` shows no frame of its own), and frameless allocations are not
    // autograd's backward thread.
    let seen = |phase: Phase, sources: &[Source]| {
        per_event
            .iter()
            .any(|(p, s)| p == phase && sources.contains(&s))
    };
    // A training loop or an optimizer anywhere in the run's frames (Lightning's sanity check
    // validates before the first training forward, which may run out of memory before any
    // backward): not inference.
    let training_frames = (0..interner.frame_count()).any(|i| {
        matches!(
            frame_marks.mark(interner, FrameId(i as u32)),
            Some(Mark::Train | Mark::Is(Phase::Optimizer))
        )
    });
    let backward_seen = seen(
        Phase::Backward,
        &[Source::Frames, Source::UserMetadata, Source::Position],
    );
    let optimizer_seen = seen(
        Phase::Optimizer,
        &[Source::Frames, Source::UserMetadata, Source::Annotation],
    );
    let eval_seen = seen(Phase::Eval, &[Source::Frames, Source::UserMetadata]);
    let inference = eval_seen
        && !seen(Phase::Backward, &[Source::Frames, Source::UserMetadata])
        && !optimizer_seen
        && !training_frames;
    // Neither side: no backward, optimizer or training loop, and no evaluation either.
    let forward_unclear =
        !inference && !backward_seen && !optimizer_seen && !training_frames && !eval_seen;
    if inference {
        for b in per_event.0.iter_mut() {
            match (phase_of_byte(*b), source_of_byte(*b)) {
                (Phase::Forward, s) => set_byte(b, Phase::Eval, s),
                (Phase::Backward, Source::Position) => set_byte(b, Phase::Unknown, Source::None),
                _ => {}
            }
        }
    }

    // An annotated run of events that holds evidence of its own (Lightning's forward and
    // backward inside `Optimizer.step`) is read from that evidence alone: its frees take the
    // phase around them, not the annotation's.
    let in_range = |b: u8| b & IN_RANGE != 0;
    let n = per_event.len();
    let mut run_start = 0;
    while run_start < n {
        if !in_range(per_event.0[run_start]) {
            run_start += 1;
            continue;
        }
        let run_end = per_event.0[run_start..]
            .iter()
            .position(|&b| !in_range(b))
            .map_or(n, |k| run_start + k);
        let run = &mut per_event.0[run_start..run_end];
        if run.iter().any(|&b| source_of_byte(b) != Source::Annotation) {
            for b in run {
                if source_of_byte(*b) == Source::Annotation {
                    set_byte(b, Phase::Unknown, Source::None);
                }
            }
        }
        run_start = run_end;
    }

    // Events without evidence (frees, segment events) take the phase of the last evidence
    // before them. An annotation says nothing past its range: after one, they take the next
    // evidence instead, and stay unknown when that is an annotation too. Events before the
    // first evidence take the first one.
    // (On the bytes' bits: millions of events.)
    let mut last: Option<u8> = None;
    for b in per_event.0.iter_mut() {
        if *b & SOURCE_BITS != SOURCE_NONE && *b & FILLED == 0 {
            last = Some(*b & PHASE_AND_SOURCE);
            continue;
        }
        if let Some(ps) = last.filter(|ps| ps & SOURCE_BITS != SOURCE_ANNOTATION) {
            *b = (*b & !PHASE_AND_SOURCE) | ps | FILLED;
        }
    }
    let mut next: Option<u8> = None;
    for b in per_event.0.iter_mut().rev() {
        if *b & SOURCE_BITS != SOURCE_NONE {
            if *b & FILLED == 0 {
                next = Some(*b & PHASE_AND_SOURCE);
            }
            continue;
        }
        let ps = next
            .filter(|ps| ps & SOURCE_BITS != SOURCE_ANNOTATION)
            .unwrap_or(pack(Phase::Unknown, Source::None));
        *b = (*b & !PHASE_AND_SOURCE) | ps;
    }
    // The marks are find_phases' own.
    for b in per_event.0.iter_mut() {
        *b &= PHASE_AND_SOURCE;
    }
    let first = per_event.iter().find(|&(_, s)| s != Source::None);

    let step_ends: Vec<i64> = ranges.iter().filter(|r| r.2).map(|r| r.1).collect();
    let unknown_reason = if trace.is_empty() {
        Some("no trace was recorded for this device (memory history off), so there is no timeline to cut into phases".to_owned())
    } else if first.is_none() {
        Some(if has_stacks {
            "no stack, annotation or metadata in the trace points to a phase".to_owned()
        } else {
            "the trace has no stacks (context=None or stacks not recorded) and no annotations; \
             record with _record_memory_history(stacks=\"python\") to get phases"
                .to_owned()
        })
    } else if !has_stacks && per_event.iter().any(|(p, _)| p == Phase::Unknown) {
        // Only the optimizer's annotated ranges: the rest of each step is forward or backward,
        // and nothing in the trace tells which.
        Some(NO_STACKS_BETWEEN_RANGES.to_owned())
    } else {
        None
    };
    let mut phases = Phases {
        per_event,
        intervals: Vec::new(),
        unknown_reason,
        stack_phases,
        frame_marks,
        step_ends,
        inference,
        forward_unclear,
        backward_in_window: backward_seen,
    };
    phases.build_intervals(trace);
    phases
}

const NO_STACKS_BETWEEN_RANGES: &str = "the trace has no stacks (context=None); only the \
    optimizer's record_function ranges mark phases, so events between them (forward or backward \
    of a step) are unknown; record with _record_memory_history(stacks=\"python\") \
    to tell forward from backward";

impl Phases {
    /// Intervals and step numbers from the per-event phases. With `Optimizer.step` annotations,
    /// steps are counted from them: a step ends with its optimizer step (and the zero_grad right
    /// after it). Without, a new step starts at a forward that follows a backward or optimizer
    /// phase (eval and load in between do not count); the first training phase is step 0.
    fn build_intervals(&mut self, trace: &Trace) {
        let by_annotations = !self.step_ends.is_empty();
        let mut intervals: Vec<PhaseInterval> = Vec::new();
        let mut step: Option<u32> = None;
        let mut last_training: Option<Phase> = None;
        let mut steps_done: u32 = 0;
        for (i, (p, s)) in self.per_event.iter().enumerate() {
            if let Some(last) = intervals.last_mut() {
                if last.name == p {
                    last.last_event = i as u32;
                    continue;
                }
            }
            if by_annotations {
                // Optimizer phases keep the step they close (zero_grad after the step included).
                if p != Phase::Optimizer {
                    if let Some(t) = trace.get(i).and_then(|e| e.time_us) {
                        steps_done = self.step_ends.partition_point(|&end| end < t) as u32;
                    }
                }
                step = Some(steps_done);
            } else if matches!(p, Phase::Forward | Phase::Backward | Phase::Optimizer) {
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
                step: if p == Phase::Load || (p == Phase::Unknown && !by_annotations) {
                    None
                } else {
                    step
                },
                first_event: i as u32,
                last_event: i as u32,
                source: s,
            });
        }
        self.intervals = intervals;
    }

    /// Events left without evidence between the optimizer's annotated ranges (a `stacks=None`
    /// run) placed in forward or backward by where they lie in their step: the memory of a
    /// training step rises through the forward and falls through the backward, so the highest
    /// level between two ranges is where the backward begins. Claimed only where the steps look
    /// alike (as many allocations, the highest level as far in) and never in the stretch before
    /// the first range (loading and the first step share it); the last, unfinished stretch (an
    /// OOM) is read against the finished ones, and left unknown near their turning point. Low
    /// confidence throughout: nothing in the trace names the phase.
    pub fn fill_by_step_position(&mut self, trace: &Trace, requested: &Curve) {
        if self.step_ends.is_empty() || !self.per_event.iter().any(|(_, s)| s == Source::None) {
            return;
        }
        let annotated = |i: usize| self.per_event.source(i) == Source::Annotation;
        let is_request = |i: usize| {
            trace
                .get(i)
                .is_some_and(|e| matches!(e.action, Action::Alloc | Action::Oom))
        };
        // Stretches strictly between annotated runs, and whether a range closes them.
        let n = self.per_event.len();
        let mut stretches: Vec<(usize, usize, bool)> = Vec::new();
        let mut i = 0;
        let mut seen_range = false;
        while i < n {
            if annotated(i) {
                seen_range = true;
                i += 1;
                continue;
            }
            let start = i;
            while i < n && !annotated(i) {
                i += 1;
            }
            if seen_range && (start..i).any(is_request) {
                stretches.push((start, i - 1, i < n));
            }
        }
        // Requests (allocations and failed ones) in each finished stretch, and how many of them
        // up to its highest level.
        let shape = |first: usize, last: usize| {
            let (_, top) = requested.peak_between(first, last);
            let total = (first..=last).filter(|&k| is_request(k)).count();
            let rising = (first..=top as usize).filter(|&k| is_request(k)).count();
            (total, rising)
        };
        let finished: Vec<(usize, usize, usize, usize)> = stretches
            .iter()
            .filter(|s| s.2)
            .map(|&(first, last, _)| {
                let (total, rising) = shape(first, last);
                (first, last, total, rising)
            })
            .collect();
        let median = |mut v: Vec<usize>| {
            v.sort_unstable();
            v.get(v.len() / 2).copied().unwrap_or(0)
        };
        let total = median(finished.iter().map(|s| s.2).collect());
        let rising = median(finished.iter().map(|s| s.3).collect());
        let alike = |t: usize, r: usize| {
            t.abs_diff(total) * 10 <= total && r.abs_diff(rising) * 20 <= total
        };
        let alike_count = finished.iter().filter(|s| alike(s.2, s.3)).count();
        if alike_count < 2 || rising == 0 || rising >= total {
            return;
        }
        // Near the turning point (a step's highest level is often the backward's first
        // allocations, its loss gradient) position does not tell: left unknown.
        const TURN: usize = 2;
        let mut claimed = false;
        let mut claim_stretch = |first: usize, last: usize, rising: usize, limit: usize| {
            let mut count = 0;
            for k in first..=last {
                if is_request(k) {
                    count += 1;
                }
                if count > limit {
                    break;
                }
                let p = if count + TURN < rising {
                    Phase::Forward
                } else if count > rising + TURN {
                    Phase::Backward
                } else {
                    continue;
                };
                if self.per_event.source(k) == Source::None {
                    self.per_event.set(k, p, Source::StepPosition);
                    claimed = true;
                }
            }
        };
        for &(first, last, t, r) in &finished {
            if alike(t, r) {
                claim_stretch(first, last, r, usize::MAX);
            }
        }
        // The unfinished stretch, when an OOM ended it: against the finished ones. (One that
        // ends without an OOM may be anything: an evaluation, a dump taken mid-step.)
        if let Some(&(first, last, false)) = stretches.last() {
            let oom = (first..=last).any(|k| trace.get(k).is_some_and(|e| e.action == Action::Oom));
            if oom {
                claim_stretch(first, last, rising, total + total / 10);
            }
        }
        if !claimed {
            return;
        }
        if self.unknown_reason.as_deref() == Some(NO_STACKS_BETWEEN_RANGES) {
            self.unknown_reason = Some(NO_STACKS_BY_POSITION.to_owned());
        }
        self.build_intervals(trace);
    }
}

const NO_STACKS_BY_POSITION: &str =
    "the trace has no stacks (context=None); only the optimizer's record_function \
             ranges mark phases, and the events between them are placed in forward or backward \
             by their position in the step (the highest level of each step is taken as the \
             start of its backward): low confidence; record with \
             _record_memory_history(stacks=\"python\") to tell forward from \
             backward";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_holds_every_phase_and_source() {
        for p in Phase::ALL {
            for s in SOURCE_OF_BITS {
                let mut b = IN_RANGE | FILLED;
                set_byte(&mut b, p, s);
                assert_eq!((phase_of_byte(b), source_of_byte(b)), (p, s));
                assert_eq!(b & !PHASE_AND_SOURCE, IN_RANGE | FILLED);
            }
        }
    }
    use crate::snapshot::Frame;

    /// A stack given innermost first as `(file, function)` pairs, interned in `i`.
    fn stack_in(i: &mut Interner, frames: &[(&str, &str)]) -> StackId {
        let ids = frames
            .iter()
            .map(|(file, name)| {
                let f = Frame {
                    name: i.text(name),
                    filename: i.text(file),
                    line: 1,
                };
                i.frame(f)
            })
            .collect();
        i.stack(ids)
    }

    /// The phase of a stack given innermost first as `(file, function)` pairs.
    fn phase_of(frames: &[(&str, &str)]) -> Option<Phase> {
        let mut i = Interner::default();
        let s = stack_in(&mut i, frames);
        phase_from_frames(&i, s)
    }

    const MODULE: &str = "/venv/site-packages/torch/nn/modules/module.py";

    #[test]
    fn lightning_runs_forward_and_backward_inside_the_optimizer_step() {
        let outer = [
            (
                "/venv/site-packages/lightning/pytorch/loops/optimization/automatic.py",
                "closure",
            ),
            ("/venv/site-packages/torch/optim/optimizer.py", "wrapper"),
            ("/venv/site-packages/torch/optim/adam.py", "step"),
            (
                "/venv/site-packages/lightning/pytorch/core/optimizer.py",
                "step",
            ),
            (
                "/venv/site-packages/lightning/pytorch/core/module.py",
                "optimizer_step",
            ),
            (
                "/venv/site-packages/lightning/pytorch/trainer/trainer.py",
                "fit",
            ),
        ];
        let mut fwd = vec![
            (
                "/venv/site-packages/timm/models/vision_transformer.py",
                "forward",
            ),
            (MODULE, "_call_impl"),
            ("/home/me/dit.py", "forward"),
            ("/home/me/model.py", "training_step"),
        ];
        fwd.extend(outer);
        assert_eq!(phase_of(&fwd), Some(Phase::Forward));
        let mut bwd = vec![
            ("/venv/site-packages/torch/autograd/__init__.py", "backward"),
            ("/venv/site-packages/torch/_tensor.py", "backward"),
            (
                "/venv/site-packages/lightning/pytorch/core/module.py",
                "backward",
            ),
            ("/home/me/model.py", "training_step"),
        ];
        bwd.extend(outer);
        assert_eq!(phase_of(&bwd), Some(Phase::Backward));
        // The step's own kernels are the optimizer.
        let step = [
            (
                "/venv/site-packages/torch/optim/adam.py",
                "_multi_tensor_adam",
            ),
            ("/venv/site-packages/torch/optim/adam.py", "step"),
            (
                "/venv/site-packages/lightning/pytorch/core/module.py",
                "optimizer_step",
            ),
        ];
        assert_eq!(phase_of(&step), Some(Phase::Optimizer));
    }

    #[test]
    fn hf_trainer_and_accelerate() {
        let forward = [
            (
                "/venv/site-packages/transformers/models/llama/modeling_llama.py",
                "forward",
            ),
            (MODULE, "_call_impl"),
            (
                "/venv/site-packages/transformers/trainer.py",
                "compute_loss",
            ),
            (
                "/venv/site-packages/transformers/trainer.py",
                "training_step",
            ),
            (
                "/venv/site-packages/transformers/trainer.py",
                "_inner_training_loop",
            ),
        ];
        assert_eq!(phase_of(&forward), Some(Phase::Forward));
        let backward = [
            (
                "/venv/site-packages/torch/autograd/graph.py",
                "_engine_run_backward",
            ),
            ("/venv/site-packages/accelerate/accelerator.py", "backward"),
            (
                "/venv/site-packages/transformers/trainer.py",
                "training_step",
            ),
        ];
        assert_eq!(phase_of(&backward), Some(Phase::Backward));
        let step = [
            ("/venv/site-packages/torch/optim/adamw.py", "_fused_adamw"),
            ("/venv/site-packages/accelerate/optimizer.py", "step"),
            (
                "/venv/site-packages/transformers/trainer.py",
                "_inner_training_loop",
            ),
        ];
        assert_eq!(phase_of(&step), Some(Phase::Optimizer));
    }

    #[test]
    fn deepspeed_engine_forward_backward_and_step() {
        let engine = "/venv/site-packages/deepspeed/runtime/engine.py";
        let fwd = [
            (
                "/venv/site-packages/deepspeed/runtime/zero/parameter_offload.py",
                "pre_sub_module_forward_function",
            ),
            (MODULE, "_call_impl"),
            (engine, "forward"),
            ("/home/me/train.py", "main"),
        ];
        assert_eq!(phase_of(&fwd), Some(Phase::Forward));
        let bwd = [
            (
                "/venv/site-packages/deepspeed/runtime/zero/stage_1_and_2.py",
                "reduce_ready_partitions_and_remove_grads",
            ),
            (
                "/venv/site-packages/deepspeed/runtime/zero/stage_1_and_2.py",
                "reduce_partition_and_remove_grads",
            ),
        ];
        assert_eq!(phase_of(&bwd), Some(Phase::Backward));
        let bwd_call = [
            ("/venv/site-packages/torch/_tensor.py", "backward"),
            (engine, "backward"),
            ("/home/me/train.py", "main"),
        ];
        assert_eq!(phase_of(&bwd_call), Some(Phase::Backward));
        let step = [
            (
                "/venv/site-packages/deepspeed/runtime/zero/stage_1_and_2.py",
                "step",
            ),
            (engine, "_take_model_step"),
            (engine, "step"),
        ];
        assert_eq!(phase_of(&step), Some(Phase::Optimizer));
    }

    #[test]
    fn fsdp_all_gather_before_forward_and_reduce_scatter_after_backward() {
        let fsdp = "/venv/site-packages/torch/distributed/fsdp";
        let gather = [
            (&*format!("{fsdp}/_flat_param.py"), "unshard"),
            (&*format!("{fsdp}/_runtime_utils.py"), "_unshard"),
            (
                &*format!("{fsdp}/_runtime_utils.py"),
                "_pre_forward_unshard",
            ),
            (&*format!("{fsdp}/_runtime_utils.py"), "_pre_forward"),
            (
                &*format!("{fsdp}/fully_sharded_data_parallel.py"),
                "forward",
            ),
        ];
        assert_eq!(phase_of(&gather), Some(Phase::Forward));
        let gather2 = [
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_collectives.py"),
                "foreach_all_gather",
            ),
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_param_group.py"),
                "unshard",
            ),
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_param_group.py"),
                "pre_forward",
            ),
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_state.py"),
                "_pre_forward",
            ),
        ];
        assert_eq!(phase_of(&gather2), Some(Phase::Forward));
        let scatter = [
            (&*format!("{fsdp}/_runtime_utils.py"), "_reduce_grad"),
            (&*format!("{fsdp}/_runtime_utils.py"), "_post_backward_hook"),
        ];
        assert_eq!(phase_of(&scatter), Some(Phase::Backward));
        let scatter2 = [
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_collectives.py"),
                "foreach_reduce",
            ),
            (
                &*format!("{fsdp}/_fully_shard/_fsdp_param_group.py"),
                "post_backward",
            ),
        ];
        assert_eq!(phase_of(&scatter2), Some(Phase::Backward));
    }

    #[test]
    fn checkpoint_recomputation_inside_backward_is_backward() {
        let ckpt = "/venv/site-packages/torch/utils/checkpoint.py";
        let recompute = [
            ("/home/me/model.py", "forward"),
            (MODULE, "_call_impl"),
            (ckpt, "recompute_fn"),
            (ckpt, "unpack_hook"),
        ];
        assert_eq!(phase_of(&recompute), Some(Phase::Backward));
        let reentrant = [
            ("/home/me/model.py", "forward"),
            (MODULE, "_call_impl"),
            (ckpt, "backward"),
            ("/venv/site-packages/torch/autograd/function.py", "apply"),
        ];
        assert_eq!(phase_of(&reentrant), Some(Phase::Backward));
        // The first pass through `checkpoint()` is the forward.
        let first = [
            ("/home/me/model.py", "forward"),
            (ckpt, "checkpoint"),
            ("/home/me/model.py", "forward"),
            (MODULE, "_call_impl"),
        ];
        assert_eq!(phase_of(&first), Some(Phase::Forward));
    }

    #[test]
    fn torch_compile_regions() {
        let aot = "/venv/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py";
        let fwd = [
            (aot, "call_func_at_runtime_with_args"),
            ("/venv/site-packages/torch/_functorch/_aot_autograd/jit_compile_runtime_wrappers.py", "forward"),
            ("/venv/site-packages/torch/_dynamo/eval_frame.py", "_fn"),
            (MODULE, "_call_impl"),
            ("/home/me/train.py", "train_step"),
        ];
        assert_eq!(phase_of(&fwd), Some(Phase::Forward));
        let bwd = [
            (aot, "call_func_at_runtime_with_args"),
            (
                "/venv/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                "call_compiled_backward",
            ),
            (
                "/venv/site-packages/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                "backward",
            ),
        ];
        assert_eq!(phase_of(&bwd), Some(Phase::Backward));
    }

    #[test]
    fn generation_validation_and_no_grad_loops_are_eval() {
        let generate = [
            (
                "/venv/site-packages/transformers/models/llama/modeling_llama.py",
                "forward",
            ),
            (MODULE, "_call_impl"),
            (
                "/venv/site-packages/transformers/generation/utils.py",
                "_sample",
            ),
            (
                "/venv/site-packages/transformers/generation/utils.py",
                "generate",
            ),
            (
                "/venv/site-packages/torch/utils/_contextlib.py",
                "decorate_context",
            ),
            ("/home/me/infer.py", "main"),
        ];
        assert_eq!(phase_of(&generate), Some(Phase::Eval));
        let kv = [
            ("/home/me/models/cache_utils_v2.py", "update"),
            ("/home/me/models/modeling_llama.py", "forward"),
            (MODULE, "_call_impl"),
            (
                "/venv/site-packages/transformers/generation/utils.py",
                "generate",
            ),
        ];
        assert_eq!(phase_of(&kv), Some(Phase::Eval));
        let validation = [
            ("/home/me/model.py", "forward"),
            (MODULE, "_call_impl"),
            ("/home/me/model.py", "validation_step"),
            (
                "/venv/site-packages/lightning/pytorch/loops/evaluation_loop.py",
                "run",
            ),
        ];
        assert_eq!(phase_of(&validation), Some(Phase::Eval));
        let no_grad = [
            ("/home/me/model.py", "forward"),
            (MODULE, "_call_impl"),
            (
                "/venv/site-packages/torch/utils/_contextlib.py",
                "decorate_context",
            ),
            ("/home/me/eval.py", "run_benchmark"),
        ];
        assert_eq!(phase_of(&no_grad), Some(Phase::Eval));
        // `@torch.no_grad()` on a rotary embedding inside a training forward is not evaluation.
        let rope = [
            (
                "/venv/site-packages/transformers/models/llama/modeling_llama.py",
                "forward",
            ),
            (
                "/venv/site-packages/torch/utils/_contextlib.py",
                "decorate_context",
            ),
            (MODULE, "_call_impl"),
            (
                "/venv/site-packages/transformers/models/llama/modeling_llama.py",
                "forward",
            ),
            (MODULE, "_call_impl"),
            ("/home/me/train.py", "train_step"),
        ];
        assert_eq!(phase_of(&rope), Some(Phase::Forward));
    }

    #[test]
    fn cpp_only_autograd_thread_stacks_are_backward() {
        let stack = [
            ("??", "torch::unwind::unwind()"),
            (
                "CUDACachingAllocator.cpp",
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)",
            ),
            ("", "at::cuda::getNewWorkspace()"),
            (
                "Blas.cpp",
                "at::native::(anonymous namespace)::addmm_out_cuda_impl(...)",
            ),
            (
                "??",
                "torch::autograd::generated::AddmmBackward0::apply(...)",
            ),
            ("??", "torch::autograd::Engine::evaluate_function(...)"),
            ("??", "torch::autograd::Engine::thread_main(...)"),
            ("./nptl/pthread_create.c", "start_thread"),
        ];
        assert_eq!(phase_of(&stack), Some(Phase::Backward));
    }

    #[test]
    fn optimizer_buffers_built_while_loading_are_told_apart() {
        let mut i = Interner::default();
        let mut stack = |frames: &[(&str, &str)]| stack_in(&mut i, frames);
        let main_params = stack(&[
            (
                "/venv/megatron/core/optimizer/distrib_optimizer.py",
                "_build_model_and_main_param_groups",
            ),
            (
                "/venv/megatron/core/optimizer/distrib_optimizer.py",
                "__init__",
            ),
            ("/home/me/verl/workers/megatron_workers.py", "init_model"),
        ]);
        let params = stack(&[
            (
                "/venv/megatron/core/distributed/param_and_grad_buffer.py",
                "__init__",
            ),
            ("/home/me/verl/workers/megatron_workers.py", "init_model"),
        ]);
        assert_eq!(phase_from_frames(&i, main_params), Some(Phase::Load));
        assert!(optimizer_code_while_loading(&i, main_params));
        assert!(!optimizer_code_while_loading(&i, params));
    }

    #[test]
    fn loading_and_hand_written_optimizers() {
        let init = [
            ("/home/me/flexgen/pytorch_backend.py", "allocate"),
            ("/home/me/flexgen/flex_opt.py", "init_weight_list"),
            ("/home/me/flexgen/flex_opt.py", "init_all_weights"),
            ("/home/me/flexgen/flex_opt.py", "__init__"),
        ];
        assert_eq!(phase_of(&init), Some(Phase::Load));
        // A profiling forward and optimizer buffers built while initialising are loading.
        let profile = [
            (
                "/venv/site-packages/vllm/model_executor/models/llama.py",
                "forward",
            ),
            (
                "/venv/site-packages/vllm/worker/model_runner.py",
                "profile_run",
            ),
            ("/home/me/workers.py", "init_model"),
        ];
        assert_eq!(phase_of(&profile), Some(Phase::Load));
        let zeroth_order = [
            (
                "C:\\research\\cezo_fl\\gradient_estimators\\adam_forward.py",
                "update_K_param_paramwise",
            ),
            ("C:\\research\\cezo_fl\\client.py", "pull_model"),
            ("C:\\research\\cezo_fl\\server.py", "train_one_step"),
        ];
        assert_eq!(phase_of(&zeroth_order), Some(Phase::Optimizer));
        // No frame that stands for a phase: no claim.
        assert_eq!(
            phase_of(&[
                ("/home/me/attention/scheduler.py", "step"),
                ("/home/me/pipeline.py", "__call__")
            ]),
            None
        );
    }
}
