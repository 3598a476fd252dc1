//! The parallel reader: protocol 4/5 pickles straight to the typed model, on every core, without
//! building the generic document of the trace.
//!
//! 1. `pickle::scan` cuts the input at FRAME boundaries and counts MEMOIZE per chunk.
//! 2. Each chunk runs in its own machine ([`vm`]): trace entries become compact rows, frames
//!    lists become stack slots; what needs earlier chunks is handed on as macros.
//! 3. The stitch runs the macros of all chunks in order: the skeleton (segments, settings, the
//!    lists that hold the rows) and the few opcodes that cross chunks.
//! 4. Chunk-local stack slots and strings become interner ids; rows are rewritten in parallel.
//! 5. The skeleton becomes a small [`Document`] and goes through the ordinary decoder, with the
//!    compact traces put in place of the device lists.
//!
//! Whatever this does not handle returns `None` and the sequential reader runs instead; the
//! tests check that both give the same snapshot for every fixture.

mod probe;
mod vm;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::decode::decode_parts;
use super::intern::{Frame, FrameId, Interner, StackId, TextId};
use super::model::{Segment, Snapshot};
use super::trace::{Part, Trace};
use crate::pickle::scan::{self, Chunk, End};
use crate::pickle::{DictId, Document, PickleError, SeqId, StrId, Value};
use crate::timing::Timer;
use vm::{ChunkOut, Copier, Ctx, FrameC, LVal, Macro, Resolved, SegRow, Slot, Unsupported, Vm, R};

/// Bytes per chunk: small enough to spread over the cores, large enough that little crosses.
/// Files of [`BIG_FILE`] and more take chunks twice as large: each chunk learns the frames
/// lists it sees again (a list first seen in a chunk is read fetch by fetch, later ones by
/// their bytes), and on notHanmin x280 2 MiB chunks took 0.880 s where 1 MiB took 0.910 s
/// (median of 9 runs each, alternating; CPU 1.67 -> 1.62 s). Smaller files keep 1 MiB: the
/// pages a thread has mapped count as resident memory, and MAGMA27 x200's peak went from
/// 0.48x to 0.50x its size with 2 MiB.
const CHUNK_BYTES: usize = 1 << 20;
const BIG_FILE: usize = 512 << 20;

/// [`CHUNK_BYTES`] for a file of `len` bytes.
fn chunk_bytes(len: usize) -> usize {
    match len >= BIG_FILE {
        true => 2 * CHUNK_BYTES,
        false => CHUNK_BYTES,
    }
}

/// With two threads, the helper runs the last `HELPER_SHARE.0 / HELPER_SHARE.1` of the bytes.
/// When the first thread's share turns out too large (on torch's dumps the segments at the
/// front take several times longer per byte than the trace), the helper evens it out by taking
/// chunks back; a share too small would not be evened out, so the helper's errs on the small
/// side. (When the helper must walk to its base instead, see [`walked_start`], half is more
/// than it can run in time, and the first thread ends first and waits: with the walk, three
/// eighths evened out. The probe found the base on every real-shaped dump tried.)
const HELPER_SHARE: (usize, usize) = (1, 2);

/// Why the parallel reader gives no snapshot.
pub enum Fail {
    /// The sequential reader must do it.
    Unsupported,
    /// The pickle is cut (and salvage was not asked for).
    Truncated(PickleError),
}

impl From<Unsupported> for Fail {
    fn from(_: Unsupported) -> Fail {
        Fail::Unsupported
    }
}

/// A snapshot, and the truncation when it was salvaged from a cut pickle.
pub type Loaded = (Snapshot, Option<PickleError>);

/// Reads a snapshot with the parallel reader. `release(start, end)` is called for byte ranges
/// read for now (see `InputBytes::release`). With `salvage`, a cut pickle gives what is
/// complete (as `pickle::parse_salvage` keeps it).
///
/// `done` counts progress for a bar over `data.len()`: each chunk adds its length when it has
/// run; when every chunk is walked first, the walk (about a quarter of the time) adds a
/// quarter of the length and each chunk three quarters of its own.
///
/// `peek(pos, buf)` copies bytes at `pos` without touching `data`'s pages (see
/// `InputBytes::peek`).
pub fn load(
    data: &[u8],
    release: &(dyn Fn(usize, usize) + Sync),
    peek: &(dyn Fn(usize, &mut [u8]) -> usize + Sync),
    done: &AtomicU64,
    salvage: bool,
) -> Result<Loaded, Fail> {
    load_inner(data, release, peek, done, chunk_bytes(data.len()), salvage)
}

/// [`load`] with chunks of about `chunk_bytes` (tests use one frame per chunk, so that every
/// structure crosses chunks).
pub fn load_chunked(data: &[u8], chunk_bytes: usize, salvage: bool) -> Result<Loaded, Fail> {
    load_inner(
        data,
        &|_, _| {},
        &|p, b| crate::input::peek_slice(data, p, b),
        &AtomicU64::new(0),
        chunk_bytes.max(1),
        salvage,
    )
}

