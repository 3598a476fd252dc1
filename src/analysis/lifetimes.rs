//! Per-device lifetimes: when each allocation lived, and the requested / allocated / reserved
//! curves, each including the level at window start (snapshot-format.md §9.10, design §4). Where
//! the allocator put each block is `crate::allocator`'s question, not this one's.
//!
//! Lifetime = from `alloc` to `free_completed` (MemoryViz's definition): a block is unusable and
//! still counts between `free_requested` and `free_completed`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use rustc_hash::FxHashMap;

use crate::snapshot::{Action, Block, BlockState, Snapshot, StackId, Trace, TraceEntry, TraceIter};

/// Where an allocation's record comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Its `alloc` is in the trace.
    Traced,
    /// Allocated before the window: only its free is in the trace.
    FreedInWindow,
    /// Allocated before the window and still allocated in the dump, no trace event at all.
    Ghost,
}

impl Origin {
    /// Its name in the SQL store and the MCP answers.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Traced => "traced",
            Origin::FreedInWindow => "before_window_freed",
            Origin::Ghost => "before_window_alive",
        }
    }

    /// What a reader is told about an allocation of this origin without a recorded stack
    /// (the report's call sites and the pictures' labels).
    pub fn label(self) -> &'static str {
        match self {
            Origin::Traced => "<no stack recorded>",
            Origin::FreedInWindow => "<allocated before the trace window>",
            Origin::Ghost => "<allocated before the trace window, still allocated at the dump>",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allocation {
    pub address: u64,
    pub requested_bytes: u64,
    /// Block bytes: exact from the dump's block table when the block survived to the dump,
    /// else PyTorch's `round_size` of the request.
    pub block_bytes: u64,
    pub block_bytes_exact: bool,
    /// Index of the `alloc` entry; `None` = allocated before the window.
    pub alloc_event: Option<u32>,
    pub free_requested_event: Option<u32>,
    /// Index of the `free_completed` entry (or of the `alloc` that reused the address when a free
    /// was lost); `None` = alive at the end of the trace.
    pub free_event: Option<u32>,
    /// Allocation stack (for `FreedInWindow`: the free's stack, the only one recorded).
    pub stack: StackId,
    pub stream: u64,
    pub origin: Origin,
}

impl Allocation {
    /// Alive after event `event` was applied (`None` = at window start).
    pub fn alive_after(&self, event: Option<u32>) -> bool {
        alive(
            self.alloc_event.unwrap_or(NONE),
            self.free_event.unwrap_or(NONE),
            event,
        )
    }
}

/// An allocation made in the window, as [`Allocations::births`] gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Birth {
    pub born: u32,
    pub free_requested_event: Option<u32>,
    pub free_event: Option<u32>,
    pub requested_bytes: u64,
    pub stack: StackId,
    pub stream: u64,
}

const NONE: u32 = u32::MAX;
/// In the replay's address map: the address was freed (index `NONE`, this as its bytes).
const FREED: u64 = 1;

fn opt(v: u32) -> Option<u32> {
    (v != NONE).then_some(v)
}

#[inline]
fn alive(alloc: u32, free: u32, event: Option<u32>) -> bool {
    let born = match (alloc, event) {
        (NONE, _) => true,
        (_, None) => false,
        (a, Some(e)) => a <= e,
    };
    let dead = match (free, event) {
        (NONE, _) | (_, None) => false,
        (f, Some(e)) => f <= e,
    };
    born && !dead
}

/// The allocations of one device, 12 bytes each: their events. Address, size, stack and stream
/// are read from the trace entry that recorded them (the `alloc`, or the free for allocations
/// made before the window); allocations only the dump knows ("ghosts") are kept whole.
///
/// `values()`, `get()` and `live()` build [`Allocation`]s on the fly. `iter()`, indexing and
/// `&allocations` in a `for` loop give references into a full copy made on first use (24 bytes
/// and more per allocation: for the pictures, not for big analyses).
#[derive(Clone, Debug, Default)]
pub struct Allocations {
    trace: Trace,
    /// (alloc, free) event per traced allocation; `NONE` = none.
    events: Vec<[u32; 2]>,
    /// The free_requested events: one bit per allocation for those right before the free (as
    /// PyTorch records them, but when the free waits for other streams), the others by index.
    requests: FreeRequests,
    /// Block bytes from the dump, by allocation index (survivors only).
    exact: FxHashMap<u32, u64>,
    ghosts: Vec<Ghost>,
    /// The streams of the ghosts' segments (few: a ghost keeps an index).
    ghost_streams: Vec<u64>,
    full: OnceLock<Vec<Allocation>>,
}

/// An allocation only the dump knows, in 32 bytes (an [`Allocation`] takes 72: a big dump
/// has tens of thousands).
#[derive(Clone, Copy, Debug)]
struct Ghost {
    address: u64,
    requested_bytes: u64,
    block_bytes: u64,
    stack: StackId,
    stream: u32,
}

impl Allocations {
    pub fn len(&self) -> usize {
        self.events.len() + self.ghosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ghost(&self, g: &Ghost) -> Allocation {
        Allocation {
            address: g.address,
            requested_bytes: g.requested_bytes,
            block_bytes: g.block_bytes,
            block_bytes_exact: true,
            alloc_event: None,
            free_requested_event: None,
            free_event: None,
            stack: g.stack,
            stream: self.ghost_streams[g.stream as usize],
            origin: Origin::Ghost,
        }
    }

    /// Adds a ghost; `stream_ids` numbers the streams seen so far (keyed by std's hash: a
    /// crafted dump may give every segment a stream of its own).
    fn push_ghost(&mut self, b: &Block, stream: u64, stream_ids: &mut HashMap<u64, u32>) {
        let stream = *stream_ids.entry(stream).or_insert_with(|| {
            self.ghost_streams.push(stream);
            (self.ghost_streams.len() - 1) as u32
        });
        self.ghosts.push(Ghost {
            address: b.address,
            requested_bytes: b.requested_size,
            block_bytes: b.size,
            stack: b.frames,
            stream,
        });
    }

    fn build(&self, i: usize, entry: TraceEntry) -> Allocation {
        let [alloc, free] = self.events[i];
        let requested = self.requests.of(i, free);
        let exact = self.exact.get(&(i as u32)).copied();
        Allocation {
            address: entry.addr,
            requested_bytes: entry.size,
            block_bytes: exact.unwrap_or_else(|| round_size(entry.size)),
            block_bytes_exact: exact.is_some(),
            alloc_event: opt(alloc),
            free_requested_event: opt(requested),
            free_event: opt(free),
            stack: entry.frames,
            stream: entry.stream,
            origin: if alloc != NONE {
                Origin::Traced
            } else {
                Origin::FreedInWindow
            },
        }
    }

    /// Index of the trace entry that describes traced allocation `i`.
    fn source(&self, i: usize) -> usize {
        let [alloc, free] = self.events[i];
        if alloc != NONE {
            alloc as usize
        } else {
            free as usize
        }
    }

    /// Allocation `i` (`None` past the end).
    pub fn get(&self, i: usize) -> Option<Allocation> {
        if i < self.events.len() {
            let entry = self.trace.get(self.source(i))?;
            Some(self.build(i, entry))
        } else {
            self.ghosts
                .get(i - self.events.len())
                .map(|g| self.ghost(g))
        }
    }

    /// Every allocation, by value, in order (traced ones in the order of their first event).
    pub fn values(&self) -> impl Iterator<Item = Allocation> + '_ {
        // Sources only grow: one pass over the trace.
        let mut entries = EntryCursor::new(&self.trace);
        let traced = (0..self.events.len())
            .filter_map(move |i| Some(self.build(i, entries.at(self.source(i))?)));
        traced.chain(self.ghosts())
    }

