//! What kind of memory an allocation is: weights, activations, gradients, optimizer state, KV
//! cache, temporaries — from what its frames name, from its lifetime across phases and steps,
//! and, for blocks without a stack, from the shapes and sizes the model's own tensors have.
//!
//! Rules (design.md §4), each claim with its confidence and the evidence it rests on:
//! * frames that name it: KV caches (`cache_utils`, vLLM's cache engine), gradients
//!   (`AccumulateGrad`);
//! * kv_cache: chains of tensors each replaced by one a fixed size larger, step after step
//!   (a cache grown by `torch.cat` at every decode step), several alike side by side;
//! * weights: born while loading; frameless blocks from before recording whose sizes recur in
//!   layer groups (a model's parameters); in a run without stacks, blocks alive from the start
//!   to the end whose sizes the optimizer keeps state for;
//! * activations: born in a forward and freed in the backward after it (or later in the same
//!   step: outputs kept until the step ends); in inference, large eval allocations;
//! * gradients: born in backward and alive past it (until zero_grad, the next step or the end);
//! * optimizer_state: born in the optimizer step and alive across steps;
//! * temporary: born and freed within one phase;
//! * unknown otherwise, with the reason. Allocations made before the window are judged by their
//!   recorded stack, else by the phase that frees them.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use super::annotations::{category_of_text, UserAnnotations};
use super::lifetimes::{Allocation, DeviceReplay, Origin};
use super::phase::{PerStack, Phase, Phases, Source};
use crate::snapshot::{Interner, Snapshot, StackId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Weights,
    Activations,
    Gradients,
    OptimizerState,
    Temporary,
    /// Keys and values cached for generation (transformers' cache_utils, vLLM's cache engine).
    KvCache,
    Unknown,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Weights,
        Category::Activations,
        Category::Gradients,
        Category::OptimizerState,
        Category::Temporary,
        Category::KvCache,
        Category::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::Activations => "activations",
            Category::Gradients => "gradients",
            Category::OptimizerState => "optimizer_state",
            Category::Temporary => "temporary",
            Category::KvCache => "kv_cache",
            Category::Unknown => "unknown",
        }
    }
}

/// How sure the attribution is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// The phase of birth was seen in frames, annotations or metadata.
    High,
    /// Inferred by position (frameless allocations, events between seen ones) or from sizes
    /// and lifetimes alone.
    Medium,
    /// A fallback guess, or nothing decides it.
    Low,
}

impl Confidence {
    pub fn name(self) -> &'static str {
        match self {
            Confidence::High => "high",
            Confidence::Medium => "medium",
            Confidence::Low => "low",
        }
    }
}

/// A category claim: what, how sure, and what it rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub category: Category,
    pub confidence: Confidence,
    pub evidence: &'static str,
}

fn claim(category: Category, confidence: Confidence, evidence: &'static str) -> Claim {
    Claim {
        category,
        confidence,
        evidence,
    }
}

/// Context shared by all allocations of one device.
pub struct Categorizer<'a> {
    pub phases: &'a Phases,
    pub interner: &'a Interner,
    /// Requested bytes at the peak (for the eval size rule).
    pub peak_bytes: i64,
    /// Stacks were recorded somewhere in the snapshot, so a block without one was allocated
    /// while nothing was being recorded.
    pub stacks: bool,
    /// [`category_from_frames`] of each stack, once looked at.
    pub stack_categories: PerStack,
    /// The frameless blocks from before the window, still allocated at the dump, form a model's
    /// parameter shapes ([`parameter_shaped`]).
    pub frameless_are_parameters: bool,
    /// Allocation events of the members of KV-cache growth chains ([`GrowthChains`]).
    pub kv_growth: FxHashSet<u32>,
    /// Sizes the optimizer keeps state of (state born in an optimizer step and never freed),
    /// with how many blocks of each.
    pub optimizer_state_sizes: FxHashMap<u64, u32>,
    /// The user's `_annotate_tensor` texts, by allocation.
    pub annotations: UserAnnotations,
}

