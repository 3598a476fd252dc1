//! The machine of the parallel reader. One runs per chunk (in parallel) with a local stack: an
//! opcode that needs the stack below the chunk's start (the SETITEMS closing a dict begun in an
//! earlier chunk, the APPENDS into a list made there, …) is not run but recorded, after the
//! values pushed so far, as a [`Macro`]; one more runs the macros of every chunk in order (the
//! "stitch") with the whole stack, so each opcode runs exactly once, in its machine.
//!
//! Trace-entry dicts become compact rows of a [`Part`] as soon as their SETITEMS runs, frames
//! lists become stack slots when an entry uses them: the generic containers of the bulk of the
//! file never exist. Anything unusual returns [`Unsupported`] and the caller falls back to the
//! sequential reader, which then gives the exact result or error.

use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::pickle::opcodes as op;
use crate::pickle::scan::{self, Chunk};
use crate::snapshot::intern::{StackId, TextId};
use crate::snapshot::model::{Action, TraceEntry};
use crate::snapshot::trace::Part;

/// The parallel reader cannot take this input; the sequential one will.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported;

pub type R<T> = Result<T, Unsupported>;

const NONE_U32: u32 = u32::MAX;

/// A value on a machine's stack or in its containers (16 bytes, `Copy`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LVal {
    None,
    Bool(bool),
    Int(i64),
    /// Index into `bigs`.
    Big(u32),
    Float(f64),
    /// Index into `strs`.
    Str(u32),
    /// Memo index stored before this chunk; resolved when needed.
    Ext(u32),
    List(u32),
    Tuple(u32),
    Dict(u32),
    /// Row `row` of the records of source `src`.
    Rec { src: u32, row: u32 },
    /// Rows `start..start + len` of the records of source `src` (only in lists).
    Recs { src: u32, start: u32, len: u32 },
}

/// What a chunk hands to the stitch, in order.
#[derive(Clone, Copy, Debug)]
pub enum Macro {
    Push(LVal),
    Mark,
    /// Run the opcode at this position; `memo` is the index a MEMOIZE there assigns.
    Raw { pos: usize, memo: u32 },
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ListS {
    start: u32,
    len: u32,
    memo: u32,
    /// Stack slot once an entry used the list as its frames.
    stack: u32,
    sealed: bool,
    flushed: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct DictS {
    start: u32,
    len: u32,
    memo: u32,
    /// Row when the dict became a trace record.
    rec: u32,
    sealed: bool,
    flushed: bool,
}

/// A frame dict's content, with texts local to the source that captured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameC {
    pub name: u32,
    pub filename: u32,
    pub line: i64,
}

/// Where a stack slot's frames come from.
#[derive(Clone, Debug)]
pub enum Slot {
    /// Memo indices of the frame dicts.
    Content(Box<[u32]>),
    /// A frames list stored under this memo index by an earlier chunk.
    ExtList(u32),
}

// Dict keys the reader looks at.
const F_ACTION: u8 = 0;
const F_ADDR: u8 = 1;
const F_SIZE: u8 = 2;
const F_STREAM: u8 = 3;
const F_DEVICE_FREE: u8 = 4;
const F_TIME: u8 = 5;
const F_FRAMES: u8 = 6;
const F_UM: u8 = 7;
const F_CC: u8 = 8;
const F_NAME: u8 = 9;
const F_FILENAME: u8 = 10;
const F_LINE: u8 = 11;
const F_OTHER: u8 = 12;
const F_NOT_STR: u8 = 13;

fn field_of(s: &str) -> u8 {
    match s {
        "action" => F_ACTION,
        "addr" => F_ADDR,
        "size" => F_SIZE,
        "stream" => F_STREAM,
        "device_free" => F_DEVICE_FREE,
        "time_us" => F_TIME,
        "frames" => F_FRAMES,
        "user_metadata" => F_UM,
        "compile_context" => F_CC,
        "name" => F_NAME,
        "filename" => F_FILENAME,
        "line" => F_LINE,
        _ => F_OTHER,
    }
}

/// A memo value found from the bytes that stored it.
#[derive(Clone, Copy, Debug)]
pub enum Resolved<'a> {
    Str(&'a str),
    Int(i64),
    Big(i128),
    Float(f64),
    None,
    Bool(bool),
    Container,
    Unknown,
}

/// What all machines share: the input, the chunks, and memo values found so far.
pub struct Ctx<'a> {
    pub data: &'a [u8],
    pub chunks: Vec<Chunk>,
    resolved: Mutex<FxHashMap<u32, Resolved<'a>>>,
}

