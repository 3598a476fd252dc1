//! The typed snapshot: segments, blocks, trace entries, settings and annotations, with frames
//! and stacks interned behind small ids.

use serde::{Deserialize, Serialize};

use super::intern::{Interner, StackId, TextId};
use super::trace::Trace;

/// Which top-level shape the file had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// `_dump_snapshot` dict (`segments`, `device_traces`, …).
    Dict,
    /// Bare list of segments (`torch.cuda.memory_snapshot()`, pre-2.0 files).
    SegmentList,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
    /// A state string this version does not know.
    Unknown,
}

impl BlockState {
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
            BlockState::Unknown => "unknown",
        }
    }

    /// Active = still holding memory for the program (allocated or waiting for its free).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            BlockState::ActiveAllocated | BlockState::ActivePendingFree
        )
    }
}

/// Small (≤ 1 MiB requests) or large pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    Small,
    Large,
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// Requested bytes as PyTorch's own tools read them (legacy layout: `history[0].real_size`).
    /// Stale for inactive blocks; only meaningful for active ones.
    pub requested_size: u64,
    pub state: BlockState,
    pub frames: StackId,
}

#[derive(Clone, Debug)]
pub struct Segment {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    /// Raw `cudaStream_t` value; 0 is the default stream.
    pub stream: u64,
    pub pool_kind: PoolKind,
    /// `segment_pool_id`; `(0, 0)` is the default pool. `None` in files older than 2.1.
    pub pool_id: Option<(i64, i64)>,
    pub is_expandable: bool,
    pub frames: StackId,
    pub blocks: Vec<Block>,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.total_size)
    }

    /// True for CUDA-graph and MemPool segments (anything but the default pool).
    pub fn is_private_pool(&self) -> bool {
        matches!(self.pool_id, Some(p) if p != (0, 0))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Oom,
    Snapshot,
    Annotate,
    /// An action string this version does not know; kept, shown raw.
    Other,
}

impl Action {
    pub fn from_name(name: &str) -> Action {
        match name {
            "alloc" => Action::Alloc,
            "free_requested" => Action::FreeRequested,
            "free_completed" => Action::FreeCompleted,
            "segment_alloc" => Action::SegmentAlloc,
            "segment_free" => Action::SegmentFree,
            "segment_map" => Action::SegmentMap,
            "segment_unmap" => Action::SegmentUnmap,
            "oom" => Action::Oom,
            "snapshot" => Action::Snapshot,
            "annotate" => Action::Annotate,
            _ => Action::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Oom => "oom",
            Action::Snapshot => "snapshot",
            Action::Annotate => "annotate",
            Action::Other => "other",
        }
    }
}

/// One entry of `device_traces[d]` (stored compactly in a [`Trace`], read back by value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceEntry {
    pub action: Action,
    /// The raw action text when `action` is `Other`.
    pub action_text: Option<TextId>,
    /// Block or segment address (0 for `oom` and `snapshot`).
    pub addr: u64,
    /// Meaning depends on the action (requested bytes, segment bytes, rounded OOM request).
    pub size: u64,
    pub stream: u64,
    /// `device_free` of an `oom` entry.
    pub device_free: Option<u64>,
    pub time_us: Option<i64>,
    pub frames: StackId,
    pub user_metadata: Option<TextId>,
    pub compile_context: Option<TextId>,
    /// `pool_id` (torch 2.12+): the memory pool of the block or segment; `(0, 0)` is the
    /// default pool. `None` in older files.
    pub pool_id: Option<(i64, i64)>,
    /// `internal_metadata` (torch 2.15+): the allocator's own tag, e.g. `mallocWithAddress`.
    pub internal_metadata: Option<TextId>,
}

#[derive(Clone, Debug)]
pub struct Annotation {
    /// Interned (see [`Snapshot::interner`]): annotations share their few names.
    pub name: TextId,
    pub stage: TextId,
    pub device: Option<i64>,
    pub time_us: Option<i64>,
}

/// `allocator_settings` (2.3+): the fields the analysis uses, and the whole dict as JSON.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AllocatorSettings {
    pub conf: Option<String>,
    pub expandable_segments: Option<bool>,
    /// Bytes; `None` = unlimited (`-1` or `SIZE_MAX` in the file) or absent.
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    pub raw: serde_json::Value,
}