fn load_inner(
    data: &[u8],
    release: &(dyn Fn(usize, usize) + Sync),
    peek: &(dyn Fn(usize, &mut [u8]) -> usize + Sync),
    done: &AtomicU64,
    chunk_bytes: usize,
    salvage: bool,
) -> Result<Loaded, Fail> {
    let mut t = Timer::new();
    let plan = scan::plan(data, chunk_bytes, peek).ok_or(Unsupported)?;
    t.lap("plan");
    let threads = rayon::current_num_threads();
    let in_order = if threads <= 2 && plan.header_cut.is_none() {
        // Anything unusual (a cut, STOP early, a count that disagrees) is left to the
        // parallel walk below, which words it.
        match read_in_order(data, &plan, release, peek, done, threads == 2) {
            Ok(read) => Some(read),
            Err(InOrderFail::Retry) => None,
            Err(InOrderFail::SequentialOnly) => return Err(Fail::Unsupported),
        }
    } else {
        None
    };
    let (ctx, outs, cut) = match in_order {
        Some((ctx, outs)) => (ctx, outs, None),
        None => {
            done.store(0, Ordering::Relaxed);
            let headers = plan.headers.clone();
            let s = scan::scan(data, plan, release).ok_or(Unsupported)?;
            done.fetch_add(data.len() as u64 / 4, Ordering::Relaxed);
            t.lap("scan");
            let cut = match s.end {
                End::Stop(_) => None,
                End::Truncated(at) => Some(at),
            };
            let ctx = Ctx::new(data, s.chunks, headers, release, peek);
            let outs: Vec<ChunkOut<'_>> = (0..ctx.spans.len())
                .into_par_iter()
                .map_init(vm::Spare::default, |spare, k| {
                    let out = vm::run_chunk(&ctx, k, spare)?;
                    let chunk = &ctx.spans[k];
                    release(chunk.start, chunk.end);
                    done.fetch_add((chunk.end - chunk.start) as u64 * 3 / 4, Ordering::Relaxed);
                    // The machine counts the MEMOIZEs it ran: the walk's count must agree.
                    ctx.set_counts(k, ctx.memo_base(k).ok_or(Unsupported)?, out.memos)?;
                    Ok(out)
                })
                .collect::<R<Vec<_>>>()?;
            (ctx, outs, cut)
        }
    };
    if t.on {
        let parts: usize = outs.iter().map(|o| o.part.heap_bytes()).sum();
        let rows: usize = outs.iter().map(|o| o.part.len()).sum();
        let lists: usize = outs.iter().map(|o| o.memo_lists.len()).sum();
        let slots: usize = outs.iter().map(|o| o.slots.len()).sum();
        let frames: usize = outs.iter().map(|o| o.frames.len()).sum();
        let strs: usize = outs.iter().map(|o| o.a.strs.len()).sum();
        let macros: usize = outs.iter().map(|o| o.macros.len()).sum();
        eprintln!(
            "chunks: {} rows, parts {} MB, {lists} lists, {slots} slots, {frames} frames, \
             {strs} strings, {macros} macros",
            rows,
            parts >> 20
        );
    }
    t.lap("chunks");
    let mut stitch = Vm::stitch(&ctx);
    let mut truncation = None;
    let root = match (run_stitch(&mut stitch, &outs, release)?, cut) {
        (Some(root), None) => root,
        (None, Some(at)) => {
            // The same error the sequential reader gives for this cut.
            let err = PickleError::Truncated {
                offset: at as u64,
                len: data.len() as u64,
                needed: 1,
                inside: stitch.inside(),
            };
            if !salvage {
                return Err(Fail::Truncated(err));
            }
            truncation = Some(err);
            stitch.close_for_salvage()?
        }
        _ => return Err(Fail::Unsupported),
    };
    t.lap("stitch");
    let end = outs.last().and_then(|o| o.stop_end);
    let unknown_keys = unknown_entry_keys(&outs, &stitch);
    let mut s = finish(&ctx, outs, stitch, root, &mut t)?;
    merge_unknown_keys(&mut s.unknown_entry_keys, unknown_keys);
    s.after_stop = end.and_then(|e| super::AfterStop::of(e, data.len()));
    t.lap("decode");
    Ok((s, truncation))
}

