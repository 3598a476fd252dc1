//! Compact storage of one device's trace: 20 bytes per entry instead of ~90 for a plain
//! `Vec<TraceEntry>`. Entries are read back as [`TraceEntry`] values (`get`, `iter`, `range`).
//!
//! An entry keeps its address, its size (as u32, wider ones in a side table), its stack id, an
//! index into a small table of the (action, stream, metadata) combinations of its part, and its
//! time as a u32 offset from the part's first time (others in a side table). A trace is a list
//! of parts: the parallel loader builds one part per chunk of the file and never copies them.

use std::ops::Range;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::intern::{StackId, TextId};
use super::model::{Action, TraceEntry};

const NO_TIME: u32 = u32::MAX;
const WIDE_TIME: u32 = u32::MAX - 1;
const WIDE_SIZE: u32 = u32::MAX;

/// What entries share: few distinct combinations per part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Meta {
    pub action: Action,
    pub action_text: Option<TextId>,
    pub stream: u64,
    pub user_metadata: Option<TextId>,
    pub compile_context: Option<TextId>,
    pub has_device_free: bool,
}

/// One entry in 20 bytes (4-byte alignment). The address is kept as an offset in a 2^48-byte
/// window around the part's first address (a device's addresses lie far closer together), and
/// the offset's top 16 bits hold the metadata id; another address or id is in `wide_addrs`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(crate) struct Row {
    addr_meta: u64,
    pub size: u32,
    pub stack: u32,
    pub time: u32,
}

