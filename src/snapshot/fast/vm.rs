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

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use rustc_hash::FxHashMap;

use crate::pickle::opcodes as op;
use crate::pickle::reader::{inside_path, Holder, Level, StackView};
use crate::pickle::scan::{self, Chunk};
use crate::snapshot::intern::{StackId, TextId};
use crate::snapshot::model::{Action, TraceEntry};

mod segments;
use crate::snapshot::trace::Part;
pub use segments::SegRow;

/// The parallel reader cannot take this input; the sequential one will.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported;

pub type R<T> = Result<T, Unsupported>;

const NONE_U32: u32 = u32::MAX;

/// A value on a machine's stack or in its containers (16 bytes, `Copy`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(u8)]
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
    Rec {
        src: u32,
        row: u32,
    },
    /// Rows `start..start + len` of the records of source `src` (only in lists).
    Recs {
        src: u32,
        start: u32,
        len: u32,
    },
    /// Segment `row` read by source `src` (see [`SegRow`]).
    Seg {
        src: u32,
        row: u32,
    },
}

/// What a chunk hands to the stitch, in order.
#[derive(Clone, Copy, Debug)]
pub enum Macro {
    Push(LVal),
    Mark,
    /// Run the opcode at this position; `memo` is the index a MEMOIZE there assigns.
    Raw {
        pos: usize,
        memo: u32,
        /// The opcode's bytes when they fit (`len` 0: read them from `pos`).
        len: u8,
        bytes: [u8; RAW_INLINE],
    },
}

/// Opcode bytes a [`Macro::Raw`] carries: the chunk's pages are let go once it has run, and
/// the stitch read each opcode back with a system call (thousands of them, one after the
/// other on one core); APPENDS, SETITEMS and memo fetches fit.
pub const RAW_INLINE: usize = 6;

/// Tests: false makes every [`Macro::Raw`] leave its bytes in the input (the path of longer
/// opcodes), so that reading them back stays tested.
pub static KEEP_RAW_BYTES: AtomicBool = AtomicBool::new(true);

#[derive(Clone, Copy, Debug, Default)]
pub struct ListS {
    start: u32,
    len: u32,
    /// Index into `owned` once the list moved out of the pool.
    own: u32,
    memo: u32,
    /// Stack slot once an entry used the list as its frames.
    stack: u32,
    sealed: bool,
    flushed: bool,
    /// A segment's blocks list whose dicts were read into a row and dropped (see
    /// `Vm::drop_segment_dicts`): fetching it again is left to the sequential reader.
    dropped: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct DictS {
    start: u32,
    len: u32,
    own: u32,
    memo: u32,
    /// Row when the dict became a trace record.
    rec: u32,
    /// Row when the dict became a segment.
    seg: u32,
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

/// A trace entry's values, read: what [`Vm::push_row`] makes a row of.
struct RowFields {
    /// The action string (index into the arena's strings).
    action: u32,
    addr: Option<u64>,
    size: u64,
    stream: u64,
    device_free: Option<u64>,
    time_us: Option<i64>,
    frames: Option<LVal>,
    user_metadata: Option<LVal>,
    compile_context: Option<LVal>,
    pool_id: Option<(i64, i64)>,
    internal_metadata: Option<LVal>,
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
// Keys of segment and block dicts (besides `size`, `stream` and `frames` above).
const F_DEVICE: u8 = 14;
const F_ADDRESS: u8 = 15;
const F_TOTAL_SIZE: u8 = 16;
const F_ALLOCATED_SIZE: u8 = 17;
const F_ACTIVE_SIZE: u8 = 18;
const F_REQUESTED_SIZE: u8 = 19;
const F_SEGMENT_TYPE: u8 = 20;
const F_POOL_ID: u8 = 21;
const F_IS_EXPANDABLE: u8 = 22;
const F_BLOCKS: u8 = 23;
const F_STATE: u8 = 24;
// Keys of trace entries from torch 2.11-2.15 (`pool_id`, `internal_metadata`, `forward_frames`).
const F_TPOOL: u8 = 25;
const F_IM: u8 = 26;
const F_FWD: u8 = 27;
/// Number of field codes.
const FIELDS: usize = 28;

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
        "device" => F_DEVICE,
        "address" => F_ADDRESS,
        "total_size" => F_TOTAL_SIZE,
        "allocated_size" => F_ALLOCATED_SIZE,
        "active_size" => F_ACTIVE_SIZE,
        "requested_size" => F_REQUESTED_SIZE,
        "segment_type" => F_SEGMENT_TYPE,
        "segment_pool_id" => F_POOL_ID,
        "is_expandable" => F_IS_EXPANDABLE,
        "blocks" => F_BLOCKS,
        "state" => F_STATE,
        "pool_id" => F_TPOOL,
        "internal_metadata" => F_IM,
        "forward_frames" => F_FWD,
        _ => F_OTHER,
    }
}

/// Whether a key of this field code is one a trace entry may have (read or knowingly skipped).
fn is_entry_key(field: u8) -> bool {
    matches!(field, 0..=F_CC | F_TPOOL | F_IM | F_FWD)
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
    /// Copies bytes of the input without mapping its pages (see `InputBytes::peek`).
    peek: &'a (dyn Fn(usize, &mut [u8]) -> usize + Sync),
    /// Byte ranges of the chunks.
    pub spans: Vec<Range<usize>>,
    /// Memo index of each chunk's first MEMOIZE and how many it has (`UNKNOWN` until known:
    /// when chunks are read in order, they become known as the reading goes).
    bases: Vec<AtomicU32>,
    counts: Vec<AtomicU32>,
    /// Set once every chunk's counts are known.
    all_known: AtomicBool,
    /// Positions of the FRAME headers between frames, in order.
    pub frame_headers: Vec<usize>,
    release: &'a (dyn Fn(usize, usize) + Sync),
    /// Per chunk, built the first time a later chunk needs one of its memo values: where the
    /// value of each of its MEMOIZEs was written. One walk of the chunk, then every reference
    /// into it is answered in O(1) (walking the chunk per reference made work grow with
    /// references × chunk size on real dumps, whose frame dicts are shared file-wide).
    sources: Vec<OnceLock<Box<[u32]>>>,
    /// Set when a chunk holds what the machines are not made for: nesting deeper than they
    /// follow ([`MAX_DEPTH`], [`MAX_MARKS`]) or more opcodes to run one by one than a snapshot
    /// has ([`STEPPED_PER_BYTE`]). Every other way through the chunks fails the same way, so
    /// the sequential reader takes the input at once (a million nested lists were read three
    /// times; 10 MB of empty lists took 5 s and 800 MB in the machines' copies).
    pub sequential_only: AtomicBool,
}

/// A chunk's memo counts not known yet.
pub const UNKNOWN: u32 = u32::MAX;

impl<'a> Ctx<'a> {
    pub fn new(
        data: &'a [u8],
        chunks: Vec<Chunk>,
        frame_headers: Vec<usize>,
        release: &'a (dyn Fn(usize, usize) + Sync),
        peek: &'a (dyn Fn(usize, &mut [u8]) -> usize + Sync),
    ) -> Ctx<'a> {
        let bases = chunks.iter().map(|c| AtomicU32::new(c.memo_base)).collect();
        let counts = chunks.iter().map(|c| AtomicU32::new(c.memos)).collect();
        let all_known = chunks
            .iter()
            .all(|c| c.memo_base != UNKNOWN && c.memos != UNKNOWN);
        Ctx {
            data,
            peek,
            spans: chunks.iter().map(|c| c.start..c.end).collect(),
            bases,
            counts,
            all_known: AtomicBool::new(all_known),
            frame_headers,
            release,
            sources: chunks.iter().map(|_| OnceLock::new()).collect(),
            sequential_only: AtomicBool::new(false),
        }
    }

    /// Notes that a chunk holds what the machines are not made for (see `sequential_only`);
    /// returns the error to give.
    fn not_for_machines(&self) -> Unsupported {
        self.sequential_only.store(true, Ordering::Relaxed);
        Unsupported
    }

    /// `s` as owned text; read back with a system call when it lies in the input, whose pages
    /// were let go after their chunk ran (touching them maps them again: on kernels that cache
    /// files in large folios one string per chunk brings the whole file back into the RSS).
    pub fn owned_text(&self, s: &str) -> String {
        let start = (s.as_ptr() as usize).wrapping_sub(self.data.as_ptr() as usize);
        if start >= self.data.len() || s.is_empty() {
            return s.to_owned();
        }
        let mut buf = vec![0u8; s.len()];
        if (self.peek)(start, &mut buf) == s.len() {
            if let Ok(t) = String::from_utf8(buf) {
                return t;
            }
        }
        s.to_owned()
    }

    /// Memo index of chunk `k`'s first MEMOIZE, once known.
    pub fn memo_base(&self, k: usize) -> Option<u32> {
        let b = self.bases.get(k)?.load(Ordering::Acquire);
        (b != UNKNOWN).then_some(b)
    }

    fn memo_count(&self, k: usize) -> Option<u32> {
        let n = self.counts.get(k)?.load(Ordering::Acquire);
        (n != UNKNOWN).then_some(n)
    }

    /// Records chunk `k`'s memo base and count (count `UNKNOWN`: the base alone). Counts found
    /// twice (by a walk and by running the chunk) must agree.
    pub fn set_counts(&self, k: usize, base: u32, count: u32) -> R<()> {
        for (cell, v) in [(&self.bases[k], base), (&self.counts[k], count)] {
            if v == UNKNOWN {
                continue;
            }
            match cell.compare_exchange(UNKNOWN, v, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {}
                Err(old) if old == v => {}
                Err(_) => return Err(Unsupported),
            }
        }
        Ok(())
    }

    /// Marks every chunk's counts as known (after checking that they are).
    pub fn seal_counts(&self) -> R<()> {
        for k in 0..self.spans.len() {
            self.memo_base(k).ok_or(Unsupported)?;
            self.memo_count(k).ok_or(Unsupported)?;
        }
        self.all_known.store(true, Ordering::Release);
        Ok(())
    }