impl<'a> Categorizer<'a> {
    /// The categorizer of one device, with the evidence that needs all its allocations.
    pub fn new(
        snapshot: &'a Snapshot,
        phases: &'a Phases,
        replay: &DeviceReplay,
    ) -> Categorizer<'a> {
        let mut frameless_ghosts = Vec::new();
        let mut optimizer_state_sizes: FxHashMap<u64, u32> = FxHashMap::default();
        // One walk over the allocations (millions in a long trace) for every rule below.
        let mut growth = GrowthChains::default();
        for a in replay.allocations.ghosts() {
            if a.stack == StackId::EMPTY {
                frameless_ghosts.push(a.requested_bytes);
            }
        }
        for a in replay.allocations.births() {
            let born = a.born;
            match phases.at(Some(born)) {
                Phase::Optimizer if a.free_event.is_none() => {
                    *optimizer_state_sizes.entry(a.requested_bytes).or_default() += 1;
                }
                // Where KV caches grow (outside backward, optimizer and loading).
                Phase::Forward | Phase::Eval | Phase::Unknown => growth.add(GrowthNode {
                    born,
                    freed: a.free_requested_event.or(a.free_event).unwrap_or(NO_EVENT),
                    bytes: a.requested_bytes,
                    stack: a.stack,
                    stream: a.stream,
                }),
                _ => {}
            }
        }
        Categorizer {
            phases,
            interner: &snapshot.interner,
            peak_bytes: replay.requested.peak().0,
            stacks: snapshot.has_stacks(),
            stack_categories: PerStack::new(&snapshot.interner),
            frameless_are_parameters: parameter_shaped(&frameless_ghosts),
            kv_growth: growth.finish(),
            optimizer_state_sizes,
            annotations: UserAnnotations::of(snapshot, replay.device),
        }
    }

    /// Is the forward interval containing `event` training: followed by a backward, or the
    /// last thing in a trace that trains (an OOM in the forward of a later step)?
    fn forward_is_training(&self, event: u32) -> bool {
        let Some(i) = self.phases.interval_of(event) else {
            return false;
        };
        let known = |iv: &&super::phase::PhaseInterval| iv.name != Phase::Unknown;
        match self.phases.intervals[i + 1..].iter().find(known) {
            Some(next) => next.name == Phase::Backward,
            None => self.phases.intervals[..i]
                .iter()
                .any(|iv| matches!(iv.name, Phase::Backward | Phase::Optimizer)),
        }
    }

    fn same_interval(&self, a: u32, b: u32) -> bool {
        match (self.phases.interval_of(a), self.phases.interval_of(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        }
    }

    /// Does `event` lie in a later training step than `born`?
    fn later_step(&self, born: u32, event: u32) -> bool {
        match (
            self.phases.step_at(Some(born)),
            self.phases.step_at(Some(event)),
        ) {
            (Some(a), Some(b)) => b > a,
            _ => false,
        }
    }

    /// Did steps run after the one `born` lies in (the trace goes on past it)?
    fn step_ended(&self, born: u32) -> bool {
        let Some(step) = self.phases.step_at(Some(born)) else {
            return false;
        };
        self.phases
            .intervals
            .iter()
            .rev()
            .find_map(|iv| iv.step)
            .is_some_and(|last| last > step)
    }

    pub fn categorize(&self, a: &Allocation) -> (Category, Confidence) {
        let c = self.claim(a);
        (c.category, c.confidence)
    }

    pub fn claim(&self, a: &Allocation) -> Claim {
        // The user's own word on it beats everything else.
        let named = self
            .annotations
            .of_allocation(a)
            .iter()
            .rev()
            .find_map(|&t| category_of_text(self.interner.get_text(t)));
        if let Some(c) = named {
            return claim(
                c,
                Confidence::High,
                "the user annotated it (_annotate_tensor)",
            );
        }
        // What the allocating code is, when its frames say so, beats the phase.
        if a.origin != Origin::FreedInWindow {
            let of_stack = || {
                category_from_frames(self.interner, a.stack)
                    .map(|c| Category::ALL.iter().position(|&x| x == c).unwrap_or(0) as u8)
            };
            let known = self.stack_categories.get(a.stack, of_stack);
            if let Some(c) = known.map(|k| Category::ALL[k as usize]) {
                let evidence = match c {
                    Category::KvCache => "the allocating frames are a KV cache's",
                    _ => "the allocating frames accumulate gradients (AccumulateGrad)",
                };
                return claim(c, Confidence::High, evidence);
            }
        }
        let Some(born) = a.alloc_event else {
            return self.before_window(a);
        };
        if self.kv_growth.contains(&born) {
            return claim(
                Category::KvCache,
                Confidence::Medium,
                "grows across decode steps: each step replaces it by a copy one token longer, \
                 side by side with others alike (a KV cache grown by concatenation)",
            );
        }
        let phase = self.phases.at(Some(born));
        let confidence = match self.phases.source_at(Some(born)) {
            Source::Annotation | Source::UserMetadata | Source::Frames => Confidence::High,
            Source::Position => Confidence::Medium,
            Source::StepPosition | Source::None => Confidence::Low,
        };
        let freed_inside = a.free_event.is_some_and(|d| self.same_interval(born, d));
        let outlived_step = match a.free_event {
            Some(d) => self.later_step(born, d),
            None => self.step_ended(born),
        };
        let c = |category, evidence| claim(category, confidence, evidence);
        match phase {
            Phase::Load if freed_inside => c(
                Category::Temporary,
                "allocated and freed while the model was loading",
            ),
            Phase::Load
                if self
                    .phases
                    .optimizer_code_while_loading(self.interner, a.stack) =>
            {
                c(
                    Category::OptimizerState,
                    "allocated by the optimizer's code while the model was set up",
                )
            }
            Phase::Load => c(Category::Weights, "allocated while the model was loading"),
            Phase::Forward if !self.forward_is_training(born) => c(
                Category::Activations,
                "allocated in a forward that no backward follows (inference, or the trace ends \
                 before any backward)",
            ),
            Phase::Forward if freed_inside => c(
                Category::Temporary,
                "allocated and freed within one forward pass",
            ),
            Phase::Forward if outlived_step => claim(
                Category::Unknown,
                Confidence::Low,
                "allocated in a forward but alive past its training step: a buffer built in the \
                 forward, or outputs kept across steps, not told apart",
            ),
            Phase::Forward if a.free_event.is_none() => c(
                Category::Activations,
                "allocated in the forward of the step the trace ends in, still alive",
            ),
            Phase::Forward => c(
                Category::Activations,
                "allocated in the forward and freed by the backward after it (or later in the \
                 same step)",
            ),
            Phase::Backward if freed_inside => c(
                Category::Temporary,
                "allocated and freed within one backward pass",
            ),
            Phase::Backward => c(
                Category::Gradients,
                "allocated in the backward and alive past it (until zero_grad, the next step or \
                 the end)",
            ),
            Phase::Optimizer if freed_inside => c(
                Category::Temporary,
                "allocated and freed within one optimizer step",
            ),
            Phase::Optimizer if a.free_event.is_none() || self.freed_by_a_later_step(born, a) => c(
                Category::OptimizerState,
                "allocated in an optimizer step and alive across steps",
            ),
            Phase::Optimizer if !outlived_step => c(
                Category::Temporary,
                "allocated in the optimizer step and freed before the next step",
            ),
            Phase::Optimizer => claim(
                Category::Unknown,
                Confidence::Low,
                "allocated in an optimizer step and freed in a later step outside the optimizer",
            ),
            Phase::Eval => {
                if (a.requested_bytes as f64) >= 0.01 * self.peak_bytes.max(0) as f64 {
                    c(
                        Category::Activations,
                        "allocated in evaluation, large (1 % of the peak or more)",
                    )
                } else {
                    c(Category::Temporary, "allocated in evaluation, small")
                }
            }
            Phase::Unknown => self.unknown_phase(a),
        }
    }

    /// Freed by the optimizer phase of a later step: state it replaced.
    fn freed_by_a_later_step(&self, born: u32, a: &Allocation) -> bool {
        a.free_event.is_some_and(|d| {
            self.phases.at(Some(d)) == Phase::Optimizer && !self.same_interval(born, d)
        })
    }

    /// Born where no evidence says which phase was running.
    fn unknown_phase(&self, a: &Allocation) -> Claim {
        // Alive from the start to the end, before the first step, with a size the optimizer
        // keeps state of: a parameter (the run without stacks loads the model unseen).
        let first_step_start = self
            .phases
            .intervals
            .iter()
            .find(|iv| iv.name == Phase::Optimizer)
            .map(|iv| iv.first_event);
        let before_first_step = match (a.alloc_event, first_step_start) {
            (Some(b), Some(s)) => b < s,
            _ => false,
        };
        if a.free_event.is_none()
            && before_first_step
            && self
                .optimizer_state_sizes
                .get(&a.requested_bytes)
                .is_some_and(|&n| n > 0)
        {
            return claim(
                Category::Weights,
                Confidence::Medium,
                "alive from before the first optimizer step to the end, with a size the \
                 optimizer keeps state of (a parameter)",
            );
        }
        claim(
            Category::Unknown,
            Confidence::Low,
            "no evidence of the phase it was allocated in",
        )
    }

    fn before_window(&self, a: &Allocation) -> Claim {
        // No stack and still allocated at the dump: allocated before recording started and kept
        // for the whole window. The model's parameters, when the sizes say so: recording is
        // usually switched on after the model is loaded.
        if a.origin == Origin::Ghost && a.stack == StackId::EMPTY {
            if !self.stacks {
                return claim(
                    Category::Unknown,
                    Confidence::Low,
                    "no stacks were recorded, and the block predates the window",
                );
            }
            if self.frameless_are_parameters {
                return claim(
                    Category::Weights,
                    Confidence::Medium,
                    "allocated before recording and alive to the end, among blocks whose sizes \
                     recur in layer groups (a model's parameters)",
                );
            }
            return claim(
                Category::Unknown,
                Confidence::Low,
                "allocated before recording (no stack) and the sizes of such blocks do not look \
                 like a model's parameters; record from before the model is loaded",
            );
        }
        // The recorded stack: the allocation's own for blocks still allocated at the dump, the
        // free's (or a copy of the allocation's) for those freed in the window.
        if a.origin == Origin::Ghost {
            if let Some(p) = self.phases.of_stack(self.interner, a.stack) {
                let c = match p {
                    Phase::Load
                        if self
                            .phases
                            .optimizer_code_while_loading(self.interner, a.stack) =>
                    {
                        Category::OptimizerState
                    }
                    Phase::Load => Category::Weights,
                    Phase::Optimizer => Category::OptimizerState,
                    Phase::Forward | Phase::Eval => Category::Activations,
                    Phase::Backward => Category::Gradients,
                    Phase::Unknown => Category::Unknown,
                };
                return claim(
                    c,
                    Confidence::High,
                    "the stack recorded with the block names the phase that allocated it",
                );
            }
        }
        let free_site = self.phases.of_stack(self.interner, a.stack);
        match a.free_event.map(|d| self.phases.at(Some(d))) {
            // Saved for backward and released by it.
            Some(Phase::Backward) => claim(
                Category::Activations,
                Confidence::Medium,
                "allocated before the window and freed by the backward",
            ),
            // Released by zero_grad: last step's gradients.
            Some(Phase::Optimizer) if frees_in_zero_grad(self.interner, a.stack) => claim(
                Category::Gradients,
                Confidence::Medium,
                "allocated before the window and freed by zero_grad",
            ),
            // Released by the optimizer's step itself: state it replaced (exp_avg, exp_avg_sq
            // re-created every step instead of updated in place).
            Some(Phase::Optimizer) if free_site == Some(Phase::Optimizer) => claim(
                Category::OptimizerState,
                Confidence::Medium,
                "allocated before the window and freed by the optimizer step that replaced it",
            ),
            // Released by the user's step code at the end of the step (loss, logits, inputs).
            Some(Phase::Optimizer) if a.stack != StackId::EMPTY => claim(
                Category::Activations,
                Confidence::Low,
                "allocated before the window and freed by the step's own code after the \
                 optimizer",
            ),
            Some(Phase::Optimizer) => claim(
                Category::Gradients,
                Confidence::Low,
                "allocated before the window and freed in the optimizer phase",
            ),
            _ => claim(
                Category::Unknown,
                Confidence::Low,
                "allocated before the window, and neither a stack nor the phase that frees it \
                 tells what it is",
            ),
        }
    }
}

