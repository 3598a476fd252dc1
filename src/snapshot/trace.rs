//! Compact storage of one device's trace: 16 bytes per entry instead of ~90 for a plain
//! `Vec<TraceEntry>`. Entries are read back as [`TraceEntry`] values (`get`, `iter`, `range`).
//!
//! An entry keeps its address, its size (as u32), its stack id (24 bits), an index into a small
//! table of the (action, stream, metadata) combinations of its part (8 bits), and its time as a
//! 24-bit offset from a time base of its part; what does not fit is in side tables. A trace is
//! a list of parts: the parallel loader builds one part per chunk of the file and never copies
//! them.

use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::intern::{StackId, TextId};
use super::model::{Action, TraceEntry};

/// Time codes (24 bits): no time, and a time in `wide_times`; others are offsets (µs).
const NO_TIME: u32 = (1 << 24) - 1;
const WIDE_TIME: u32 = (1 << 24) - 2;
const WIDE_SIZE: u32 = u32::MAX;
/// The stack id (24 bits) is in `wide_stacks`.
const WIDE_STACK: u32 = (1 << 24) - 1;

/// What entries share: few distinct combinations per part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Meta {
    pub action: Action,
    pub action_text: Option<TextId>,
    pub stream: u64,
    pub user_metadata: Option<TextId>,
    pub compile_context: Option<TextId>,
    pub has_device_free: bool,
    pub pool_id: Option<(i64, i64)>,
    pub internal_metadata: Option<TextId>,
}

/// One entry in 16 bytes (4-byte alignment; a long trace has millions). The address is kept
/// as an offset in 256-byte units in a 2^48-byte window around the part's first address (a
/// device's addresses lie far closer together, and the allocator's blocks start at multiples
/// of 512); another address, or a metadata id past 8 bits, is in `wide_addrs`.
///
/// `addr_meta`: bits 0-39 the address offset, 40-47 the metadata id, 48-63 the stack id's low
/// 16 bits. `stack_time`: bits 0-7 the stack id's bits 16-23, 8-31 the time code.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(crate) struct Row {
    addr_meta: u64,
    size: u32,
    stack_time: u32,
}

const ADDR_BITS: u32 = 48;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
/// Addresses are kept in units of 2^8 bytes.
const ADDR_UNIT_BITS: u32 = 8;
const ADDR_CODE_MASK: u64 = (1 << (ADDR_BITS - ADDR_UNIT_BITS)) - 1;
const META_SHIFT: u32 = ADDR_BITS - ADDR_UNIT_BITS;
/// In `addr_meta`'s metadata bits: the address and metadata id are in the side table.
const WIDE_META: u64 = 0xFF;
const STACK_LOW_SHIFT: u32 = 48;

impl Row {
    fn new(addr_meta: u64, size: u32, stack: u32, time: u32) -> Row {
        let mut r = Row {
            addr_meta,
            size,
            stack_time: time << 8,
        };
        r.set_stack_code(stack);
        r
    }

    fn stack_code(&self) -> u32 {
        (self.addr_meta >> STACK_LOW_SHIFT) as u32 | (self.stack_time & 0xFF) << 16
    }

    fn set_stack_code(&mut self, stack: u32) {
        debug_assert!(stack <= WIDE_STACK);
        let low = u64::from(stack & 0xFFFF) << STACK_LOW_SHIFT;
        self.addr_meta = (self.addr_meta & !(0xFFFF << STACK_LOW_SHIFT)) | low;
        self.stack_time = (self.stack_time & !0xFF) | stack >> 16;
    }

    fn time_code(&self) -> u32 {
        self.stack_time >> 8
    }
}

/// The code of stack id `stack` at row `row`; ids of 24 bits and more go to `wide`.
fn stack_code(stack: u32, row: u32, wide: &mut Vec<(u32, u32)>) -> u32 {
    if stack < WIDE_STACK {
        stack
    } else {
        wide.push((row, stack));
        WIDE_STACK
    }
}

/// What entries share, as [`Trace::combinations`] counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Combination {
    pub action: Action,
    /// The raw action text when `action` is `Other`.
    pub action_text: Option<TextId>,
    pub pool_id: Option<(i64, i64)>,
    pub user_metadata: Option<TextId>,
    pub internal_metadata: Option<TextId>,
}