/// The keys of trace entries that the chunks and the stitch did not read, with their counts.
fn unknown_entry_keys(outs: &[ChunkOut<'_>], stitch: &Vm<'_, '_>) -> FxHashMap<String, u64> {
    let mut all: FxHashMap<String, u64> = FxHashMap::default();
    for (k, n) in outs
        .iter()
        .flat_map(|o| o.unknown_keys.iter())
        .chain(stitch.unknown_keys())
    {
        *all.entry((*k).to_owned()).or_default() += n;
    }
    all
}

/// Adds `more` to the decoder's own count (entries the document held), most first.
fn merge_unknown_keys(counts: &mut Vec<(String, u64)>, more: FxHashMap<String, u64>) {
    if more.is_empty() {
        return;
    }
    let mut all: FxHashMap<String, u64> = counts.drain(..).collect();
    for (k, n) in more {
        *all.entry(k).or_default() += n;
    }
    counts.extend(all);
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
}

/// Tests: the chunk where the helper of [`read_in_order`] starts (`usize::MAX`: the one at
/// [`HELPER_SHARE`] of the bytes).
static FORCED_SPLIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Tests: whether chunks hand the stitch the bytes of short opcodes (see `vm::RAW_INLINE`).
pub fn keep_raw_bytes(keep: bool) {
    vm::KEEP_RAW_BYTES.store(keep, Ordering::Relaxed);
}

/// Sets [`FORCED_SPLIT`].
pub fn force_split(chunk: Option<usize>) {
    FORCED_SPLIT.store(chunk.unwrap_or(usize::MAX), Ordering::Relaxed);
}

/// Runs the chunks in order, each from the memo index where the one before it ended: no walk
/// beforehand to count MEMOIZEs (on one or two cores that walk costs a fifth of the time).
///
/// With `helper`, a second thread takes the chunks from `split` on (about half-way, by bytes).
/// It needs the memo base there. It reads it from inside one of the first chunks from `split`
/// (see [`probe`]; the first thread's share then ends there), else it walks the chunks before
/// `split` from the back (see [`walked_start`]). Then it runs its chunks in order; fetches of
/// values stored before its first chunk count the chunks they need (`Ctx::count_for`). Done,
/// it takes the first thread's last chunks from the back, their bases counted back from the
/// chunk after them, so that neither thread waits long for the other. A probed base is checked
/// where the first thread reaches the helper's first chunk (or a base counted from it): the
/// bases must agree. Fails (for the parallel walk to take over) on anything unusual: a cut
/// input, STOP before the last chunk, counts that disagree.
///
/// The probe saves the walk: on notHanmin x280 the helper walked ~470 chunks before it could
/// start (~200 ms of its time); with the probe its lookups count the first ~40 chunks instead
/// (walked, not run) and the chunk stage takes ~480 instead of ~580 ms.
fn read_in_order<'a>(
    data: &'a [u8],
    plan: &scan::Plan,
    release: &'a (dyn Fn(usize, usize) + Sync),
    peek: &'a (dyn Fn(usize, &mut [u8]) -> usize + Sync),
    done: &AtomicU64,
    helper: bool,
) -> Result<(Ctx<'a>, Vec<ChunkOut<'a>>), InOrderFail> {
    let n = plan.ranges.len();
    let chunks: Vec<Chunk> = plan
        .ranges
        .iter()
        .map(|&(start, end)| Chunk {
            start,
            end,
            memo_base: vm::UNKNOWN,
            memos: vm::UNKNOWN,
        })
        .collect();
    let ctx = Ctx::new(data, chunks, plan.headers.clone(), release, peek);
    if n > 0 {
        ctx.set_counts(0, 0, vm::UNKNOWN)?;
    }
    // The helper's first chunk. Tests force one (and make the first thread wait after chunk
    // `forced / 8`, so that the helper takes chunks back).
    let forced = FORCED_SPLIT.load(Ordering::Relaxed);
    let split = match (helper, forced) {
        (false, _) => n,
        (true, usize::MAX) => {
            let at = data.len() / HELPER_SHARE.1 * (HELPER_SHARE.1 - HELPER_SHARE.0);
            plan.ranges.partition_point(|&(start, _)| start < at).max(1)
        }
        (true, k) => k,
    }
    .min(n);
    let wait_after = (forced != usize::MAX).then_some(split / 8);
    // (next chunk of the first thread, first chunk of the helper).
    let claims = Mutex::new((0usize, split));
    let batch = release_batch(data.len());
    let run = |k: usize,
               base: u32,
               spare: &mut vm::Spare<'a>,
               behind: &mut Behind<'a>|
     -> R<(ChunkOut<'a>, u32)> {
        ctx.set_counts(k, base, vm::UNKNOWN)?;
        let out = vm::run_chunk(&ctx, k, spare)?;
        ctx.set_counts(k, base, out.memos)?;
        let c = &ctx.spans[k];
        behind.add(c.start, c.end);
        done.fetch_add((c.end - c.start) as u64, Ordering::Relaxed);
        if out.stopped && k + 1 != n {
            return Err(Unsupported);
        }
        let next = base.checked_add(out.memos).ok_or(Unsupported)?;
        if k + 1 < n {
            // The next chunk's base is known now (a helper may be waiting for it).
            ctx.set_counts(k + 1, next, vm::UNKNOWN)?;
        }
        Ok((out, next))
    };
    // Where the helper is (see `Helper`): the first thread waits on it only once it has
    // started (a thread pool busy elsewhere may never start it).
    let helper_at = AtomicU8::new(if split < n {
        Helper::NotStarted
    } else {
        Helper::Abandoned
    } as u8);
    let helper_is = |h: Helper| helper_at.load(Ordering::Acquire) == h as u8;
    // Moves the helper from `from` to `to`; false if it was elsewhere.
    let helper_moves = |from: Helper, to: Helper| {
        helper_at
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    };
    let first_chunks = || -> R<Vec<ChunkOut<'a>>> {
        let mut outs = Vec::new();
        let mut spare = vm::Spare::default();
        let mut behind = Behind::new(release, batch);
        let mut base = 0u32;
        loop {
            if wait_after.is_some_and(|w| outs.len() > w) {
                // Tests: until the helper has run its chunks (if it has started).
                helper_moves(Helper::NotStarted, Helper::Abandoned);
                while helper_is(Helper::Walking) || helper_is(Helper::Running) {
                    std::thread::yield_now();
                }
            }
            let k = {
                let mut c = claims.lock().map_err(|_| Unsupported)?;
                if c.0 >= c.1 {
                    if helper_moves(Helper::NotStarted, Helper::Abandoned) {
                        // The helper has not started: every chunk is the first thread's.
                        c.1 = n;
                        continue;
                    }
                    if !helper_is(Helper::Walking) {
                        break;
                    }
                    // At the split before the helper has its base (or has given up).
                    drop(c);
                    std::thread::yield_now();
                    continue;
                }
                c.0 += 1;
                c.0 - 1
            };
            let (out, next) = run(k, base, &mut spare, &mut behind)?;
            base = next;
            outs.push(out);
        }
        Ok(outs)
    };
    // Gives the helper's chunks to the first thread.
    let give_up = || -> R<Vec<ChunkOut<'a>>> {
        claims.lock().map_err(|_| Unsupported)?.1 = n;
        helper_at.store(Helper::Done as u8, Ordering::Release);
        Ok(Vec::new())
    };
    let second_chunks = || -> R<Vec<ChunkOut<'a>>> {
        if !helper_moves(Helper::NotStarted, Helper::Walking) {
            return Ok(Vec::new());
        }
        let mut behind = Behind::new(release, batch);
        let (start, mut base) = match probed_start(data, &plan.ranges, split, &claims)? {
            Some(found) => found,
            None => match walked_start(data, &plan.ranges, split, &ctx, &mut behind)? {
                Some(base) => (split, base),
                None => return give_up(),
            },
        };
        helper_at.store(Helper::Running as u8, Ordering::Release);
        let mut outs = Vec::new();
        let mut spare = vm::Spare::default();
        for k in start..n {
            let (out, next) = run(k, base, &mut spare, &mut behind)?;
            base = next;
            outs.push(out);
        }
        helper_at.store(Helper::Done as u8, Ordering::Release);
        // Done first: take the first thread's chunks from the back, half of what it has left
        // at a time (at most a walk's lanes), so that neither thread waits long for the other.
        // Their bases were walked before the split, or are counted back from the chunk after.
        let mut taken = Vec::new();
        loop {
            let (lo, hi) = {
                let mut c = claims.lock().map_err(|_| Unsupported)?;
                if c.1 <= c.0 {
                    break;
                }
                let take = (c.1 - c.0).div_ceil(2).min(scan::LANES);
                c.1 -= take;
                (c.1, c.1 + take)
            };
            if (lo..hi).any(|k| ctx.memo_base(k).is_none()) && !ctx.count_chunks(lo..hi, true) {
                return Err(Unsupported);
            }
            for k in (lo..hi).rev() {
                let base = ctx.memo_base(k).ok_or(Unsupported)?;
                taken.push(run(k, base, &mut spare, &mut behind)?.0);
            }
        }
        taken.reverse();
        taken.extend(outs);
        Ok(taken)
    };
    let (a, b) = if helper {
        // Whatever the helper returns, the first thread stops waiting on it.
        let second = || {
            let out = second_chunks();
            helper_moves(Helper::Walking, Helper::Done);
            helper_moves(Helper::Running, Helper::Done);
            out
        };
        rayon::join(first_chunks, second)
    } else {
        (first_chunks(), Ok(Vec::new()))
    };
    let fail = || {
        if ctx.sequential_only.load(Ordering::Relaxed) {
            InOrderFail::SequentialOnly
        } else {
            InOrderFail::Retry
        }
    };
    let mut outs = a.map_err(|_| fail())?;
    outs.extend(b.map_err(|_| fail())?);
    if outs.len() != n || !outs.last().is_some_and(|o| o.stopped) {
        return Err(InOrderFail::Retry);
    }
    ctx.seal_counts()?;
    Ok((ctx, outs))
}

/// Chunks from the split on that [`probed_start`] tries.
const PROBES: usize = 4;

/// Tests: added to every probed base (a wrong one must be caught).
static PROBE_ERROR: AtomicU32 = AtomicU32::new(0);

/// Tests: sets [`PROBE_ERROR`].
pub fn force_probe_error(by: u32) {
    PROBE_ERROR.store(by, Ordering::Relaxed);
}