/// Is any frame of the stack `zero_grad` (of torch.optim or a framework's wrapper)?
fn frees_in_zero_grad(interner: &Interner, stack: StackId) -> bool {
    interner.get_stack(stack).iter().any(|&f| {
        interner
            .get_text(interner.get_frame(f).name)
            .contains("zero_grad")
    })
}

/// Categories the allocating code names by itself: KV caches (transformers' `cache_utils`,
/// vLLM's cache engine, anything called `*kv_cache*`) and gradients (autograd's
/// `AccumulateGrad` node, seen with `stacks="all"`).
pub fn category_from_frames(interner: &Interner, stack: StackId) -> Option<Category> {
    interner.get_stack(stack).iter().find_map(|&id| {
        let f = interner.get_frame(id);
        let raw_name = interner.get_text(f.name);
        if raw_name.contains("AccumulateGrad") {
            return Some(Category::Gradients);
        }
        let name = raw_name.to_ascii_lowercase();
        let file = interner.get_text(f.filename).replace('\\', "/");
        (file.contains("cache_utils")
            || file.contains("cache_engine")
            || name.contains("kv_cache")
            || name.contains("kvcache"))
        .then_some(Category::KvCache)
    })
}

/// Do these block sizes look like a model's parameters? A model repeats one block of layers,
/// so its parameters come in sizes that recur a multiple of the layer count each: in a
/// transformer four attention matrices and three MLP matrices per layer (LLaMA-7B in fp16:
/// 128 blocks of 32 MiB and 96 of 86 MiB, for 32 layers). Asked: the two sizes holding most
/// bytes among those that recur (4 times or more) have a common count of at least 4 layers,
/// sizes in multiples of it hold at least half the bytes, and they recur in at least two
/// different counts (a KV cache alone is one count: one block, or a key and a value, per layer).
pub fn parameter_shaped(sizes: &[u64]) -> bool {
    let mut counts: FxHashMap<u64, u64> = FxHashMap::default();
    for &s in sizes {
        *counts.entry(s).or_default() += 1;
    }
    let total: u128 = sizes.iter().map(|&s| s as u128).sum();
    let mut recurring: Vec<(u64, u64)> = counts.into_iter().filter(|&(_, n)| n >= 4).collect();
    recurring.sort_by_key(|&(s, n)| std::cmp::Reverse((s as u128 * n as u128, s)));
    let [(_, a), (_, b), ..] = recurring[..] else {
        return false;
    };
    let layers = gcd(a, b);
    if layers < 4 || total == 0 {
        return false;
    }
    let layered: Vec<&(u64, u64)> = recurring.iter().filter(|(_, n)| n % layers == 0).collect();
    let layered_bytes: u128 = layered.iter().map(|&&(s, n)| s as u128 * n as u128).sum();
    let counts_differ = layered.iter().any(|(_, n)| *n != layered[0].1);
    counts_differ && layered_bytes * 2 >= total
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// An allocation made where KV caches grow, for [`GrowthChains`].
#[derive(Clone, Copy, Debug)]
struct GrowthNode {
    born: u32,
    /// `NO_EVENT`: never freed.
    freed: u32,
    stack: StackId,
    bytes: u64,
    stream: u64,
}

const NO_EVENT: u32 = u32::MAX;
/// How many events before the old tensor's free its replacement may be allocated.
const REPLACED_WITHIN: u32 = 4;

/// A node in [`GrowthChains`]' heap, ordered by its free alone (frees are distinct events),
/// the earliest first.
#[derive(Clone, Copy)]
struct Waiting(GrowthNode);

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.0.freed == other.0.freed
    }
}

