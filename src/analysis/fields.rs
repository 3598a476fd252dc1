//! What a snapshot's format says beyond the memory itself: the accelerator that wrote it, the
//! 2026 fields it carries (`pool_id`, `annotate`, `user_metadata`, `internal_metadata`), and the
//! keys and actions this version does not read, counted and named rather than dropped.

use std::collections::BTreeMap;

use crate::report::{NameCount, SnapshotFields};
use crate::snapshot::{Action, Snapshot};

/// Distinct metadata texts listed.
const LISTED: usize = 20;

pub fn snapshot_fields(snapshot: &Snapshot) -> SnapshotFields {
    let mut out = SnapshotFields {
        accelerator: Accelerator::of(snapshot).name().to_owned(),
        unknown_entry_keys: snapshot
            .unknown_entry_keys
            .iter()
            .map(|(name, entries)| NameCount {
                name: name.clone(),
                entries: *entries,
            })
            .collect(),
        other_top_level_keys: snapshot.other_top_level_keys.clone(),
        ..SnapshotFields::default()
    };
    let interner = &snapshot.interner;
    let (mut user, mut internal, mut actions) = (
        BTreeMap::<String, u64>::new(),
        BTreeMap::<String, u64>::new(),
        BTreeMap::<String, u64>::new(),
    );
    let traces = snapshot
        .device_traces
        .iter()
        .chain(snapshot.host_trace.as_ref());
    for trace in traces {
        // Counting entries takes a pass over the rows: only when something is to be counted.
        let counted = trace.distinct_combinations().iter().any(|c| {
            c.pool_id.is_some()
                || c.internal_metadata.is_some()
                || matches!(c.action, Action::Annotate | Action::Other)
                || c.user_metadata
                    .is_some_and(|m| !interner.get_text(m).is_empty())
        });
        if !counted {
            continue;
        }
        for (c, n) in trace.combinations() {
            out.pool_ids |= c.pool_id.is_some();
            match c.action {
                Action::Annotate => out.annotations += n,
                Action::Other => {
                    let name = c.action_text.map_or("", |t| interner.get_text(t));
                    *actions.entry(name.to_owned()).or_default() += n;
                }
                _ => {}
            }
            // An annotation's metadata is its text (shown with the allocation), not a context.
            if let Some(m) = c.user_metadata.filter(|_| c.action != Action::Annotate) {
                let text = interner.get_text(m);
                if !text.is_empty() {
                    *user.entry(text.to_owned()).or_default() += n;
                }
            }
            if let Some(m) = c.internal_metadata {
                *internal.entry(interner.get_text(m).to_owned()).or_default() += n;
            }
        }
    }
    let listed = |m: BTreeMap<String, u64>| {
        let mut v: Vec<NameCount> = m
            .into_iter()
            .map(|(name, entries)| NameCount { name, entries })
            .collect();
        v.sort_by(|a, b| b.entries.cmp(&a.entries).then_with(|| a.name.cmp(&b.name)));
        v.truncate(LISTED);
        v
    };
    out.user_metadata = listed(user);
    out.internal_metadata = listed(internal);
    out.unknown_actions = listed(actions);
    out
}

/// Which allocator wrote the dump: it decides the API and the words the advice uses, so that
/// an XPU dump is never told to call `torch.cuda`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accelerator {
    /// CUDA (ROCm builds write CUDA's keys and cannot be told apart).
    Cuda,
    /// XPU: its `allocator_settings` hold only `PYTORCH_ALLOC_CONF` and `expandable_segments`.
    Xpu,
}

impl Accelerator {
    pub fn of(snapshot: &Snapshot) -> Accelerator {
        let Some(settings) = &snapshot.allocator_settings else {
            return Accelerator::Cuda;
        };
        match settings.raw.as_object() {
            Some(o)
                if o.contains_key("PYTORCH_ALLOC_CONF")
                    && !o.contains_key("PYTORCH_CUDA_ALLOC_CONF")
                    && !o.contains_key("max_split_size") =>
            {
                Accelerator::Xpu
            }
            _ => Accelerator::Cuda,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Accelerator::Cuda => "cuda",
            Accelerator::Xpu => "xpu",
        }
    }

    /// The accelerator a report names ([`Accelerator::name`]); CUDA for a report written
    /// before the field existed.
    pub fn named(name: &str) -> Accelerator {
        match name {
            "xpu" => Accelerator::Xpu,
            _ => Accelerator::Cuda,
        }
    }

    /// The device module (`torch.cuda`), whose `empty_cache()` this device's cache answers to.
    pub fn device_module(self) -> &'static str {
        match self {
            Accelerator::Cuda => "torch.cuda",
            Accelerator::Xpu => "torch.xpu",
        }
    }

    /// The module whose `_record_memory_history` and `_dump_snapshot` record this device.
    pub fn memory_module(self) -> &'static str {
        match self {
            Accelerator::Cuda => "torch.cuda.memory",
            Accelerator::Xpu => "torch.xpu.memory",
        }
    }

    /// How to set an allocator option (`expandable_segments:True`).
    pub fn set_conf(self, option: &str) -> String {
        match self {
            Accelerator::Cuda => {
                format!("PYTORCH_ALLOC_CONF={option} (PYTORCH_CUDA_ALLOC_CONF before torch 2.9)")
            }
            Accelerator::Xpu => format!("PYTORCH_ALLOC_CONF={option}"),
        }
    }

    /// The tool that shows the device's memory in use (it counts reserved memory as used).
    pub fn smi(self) -> &'static str {
        match self {
            Accelerator::Cuda => "nvidia-smi",
            Accelerator::Xpu => "xpu-smi",
        }
    }

    /// The driver call that reserves a segment.
    pub fn device_malloc(self) -> &'static str {
        match self {
            Accelerator::Cuda => "cudaMalloc",
            Accelerator::Xpu => "device malloc",
        }
    }

    /// What the runtime takes of the card before PyTorch reserves anything.
    pub fn context(self) -> &'static str {
        match self {
            Accelerator::Cuda => "CUDA context",
            Accelerator::Xpu => "XPU runtime",
        }
    }
}