/// A whole snapshot file.
#[derive(Debug)]
pub struct Snapshot {
    pub layout: Layout,
    /// Every segment of every device, in file order.
    pub segments: Vec<Segment>,
    /// `device_traces[d]` = trace of device `d`, oldest first.
    pub device_traces: Vec<Trace>,
    pub allocator_settings: Option<AllocatorSettings>,
    pub annotations: Vec<Annotation>,
    pub interner: Interner,
    /// Top-level keys this version does not read (kept for the record).
    pub other_top_level_keys: Vec<String>,
    /// `host_segments` (torch 2.14+): the pinned host allocator's segments (device -1).
    pub host_segments: Vec<Segment>,
    /// `host_traces` (torch 2.14+, `record_pinned_host_memory=True`): one flat trace.
    pub host_trace: Option<Trace>,
    /// Keys of trace entries this version does not read, with how many entries had each
    /// (most first). Read by the sequential reader; the parallel one leaves entries with such
    /// keys to it.
    pub unknown_entry_keys: Vec<(String, u64)>,
    /// Set when the snapshot was recovered from a cut pickle (`--salvage`).
    pub salvaged: Option<Salvaged>,
    /// Bytes after the pickle's STOP, ignored (as `pickle.load` ignores them).
    pub after_stop: Option<AfterStop>,
    /// The positions in `segments` of each device's segments, built on first use by
    /// [`Snapshot::segments_of`] (`segments` is not changed after decoding).
    pub(crate) segments_by_device: std::sync::OnceLock<rustc_hash::FxHashMap<i64, Vec<u32>>>,
    /// [`Snapshot::has_stacks`], found on first use.
    pub(crate) stacks_found: std::sync::OnceLock<bool>,
}

/// Bytes that follow the end of the pickle (STOP), which the reader ignores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AfterStop {
    /// Offset of the first byte after STOP.
    pub offset: u64,
    /// How many bytes follow.
    pub len: u64,
}

impl AfterStop {
    /// `None` when the pickle ends at `end` (just after STOP) of an input of `len` bytes.
    pub fn of(end: usize, len: usize) -> Option<AfterStop> {
        (end < len).then_some(AfterStop {
            offset: end as u64,
            len: (len - end) as u64,
        })
    }
}

/// Where a pickle was cut, for a snapshot recovered from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Salvaged {
    /// Offset of the first opcode that was not complete, and the input length.
    pub offset: u64,
    pub len: u64,
    /// The value that was being built (`device_traces[0]`), when known.
    pub inside: Option<String>,
    /// A compressed input whose stream broke off: what was decompressed (the pickle is then cut
    /// where the stream broke).
    pub stream: Option<String>,
}

/// What a salvaged file holds of one device's trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceCut {
    /// The cut fell inside this device's trace: only its first entries arrived.
    Cut,
    /// The cut came before this device's trace began: none of it arrived.
    NotReached,
}

impl TraceCut {
    /// Stable name (JSON `trace_cut`).
    pub fn name(self) -> &'static str {
        match self {
            TraceCut::Cut => "cut",
            TraceCut::NotReached => "not_reached",
        }
    }
}

impl Salvaged {
    /// The trace index whose list was being written at the cut (`device_traces[1][…]` → 1).
    fn cut_trace(&self) -> Option<usize> {
        let rest = self.inside.as_deref()?.strip_prefix("device_traces[")?;
        rest[..rest.find(']')?].parse().ok()
    }

    /// Whether the cut reached `device_traces` at all (a cut inside `segments`, inside the list
    /// itself, or at an unknown place leaves traces after it missing).
    fn traces_complete(&self) -> bool {
        match self.inside.as_deref() {
            Some(p) => !(p.starts_with("segments") || p.starts_with("device_traces")),
            None => self.offset >= self.len && self.stream.is_none(),
        }
    }

    /// What the file holds of `device`'s trace: cut, not reached, or whole (`None`).
    pub fn trace_cut(&self, s: &Snapshot, device: i64) -> Option<TraceCut> {
        let d = usize::try_from(device).ok()?;
        if self.cut_trace() == Some(d) {
            return Some(TraceCut::Cut);
        }
        if self.traces_complete() {
            return None;
        }
        match self.cut_trace() {
            Some(k) if d > k => Some(TraceCut::NotReached),
            Some(_) => None,
            // Cut before or inside the list of traces: those that did not arrive.
            None => (d >= s.device_traces.len()).then_some(TraceCut::NotReached),
        }
    }

    /// Every device of `s` whose trace was cut or not reached, in device order.
    pub fn cut_devices(&self, s: &Snapshot) -> Vec<(i64, TraceCut)> {
        s.devices()
            .into_iter()
            .filter_map(|d| self.trace_cut(s, d).map(|c| (d, c)))
            .collect()
    }