impl Eq for Waiting {}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.freed.cmp(&self.0.freed)
    }
}

/// The allocation events of KV caches grown by concatenation: at every decode step each
/// layer's cache is replaced by a copy one token longer (`torch.cat`), allocated just before
/// the old one is freed. A chain of three or more such replacements from one stack and stream,
/// growing by the same number of bytes each time, side by side with at least one other chain of
/// the same sizes (keys and values, layers), outside backward, optimizer and loading.
///
/// Read in one pass over the nodes in order of birth, holding only the nodes not yet freed and
/// the replacements found (a trace has hundreds of thousands of nodes): a node's replacement is
/// the latest node born in the `REPLACED_WITHIN` events before its free that is larger, from
/// the same stack and stream; when several nodes pick one, the earliest born keeps it.
#[derive(Default)]
struct GrowthChains {
    /// The last nodes born (at most `REPLACED_WITHIN`: births are distinct events), oldest
    /// first.
    recent: std::collections::VecDeque<GrowthNode>,
    /// Nodes waiting for their free, earliest free first.
    waiting: std::collections::BinaryHeap<Waiting>,
    /// By the birth of a replacement: the birth and bytes of the node it replaces, and its own
    /// bytes.
    replaced: FxHashMap<u32, (u32, u64, u64)>,
}

