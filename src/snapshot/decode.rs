//! From the plain [`Document`] to the typed [`Snapshot`], naming the path of anything that does
//! not have the expected type (`device_traces[0][17].size: expected int, found str`).

use rustc_hash::FxHashMap;

use super::intern::{Frame, FrameId, Interner, StackId, TextId};
use super::model::*;
use super::trace::{Part, Trace};
use crate::pickle::{DictId, Document, SeqId, StrId, Value};

/// `allocator_settings` is a dict of a dozen values (a few hundred bytes as JSON); far more
/// once shared references are expanded is a memo bomb. Counted in bytes of the JSON kept
/// (see `Document::to_json_limited`).
const MAX_SETTINGS_BYTES: usize = 4 << 20;

/// A schema error: where in the document, and what was wrong.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("{path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

/// Ids of the dict keys this decoder reads, looked up once per document. A key string that does
/// not occur anywhere in the file has no id, so it can never match.
#[derive(Clone, Copy)]
struct Keys {
    segments: Option<StrId>,
    device_traces: Option<StrId>,
    allocator_settings: Option<StrId>,
    external_annotations: Option<StrId>,
    host_segments: Option<StrId>,
    host_traces: Option<StrId>,
    device: Option<StrId>,
    address: Option<StrId>,
    total_size: Option<StrId>,
    allocated_size: Option<StrId>,
    active_size: Option<StrId>,
    requested_size: Option<StrId>,
    stream: Option<StrId>,
    segment_type: Option<StrId>,
    segment_pool_id: Option<StrId>,
    is_expandable: Option<StrId>,
    frames: Option<StrId>,
    blocks: Option<StrId>,
    size: Option<StrId>,
    state: Option<StrId>,
    history: Option<StrId>,
    real_size: Option<StrId>,
    action: Option<StrId>,
    addr: Option<StrId>,
    device_free: Option<StrId>,
    time_us: Option<StrId>,
    user_metadata: Option<StrId>,
    compile_context: Option<StrId>,
    pool_id: Option<StrId>,
    internal_metadata: Option<StrId>,
    forward_frames: Option<StrId>,
    name: Option<StrId>,
    filename: Option<StrId>,
    line: Option<StrId>,
    stage: Option<StrId>,
}

impl Keys {
    fn new(doc: &Document) -> Keys {
        let k = |s: &str| doc.strings.lookup(s);
        Keys {
            segments: k("segments"),
            device_traces: k("device_traces"),
            allocator_settings: k("allocator_settings"),
            external_annotations: k("external_annotations"),
            host_segments: k("host_segments"),
            host_traces: k("host_traces"),
            device: k("device"),
            address: k("address"),
            total_size: k("total_size"),
            allocated_size: k("allocated_size"),
            active_size: k("active_size"),
            requested_size: k("requested_size"),
            stream: k("stream"),
            segment_type: k("segment_type"),
            segment_pool_id: k("segment_pool_id"),
            is_expandable: k("is_expandable"),
            frames: k("frames"),
            blocks: k("blocks"),
            size: k("size"),
            state: k("state"),
            history: k("history"),
            real_size: k("real_size"),
            action: k("action"),
            addr: k("addr"),
            device_free: k("device_free"),
            time_us: k("time_us"),
            user_metadata: k("user_metadata"),
            compile_context: k("compile_context"),
            pool_id: k("pool_id"),
            internal_metadata: k("internal_metadata"),
            forward_frames: k("forward_frames"),
            name: k("name"),
            filename: k("filename"),
            line: k("line"),
            stage: k("stage"),
        }
    }
}

struct Decoder<'d> {
    doc: &'d Document,
    keys: Keys,
    interner: Interner,
    /// Frames lists are shared pickle objects: decode each list once.
    stack_by_list: FxHashMap<SeqId, StackId>,
    frame_by_dict: FxHashMap<DictId, FrameId>,
    text_by_str: FxHashMap<StrId, TextId>,
    /// Keys of trace entries this version does not read, with how many entries had each.
    unknown_entry_keys: FxHashMap<StrId, u64>,
}