    /// The allocations made in the window, in order of birth: what the categorizer reads of
    /// them, without the block bytes and origin that [`values`](Self::values) works out.
    pub fn births(&self) -> impl Iterator<Item = Birth> + '_ {
        // Alloc events grow with the index (an allocation's index is its first event).
        let mut entries = EntryCursor::new(&self.trace);
        self.events
            .iter()
            .enumerate()
            .filter_map(move |(i, &[alloc, free])| {
                if alloc == NONE {
                    return None;
                }
                let entry = entries.at(alloc as usize)?;
                Some(Birth {
                    born: alloc,
                    free_requested_event: opt(self.requests.of(i, free)),
                    free_event: opt(free),
                    requested_bytes: entry.size,
                    stack: entry.frames,
                    stream: entry.stream,
                })
            })
    }

    /// The allocations only the dump knows (before the window, no trace event).
    pub fn ghosts(&self) -> impl Iterator<Item = Allocation> + '_ {
        self.ghosts.iter().map(|g| self.ghost(g))
    }

    /// Allocations alive after `event` (`None` = window start), by value.
    pub fn live(&self, event: Option<u32>) -> impl Iterator<Item = Allocation> + '_ {
        let traced = self
            .events
            .iter()
            .enumerate()
            .filter(move |(_, ev)| alive(ev[0], ev[1], event))
            .filter_map(|(i, _)| self.get(i));
        let ghosts = self.ghosts().filter(move |a| a.alive_after(event));
        traced.chain(ghosts)
    }

    /// `f` of each of [`live`](Self::live), worked out on every core, in the same order.
    pub fn live_map<T: Send>(
        &self,
        event: Option<u32>,
        f: impl Fn(Allocation) -> T + Sync + Send,
    ) -> Vec<T> {
        use rayon::prelude::*;
        // The indices first (4 bytes each), then the values straight into a vector of their
        // exact length: collected through rayon's per-thread lists, the values of a big peak
        // (hundreds of thousands of them) were held twice.
        let traced: Vec<u32> = self
            .events
            .par_iter()
            .enumerate()
            .with_min_len(1 << 14)
            .filter(|(_, ev)| alive(ev[0], ev[1], event))
            .map(|(i, _)| i as u32)
            .collect();
        // Room for the ghosts too (at most all of them), so that the extend below stays in
        // this allocation.
        let mut values: Vec<Option<T>> = Vec::with_capacity(traced.len() + self.ghosts.len());
        traced
            .par_iter()
            .with_min_len(1 << 12)
            .map(|&i| self.get(i as usize).map(&f))
            .collect_into_vec(&mut values);
        drop(traced);
        // `filter_map` collects in place (an `Option` of these takes no more room than the
        // value); `flatten` would copy into a second vector.
        #[allow(clippy::filter_map_identity)]
        let mut out: Vec<T> = values.into_iter().filter_map(|v| v).collect();
        out.extend(self.ghosts().filter(|a| a.alive_after(event)).map(f));
        out
    }

    /// How many allocations were made before the window (freed in it, or ghosts).
    pub fn before_window(&self) -> usize {
        self.events.iter().filter(|ev| ev[0] == NONE).count() + self.ghosts.len()
    }

    /// All allocations as a slice (built on first use).
    pub fn as_slice(&self) -> &[Allocation] {
        self.full.get_or_init(|| self.values().collect())
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Allocation> {
        self.as_slice().iter()
    }
}

/// The free_requested events of the traced allocations, by allocation index.
#[derive(Clone, Debug, Default)]
struct FreeRequests {
    /// Bit `i`: allocation `i`'s free_requested is the event right before its free.
    before_free: Vec<u64>,
    /// The others that have one.
    other: FxHashMap<u32, u32>,
}

/// Bit `i` of a bit set.
fn bit(bits: &[u64], i: u32) -> bool {
    bits.get(i as usize / 64)
        .is_some_and(|w| w >> (i % 64) & 1 == 1)
}

fn set_bit(bits: &mut Vec<u64>, i: u32) {
    let word = i as usize / 64;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    bits[word] |= 1 << (i % 64);
}

/// Clears bit `i`; returns whether it was set.
fn take_bit(bits: &mut [u64], i: u32) -> bool {
    match bits.get_mut(i as usize / 64) {
        Some(w) if *w >> (i % 64) & 1 == 1 => {
            *w &= !(1 << (i % 64));
            true
        }
        _ => false,
    }
}

impl FreeRequests {
    /// The free_requested event of allocation `i`, freed at `free`.
    fn of(&self, i: usize, free: u32) -> u32 {
        if bit(&self.before_free, i as u32) {
            free - 1
        } else {
            self.other.get(&(i as u32)).copied().unwrap_or(NONE)
        }
    }

    /// Allocation `i`, freed at `free` (`NONE`: not freed), was requested free at `request`.
    fn set(&mut self, i: u32, request: u32, free: u32) {
        if free != NONE && request.checked_add(1) == Some(free) {
            set_bit(&mut self.before_free, i);
        } else {
            self.other.insert(i, request);
        }
    }
}

/// Entries of a trace asked for in rising order, in one pass that steps over the entries
/// between them without decoding them (a long trace's frees are half its entries).
struct EntryCursor<'t> {
    entries: TraceIter<'t>,
    /// Index of the entry `entries` gives next; `None` once an index went backwards (the pass
    /// is over, as a search for it would have ended it).
    next: Option<usize>,
}

impl<'t> EntryCursor<'t> {
    fn new(trace: &'t Trace) -> Self {
        EntryCursor {
            entries: trace.iter(),
            next: Some(0),
        }
    }

    fn at(&mut self, want: usize) -> Option<TraceEntry> {
        let at = self.next.filter(|&at| want >= at);
        self.next = None;
        let entry = self.entries.nth(want - at?)?;
        self.next = Some(want + 1);
        Some(entry)
    }
}

impl std::ops::Index<usize> for Allocations {
    type Output = Allocation;
    fn index(&self, i: usize) -> &Allocation {
        &self.as_slice()[i]
    }
}