    /// The value stored under memo index `g` when it is a scalar or a string (read back from
    /// the opcode before its MEMOIZE); `Container` for containers.
    pub fn resolve(&self, g: u32) -> Resolved<'a> {
        let mut near = usize::MAX;
        self.resolve_near(g, &mut near)
    }

    /// [`Ctx::resolve`], trying chunk `*near` first and leaving there the chunk that held `g`:
    /// a machine's lookups mostly go to the chunk of the one before (a replayed trace fetches
    /// the strings of its first pass in order), and the search over all chunks costs half of
    /// a lookup.
    pub fn resolve_near(&self, g: u32, near: &mut usize) -> Resolved<'a> {
        let k = match self.holds(*near, g) {
            true => *near,
            false => match self.chunk_of_memo(g) {
                Some(k) => k,
                None if self.count_for(g) => match self.chunk_of_memo(g) {
                    Some(k) => k,
                    None => return Resolved::Unknown,
                },
                None => return Resolved::Unknown,
            },
        };
        *near = k;
        let (Some(c), Some(base)) = (self.spans.get(k), self.memo_base(k)) else {
            return Resolved::Unknown;
        };
        let sources = self.sources[k].get_or_init(|| {
            let found = scan::memo_sources_in(self.data, c.start, c.end);
            (self.release)(c.start, c.end);
            found
        });
        match sources.get((g - base) as usize) {
            Some(&rel) if rel != scan::NO_SOURCE => {
                decode_scalar(self.data, c.start + rel as usize)
            }
            _ => Resolved::Unknown,
        }
    }

    /// Counts the chunks that may hold memo index `g` when no chunk counted so far does: a
    /// helper of the in-order reader starts with its own base only (probed, see `probe`), and
    /// fetches the keys and actions stored near the front and lists stored just before it. The
    /// chunks not counted yet lie between the first thread (the lowest chunk of unknown count,
    /// its base known) and the next chunk whose base is known; they are walked from the end
    /// nearer to `g`, LANES at a time, until one holds `g`. The counts must agree with the
    /// bases known at both ends and with what the threads find running the chunks: a probed
    /// base that was wrong fails here or there, and the reader starts over the counted way.
    /// False when `g` lies in no gap (or a walk finds what the machines do not run).
    fn count_for(&self, g: u32) -> bool {
        if self.all_known.load(Ordering::Acquire) {
            return false;
        }
        let n = self.spans.len();
        loop {
            if self.chunk_of_memo(g).is_some() {
                return true;
            }
            let Some(lo) = (0..n).find(|&k| self.memo_count(k).is_none()) else {
                return false;
            };
            let Some(hi) = (lo + 1..n).find(|&k| self.memo_base(k).is_some()) else {
                return false;
            };
            let (Some(lo_base), Some(hi_base)) = (self.memo_base(lo), self.memo_base(hi)) else {
                return false;
            };
            if !(lo_base..hi_base).contains(&g) {
                return false;
            }
            let forward = g - lo_base < hi_base - g;
            let group = match forward {
                true => lo..(lo + scan::LANES).min(hi),
                false => hi.saturating_sub(scan::LANES).max(lo)..hi,
            };
            if !self.count_chunks(group.clone(), !forward) {
                return false;
            }
            if !forward {
                // Far from the first thread: its pages are not kept for it.
                (self.release)(self.spans[group.start].start, self.spans[group.end - 1].end);
            }
        }
    }

    /// Walks the chunks of `group` (counting only) and records their bases and counts, from
    /// the base of the first of them, or with `back` from the base of the chunk after them.
    /// False when that base is not known, a walk finds what the machines do not run, or a
    /// count or base disagrees with one recorded before.
    pub fn count_chunks(&self, group: Range<usize>, back: bool) -> bool {
        let ranges: Vec<(usize, usize)> = self.spans[group.clone()]
            .iter()
            .map(|r| (r.start, r.end))
            .collect();
        let walks = scan::walk_in_order(self.data, &ranges);
        if !walks.iter().all(scan::Walk::is_plain) {
            return false;
        }
        let counted = match back {
            false => {
                let Some(first) = self.memo_base(group.start) else {
                    return false;
                };
                group.zip(&walks).try_fold(first, |base, (k, w)| {
                    self.set_counts(k, base, w.memos).ok()?;
                    let next = base.checked_add(w.memos)?;
                    if k + 1 < self.spans.len() {
                        self.set_counts(k + 1, next, UNKNOWN).ok()?;
                    }
                    Some(next)
                })
            }
            true => {
                let Some(after) = self.memo_base(group.end) else {
                    return false;
                };
                group.zip(&walks).rev().try_fold(after, |end, (k, w)| {
                    let base = end.checked_sub(w.memos)?;
                    self.set_counts(k, base, w.memos).ok()?;
                    Some(base)
                })
            }
        };
        counted.is_some()
    }

    /// Whether chunk `k`'s MEMOIZEs assign memo index `g` (`false` for a chunk not counted
    /// yet, or no chunk).
    #[inline]
    fn holds(&self, k: usize, g: u32) -> bool {
        match (self.memo_base(k), self.memo_count(k)) {
            (Some(b), Some(n)) => b <= g && g - b < n,
            _ => false,
        }
    }

    /// Index of the chunk whose MEMOIZEs assign memo index `g`.
    pub fn chunk_of_memo(&self, g: u32) -> Option<usize> {
        let holds = |k: usize| self.holds(k, g);
        // Bases grow with the chunk index. While chunks are still being read, the ones not
        // known yet are mostly those after the reading (whose memo indices are higher than
        // any fetched one): the search takes them as higher, and a result that does not hold
        // `g` asks every chunk instead.
        let all_known = self.all_known.load(Ordering::Acquire);
        let (mut lo, mut hi) = (0, self.spans.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.memo_base(mid) {
                Some(b) if b <= g => lo = mid + 1,
                _ => hi = mid,
            }
        }
        match lo.checked_sub(1) {
            Some(k) if holds(k) => Some(k),
            _ if all_known => None,
            _ => (0..self.spans.len()).find(|&k| holds(k)),
        }
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
            Some(n) => text(
                pos + 5,
                u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize,
            ),
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

/// The `n <= 8` bytes at `at` as a little-endian two's complement integer (LONG1's payload),
/// read as one word where the input allows.
#[inline(always)]
fn le_i64(data: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut b = [0u8; 8];
    match data.get(at..at + 8) {
        Some(w) => b.copy_from_slice(w),
        None => b[..n].copy_from_slice(data.get(at..at + n)?),
    }
    if n == 0 {
        return Some(0);
    }
    let shift = 64 - 8 * n as u32;
    Some(((u64::from_le_bytes(b) << shift) as i64) >> shift)
}

/// The int a BININT1, BININT2, BININT or LONG1 (of 8 bytes at most) at `p` pushes, and the
/// opcode's length.
#[inline(always)]
fn small_int(data: &[u8], p: usize) -> Option<(i64, usize)> {
    Some(match *data.get(p)? {
        op::BININT1 => (i64::from(*data.get(p + 1)?), 2),
        op::BININT2 => {
            let b = data.get(p + 1..p + 3)?;
            (i64::from(u16::from_le_bytes([b[0], b[1]])), 3)
        }
        op::BININT => {
            let b = data.get(p + 1..p + 5)?;
            (i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])), 5)
        }
        op::LONG1 => {
            let n = *data.get(p + 1)? as usize;
            if n > 8 {
                return None;
            }
            (le_i64(data, p + 2, n)?, 2 + n)
        }
        _ => return None,
    })
}

/// The memo index a BINGET or LONG_BINGET at `p` fetches, and the position after it.
#[inline(always)]
pub(super) fn memo_index(data: &[u8], p: usize) -> Option<(u32, usize)> {
    match *data.get(p)? {
        op::BINGET => Some((*data.get(p + 1)? as u32, p + 2)),
        op::LONG_BINGET => {
            let b = data.get(p + 1..p + 5)?;
            Some((u32::from_le_bytes([b[0], b[1], b[2], b[3]]), p + 5))
        }
        _ => None,
    }
}

/// Memo fetches (BINGET, LONG_BINGET) of a frames list, as bytes, with a hash of them made
/// by [`hash_fetches`]. Equal bytes have equal hashes; a map of these compares the bytes too,
/// so a collision only costs a comparison.
#[derive(Clone, Copy)]
struct FetchRun<'a> {
    hash: u64,
    bytes: &'a [u8],
}

impl PartialEq for FetchRun<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for FetchRun<'_> {}

impl std::hash::Hash for FetchRun<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// `bytes` with their hash: multiply-rotate steps (the odd constant of FxHash) on whole
/// eight-byte words, in four independent lanes over 32-byte blocks. One lane was a chain of
/// dependent multiplies, waited on word after word (most of `ext_frames`' time on a real
/// dump's frames lists of a few hundred bytes).
fn hash_fetches(bytes: &[u8]) -> FetchRun<'_> {
    let mix = |h: u64, w: u64| (h ^ w).wrapping_mul(0xf135_7aea_2e62_a9c5).rotate_left(26);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    let mut lanes = [bytes.len() as u64, 1, 2, 3];
    let mut blocks = bytes.chunks_exact(32);
    for b in &mut blocks {
        for (j, lane) in lanes.iter_mut().enumerate() {
            *lane = mix(*lane, word(&b[8 * j..8 * j + 8]));
        }
    }
    let mut hash = lanes.into_iter().fold(0, mix);
    for w in blocks.remainder().chunks_exact(8) {
        hash = mix(hash, word(w));
    }
    // The last eight bytes (overlapping the words before), not a copy of the remainder: a
    // copy of a few bytes is a call to memcpy.
    let last = match bytes.len().checked_sub(8) {
        Some(k) => word(&bytes[k..]),
        None => bytes.iter().fold(0, |w, &b| w << 8 | b as u64),
    };
    FetchRun {
        hash: mix(hash, last),
        bytes,
    }
}

/// The bytes from `p` up to an APPENDS when they are memo fetches only, with their hash.
fn fetches_until_appends(data: &[u8], p: usize) -> Option<FetchRun<'_>> {
    let mut q = p;
    loop {
        // Runs of four LONG_BINGETs (most of a real frames list) in one step: four independent
        // loads and one branch instead of a branch per opcode.
        while let Some(w) = data.get(q..q + 16) {
            if w[0] == op::LONG_BINGET
                && w[5] == op::LONG_BINGET
                && w[10] == op::LONG_BINGET
                && w[15] == op::LONG_BINGET
            {
                q += 20;
            } else {
                break;
            }
        }
        match *data.get(q)? {
            op::LONG_BINGET => q += 5,
            op::BINGET => q += 2,
            op::APPENDS => return Some(hash_fetches(data.get(p..q)?)),
            _ => return None,
        }
    }
}

/// How far [`Vm::closing_run`] looks for the end of a frames list (a stack of 400 frames).
const CLOSING_WINDOW: usize = 2048;

/// Slots of the direct-mapped caches of other chunks' memo values (a power of two). Memo
/// indices of the hot values (dict keys, action names, frame dicts) can be anywhere: in real
/// dumps the trace's keys come after every segment's values, millions of indices in.
const EXT_SLOTS: usize = 1 << 14;

/// A direct-mapped slot: the memo index it holds (`NONE_U32`: none) and its value.
#[derive(Clone, Copy)]
struct Tagged<T: Copy> {
    g: u32,
    v: T,
}

/// Values by memo index in `EXT_SLOTS` direct-mapped slots (made on the first `put`): an index
/// whose slot another one took is simply not found.
pub struct Slots<T: Copy> {
    slots: Vec<Tagged<T>>,
}

impl<T: Copy> Default for Slots<T> {
    fn default() -> Self {
        Slots { slots: Vec::new() }
    }
}

impl<T: Copy + Default> Slots<T> {
    #[inline(always)]
    fn get(&self, g: u32) -> Option<T> {
        let t = self.slots.get(slot_of_memo(g))?;
        (t.g == g).then_some(t.v)
    }

    fn put(&mut self, g: u32, v: T) {
        if self.slots.is_empty() {
            let none = Tagged {
                g: NONE_U32,
                v: T::default(),
            };
            self.slots = vec![none; EXT_SLOTS];
        }
        self.slots[slot_of_memo(g)] = Tagged { g, v };
    }
}

/// Local view of other chunks' memo values (resolved once per machine): direct-mapped slots in
/// front of a map that keeps every value, so a slot taken by another index costs a lookup.
#[derive(Default)]
struct ExtCache {
    /// Strings (the common case: dict keys, action names) by index into `a.strs`.
    strs: Slots<u32>,
    /// The field a string used as a dict key names.
    fields: Slots<u8>,
    all: FxHashMap<u32, LVal>,
}

#[inline(always)]
fn slot_of_memo(g: u32) -> usize {
    g as usize & (EXT_SLOTS - 1)
}

impl ExtCache {
    #[inline(always)]
    fn get(&self, g: u32) -> Option<LVal> {
        // Built in registers: copying a 16-byte enum through memory stalls here.
        if let Some(i) = self.strs.get(g) {
            return Some(LVal::Str(i));
        }
        self.all.get(&g).copied()
    }

    fn put(&mut self, g: u32, v: LVal) {
        if let LVal::Str(i) = v {
            // Strings only in their slot: real dumps fetch a string of their own per entry
            // (`compile_context`), and keeping each in the map cost more than resolving the
            // few evicted ones again.
            self.strs.put(g, i);
            return;
        }
        self.all.insert(g, v);
    }

    #[inline(always)]
    fn field(&self, g: u32) -> Option<u8> {
        self.fields.get(g)
    }

    fn put_field(&mut self, g: u32, f: u8) {
        self.fields.put(g, f);
    }
}

/// Strings stored in other chunks' memos, by memo index, kept by a worker from one chunk to
/// the next. Real dumps fetch strings stored far back (every entry of a replayed trace fetches
/// its own `compile_context` string from the first pass): read from the input each time, each
/// chunk found them again at ~500 instructions apiece (a tenth of the reader's work on such
/// files).
///
/// Direct-mapped like [`Slots`], but it grows: a replayed trace fetches its first pass's
/// strings in a cycle (ZidongLiu: 23,105 `compile_context` strings, one per entry, about
/// 100,000 memo indices apart end to end), and once they span more slots than there are, each
/// evicts another before it comes round again and every fetch misses. Doubling once as many
/// strings were evicted as there are slots gives them room (at most `TEXT_SLOTS_MAX`, 6 MiB).
#[derive(Default)]
pub struct TextCache<'a> {
    slots: Vec<Tagged<&'a str>>,
    evicted: usize,
}

/// The most slots a [`TextCache`] grows to (a power of two).
const TEXT_SLOTS_MAX: usize = 1 << 18;

impl<'a> TextCache<'a> {
    #[inline]
    fn get(&self, g: u32) -> Option<&'a str> {
        let t = self
            .slots
            .get(g as usize & self.slots.len().wrapping_sub(1))?;
        (t.g == g).then_some(t.v)
    }

    fn put(&mut self, g: u32, v: &'a str) {
        let none = Tagged { g: NONE_U32, v: "" };
        if self.slots.is_empty() {
            self.slots = vec![none; EXT_SLOTS];
        }
        let mask = self.slots.len() - 1;
        let old = self.slots[g as usize & mask].g;
        if old != NONE_U32 && old != g {
            self.evicted += 1;
            if self.evicted >= self.slots.len() && self.slots.len() < TEXT_SLOTS_MAX {
                let mut grown = vec![none; self.slots.len() * 2];
                let mask = grown.len() - 1;
                for t in self.slots.iter().filter(|t| t.g != NONE_U32) {
                    grown[t.g as usize & mask] = *t;
                }
                self.slots = grown;
                self.evicted = 0;
            }
        }
        let mask = self.slots.len() - 1;
        self.slots[g as usize & mask] = Tagged { g, v };
    }
}

/// Containers and strings of one machine (or of what a chunk hands on).
#[derive(Default)]
pub struct Arena<'a> {
    pub strs: Vec<&'a str>,
    last_str: Option<(&'a str, u32)>,
    str_index: FxHashMap<&'a str, u32>,
    str_field: Vec<u8>,
    pub bigs: Vec<i128>,
    pub lists: Vec<ListS>,
    pub dicts: Vec<DictS>,
    pub tuples: Vec<(u32, u32)>,
    /// Items of lists and tuples, back to back (a list filled once never moves).
    pub pool: Vec<LVal>,
    pub dpool: Vec<(LVal, LVal)>,
    /// Lists and dicts filled again after others were made: their own storage.
    owned: Vec<Vec<LVal>>,
    downed: Vec<Vec<(LVal, LVal)>>,
}

/// The most a machine's container keeps for the next chunk (see [`Spare::keep`]).
const SPARE_BYTES: usize = 2 << 20;