/// Where the helper of [`read_in_order`] starts when it can read its memo base from inside a
/// chunk (see [`probe`]): the first of [`PROBES`] chunks from `split` that gives one, with its
/// base; the first thread's share then ends there. `None` when none does (or the first thread
/// is past them).
fn probed_start(
    data: &[u8],
    ranges: &[(usize, usize)],
    split: usize,
    claims: &Mutex<(usize, usize)>,
) -> R<Option<(usize, u32)>> {
    for (k, &(start, end)) in ranges.iter().enumerate().skip(split).take(PROBES) {
        let Some(base) = probe::memo_base(data, start, end) else {
            continue;
        };
        let base = base.wrapping_add(PROBE_ERROR.load(Ordering::Relaxed));
        let mut c = claims.lock().map_err(|_| Unsupported)?;
        if c.0 > k {
            return Ok(None);
        }
        c.1 = k;
        return Ok(Some((k, base)));
    }
    Ok(None)
}

/// The memo base at `split` counted as before the probe: the chunks before it walked from the
/// back (the last one first) until the first thread has recorded the base of the lowest (as it
/// starts a chunk, and as it ends the one before; chunk 0's is known from the start); their
/// bases recorded. `None` when a walk finds what the machines do not run (left to the first
/// thread, which fails there if it must).
fn walked_start(
    data: &[u8],
    ranges: &[(usize, usize)],
    split: usize,
    ctx: &Ctx<'_>,
    behind: &mut Behind<'_>,
) -> R<Option<u32>> {
    let mut walked: Vec<u32> = Vec::new();
    let mut low = split;
    while ctx.memo_base(low).is_none() {
        let from = low.saturating_sub(scan::LANES);
        let group = &ranges[from..low];
        let walks = scan::walk_in_order(data, group);
        for w in walks.iter().rev() {
            if !w.is_plain() {
                return Ok(None);
            }
            walked.push(w.memos);
        }
        for &(s, e) in group.iter().rev() {
            behind.add(s, e);
        }
        low = from;
    }
    let Some(mut base) = ctx.memo_base(low) else {
        return Ok(None);
    };
    for (j, &memos) in walked.iter().rev().enumerate() {
        ctx.set_counts(low + j, base, memos)?;
        base = base.checked_add(memos).ok_or(Unsupported)?;
    }
    Ok(Some(base))
}

/// How many bytes read [`read_in_order`] lets each thread keep mapped before it releases them
/// (0: every chunk as it is done). Each release is a system call and, with two threads, an
/// interrupt of the other core, which drops its cached translations of the pages: per chunk,
/// notHanmin x280 made 930 of them, and batches of 16 MiB cut its system time by about a
/// fifth (0.34 -> 0.28 s, median wall 1.09 -> 1.04 s). The pages kept, at most two batches,
/// count as resident memory: only what a file has above 256 MiB pays for them, a thirty-second
/// of it (the 100 MB replicas' peaks are 0.34-0.48x their size, against a target of 0.5x).
fn release_batch(len: usize) -> usize {
    const FREE: usize = 256 << 20;
    const MAX: usize = 16 << 20;
    (len.saturating_sub(FREE) / 32).min(MAX)
}

/// Byte ranges read, handed to `release` together once they add up to `batch` bytes (or stop
/// adjoining); the rest when dropped.
struct Behind<'r> {
    release: &'r (dyn Fn(usize, usize) + Sync),
    batch: usize,
    start: usize,
    end: usize,
}

impl<'r> Behind<'r> {
    fn new(release: &'r (dyn Fn(usize, usize) + Sync), batch: usize) -> Self {
        Behind {
            release,
            batch,
            start: 0,
            end: 0,
        }
    }

