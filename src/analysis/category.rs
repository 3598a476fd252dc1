//! What kind of memory an allocation is: weights, activations, gradients, optimizer state,
//! temporaries — from the phase of its birth and death, its lifetime across phases, and frames.
//!
//! Rules (design.md §4): born in load → weights; born in forward and alive past that forward →
//! activations, freed inside it → temporary; born in backward and alive past it → gradients,
//! freed inside it → temporary; born in the optimizer step and alive past it → optimizer state,
//! freed inside it → temporary. Inference (a forward with no backward after it) holds KV caches
//! and hidden states: activations. Eval: large allocations (≥ 1 % of the peak, e.g. logits) are
//! activations, small ones temporaries. Allocations made before the window are judged by their
//! recorded stack, else by the phase that frees them.

use serde::{Deserialize, Serialize};

use super::phase::{PerStack, Phase, Phases, Source};
use super::replay::{Allocation, Origin};
use crate::snapshot::Interner;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    /// The phase of birth was seen in frames, annotations or metadata.
    High,
    /// Inferred by position (frameless allocations, events between seen ones).
    Medium,
    /// A fallback guess.
    Low,
}

/// Context shared by all allocations of one device.
pub struct Categorizer<'a> {
    pub phases: &'a Phases,
    pub interner: &'a Interner,
    /// Requested bytes at the peak (for the eval size rule).
    pub peak_bytes: i64,
    /// The device has a trace: memory history was being recorded, so a block without a stack
    /// predates the recording.
    pub recorded: bool,
    /// [`category_from_frames`] of each stack, once looked at.
    pub stack_categories: PerStack,
}

impl Categorizer<'_> {
    /// Is the forward interval containing `event` followed by a backward (training)?
    fn forward_is_training(&self, event: u32) -> bool {
        let Some(i) = self.phases.interval_of(event) else {
            return false;
        };
        self.phases.intervals[i + 1..]
            .iter()
            .find(|iv| iv.name != Phase::Unknown)
            .is_some_and(|iv| iv.name == Phase::Backward)
            || self.phases.intervals[i].name == Phase::Backward
    }

    fn same_interval(&self, a: u32, b: u32) -> bool {
        match (self.phases.interval_of(a), self.phases.interval_of(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        }
    }

    pub fn categorize(&self, a: &Allocation) -> (Category, Confidence) {
        // What the allocating code is, when its frames say so, beats the phase.
        if a.origin != Origin::FreedInWindow {
            let of_stack = || {
                category_from_frames(self.interner, a.stack)
                    .map(|c| Category::ALL.iter().position(|&x| x == c).unwrap_or(0) as u8)
            };
            let known = self.stack_categories.get(a.stack, of_stack);
            if let Some(c) = known.map(|k| Category::ALL[k as usize]) {
                return (c, Confidence::High);
            }
        }
        let Some(born) = a.alloc_event else {
            return self.before_window(a);
        };
        let phase = self.phases.at(Some(born));
        let confidence = match self.phases.source_at(Some(born)) {
            Source::Annotation | Source::UserMetadata | Source::Frames => Confidence::High,
            Source::Position => Confidence::Medium,
            Source::None => Confidence::Low,
        };
        let freed_inside = a.free_event.is_some_and(|d| self.same_interval(born, d));
        let category = match phase {
            Phase::Load => Category::Weights,
            Phase::Forward if !self.forward_is_training(born) => Category::Activations,
            Phase::Forward if freed_inside => Category::Temporary,
            Phase::Forward => Category::Activations,
            Phase::Backward if freed_inside => Category::Temporary,
            Phase::Backward => Category::Gradients,
            Phase::Optimizer if freed_inside => Category::Temporary,
            Phase::Optimizer => Category::OptimizerState,
            Phase::Eval => {
                if (a.requested_bytes as f64) >= 0.01 * self.peak_bytes.max(0) as f64 {
                    Category::Activations
                } else {
                    Category::Temporary
                }
            }
            Phase::Unknown => Category::Unknown,
        };
        (category, confidence)
    }

    fn before_window(&self, a: &Allocation) -> (Category, Confidence) {
        // No stack and never freed while history was recorded: allocated before recording
        // started and kept for the whole window, which in practice is the model's parameters (recording is usually switched on
        // after the model is loaded). A guess by lifetime alone.
        if a.stack == crate::snapshot::StackId::EMPTY && a.free_event.is_none() && self.recorded {
            return (Category::Weights, Confidence::Low);
        }
        // The recorded stack: the allocation's own for blocks still allocated at the dump, the
        // free's (or a copy of the allocation's) for those freed in the window.
        if a.origin == Origin::Ghost {
            if let Some(p) = self.phases.of_stack(self.interner, a.stack) {
                let c = match p {
                    Phase::Load => Category::Weights,
                    Phase::Optimizer => Category::OptimizerState,
                    Phase::Forward | Phase::Eval => Category::Activations,
                    Phase::Backward => Category::Gradients,
                    Phase::Unknown => Category::Unknown,
                };
                return (c, Confidence::High);
            }
        }
        let free_site = self.phases.of_stack(self.interner, a.stack);
        match a.free_event.map(|d| self.phases.at(Some(d))) {
            // Saved for backward and released by it.
            Some(Phase::Backward) => (Category::Activations, Confidence::Medium),
            // Released by zero_grad: last step's gradients.
            Some(Phase::Optimizer) if frees_in_zero_grad(self.interner, a.stack) => {
                (Category::Gradients, Confidence::Medium)
            }
            // Released by the optimizer's step itself: state it replaced (exp_avg, exp_avg_sq
            // re-created every step instead of updated in place).
            Some(Phase::Optimizer) if free_site == Some(Phase::Optimizer) => {
                (Category::OptimizerState, Confidence::Medium)
            }
            // Released by the user's step code at the end of the step (loss, logits, inputs).
            Some(Phase::Optimizer) if a.stack != crate::snapshot::StackId::EMPTY => {
                (Category::Activations, Confidence::Low)
            }
            Some(Phase::Optimizer) => (Category::Gradients, Confidence::Low),
            _ => (Category::Unknown, Confidence::Low),
        }
    }
}

/// Is any frame of the stack `zero_grad` (of torch.optim or a framework's wrapper)?
fn frees_in_zero_grad(interner: &Interner, stack: crate::snapshot::StackId) -> bool {
    interner.get_stack(stack).iter().any(|&f| {
        interner
            .get_text(interner.get_frame(f).name)
            .contains("zero_grad")
    })
}

/// Categories the allocating code names by itself: KV caches (transformers' `cache_utils`,
/// vLLM's cache engine, anything called `*kv_cache*`).
pub fn category_from_frames(
    interner: &Interner,
    stack: crate::snapshot::StackId,
) -> Option<Category> {
    interner.get_stack(stack).iter().find_map(|&id| {
        let f = interner.get_frame(id);
        let name = interner.get_text(f.name).to_ascii_lowercase();
        let file = interner.get_text(f.filename).replace('\\', "/");
        (file.contains("cache_utils")
            || file.contains("cache_engine")
            || name.contains("kv_cache")
            || name.contains("kvcache"))
        .then_some(Category::KvCache)
    })
}