impl<'a> IntoIterator for &'a Allocations {
    type Item = &'a Allocation;
    type IntoIter = std::slice::Iter<'a, Allocation>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Events per checkpoint of a [`Curve`].
const STEP: usize = 256;

/// The changes of a dense curve, event by event: the nonzero ones (4 bytes each) and a bit per
/// event that says whether it changes the level. A real trace's free_requested events, a third
/// of it, change nothing.
#[derive(Clone, Debug, Default)]
struct EventChanges {
    len: usize,
    /// Bit `i % 64` of word `i / 64`: event `i` changes the level.
    bits: Vec<u64>,
    /// Index in `values` of the first change of each block of `STEP` events.
    ranks: Vec<u32>,
    values: Vec<i32>,
}

impl EventChanges {
    /// Empty, with room for `n` events.
    fn with_capacity(n: usize) -> EventChanges {
        EventChanges {
            len: 0,
            bits: Vec::with_capacity(n.div_ceil(64)),
            ranks: Vec::with_capacity(n.div_ceil(STEP)),
            values: Vec::with_capacity(n),
        }
    }

    /// The change of the next event.
    fn push(&mut self, d: i32) {
        let i = self.len;
        if i.is_multiple_of(STEP) {
            self.ranks.push(self.values.len() as u32);
        }
        if i.is_multiple_of(64) {
            self.bits.push(0);
        }
        if d != 0 {
            if let Some(w) = self.bits.last_mut() {
                *w |= 1 << (i % 64);
            }
            self.values.push(d);
        }
        self.len += 1;
    }

    fn len(&self) -> usize {
        self.len
    }

    /// How many events change the level.
    fn changed(&self) -> usize {
        self.values.len()
    }

    /// How many of the events before `i` (`i` < the length) change the level: counted from
    /// its block's rank (at most four words).
    #[inline(never)]
    fn rank(&self, i: usize) -> usize {
        let block = i / STEP;
        let mut rank = self.ranks[block] as usize;
        for w in &self.bits[block * (STEP / 64)..i / 64] {
            rank += w.count_ones() as usize;
        }
        rank + (self.bits[i / 64] & ((1u64 << (i % 64)) - 1)).count_ones() as usize
    }

    /// The change of event `i` (`None` past the end). `cursor` is where the last call left
    /// off: the next event in order is read without counting bits.
    #[inline(always)]
    fn get(&self, i: usize, cursor: &mut RankCursor) -> Option<i32> {
        if i >= self.len {
            return None;
        }
        if cursor.at != i {
            *cursor = RankCursor {
                at: i,
                rank: self.rank(i),
            };
        }
        cursor.at = i + 1;
        if self.bits[i / 64] >> (i % 64) & 1 == 0 {
            return Some(0);
        }
        cursor.rank += 1;
        Some(self.values[cursor.rank - 1])
    }

    /// The changes of events `first..end` (within the length), in order: a word of bits at a
    /// time.
    fn range(&self, first: usize, end: usize) -> impl Iterator<Item = i32> + '_ {
        let mut rank = if first < end { self.rank(first) } else { 0 };
        let mut word = if first < end {
            self.bits[first / 64] >> (first % 64)
        } else {
            0
        };
        (first..end).map(move |i| {
            if i % 64 == 0 {
                word = self.bits[i / 64];
            }
            let changes = word & 1 == 1;
            word >>= 1;
            if !changes {
                return 0;
            }
            rank += 1;
            self.values[rank - 1]
        })
    }
}

/// Where a sequential read of [`EventChanges`] stands: the next event, and how many events
/// before it change the level.
#[derive(Clone, Copy, Debug)]
struct RankCursor {
    at: usize,
    rank: usize,
}

impl Default for RankCursor {
    fn default() -> Self {
        RankCursor {
            at: usize::MAX,
            rank: 0,
        }
    }
}

/// Where a sequential read of a [`Curve`]'s changes stands: the next entry of `sparse`, and the
/// dense changes' cursor.
#[derive(Clone, Copy, Debug, Default)]
struct ChangeCursor {
    k: usize,
    dense: RankCursor,
}

/// A level over the trace: `start` before the first event, then one change per event. Stored as
/// [`EventChanges`] with a checkpoint every 256 events (or only the events that change it, when
/// few do), so `at` costs a few hundred additions at most.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    pub start: i64,
    len: usize,
    /// Per event; `WIDE` = the change is in `wide`. Shared with the curve a `rounded` one is
    /// derived from.
    deltas: Arc<EventChanges>,
    wide: Vec<(u32, i64)>,
    /// (event, change) for the events that change a sparse curve (`deltas` is then empty), or
    /// of a `rounded` curve the events whose change is not the rounded one.
    sparse: Vec<(u32, i64)>,
    /// The change of an event is [`rounded`] of `deltas`' (the allocated curve follows the
    /// requested one but for rounding: one table for both), but where `sparse` says otherwise.
    rounded: bool,
    /// Level after `k * STEP` events.
    checkpoints: Vec<i64>,
    /// Per block of `STEP` events: its highest level and the first event after which it is
    /// reached (peaks within a range of events without reading every event).
    block_peaks: Vec<(i64, u32)>,
    /// The highest level and the event after which it is first reached (`None`: the start).
    peak: (i64, Option<u32>),
    /// The first level below zero (the event after which, `None`: the start) and how many
    /// levels, the start included, are below zero.
    below_zero: Option<(Option<u32>, i64)>,
    below_zero_count: u64,
    /// Where the level first left what a signed 64-bit number holds (`Some(None)`: already
    /// at the start); the levels saturate from there, so they are not figures of the run.
    overflow: Option<Option<u32>>,
}

const WIDE: i32 = i32::MIN;

/// Changes per event while a replay runs.
struct Deltas {
    dense: EventChanges,
    wide: FxHashMap<u32, i64>,
}

impl Deltas {
    /// Empty, with room for `n` events (filled by [`push`](Self::push), in event order:
    /// written once, not zeroed first and then read back).
    fn new(n: usize) -> Deltas {
        Deltas {
            dense: EventChanges::with_capacity(n),
            wide: FxHashMap::default(),
        }
    }

    /// The change of the next event.
    fn push(&mut self, v: i64) {
        match i32::try_from(v) {
            Ok(d) if d != WIDE => self.dense.push(d),
            _ => {
                self.wide.insert(self.dense.len() as u32, v);
                self.dense.push(WIDE);
            }
        }
    }

    fn into_curve(self, start: i64) -> Curve {
        self.into_curve_with(start, true)
    }

    /// [`into_curve`](Self::into_curve), indexed or not (the caller then calls
    /// [`Curve::index`]).
    fn into_curve_with(self, start: i64, index: bool) -> Curve {
        let len = self.dense.len();
        if self.dense.changed() * 4 < len {
            // Sparse (reserved memory changes only at segment events).
            let sparse = (0..len)
                .zip(self.dense.range(0, len))
                .filter(|&(_, d)| d != 0)
                .map(|(i, d)| match d {
                    WIDE => (i as u32, self.wide.get(&(i as u32)).copied().unwrap_or(0)),
                    d => (i as u32, d as i64),
                })
                .collect();
            return Curve::sparse_with(start, len, sparse, index);
        }
        let mut wide: Vec<(u32, i64)> = self.wide.into_iter().collect();
        wide.sort_unstable();
        let mut c = Curve {
            start,
            len,
            deltas: Arc::new(self.dense),
            wide,
            ..Curve::default()
        };
        if index {
            c.index();
        }
        c
    }
}