    fn add(&mut self, start: usize, end: usize) {
        // Chunks are cut at FRAME headers, which lie between them.
        const GAP: usize = 64;
        if self.start == self.end {
            (self.start, self.end) = (start, end);
        } else if (self.end..=self.end + GAP).contains(&start) {
            self.end = end;
        } else if (end..=end + GAP).contains(&self.start) {
            self.start = start;
        } else {
            self.flush();
            (self.start, self.end) = (start, end);
        }
        if self.end - self.start >= self.batch {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.end > self.start {
            (self.release)(self.start, self.end);
        }
        self.start = self.end;
    }
}

impl Drop for Behind<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Where the helper of [`read_in_order`] is.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Helper {
    NotStarted,
    /// Counting the chunks before its split, from the back.
    Walking,
    /// Running its chunks (the first thread's end at the split is final).
    Running,
    /// Done, given up or failed.
    Done,
    /// Not started when the first thread reached the split (or there is no helper): the
    /// first thread ran every chunk.
    Abandoned,
}

/// Why [`read_in_order`] gave up.
enum InOrderFail {
    /// Something the parallel walk words (a cut, STOP early, counts that disagree).
    Retry,
    /// A chunk holds what the machines are not made for (see `Ctx::sequential_only`): the
    /// parallel walk would fail the same way, so the sequential reader takes the input at once.
    SequentialOnly,
}

impl From<Unsupported> for InOrderFail {
    fn from(_: Unsupported) -> InOrderFail {
        InOrderFail::Retry
    }
}

/// Runs every chunk's macros in order. Returns the root once STOP ran.
fn run_stitch<'a>(
    vm: &mut Vm<'a, '_>,
    outs: &[ChunkOut<'a>],
    release: &(dyn Fn(usize, usize) + Sync),
) -> R<Option<LVal>> {
    for (k, out) in outs.iter().enumerate() {
        if k > 0 {
            // The opcodes run here read the chunk's pages again.
            let c = &vm.ctx.spans[k - 1];
            release(c.start, c.end);
        }
        let mut copier = Copier::new(&out.a, false);
        crate::work::add(out.macros.len() as u64);
        for m in &out.macros {
            match *m {
                Macro::Push(v) => {
                    let smemo = &mut vm.smemo;
                    let v = copier.copy(
                        &mut vm.a,
                        v,
                        &mut |g, val| {
                            smemo.insert(g, val);
                        },
                        0,
                    )?;
                    vm.stack.push(v);
                }
                Macro::Mark => vm.marks.push(vm.stack.len()),
                Macro::Raw {
                    pos,
                    memo,
                    len,
                    bytes,
                } => {
                    if let Some(root) = vm.exec_at(pos, memo, &bytes[..len as usize])? {
                        return Ok(Some(root));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// Ids of one source (a chunk or the stitch) in the interner.
#[derive(Default)]
struct SourceIds {
    texts: Vec<u32>,
    stacks: Vec<u32>,
}

const UNSET: u32 = u32::MAX;

/// Turns chunk-local slots and strings into interner ids.
struct Resolver<'x, 'a, 'c> {
    ctx: &'x Ctx<'a>,
    outs: &'x [ChunkOut<'a>],
    stitch: &'x mut Vm<'a, 'c>,
    interner: Interner,
    ids: Vec<SourceIds>,
    frame_by_memo: FxHashMap<u32, FrameId>,
    list_by_memo: FxHashMap<u32, StackId>,
    /// The frames of the stack being resolved.
    frames_scratch: Vec<FrameId>,
    /// Stacks by the memo indices of their frame dicts.
    stack_by_refs: FxHashMap<Box<[u32]>, StackId>,
}

impl<'a> Resolver<'_, 'a, '_> {
    fn stitch_src(&self) -> usize {
        self.outs.len()
    }

    fn strs(&self, src: usize) -> &[&'a str] {
        if src == self.stitch_src() {
            &self.stitch.a.strs
        } else {
            &self.outs[src].a.strs
        }
    }

    fn text(&mut self, src: usize, i: u32) -> R<TextId> {
        let ids = &mut self.ids[src].texts;
        if ids.len() <= i as usize {
            ids.resize(i as usize + 1, UNSET);
        }
        let cached = ids[i as usize];
        if cached != UNSET {
            return Ok(TextId(cached));
        }
        let s = *self.strs(src).get(i as usize).ok_or(Unsupported)?;
        let id = self.interner.text(&self.ctx.owned_text(s));
        self.ids[src].texts[i as usize] = id.0;
        Ok(id)
    }

    fn stack(&mut self, src: usize, slot: u32) -> R<StackId> {
        if let Some(&id) = self.ids[src].stacks.get(slot as usize) {
            if id != UNSET {
                return Ok(StackId(id));
            }
        }
        // A chunk's slots are read where they are (nothing here changes the chunks' outputs);
        // the stitch's are copied, as resolving may add to the stitch. Copying every slot, and
        // a new frames vector for each, took about 5 of this stage's 40 ms on notHanmin x280.
        let outs = self.outs;
        let copied;
        let content = if src == self.stitch_src() {
            copied = self.stitch.slots.get(slot as usize).cloned();
            copied.as_ref()
        } else {
            outs.get(src).and_then(|o| o.slots.get(slot as usize))
        };
        let id = match content.ok_or(Unsupported)? {
            Slot::Content(refs) => match self.stack_by_refs.get(refs.as_ref()) {
                // Every chunk has its own slot for a stack that repeats across the file; a
                // memo index names the same frame wherever it is fetched from.
                Some(&id) => id,
                None => {
                    let mut frames = std::mem::take(&mut self.frames_scratch);
                    frames.clear();
                    for &g in refs.iter() {
                        frames.push(self.frame(src, g)?);
                    }
                    let id = self.interner.stack_of(&frames);
                    self.frames_scratch = frames;
                    self.stack_by_refs.insert(refs.clone(), id);
                    id
                }
            },
            &Slot::ExtList(g) => self.memo_list(g, 0)?,
        };
        let stacks = &mut self.ids[src].stacks;
        if stacks.len() <= slot as usize {
            stacks.resize(slot as usize + 1, UNSET);
        }
        stacks[slot as usize] = id.0;
        Ok(id)
    }

    /// The stack of the frames list stored under memo index `g`.
    fn memo_list(&mut self, g: u32, depth: usize) -> R<StackId> {
        if let Some(&id) = self.list_by_memo.get(&g) {
            return Ok(id);
        }
        if depth > 8 {
            return Err(Unsupported);
        }
        let id = match self.stitch.smemo.get(&g).copied() {
            Some(LVal::Ext(h)) if h != g => self.memo_list(h, depth + 1)?,
            Some(v @ (LVal::List(_) | LVal::Tuple(_))) => {
                let slot = self.stitch.stack_slot(Some(v))?;
                let src = self.stitch_src();
                self.stack(src, slot)?
            }
            Some(_) => return Err(Unsupported),
            None => {
                let j = self.ctx.chunk_of_memo(g).ok_or(Unsupported)?;
                let out = &self.outs[j];
                let slot = match out.memo_lists.binary_search_by_key(&g, |(m, _)| *m) {
                    Ok(k) => out.memo_lists[k].1,
                    Err(_) => {
                        let base = self.ctx.memo_base(j).ok_or(Unsupported)?;
                        let i = (g - base) as usize;
                        let word = out.empty_lists.get(i / 64).copied().unwrap_or(0);
                        if word & (1 << (i % 64)) == 0 {
                            return Err(Unsupported);
                        }
                        0
                    }
                };
                self.stack(j, slot)?
            }
        };
        self.list_by_memo.insert(g, id);
        Ok(id)
    }

    /// The frame dict stored under memo index `g`, as seen from source `src`.
    fn frame(&mut self, src: usize, g: u32) -> R<FrameId> {
        if let Some(&id) = self.frame_by_memo.get(&g) {
            return Ok(id);
        }
        let (owner, fc) = self.find_frame(src, g, 0)?;
        let frame = Frame {
            name: self.text(owner, fc.name)?,
            filename: self.text(owner, fc.filename)?,
            line: fc.line,
        };
        let id = self.interner.frame(frame);
        self.frame_by_memo.insert(g, id);
        Ok(id)
    }

    fn find_frame(&mut self, src: usize, g: u32, depth: usize) -> R<(usize, FrameC)> {
        let stitch = self.stitch_src();
        if src != stitch {
            if let Ok(k) = self.outs[src].frames.binary_search_by_key(&g, |(m, _)| *m) {
                return Ok((src, self.outs[src].frames[k].1));
            }
        }
        if let Some(fc) = self.stitch.frames.get(&g) {
            return Ok((stitch, *fc));
        }
        if depth > 8 {
            return Err(Unsupported);
        }
        match self.stitch.smemo.get(&g).copied() {
            Some(LVal::Dict(d)) => {
                let fc = self.stitch.capture_frame(d)?;
                self.stitch.frames.insert(g, fc);
                Ok((stitch, fc))
            }
            Some(LVal::Ext(h)) if h != g => self.find_frame(src, h, depth + 1),
            Some(_) => Err(Unsupported),
            None => {
                let j = self.ctx.chunk_of_memo(g).ok_or(Unsupported)?;
                let frames = &self.outs[j].frames;
                let k = frames
                    .binary_search_by_key(&g, |(m, _)| *m)
                    .map_err(|_| Unsupported)?;
                Ok((j, frames[k].1))
            }
        }
    }

    /// Resolves every slot and metadata text of source `src`.
    fn source(&mut self, src: usize) -> R<()> {
        let n = if src == self.stitch_src() {
            self.stitch.slots.len()
        } else {
            self.outs[src].slots.len()
        };
        for slot in 0..n as u32 {
            self.stack(src, slot)?;
        }
        let metas = if src == self.stitch_src() {
            self.stitch.part.metas.clone()
        } else {
            self.outs[src].part.metas.clone()
        };
        for m in metas {
            for t in [
                m.action_text,
                m.user_metadata,
                m.compile_context,
                m.internal_metadata,
            ]
            .into_iter()
            .flatten()
            {
                self.text(src, t.0)?;
            }
        }
        Ok(())
    }
}

fn remap(part: &mut Part, ids: &SourceIds) -> R<()> {
    let ok = (0..part.len()).all(|i| {
        ids.stacks
            .get(part.stack(i) as usize)
            .is_some_and(|&s| s != UNSET)
    });
    if !ok {
        return Err(Unsupported);
    }
    part.remap(
        |s| ids.stacks[s as usize],
        |t| TextId(ids.texts.get(t.0 as usize).copied().unwrap_or(0)),
    );
    Ok(())
}

/// The segments each source read, by row (taken out as the document's list is decoded).
type SourceSegments = Vec<Vec<Option<Segment>>>;

/// Resolution, the skeleton document and the decoder.
fn finish<'a>(
    ctx: &Ctx<'a>,
    mut outs: Vec<ChunkOut<'a>>,
    mut stitch: Vm<'a, '_>,
    root: LVal,
    t: &mut Timer,
) -> R<Snapshot> {
    let sources = outs.len() + 1;
    let mut r = Resolver {
        ctx,
        outs: &outs,
        stitch: &mut stitch,
        interner: Interner::default(),
        ids: (0..sources).map(|_| SourceIds::default()).collect(),
        frame_by_memo: FxHashMap::default(),
        list_by_memo: FxHashMap::default(),
        frames_scratch: Vec::new(),
        stack_by_refs: FxHashMap::default(),
    };
    for src in 0..sources {
        r.source(src)?;
    }
    let Resolver { interner, ids, .. } = r;
    t.lap("resolve");

    // Rewrite the rows in parallel, then share the parts.
    let mut stitch_part = std::mem::take(&mut stitch.part);
    stitch_part.seal();
    remap(&mut stitch_part, &ids[sources - 1])?;
    let mut parts: Vec<Part> = outs
        .iter_mut()
        .map(|o| std::mem::take(&mut o.part))
        .collect();
    parts
        .par_iter_mut()
        .zip(ids.par_iter())
        .map(|(p, i)| remap(p, i))
        .collect::<R<Vec<()>>>()?;
    parts.push(stitch_part);
    let parts: Vec<Arc<Part>> = parts.into_iter().map(Arc::new).collect();
    t.lap("remap");
    // In chunk order, so sorted by memo index.
    let ext_tuples: Vec<(u32, Box<[Resolved<'a>]>)> = outs
        .iter_mut()
        .flat_map(|o| std::mem::take(&mut o.tuples))
        .collect();
    // The segments are rewritten while the skeleton is converted: neither needs the other,
    // and both ran on one core.
    let stitch_segs = std::mem::take(&mut stitch.segs);
    let stitch = &stitch;
    let parts = &parts;
    let ext_tuples = &ext_tuples;
    let (segs, conv) = rayon::join(
        move || -> R<(SourceSegments, Vec<ChunkOut<'a>>)> {
            let mut segs: SourceSegments = outs
                .par_iter_mut()
                .zip(ids.par_iter())
                .map(|(o, i)| {
                    std::mem::take(&mut o.segs)
                        .into_iter()
                        .map(|row| remap_segment(row, i, ext_tuples).map(Some))
                        .collect::<R<Vec<_>>>()
                })
                .collect::<R<Vec<_>>>()?;
            let stitch_segs = stitch_segs
                .into_iter()
                .map(|row| remap_segment(row, &ids[sources - 1], ext_tuples));
            segs.push(stitch_segs.map(|s| s.map(Some)).collect::<R<Vec<_>>>()?);
            Ok((segs, outs))
        },
        || -> R<(Value, ToDoc)> {
            let mut conv = ToDoc {
                ctx,
                vm: stitch,
                parts,
                doc: Document::default(),
                lists: FxHashMap::default(),
                dicts: FxHashMap::default(),
                tuples: FxHashMap::default(),
                ext_tuples,
                ext_tuple_ids: FxHashMap::default(),
                traces: FxHashMap::default(),
                seg_lists: FxHashMap::default(),
                segs_seen: SegsSeen::default(),
                str_ids: vec![NO_STR; stitch.a.strs.len()],
            };
            let root = conv.value(root, 0)?;
            Ok((root, conv))
        },
    );
    let (mut segs, outs) = segs?;
    let (root, conv) = conv?;
    t.lap("segments and skeleton");
    let mut doc = conv.doc;
    let traces = conv.traces;
    let seg_lists = conv.seg_lists;
    doc.root = Some(root);
    let values = doc.seqs.iter().map(Vec::len).sum::<usize>()
        + 2 * doc.dicts.iter().map(Vec::len).sum::<usize>();
    crate::work::add_document_values(values as u64);
    // Sets: a list searched for every key took 20 s for 32 000 device lists.
    let mut used: rustc_hash::FxHashSet<SeqId> = Default::default();
    let mut used_segs: rustc_hash::FxHashSet<SeqId> = Default::default();
    let mut preset_trace = |seq| {
        let t = traces.get(&seq).cloned();
        if t.is_some() {
            used.insert(seq);
        }
        t
    };
    let mut preset_segments = |seq| {
        let rows = seg_lists.get(&seq)?;
        used_segs.insert(seq);
        // Each source's segments are let go once its last one is taken (they come in
        // order): the list and the sources are not held whole side by side.
        let mut left: Vec<usize> = segs.iter().map(Vec::len).collect();
        let mut taken = Vec::with_capacity(rows.len());
        for r in rows {
            let seg = r.and_then(|(src, row)| {
                let (src, row) = (src as usize, row as usize);
                let seg = segs.get_mut(src)?.get_mut(row)?.take();
                if seg.is_some() {
                    left[src] -= 1;
                    if left[src] == 0 {
                        segs[src] = Vec::new();
                    }
                }
                seg
            });
            taken.push(seg);
        }
        Some(taken)
    };
    // The chunks' leftovers are freed while the document is decoded: that runs on one core,
    // and freeing them took 10 ms of notHanmin x280's load.
    let (snapshot, ()) = rayon::join(
        || decode_parts(&doc, interner, &mut preset_trace, &mut preset_segments),
        move || drop(outs),
    );
    let snapshot = snapshot.map_err(|_| Unsupported)?;
    // Rows must have ended up exactly in the device lists, segments in the segments list.
    if traces.keys().any(|k| !used.contains(k)) || seg_lists.keys().any(|k| !used_segs.contains(k))
    {
        return Err(Unsupported);
    }
    Ok(snapshot)
}

/// A chunk's segment with the interner's stack ids and its shared pool tuple read in.
fn remap_segment(
    row: SegRow,
    ids: &SourceIds,
    ext_tuples: &[(u32, Box<[Resolved<'_>]>)],
) -> R<Segment> {
    let stack = |s: StackId| match ids.stacks.get(s.0 as usize) {
        Some(&id) if id != UNSET => Ok(StackId(id)),
        _ => Err(Unsupported),
    };
    let mut seg = row.seg;
    seg.frames = stack(seg.frames)?;
    for b in &mut seg.blocks {
        b.frames = stack(b.frames)?;
    }
    if let Some(g) = row.pool_ext {
        let k = ext_tuples
            .binary_search_by_key(&g, |(m, _)| *m)
            .map_err(|_| Unsupported)?;
        seg.pool_id = match *ext_tuples[k].1 {
            [Resolved::Int(a), Resolved::Int(b)] => Some((a, b)),
            _ => return Err(Unsupported),
        };
    }
    Ok(seg)
}

/// The stitch's containers as a [`Document`]; lists of rows become [`Trace`]s.
struct ToDoc<'x, 'a, 'c> {
    ctx: &'x Ctx<'a>,
    vm: &'x Vm<'a, 'c>,
    parts: &'x [Arc<Part>],
    doc: Document,
    lists: FxHashMap<u32, SeqId>,
    dicts: FxHashMap<u32, DictId>,
    tuples: FxHashMap<u32, SeqId>,
    /// Tuples of scalars in the chunks' memos, and their ids once converted (by memo index).
    ext_tuples: &'x [(u32, Box<[Resolved<'a>]>)],
    ext_tuple_ids: FxHashMap<u32, SeqId>,
    traces: FxHashMap<SeqId, Trace>,
    /// Lists holding segments read by the chunks: (source, row) of each item, `None` for an
    /// item converted here.
    seg_lists: FxHashMap<SeqId, Vec<Option<(u32, u32)>>>,
    segs_seen: SegsSeen,
    /// The document's id of each of the stitch's strings once converted ([`NO_STR`]: not
    /// yet): the annotations at the end of a long run repeat the same few keys and values
    /// tens of thousands of times, and the document's table hashes with a keyed hasher.
    str_ids: Vec<u32>,
}

const NO_STR: u32 = u32::MAX;

/// The segment rows placed in the document so far: one bit per row of each source. A big
/// dump has hundreds of thousands of segments, and a hash set of them was a third of the
/// skeleton's time.
#[derive(Default)]
struct SegsSeen(Vec<Vec<u64>>);

impl SegsSeen {
    /// Marks row `row` of source `src`; false when it was marked already.
    fn insert(&mut self, src: u32, row: u32) -> bool {
        let (src, row) = (src as usize, row as usize);
        if self.0.len() <= src {
            self.0.resize_with(src + 1, Vec::new);
        }
        let words = &mut self.0[src];
        if words.len() <= row / 64 {
            words.resize(row / 64 + 1, 0);
        }
        let bit = 1u64 << (row % 64);
        let seen = words[row / 64] & bit != 0;
        words[row / 64] |= bit;
        !seen
    }
}

const MAX_DEPTH: usize = 256;

impl ToDoc<'_, '_, '_> {
    fn new_seq(&mut self) -> R<SeqId> {
        let id = u32::try_from(self.doc.seqs.len()).map_err(|_| Unsupported)?;
        self.doc.seqs.push(Vec::new());
        Ok(SeqId(id))
    }

    fn scalar(&mut self, r: Resolved<'_>) -> R<Value> {
        Ok(match r {
            Resolved::Str(s) => Value::Str(self.doc.strings.intern(s)),
            Resolved::Int(i) => Value::Int(i),
            Resolved::Big(b) => {
                self.doc.big_ints.push(b);
                Value::BigInt(self.doc.big_ints.len() as u32 - 1)
            }
            Resolved::Float(f) => Value::Float(f),
            Resolved::None => Value::None,
            Resolved::Bool(b) => Value::Bool(b),
            // A container consumed inside its chunk (a frames list or a record).
            Resolved::Container | Resolved::Unknown => return Err(Unsupported),
        })
    }

    /// A tuple of scalars stored under memo index `g` by a chunk, one sequence however often
    /// it is fetched.
    fn ext_tuple(&mut self, g: u32) -> R<Value> {
        if let Some(&id) = self.ext_tuple_ids.get(&g) {
            return Ok(Value::Tuple(id));
        }
        let tuples = self.ext_tuples;
        let k = tuples
            .binary_search_by_key(&g, |(m, _)| *m)
            .map_err(|_| Unsupported)?;
        let items = tuples[k].1.iter().map(|&r| self.scalar(r));
        let items = items.collect::<R<Vec<Value>>>()?;
        let id = self.new_seq()?;
        self.doc.seqs[id.0 as usize] = items;
        self.ext_tuple_ids.insert(g, id);
        Ok(Value::Tuple(id))
    }

    fn value(&mut self, v: LVal, depth: usize) -> R<Value> {
        if depth > MAX_DEPTH {
            return Err(Unsupported);
        }
        let a = &self.vm.a;
        Ok(match v {
            LVal::None => Value::None,
            LVal::Bool(b) => Value::Bool(b),
            LVal::Int(i) => Value::Int(i),
            LVal::Big(i) => {
                let b = *a.bigs.get(i as usize).ok_or(Unsupported)?;
                self.doc.big_ints.push(b);
                Value::BigInt(self.doc.big_ints.len() as u32 - 1)
            }
            LVal::Float(f) => Value::Float(f),
            LVal::Str(i) => {
                let s = *a.strs.get(i as usize).ok_or(Unsupported)?;
                // One slot per string of the arena (`a` is the stitch's, which `str_ids` was
                // sized from).
                let slot = self.str_ids.get_mut(i as usize).ok_or(Unsupported)?;
                if *slot == NO_STR {
                    *slot = self.doc.strings.intern(s).0;
                }
                Value::Str(StrId(*slot))
            }
            LVal::Ext(g) => match self.vm.smemo.get(&g).copied() {
                Some(LVal::Ext(h)) if h == g => return Err(Unsupported),
                Some(inner) => self.value(inner, depth + 1)?,
                None => match self.ctx.resolve(g) {
                    Resolved::Container => self.ext_tuple(g)?,
                    r => self.scalar(r)?,
                },
            },
            LVal::List(l) => {
                if let Some(&id) = self.lists.get(&l) {
                    return Ok(Value::List(id));
                }
                let id = self.new_seq()?;
                self.lists.insert(l, id);
                let items: Vec<LVal> = self.vm.a.list_items(l).to_vec();
                if items.iter().any(|v| matches!(v, LVal::Recs { .. })) {
                    let mut trace = Trace::new();
                    for v in items {
                        let LVal::Recs { src, start, len } = v else {
                            return Err(Unsupported);
                        };
                        let part = self.parts.get(src as usize).ok_or(Unsupported)?;
                        let range = start as usize..start as usize + len as usize;
                        if range.end > part.len() {
                            return Err(Unsupported);
                        }
                        trace.push_slice(part.clone(), range);
                    }
                    self.traces.insert(id, trace);
                } else {
                    self.seq_items(id, items, depth)?;
                }
                Value::List(id)
            }
            LVal::Tuple(t) => {
                if let Some(&id) = self.tuples.get(&t) {
                    return Ok(Value::Tuple(id));
                }
                let id = self.new_seq()?;
                self.tuples.insert(t, id);
                let items: Vec<LVal> = self.vm.a.tuple_items(t).to_vec();
                self.seq_items(id, items, depth)?;
                Value::Tuple(id)
            }
            LVal::Dict(d) => {
                if let Some(&id) = self.dicts.get(&d) {
                    return Ok(Value::Dict(id));
                }
                if self.vm.a.dict_is_record(d) {
                    return Err(Unsupported);
                }
                let id = DictId(u32::try_from(self.doc.dicts.len()).map_err(|_| Unsupported)?);
                self.doc.dicts.push(Vec::new());
                self.dicts.insert(d, id);
                let items: Vec<(LVal, LVal)> = self.vm.a.dict_items(d).to_vec();
                let mut out = Vec::with_capacity(items.len());
                for (k, v) in items {
                    out.push((self.value(k, depth + 1)?, self.value(v, depth + 1)?));
                }
                self.doc.dicts[id.0 as usize] = out;
                Value::Dict(id)
            }
            LVal::Rec { .. } | LVal::Recs { .. } | LVal::Seg { .. } => return Err(Unsupported),
        })
    }

    /// The items of sequence `id`; segments read by the chunks stay rows (a placeholder in the
    /// document, the row in `seg_lists`), each in one place only.
    fn seq_items(&mut self, id: SeqId, items: Vec<LVal>, depth: usize) -> R<()> {
        let items_len = items.len();
        let mut out = Vec::with_capacity(items_len);
        let mut rows: Vec<Option<(u32, u32)>> = Vec::new();
        for v in items {
            if let LVal::Seg { src, row } = v {
                if !self.segs_seen.insert(src, row) {
                    return Err(Unsupported);
                }
                if rows.is_empty() {
                    rows.reserve_exact(items_len);
                }
                rows.resize(out.len(), None);
                rows.push(Some((src, row)));
                out.push(Value::None);
            } else {
                out.push(self.value(v, depth + 1)?);
            }
        }
        if !rows.is_empty() {
            rows.resize(out.len(), None);
            self.seg_lists.insert(id, rows);
        }
        self.doc.seqs[id.0 as usize] = out;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_bytes, release_batch, Behind, SegsSeen, BIG_FILE, CHUNK_BYTES};
    use std::sync::Mutex;

    #[test]
    fn ranges_read_are_released_in_batches_of_adjoining_bytes() {
        let released = Mutex::new(Vec::new());
        let release = |s: usize, e: usize| released.lock().unwrap().push((s, e));
        {
            let mut behind = Behind::new(&release, 100);
            // Forwards, with a FRAME header's gap between chunks: one batch once 100 bytes.
            behind.add(0, 40);
            behind.add(49, 90);
            assert!(released.lock().unwrap().is_empty());
            behind.add(99, 130);
            // Backwards (the helper's walk), after a jump: the jump hands on what was there.
            behind.add(500, 540);
            behind.add(460, 500);
            assert_eq!(*released.lock().unwrap(), [(0, 130)]);
        }
        // Dropped: the rest goes too.
        assert_eq!(*released.lock().unwrap(), [(0, 130), (460, 540)]);
        {
            // Batch 0: every range as it comes.
            let mut behind = Behind::new(&release, 0);
            behind.add(1000, 1010);
            behind.add(1010, 1020);
        }
        assert_eq!(released.lock().unwrap()[2..], [(1000, 1010), (1010, 1020)]);
    }

    #[test]
    fn big_files_take_bigger_chunks() {
        assert_eq!(chunk_bytes(100 << 20), CHUNK_BYTES);
        assert_eq!(chunk_bytes(BIG_FILE - 1), CHUNK_BYTES);
        assert_eq!(chunk_bytes(BIG_FILE), 2 * CHUNK_BYTES);
        assert_eq!(chunk_bytes(4 << 30), 2 * CHUNK_BYTES);
    }

    #[test]
    fn small_files_release_every_chunk_and_big_ones_in_batches() {
        assert_eq!(release_batch(100 << 20), 0);
        assert_eq!(release_batch(256 << 20), 0);
        assert_eq!(release_batch(512 << 20), 8 << 20);
        assert_eq!(release_batch(976 << 20), 16 << 20);
        assert_eq!(release_batch(4 << 30), 16 << 20);
    }

    #[test]
    fn a_segment_row_is_placed_once_per_source() {
        let mut seen = SegsSeen::default();
        // Rows far apart and in any order, in sources not seen before.
        for (src, row) in [(3, 200), (0, 0), (3, 63), (3, 64), (1, 5)] {
            assert!(seen.insert(src, row), "first time: ({src}, {row})");
        }
        for (src, row) in [(3, 200), (0, 0), (3, 63), (3, 64), (1, 5)] {
            assert!(!seen.insert(src, row), "second time: ({src}, {row})");
        }
        // The same row of another source is another segment.
        assert!(seen.insert(2, 200));
        assert!(seen.insert(0, 1));
    }
}