/// The fields of a trace entry that the replay and most checks read, cheaper to get than a
/// whole [`TraceEntry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Core {
    pub action: Action,
    pub user_metadata: Option<TextId>,
    pub addr: u64,
    pub size: u64,
    pub frames: StackId,
}

/// A run of entries with their shared tables.
#[derive(Clone, Debug, Default)]
pub(crate) struct Part {
    pub rows: Vec<Row>,
    pub metas: Vec<Meta>,
    /// Lookups used while entries are pushed; dropped at [`seal`](Self::seal).
    building: Option<Box<Building>>,
    /// (first row, time) of each time base, rows ascending: a row's time is an offset from the
    /// last base at or before it. A new base starts where the time jumps further than 24 bits
    /// of microseconds (16.7 s) reach, as after a pause in the run.
    time_bases: Vec<(u32, i64)>,
    /// Where the addresses' window starts: 2^47 below the part's first address.
    addr_base: Option<u64>,
    /// What does not fit a row; absent in most parts (a file of many devices has a part per
    /// device, so an empty part must be small).
    sides: Option<Box<Sides>>,
}

#[derive(Clone, Debug, Default)]
struct Building {
    meta_index: FxHashMap<Meta, u32>,
    /// The last metadata id used per action, as `id + 1` (0: none yet): entries alternate
    /// between a few actions, each mostly with one metadata.
    recent_meta: [u32; 16],
}

/// The side tables of a part, each of (row, value) with rows ascending.
#[derive(Clone, Debug, Default)]
struct Sides {
    wide_times: Vec<(u32, i64)>,
    wide_stacks: Vec<(u32, u32)>,
    wide_sizes: Vec<(u32, u64)>,
    /// Rows whose address or metadata id does not fit `addr_meta`: (address, metadata id).
    wide_addrs: Vec<(u32, (u64, u32))>,
    device_free: Vec<(u32, u64)>,
}

static NO_SIDES: Sides = Sides {
    wide_times: Vec::new(),
    wide_stacks: Vec::new(),
    wide_sizes: Vec::new(),
    wide_addrs: Vec::new(),
    device_free: Vec::new(),
};

/// A row's value in a side table (rare: kept out of the readers' inlined paths).
#[cold]
#[inline(never)]
fn side<T: Copy>(table: &[(u32, T)], row: u32) -> Option<T> {
    table
        .binary_search_by_key(&row, |(r, _)| *r)
        .ok()
        .map(|i| table[i].1)
}