/// Working storage of a chunk's machine that dies with the chunk, kept by a worker for its
/// next chunk: growing fresh vectors for every chunk costs page faults and copies.
#[derive(Default)]
pub struct Spare<'a> {
    /// Strings of other chunks' memo values by memo index (see [`TextCache`]): unlike the
    /// arena, they stay valid from one chunk to the next.
    texts: TextCache<'a>,
    lists: Vec<ListS>,
    dicts: Vec<DictS>,
    tuples: Vec<(u32, u32)>,
    pool: Vec<LVal>,
    dpool: Vec<(LVal, LVal)>,
    memo: Vec<LVal>,
    stack: Vec<LVal>,
}

impl<'a> Spare<'a> {
    fn keep(&mut self, a: Arena<'_>, memo: Vec<LVal>, stack: Vec<LVal>) {
        // What a chunk of trace entries fills is kept; what a chunk of segments with thousands
        // of block dicts filled (8 MiB of pairs) is not, or it would stay through the whole
        // read, beside the rows.
        fn cleared<T>(mut v: Vec<T>) -> Vec<T> {
            if v.capacity() * std::mem::size_of::<T>() > SPARE_BYTES {
                return Vec::new();
            }
            v.clear();
            v
        }
        self.lists = cleared(a.lists);
        self.dicts = cleared(a.dicts);
        self.tuples = cleared(a.tuples);
        self.pool = cleared(a.pool);
        self.dpool = cleared(a.dpool);
        self.memo = cleared(memo);
        self.stack = cleared(stack);
    }
}

/// Appends `v` to `items`, extending a run of records when it continues one.
fn push_item(items: &mut Vec<LVal>, nonempty: bool, v: LVal) -> bool {
    if nonempty {
        if let Some(LVal::Recs { src, start, len }) = items.last_mut() {
            match v {
                LVal::Rec { src: s2, row } if *src == s2 && *start + *len == row => {
                    *len += 1;
                    return false;
                }
                LVal::Recs {
                    src: s2,
                    start: st2,
                    len: n2,
                } if *src == s2 && *start + *len == st2 => {
                    *len += n2;
                    return false;
                }
                _ => {}
            }
        }
    }
    items.push(match v {
        LVal::Rec { src, row } => LVal::Recs {
            src,
            start: row,
            len: 1,
        },
        other => other,
    });
    true
}

impl<'a> Arena<'a> {
    /// [`intern`](Self::intern) of UTF-8 bytes: the last string is recognised by its bytes,
    /// before they are checked as UTF-8 (torch writes `compile_context` "N/A" anew in every
    /// entry). `None` for bytes that are not UTF-8.
    #[inline]
    pub fn intern_utf8(&mut self, raw: &'a [u8]) -> Option<u32> {
        if let Some(i) = self.last_is(raw) {
            return Some(i);
        }
        Some(self.remember(std::str::from_utf8(raw).ok()?))
    }

    #[inline]
    pub fn intern(&mut self, s: &'a str) -> u32 {
        match self.last_is(s.as_bytes()) {
            Some(i) => i,
            None => self.remember(s),
        }
    }

    /// Entries repeat the same few strings ("N/A"): the last one is checked before hashing.
    #[inline]
    fn last_is(&self, raw: &[u8]) -> Option<u32> {
        let &(last, i) = self.last_str.as_ref()?;
        (last.as_bytes() == raw).then_some(i)
    }

    /// Interns `s` and keeps it as the last string.
    fn remember(&mut self, s: &'a str) -> u32 {
        let i = self.intern_slow(s);
        self.last_str = Some((s, i));
        i
    }

    fn intern_slow(&mut self, s: &'a str) -> u32 {
        if let Some(&i) = self.str_index.get(s) {
            return i;
        }
        let i = self.strs.len() as u32;
        self.strs.push(s);
        self.str_index.insert(s, i);
        self.str_field.push(field_of(s));
        i
    }

    pub fn big(&mut self, v: i128) -> LVal {
        self.bigs.push(v);
        LVal::Big(self.bigs.len() as u32 - 1)
    }

    fn new_list(&mut self) -> LVal {
        self.lists.push(ListS {
            start: self.pool.len() as u32,
            len: 0,
            own: NONE_U32,
            memo: NONE_U32,
            stack: NONE_U32,
            sealed: false,
            flushed: false,
            dropped: false,
        });
        LVal::List(self.lists.len() as u32 - 1)
    }

    fn new_dict(&mut self) -> LVal {
        self.dicts.push(DictS {
            start: self.dpool.len() as u32,
            len: 0,
            own: NONE_U32,
            memo: NONE_U32,
            rec: NONE_U32,
            seg: NONE_U32,
            sealed: false,
            flushed: false,
        });
        LVal::Dict(self.dicts.len() as u32 - 1)
    }

    pub fn list_items(&self, l: u32) -> &[LVal] {
        let s = self.lists[l as usize];
        if s.own != NONE_U32 {
            return &self.owned[s.own as usize];
        }
        &self.pool[s.start as usize..(s.start + s.len) as usize]
    }

    pub fn tuple_items(&self, t: u32) -> &[LVal] {
        let (s, n) = self.tuples[t as usize];
        &self.pool[s as usize..(s + n) as usize]
    }

    /// True when dict `d` became a trace record.
    pub fn dict_is_record(&self, d: u32) -> bool {
        self.dicts[d as usize].rec != NONE_U32
    }

    pub fn dict_items(&self, d: u32) -> &[(LVal, LVal)] {
        let s = self.dicts[d as usize];
        if s.own != NONE_U32 {
            return &self.downed[s.own as usize];
        }
        &self.dpool[s.start as usize..(s.start + s.len) as usize]
    }

    /// Appends to list `l`, keeping runs of records as one item.
    fn list_extend(&mut self, l: u32, items: &[LVal]) -> R<()> {
        let s = self.lists[l as usize];
        if s.sealed || s.flushed || self.pool.len() + items.len() >= u32::MAX as usize {
            return Err(Unsupported);
        }
        let at_end = s.start as usize + s.len as usize == self.pool.len();
        if s.own == NONE_U32 && !at_end && s.len > 0 {
            // Filled again after other containers: give it its own storage (once).
            let old = self.pool[s.start as usize..(s.start + s.len) as usize].to_vec();
            self.owned.push(old);
            self.lists[l as usize].own = (self.owned.len() - 1) as u32;
        } else if s.own == NONE_U32 && !at_end {
            self.lists[l as usize].start = self.pool.len() as u32;
        }
        let own = self.lists[l as usize].own;
        let mut len = self.lists[l as usize].len;
        let target = if own == NONE_U32 {
            &mut self.pool
        } else {
            &mut self.owned[own as usize]
        };
        for &v in items {
            if push_item(target, len > 0, v) {
                len += 1;
            }
        }
        self.lists[l as usize].len = len;
        Ok(())
    }

    fn new_tuple(&mut self, items: &[LVal]) -> R<LVal> {
        let start = self.pool.len();
        if items.iter().any(|v| matches!(v, LVal::Recs { .. })) {
            return Err(Unsupported);
        }
        self.pool.extend_from_slice(items);
        self.tuples.push((start as u32, items.len() as u32));
        Ok(LVal::Tuple(self.tuples.len() as u32 - 1))
    }

    fn dict_extend(&mut self, d: u32, pairs: &[LVal]) -> R<()> {
        let s = self.dicts[d as usize];
        let at_end = s.start as usize + s.len as usize == self.dpool.len();
        if s.own == NONE_U32 && !at_end && s.len > 0 {
            let old = self.dpool[s.start as usize..(s.start + s.len) as usize].to_vec();
            self.downed.push(old);
            self.dicts[d as usize].own = (self.downed.len() - 1) as u32;
        } else if s.own == NONE_U32 && !at_end {
            self.dicts[d as usize].start = self.dpool.len() as u32;
        }
        let own = self.dicts[d as usize].own;
        let target = if own == NONE_U32 {
            &mut self.dpool
        } else {
            &mut self.downed[own as usize]
        };
        for kv in pairs.chunks_exact(2) {
            if matches!(kv[0], LVal::Recs { .. }) || matches!(kv[1], LVal::Recs { .. }) {
                return Err(Unsupported);
            }
            target.push((kv[0], kv[1]));
        }
        self.dicts[d as usize].len += (pairs.len() / 2) as u32;
        Ok(())
    }
}

/// Deepest nesting the copies between machines follow (the sequential reader takes deeper).
const MAX_DEPTH: usize = 256;

/// Opcodes a chunk's machine runs one by one: at most one per `STEPPED_PER_BYTE` bytes of the
/// chunk, plus [`MIN_STEPPED`]. Snapshots' entries, segments, blocks and frames are read whole,
/// so real dumps' chunks of a MiB run at most about 43,000 (snapgen's segments: 79,000 in its
/// last 381 kB); every generic value and container costs at least one, so this bounds the
/// machines' memory and copies on inputs made of tiny values.
const STEPPED_PER_BYTE: usize = 4;
const MIN_STEPPED: usize = 1 << 16;

/// What a chunk's machine leaves for the stitch (each costs a copy there, and another into
/// the document): at most one macro per `MACROS_PER_BYTE` bytes, plus [`MIN_MACROS`]. Real
/// dumps leave at most about 7,200 per MiB chunk; a generic list spanning the chunks (10 MB
/// of short strings) leaves one per item.
const MACROS_PER_BYTE: usize = 32;
const MIN_MACROS: usize = 1 << 13;

/// Most MARKs a machine keeps open: each is a container being built, so more than the copies
/// follow ([`MAX_DEPTH`]) would fail later anyway (real snapshots nest fewer than ten deep).
const MAX_MARKS: usize = MAX_DEPTH;

/// Copies value `v` of arena `from` into `to`. `text` re-homes strings; `memo` is told of every
/// memoized container copied (old id → new value). Shared containers are copied once.
pub struct Copier<'x, 'a> {
    pub from: &'x Arena<'a>,
    lists: FxHashMap<u32, u32>,
    dicts: FxHashMap<u32, u32>,
    tuples: FxHashMap<u32, u32>,
    same_strings: bool,
    /// Set when a copy failed for nesting deeper than [`MAX_DEPTH`].
    pub too_deep: bool,
}

impl<'x, 'a> Copier<'x, 'a> {
    pub fn new(from: &'x Arena<'a>, same_strings: bool) -> Self {
        Copier {
            from,
            lists: FxHashMap::default(),
            dicts: FxHashMap::default(),
            tuples: FxHashMap::default(),
            same_strings,
            too_deep: false,
        }
    }

    pub fn copy(
        &mut self,
        to: &mut Arena<'a>,
        v: LVal,
        memo: &mut dyn FnMut(u32, LVal),
        depth: usize,
    ) -> R<LVal> {
        if depth > MAX_DEPTH {
            self.too_deep = true;
            return Err(Unsupported);
        }
        Ok(match v {
            LVal::Str(i) if !self.same_strings => LVal::Str(to.intern(self.from.strs[i as usize])),
            LVal::Big(i) if !self.same_strings => to.big(self.from.bigs[i as usize]),
            LVal::List(l) => {
                if let Some(&n) = self.lists.get(&l) {
                    return Ok(LVal::List(n));
                }
                let s = self.from.lists[l as usize];
                if s.dropped {
                    return Err(Unsupported);
                }
                let LVal::List(n) = to.new_list() else {
                    return Err(Unsupported);
                };
                self.lists.insert(l, n);
                let mut items = Vec::with_capacity(s.len as usize);
                for &item in self.from.list_items(l) {
                    items.push(self.copy(to, item, memo, depth + 1)?);
                }
                let start = to.pool.len() as u32;
                to.pool.extend_from_slice(&items);
                let t = &mut to.lists[n as usize];
                t.start = start;
                t.len = items.len() as u32;
                t.memo = s.memo;
                t.sealed = s.sealed;
                if s.memo != NONE_U32 {
                    memo(s.memo, LVal::List(n));
                }
                LVal::List(n)
            }
            LVal::Dict(d) => {
                if let Some(&n) = self.dicts.get(&d) {
                    return Ok(LVal::Dict(n));
                }
                let s = self.from.dicts[d as usize];
                if s.rec != NONE_U32 || s.seg != NONE_U32 {
                    return Err(Unsupported);
                }
                let LVal::Dict(n) = to.new_dict() else {
                    return Err(Unsupported);
                };
                self.dicts.insert(d, n);
                let mut pairs = Vec::with_capacity(2 * s.len as usize);
                for &(k, v) in self.from.dict_items(d) {
                    pairs.push(self.copy(to, k, memo, depth + 1)?);
                    pairs.push(self.copy(to, v, memo, depth + 1)?);
                }
                to.dict_extend(n, &pairs)?;
                let t = &mut to.dicts[n as usize];
                t.memo = s.memo;
                t.sealed = s.sealed;
                if s.memo != NONE_U32 {
                    memo(s.memo, LVal::Dict(n));
                }
                LVal::Dict(n)
            }
            LVal::Tuple(t) => {
                if let Some(&n) = self.tuples.get(&t) {
                    return Ok(LVal::Tuple(n));
                }
                let mut items = Vec::new();
                for &item in self.from.tuple_items(t) {
                    items.push(self.copy(to, item, memo, depth + 1)?);
                }
                let LVal::Tuple(n) = to.new_tuple(&items)? else {
                    return Err(Unsupported);
                };
                self.tuples.insert(t, n);
                LVal::Tuple(n)
            }
            other => other,
        })
    }
}

/// Which kind of machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A chunk: memo indices from `memo_base` are local, lower ones are other chunks'.
    Chunk,
    /// The stitch: the whole stack; memo kept sparse.
    Stitch,
}