impl Curve {
    /// A curve of `len` events that changes only at the events of `changes` (ascending, no
    /// zeros); dense storage when more than a quarter of the events change.
    fn from_changes(start: i64, len: usize, changes: Vec<(u32, i64)>) -> Curve {
        Curve::from_changes_with(start, len, changes, true)
    }

    fn from_changes_with(start: i64, len: usize, changes: Vec<(u32, i64)>, index: bool) -> Curve {
        if changes.len() * 4 < len {
            return Curve::sparse_with(start, len, changes, index);
        }
        let mut deltas = Deltas::new(len);
        let mut next = changes.into_iter().peekable();
        for i in 0..len {
            match next.next_if(|&(e, _)| e as usize == i) {
                Some((_, d)) => deltas.push(d),
                None => deltas.push(0),
            }
        }
        deltas.into_curve_with(start, index)
    }

    /// A curve whose changes are those of `of`, [`rounded`], but at the events of
    /// `exceptions` (ascending), whose changes they give; indexed or not (the caller then calls
    /// [`Curve::index`]). `of` need not be indexed.
    fn rounded_with(start: i64, of: &Curve, exceptions: Vec<(u32, i64)>, index: bool) -> Curve {
        if of.deltas.len() != of.len {
            // `of` is sparse: so is this one, its changes merged with the exceptions.
            let mut changes = Vec::with_capacity(of.sparse.len() + exceptions.len());
            let mut own = of.sparse.iter().map(|&(e, d)| (e, rounded(d))).peekable();
            let mut exceptions = exceptions.into_iter().peekable();
            loop {
                let next = match (own.peek(), exceptions.peek()) {
                    (Some(a), Some(b)) if a.0 < b.0 => own.next(),
                    (Some(a), Some(b)) if a.0 == b.0 => {
                        own.next();
                        exceptions.next()
                    }
                    (_, Some(_)) => exceptions.next(),
                    (Some(_), None) => own.next(),
                    (None, None) => break,
                };
                changes.extend(next.filter(|c| c.1 != 0));
            }
            return Curve::from_changes_with(start, of.len, changes, index);
        }
        let mut c = Curve {
            start,
            len: of.len,
            deltas: of.deltas.clone(),
            sparse: exceptions,
            rounded: true,
            ..Curve::default()
        };
        if index {
            c.index();
        }
        c
    }

    fn sparse_with(start: i64, len: usize, sparse: Vec<(u32, i64)>, index: bool) -> Curve {
        let mut c = Curve {
            start,
            len,
            sparse,
            ..Curve::default()
        };
        if index {
            c.index();
        }
        c
    }

    /// Computes the level after every `STEP` events, the block peaks and the peak, in one pass
    /// (a dense curve's changes read straight from their slice).
    fn index(&mut self) {
        let blocks = self.len.div_ceil(STEP);
        let mut checkpoints = Vec::with_capacity(blocks);
        let mut block_peaks = Vec::with_capacity(blocks);
        let mut x = Indexer {
            level: self.start,
            block_peak: (i64::MIN, 0),
            below: (self.start < 0).then_some((None, self.start)),
            below_count: (self.start < 0) as u64,
            // A start at either end of the range is a saturated sum.
            overflow: (self.start == i64::MAX || self.start <= i64::MIN + 1).then_some(None),
        };
        let dense = self.deltas.len() == self.len && !self.rounded;
        // Only the listed events change it: the runs between them are taken whole.
        let sparse = !dense && !self.rounded && self.deltas.len() == 0;
        let mut k = 0;
        let mut changes = self.changes(0);
        for block in 0..blocks {
            let (first, end) = (block * STEP, ((block + 1) * STEP).min(self.len));
            checkpoints.push(x.level);
            x.block_peak = (i64::MIN, first as u32);
            if sparse {
                let mut i = first;
                while let Some(&(e, d)) = self.sparse.get(k) {
                    let e = e as usize;
                    if e >= end {
                        break;
                    }
                    k += 1;
                    // A second change listed for an event is not read (as `change_at`).
                    if e < i {
                        continue;
                    }
                    x.hold(i, e);
                    x.step(e, d);
                    i = e + 1;
                }
                x.hold(i, end);
            } else if self.rounded && self.deltas.len() == self.len {
                // The shared table's changes rounded, but at the listed events (as `change_at`).
                for (i, d) in (first..end).zip(self.deltas.range(first, end)) {
                    while self.sparse.get(k).is_some_and(|&(e, _)| (e as usize) < i) {
                        k += 1;
                    }
                    let d = match self.sparse.get(k) {
                        Some(&(e, v)) if e as usize == i => v,
                        _ => rounded(d as i64),
                    };
                    x.step(i, d);
                }
            } else if dense {
                for (i, d) in (first..end).zip(self.deltas.range(first, end)) {
                    let d = if d == WIDE {
                        self.wide_change(i)
                    } else {
                        d as i64
                    };
                    x.step(i, d);
                }
            } else {
                for i in first..end {
                    x.step(i, changes.next().unwrap_or(0));
                }
            }
            block_peaks.push(x.block_peak);
        }
        // The first block reaching the highest level holds its first event.
        let mut peak = (self.start, None);
        for &(level, at) in &block_peaks {
            if level > peak.0 {
                peak = (level, Some(at));
            }
        }
        self.checkpoints = checkpoints;
        self.block_peaks = block_peaks;
        self.peak = peak;
        self.below_zero = x.below;
        self.below_zero_count = x.below_count;
        self.overflow = x.overflow;
    }

    /// The change of event `i`, marked `WIDE` in `deltas`.
    fn wide_change(&self, i: usize) -> i64 {
        self.wide
            .binary_search_by_key(&(i as u32), |w| w.0)
            .map_or(0, |j| self.wide[j].1)
    }
}

/// What [`Curve::index`] carries from event to event.
struct Indexer {
    level: i64,
    block_peak: (i64, u32),
    below: Option<(Option<u32>, i64)>,
    below_count: u64,
    overflow: Option<Option<u32>>,
}

impl Indexer {
    #[inline(always)]
    fn step(&mut self, i: usize, d: i64) {
        self.level = match self.level.checked_add(d) {
            Some(l) => l,
            None => {
                self.overflow.get_or_insert(Some(i as u32));
                self.level.saturating_add(d)
            }
        };
        if self.level > self.block_peak.0 {
            self.block_peak = (self.level, i as u32);
        }
        if self.level < 0 {
            self.below_count += 1;
            self.below.get_or_insert((Some(i as u32), self.level));
        }
    }

    /// Events `from..to`, none of which changes the level: as many `step`s by zero.
    fn hold(&mut self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        if self.level > self.block_peak.0 {
            self.block_peak = (self.level, from as u32);
        }
        if self.level < 0 {
            self.below_count += (to - from) as u64;
            self.below.get_or_insert((Some(from as u32), self.level));
        }
    }
}

/// Changes of a curve from event `from` on.
struct Changes<'a> {
    c: &'a Curve,
    i: usize,
    cursor: ChangeCursor,
}