impl Part {
    /// Empty, with room for `rows` rows (the rest of the room goes at [`seal`](Self::seal)).
    pub fn with_capacity(rows: usize) -> Part {
        Part {
            rows: Vec::with_capacity(rows),
            ..Part::default()
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    fn sides(&self) -> &Sides {
        self.sides.as_deref().unwrap_or(&NO_SIDES)
    }

    fn sides_mut(&mut self) -> &mut Sides {
        self.sides.get_or_insert_with(Box::default)
    }

    pub fn push(&mut self, e: &TraceEntry) {
        let row = self.rows.len() as u32;
        let meta = Meta {
            action: e.action,
            action_text: e.action_text,
            stream: e.stream,
            user_metadata: e.user_metadata,
            compile_context: e.compile_context,
            has_device_free: e.device_free.is_some(),
            pool_id: e.pool_id,
            internal_metadata: e.internal_metadata,
        };
        let meta = self.meta_id(meta);
        if let Some(v) = e.device_free {
            self.sides_mut().device_free.push((row, v));
        }
        let size = match u32::try_from(e.size) {
            Ok(s) if s != WIDE_SIZE => s,
            _ => {
                self.sides_mut().wide_sizes.push((row, e.size));
                WIDE_SIZE
            }
        };
        let time = self.time_code(row, e.time_us);
        let base = *self
            .addr_base
            .get_or_insert(e.addr.saturating_sub(1 << (ADDR_BITS - 1)));
        let offset = e.addr.wrapping_sub(base);
        let fits =
            e.addr >= base && offset <= ADDR_MASK && offset.is_multiple_of(1 << ADDR_UNIT_BITS);
        let addr_meta = if fits && u64::from(meta) < WIDE_META {
            offset >> ADDR_UNIT_BITS | u64::from(meta) << META_SHIFT
        } else {
            self.sides_mut().wide_addrs.push((row, (e.addr, meta)));
            WIDE_META << META_SHIFT
        };
        let stack = if e.frames.0 < WIDE_STACK {
            e.frames.0
        } else {
            stack_code(e.frames.0, row, &mut self.sides_mut().wide_stacks)
        };
        self.rows.push(Row::new(addr_meta, size, stack, time));
    }

    pub fn meta_id(&mut self, meta: Meta) -> u32 {
        let building = self.building.get_or_insert_with(Box::default);
        let recent = &mut building.recent_meta[meta.action as usize % 16];
        if let Some(id) = recent.checked_sub(1) {
            if self.metas[id as usize] == meta {
                return id;
            }
        }
        let id = match building.meta_index.get(&meta) {
            Some(&id) => id,
            None => {
                let id = self.metas.len() as u32;
                self.metas.push(meta);
                building.meta_index.insert(meta, id);
                id
            }
        };
        *recent = id + 1;
        id
    }

    /// Time of row `row` as stored: an offset from the last time base, or an escape.
    fn time_code(&mut self, row: u32, time: Option<i64>) -> u32 {
        let Some(t) = time else { return NO_TIME };
        let Some(&(_, base)) = self.time_bases.last() else {
            self.time_bases.push((row, t));
            return 0;
        };
        match t.checked_sub(base) {
            Some(d) if (0..i64::from(WIDE_TIME)).contains(&d) => d as u32,
            // Later than the base reaches: a new base from this row on.
            Some(d) if d > 0 => {
                self.time_bases.push((row, t));
                0
            }
            // Earlier than the base (clocks are not always monotonic).
            _ => {
                self.sides_mut().wide_times.push((row, t));
                WIDE_TIME
            }
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> TraceEntry {
        let (addr, meta) = self.addr_meta(i);
        let m = self.metas[meta as usize];
        let row = i as u32;
        TraceEntry {
            action: m.action,
            action_text: m.action_text,
            addr,
            size: self.size(i),
            stream: m.stream,
            device_free: if m.has_device_free {
                side(&self.sides().device_free, row)
            } else {
                None
            },
            time_us: self.time_us(i),
            frames: StackId(self.stack(i)),
            user_metadata: m.user_metadata,
            compile_context: m.compile_context,
            pool_id: m.pool_id,
            internal_metadata: m.internal_metadata,
        }
    }

    /// The time of row `i` alone.
    #[inline]
    pub fn time_us(&self, i: usize) -> Option<i64> {
        match self.rows[i].time_code() {
            NO_TIME => None,
            WIDE_TIME => side(&self.sides().wide_times, i as u32),
            d => Some(self.time_base(i).saturating_add(i64::from(d))),
        }
    }

    /// The time base of row `i` (one per part but after pauses).
    #[inline]
    fn time_base(&self, i: usize) -> i64 {
        if let [(_, base)] = self.time_bases[..] {
            return base;
        }
        // A row with a time offset has a base at or before it.
        let k = self
            .time_bases
            .partition_point(|&(row, _)| row as usize <= i);
        self.time_bases.get(k.wrapping_sub(1)).map_or(0, |b| b.1)
    }

    /// The stack id of row `i`.
    #[inline(always)]
    pub fn stack(&self, i: usize) -> u32 {
        match self.rows[i].stack_code() {
            WIDE_STACK => side(&self.sides().wide_stacks, i as u32).unwrap_or(0),
            s => s,
        }
    }

    /// What most passes read of row `i`: no time, stream or metadata lookups.
    #[inline(always)]
    pub fn core(&self, i: usize) -> Core {
        let (addr, meta) = self.addr_meta(i);
        let m = &self.metas[meta as usize];
        Core {
            action: m.action,
            user_metadata: m.user_metadata,
            addr,
            size: self.size(i),
            frames: StackId(self.stack(i)),
        }
    }

    /// The address and metadata id of row `i`.
    #[inline(always)]
    fn addr_meta(&self, i: usize) -> (u64, u32) {
        let v = self.rows[i].addr_meta;
        let base = self.addr_base.unwrap_or(0);
        match v >> META_SHIFT & WIDE_META {
            WIDE_META => side(&self.sides().wide_addrs, i as u32).unwrap_or((base, 0)),
            meta => (
                base.wrapping_add((v & ADDR_CODE_MASK) << ADDR_UNIT_BITS),
                meta as u32,
            ),
        }
    }

    /// The size of row `i` alone.
    #[inline(always)]
    fn size(&self, i: usize) -> u64 {
        match self.rows[i].size {
            WIDE_SIZE => side(&self.sides().wide_sizes, i as u32).unwrap_or(u64::from(WIDE_SIZE)),
            s => u64::from(s),
        }
    }

    /// Drops the lookup index once the part is complete.
    pub fn seal(&mut self) {
        self.building = None;
        self.rows.shrink_to_fit();
        self.metas.shrink_to_fit();
    }

    /// Rewrites ids (used by the parallel loader, whose parts first hold chunk-local ids).
    pub fn remap(&mut self, stack: impl Fn(u32) -> u32, text: impl Fn(TextId) -> TextId) {
        let mut wide = Vec::new();
        for i in 0..self.rows.len() {
            let code = stack_code(stack(self.stack(i)), i as u32, &mut wide);
            self.rows[i].set_stack_code(code);
        }
        if !wide.is_empty() || self.sides.is_some() {
            self.sides_mut().wide_stacks = wide;
        }
        for m in &mut self.metas {
            m.action_text = m.action_text.map(&text);
            m.user_metadata = m.user_metadata.map(&text);
            m.compile_context = m.compile_context.map(&text);
            m.internal_metadata = m.internal_metadata.map(&text);
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<Row>()
            + self.metas.capacity() * std::mem::size_of::<Meta>()
            + (self.sides().wide_times.capacity()
                + self.sides().wide_sizes.capacity()
                + self.sides().device_free.capacity()
                + self.time_bases.capacity())
                * 16
            + self.sides().wide_stacks.capacity() * 8
            + self.sides().wide_addrs.capacity() * std::mem::size_of::<(u32, (u64, u32))>()
    }
}

#[derive(Clone, Debug)]
struct Slice {
    part: Arc<Part>,
    rows: Range<usize>,
    /// Index in the trace of the slice's first entry.
    start: usize,
}

/// The trace of one device, oldest entry first.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    slices: Vec<Slice>,
    len: usize,
}

impl Trace {
    pub const EMPTY: Trace = Trace {
        slices: Vec::new(),
        len: 0,
    };

    pub fn new() -> Trace {
        Trace::default()
    }

    /// A trace made of these entries (tests, small inputs).
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = &'a TraceEntry>) -> Trace {
        let mut part = Part::default();
        for e in entries {
            part.push(e);
        }
        let mut t = Trace::new();
        t.push_part(part);
        t
    }

    pub(crate) fn push_part(&mut self, mut part: Part) {
        part.seal();
        let n = part.len();
        self.push_slice(Arc::new(part), 0..n);
    }

    pub(crate) fn push_slice(&mut self, part: Arc<Part>, rows: Range<usize>) {
        if rows.is_empty() {
            return;
        }
        let n = rows.len();
        // Most traces are one slice (many devices: a trace each).
        self.slices.reserve_exact(1);
        self.slices.push(Slice {
            part,
            rows,
            start: self.len,
        });
        self.len += n;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The distinct combinations of what entries share (their parts' tables: a few per part,
    /// whatever the trace's length; entries of a part outside the trace's rows may count).
    pub fn distinct_combinations(&self) -> Vec<Combination> {
        let mut seen: rustc_hash::FxHashSet<Combination> = Default::default();
        let mut parts: rustc_hash::FxHashSet<*const Part> = Default::default();
        for s in &self.slices {
            if !parts.insert(Arc::as_ptr(&s.part)) {
                continue;
            }
            seen.extend(s.part.metas.iter().map(|m| Combination {
                action: m.action,
                action_text: m.action_text,
                pool_id: m.pool_id,
                user_metadata: m.user_metadata,
                internal_metadata: m.internal_metadata,
            }));
        }
        let mut v: Vec<Combination> = seen.into_iter().collect();
        v.sort();
        v
    }

    /// Whether some entry may have `action` (false means none has: see
    /// [`distinct_combinations`](Self::distinct_combinations)), without a pass over the entries.
    pub fn may_have(&self, action: Action) -> bool {
        self.distinct_combinations()
            .iter()
            .any(|c| c.action == action)
    }

    /// How many entries have each distinct combination of what entries share (action, its
    /// text when unknown, pool id, user and internal metadata): one pass over the rows' small
    /// metadata ids, most entries first.
    pub fn combinations(&self) -> Vec<(Combination, u64)> {
        let mut counts: rustc_hash::FxHashMap<Combination, u64> = Default::default();
        for s in &self.slices {
            let part = &s.part;
            let mut per_meta = vec![0u64; part.metas.len()];
            for i in s.rows.clone() {
                let (_, meta) = part.addr_meta(i);
                if let Some(c) = per_meta.get_mut(meta as usize) {
                    *c += 1;
                }
            }
            for (m, n) in part.metas.iter().zip(per_meta) {
                if n > 0 {
                    *counts
                        .entry(Combination {
                            action: m.action,
                            action_text: m.action_text,
                            pool_id: m.pool_id,
                            user_metadata: m.user_metadata,
                            internal_metadata: m.internal_metadata,
                        })
                        .or_default() += n;
                }
            }
        }
        let mut v: Vec<(Combination, u64)> = counts.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// Entry `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<TraceEntry> {
        if i >= self.len {
            return None;
        }
        let k = match self.slices.binary_search_by_key(&i, |s| s.start) {
            Ok(k) => k,
            Err(k) => k - 1,
        };
        let s = &self.slices[k];
        Some(s.part.get(s.rows.start + (i - s.start)))
    }

    /// Entry `i`; panics past the end, like indexing a slice.
    pub fn at(&self, i: usize) -> TraceEntry {
        match self.get(i) {
            Some(e) => e,
            None => panic!("trace index {i} out of range (length {})", self.len),
        }
    }

    pub fn first(&self) -> Option<TraceEntry> {
        self.get(0)
    }

    pub fn last(&self) -> Option<TraceEntry> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    /// The trace cut into index ranges of at most `size` entries (at least 1), in order: for
    /// passes that run on every core (`par_iter` over the ranges, `range` in each).
    pub fn pieces(&self, size: usize) -> Vec<Range<usize>> {
        let size = size.max(1);
        (0..self.len)
            .step_by(size)
            .map(|start| start..(start + size).min(self.len))
            .collect()
    }

    /// Calls `f(index, core)` for the entries in `range` (clamped to the trace), in order.
    #[inline(always)]
    pub fn for_each_core(&self, range: Range<usize>, mut f: impl FnMut(usize, Core)) {
        self.for_each_row(range, |i, part, row| f(i, part.core(row)));
    }

    /// Calls `f(index, part, row)` for the entries in `range` (clamped to the trace), in order.
    #[inline(always)]
    fn for_each_row(&self, range: Range<usize>, mut f: impl FnMut(usize, &Part, usize)) {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        if start == end {
            return;
        }
        let first = match self.slices.binary_search_by_key(&start, |s| s.start) {
            Ok(k) => k,
            Err(k) => k - 1,
        };
        for s in &self.slices[first..] {
            if s.start >= end {
                break;
            }
            let lo = start.max(s.start);
            let hi = end.min(s.start + s.rows.len());
            let offset = s.rows.start + lo - s.start;
            for k in 0..hi - lo {
                f(lo + k, &s.part, offset + k);
            }
        }
    }

    /// Calls `f(index, time_us)` for the entries in `range` (clamped to the trace), in order.
    pub fn for_each_time(&self, range: Range<usize>, mut f: impl FnMut(usize, Option<i64>)) {
        self.for_each_row(range, |i, part, row| f(i, part.time_us(row)));
    }

    /// Every entry in order.
    pub fn iter(&self) -> Iter<'_> {
        self.range(0..self.len)
    }

    /// Entries `range` (clamped to the trace), in order; reversible.
    pub fn range(&self, range: Range<usize>) -> Iter<'_> {
        let end = range.end.min(self.len);
        let start = range.start.min(end);
        Iter::new(self, start, end)
    }

    /// Bytes held on the heap (for memory accounting in tests and benchmarks).
    pub fn heap_bytes(&self) -> usize {
        let mut seen: Vec<*const Part> = Vec::new();
        let mut total = 0;
        for s in &self.slices {
            let p = Arc::as_ptr(&s.part);
            if !seen.contains(&p) {
                seen.push(p);
                total += s.part.heap_bytes();
            }
        }
        total
    }
}

impl PartialEq for Trace {
    fn eq(&self, other: &Trace) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

/// Iterator over a [`Trace`] (by value: entries are decoded from the compact rows).
#[derive(Clone)]
pub struct Iter<'a> {
    trace: &'a Trace,
    front: usize,
    back: usize,
    /// Slices holding `front` and `back - 1` (kept up to date to avoid a search per entry).
    fs: usize,
    bs: usize,
}

impl<'a> Iter<'a> {
    fn new(trace: &'a Trace, front: usize, back: usize) -> Self {
        let find = |i: usize| match trace.slices.binary_search_by_key(&i, |s| s.start) {
            Ok(k) => k,
            Err(k) => k.saturating_sub(1),
        };
        Iter {
            trace,
            front,
            back,
            fs: find(front),
            bs: find(back.saturating_sub(1)),
        }
    }
}

impl Iterator for Iter<'_> {
    type Item = TraceEntry;

    #[inline]
    fn next(&mut self) -> Option<TraceEntry> {
        if self.front >= self.back {
            return None;
        }
        let i = self.front;
        self.front += 1;
        let slices = &self.trace.slices;
        while slices[self.fs].start + slices[self.fs].rows.len() <= i {
            self.fs += 1;
        }
        let s = &slices[self.fs];
        Some(s.part.get(s.rows.start + (i - s.start)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }

    fn nth(&mut self, n: usize) -> Option<TraceEntry> {
        // `next` moves on to the slice that holds the new front: callers step over a few
        // entries at a time, where a search of the slices would cost more than the step.
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }
}

impl DoubleEndedIterator for Iter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<TraceEntry> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        let i = self.back;
        let slices = &self.trace.slices;
        while slices[self.bs].start > i {
            self.bs -= 1;
        }
        let s = &slices[self.bs];
        Some(s.part.get(s.rows.start + (i - s.start)))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Trace {
    type Item = TraceEntry;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> TraceEntry {
        TraceEntry {
            action: if i.is_multiple_of(3) {
                Action::Alloc
            } else {
                Action::FreeCompleted
            },
            action_text: None,
            addr: 0x7f00_0000_0000 + i * 512,
            size: if i == 5 { 1 << 40 } else { i * 100 },
            stream: i % 2,
            device_free: (i == 7).then_some(123),
            time_us: match i {
                3 => None,
                4 => Some(-5),
                _ => Some(1_700_000_000_000_000 + i as i64),
            },
            frames: StackId(i as u32),
            user_metadata: (i == 2).then_some(TextId(9)),
            compile_context: Some(TextId(1)),
            pool_id: (i == 6).then_some((1, 0)),
            internal_metadata: (i == 8).then_some(TextId(4)),
        }
    }

    #[test]
    fn entries_read_back_exactly() {
        let entries: Vec<TraceEntry> = (0..20).map(entry).collect();
        let t = Trace::from_entries(&entries);
        assert_eq!(t.len(), 20);
        let back: Vec<TraceEntry> = t.iter().collect();
        assert_eq!(back, entries);
        let rev: Vec<TraceEntry> = t.iter().rev().collect();
        assert_eq!(rev.len(), 20);
        assert_eq!(rev[0], entries[19]);
        assert_eq!(t.get(7), Some(entries[7]));
        assert_eq!(t.get(20), None);
        assert_eq!(t.range(18..40).count(), 2);
        assert_eq!(std::mem::size_of::<Row>(), 16);
    }

    /// Addresses outside the 2^48-byte window around the part's first address, and metadata
    /// ids past 16 bits, do not fit a row's packed word: they come back from the side table,
    /// the others from the row.
    #[test]
    fn wide_addresses_and_many_metadata_come_back() {
        let mut entries: Vec<TraceEntry> = (0..70_000u64)
            .map(|i| TraceEntry {
                // A distinct stream per entry: 70,000 metadata ids.
                stream: i,
                ..entry(i)
            })
            .collect();
        // Outside the first address's 2^48-byte window (1 << 50 and up), and inside it (0).
        for (k, addr) in [0, 1 << 50, u64::MAX, (1 << 48) + 0x7f00_0000_0000]
            .into_iter()
            .enumerate()
        {
            entries[k * 10].addr = addr;
            entries[69_990 + k].addr = addr;
        }
        let t = Trace::from_entries(&entries);
        let back: Vec<TraceEntry> = t.iter().collect();
        assert_eq!(back, entries);
        assert_eq!(t.get(69_992).map(|e| e.addr), Some(u64::MAX));
    }

    #[test]
    fn slices_of_several_parts() {
        let entries: Vec<TraceEntry> = (0..30).map(entry).collect();
        let mut a = Part::default();
        let mut b = Part::default();
        for e in &entries[..12] {
            a.push(e);
        }
        for e in &entries[12..] {
            b.push(e);
        }
        let b = Arc::new(b);
        let mut t = Trace::new();
        t.push_part(a);
        t.push_slice(b.clone(), 0..10);
        t.push_slice(b, 10..18);
        assert_eq!(t.iter().collect::<Vec<_>>(), entries);
        assert_eq!(t.iter().fold(0, |n, _| n + 1), 30);
        assert_eq!(
            t.range(11..14).collect::<Vec<_>>(),
            entries[11..14].to_vec()
        );
        assert_eq!(t.at(29), entries[29]);
        // The cheap accessor and the pieces see the same entries, across slice boundaries.
        for range in [0..30, 5..25, 11..14, 29..40, 10..10] {
            let mut seen = Vec::new();
            t.for_each_core(range.clone(), |i, c| seen.push((i, c)));
            let want: Vec<(usize, Core)> = entries
                .iter()
                .enumerate()
                .skip(range.start)
                .take(range.end.min(30).saturating_sub(range.start))
                .map(|(i, e)| {
                    let core = Core {
                        action: e.action,
                        user_metadata: e.user_metadata,
                        addr: e.addr,
                        size: e.size,
                        frames: e.frames,
                    };
                    (i, core)
                })
                .collect();
            assert_eq!(seen, want, "{range:?}");
        }
        assert_eq!(t.pieces(7), vec![0..7, 7..14, 14..21, 21..28, 28..30]);
        assert_eq!(Trace::new().pieces(7), Vec::<Range<usize>>::new());
    }

    /// Stack ids of 24 bits and more, addresses off the 256-byte grid, times that jump ahead
    /// (a pause in the run) or go back: each comes back exactly, from the row or a side table,
    /// and the rows that fit stay 16 bytes with no side entry.
    #[test]
    fn stacks_times_and_addresses_past_the_row_fields_come_back() {
        let entries: Vec<TraceEntry> = (0..200u64)
            .map(|i| TraceEntry {
                frames: StackId(match i % 5 {
                    0 => (1 << 24) - 2,
                    1 => (1 << 24) - 1,
                    2 => u32::MAX,
                    _ => i as u32 * 70_001,
                }),
                addr: 0x7f00_0000_0000 + i * 512 + if i % 7 == 0 { 16 } else { 0 },
                time_us: Some(match i {
                    // 20 s, then 2 hours later, then back before the first base.
                    0..50 => 1_000_000 + i as i64 * 400_000,
                    50..120 => 7_200_000_000 + i as i64,
                    120..125 => 5,
                    _ => 7_200_000_000 + (1 << 23) + i as i64,
                }),
                ..entry(i)
            })
            .collect();
        let mut part = Part::default();
        for e in &entries {
            part.push(e);
        }
        let back: Vec<TraceEntry> = (0..entries.len()).map(|i| part.get(i)).collect();
        assert_eq!(back, entries);
        // Ids from 2^24 - 1 on, and the times before the first base, are the only side entries
        // of their kind; the pauses start new bases.
        assert_eq!(part.sides().wide_stacks.len(), 80);
        assert_eq!(part.sides().wide_times.len(), 5);
        assert!(part.time_bases.len() >= 3, "{:?}", part.time_bases);
        // Remapped ids cross the 24-bit line both ways.
        part.remap(|s| if s >= 1 << 24 { 3 } else { s + (1 << 24) }, |t| t);
        for (i, e) in entries.iter().enumerate() {
            let want = if e.frames.0 >= 1 << 24 {
                3
            } else {
                e.frames.0 + (1 << 24)
            };
            assert_eq!(part.stack(i), want, "row {i}");
            assert_eq!(part.get(i).addr, e.addr);
            assert_eq!(part.get(i).time_us, e.time_us);
        }
    }
}