/// One machine and what it built.
pub struct Vm<'a, 'c> {
    pub ctx: &'c Ctx<'a>,
    /// Source id of the records this machine makes.
    pub src: u32,
    mode: Mode,
    pub stack: Vec<LVal>,
    pub marks: Vec<usize>,
    memo_base: u32,
    /// Next memo index a MEMOIZE assigns.
    pub memo_next: u32,
    /// Chunk mode: values of memo indices `memo_base..`.
    memo: Vec<LVal>,
    /// Stitch mode: memo values by index.
    pub smemo: FxHashMap<u32, LVal>,
    ext: ExtCache,
    /// The worker's strings of other chunks (taken from and handed back to its [`Spare`]).
    texts: TextCache<'a>,
    pub a: Arena<'a>,
    pub part: Part,
    pub slots: Vec<Slot>,
    slot_index: FxHashMap<Box<[u32]>, u32>,
    ext_slot: FxHashMap<u32, u32>,
    /// Frames captured from this machine's dicts, by memo index.
    pub frames: FxHashMap<u32, FrameC>,
    pub macros: Vec<Macro>,
    scratch: Vec<u32>,
    scratch_vals: Vec<LVal>,
    /// Keys and values of the dict [`Vm::entry_body`] reads, and of a dict inside it.
    scratch_pairs: Vec<LVal>,
    scratch_pairs_inner: Vec<LVal>,
    /// Block fields of the segment [`Vm::segment_entry`] reads.
    scratch_blocks: Vec<[Option<LVal>; FIELDS]>,
    /// Set while [`Vm::entry_body`] reads a dict inside a dict's list (a segment's blocks).
    inner: bool,
    /// Action of each string, once looked up.
    str_action: Vec<Option<Action>>,
    /// Keys of trace entries that no field reads, with how many entries had each.
    unknown_keys: FxHashMap<&'a str, u64>,
    /// Entries' `pool_id` pairs read without the machine, by memo index (ascending): the
    /// memo holds `Ext` for them, resolved here when this chunk fetches one.
    local_pairs: Vec<(u32, (i64, i64))>,
    /// Offset of the opcode being run.
    pub op_pos: usize,
    /// Where [`Vm::ext_frames`] stopped.
    after_frames: usize,
    /// Frames lists read by [`Vm::ext_frames`], by their bytes up to APPENDS: a stack that
    /// repeats repeats its fetches byte for byte, and its list shares the first one's items
    /// and slot (sealed lists never change).
    frames_seen: FxHashMap<FetchRun<'a>, (u32, u32, u32)>,
    /// Keys of `frames_seen` in the order they came, so that a rollback removes its own.
    frames_log: Vec<FetchRun<'a>>,
    /// Memo values looked up in other chunks (for the work counter).
    lookups: u64,
    /// The chunk that held the last memo index looked up ([`Ctx::resolve_near`]).
    resolve_near: usize,
    /// Segment dicts read here (chunk mode).
    pub segs: Vec<SegRow>,
}