/// A segment's allocated, active and requested bytes: as the dump gives them, or, where older
/// files lack them, summed from its blocks as PyTorch does.
pub(crate) fn segment_sums(
    blocks: &[Block],
    allocated: Option<u64>,
    active: Option<u64>,
    requested: Option<u64>,
) -> (u64, u64, u64) {
    // Saturating: the blocks of a corrupt file can claim more than 2^64 bytes together, and
    // the figure is then implausible anyway (the quality checks say so).
    let sum = |f: &dyn Fn(&Block) -> u64| blocks.iter().map(f).fold(0, u64::saturating_add);
    let allocated = allocated.unwrap_or_else(|| {
        sum(&|b| match b.state {
            BlockState::ActiveAllocated => b.size,
            _ => 0,
        })
    });
    let active = active.unwrap_or_else(|| sum(&|b| if b.state.is_active() { b.size } else { 0 }));
    let requested = requested.unwrap_or_else(|| {
        sum(&|b| {
            if b.state.is_active() {
                b.requested_size
            } else {
                0
            }
        })
    });
    (allocated, active, requested)
}

fn schema(path: impl Into<String>, message: impl Into<String>) -> SchemaError {
    SchemaError {
        path: path.into(),
        message: message.into(),
    }
}

/// The same pickle object a second time where a snapshot has distinct ones.
fn shared(path: String, first: String) -> SchemaError {
    schema(
        path,
        format!(
            "the same object as {first} again: a pickle that references one object many times \
             (a memo bomb), not a memory snapshot"
        ),
    )
}

fn expected(path: impl Into<String>, what: &str, found: Value) -> SchemaError {
    schema(
        path,
        format!("expected {what}, found {}", found.type_name()),
    )
}

impl<'d> Decoder<'d> {
    fn get(&self, dict: DictId, key: Option<StrId>) -> Option<Value> {
        key.and_then(|k| self.doc.dict_get(dict, k))
    }

    fn as_dict(&self, v: Value, path: &dyn Fn() -> String) -> Result<DictId, SchemaError> {
        match v {
            Value::Dict(id) => Ok(id),
            other => Err(expected(path(), "dict", other)),
        }
    }