impl<'a> Ctx<'a> {
    pub fn new(data: &'a [u8], chunks: Vec<Chunk>) -> Ctx<'a> {
        Ctx {
            data,
            chunks,
            resolved: Mutex::new(FxHashMap::default()),
        }
    }

    /// The value stored under memo index `g` when it is a scalar or a string (read back from
    /// the opcode before its MEMOIZE); `Container` for containers.
    pub fn resolve(&self, g: u32) -> Resolved<'a> {
        if let Ok(map) = self.resolved.lock() {
            if let Some(r) = map.get(&g) {
                return *r;
            }
        }
        let r = match scan::memo_source(self.data, &self.chunks, g) {
            Some(pos) => decode_scalar(self.data, pos),
            None => Resolved::Unknown,
        };
        if let Ok(mut map) = self.resolved.lock() {
            map.insert(g, r);
        }
        r
    }

    /// Index of the chunk whose MEMOIZEs assign memo index `g`.
    pub fn chunk_of_memo(&self, g: u32) -> Option<usize> {
        let k = self
            .chunks
            .partition_point(|c| c.memo_base <= g)
            .checked_sub(1)?;
        (g - self.chunks[k].memo_base < self.chunks[k].memos).then_some(k)
    }
}

fn decode_scalar(data: &[u8], pos: usize) -> Resolved<'_> {
    let Some(&code) = data.get(pos) else {
        return Resolved::Unknown;
    };
    let arg = |n: usize| data.get(pos + 1..pos + 1 + n);
    let text = |start: usize, n: usize| {
        data.get(start..start + n)
            .and_then(|b| std::str::from_utf8(b).ok())
            .map_or(Resolved::Unknown, Resolved::Str)
    };
    match code {
        op::SHORT_BINUNICODE => match arg(1) {
            Some(n) => text(pos + 2, n[0] as usize),
            None => Resolved::Unknown,
        },
        op::BINUNICODE => match arg(4) {
            Some(n) => text(pos + 5, u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize),
            None => Resolved::Unknown,
        },
        op::BINUNICODE8 => match arg(8).and_then(|n| usize::try_from(le_u64(n)).ok()) {
            Some(n) => text(pos + 9, n),
            None => Resolved::Unknown,
        },
        op::BININT1 => arg(1).map_or(Resolved::Unknown, |b| Resolved::Int(b[0] as i64)),
        op::BININT2 => arg(2).map_or(Resolved::Unknown, |b| {
            Resolved::Int(u16::from_le_bytes([b[0], b[1]]) as i64)
        }),
        op::BININT => arg(4).map_or(Resolved::Unknown, |b| {
            Resolved::Int(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64)
        }),
        op::LONG1 => match arg(1).and_then(|n| data.get(pos + 2..pos + 2 + n[0] as usize)) {
            Some(raw) if raw.len() <= 16 => {
                let v = le_signed(raw);
                match i64::try_from(v) {
                    Ok(i) => Resolved::Int(i),
                    Err(_) => Resolved::Big(v),
                }
            }
            _ => Resolved::Unknown,
        },
        op::BINFLOAT => arg(8).map_or(Resolved::Unknown, |b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            Resolved::Float(f64::from_be_bytes(a))
        }),
        op::NONE => Resolved::None,
        op::NEWTRUE => Resolved::Bool(true),
        op::NEWFALSE => Resolved::Bool(false),
        op::EMPTY_DICT
        | op::EMPTY_LIST
        | op::EMPTY_TUPLE
        | op::TUPLE
        | op::TUPLE1
        | op::TUPLE2
        | op::TUPLE3
        | op::APPENDS
        | op::APPEND
        | op::SETITEMS
        | op::SETITEM => Resolved::Container,
        _ => Resolved::Unknown,
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_le_bytes(a)
}

fn le_signed(raw: &[u8]) -> i128 {
    if raw.is_empty() {
        return 0;
    }
    let mut buf = if raw[raw.len() - 1] & 0x80 != 0 {
        [0xffu8; 16]
    } else {
        [0u8; 16]
    };
    buf[..raw.len()].copy_from_slice(raw);
    i128::from_le_bytes(buf)
}

/// Memo indices below this use a dense cache of resolved values.
const DENSE_EXT: usize = 4096;

/// Local view of other chunks' memo values (resolved once per machine).
#[derive(Default)]
struct ExtCache {
    dense: Vec<Option<LVal>>,
    sparse: FxHashMap<u32, LVal>,
}

impl ExtCache {
    fn get(&self, g: u32) -> Option<LVal> {
        match self.dense.get(g as usize) {
            Some(v) => *v,
            None => self.sparse.get(&g).copied(),
        }
    }

    fn put(&mut self, g: u32, v: LVal) {
        if (g as usize) < DENSE_EXT {
            if self.dense.len() <= g as usize {
                self.dense.resize(g as usize + 1, None);
            }
            self.dense[g as usize] = Some(v);
        } else {
            self.sparse.insert(g, v);
        }
    }
}