impl GrowthChains {
    /// The next node; nodes come in order of birth.
    fn add(&mut self, node: GrowthNode) {
        debug_assert!(self.recent.back().is_none_or(|last| last.born < node.born));
        // Nodes freed by now: every node born before their free has come.
        self.resolve_freed_by(node.born);
        if self.recent.len() == REPLACED_WITHIN as usize {
            self.recent.pop_front();
        }
        self.recent.push_back(node);
        if node.freed != NO_EVENT {
            self.waiting.push(Waiting(node));
        }
    }

    /// Finds the replacements of the waiting nodes freed at or before `event`.
    fn resolve_freed_by(&mut self, event: u32) {
        while let Some(&Waiting(x)) = self.waiting.peek() {
            let freed = x.freed;
            if freed > event {
                break;
            }
            self.waiting.pop();
            let earliest = freed.saturating_sub(REPLACED_WITHIN);
            let replacement = self.recent.iter().rev().find(|y| {
                (earliest..freed).contains(&y.born)
                    && y.born > x.born
                    && y.bytes > x.bytes
                    && y.stack == x.stack
                    && y.stream == x.stream
            });
            if let Some(y) = replacement {
                let claim = self
                    .replaced
                    .entry(y.born)
                    .or_insert((x.born, x.bytes, y.bytes));
                if x.born < claim.0 {
                    *claim = (x.born, x.bytes, y.bytes);
                }
            }
        }
    }