    fn as_seq(&self, v: Value, path: &dyn Fn() -> String) -> Result<&'d [Value], SchemaError> {
        self.doc
            .as_seq(v)
            .ok_or_else(|| expected(path(), "list", v))
    }

    fn int(&self, v: Value, path: &dyn Fn() -> String) -> Result<i128, SchemaError> {
        match v {
            Value::Int(_) | Value::BigInt(_) => {
                self.doc.as_int(v).ok_or_else(|| expected(path(), "int", v))
            }
            other => Err(expected(path(), "int", other)),
        }
    }

    fn u64_value(&self, v: Value, path: &dyn Fn() -> String) -> Result<u64, SchemaError> {
        let i = self.int(v, path)?;
        u64::try_from(i).map_err(|_| {
            schema(
                path(),
                format!("expected a non-negative int below 2^64, found {i}"),
            )
        })
    }

    fn i64_value(&self, v: Value, path: &dyn Fn() -> String) -> Result<i64, SchemaError> {
        let i = self.int(v, path)?;
        i64::try_from(i).map_err(|_| schema(path(), format!("int {i} does not fit in 64 bits")))
    }

    /// An int that feeds no figure (a line number, a time): `None` when it does not fit in
    /// `i64`, never an error. PyTorch writes 2^64 − 1 as the line of C++ frames it could not
    /// resolve, and Python reads that without complaint.
    fn lenient_i64(&self, v: Value, path: &dyn Fn() -> String) -> Result<Option<i64>, SchemaError> {
        Ok(i64::try_from(self.int(v, path)?).ok())
    }

    /// Required unsigned field of a dict.
    fn req_u64(
        &self,
        dict: DictId,
        key: Option<StrId>,
        name: &str,
        path: &dyn Fn() -> String,
    ) -> Result<u64, SchemaError> {
        let p = || format!("{}.{name}", path());
        let v = self
            .get(dict, key)
            .ok_or_else(|| schema(p(), "missing required key"))?;
        self.u64_value(v, &p)
    }

    fn opt_u64(
        &self,
        dict: DictId,
        key: Option<StrId>,
        name: &str,
        path: &dyn Fn() -> String,
    ) -> Result<Option<u64>, SchemaError> {
        match self.get(dict, key) {
            None | Some(Value::None) => Ok(None),
            Some(v) => self
                .u64_value(v, &|| format!("{}.{name}", path()))
                .map(Some),
        }
    }

    fn str_value(&self, v: Value, path: &dyn Fn() -> String) -> Result<&'d str, SchemaError> {
        self.doc.as_str(v).ok_or_else(|| expected(path(), "str", v))
    }

    fn text(&mut self, id: StrId) -> TextId {
        if let Some(&t) = self.text_by_str.get(&id) {
            return t;
        }
        let t = self.interner.text(self.doc.str(id));
        self.text_by_str.insert(id, t);
        t
    }

    fn opt_text(&mut self, v: Option<Value>) -> Option<TextId> {
        match v {
            Some(Value::Str(id)) => Some(self.text(id)),
            _ => None,
        }
    }

    fn frame(&mut self, v: Value, path: &dyn Fn() -> String) -> Result<FrameId, SchemaError> {
        let dict = self.as_dict(v, path)?;
        if let Some(&f) = self.frame_by_dict.get(&dict) {
            return Ok(f);
        }
        let name = match self.get(dict, self.keys.name) {
            Some(Value::Str(id)) => self.text(id),
            Some(other) => return Err(expected(format!("{}.name", path()), "str", other)),
            None => self.interner.text("??"),
        };
        let filename = match self.get(dict, self.keys.filename) {
            Some(Value::Str(id)) => self.text(id),
            Some(other) => return Err(expected(format!("{}.filename", path()), "str", other)),
            None => self.interner.text("??"),
        };
        let line = match self.get(dict, self.keys.line) {
            // A line that does not fit is no line, as torch's own 0.
            Some(v @ (Value::Int(_) | Value::BigInt(_))) => self
                .lenient_i64(v, &|| format!("{}.line", path()))?
                .unwrap_or(0),
            Some(Value::None) | None => 0,
            Some(other) => return Err(expected(format!("{}.line", path()), "int", other)),
        };
        let f = self.interner.frame(Frame {
            name,
            filename,
            line,
        });
        self.frame_by_dict.insert(dict, f);
        Ok(f)
    }

    /// A `frames` value (list of frame dicts), decoded once per shared list object.
    fn stack(
        &mut self,
        v: Option<Value>,
        path: &dyn Fn() -> String,
    ) -> Result<StackId, SchemaError> {
        let v = match v {
            None | Some(Value::None) => return Ok(StackId::EMPTY),
            Some(v) => v,
        };
        let list_id = match v {
            Value::List(id) | Value::Tuple(id) => id,
            other => return Err(expected(format!("{}.frames", path()), "list", other)),
        };
        if let Some(&s) = self.stack_by_list.get(&list_id) {
            return Ok(s);
        }
        let items = self.doc.seq(list_id);
        let mut frames = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            frames.push(self.frame(*item, &|| format!("{}.frames[{i}]", path()))?);
        }
        let s = self.interner.stack(frames);
        self.stack_by_list.insert(list_id, s);
        Ok(s)
    }

    fn segment(&mut self, v: Value, path: &dyn Fn() -> String) -> Result<Segment, SchemaError> {
        let k = self.keys;
        let dict = self.as_dict(v, path)?;
        let device = match self.get(dict, k.device) {
            Some(v) => self.i64_value(v, &|| format!("{}.device", path()))?,
            None => 0,
        };
        let address = self.req_u64(dict, k.address, "address", path)?;
        let total_size = self.req_u64(dict, k.total_size, "total_size", path)?;
        let allocated_size = self.opt_u64(dict, k.allocated_size, "allocated_size", path)?;
        let active_size = self.opt_u64(dict, k.active_size, "active_size", path)?;
        let requested_size = self.opt_u64(dict, k.requested_size, "requested_size", path)?;
        let stream = self.opt_u64(dict, k.stream, "stream", path)?.unwrap_or(0);
        let pool_kind = match self.get(dict, k.segment_type) {
            Some(v) => match self.str_value(v, &|| format!("{}.segment_type", path()))? {
                "small" => PoolKind::Small,
                "large" => PoolKind::Large,
                _ => PoolKind::Unknown,
            },
            None => PoolKind::Unknown,
        };
        let pool_id = self.pool_pair(self.get(dict, k.segment_pool_id), &|| {
            format!("{}.segment_pool_id", path())
        })?;
        let is_expandable = matches!(self.get(dict, k.is_expandable), Some(Value::Bool(true)));
        let frames = self.stack(self.get(dict, k.frames), path)?;
        let blocks_value = self
            .get(dict, k.blocks)
            .ok_or_else(|| schema(format!("{}.blocks", path()), "missing required key"))?;
        let block_values = self.as_seq(blocks_value, &|| format!("{}.blocks", path()))?;
        let mut blocks = Vec::with_capacity(block_values.len().min(1 << 16));
        let mut next_address = address;
        for (i, bv) in block_values.iter().enumerate() {
            let bp = || format!("{}.blocks[{i}]", path());
            let block = self.block(*bv, next_address, &bp)?;
            next_address = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        let (allocated_size, active_size, requested_size) =
            segment_sums(&blocks, allocated_size, active_size, requested_size);
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            pool_kind,
            pool_id,
            is_expandable,
            frames,
            blocks,
        })
    }

    fn block(
        &mut self,
        v: Value,
        implied_address: u64,
        path: &dyn Fn() -> String,
    ) -> Result<Block, SchemaError> {
        let k = self.keys;
        let dict = self.as_dict(v, path)?;
        let address = self
            .opt_u64(dict, k.address, "address", path)?
            .unwrap_or(implied_address);
        let size = self.req_u64(dict, k.size, "size", path)?;
        let state = match self.get(dict, k.state) {
            Some(v) => match self.str_value(v, &|| format!("{}.state", path()))? {
                "active_allocated" => BlockState::ActiveAllocated,
                "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
                "inactive" => BlockState::Inactive,
                _ => BlockState::Unknown,
            },
            None => return Err(schema(format!("{}.state", path()), "missing required key")),
        };
        let frames_value = self.get(dict, k.frames);
        let raw_requested = self.opt_u64(dict, k.requested_size, "requested_size", path)?;
        // PyTorch's tools (`_block_extra`): new layout → requested_size; legacy layout (no
        // `frames` key) → history[0].real_size, else requested_size, else size.
        let (requested_size, frames) = if frames_value.is_some() {
            let req = raw_requested.ok_or_else(|| {
                schema(format!("{}.requested_size", path()), "missing required key")
            })?;
            (req, self.stack(frames_value, path)?)
        } else {
            match self.get(dict, k.history) {
                Some(h) => {
                    let hp = || format!("{}.history", path());
                    let records = self.as_seq(h, &hp)?;
                    match records.first() {
                        Some(first) => {
                            let rp = || format!("{}.history[0]", path());
                            let rd = self.as_dict(*first, &rp)?;
                            let real = self.req_u64(rd, self.keys.real_size, "real_size", &rp)?;
                            let frames = self.stack(self.get(rd, self.keys.frames), &rp)?;
                            (real, frames)
                        }
                        None => (raw_requested.unwrap_or(size), StackId::EMPTY),
                    }
                }
                None => (raw_requested.unwrap_or(size), StackId::EMPTY),
            }
        };
        Ok(Block {
            address,
            size,
            requested_size,
            state,
            frames,
        })
    }

    /// A `segment_pool_id` or `pool_id`: a pair of ints (`None` when absent or None).
    fn pool_pair(
        &self,
        v: Option<Value>,
        p: &dyn Fn() -> String,
    ) -> Result<Option<(i64, i64)>, SchemaError> {
        match v {
            None | Some(Value::None) => Ok(None),
            Some(v) => match self.as_seq(v, p)? {
                [a, b] => Ok(Some((self.i64_value(*a, p)?, self.i64_value(*b, p)?))),
                items => Err(schema(
                    p(),
                    format!("expected a pair, found {} items", items.len()),
                )),
            },
        }
    }

    /// [`Decoder::unknown_entry_keys`] by name, most frequent first.
    fn unknown_entry_keys(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .unknown_entry_keys
            .iter()
            .map(|(k, n)| (self.doc.str(*k).to_owned(), *n))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    fn trace_entry(
        &mut self,
        v: Value,
        path: &dyn Fn() -> String,
    ) -> Result<TraceEntry, SchemaError> {
        let dict = self.as_dict(v, path)?;
        // One pass over the entry's items: trace entries are the bulk of a large file.
        let (mut action, mut addr, mut size, mut stream, mut device_free, mut time_us) =
            (None, None, None, None, None, None);
        let (mut frames, mut user_metadata, mut compile_context) = (None, None, None);
        let (mut pool_id, mut internal_metadata) = (None, None);
        let k = self.keys;
        for (key, value) in self.doc.dict(dict) {
            let Value::Str(key) = *key else { continue };
            let key = Some(key);
            if key == k.action {
                action = Some(*value);
            } else if key == k.addr {
                addr = Some(*value);
            } else if key == k.size {
                size = Some(*value);
            } else if key == k.stream {
                stream = Some(*value);
            } else if key == k.device_free {
                device_free = Some(*value);
            } else if key == k.time_us {
                time_us = Some(*value);
            } else if key == k.frames {
                frames = Some(*value);
            } else if key == k.user_metadata {
                user_metadata = Some(*value);
            } else if key == k.compile_context {
                compile_context = Some(*value);
            } else if key == k.pool_id {
                pool_id = Some(*value);
            } else if key == k.internal_metadata {
                internal_metadata = Some(*value);
            } else if key != k.forward_frames {
                // Kept for the record: named and counted in the report, never dropped silently.
                if let Some(key) = key {
                    *self.unknown_entry_keys.entry(key).or_default() += 1;
                }
            }
        }
        let action_value =
            action.ok_or_else(|| schema(format!("{}.action", path()), "missing required key"))?;
        let action_str = self.str_value(action_value, &|| format!("{}.action", path()))?;
        let action = Action::from_name(action_str);
        let action_text = match (action, action_value) {
            (Action::Other, Value::Str(id)) => Some(self.text(id)),
            _ => None,
        };
        let field_u64 =
            |this: &Self, v: Option<Value>, name: &str| -> Result<Option<u64>, SchemaError> {
                match v {
                    None | Some(Value::None) => Ok(None),
                    Some(v) => this
                        .u64_value(v, &|| format!("{}.{name}", path()))
                        .map(Some),
                }
            };
        let addr = field_u64(self, addr, "addr")?;
        let size = field_u64(self, size, "size")?;
        let stream = field_u64(self, stream, "stream")?.unwrap_or(0);
        let device_free = field_u64(self, device_free, "device_free")?;
        let time_us = match time_us {
            None | Some(Value::None) => None,
            Some(v) => self.lenient_i64(v, &|| format!("{}.time_us", path()))?,
        };
        let size =
            size.ok_or_else(|| schema(format!("{}.size", path()), "missing required key"))?;
        let addr = match (addr, action) {
            (Some(a), _) => a,
            (None, Action::Oom | Action::Snapshot | Action::Other) => 0,
            (None, _) => return Err(schema(format!("{}.addr", path()), "missing required key")),
        };
        let frames = self.stack(frames, path)?;
        let user_metadata = self.opt_text(user_metadata);
        let compile_context = self.opt_text(compile_context);
        let pool_id = self.pool_pair(pool_id, &|| format!("{}.pool_id", path()))?;
        let internal_metadata = self.opt_text(internal_metadata);
        Ok(TraceEntry {
            action,
            action_text,
            addr,
            size,
            stream,
            device_free,
            time_us,
            frames,
            user_metadata,
            compile_context,
            pool_id,
            internal_metadata,
        })
    }

    fn settings(&mut self, v: Value) -> Result<AllocatorSettings, SchemaError> {
        let path = || "allocator_settings".to_owned();
        let dict = self.as_dict(v, &path)?;
        let get = |name: &str| {
            self.doc
                .strings
                .lookup(name)
                .and_then(|k| self.doc.dict_get(dict, k))
        };
        let conf = get("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| self.doc.as_str(v))
            .map(str::to_owned);
        let expandable_segments = match get("expandable_segments") {
            Some(Value::Bool(b)) => Some(b),
            _ => None,
        };
        let max_split_size = get("max_split_size")
            .and_then(|v| self.doc.as_int(v))
            .and_then(|i| u64::try_from(i).ok())
            .filter(|&i| i != u64::MAX && i < (1u64 << 62));
        let garbage_collection_threshold = match get("garbage_collection_threshold") {
            Some(Value::Float(f)) => Some(f),
            Some(v) => self.doc.as_int(v).map(|i| i as f64),
            None => None,
        };
        // Kept whole as JSON, within a budget: shared lists nested in it could expand without
        // end ("billion laughs").
        let mut budget = MAX_SETTINGS_BYTES;
        let raw = match self.doc.to_json_limited(v, 16, &mut budget) {
            Some(json) => json,
            None if budget == 0 => {
                return Err(schema(
                    "allocator_settings",
                    format!(
                        "more than {} once shared references are expanded (a memo bomb, not \
                         allocator settings)",
                        crate::units::format_bytes(MAX_SETTINGS_BYTES as u64)
                    ),
                ))
            }
            None => serde_json::Value::Null,
        };
        Ok(AllocatorSettings {
            conf,
            expandable_segments,
            max_split_size,
            garbage_collection_threshold,
            raw,
        })
    }

    fn annotation(
        &mut self,
        v: Value,
        path: &dyn Fn() -> String,
    ) -> Result<Annotation, SchemaError> {
        let dict = self.as_dict(v, path)?;
        // Interned, not copied: one long name shared by every annotation stays one string.
        let text = |this: &mut Self, key: Option<StrId>| -> TextId {
            match this.get(dict, key) {
                Some(Value::Str(id)) => this.text(id),
                _ => this.interner.text(""),
            }
        };
        let name = text(self, self.keys.name);
        let stage = text(self, self.keys.stage);
        let int = |this: &Self, key: Option<StrId>| -> Option<i64> {
            this.get(dict, key)
                .and_then(|v| this.doc.as_int(v))
                .and_then(|i| i64::try_from(i).ok())
        };
        Ok(Annotation {
            name,
            stage,
            device: int(self, self.keys.device),
            time_us: int(self, self.keys.time_us),
        })
    }
}

/// Decodes a document into the typed model.
pub fn decode(doc: &Document) -> Result<Snapshot, SchemaError> {
    decode_parts(doc, Interner::default(), &mut |_| None, &mut |_| None)
}

/// Segments decoded elsewhere, by their place in a list (`None`: decode that item here).
pub(crate) type PresetSegments<'p> = dyn FnMut(SeqId) -> Option<Vec<Option<Segment>>> + 'p;

/// [`decode`] with traces decoded elsewhere: `preset(list)` gives the trace of a device list
/// (the parallel reader's), `None` decodes the list here; `preset_segments(list)` gives
/// segments of the segments list the same way. Ids go on from `interner`.
pub(crate) fn decode_parts(
    doc: &Document,
    interner: Interner,
    preset: &mut dyn FnMut(SeqId) -> Option<Trace>,
    preset_segments: &mut PresetSegments<'_>,
) -> Result<Snapshot, SchemaError> {
    let root = doc
        .root
        .ok_or_else(|| schema("<root>", "document has no value"))?;
    let mut d = Decoder {
        doc,
        keys: Keys::new(doc),
        interner,
        stack_by_list: FxHashMap::default(),
        frame_by_dict: FxHashMap::default(),
        text_by_str: FxHashMap::default(),
        unknown_entry_keys: FxHashMap::default(),
    };
    let (layout, segments_value, traces_value, settings_value, annotations_value, other_keys) =
        match root {
            Value::List(_) | Value::Tuple(_) => (
                Layout::SegmentList,
                Some(root),
                None,
                None,
                None,
                Vec::new(),
            ),
            Value::Dict(top) => {
                let known = [
                    d.keys.segments,
                    d.keys.device_traces,
                    d.keys.allocator_settings,
                    d.keys.external_annotations,
                    d.keys.host_segments,
                    d.keys.host_traces,
                ];
                // Each key once: a dict may list one long key again and again.
                let mut seen = rustc_hash::FxHashSet::default();
                let other: Vec<String> = doc
                    .dict(top)
                    .iter()
                    .filter_map(|(k, _)| match k {
                        Value::Str(id) if !known.contains(&Some(*id)) && seen.insert(*id) => {
                            Some(doc.str(*id).to_owned())
                        }
                        _ => None,
                    })
                    .collect();
                let segments = d.get(top, d.keys.segments);
                if segments.is_none() {
                    return Err(schema(
                        "segments",
                        "missing required key (a memory snapshot dict has `segments` and `device_traces`)",
                    ));
                }
                (
                    Layout::Dict,
                    segments,
                    d.get(top, d.keys.device_traces),
                    d.get(top, d.keys.allocator_settings),
                    d.get(top, d.keys.external_annotations),
                    other,
                )
            }
            other => {
                return Err(expected(
                    "<root>",
                    "a dict with `segments` or a list of segments",
                    other,
                ))
            }
        };

    let segments = match segments_value {
        Some(sv) => segment_list(&mut d, sv, "segments", preset_segments)?,
        None => Vec::new(),
    };
    let (host_segments_value, host_traces_value) = match root {
        Value::Dict(top) => (
            d.get(top, d.keys.host_segments),
            d.get(top, d.keys.host_traces),
        ),
        _ => (None, None),
    };
    let host_segments = match host_segments_value {
        Some(v) => segment_list(&mut d, v, "host_segments", preset_segments)?,
        None => Vec::new(),
    };

    let mut device_traces = Vec::new();
    if let Some(tv) = traces_value {
        let devices = d.as_seq(tv, &|| "device_traces".to_owned())?;
        // Each trace list and each entry is its own object (as for segments above).
        let mut lists_seen: FxHashMap<SeqId, usize> = FxHashMap::default();
        let mut entries_seen: FxHashMap<DictId, (usize, usize)> = FxHashMap::default();
        for (dev, trace) in devices.iter().enumerate() {
            if let Value::List(id) | Value::Tuple(id) = trace {
                if let Some(first) = lists_seen.insert(*id, dev) {
                    return Err(shared(
                        format!("device_traces[{dev}]"),
                        format!("device_traces[{first}]"),
                    ));
                }
            }
            if let Value::List(id) = trace {
                if let Some(t) = preset(*id) {
                    device_traces.push(t);
                    continue;
                }
            }
            let entries = d.as_seq(*trace, &|| format!("device_traces[{dev}]"))?;
            let mut part = Part::default();
            for (i, e) in entries.iter().enumerate() {
                if let Value::Dict(id) = e {
                    if let Some((fd, fi)) = entries_seen.insert(*id, (dev, i)) {
                        return Err(shared(
                            format!("device_traces[{dev}][{i}]"),
                            format!("device_traces[{fd}][{fi}]"),
                        ));
                    }
                }
                part.push(&d.trace_entry(*e, &|| format!("device_traces[{dev}][{i}]"))?);
            }
            let mut out = Trace::new();
            out.push_part(part);
            device_traces.push(out);
        }
    }

    // Pinned host memory (torch 2.14+): one flat trace, entries of the device traces' shape.
    let host_trace = match host_traces_value {
        None | Some(Value::None) => None,
        Some(v) => {
            // (A list shared with a device trace is read twice: twice the bytes at most.)
            let read = match v {
                Value::List(id) => preset(id),
                _ => None,
            };
            match read {
                Some(t) => Some(t),
                None => {
                    let entries = d.as_seq(v, &|| "host_traces".to_owned())?;
                    let mut part = Part::default();
                    for (i, e) in entries.iter().enumerate() {
                        part.push(&d.trace_entry(*e, &|| format!("host_traces[{i}]"))?);
                    }
                    let mut out = Trace::new();
                    out.push_part(part);
                    Some(out)
                }
            }
        }
    };

    let allocator_settings = match settings_value {
        None | Some(Value::None) => None,
        Some(v) => Some(d.settings(v)?),
    };

    let mut annotations = Vec::new();
    if let Some(av) = annotations_value {
        let items = d.as_seq(av, &|| "external_annotations".to_owned())?;
        for (i, item) in items.iter().enumerate() {
            annotations.push(d.annotation(*item, &|| format!("external_annotations[{i}]"))?);
        }
    }

    Ok(Snapshot {
        layout,
        segments,
        device_traces,
        allocator_settings,
        annotations,
        unknown_entry_keys: d.unknown_entry_keys(),
        interner: d.interner,
        other_top_level_keys: other_keys,
        host_segments,
        host_trace,
        salvaged: None,
        after_stop: None,
        segments_by_device: Default::default(),
        stacks_found: Default::default(),
    })
}

/// A list of segment dicts (`segments`, `host_segments`), each dict its own object.
fn segment_list(
    d: &mut Decoder,
    sv: Value,
    name: &str,
    preset_segments: &mut PresetSegments<'_>,
) -> Result<Vec<Segment>, SchemaError> {
    let mut segments = Vec::new();
    {
        let items = d.as_seq(sv, &|| name.to_owned())?;
        // Bounded: the count comes from the input (a memo bomb lists one segment millions of times).
        segments.reserve(items.len().min(1 << 16));
        // A segment is one dict: the same dict listed again is a memo bomb (one object
        // referenced millions of times), not a snapshot; copying it each time would not end.
        let mut seen: FxHashMap<DictId, usize> = FxHashMap::default();
        let mut preset = match sv {
            Value::List(id) | Value::Tuple(id) => preset_segments(id),
            _ => None,
        };
        // Every segment read already (the parallel reader's usual case): the list becomes the
        // segments where it lies, without a second copy of them all.
        // (`map_while` collects in place; all items are `Some`.)
        if let Some(p) = preset.take_if(|p| p.len() == items.len() && p.iter().all(Option::is_some))
        {
            segments = p.into_iter().map_while(|s| s).collect();
        }
        for (i, item) in items.iter().enumerate().skip(segments.len()) {
            if let Some(seg) = preset.as_mut().and_then(|p| p.get_mut(i)?.take()) {
                segments.push(seg);
                continue;
            }
            if let Value::Dict(id) = item {
                if let Some(first) = seen.insert(*id, i) {
                    return Err(shared(format!("{name}[{i}]"), format!("{name}[{first}]")));
                }
            }
            segments.push(d.segment(*item, &|| format!("{name}[{i}]"))?);
        }
    }
    Ok(segments)
}