const ADDR_BITS: u32 = 48;
const ADDR_MASK: u64 = (1 << ADDR_BITS) - 1;
/// In `addr_meta`'s top bits: the address and metadata id are in the side table.
const WIDE_META: u64 = 0xFFFF;

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
    meta_index: FxHashMap<Meta, u32>,
    /// The last metadata id used per action, as `id + 1` (0: none yet): entries alternate
    /// between a few actions, each mostly with one metadata.
    recent_meta: [u32; 16],
    time_base: Option<i64>,
    /// (row, value), rows ascending.
    wide_times: Vec<(u32, i64)>,
    wide_sizes: Vec<(u32, u64)>,
    /// Where the addresses' window starts: 2^47 below the part's first address.
    addr_base: Option<u64>,
    /// (row, (address, metadata id)) of rows whose address or id does not fit `addr_meta`.
    wide_addrs: Vec<(u32, (u64, u32))>,
    device_free: Vec<(u32, u64)>,
}

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

    pub fn push(&mut self, e: &TraceEntry) {
        let row = self.rows.len() as u32;
        let meta = Meta {
            action: e.action,
            action_text: e.action_text,
            stream: e.stream,
            user_metadata: e.user_metadata,
            compile_context: e.compile_context,
            has_device_free: e.device_free.is_some(),
        };
        let meta = self.meta_id(meta);
        if let Some(v) = e.device_free {
            self.device_free.push((row, v));
        }
        let size = match u32::try_from(e.size) {
            Ok(s) if s != WIDE_SIZE => s,
            _ => {
                self.wide_sizes.push((row, e.size));
                WIDE_SIZE
            }
        };
        let time = self.time_code(row, e.time_us);
        let base = *self
            .addr_base
            .get_or_insert(e.addr.saturating_sub(1 << (ADDR_BITS - 1)));
        let offset = e.addr.wrapping_sub(base);
        let addr_meta = if e.addr >= base && offset <= ADDR_MASK && u64::from(meta) < WIDE_META {
            offset | u64::from(meta) << ADDR_BITS
        } else {
            self.wide_addrs.push((row, (e.addr, meta)));
            WIDE_META << ADDR_BITS
        };
        self.rows.push(Row {
            addr_meta,
            size,
            stack: e.frames.0,
            time,
        });
    }

    pub fn meta_id(&mut self, meta: Meta) -> u32 {
        let recent = &mut self.recent_meta[meta.action as usize % 16];
        if let Some(id) = recent.checked_sub(1) {
            if self.metas[id as usize] == meta {
                return id;
            }
        }
        let id = match self.meta_index.get(&meta) {
            Some(&id) => id,
            None => {
                let id = self.metas.len() as u32;
                self.metas.push(meta);
                self.meta_index.insert(meta, id);
                id
            }
        };
        *recent = id + 1;
        id
    }

    /// Time of row `row` as stored: an offset from the part's first time, or an escape.
    pub fn time_code(&mut self, row: u32, time: Option<i64>) -> u32 {
        let Some(t) = time else { return NO_TIME };
        let base = *self.time_base.get_or_insert(t);
        match t.checked_sub(base).and_then(|d| u32::try_from(d).ok()) {
            Some(d) if d < WIDE_TIME => d,
            _ => {
                self.wide_times.push((row, t));
                WIDE_TIME
            }
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> TraceEntry {
        let r = self.rows[i];
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
                side(&self.device_free, row)
            } else {
                None
            },
            time_us: self.time_us(i),
            frames: StackId(r.stack),
            user_metadata: m.user_metadata,
            compile_context: m.compile_context,
        }
    }

    /// The time of row `i` alone.
    #[inline]
    pub fn time_us(&self, i: usize) -> Option<i64> {
        match self.rows[i].time {
            NO_TIME => None,
            WIDE_TIME => side(&self.wide_times, i as u32),
            d => self.time_base.map(|b| b + i64::from(d)),
        }
    }

    /// What most passes read of row `i`: no time, stream or metadata lookups.
    #[inline]
    pub fn core(&self, i: usize) -> Core {
        let r = self.rows[i];
        let (addr, meta) = self.addr_meta(i);
        let m = &self.metas[meta as usize];
        Core {
            action: m.action,
            user_metadata: m.user_metadata,
            addr,
            size: self.size(i),
            frames: StackId(r.stack),
        }
    }

    /// The address and metadata id of row `i`.
    #[inline]
    fn addr_meta(&self, i: usize) -> (u64, u32) {
        let v = self.rows[i].addr_meta;
        let base = self.addr_base.unwrap_or(0);
        match v >> ADDR_BITS {
            WIDE_META => side(&self.wide_addrs, i as u32).unwrap_or((base, 0)),
            meta => (base.wrapping_add(v & ADDR_MASK), meta as u32),
        }
    }

    /// The size of row `i` alone.
    #[inline]
    fn size(&self, i: usize) -> u64 {
        match self.rows[i].size {
            WIDE_SIZE => side(&self.wide_sizes, i as u32).unwrap_or(u64::from(WIDE_SIZE)),
            s => u64::from(s),
        }
    }

    /// Drops the lookup index once the part is complete.
    pub fn seal(&mut self) {
        self.meta_index = FxHashMap::default();
        self.rows.shrink_to_fit();
        self.metas.shrink_to_fit();
    }

    /// Rewrites ids (used by the parallel loader, whose parts first hold chunk-local ids).
    pub fn remap(&mut self, stack: impl Fn(u32) -> u32, text: impl Fn(TextId) -> TextId) {
        for r in &mut self.rows {
            r.stack = stack(r.stack);
        }
        for m in &mut self.metas {
            m.action_text = m.action_text.map(&text);
            m.user_metadata = m.user_metadata.map(&text);
            m.compile_context = m.compile_context.map(&text);
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.rows.capacity() * std::mem::size_of::<Row>()
            + self.metas.capacity() * std::mem::size_of::<Meta>()
            + (self.wide_times.capacity()
                + self.wide_sizes.capacity()
                + self.device_free.capacity())
                * 16
            + self.wide_addrs.capacity() * std::mem::size_of::<(u32, (u64, u32))>()
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
            action: if i % 3 == 0 {
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
        assert_eq!(std::mem::size_of::<Row>(), 20);
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
}