/// What a chunk hands on once it has run.
pub struct ChunkOut<'a> {
    pub macros: Vec<Macro>,
    /// Containers reachable from the macros (strings shared with `a.strs`).
    pub a: Arena<'a>,
    pub part: Part,
    pub slots: Vec<Slot>,
    /// Frames lists stored in this chunk's memo that entries used: (memo index, slot); empty
    /// ones (most of them in files without stacks) only as a bit in `empty_lists`.
    pub memo_lists: Vec<(u32, u32)>,
    /// Bit `i`: memo index `memo_base + i` is an empty frames list.
    pub empty_lists: Vec<u64>,
    /// Memoized tuples of scalars (memo index, items), sorted: later chunks may fetch them
    /// (torch's dumps share one `segment_pool_id` tuple between segments).
    pub tuples: Vec<(u32, Box<[Resolved<'a>]>)>,
    /// Frame dicts captured here: (memo index, frame), sorted.
    pub frames: Vec<(u32, FrameC)>,
    /// How many memo indices the chunk's MEMOIZEs assigned.
    pub memos: u32,
    /// True when the chunk ran up to STOP.
    pub stopped: bool,
    /// Offset just after that STOP.
    pub stop_end: Option<usize>,
    /// Segment dicts read here, by row.
    pub segs: Vec<SegRow>,
    /// Keys of trace entries that no field reads, with how many entries had each.
    pub unknown_keys: FxHashMap<&'a str, u64>,
}

impl<'a, 'c> Vm<'a, 'c> {
    fn new(ctx: &'c Ctx<'a>, src: u32, mode: Mode, memo_base: u32) -> Self {
        let mut slot_index = FxHashMap::default();
        slot_index.insert(Box::<[u32]>::from([]), 0);
        Vm {
            ctx,
            src,
            mode,
            stack: Vec::new(),
            marks: Vec::new(),
            memo_base,
            memo_next: memo_base,
            memo: Vec::new(),
            smemo: FxHashMap::default(),
            ext: ExtCache::default(),
            texts: TextCache::default(),
            a: Arena::default(),
            part: Part::default(),
            // Slot 0 is the empty stack.
            slots: vec![Slot::Content(Box::new([]))],
            slot_index,
            ext_slot: FxHashMap::default(),
            frames: FxHashMap::default(),
            macros: Vec::new(),
            scratch: Vec::new(),
            scratch_vals: Vec::new(),
            scratch_pairs: Vec::new(),
            scratch_pairs_inner: Vec::new(),
            scratch_blocks: Vec::new(),
            inner: false,
            str_action: Vec::new(),
            unknown_keys: FxHashMap::default(),
            local_pairs: Vec::new(),
            op_pos: 0,
            after_frames: 0,
            frames_seen: FxHashMap::default(),
            frames_log: Vec::new(),
            lookups: 0,
            resolve_near: usize::MAX,
            segs: Vec::new(),
        }
    }

    pub fn chunk(ctx: &'c Ctx<'a>, index: usize, spare: &mut Spare<'a>) -> R<Self> {
        let c = &ctx.spans[index];
        let base = ctx.memo_base(index).ok_or(Unsupported)?;
        let mut vm = Vm::new(ctx, index as u32, Mode::Chunk, base);
        // A trace entry takes 60 bytes or more: room for all of them, so the rows are not
        // copied as they grow (untouched room costs no memory).
        vm.part = Part::with_capacity((c.end - c.start) / 60);
        vm.texts = std::mem::take(&mut spare.texts);
        vm.a.lists = std::mem::take(&mut spare.lists);
        vm.a.dicts = std::mem::take(&mut spare.dicts);
        vm.a.tuples = std::mem::take(&mut spare.tuples);
        vm.a.pool = std::mem::take(&mut spare.pool);
        vm.a.dpool = std::mem::take(&mut spare.dpool);
        vm.memo = std::mem::take(&mut spare.memo);
        vm.stack = std::mem::take(&mut spare.stack);
        Ok(vm)
    }

    pub fn stitch(ctx: &'c Ctx<'a>) -> Self {
        Vm::new(ctx, ctx.spans.len() as u32, Mode::Stitch, 0)
    }

    // ----- memo -----

    /// A `pool_id` pair this chunk read without the machine ([`Vm::local_pairs`]), fetched:
    /// made a tuple for this fetch (its memo slot keeps the marker: a rollback of the dict
    /// being read drops the arena's newer tuples).
    #[cold]
    #[inline(never)]
    fn local_pair(&mut self, g: u32) -> R<LVal> {
        let k = self
            .local_pairs
            .binary_search_by_key(&g, |(m, _)| *m)
            .map_err(|_| Unsupported)?;
        let (a, b) = self.local_pairs[k].1;
        self.a.new_tuple(&[LVal::Int(a), LVal::Int(b)])
    }

    #[inline(always)]
    fn memo_get(&mut self, g: u32) -> R<LVal> {
        let v = match self.mode {
            Mode::Chunk => {
                if g < self.memo_base {
                    return Ok(LVal::Ext(g));
                }
                match *self
                    .memo
                    .get((g - self.memo_base) as usize)
                    .ok_or(Unsupported)?
                {
                    LVal::Ext(x) if x == g => self.local_pair(g)?,
                    v => v,
                }
            }
            Mode::Stitch => self.smemo.get(&g).copied().unwrap_or(LVal::Ext(g)),
        };
        // A trace entry fetched again (CPython never does this; the same entry twice in a trace
        // is a memo bomb): the sequential reader decides.
        match v {
            LVal::Rec { .. } | LVal::Seg { .. } => Err(Unsupported),
            LVal::List(l) if self.a.lists[l as usize].dropped => Err(Unsupported),
            LVal::Dict(d)
                if self.a.dicts[d as usize].rec != NONE_U32
                    || self.a.dicts[d as usize].seg != NONE_U32 =>
            {
                Err(Unsupported)
            }
            _ => Ok(v),
        }
    }

    fn memo_put(&mut self, v: LVal) -> R<()> {
        let g = self.memo_next;
        self.memo_next = g.checked_add(1).ok_or(Unsupported)?;
        match v {
            LVal::List(l) => {
                let l = &mut self.a.lists[l as usize];
                if l.memo == NONE_U32 {
                    l.memo = g;
                }
            }
            LVal::Dict(d) => {
                let d = &mut self.a.dicts[d as usize];
                if d.memo == NONE_U32 {
                    d.memo = g;
                }
            }
            _ => {}
        }
        match self.mode {
            Mode::Chunk => self.memo.push(v),
            Mode::Stitch => {
                self.smemo.insert(g, v);
            }
        }
        Ok(())
    }

    /// A value with other chunks' scalars and strings read in; containers stay `Ext`.
    #[inline(always)]
    pub fn deref(&mut self, v: LVal) -> R<LVal> {
        let LVal::Ext(g) = v else { return Ok(v) };
        if let Some(r) = self.ext.get(g) {
            return Ok(r);
        }
        self.deref_slow(g)
    }

    #[cold]
    #[inline(never)]
    fn deref_slow(&mut self, g: u32) -> R<LVal> {
        if let Some(s) = self.texts.get(g) {
            let r = LVal::Str(self.a.intern(s));
            self.ext.put(g, r);
            return Ok(r);
        }
        self.lookups += 1;
        let ctx = self.ctx;
        let r = match ctx.resolve_near(g, &mut self.resolve_near) {
            Resolved::Str(s) => {
                if self.mode == Mode::Chunk {
                    self.texts.put(g, s);
                }
                LVal::Str(self.a.intern(s))
            }
            Resolved::Int(i) => LVal::Int(i),
            Resolved::Big(b) => self.a.big(b),
            Resolved::Float(f) => LVal::Float(f),
            Resolved::None => LVal::None,
            Resolved::Bool(b) => LVal::Bool(b),
            Resolved::Container => LVal::Ext(g),
            Resolved::Unknown => return Err(Unsupported),
        };
        self.ext.put(g, r);
        Ok(r)
    }

    #[inline(always)]
    fn field(&mut self, key: LVal) -> R<u8> {
        Ok(match key {
            LVal::Str(i) => self.a.str_field[i as usize],
            // Other chunks' keys: their field is cached by memo index once looked up.
            LVal::Ext(g) => match self.ext.field(g) {
                Some(f) => f,
                None => match self.deref(key)? {
                    LVal::Str(i) => {
                        let f = self.a.str_field[i as usize];
                        self.ext.put_field(g, f);
                        f
                    }
                    _ => F_NOT_STR,
                },
            },
            _ => F_NOT_STR,
        })
    }

    /// A dict key fetched from another chunk's memo at `p` whose field is known already: the
    /// key (as it fetches: `Ext`), its field and the position after the fetch (the common case,
    /// without decoding the key).
    #[inline(always)]
    fn known_key(&self, data: &[u8], p: usize) -> Option<(LVal, u8, usize)> {
        let (g, np) = memo_index(data, p)?;
        if self.mode != Mode::Chunk || g >= self.memo_base {
            return None;
        }
        self.ext.field(g).map(|f| (LVal::Ext(g), f, np))
    }

    /// The key at `p`, fetched from the memo: its field and the position after it. The common
    /// cases are inlined into the readers: another chunk's key whose field is known, and a
    /// string this chunk stored (the first chunk stores every key); the rest is
    /// [`Vm::fetched_key_slow`].
    #[inline(always)]
    fn fetched_key(&mut self, data: &[u8], p: usize) -> Option<(u8, usize)> {
        if let Some((_, field, np)) = self.known_key(data, p) {
            return Some((field, np));
        }
        if let (Some((g, np)), Mode::Chunk) = (memo_index(data, p), self.mode) {
            let local = g.checked_sub(self.memo_base);
            if let Some(&LVal::Str(i)) = local.and_then(|k| self.memo.get(k as usize)) {
                return Some((self.a.str_field[i as usize], np));
            }
        }
        self.fetched_key_slow(data, p)
    }

    /// A key neither cache knows yet: other chunks' keys seen for the first time, and keys
    /// after a FRAME header (protocol 4 starts a frame every 64 KiB, between any two opcodes).
    #[cold]
    #[inline(never)]
    fn fetched_key_slow(&mut self, data: &[u8], mut p: usize) -> Option<(u8, usize)> {
        if data.get(p) == Some(&op::FRAME) {
            p = self.past_frame_header(p)?;
        }
        let (key, np) = self.fetch(data, p).ok()?;
        Some((self.field(key).ok()?, np))
    }

    // ----- running opcodes -----

    /// Items above the innermost mark.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// Runs the opcodes of `start..end` (chunk mode); `Ok(true)` when STOP was reached.
    pub fn run(&mut self, start: usize, end: usize) -> R<bool> {
        let r = self.run_opcodes(start, end);
        // Work in bytes stepped over, the unit of every opcode walk.
        let stopped_at = match r {
            Ok(false) => end.min(self.ctx.data.len()),
            _ => self.op_pos,
        };
        crate::work::add(stopped_at.saturating_sub(start) as u64 + self.lookups);
        self.lookups = 0;
        r
    }

    fn run_opcodes(&mut self, start: usize, end: usize) -> R<bool> {
        let mut stepped = 0u64;
        let r = self.run_opcodes_counted(start, end, &mut stepped);
        crate::work::add_machine_opcodes(stepped);
        r
    }

    fn run_opcodes_counted(&mut self, start: usize, end: usize, stepped: &mut u64) -> R<bool> {
        let data = self.ctx.data;
        let data = &data[..end.min(data.len())];
        let bytes = data.len().saturating_sub(start);
        let most_stepped = (bytes / STEPPED_PER_BYTE + MIN_STEPPED) as u64;
        let most_macros = bytes / MACROS_PER_BYTE + MIN_MACROS;
        let mut pos = start;
        while pos < data.len() {
            self.op_pos = pos;
            let code = data[pos];
            let n = match scan::op_len(data, pos) {
                scan::Step::Len(n) => n,
                _ => return Err(Unsupported),
            };
            pos += n;
            if code == op::STOP {
                self.raw(self.op_pos, &data[self.op_pos..pos]);
                return Ok(true);
            }
            if code == op::EMPTY_DICT {
                if let Some(end) = self.entry(data, self.op_pos) {
                    pos = end;
                    continue;
                }
            }
            // A FRAME that is not one of the headers between frames (inside a frame's body,
            // which CPython refuses), or a second PROTO of an unknown version: the sequential
            // reader says what is wrong.
            let stray_frame =
                code == op::FRAME && self.ctx.frame_headers.binary_search(&self.op_pos).is_err();
            if stray_frame || (code == op::PROTO && data[self.op_pos + 1] > 5) {
                return Err(Unsupported);
            }
            *stepped += 1;
            if *stepped > most_stepped || self.macros.len() > most_macros {
                return Err(self.ctx.not_for_machines());
            }
            self.step(code, &data[self.op_pos..pos])?;
        }
        Ok(false)
    }

    /// The shape CPython writes for a trace entry, decoded without the stack machine:
    /// `EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`, keys fetched from the memo; values
    /// ints, strings, memo fetches or a frames list of memo fetches. A dict of that shape that
    /// is not an entry (a block or frame dict) becomes the dict the machine would have made.
    /// Returns the position after SETITEMS, or `None`, with nothing changed, to let the
    /// machine run the same bytes.
    fn entry(&mut self, data: &'a [u8], pos: usize) -> Option<usize> {
        if data.get(pos + 1) != Some(&op::MEMOIZE) || data.get(pos + 2) != Some(&op::MARK) {
            return None;
        }
        let saved = (
            self.memo.len(),
            self.memo_next,
            self.a.lists.len(),
            self.a.pool.len(),
            self.a.dicts.len(),
            self.a.dpool.len(),
            self.segs.len(),
            self.frames_log.len(),
            self.a.tuples.len(),
        );
        let rollback = |vm: &mut Self| {
            // Lists whose items are about to go from the pool.
            for key in vm.frames_log.drain(saved.7..) {
                vm.frames_seen.remove(&key);
            }
            vm.memo.truncate(saved.0);
            vm.memo_next = saved.1;
            let pairs = vm.local_pairs.partition_point(|(m, _)| *m < saved.1);
            vm.local_pairs.truncate(pairs);
            vm.a.lists.truncate(saved.2);
            vm.a.pool.truncate(saved.3);
            vm.a.dicts.truncate(saved.4);
            vm.a.dpool.truncate(saved.5);
            vm.segs.truncate(saved.6);
            vm.a.tuples.truncate(saved.8);
        };
        if self.mode == Mode::Chunk && !self.inner {
            // The first key tells a trace entry (`action`) and a segment (`device`) from the
            // block and frame dicts, before anything changes.
            let read = match self.fetched_key(data, pos + 3).map(|(field, _)| field) {
                Some(F_ACTION) => self.trace_entry(data, pos + 3),
                Some(F_DEVICE) => self.segment_entry(data, pos + 3),
                _ => None,
            };
            match read {
                Some(end) => return Some(end),
                None => rollback(self),
            }
        }
        match self.entry_body(data, pos + 3) {
            Ok(Some(end)) => Some(end),
            _ => {
                rollback(self);
                None
            }
        }
    }

    /// The common trace entry, straight to its row: `action` first, then keys fetched from
    /// other chunks' memos with ints, strings, `None`, memo fetches or an empty or fetched
    /// frames list as values. Decodes as [`Vm::record`] does, without the generic values of
    /// [`Vm::entry_pairs`] (a third of the reader's instructions on real dumps). `None` for
    /// anything else (the caller rolls back and reads the dict the general way). The caller
    /// has seen the `action` key at `p`.
    fn trace_entry(&mut self, data: &'a [u8], mut p: usize) -> Option<usize> {
        let dict_slot = self.memo.len();
        self.memo.push(LVal::Rec {
            src: self.src,
            row: NONE_U32,
        });
        self.memo_next += 1;
        // Values by field: texts and frames as fetched, numbers read (`None`: absent or None).
        let mut action = None;
        let mut frames = None;
        let mut texts: [Option<LVal>; 3] = [None; 3];
        let mut nums: [Option<i64>; 6] = [None; 6];
        let mut pool_id = None;
        loop {
            let code = *data.get(p)?;
            if code == op::SETITEMS {
                p += 1;
                break;
            }
            let (field, np) = self.fetched_key(data, p)?;
            p = np;
            let code = *data.get(p)?;
            match field {
                F_ADDR | F_SIZE | F_STREAM | F_DEVICE_FREE | F_TIME => {
                    let (v, len) = match code {
                        op::NONE => (None, 1),
                        _ => small_int(data, p).map(|(v, len)| (Some(v), len))?,
                    };
                    nums[(field - F_ADDR) as usize] = v;
                    p += len;
                }
                // torch 2.12+: a fresh pair of ints on every entry. Memoized as a value to
                // look up when fetched ([`Vm::local_pairs`]): a tuple per entry kept for later
                // chunks would cost millions of allocations (their fetches fall back).
                F_TPOOL => {
                    let (a, la) = small_int(data, p)?;
                    let (b, lb) = small_int(data, p + la)?;
                    p += la + lb;
                    if *data.get(p)? != op::TUPLE2 {
                        return None;
                    }
                    p += 1;
                    if data.get(p) == Some(&op::MEMOIZE) {
                        p += 1;
                        self.local_pairs.push((self.memo_next, (a, b)));
                        self.memo.push(LVal::Ext(self.memo_next));
                        self.memo_next += 1;
                    }
                    pool_id = Some((a, b));
                }
                F_ACTION | F_UM | F_CC | F_IM => {
                    let v = match code {
                        op::BINGET | op::LONG_BINGET => {
                            let (v, np) = self.fetch(data, p).ok()?;
                            p = np;
                            v
                        }
                        // Read here rather than by `entry_pairs`' string arm, which also takes
                        // BINUNICODE: sharing one reader cost 1 % of the instructions (callgrind).
                        op::SHORT_BINUNICODE => {
                            let (v, np) = self.short_str(data, p)?;
                            p = np;
                            v
                        }
                        op::NONE if field != F_ACTION => {
                            p += 1;
                            LVal::None
                        }
                        _ => return None,
                    };
                    match field {
                        F_ACTION => action = Some(v),
                        F_UM => texts[0] = Some(v),
                        F_CC => texts[1] = Some(v),
                        _ => texts[2] = Some(v),
                    }
                }
                F_FRAMES => {
                    frames = Some(match code {
                        op::BINGET | op::LONG_BINGET => {
                            let (v, np) = self.fetch(data, p).ok()?;
                            p = np;
                            v
                        }
                        op::EMPTY_LIST => {
                            let (v, np) = self.frames_list(data, p)?;
                            p = np;
                            v
                        }
                        op::NONE => {
                            p += 1;
                            LVal::None
                        }
                        _ => return None,
                    });
                }
                _ => return None,
            }
        }
        let LVal::Str(action) = self.deref(action?).ok()? else {
            return None;
        };
        let unsigned = |v: Option<i64>| v.map(u64::try_from).transpose().ok();
        let fields = RowFields {
            action,
            addr: unsigned(nums[0])?,
            size: unsigned(nums[1])??,
            stream: unsigned(nums[2])?.unwrap_or(0),
            device_free: unsigned(nums[3])?,
            time_us: nums[4],
            frames,
            user_metadata: texts[0],
            compile_context: texts[1],
            pool_id,
            internal_metadata: texts[2],
        };
        let row = self.push_row(fields).ok()?;
        let rec = LVal::Rec { src: self.src, row };
        self.memo[dict_slot] = rec;
        self.stack.push(rec);
        Some(p)
    }

    /// The position after the FRAME at `p` when it is one of the headers between frames
    /// (a stray FRAME is left to the general path, which refuses it).
    #[cold]
    fn past_frame_header(&self, p: usize) -> Option<usize> {
        self.ctx.frame_headers.binary_search(&p).ok()?;
        Some(p + 9)
    }

    /// A dict of the entry shape at `*p` inside a dict's list (one level deep only: the
    /// reader's own stack must not grow with the input's nesting), read as [`Vm::entry_body`]
    /// reads it; `*p` moves past its SETITEMS. The caller's rollback undoes it on failure.
    fn inner_dict(&mut self, data: &'a [u8], p: &mut usize) -> R<LVal> {
        let q = *p;
        if self.inner || data.get(q + 1) != Some(&op::MEMOIZE) || data.get(q + 2) != Some(&op::MARK)
        {
            return Err(Unsupported);
        }
        self.inner = true;
        let mut pairs = std::mem::take(&mut self.scratch_pairs_inner);
        pairs.clear();
        let r = self.entry_pairs(data, q + 3, &mut pairs);
        self.scratch_pairs_inner = pairs;
        self.inner = false;
        let end = r?.ok_or(Unsupported)?;
        *p = end;
        self.stack.pop().ok_or(Unsupported)
    }

    /// A memo fetch at `p`: the value and the position after it.
    #[inline(always)]
    fn fetch(&mut self, data: &[u8], p: usize) -> R<(LVal, usize)> {
        let (g, np) = memo_index(data, p).ok_or(Unsupported)?;
        Ok((self.memo_get(g)?, np))
    }

    /// Memoizes `v` when a MEMOIZE follows at `*p` (and steps over it).
    fn memoize_if_next(&mut self, data: &[u8], p: &mut usize, v: LVal) {
        if data.get(*p) == Some(&op::MEMOIZE) {
            *p += 1;
            self.memoize_here(v);
        }
    }

    /// A SHORT_BINUNICODE at `p` (and its MEMOIZE): the string and the position after it.
    #[inline(always)]
    fn short_str(&mut self, data: &'a [u8], p: usize) -> Option<(LVal, usize)> {
        let n = *data.get(p + 1)? as usize;
        let raw = data.get(p + 2..p + 2 + n)?;
        let v = LVal::Str(self.a.intern_utf8(raw)?);
        let mut np = p + 2 + n;
        self.memoize_if_next(data, &mut np, v);
        Some((v, np))
    }

    /// A `frames` list made at `p` (EMPTY_LIST, its MEMOIZE): empty, or of frames fetched from
    /// other chunks (see [`Vm::ext_frames`]). The list and the position after it.
    #[inline(always)]
    fn frames_list(&mut self, data: &'a [u8], p: usize) -> Option<(LVal, usize)> {
        let v = self.a.new_list();
        let mut np = p + 1;
        self.memoize_if_next(data, &mut np, v);
        if data.get(np) == Some(&op::MARK) {
            let LVal::List(l) = v else { return None };
            if !self.ext_frames(data, np + 1, l) {
                return None;
            }
            np = self.after_frames;
        }
        Some((v, np))
    }

    fn memoize_here(&mut self, v: LVal) {
        if let LVal::List(l) = v {
            self.a.lists[l as usize].memo = self.memo_next;
        }
        self.memo.push(v);
        self.memo_next += 1;
    }

    fn entry_body(&mut self, data: &'a [u8], p: usize) -> R<Option<usize>> {
        let mut pairs = std::mem::take(&mut self.scratch_pairs);
        pairs.clear();
        let r = self.entry_pairs(data, p, &mut pairs);
        self.scratch_pairs = pairs;
        r
    }

    fn entry_pairs(
        &mut self,
        data: &'a [u8],
        mut p: usize,
        pairs: &mut Vec<LVal>,
    ) -> R<Option<usize>> {
        let dict_slot = self.memo.len();
        let dict_g = self.memo_next;
        // The entry's own memo slot: fetching it (a dict holding itself) is refused, as every
        // fetch of a trace entry is.
        self.memo.push(LVal::Rec {
            src: self.src,
            row: NONE_U32,
        });
        self.memo_next += 1;
        let mut f: [Option<LVal>; 11] = [None; 11];
        // Only a dict with a `blocks` key can be a segment: block and frame dicts skip the try.
        let mut has_blocks = false;
        // A key past the common trace entry's (`pool_id`, `internal_metadata`, unknown ones).
        let mut other_key = false;
        loop {
            let code = *data.get(p).ok_or(Unsupported)?;
            if code == op::SETITEMS {
                p += 1;
                break;
            }
            let (field, key) = match self.known_key(data, p) {
                Some((key, field, np)) => {
                    p = np;
                    (field, key)
                }
                None => {
                    let (key, np) = self.fetch(data, p)?;
                    p = np;
                    (self.field(key)?, key)
                }
            };
            let code = *data.get(p).ok_or(Unsupported)?;
            let arg = |n: usize| data.get(p + 1..p + 1 + n).ok_or(Unsupported);
            let v = match code {
                op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                    let (v, len) = small_int(data, p).ok_or(Unsupported)?;
                    p += len;
                    LVal::Int(v)
                }
                op::SHORT_BINUNICODE | op::BINUNICODE => {
                    let (n, skip) = if code == op::SHORT_BINUNICODE {
                        (arg(1)?[0] as usize, 2)
                    } else {
                        let b = arg(4)?;
                        (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 5)
                    };
                    let raw = data.get(p + skip..p + skip + n).ok_or(Unsupported)?;
                    let i = self.a.intern_utf8(raw).ok_or(Unsupported)?;
                    p += skip + n;
                    let v = LVal::Str(i);
                    self.memoize_if_next(data, &mut p, v);
                    v
                }
                op::BINGET | op::LONG_BINGET => {
                    let (v, np) = self.fetch(data, p)?;
                    p = np;
                    v
                }
                op::EMPTY_LIST => {
                    let v = self.a.new_list();
                    p += 1;
                    self.memoize_if_next(data, &mut p, v);
                    let LVal::List(l) = v else {
                        return Err(Unsupported);
                    };
                    match data.get(p) {
                        Some(&op::MARK) if field == F_FRAMES && self.ext_frames(data, p + 1, l) => {
                            // Up to APPENDS, which `ext_frames` found.
                            p = self.after_frames;
                        }
                        Some(&op::MARK) => {
                            p += 1;
                            let mut items = std::mem::take(&mut self.scratch_vals);
                            items.clear();
                            let mut ok = true;
                            while data.get(p) != Some(&op::APPENDS) {
                                let item = if data.get(p) == Some(&op::EMPTY_DICT) {
                                    self.inner_dict(data, &mut p)
                                } else {
                                    self.fetch(data, p).map(|(item, np)| {
                                        p = np;
                                        item
                                    })
                                };
                                match item {
                                    Ok(item) => items.push(item),
                                    Err(_) => {
                                        ok = false;
                                        break;
                                    }
                                }
                            }
                            let r = if ok {
                                self.a.list_extend(l, &items)
                            } else {
                                Err(Unsupported)
                            };
                            self.scratch_vals = items;
                            r?;
                            p += 1;
                        }
                        Some(&(op::BINGET | op::LONG_BINGET)) => {
                            let (item, np) = self.fetch(data, p)?;
                            if data.get(np) != Some(&op::APPEND) {
                                return Err(Unsupported);
                            }
                            self.a.list_extend(l, &[item])?;
                            p = np + 1;
                        }
                        Some(&op::EMPTY_DICT) => {
                            // One dict, then APPEND: a segment's only block.
                            let item = self.inner_dict(data, &mut p)?;
                            if data.get(p) != Some(&op::APPEND) {
                                return Err(Unsupported);
                            }
                            self.a.list_extend(l, &[item])?;
                            p += 1;
                        }
                        _ => {}
                    }
                    v
                }
                op::NEWTRUE => {
                    p += 1;
                    LVal::Bool(true)
                }
                op::NEWFALSE => {
                    p += 1;
                    LVal::Bool(false)
                }
                op::NONE => {
                    p += 1;
                    LVal::None
                }
                _ => return Err(Unsupported),
            };
            if field <= F_CC {
                f[field as usize] = Some(v);
            } else {
                other_key = true;
            }
            has_blocks |= field == F_BLOCKS;
            // The pairs make a dict only when there is no action (a trace entry has it first).
            if f[F_ACTION as usize].is_none() {
                pairs.push(key);
                pairs.push(v);
            }
        }
        if f[F_ACTION as usize].is_none() {
            // What EMPTY_DICT, MEMOIZE and SETITEMS would have made (`try_record` finds no
            // action either): in real dumps the block and frame dicts of the segments, a tenth
            // of the bytes, which opcode by opcode were a third of the chunk stage's time.
            let LVal::Dict(d) = self.a.new_dict() else {
                return Err(Unsupported);
            };
            self.a.dicts[d as usize].memo = dict_g;
            self.a.dict_extend(d, pairs)?;
            self.memo[dict_slot] = LVal::Dict(d);
            let v = if has_blocks {
                self.completed_dict(d)
            } else {
                LVal::Dict(d)
            };
            self.stack.push(v);
            return Ok(Some(p));
        }
        if self.inner || other_key {
            // A trace entry inside a dict: the machine decides (a rollback would leave its row).
            // One with other keys: the machine reads and counts them (`try_record`).
            return Err(Unsupported);
        }
        let row = self.record(&f)?;
        let rec = LVal::Rec { src: self.src, row };
        self.memo[dict_slot] = rec;
        self.stack.push(rec);
        Ok(Some(p))
    }

    /// An entry's frames list whose items are all frame dicts stored by earlier chunks (the
    /// common case: a program's frames repeat): fetches from `p` up to APPENDS, read straight
    /// into list `l` and its stack slot, without the generic list and slot steps. False, with
    /// nothing changed, for anything else.
    fn ext_frames(&mut self, data: &'a [u8], p: usize, l: u32) -> bool {
        if self.mode != Mode::Chunk || self.a.lists[l as usize].len != 0 {
            return false;
        }
        // Seen before: the same bytes are the same fetches.
        let (run, seen) = match self.closing_run(data, p) {
            Some((run, seen)) => (run, Some(seen)),
            None => match fetches_until_appends(data, p) {
                Some(run) => (run, self.frames_seen.get(&run).copied()),
                None => return false,
            },
        };
        let bytes = run.bytes;
        let end = p + bytes.len() + 1;
        if let Some((start, len, slot)) = seen {
            let list = &mut self.a.lists[l as usize];
            list.start = start;
            list.len = len;
            list.stack = slot;
            list.sealed = true;
            self.after_frames = end;
            return true;
        }
        let mut refs = std::mem::take(&mut self.scratch);
        refs.clear();
        let mut readable = true;
        let mut local = false;
        let mut q = 0;
        while let Some((g, next)) = memo_index(bytes, q) {
            // A frame dict this chunk stored (the first pass over a trace defines its frames
            // as it goes): captured as `content_slot` captures it.
            if g >= self.memo_base && !self.local_frame(g) {
                readable = false;
                break;
            }
            local |= g >= self.memo_base;
            refs.push(g);
            q = next;
        }
        let ok = readable && self.a.pool.len() + refs.len() < u32::MAX as usize;
        if ok {
            // No frames: no slot (as `content_slot` gives).
            let slot = if refs.is_empty() {
                0
            } else {
                self.slot_of(&refs)
            };
            // The items stay readable as a list (for anything else that fetches it): as
            // fetched, other chunks' frames by memo index and this chunk's as its dicts.
            let start = self.a.pool.len() as u32;
            if local {
                for &g in refs.iter() {
                    let v = match g >= self.memo_base {
                        true => self.memo[(g - self.memo_base) as usize],
                        false => LVal::Ext(g),
                    };
                    self.a.pool.push(v);
                }
            } else {
                self.a.pool.extend(refs.iter().map(|&g| LVal::Ext(g)));
            }
            let list = &mut self.a.lists[l as usize];
            list.start = start;
            list.len = refs.len() as u32;
            list.stack = slot;
            list.sealed = true;
            self.after_frames = end;
            self.frames_seen
                .insert(run, (start, refs.len() as u32, slot));
            self.frames_log.push(run);
        }
        self.scratch = refs;
        ok
    }

    /// A frames list that closes its trace entry, when it repeats one seen before (with what
    /// `frames_seen` holds of it): torch writes `frames` last, so APPENDS and the entry's
    /// SETITEMS follow it. Those two bytes are found by `memchr` (a few instructions per 32
    /// bytes, where walking the fetches costs a few per fetch), and the bytes before them are
    /// taken as the list only when they equal a list read before, which proves they are whole
    /// fetches that end there. Anything else (a new list, one followed by another key, an
    /// APPENDS byte inside a memo index that misleads the search) is scanned opcode by opcode.
    #[inline]
    fn closing_run(&self, data: &'a [u8], p: usize) -> Option<(FetchRun<'a>, (u32, u32, u32))> {
        let window = data.get(p..data.len().min(p + CLOSING_WINDOW))?;
        let end = memchr::memchr_iter(op::APPENDS, window)
            .find(|&c| window.get(c + 1) == Some(&op::SETITEMS))?;
        let run = hash_fetches(&window[..end]);
        Some((run, *self.frames_seen.get(&run)?))
    }

    /// Runs one opcode recorded by a chunk (stitch mode), its bytes given when the chunk kept
    /// them (`inline` empty: read from `pos`). Returns the root at STOP.
    pub fn exec_at(&mut self, pos: usize, memo: u32, inline: &[u8]) -> R<Option<LVal>> {
        let data = self.ctx.data;
        self.op_pos = pos;
        // The chunk's pages were let go after it ran: a short opcode is read back with a
        // system call rather than by mapping the pages around it again.
        let mut buf = [0u8; 16];
        let (code, ins): (u8, &[u8]) = if let Some(&code) = inline.first() {
            (code, inline)
        } else {
            let got = (self.ctx.peek)(pos, &mut buf);
            match scan::op_len(&buf[..got], 0) {
                scan::Step::Len(n) => (buf[0], &buf[..n]),
                _ => match scan::op_len(data, pos) {
                    scan::Step::Len(n) => (data[pos], &data[pos..pos + n]),
                    _ => return Err(Unsupported),
                },
            }
        };
        if code == op::STOP {
            // Marks left open at STOP are the sequential reader's to report.
            if !self.marks.is_empty() {
                return Err(Unsupported);
            }
            let root = self.pop()?;
            return Ok(Some(root));
        }
        self.memo_next = memo;
        self.step(code, ins)?;
        Ok(None)
    }

    /// Records the opcode at `pos` (its bytes `ins`) for the stitch, after the values pushed so
    /// far.
    fn raw(&mut self, pos: usize, ins: &[u8]) {
        self.flush();
        let mut bytes = [0u8; RAW_INLINE];
        let len = if ins.len() <= RAW_INLINE && KEEP_RAW_BYTES.load(Ordering::Relaxed) {
            bytes[..ins.len()].copy_from_slice(ins);
            ins.len() as u8
        } else {
            0
        };
        self.macros.push(Macro::Raw {
            pos,
            memo: self.memo_next,
            len,
            bytes,
        });
    }

    /// Hands the local stack (values and marks) to the stitch.
    pub fn flush(&mut self) {
        let mut m = 0;
        for i in 0..self.stack.len() {
            while m < self.marks.len() && self.marks[m] == i {
                self.macros.push(Macro::Mark);
                m += 1;
            }
            let v = self.stack[i];
            match v {
                LVal::List(l) => self.a.lists[l as usize].flushed = true,
                LVal::Dict(d) => self.a.dicts[d as usize].flushed = true,
                _ => {}
            }
            let merged = match (self.macros.last_mut(), v) {
                (Some(Macro::Push(LVal::Recs { src, start, len })), LVal::Rec { src: s2, row })
                    if *src == s2 && *start + *len == row =>
                {
                    *len += 1;
                    true
                }
                _ => false,
            };
            if !merged {
                let v = match v {
                    LVal::Rec { src, row } => LVal::Recs {
                        src,
                        start: row,
                        len: 1,
                    },
                    other => other,
                };
                self.macros.push(Macro::Push(v));
            }
        }
        while m < self.marks.len() {
            self.macros.push(Macro::Mark);
            m += 1;
        }
        self.stack.clear();
        self.marks.clear();
    }

    /// Chunk mode: does the opcode need `need` items (and a target under them) from below
    /// the chunk's start? Then it is recorded for the stitch instead.
    fn outer(&self, need: usize, target: bool) -> bool {
        if self.mode == Mode::Stitch {
            return false;
        }
        let have = self.stack.len() - self.floor();
        if have < need {
            return true;
        }
        if target {
            let below = self.stack.len() - need;
            if below == 0 {
                return true;
            }
            return matches!(self.stack[below - 1], LVal::Ext(_));
        }
        false
    }

    fn pop(&mut self) -> R<LVal> {
        if self.stack.len() <= self.floor() {
            return Err(Unsupported);
        }
        self.stack.pop().ok_or(Unsupported)
    }

    /// Runs the opcode `ins` (its bytes, which may be a copy: strings are taken from the
    /// input at `op_pos`, to live as long as it).
    fn step(&mut self, code: u8, ins: &[u8]) -> R<()> {
        match code {
            op::FRAME | op::PROTO => {}
            op::MARK => {
                if self.marks.len() >= MAX_MARKS {
                    return Err(self.ctx.not_for_machines());
                }
                self.marks.push(self.stack.len())
            }
            op::NONE => self.stack.push(LVal::None),
            op::NEWTRUE => self.stack.push(LVal::Bool(true)),
            op::NEWFALSE => self.stack.push(LVal::Bool(false)),
            op::BININT1 => self.stack.push(LVal::Int(ins[1] as i64)),
            op::BININT2 => self
                .stack
                .push(LVal::Int(u16::from_le_bytes([ins[1], ins[2]]) as i64)),
            op::BININT => {
                self.stack.push(LVal::Int(
                    i32::from_le_bytes([ins[1], ins[2], ins[3], ins[4]]) as i64,
                ))
            }
            op::LONG1 => {
                let raw = &ins[2..];
                if raw.len() > 16 {
                    return Err(Unsupported);
                }
                let v = le_signed(raw);
                let v = match i64::try_from(v) {
                    Ok(i) => LVal::Int(i),
                    Err(_) => self.a.big(v),
                };
                self.stack.push(v);
            }
            op::BINFLOAT => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&ins[1..9]);
                self.stack.push(LVal::Float(f64::from_be_bytes(b)));
            }
            op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                let skip = match code {
                    op::SHORT_BINUNICODE => 2,
                    op::BINUNICODE => 5,
                    _ => 9,
                };
                // Invalid UTF-8 (or CPython's surrogate escapes) is the sequential reader's job.
                let at = self.op_pos;
                let raw = self
                    .ctx
                    .data
                    .get(at + skip..at + ins.len())
                    .ok_or(Unsupported)?;
                let i = self.a.intern_utf8(raw).ok_or(Unsupported)?;
                self.stack.push(LVal::Str(i));
            }
            op::EMPTY_LIST => {
                let v = self.a.new_list();
                self.stack.push(v);
            }
            op::EMPTY_DICT => {
                let v = self.a.new_dict();
                self.stack.push(v);
            }
            op::EMPTY_TUPLE => {
                let v = self.a.new_tuple(&[])?;
                self.stack.push(v);
            }
            op::BINGET => {
                let v = self.memo_get(ins[1] as u32)?;
                self.stack.push(v);
            }
            op::LONG_BINGET => {
                let v = self.memo_get(u32::from_le_bytes([ins[1], ins[2], ins[3], ins[4]]))?;
                self.stack.push(v);
            }
            op::MEMOIZE => {
                if self.outer(1, false) {
                    self.raw(self.op_pos, ins);
                    // The stitch stores the value; here it is another chunk's.
                    self.memo.push(LVal::Ext(self.memo_next));
                    self.memo_next += 1;
                    return Ok(());
                }
                let v = self.target()?;
                self.memo_put(v)?;
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = (code - op::TUPLE1 + 1) as usize;
                if self.outer(n, false) {
                    self.raw(self.op_pos, ins);
                    return Ok(());
                }
                let from = self.stack.len().checked_sub(n).ok_or(Unsupported)?;
                if from < self.floor() {
                    return Err(Unsupported);
                }
                let t = self.a.new_tuple(&self.stack[from..])?;
                self.stack.truncate(from);
                self.stack.push(t);
            }
            op::TUPLE => {
                let Some(m) = self.marks.pop() else {
                    if self.mode == Mode::Chunk {
                        self.raw(self.op_pos, ins);
                        return Ok(());
                    }
                    return Err(Unsupported);
                };
                let t = self.a.new_tuple(&self.stack[m..])?;
                self.stack.truncate(m);
                self.stack.push(t);
            }
            op::APPEND => {
                if self.outer(1, true) {
                    self.raw(self.op_pos, ins);
                    return Ok(());
                }
                let item = self.pop()?;
                let LVal::List(l) = self.target()? else {
                    return Err(Unsupported);
                };
                self.a.list_extend(l, &[item])?;
            }
            op::APPENDS | op::SETITEMS => {
                let m = match self.marks.last() {
                    Some(&m) => m,
                    None if self.mode == Mode::Chunk => {
                        self.raw(self.op_pos, ins);
                        return Ok(());
                    }
                    None => return Err(Unsupported),
                };
                if self.mode == Mode::Chunk && (m == 0 || matches!(self.stack[m - 1], LVal::Ext(_)))
                {
                    self.raw(self.op_pos, ins);
                    return Ok(());
                }
                self.marks.pop();
                if m == 0 || m <= self.floor() {
                    return Err(Unsupported);
                }
                let target = self.stack[m - 1];
                if code == op::APPENDS {
                    let LVal::List(l) = target else {
                        return Err(Unsupported);
                    };
                    let stack = std::mem::take(&mut self.stack);
                    let r = self.a.list_extend(l, &stack[m..]);
                    self.stack = stack;
                    r?;
                    self.stack.truncate(m);
                } else {
                    let LVal::Dict(d) = target else {
                        return Err(Unsupported);
                    };
                    self.set_items(d, m)?;
                }
            }
            op::SETITEM => {
                if self.outer(2, true) {
                    self.raw(self.op_pos, ins);
                    return Ok(());
                }
                let from = self.stack.len().checked_sub(2).ok_or(Unsupported)?;
                if from == 0 || from <= self.floor() {
                    return Err(Unsupported);
                }
                let LVal::Dict(d) = self.stack[from - 1] else {
                    return Err(Unsupported);
                };
                self.set_items(d, from)?;
            }
            _ => return Err(Unsupported),
        }
        Ok(())
    }

    fn target(&self) -> R<LVal> {
        if self.stack.len() <= self.floor() {
            return Err(Unsupported);
        }
        self.stack.last().copied().ok_or(Unsupported)
    }

    /// SETITEM(S) on dict `d` with the pairs `stack[from..]`. A fresh dict with an `action` key
    /// becomes a trace record; any other dict keeps its items.
    fn set_items(&mut self, d: u32, from: usize) -> R<()> {
        let n = self.stack.len() - from;
        if !n.is_multiple_of(2) {
            return Err(Unsupported);
        }
        let s = self.a.dicts[d as usize];
        if s.sealed || s.flushed || s.rec != NONE_U32 {
            return Err(Unsupported);
        }
        if s.len == 0 {
            if let Some(row) = self.try_record(from)? {
                self.stack.truncate(from);
                let ds = &mut self.a.dicts[d as usize];
                ds.rec = row;
                ds.sealed = true;
                if let Some(top) = self.stack.last_mut() {
                    if *top == LVal::Dict(d) {
                        *top = LVal::Rec { src: self.src, row };
                    }
                }
                return Ok(());
            }
        }
        let stack = std::mem::take(&mut self.stack);
        let r = self.a.dict_extend(d, &stack[from..]);
        self.stack = stack;
        r?;
        self.stack.truncate(from);
        if s.len == 0 {
            let v = self.completed_dict(d);
            if let Some(top) = self.stack.last_mut() {
                if *top == LVal::Dict(d) {
                    *top = v;
                }
            }
        }
        Ok(())
    }

    /// Dict `d`, just filled by its first SETITEMS, as the value that stands for it: a
    /// segment row when it is a segment the decoder would accept.
    fn completed_dict(&mut self, d: u32) -> LVal {
        match self.try_segment(d) {
            Some(row) => {
                let ds = &mut self.a.dicts[d as usize];
                ds.seg = row;
                ds.sealed = true;
                LVal::Seg { src: self.src, row }
            }
            None => LVal::Dict(d),
        }
    }

    fn u64_field(&mut self, v: Option<LVal>) -> R<Option<u64>> {
        match v.map(|v| self.deref(v)).transpose()? {
            None | Some(LVal::None) => Ok(None),
            Some(LVal::Int(i)) => u64::try_from(i).map(Some).map_err(|_| Unsupported),
            Some(LVal::Big(b)) => u64::try_from(self.a.bigs[b as usize])
                .map(Some)
                .map_err(|_| Unsupported),
            Some(_) => Err(Unsupported),
        }
    }

    fn opt_text(&mut self, v: Option<LVal>) -> R<Option<TextId>> {
        match v.map(|v| self.deref(v)).transpose()? {
            Some(LVal::Str(i)) => Ok(Some(TextId(i))),
            _ => Ok(None),
        }
    }

    /// The decoder's `trace_entry` on the pairs `stack[from..]`: `None` when there is no
    /// `action` key (not a trace entry), `Unsupported` where the decoder would fail.
    fn try_record(&mut self, from: usize) -> R<Option<u32>> {
        // The fields up to `F_CC` by code, then `pool_id` and `internal_metadata`.
        let mut f: [Option<LVal>; 11] = [None; 11];
        let mut i = from;
        let mut unknown: Option<(usize, usize)> = None;
        while i + 1 < self.stack.len() {
            let (k, v) = (self.stack[i], self.stack[i + 1]);
            let field = self.field(k)?;
            match field {
                0..=F_CC => f[field as usize] = Some(v),
                F_TPOOL => f[9] = Some(v),
                F_IM => f[10] = Some(v),
                F_FWD | F_NOT_STR => {}
                _ => {
                    unknown.get_or_insert((i, i));
                    if let Some(u) = unknown.as_mut() {
                        u.1 = i;
                    }
                }
            }
            i += 2;
        }
        if f[F_ACTION as usize].is_none() {
            return Ok(None);
        }
        // Keys this version does not read: counted by name (the report names them).
        if let Some((first, last)) = unknown {
            for j in (first..=last).step_by(2) {
                if let LVal::Str(k) = self.stack[j] {
                    if !is_entry_key(self.a.str_field[k as usize]) {
                        *self
                            .unknown_keys
                            .entry(self.a.strs[k as usize])
                            .or_default() += 1;
                    }
                }
            }
        }
        self.record(&f).map(Some)
    }

    /// A trace record from the values of its keys (indexed by `F_*`); `action` is present.
    fn record(&mut self, f: &[Option<LVal>; 11]) -> R<u32> {
        let action_value = f[F_ACTION as usize].ok_or(Unsupported)?;
        let LVal::Str(action) = self.deref(action_value)? else {
            return Err(Unsupported);
        };
        let time_us = match f[F_TIME as usize].map(|v| self.deref(v)).transpose()? {
            None | Some(LVal::None) => None,
            Some(LVal::Int(t)) => Some(t),
            // Outside i64: an unknown time (as the sequential decoder reads it).
            Some(LVal::Big(_)) => None,
            Some(_) => return Err(Unsupported),
        };
        let fields = RowFields {
            action,
            addr: self.u64_field(f[F_ADDR as usize])?,
            size: self.u64_field(f[F_SIZE as usize])?.ok_or(Unsupported)?,
            stream: self.u64_field(f[F_STREAM as usize])?.unwrap_or(0),
            device_free: self.u64_field(f[F_DEVICE_FREE as usize])?,
            time_us,
            frames: f[F_FRAMES as usize],
            user_metadata: f[F_UM as usize],
            compile_context: f[F_CC as usize],
            pool_id: self.pool_pair(f[9])?,
            internal_metadata: f[10],
        };
        self.push_row(fields)
    }

    /// The row of a trace entry read by [`Vm::record`] or [`Vm::trace_entry`] (the decoder's
    /// `trace_entry` rules from here on are the same for both).
    #[inline(always)]
    fn push_row(&mut self, f: RowFields) -> R<u32> {
        let action = self.action_of(f.action);
        let addr = match (f.addr, action) {
            (Some(a), _) => a,
            (None, Action::Oom | Action::Snapshot | Action::Other) => 0,
            (None, _) => return Err(Unsupported),
        };
        let frames = self.stack_slot(f.frames)?;
        let user_metadata = self.opt_text(f.user_metadata)?;
        let compile_context = self.opt_text(f.compile_context)?;
        let internal_metadata = self.opt_text(f.internal_metadata)?;
        let row = self.part.len();
        if row >= NONE_U32 as usize - 1 {
            return Err(Unsupported);
        }
        self.part.push(&TraceEntry {
            action,
            action_text: (action == Action::Other).then_some(TextId(f.action)),
            addr,
            size: f.size,
            stream: f.stream,
            device_free: f.device_free,
            time_us: f.time_us,
            frames: StackId(frames),
            user_metadata,
            compile_context,
            pool_id: f.pool_id,
            internal_metadata,
        });
        Ok(row as u32)
    }

    /// A trace entry's `pool_id` (the decoder's `pool_pair`): a tuple or list of two ints of
    /// this chunk. Another chunk's tuple (torch writes a fresh one per entry) is left to the
    /// sequential reader.
    fn pool_pair(&mut self, v: Option<LVal>) -> R<Option<(i64, i64)>> {
        let v = match v {
            None => return Ok(None),
            Some(v) => self.deref(v)?,
        };
        let items: &[LVal] = match v {
            LVal::None => return Ok(None),
            LVal::Tuple(t) => self.a.tuple_items(t),
            LVal::List(l) if !self.a.lists[l as usize].flushed => self.a.list_items(l),
            _ => return Err(Unsupported),
        };
        match *items {
            [LVal::Int(a), LVal::Int(b)] => Ok(Some((a, b))),
            _ => Err(Unsupported),
        }
    }

    fn action_of(&mut self, s: u32) -> Action {
        let i = s as usize;
        if self.str_action.len() <= i {
            self.str_action.resize(i + 1, None);
        }
        *self.str_action[i].get_or_insert_with(|| Action::from_name(self.a.strs[i]))
    }

    /// Stack slot of a `frames` value (the decoder's `stack`).
    pub fn stack_slot(&mut self, v: Option<LVal>) -> R<u32> {
        match v {
            None | Some(LVal::None) => Ok(0),
            // Another chunk's list (its value is not read here: that would mean walking the
            // chunk that stored it); the stitch resolves it.
            Some(LVal::Ext(g)) => {
                if let Some(&s) = self.ext_slot.get(&g) {
                    return Ok(s);
                }
                let s = self.slots.len() as u32;
                self.slots.push(Slot::ExtList(g));
                self.ext_slot.insert(g, s);
                Ok(s)
            }
            Some(LVal::List(l)) => {
                let s = self.a.lists[l as usize];
                if s.stack != NONE_U32 {
                    return Ok(s.stack);
                }
                let slot = self.content_slot(LVal::List(l))?;
                let s = &mut self.a.lists[l as usize];
                s.stack = slot;
                s.sealed = true;
                Ok(slot)
            }
            Some(v @ LVal::Tuple(_)) => self.content_slot(v),
            Some(_) => Err(Unsupported),
        }
    }

    /// Slot of the frames of list or tuple `v`, deduplicated by content.
    fn content_slot(&mut self, v: LVal) -> R<u32> {
        let empty = match v {
            LVal::List(l) => self.a.list_items(l).is_empty(),
            LVal::Tuple(t) => self.a.tuple_items(t).is_empty(),
            _ => false,
        };
        if empty {
            return Ok(0);
        }
        let mut vals = std::mem::take(&mut self.scratch_vals);
        vals.clear();
        match v {
            LVal::List(l) => vals.extend_from_slice(self.a.list_items(l)),
            LVal::Tuple(t) => vals.extend_from_slice(self.a.tuple_items(t)),
            _ => return Err(Unsupported),
        }
        let mut refs = std::mem::take(&mut self.scratch);
        refs.clear();
        let mut failed = false;
        for &v in &vals {
            match self.frame_ref(v) {
                Ok(g) => refs.push(g),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        self.scratch_vals = vals;
        if failed {
            self.scratch = refs;
            return Err(Unsupported);
        }
        let slot = self.slot_of(&refs);
        self.scratch = refs;
        Ok(slot)
    }

    /// The stack slot of frames `refs` (memo indices of frame dicts), made on first sight.
    fn slot_of(&mut self, refs: &[u32]) -> u32 {
        if let Some(&s) = self.slot_index.get(refs) {
            return s;
        }
        let s = self.slots.len() as u32;
        let boxed: Box<[u32]> = refs.into();
        self.slots.push(Slot::Content(boxed.clone()));
        self.slot_index.insert(boxed, s);
        s
    }

    /// Whether memo index `g` of this chunk holds a frame dict (captured now, as
    /// [`Vm::frame_ref`] does).
    fn local_frame(&mut self, g: u32) -> bool {
        match self.memo_get(g) {
            Ok(v @ LVal::Dict(d)) if self.a.dicts[d as usize].memo == g => {
                self.frame_ref(v).is_ok()
            }
            _ => false,
        }
    }

    /// A frame dict as the memo index it was stored under (its identity across chunks); a
    /// local dict's content is captured now.
    fn frame_ref(&mut self, v: LVal) -> R<u32> {
        match v {
            LVal::Ext(g) => Ok(g),
            LVal::Dict(d) => {
                let s = self.a.dicts[d as usize];
                if s.memo == NONE_U32 || s.rec != NONE_U32 {
                    return Err(Unsupported);
                }
                if !self.frames.contains_key(&s.memo) {
                    let f = self.capture_frame(d)?;
                    self.frames.insert(s.memo, f);
                    self.a.dicts[d as usize].sealed = true;
                }
                Ok(s.memo)
            }
            _ => Err(Unsupported),
        }
    }

    /// The decoder's `frame` on dict `d`.
    pub fn capture_frame(&mut self, d: u32) -> R<FrameC> {
        let (mut name, mut filename, mut line) = (None, None, None);
        let items: Vec<(LVal, LVal)> = self.a.dict_items(d).to_vec();
        for (k, v) in items {
            match self.field(k)? {
                F_NAME => name = Some(v),
                F_FILENAME => filename = Some(v),
                F_LINE => line = Some(v),
                _ => {}
            }
        }
        let text = |vm: &mut Self, v: Option<LVal>| -> R<u32> {
            match v.map(|v| vm.deref(v)).transpose()? {
                None => Ok(vm.a.intern("??")),
                Some(LVal::Str(i)) => Ok(i),
                Some(_) => Err(Unsupported),
            }
        };
        let name = text(self, name)?;
        let filename = text(self, filename)?;
        let line = match line.map(|v| self.deref(v)).transpose()? {
            None | Some(LVal::None) => 0,
            Some(LVal::Int(i)) => i,
            // A line outside i64 (torch's 2^64 - 1 for unresolved C++ frames) is no line.
            Some(LVal::Big(_)) => 0,
            Some(_) => return Err(Unsupported),
        };
        Ok(FrameC {
            name,
            filename,
            line,
        })
    }

    /// Items a stack value stands for in a list (runs of records count each record).
    fn item_count(v: LVal) -> usize {
        match v {
            LVal::Recs { len, .. } => len as usize,
            _ => 1,
        }
    }

    /// Stitch mode: the path of the value being built when the input ends (the sequential
    /// reader's `inside`, on the same state).
    pub fn inside(&self) -> Option<String> {
        let levels: Vec<Level> = self
            .marks
            .iter()
            .map(|&m| {
                let container = match m.checked_sub(1).and_then(|i| self.stack.get(i)) {
                    Some(LVal::List(l)) => Holder::List(
                        self.a
                            .list_items(*l)
                            .iter()
                            .map(|v| Self::item_count(*v))
                            .sum(),
                    ),
                    Some(LVal::Dict(_)) => Holder::Dict,
                    _ => Holder::Other,
                };
                Level { mark: m, container }
            })
            .collect();
        inside_path(&levels, self)
    }

    /// Stitch mode: closes what a cut left open, as `pickle::parse_salvage` does; returns the
    /// root (the outermost value).
    pub fn close_for_salvage(&mut self) -> R<LVal> {
        while let Some(m) = self.marks.pop() {
            let mut items = self.stack.split_off(m.min(self.stack.len()));
            let Some(below) = m.checked_sub(1) else {
                continue;
            };
            match self.stack.get(below).copied() {
                Some(LVal::List(l)) => {
                    while let Some(v) = items.last() {
                        let empty = match v {
                            LVal::List(x) => self.a.list_items(*x).is_empty(),
                            LVal::Dict(d) => {
                                !self.a.dict_is_record(*d) && self.a.dict_items(*d).is_empty()
                            }
                            _ => false,
                        };
                        if !empty {
                            break;
                        }
                        items.pop();
                    }
                    self.a.list_extend(l, &items)?;
                }
                Some(LVal::Dict(d)) if below == 0 => {
                    // `[…, key, list, item]`: the item awaited its APPEND.
                    if items.len() % 2 == 1 && items.len() >= 3 {
                        if let LVal::List(l) = items[items.len() - 2] {
                            if let Some(last) = items.pop() {
                                let empty = match last {
                                    LVal::List(x) => self.a.list_items(x).is_empty(),
                                    LVal::Dict(x) => {
                                        !self.a.dict_is_record(x) && self.a.dict_items(x).is_empty()
                                    }
                                    _ => false,
                                };
                                if !empty {
                                    self.a.list_extend(l, &[last])?;
                                }
                            }
                        }
                    }
                    let n = items.len() / 2 * 2;
                    self.a.dict_extend(d, &items[..n])?;
                }
                Some(LVal::Dict(_)) => self.stack.truncate(below),
                _ => {}
            }
        }
        self.stack.first().copied().ok_or(Unsupported)
    }

    /// Keys of trace entries that no field reads (the stitch's own count).
    pub fn unknown_keys(&self) -> impl Iterator<Item = (&&'a str, &u64)> {
        self.unknown_keys.iter()
    }

    /// Chunk mode: the compact result (what the stitch and the resolution need).
    pub fn finish(mut self, spare: &mut Spare<'a>, stopped: bool) -> R<ChunkOut<'a>> {
        self.flush();
        let memos = self.memo_next - self.memo_base;
        let mut from = std::mem::take(&mut self.a);
        let mut out = Arena::default();
        let mut copier = Copier::new(&from, true);
        for m in &mut self.macros {
            if let Macro::Push(v) = m {
                *v = match copier.copy(&mut out, *v, &mut |_, _| {}, 0) {
                    Ok(v) => v,
                    Err(_) if copier.too_deep => return Err(self.ctx.not_for_machines()),
                    Err(e) => return Err(e),
                };
            }
        }
        drop(copier);
        let mut memo_lists = Vec::new();
        let mut tuples = Vec::new();
        let mut empty_lists = vec![0u64; self.memo.len().div_ceil(64)];
        for (i, v) in self.memo.iter().enumerate() {
            if let LVal::Tuple(t) = v {
                if let Some(items) = self.scalar_items(&from, *t) {
                    tuples.push((self.memo_base + i as u32, items));
                }
            }
            if let LVal::List(l) = v {
                let s = from.lists[*l as usize];
                if s.stack != NONE_U32 && s.memo == self.memo_base + i as u32 {
                    if s.stack == 0 {
                        empty_lists[i / 64] |= 1 << (i % 64);
                    } else {
                        memo_lists.push((s.memo, s.stack));
                    }
                }
            }
        }
        out.strs = std::mem::take(&mut from.strs);
        out.bigs = std::mem::take(&mut from.bigs);
        spare.keep(from, self.memo, self.stack);
        spare.texts = std::mem::take(&mut self.texts);
        let mut frames: Vec<(u32, FrameC)> = self.frames.into_iter().collect();
        frames.sort_unstable_by_key(|(g, _)| *g);
        let mut part = self.part;
        part.seal();
        Ok(ChunkOut {
            macros: self.macros,
            a: out,
            part,
            slots: self.slots,
            memo_lists,
            empty_lists,
            tuples,
            frames,
            memos,
            stopped,
            stop_end: None,
            segs: self.segs,
            unknown_keys: self.unknown_keys,
        })
    }

    /// The items of tuple `t` of arena `a` when all are scalars or strings (a segment's
    /// `segment_pool_id`, shared by all segments of a pool).
    fn scalar_items(&self, a: &Arena<'a>, t: u32) -> Option<Box<[Resolved<'a>]>> {
        let items = a.tuple_items(t);
        if items.len() > MAX_SHARED_TUPLE {
            return None;
        }
        let scalar = |v: &LVal| -> Option<Resolved<'a>> {
            Some(match *v {
                LVal::None => Resolved::None,
                LVal::Bool(b) => Resolved::Bool(b),
                LVal::Int(i) => Resolved::Int(i),
                LVal::Big(b) => Resolved::Big(*a.bigs.get(b as usize)?),
                LVal::Float(f) => Resolved::Float(f),
                LVal::Str(i) => Resolved::Str(a.strs.get(i as usize)?),
                LVal::Ext(g) => match self.ctx.resolve(g) {
                    Resolved::Container | Resolved::Unknown => return None,
                    r => r,
                },
                _ => return None,
            })
        };
        items.iter().map(scalar).collect()
    }
}

/// Longest tuple of scalars that later chunks may fetch from a chunk's memo.
const MAX_SHARED_TUPLE: usize = 8;

impl StackView for Vm<'_, '_> {
    fn key(&self, i: usize) -> Option<String> {
        match self.stack.get(i) {
            Some(LVal::Str(s)) => self.a.strs.get(*s as usize).map(|s| (*s).to_owned()),
            Some(LVal::Ext(g)) => match self.ctx.resolve(*g) {
                Resolved::Str(s) => Some(s.to_owned()),
                _ => None,
            },
            _ => None,
        }
    }

    fn list_len(&self, i: usize) -> Option<usize> {
        match self.stack.get(i) {
            Some(LVal::List(l)) => Some(
                self.a
                    .list_items(*l)
                    .iter()
                    .map(|v| Self::item_count(*v))
                    .sum(),
            ),
            _ => None,
        }
    }

    fn count(&self, i: usize) -> usize {
        self.stack.get(i).map_or(1, |v| Self::item_count(*v))
    }
}

/// Runs chunk `index` of the input.
pub fn run_chunk<'a>(ctx: &Ctx<'a>, index: usize, spare: &mut Spare<'a>) -> R<ChunkOut<'a>> {
    let c = &ctx.spans[index];
    let mut vm = Vm::chunk(ctx, index, spare)?;
    let stopped = vm.run(c.start, c.end)?;
    let stop_end = stopped.then_some(vm.op_pos + 1);
    let mut out = vm.finish(spare, stopped)?;
    out.stop_end = stop_end;
    Ok(out)
}

#[allow(dead_code)]
const _: () = assert!(std::mem::size_of::<LVal>() == 16);

#[cfg(test)]
mod tests {
    use super::*;

    /// The strings of one round through a cycle, looked up and put back where missing: how
    /// many were missing.
    fn round(cache: &mut TextCache<'static>, indices: &[u32]) -> usize {
        let mut missing = 0;
        for &g in indices {
            if cache.get(g).is_none() {
                missing += 1;
                cache.put(g, "N/A");
            }
        }
        missing
    }

    /// A replayed trace's `compile_context` strings as ZidongLiu's come round: 23,105 indices
    /// five apart, wider than the first slots. The cache grows until a round finds them all.
    #[test]
    fn a_text_cache_grows_to_hold_a_cycle_wider_than_its_slots() {
        let indices: Vec<u32> = (0..23_105).map(|i| 3_000_000 + i * 5).collect();
        let mut cache = TextCache::default();
        let missing: Vec<usize> = (0..8).map(|_| round(&mut cache, &indices)).collect();
        assert_eq!(missing[0], indices.len());
        assert_eq!(missing[7], 0, "missing by round: {missing:?}");
        // 23,105 indices five apart fall in distinct slots of 32,768 (five is odd).
        assert_eq!(cache.slots.len(), 1 << 15, "the smallest that holds them");
        assert!(indices.iter().all(|&g| cache.get(g) == Some("N/A")));
    }

    /// Strings that fit the slots (MAGMA27's 5,163) leave the cache at its first size.
    #[test]
    fn a_text_cache_whose_strings_fit_keeps_its_size() {
        let indices: Vec<u32> = (0..5_163).map(|i| 3_000_000 + i * 3).collect();
        let mut cache = TextCache::default();
        let missing: Vec<usize> = (0..4).map(|_| round(&mut cache, &indices)).collect();
        assert_eq!(missing, [indices.len(), 0, 0, 0]);
        assert_eq!(cache.slots.len(), EXT_SLOTS);
    }
}