impl Iterator for Changes<'_> {
    type Item = i64;

    #[inline]
    fn next(&mut self) -> Option<i64> {
        if self.i >= self.c.len {
            return None;
        }
        let i = self.i;
        self.i += 1;
        Some(self.c.change_at(i, &mut self.cursor))
    }
}

impl Curve {
    /// A curve from its levels after each event (tests, and callers that compute levels).
    pub fn from_levels(start: i64, after: &[i64]) -> Curve {
        let mut d = Deltas::new(after.len());
        let mut prev = start;
        for &v in after {
            d.push(v.wrapping_sub(prev));
            prev = v;
        }
        let c = d.into_curve(start);
        debug_assert!(c.levels().eq(after.iter().copied()));
        debug_assert_eq!(c.peak(), {
            let mut best = (start, None);
            for (i, &v) in after.iter().enumerate() {
                if v > best.0 {
                    best = (v, Some(i as u32));
                }
            }
            best
        });
        c
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Change at event `i`; `cursor.k` is a cursor into `sparse` (moved to the first entry
    /// ≥ i).
    #[inline(always)]
    fn change_at(&self, i: usize, cursor: &mut ChangeCursor) -> i64 {
        let k = &mut cursor.k;
        if self.rounded {
            while *k < self.sparse.len() && (self.sparse[*k].0 as usize) < i {
                *k += 1;
            }
            return match (self.sparse.get(*k), self.deltas.get(i, &mut cursor.dense)) {
                (Some(&(e, v)), _) if e as usize == i => v,
                (_, Some(d)) => rounded(d as i64),
                _ => 0,
            };
        }
        if self.sparse.is_empty() || self.deltas.len() != 0 {
            return match self.deltas.get(i, &mut cursor.dense) {
                Some(WIDE) => self.wide_change(i),
                Some(d) => d as i64,
                None => 0,
            };
        }
        while *k < self.sparse.len() && (self.sparse[*k].0 as usize) < i {
            *k += 1;
        }
        match self.sparse.get(*k) {
            Some(&(e, v)) if e as usize == i => v,
            _ => 0,
        }
    }

    fn changes(&self, from: usize) -> Changes<'_> {
        let k = self.sparse.partition_point(|w| (w.0 as usize) < from);
        Changes {
            c: self,
            i: from,
            cursor: ChangeCursor {
                k,
                ..ChangeCursor::default()
            },
        }
    }

    /// The change of event `i`.
    fn change(&self, i: usize) -> i64 {
        let k = self.sparse.partition_point(|w| (w.0 as usize) < i);
        self.change_at(
            i,
            &mut ChangeCursor {
                k,
                ..ChangeCursor::default()
            },
        )
    }

    /// Level after the first `n` events (`n = 0`: the start).
    fn level(&self, n: usize) -> i64 {
        let n = n.min(self.len);
        // After the last event of a trace of whole blocks there is no checkpoint: the last
        // block's is read forward.
        let block = (n / STEP).min(self.checkpoints.len().saturating_sub(1));
        let Some(&base) = self.checkpoints.get(block) else {
            return self.start;
        };
        let mut level = base;
        for d in self.changes(block * STEP).take(n - block * STEP) {
            level = level.saturating_add(d);
        }
        level
    }

    /// Level after `event` (`None` = window start; past the end: the start, as before).
    pub fn at(&self, event: Option<u32>) -> i64 {
        match event {
            Some(e) if (e as usize) < self.len => self.level(e as usize + 1),
            _ => self.start,
        }
    }

    /// Levels after each event, in order (reversible).
    pub fn levels(&self) -> Levels<'_> {
        self.levels_from(0)
    }

    /// Levels after events `first..`, in order: `at` for a run of events, without starting
    /// over from a checkpoint for each.
    pub fn levels_from(&self, first: usize) -> Levels<'_> {
        let first = first.min(self.len);
        Levels {
            c: self,
            front: first,
            back: self.len,
            front_level: self.level(first),
            fk: ChangeCursor {
                k: self.sparse.partition_point(|w| (w.0 as usize) < first),
                ..ChangeCursor::default()
            },
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    /// The highest level after events `first..=last` (those that exist) and the first of
    /// them after which it is reached; `(i64::MIN, first)` when there are none. Whole blocks
    /// are read from their peaks, only the ends event by event.
    pub fn peak_between(&self, first: usize, last: usize) -> (i64, u32) {
        let end = last.saturating_add(1).min(self.len);
        let mut best = (i64::MIN, first as u32);
        let mut i = first;
        while i < end {
            let block = i / STEP;
            let block_end = ((block + 1) * STEP).min(self.len);
            let stop = block_end.min(end);
            match self.block_peaks.get(block) {
                Some(&(level, at)) if i == block * STEP && stop == block_end => {
                    if level > best.0 {
                        best = (level, at);
                    }
                }
                _ => {
                    for (level, at) in self.levels_from(i).zip(i..stop) {
                        if level > best.0 {
                            best = (level, at as u32);
                        }
                    }
                }
            }
            i = stop;
        }
        best
    }

    /// The maximum including the level at window start, and the first event after which it is
    /// reached (`None` = already at window start).
    pub fn peak(&self) -> (i64, Option<u32>) {
        self.peak
    }

    /// The first level below zero, as (the event after which, `None`: the start; the level).
    pub fn first_below_zero(&self) -> Option<(Option<u32>, i64)> {
        self.below_zero
    }

    /// How many levels, the start included, are below zero.
    pub fn below_zero_count(&self) -> u64 {
        self.below_zero_count
    }

    /// The event after which the level first went past ±2^63 bytes (`Some(None)`: the start
    /// did), when it did: sizes that cannot all be true.
    pub fn overflow(&self) -> Option<Option<u32>> {
        self.overflow
    }
}

/// Iterator over the levels of a [`Curve`].
pub struct Levels<'a> {
    c: &'a Curve,
    front: usize,
    back: usize,
    /// Level after `front` events.
    front_level: i64,
    fk: ChangeCursor,
    /// Levels after events `buf_start..` of the block `back` is in (for going backwards).
    buf: Vec<i64>,
    buf_start: usize,
}

impl Iterator for Levels<'_> {
    type Item = i64;

    #[inline]
    fn next(&mut self) -> Option<i64> {
        if self.front >= self.back {
            return None;
        }
        let d = self.c.change_at(self.front, &mut self.fk);
        self.front_level = self.front_level.saturating_add(d);
        self.front += 1;
        Some(self.front_level)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Levels<'_> {
    fn next_back(&mut self) -> Option<i64> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        let i = self.back;
        if self.buf.is_empty() || i < self.buf_start {
            // Levels of i's block, forward from its checkpoint (exact where levels saturate).
            let start = i / STEP * STEP;
            let mut level = self
                .c
                .checkpoints
                .get(i / STEP)
                .copied()
                .unwrap_or(self.c.start);
            self.buf.clear();
            for d in self.c.changes(start).take(i + 1 - start) {
                level = level.saturating_add(d);
                self.buf.push(level);
            }
            self.buf_start = start;
        }
        self.buf.truncate(i + 1 - self.buf_start);
        self.buf.pop()
    }
}