    fn finish(mut self) -> FxHashSet<u32> {
        self.resolve_freed_by(NO_EVENT);
        // Links from each replaced node to its replacement; sizes of every linked node.
        let mut next: FxHashMap<u32, u32> = FxHashMap::default();
        let mut bytes: FxHashMap<u32, u64> = FxHashMap::default();
        for (&y, &(x, x_bytes, y_bytes)) in &self.replaced {
            next.insert(x, y);
            bytes.insert(x, x_bytes);
            bytes.insert(y, y_bytes);
        }
        // Chains from their first member (replaced, replacing nothing).
        let starts = next.keys().filter(|x| !self.replaced.contains_key(x));
        let chains = starts.map(|&start| {
            let mut members = vec![start];
            let mut at = start;
            // Replacements are born later: no cycles.
            while let Some(&y) = next.get(&at) {
                members.push(y);
                at = y;
            }
            let sizes = members.iter().map(|m| bytes[m]).collect();
            (sizes, members)
        });
        alike_growth(chains)
    }
}

/// The members of the chains, given as (sizes, births) of at least two members, that grow by
/// the same bytes each time over three or more, where another chain has the same sizes.
fn alike_growth(chains: impl Iterator<Item = (Vec<u64>, Vec<u32>)>) -> FxHashSet<u32> {
    let mut by_sizes: FxHashMap<Vec<u64>, Vec<Vec<u32>>> = FxHashMap::default();
    for (sizes, members) in chains {
        let step = sizes[1] - sizes[0];
        if sizes.len() < 3 || sizes.windows(2).any(|w| w[1] - w[0] != step) {
            continue;
        }
        by_sizes.entry(sizes).or_default().push(members);
    }
    by_sizes
        .into_values()
        .filter(|alike| alike.len() >= 2)
        .flatten()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch form [`GrowthChains`] replaced: all nodes at once, sorted by birth.
    fn growth_chains_reference(mut nodes: Vec<GrowthNode>) -> FxHashSet<u32> {
        // By birth (the allocations come in the order of their first event, so this is a check):
        // a node born at an event is found by binary search, with no map as large as the trace.
        // Births are distinct events, so an unstable sort gives the same order (and no buffer).
        if !nodes.is_sorted_by_key(|n| n.born) {
            nodes.sort_unstable_by_key(|n| n.born);
        }
        // The replacement of each node (`NO_EVENT`: none), and whether a node replaces another.
        let mut next: Vec<u32> = vec![NO_EVENT; nodes.len()];
        let mut replaces = vec![false; nodes.len()];
        for (i, x) in nodes.iter().enumerate() {
            if x.freed == NO_EVENT {
                continue;
            }
            let f = x.freed;
            let lo = nodes.partition_point(|n| n.born < f.saturating_sub(REPLACED_WITHIN));
            // Births are distinct events: at most REPLACED_WITHIN nodes lie before `f`.
            let hi = (lo..nodes.len().min(lo + REPLACED_WITHIN as usize))
                .find(|&j| nodes[j].born >= f)
                .unwrap_or(nodes.len().min(lo + REPLACED_WITHIN as usize));
            let replacement = (lo..hi).rev().find(|&j| {
                let y = &nodes[j];
                y.born > x.born && y.bytes > x.bytes && y.stack == x.stack && y.stream == x.stream
            });
            if let Some(j) = replacement {
                if !replaces[j] {
                    next[i] = j as u32;
                    replaces[j] = true;
                }
            }
        }
        // Chains from their first member.
        let starts = (0..nodes.len()).filter(|&i| !replaces[i] && next[i] != NO_EVENT);
        let chains = starts.map(|start| {
            let mut members = vec![start];
            let mut at = start;
            while next[at] != NO_EVENT {
                let j = next[at] as usize;
                members.push(j);
                at = j;
            }
            let sizes = members.iter().map(|&m| nodes[m].bytes).collect();
            (sizes, members.iter().map(|&m| nodes[m].born).collect())
        });
        alike_growth(chains)
    }

    #[test]
    fn parameter_shapes_recur_in_layer_groups() {
        // LLaMA-7B in fp16 (32 layers): attention and MLP matrices, embeddings, norms.
        let mut llama = vec![33554432; 128];
        llama.extend([90177536; 96]);
        llama.extend([262144000; 2]);
        llama.extend([8192; 65]);
        assert!(parameter_shaped(&llama));
        // A GPT-2-small-like model: the embedding outweighs any one layer size.
        let mut gpt2 = vec![9437184; 24];
        gpt2.extend([7077888; 12]);
        gpt2.extend([2359296; 12]);
        gpt2.push(154389504);
        assert!(parameter_shaped(&gpt2));
        // A KV cache (one size per layer) is not; nor are sizes without a common layer count.
        assert!(!parameter_shaped(&[905969664; 24]));
        let mut kv = vec![905969664; 24];
        kv.extend([905969664 / 2; 24]);
        assert!(!parameter_shaped(&kv));
        let mut odd = vec![134217728; 12];
        odd.extend([58982400; 20]);
        odd.extend([8388608; 81]);
        odd.extend([67108864; 9]);
        odd.extend([117964800; 5]);
        odd.extend([9437184; 54]);
        odd.extend([33554432; 13]);
        odd.extend([6553600; 66]);
        assert!(!parameter_shaped(&odd));
        assert!(!parameter_shaped(&[]));
    }

    /// Nodes like a decode loop's: `layers` caches per step replaced by a copy one token
    /// longer, with other allocations (same stacks too) and frees mixed in by `seed`.
    fn decode_like_nodes(seed: u64, layers: u32, steps: u32) -> Vec<GrowthNode> {
        let mut state = seed;
        let mut rand = move |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut nodes = Vec::new();
        let mut event = 0u32;
        // Per layer: the live cache (index into `nodes`).
        let mut caches: Vec<Option<usize>> = vec![None; layers as usize];
        for step in 0..steps {
            for (layer, cache) in caches.iter_mut().enumerate() {
                event += 1 + rand(3) as u32;
                let bytes = 4096 * (u64::from(step) + 1) + rand(2) * 4096 * u64::from(step > 5);
                nodes.push(GrowthNode {
                    born: event,
                    freed: NO_EVENT,
                    stack: StackId(1 + (layer % 2) as u32),
                    bytes,
                    stream: u64::from(rand(8) == 0),
                });
                let new = nodes.len() - 1;
                if let Some(old) = cache.replace(new) {
                    event += 1 + rand(4) as u32;
                    nodes[old].freed = event;
                }
                // Noise: a short-lived allocation, sometimes freed right away.
                if rand(3) == 0 {
                    event += 1;
                    let freed = if rand(2) == 0 {
                        event + 1 + rand(5) as u32
                    } else {
                        NO_EVENT
                    };
                    nodes.push(GrowthNode {
                        born: event,
                        freed,
                        stack: StackId(1 + rand(3) as u32),
                        bytes: 512 * (1 + rand(64)),
                        stream: 0,
                    });
                    event += 1;
                }
            }
        }
        nodes
    }

    #[test]
    fn growth_chains_in_one_pass_match_the_batch_form() {
        let mut found = 0;
        for seed in 0..300 {
            let nodes = decode_like_nodes(seed, 1 + (seed % 5) as u32, 2 + (seed % 11) as u32);
            let mut one_pass = GrowthChains::default();
            for n in &nodes {
                one_pass.add(*n);
            }
            let got = one_pass.finish();
            assert_eq!(got, growth_chains_reference(nodes), "seed {seed}");
            found += got.len();
        }
        // The generator makes chains (the comparison is not between two empty sets).
        assert!(found > 500, "{found}");
    }
}