    /// What was recovered and what is missing (for the report's notes and a warning).
    pub fn describe(&self, s: &Snapshot) -> String {
        let entries: usize = s.device_traces.iter().map(|t| t.len()).sum();
        let blocks: usize = s.segments.iter().map(|g| g.blocks.len()).sum();
        let mut text = format!(
            "salvaged from a cut pickle: the input ends at byte {} of an incomplete dump{}; \
             recovered {} ({}) and {}, all complete",
            self.offset,
            self.inside
                .as_ref()
                .map(|p| format!(" while {p} was being written"))
                .unwrap_or_default(),
            crate::units::counted(s.segments.len() as u64, "segment", "segments"),
            crate::units::counted(blocks as u64, "block", "blocks"),
            crate::units::counted(entries as u64, "trace entry", "trace entries")
        );
        // What a dump holds after the cut (keys are written in this order).
        const KEYS: [&str; 4] = [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations",
        ];
        let cut_key = self
            .inside
            .as_deref()
            .map(|p| p.split(['[', '.']).next().unwrap_or(p));
        if let Some(stream) = &self.stream {
            text = format!("{stream}; {text}");
        }
        let mut missing: Vec<String> = Vec::new();
        if let Some(p) = self
            .inside
            .as_deref()
            .filter(|_| self.cut_trace().is_none())
        {
            // The list that was cut (`segments`), not the entry inside it.
            let list = match p.match_indices(['[', '.']).nth(1) {
                Some((i, _)) => &p[..i],
                None => p,
            };
            missing.push(format!("the rest of {list}"));
        }
        // Each device whose trace was cut or never arrived, by name.
        for (d, cut) in self.cut_devices(s) {
            let entries = s.trace(d).len();
            missing.push(match cut {
                TraceCut::Cut => format!(
                    "the rest of device_traces[{d}] (device {d}'s trace, cut after {entries} entries)"
                ),
                TraceCut::NotReached => {
                    format!("device_traces[{d}] (device {d}'s trace, not reached)")
                }
            });
        }
        let after = cut_key
            .and_then(|k| KEYS.iter().position(|x| *x == k))
            .map_or(0, |i| i + 1);
        let per_device = !self.cut_devices(s).is_empty();
        let absent: Vec<&str> = KEYS[after..]
            .iter()
            .copied()
            // Traces that did not arrive are named per device above.
            .filter(|k| !(per_device && *k == "device_traces"))
            .filter(|k| match *k {
                "segments" => s.segments.is_empty(),
                "device_traces" => s.device_traces.is_empty(),
                "allocator_settings" => s.allocator_settings.is_none(),
                _ => s.annotations.is_empty(),
            })
            .collect();
        if !absent.is_empty() {
            missing.push(format!(
                "{} (not reached, if the dump had them)",
                absent.join(", ")
            ));
        }
        if !missing.is_empty() {
            text.push_str(&format!("; missing: {}", missing.join("; ")));
        }
        text
    }
}

impl Snapshot {
    /// Every device that owns a segment or has a trace list, sorted.
    pub fn devices(&self) -> Vec<i64> {
        let mut devices: Vec<i64> = self.segments.iter().map(|s| s.device).collect();
        devices.extend(0..self.device_traces.len() as i64);
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    pub fn trace(&self, device: i64) -> &Trace {
        static EMPTY: Trace = Trace::EMPTY;
        usize::try_from(device)
            .ok()
            .and_then(|d| self.device_traces.get(d))
            .unwrap_or(&EMPTY)
    }

    /// The segments of `device`, in file order. Grouped by device once: filtering every
    /// segment for every device took 20 s for 32 000 devices.
    pub fn segments_of(&self, device: i64) -> impl Iterator<Item = &Segment> {
        let index = self.segments_by_device.get_or_init(|| {
            let mut index: rustc_hash::FxHashMap<i64, Vec<u32>> = Default::default();
            for (i, s) in self.segments.iter().enumerate() {
                index.entry(s.device).or_default().push(i as u32);
            }
            index
        });
        index
            .get(&device)
            .into_iter()
            .flatten()
            .map(|&i| &self.segments[i as usize])
    }

    /// True when any block, segment or trace entry carries a non-empty stack. Found once: each
    /// device's report asks, and a file without stacks was searched whole for each of its
    /// devices (48 000 devices: 30 s).
    pub fn has_stacks(&self) -> bool {
        *self.stacks_found.get_or_init(|| self.find_stacks())
    }

    fn find_stacks(&self) -> bool {
        let empty = StackId::EMPTY;
        self.segments
            .iter()
            .any(|s| s.frames != empty || s.blocks.iter().any(|b| b.frames != empty))
            || self
                .device_traces
                .iter()
                .any(|t| t.iter().any(|e| e.frames != empty))
    }
}