impl ExactSizeIterator for Levels<'_> {}

/// Evidence that the trace does not start at the beginning of the program.
#[derive(Clone, Debug, Default)]
pub struct WindowStart {
    /// Frees whose allocation happened before the window.
    pub unmatched_frees: u64,
    /// Dump blocks allocated before the window, never touched in it.
    pub ghosts: u64,
    /// `segment_free`/`segment_unmap` of segments created before the window.
    pub unmatched_segment_frees: u64,
    /// `alloc` on an address that was still allocated (a lost free: `skip_actions` or corruption).
    pub lost_frees: u64,
    /// Blocks pending free at the dump that the trace never allocated: not counted in the curves
    /// (MemoryViz does not count them either).
    pub uncounted_pending_blocks: u64,
    pub uncounted_pending_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct DeviceReplay {
    pub device: i64,
    pub events: usize,
    pub allocations: Allocations,
    /// Σ requested bytes of live allocations (what MemoryViz draws).
    pub requested: Curve,
    /// Σ block bytes of live allocations.
    pub allocated: Curve,
    /// Σ segment bytes (segment_alloc/free/map/unmap).
    pub reserved: Curve,
    /// The events that allocate, free, map or unmap a segment, in order (the layouts undo
    /// them from the end of the trace without reading every entry again).
    pub segment_events: Vec<u32>,
    pub window: WindowStart,
    /// `free_completed` of addresses the trace had already freed (no `alloc` in between).
    pub double_frees: DoubleFrees,
}

/// Repeated frees of one address, found by the replay (`analysis::quality` reports them).
#[derive(Clone, Debug, Default)]
pub struct DoubleFrees {
    pub count: u64,
    pub bytes: u64,
    /// The first: (event, address).
    pub first: Option<(u32, u64)>,
}

/// The allocated change of a requested change `d`: each request rounded ([`round_size`]).
fn rounded(d: i64) -> i64 {
    match d {
        0 => 0,
        d if d > 0 => signed(round_size(d as u64)),
        d => signed(round_size(d.unsigned_abs())).saturating_neg(),
    }
}

/// PyTorch's default request rounding (`round_size` without power-of-two divisions).
pub fn round_size(requested: u64) -> u64 {
    crate::allocator::rules::round_to_blocks(requested)
}

pub fn replay_device(snapshot: &Snapshot, device: i64) -> DeviceReplay {
    let trace = snapshot.trace(device);
    let n = trace.len();
    crate::work::add(n as u64);
    let mut allocs = Allocations {
        trace: trace.clone(),
        // At most one per event. Reserved whole: growing a vector this big moves it (mremap)
        // and stalls the other cores (TLB shootdowns); untouched pages cost no memory.
        events: Vec::with_capacity(n),
        ..Allocations::default()
    };
    // Allocations by address: (index, requested bytes) while open; index `NONE` once freed,
    // so that a second free of the address is seen without a second map.
    let mut open: FxHashMap<u64, (u32, u64)> = FxHashMap::default();
    let mut double_frees = DoubleFrees::default();
    let mut window = WindowStart::default();
    // Changes per event; levels are computed once the start levels are known.
    let mut requested = Deltas::new(n);
    // The allocated curve is the requested one rounded, but at these events: (event, change),
    // in order, and the dump's exact block sizes by event.
    let mut allocated_exceptions: Vec<(u32, i64)> = Vec::new();
    let mut exact_corrections: FxHashMap<u32, i64> = FxHashMap::default();
    // Reserved memory changes only at segment events: (event, change).
    let mut reserved: Vec<(u32, i64)> = Vec::new();
    let mut requested_start: i64 = 0;
    let mut allocated_start: i64 = 0;
    let mut known_segments: rustc_hash::FxHashSet<u64> = Default::default();
    let mut segment_events: Vec<u32> = Vec::new();
    let mut unmatched_requests: FxHashMap<u64, u32> = FxHashMap::default();

    // An open allocation's first free_requested waits in its free slot, marked here (one bit
    // per allocation), until the free comes.
    let mut open_requests: Vec<u64> = Vec::new();
    // Closing at event i: the block was the rounded request (exact sizes come from the dump,
    // only for blocks still open at the end). `rd`, `ad`: the changes of event i so far.
    let close = |allocs: &mut Allocations,
                 open_requests: &mut Vec<u64>,
                 (idx, bytes): (u32, u64),
                 i: usize,
                 rd: &mut i64,
                 ad: &mut i64| {
        let slot = &mut allocs.events[idx as usize][1];
        if take_bit(open_requests, idx) {
            allocs.requests.set(idx, *slot, i as u32);
        }
        *slot = i as u32;
        *rd = rd.saturating_add(signed(bytes).saturating_neg());
        *ad = ad.saturating_add(signed(round_size(bytes)).saturating_neg());
    };

    trace.for_each_core(0..n, |i, e| {
        // This event's changes of the three curves.
        let (mut dr, mut da, mut dres) = (0i64, 0i64, 0i64);
        match e.action {
            Action::Alloc => {
                let idx = allocs.events.len() as u32;
                if let Some(old) = open.insert(e.addr, (idx, e.size)) {
                    if old.0 != NONE {
                        window.lost_frees += 1;
                        close(&mut allocs, &mut open_requests, old, i, &mut dr, &mut da);
                    }
                }
                dr = dr.saturating_add(signed(e.size));
                da = da.saturating_add(signed(round_size(e.size)));
                allocs.events.push([i as u32, NONE]);
            }
            Action::FreeRequested => match open.get(&e.addr) {
                Some(&(idx, _)) if idx != NONE => {
                    if !bit(&open_requests, idx) {
                        set_bit(&mut open_requests, idx);
                        allocs.events[idx as usize][1] = i as u32;
                    }
                }
                // Allocated before the window; counted once its free completes (as MemoryViz
                // does: a lone free_requested is not an allocation event).
                _ => {
                    unmatched_requests.entry(e.addr).or_insert(i as u32);
                }
            },
            Action::FreeCompleted => {
                let slot = open.entry(e.addr).or_insert((NONE, 0));
                if slot.0 != NONE {
                    let old = std::mem::replace(slot, (NONE, FREED));
                    close(&mut allocs, &mut open_requests, old, i, &mut dr, &mut da);
                } else {
                    if slot.1 == FREED {
                        double_frees.count += 1;
                        double_frees.bytes = double_frees.bytes.saturating_add(e.size);
                        double_frees.first.get_or_insert((i as u32, e.addr));
                    }
                    slot.1 = FREED;
                    // Allocated before the window: alive from the start until this free.
                    window.unmatched_frees += 1;
                    requested_start = requested_start.saturating_add(signed(e.size));
                    allocated_start = allocated_start.saturating_add(signed(round_size(e.size)));
                    let idx = allocs.events.len() as u32;
                    allocs.events.push([NONE, NONE]);
                    if let Some(r) = unmatched_requests.remove(&e.addr) {
                        set_bit(&mut open_requests, idx);
                        allocs.events[idx as usize][1] = r;
                    }
                    let closed = (idx, e.size);
                    close(&mut allocs, &mut open_requests, closed, i, &mut dr, &mut da);
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                dres = signed(e.size);
                known_segments.insert(e.addr);
                segment_events.push(i as u32);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                dres = signed(e.size).saturating_neg();
                segment_events.push(i as u32);
                if e.action == Action::SegmentFree && !known_segments.remove(&e.addr) {
                    window.unmatched_segment_frees += 1;
                }
            }
            _ => {}
        }
        requested.push(dr);
        // Where the requested change does not fit the shared table, neither is it rounded.
        if da != rounded(dr) || !matches!(i32::try_from(dr), Ok(d) if d != WIDE) {
            allocated_exceptions.push((i as u32, da));
        }
        if dres != 0 {
            reserved.push((i as u32, dres));
        }
    });
    // Requested free, never freed in the trace.
    for (w, &word) in open_requests.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            let idx = (w * 64) as u32 + word.trailing_zeros();
            word &= word - 1;
            let slot = &mut allocs.events[idx as usize][1];
            allocs.requests.set(idx, *slot, NONE);
            *slot = NONE;
        }
    }

