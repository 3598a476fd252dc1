//! The user's own words on an allocation: `torch.cuda.memory._annotate_tensor(t, text)`
//! (torch 2.14+) writes an `annotate` entry whose `user_metadata` is the text, at the base address
//! of the allocation alive then. The text is attached to that allocation, and a text that names a
//! category ("kv cache", "optimizer state", "weights") is the strongest category evidence there is.

use rustc_hash::{FxHashMap, FxHashSet};

use super::category::Category;
use super::lifetimes::Allocation;
use crate::snapshot::{Action, Snapshot, TextId};

/// An allocation before the window has no alloc event.
const BEFORE_WINDOW: u32 = u32::MAX;

/// The annotations of one device's allocations.
#[derive(Clone, Debug, Default)]
pub struct UserAnnotations {
    /// By (address, alloc event or [`BEFORE_WINDOW`]): the texts, oldest first.
    by_allocation: FxHashMap<(u64, u32), Vec<TextId>>,
    /// `annotate` entries in the trace.
    pub entries: u64,
    /// Entries at an address the window shows no live allocation at (it was freed before).
    pub unmatched: u64,
}

impl UserAnnotations {
    /// Two passes over the trace: the annotated addresses, then the allocation alive at each
    /// (work linear in the trace, however many annotations).
    pub fn of(snapshot: &Snapshot, device: i64) -> UserAnnotations {
        let trace = snapshot.trace(device);
        let mut out = UserAnnotations::default();
        // Most traces have none: their few shared combinations say so without a pass.
        if !trace.may_have(Action::Annotate) {
            return out;
        }
        let mut addresses: FxHashSet<u64> = FxHashSet::default();
        trace.for_each_core(0..trace.len(), |_, e| {
            if e.action == Action::Annotate {
                addresses.insert(e.addr);
            }
        });
        if addresses.is_empty() {
            return out;
        }
        // The live allocation at each annotated address: its alloc event; freed ones leave.
        let mut live: FxHashMap<u64, u32> = FxHashMap::default();
        let mut freed_in_window: FxHashSet<u64> = FxHashSet::default();
        trace.for_each_core(0..trace.len(), |i, e| {
            if !addresses.contains(&e.addr) {
                return;
            }
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, i as u32);
                }
                Action::FreeCompleted if live.remove(&e.addr).is_none() => {
                    freed_in_window.insert(e.addr);
                }
                Action::Annotate => {
                    out.entries += 1;
                    let born = match live.get(&e.addr) {
                        Some(&born) => born,
                        // Never allocated in the window and not freed yet: from before it.
                        None if !freed_in_window.contains(&e.addr) => BEFORE_WINDOW,
                        None => {
                            out.unmatched += 1;
                            return;
                        }
                    };
                    if let Some(text) = e.user_metadata {
                        out.by_allocation
                            .entry((e.addr, born))
                            .or_default()
                            .push(text);
                    }
                }
                _ => {}
            }
        });
        out
    }

    /// The texts attached to `a`, oldest first.
    pub fn of_allocation(&self, a: &Allocation) -> &[TextId] {
        if self.by_allocation.is_empty() {
            return &[];
        }
        let born = a.alloc_event.unwrap_or(BEFORE_WINDOW);
        self.by_allocation
            .get(&(a.address, born))
            .map_or(&[], Vec::as_slice)
    }

    pub fn is_empty(&self) -> bool {
        self.by_allocation.is_empty()
    }
}

/// The category a user's annotation names, if it names one: "kv cache", "optimizer state",
/// "exp_avg", "weights", "params", "grads", "activations", "workspace".
pub fn category_of_text(text: &str) -> Option<Category> {
    let t = text.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| t.contains(w));
    if has(&[
        "kv cache",
        "kv_cache",
        "kvcache",
        "key cache",
        "value cache",
        "past_key",
    ]) {
        Some(Category::KvCache)
    } else if has(&["optimizer", "optim", "exp_avg", "adam", "momentum"]) {
        Some(Category::OptimizerState)
    } else if has(&["grad"]) {
        Some(Category::Gradients)
    } else if has(&["weight", "param", "embedding table"]) {
        Some(Category::Weights)
    } else if has(&["activation", "saved for backward", "saved tensor"]) {
        Some(Category::Activations)
    } else if has(&["temp", "scratch", "workspace", "buffer"]) {
        Some(Category::Temporary)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_texts_name_categories() {
        assert_eq!(category_of_text("kv cache"), Some(Category::KvCache));
        assert_eq!(
            category_of_text("Optimizer state (exp_avg)"),
            Some(Category::OptimizerState)
        );
        assert_eq!(
            category_of_text("weights of layer 3"),
            Some(Category::Weights)
        );
        assert_eq!(category_of_text("grad bucket"), Some(Category::Gradients));
        assert_eq!(
            category_of_text("saved for backward"),
            Some(Category::Activations)
        );
        assert_eq!(
            category_of_text("nccl workspace"),
            Some(Category::Temporary)
        );
        assert_eq!(category_of_text("batch 7"), None);
    }
}