    // The dump's block table: exact sizes for survivors, and ghosts for blocks never traced.
    let mut ghost_streams = HashMap::new();
    for seg in snapshot.segments_of(device) {
        for b in &seg.blocks {
            if !b.state.is_active() {
                continue;
            }
            match open.get(&b.address) {
                Some(&(idx, bytes)) if idx != NONE => {
                    let exact = signed(b.size).saturating_sub(signed(round_size(bytes)));
                    if exact != 0 {
                        // Correct the estimate where it entered the curve.
                        match opt(allocs.events[idx as usize][0]) {
                            Some(ev) => {
                                let c = exact_corrections.entry(ev).or_default();
                                *c = c.saturating_add(exact);
                            }
                            None => allocated_start = allocated_start.saturating_add(exact),
                        }
                    }
                    allocs.exact.insert(idx, b.size);
                    open.remove(&b.address);
                }
                _ if b.state == BlockState::ActiveAllocated => {
                    window.ghosts += 1;
                    requested_start = requested_start.saturating_add(signed(b.requested_size));
                    allocated_start = allocated_start.saturating_add(signed(b.size));
                    allocs.push_ghost(b, seg.stream, &mut ghost_streams);
                }
                _ => {
                    window.uncounted_pending_blocks += 1;
                    window.uncounted_pending_bytes =
                        window.uncounted_pending_bytes.saturating_add(b.size);
                }
            }
        }
    }

    let final_reserved: i64 = snapshot
        .segments_of(device)
        .fold(0i64, |sum, s| sum.saturating_add(signed(s.total_size)));
    // Undoing the trace from the dump, in 128 bits: a start past the 64-bit range is kept at
    // its end, which the curve's index reads as an overflow at the start.
    let reserved_sum: i128 = reserved.iter().map(|&(_, d)| i128::from(d)).sum();
    let reserved_start = (i128::from(final_reserved) - reserved_sum)
        .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;

    // Each curve's index is a pass over every event: the two run side by side.
    let mut requested = requested.into_curve_with(requested_start, false);
    let allocated_exceptions =
        with_corrections(&requested, allocated_exceptions, exact_corrections);
    let mut allocated =
        Curve::rounded_with(allocated_start, &requested, allocated_exceptions, false);
    rayon::join(|| requested.index(), || allocated.index());
    DeviceReplay {
        device,
        events: n,
        allocations: allocs,
        requested,
        allocated,
        reserved: Curve::from_changes(reserved_start, n, reserved),
        segment_events,
        window,
        double_frees,
    }
}

/// `exceptions` (in event order) with `corrections` added to the changes of their events (an
/// event without an exception had the rounded change of `requested`).
fn with_corrections(
    requested: &Curve,
    exceptions: Vec<(u32, i64)>,
    corrections: FxHashMap<u32, i64>,
) -> Vec<(u32, i64)> {
    if corrections.is_empty() {
        return exceptions;
    }
    let mut corrections: Vec<(u32, i64)> = corrections.into_iter().collect();
    corrections.sort_unstable();
    let mut out = Vec::with_capacity(exceptions.len() + corrections.len());
    let mut exceptions = exceptions.into_iter().peekable();
    for (e, c) in corrections {
        while let Some(x) = exceptions.next_if(|x| x.0 < e) {
            out.push(x);
        }
        let base = match exceptions.next_if(|x| x.0 == e) {
            Some((_, v)) => v,
            None => rounded(requested.change(e as usize)),
        };
        out.push((e, base.saturating_add(c)));
    }
    out.extend(exceptions);
    out
}

/// Bytes as a signed level. Sizes beyond `i64::MAX` (corrupt: no device holds 8 EiB) are clamped
/// and the levels saturate instead of wrapping; `analysis::quality` flags such sizes.
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl DeviceReplay {
    /// Allocations alive after `event` (`None` = window start), by value: what analyses of
    /// big traces use.
    pub fn live(&self, event: Option<u32>) -> impl Iterator<Item = Allocation> + '_ {
        self.allocations.live(event)
    }

    /// `f` of each of [`live`](Self::live), on every core (a big trace's peak holds hundreds
    /// of thousands of allocations), in the same order.
    pub fn live_map<T: Send>(
        &self,
        event: Option<u32>,
        f: impl Fn(Allocation) -> T + Sync + Send,
    ) -> Vec<T> {
        self.allocations.live_map(event, f)
    }

    /// [`live`](Self::live) as references into the full list of allocations (built on first
    /// use: for the pictures).
    pub fn live_after(&self, event: Option<u32>) -> impl Iterator<Item = &Allocation> {
        self.allocations
            .iter()
            .filter(move |a| a.alive_after(event))
    }

    /// True when the trace shows that allocations were made before its first event.
    pub fn starts_mid_run(&self) -> bool {
        self.window.unmatched_frees > 0 || self.window.unmatched_segment_frees > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_changes_read_back_one_by_one_and_in_runs() {
        // Zeros in runs and alone, across words (64) and blocks (STEP).
        let plain: Vec<i32> = (0..1500i32)
            .map(|i| match i % 7 {
                0 | 3 => 0,
                _ if (300..700).contains(&i) => 0,
                _ => i * if i % 2 == 0 { 1 } else { -1 },
            })
            .collect();
        let mut c = EventChanges::with_capacity(plain.len());
        for &d in &plain {
            c.push(d);
        }
        assert_eq!(c.len(), plain.len());
        // Each event alone (its rank counted), and all in order with one cursor.
        let mut in_order = RankCursor::default();
        for (i, &d) in plain.iter().enumerate() {
            assert_eq!(c.get(i, &mut RankCursor::default()), Some(d), "event {i}");
            assert_eq!(c.get(i, &mut in_order), Some(d), "event {i} in order");
        }
        assert_eq!(c.get(plain.len(), &mut in_order), None);
        // A cursor left elsewhere is not trusted.
        assert_eq!(c.get(1000, &mut in_order), Some(plain[1000]));
        for (first, end) in [
            (0, 1500),
            (1, 64),
            (63, 65),
            (250, 770),
            (700, 700),
            (1499, 1500),
        ] {
            let run: Vec<i32> = c.range(first, end).collect();
            assert_eq!(run, plain[first..end], "{first}..{end}");
        }
        assert_eq!(c.values.len(), plain.iter().filter(|&&d| d != 0).count());
    }

    #[test]
    fn free_requests_right_before_the_free_take_a_bit_and_others_an_entry() {
        let mut r = FreeRequests::default();
        r.set(0, 10, 11);
        r.set(70, 20, 25);
        r.set(130, 30, NONE);
        r.set(131, u32::MAX, NONE);
        assert_eq!(r.of(0, 11), 10);
        assert_eq!(r.of(70, 25), 20);
        assert_eq!(r.of(130, NONE), 30);
        // Allocations without one, also past the bits and beside one that has a bit.
        assert_eq!(r.of(1, 12), NONE);
        assert_eq!(r.of(5000, 7), NONE);
        assert_eq!(r.other.len(), 3);
        assert_eq!(r.before_free.len(), 1);
    }

    #[test]
    fn round_size_matches_pytorch_default() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(3 << 20), 3 << 20);
    }

    #[test]
    fn curves_from_changes_sparse_or_dense_have_the_same_levels() {
        let len = 40;
        for every in [1usize, 2, 7, 39] {
            let changes: Vec<(u32, i64)> = (0..len)
                .filter(|i| i % every == 0)
                .map(|i| (i as u32, if i % 3 == 0 { -(i as i64) } else { 1 << 40 }))
                .collect();
            let mut level = 100i64;
            let mut levels = vec![0i64; len];
            let mut next = changes.iter().peekable();
            for (i, out) in levels.iter_mut().enumerate() {
                if let Some(&(_, d)) = next.next_if(|&&(e, _)| e as usize == i) {
                    level += d;
                }
                *out = level;
            }
            let c = Curve::from_changes(100, len, changes);
            assert!(c.levels().eq(levels.iter().copied()), "every {every}");
            assert_eq!(
                c.peak(),
                Curve::from_levels(100, &levels).peak(),
                "every {every}"
            );
        }
    }

    /// The peak of a range of events, from block peaks and the ends, is the first highest level
    /// a walk over every event of the range finds: any range, dense or sparse curves, ties.
    #[test]
    fn peak_between_finds_what_a_walk_over_the_levels_finds() {
        let mut next = numbers(0x2545_f491_4f6c_dd1du64);
        for case in 0..60 {
            let len = 1 + next(4 * STEP as u64) as usize;
            let every = 1 + next(8);
            let mut changes: Vec<(u32, i64)> = Vec::new();
            for i in 0..len as u32 {
                // Few distinct values: equal peaks in several blocks.
                let d = next(5) as i64 - 2;
                if next(every) == 0 && d != 0 {
                    changes.push((i, d));
                }
            }
            let c = Curve::from_changes(3, len, changes);
            for _ in 0..40 {
                let first = next(len as u64 + 3) as usize;
                let last = first + next(3 * STEP as u64) as usize;
                let want = c.levels_from(first).zip(first as u32..=last as u32).fold(
                    (i64::MIN, first as u32),
                    |best, x| if x.0 > best.0 { x } else { best },
                );
                assert_eq!(
                    c.peak_between(first, last),
                    want,
                    "case {case}: {first}..={last} of {len}"
                );
            }
        }
    }

    /// Pseudo-random numbers below `n` (xorshift), the same for the same seed.
    fn numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    /// `c`'s peak and levels below zero are those of a walk over `levels` from `start`.
    fn assert_index_walks(c: &Curve, start: i64, levels: &[i64], case: usize) {
        let mut peak = (start, None);
        let mut below = (start < 0).then_some((None, start));
        let mut count = (start < 0) as u64;
        for (i, &v) in levels.iter().enumerate() {
            if v > peak.0 {
                peak = (v, Some(i as u32));
            }
            if v < 0 {
                count += 1;
                below.get_or_insert((Some(i as u32), v));
            }
        }
        assert_eq!(c.peak(), peak, "case {case}");
        assert_eq!(c.first_below_zero(), below, "case {case}");
        assert_eq!(c.below_zero_count(), count, "case {case}");
    }

    /// A sparse curve's index (taken run by run between its changes) says what a walk over
    /// every level says: the peak, the first level below zero and how many are.
    #[test]
    fn sparse_curves_index_as_a_walk_over_every_event() {
        let mut next = numbers(0x9e37_79b9_7f4a_7c15u64);
        for case in 0..80 {
            let len = 1 + next(5 * STEP as u64) as usize;
            let start = next(7) as i64 - 3;
            let mut changes: Vec<(u32, i64)> = Vec::new();
            for i in 0..len as u32 {
                let d = next(7) as i64 - 3;
                if next(40) == 0 && d != 0 {
                    changes.push((i, d));
                }
            }
            let c = Curve::from_changes(start, len, changes);
            assert_eq!(c.deltas.len(), 0, "case {case}: sparse");
            let levels: Vec<i64> = c.levels().collect();
            assert_index_walks(&c, start, &levels, case);
            for n in [0, len / 3, len / 2, len - 1, len] {
                let want = if n == 0 { start } else { levels[n - 1] };
                assert_eq!(c.level(n), want, "case {case}: level after {n}");
            }
        }
    }

    /// A rounded curve's index (the shared table rounded, but at its exceptions) says what a
    /// walk over every event's change says.
    #[test]
    fn rounded_curves_index_as_a_walk_over_every_event() {
        let mut next = numbers(0x2545_f491_4f6c_dd1du64);
        for case in 0..60 {
            let len = 1 + next(5 * STEP as u64) as usize;
            let mut deltas = Deltas::new(len);
            let mut exceptions = Vec::new();
            for i in 0..len {
                let d = next(4000) as i64 - 2000;
                deltas.push(d);
                if next(9) == 0 {
                    exceptions.push((i as u32, next(5000) as i64 - 2500));
                }
            }
            // As the replay builds them: the rounded curve from the unindexed one, then both
            // indexed.
            let mut requested = deltas.into_curve_with(next(3000) as i64 - 1500, false);
            assert_eq!(requested.deltas.len(), len, "case {case}: dense");
            let start = next(3000) as i64 - 1500;
            let mut c = Curve::rounded_with(start, &requested, exceptions, false);
            requested.index();
            c.index();
            let levels: Vec<i64> = (0..len)
                .scan(start, |level, i| {
                    *level += c.change(i);
                    Some(*level)
                })
                .collect();
            assert_index_walks(&c, start, &levels, case);
            for n in [1, len / 3, len / 2, len] {
                assert_eq!(c.level(n), levels[n - 1], "case {case}: level after {n}");
            }
        }
    }

    #[test]
    fn peak_includes_start_level() {
        let c = Curve::from_levels(10, &[5, 7, 10]);
        assert_eq!(c.peak(), (10, None));
        let c = Curve::from_levels(0, &[5, 7, 7]);
        assert_eq!(c.peak(), (7, Some(1)));
    }
}
