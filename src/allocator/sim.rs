//! The replay: every trace event applied to the model in order. At each request the model
//! chooses a block as the allocator would (or says a new segment is needed), is compared with
//! the address the real allocator chose, and then follows the real choice, so that one
//! divergence does not spread to the events after it.

use rustc_hash::FxHashMap;

use super::fit::{why_no_fit, WhyNoFit};
use super::rules;
use super::settings::Settings;
use super::start::{self, StartInfo};
use super::state::{BlockState, Fit, PoolKey, State, NIL};
use crate::snapshot::{Action, BlockState as DumpState, Snapshot, TraceEntry};

/// How many divergences and fragmentation `cudaMalloc`s are kept in detail.
const KEEP_DIVERGENCES: usize = 32;
const KEEP_UNFIT: usize = 16;
const KEEP_OOMS: usize = 64;

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Keep the model's address of every `alloc` (`replay --full`).
    pub placements: bool,
    /// Explain only the OOMs at these events (sorted), and no `cudaMalloc`s: what the report
    /// needs. `None`: the first OOMs and `cudaMalloc`s, as `replay` shows them.
    pub only_ooms: Option<Vec<u32>>,
    /// Keep the block size the model gave each alloc (`Simulation::block_sizes`).
    pub block_sizes: bool,
}

/// Which rule decided a model's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    BestFit,
    Split,
    UnsplitRemainder,
    OversizeRefused,
    NewSegment,
    ExpandableMap,
    ExpandableUnmap,
    SegmentRelease,
    DelayedFree,
    PrivatePool,
    RoundupPower2,
    GarbageCollection,
}

impl Rule {
    pub const ALL: [Rule; 12] = [
        Rule::BestFit,
        Rule::Split,
        Rule::UnsplitRemainder,
        Rule::OversizeRefused,
        Rule::NewSegment,
        Rule::ExpandableMap,
        Rule::ExpandableUnmap,
        Rule::SegmentRelease,
        Rule::DelayedFree,
        Rule::PrivatePool,
        Rule::RoundupPower2,
        Rule::GarbageCollection,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::BestFit => "best_fit",
            Rule::Split => "split",
            Rule::UnsplitRemainder => "unsplit_remainder",
            Rule::OversizeRefused => "max_split_size",
            Rule::NewSegment => "new_segment",
            Rule::ExpandableMap => "expandable_map",
            Rule::ExpandableUnmap => "expandable_unmap",
            Rule::SegmentRelease => "segment_release",
            Rule::DelayedFree => "delayed_free",
            Rule::PrivatePool => "private_pool",
            Rule::RoundupPower2 => "roundup_power2_divisions",
            Rule::GarbageCollection => "garbage_collection_threshold",
        }
    }
}

/// Where the model and the real allocator parted.
#[derive(Clone, Debug)]
pub struct Divergence {
    pub event: u32,
    /// `placement`, `unexpected_malloc` (the model needed a new segment, the real allocator
    /// found a cached block), `missed_malloc` (the reverse), `segment_size`,
    /// `segment_not_free`, `unknown_free`, `unknown_segment`, `oom_fits`.
    pub kind: &'static str,
    pub requested: u64,
    pub rounded: u64,
    pub stream: u64,
    pub model: Option<u64>,
    pub real: Option<u64>,
    pub rule: Rule,
    pub detail: String,
}

#[derive(Clone, Debug)]
pub struct OomReplay {
    pub event: u32,
    pub rounded: u64,
    pub stream: u64,
    pub device_free: Option<u64>,
    /// The `cudaMalloc` size the allocator would have asked for.
    pub segment_bytes: u64,
    /// The model found no block that fits, as the real allocator did.
    pub reproduced: bool,
    pub why: WhyNoFit,
}

/// A `cudaMalloc` made while the request's pool held at least as many free bytes as it asked.
#[derive(Clone, Debug)]
pub struct UnfitMalloc {
    pub event: u32,
    pub segment_bytes: u64,
    pub why: WhyNoFit,
}

/// Real segment events and how many of them the model predicted.
#[derive(Clone, Copy, Debug, Default)]
pub struct SegmentCounts {
    pub real: u64,
    /// At the same event, with the same size (mallocs, maps) or on a segment the model also
    /// held entirely free (frees, unmaps).
    pub predicted: u64,
}

#[derive(Clone, Debug, Default)]
pub struct EndCheck {
    pub dump_blocks: u64,
    pub matching_blocks: u64,
    pub dump_segments: u64,
    pub matching_segments: u64,
    pub first_mismatch: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Simulation {
    pub device: i64,
    pub settings: Settings,
    pub events: u64,
    pub allocs: u64,
    pub placed: u64,
    pub mallocs: SegmentCounts,
    pub frees: SegmentCounts,
    pub maps: SegmentCounts,
    pub unmaps: SegmentCounts,
    /// Requests where the model wanted a new segment and the real allocator had none.
    pub unexpected_mallocs: u64,
    pub divergences: Vec<Divergence>,
    pub divergence_count: u64,
    pub ooms: Vec<OomReplay>,
    pub oom_count: u64,
    pub unfit: Vec<UnfitMalloc>,
    pub unfit_count: u64,
    pub start: StartInfo,
    pub end: EndCheck,
    /// How often each rule decided something in this trace.
    pub rules: Vec<(Rule, u64)>,
    /// `(event, model's address)` of every alloc, with `--full`; `None` where the model asked
    /// for a new segment that the real allocator did not make.
    pub placements: Vec<(u32, Option<u64>)>,
    /// Frees of addresses that hold no block in the model.
    pub unknown_frees: u64,
    /// With `Options::block_sizes`: the block each alloc was handed (its unsplit remainder
    /// included) by event, and the blocks alive at the window start by address.
    pub block_sizes: FxHashMap<u32, u64>,
    pub start_block_sizes: FxHashMap<u64, u64>,
    /// The allocs that went to a private pool (CUDA graphs, MemPools), with the pool.
    pub private_allocs: FxHashMap<u32, (i64, i64)>,
    /// Σ block bytes of live allocations and Σ segment bytes, at their highest, with the event
    /// after which each was reached (`None`: at the window start).
    pub peak_allocated: (u64, Option<u32>),
    pub peak_reserved: (u64, Option<u32>),
    pub notes: Vec<String>,
}

struct Run<'a> {
    settings: &'a Settings,
    block_sizes: bool,
    only_ooms: Option<&'a [u32]>,
    state: State,
    sim: Simulation,
    rules: FxHashMap<Rule, u64>,
    /// Segment events since the last request, applied when it comes (the allocator emits
    /// them just before the `alloc` they serve).
    pending: Vec<(u32, TraceEntry)>,
    /// The pool of the last alloc of each stream: where an OOM's request went.
    stream_pool: FxHashMap<u64, (i64, i64)>,
}

/// The model replayed over the whole trace of `device`, from the state at its window start.
pub fn simulate(
    snapshot: &Snapshot,
    device: i64,
    settings: &Settings,
    opts: &Options,
) -> Simulation {
    simulate_until(snapshot, device, settings, opts, None).0
}

/// The model's state after event `event` (`None`: at the window start).
pub fn state_after(
    snapshot: &Snapshot,
    device: i64,
    settings: &Settings,
    event: Option<u32>,
) -> State {
    simulate_until(snapshot, device, settings, &Options::default(), Some(event)).1
}

/// [`simulate`], stopped after event `until` (`Some(None)`: at the window start).
fn simulate_until(
    snapshot: &Snapshot,
    device: i64,
    settings: &Settings,
    opts: &Options,
    until: Option<Option<u32>>,
) -> (Simulation, State) {
    let mut timer = crate::timing::Timer::new();
    let (state, start) = start::build(snapshot, device, settings);
    timer.lap("allocator: state at the window start");
    let trace = snapshot.trace(device);
    let start_block_sizes: FxHashMap<u64, u64> = if opts.block_sizes {
        state
            .blocks
            .iter()
            .filter(|b| b.seg != super::state::NIL && b.state != BlockState::Free)
            .map(|b| (b.addr, b.size))
            .collect()
    } else {
        FxHashMap::default()
    };
    let mut run = Run {
        settings,
        block_sizes: opts.block_sizes,
        only_ooms: opts.only_ooms.as_deref(),
        state,
        sim: Simulation {
            device,
            settings: settings.clone(),
            events: trace.len() as u64,
            allocs: 0,
            placed: 0,
            mallocs: Default::default(),
            frees: Default::default(),
            maps: Default::default(),
            unmaps: Default::default(),
            unexpected_mallocs: 0,
            divergences: Vec::new(),
            divergence_count: 0,
            ooms: Vec::new(),
            oom_count: 0,
            unfit: Vec::new(),
            unfit_count: 0,
            start,
            end: EndCheck::default(),
            rules: Vec::new(),
            placements: Vec::new(),
            unknown_frees: 0,
            private_allocs: FxHashMap::default(),
            block_sizes: FxHashMap::default(),
            start_block_sizes,
            peak_allocated: (0, None),
            peak_reserved: (0, None),
            notes: Vec::new(),
        },
        rules: FxHashMap::default(),
        pending: Vec::new(),
        stream_pool: FxHashMap::default(),
    };
    if settings.garbage_collection_threshold > 0.0 {
        run.sim.notes.push(
            "garbage_collection_threshold acts only under a per-process memory fraction, which \
             the dump does not record: its segment frees are followed from the trace, not predicted"
                .to_owned(),
        );
    }
    let last = match until {
        Some(None) => 0,
        Some(Some(e)) => (e as usize).saturating_add(1).min(trace.len()),
        None => trace.len(),
    };
    for (i, e) in trace.range(0..last).enumerate() {
        let i = i as u32;
        match e.action {
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => {
                run.pending.push((i, e));
            }
            Action::Alloc => run.alloc(i, &e, opts, snapshot),
            Action::Oom => run.oom(i, &e, snapshot),
            Action::FreeRequested => {
                run.flush(None);
                run.free_requested(i, &e);
            }
            Action::FreeCompleted => {
                run.flush(None);
                run.free_completed(i, &e);
            }
            _ => run.flush(None),
        }
        let st = &run.state;
        if st.allocated > run.sim.peak_allocated.0 {
            run.sim.peak_allocated = (st.allocated, Some(i));
        }
        if st.reserved > run.sim.peak_reserved.0 {
            run.sim.peak_reserved = (st.reserved, Some(i));
        }
    }
    run.flush(None);
    timer.lap("allocator: replay");
    if last == trace.len() {
        run.end_check(snapshot);
        timer.lap("allocator: end check");
    }
    let mut rules: Vec<(Rule, u64)> = run.rules.into_iter().collect();
    rules.sort_unstable();
    run.sim.rules = rules;
    (run.sim, run.state)
}

impl Run<'_> {
    fn used(&mut self, rule: Rule) {
        *self.rules.entry(rule).or_default() += 1;
    }

    /// Counts a divergence; the first ones are kept in detail (their texts made only then).
    fn diverge(&mut self, d: impl FnOnce(&Self) -> Divergence) {
        self.sim.divergence_count += 1;
        if self.sim.divergences.len() < KEEP_DIVERGENCES {
            let d = d(self);
            self.sim.divergences.push(d);
        }
    }

    /// The pool of the segment that holds `addr` (live, or among the pending new ones).
    fn pool_at(&self, addr: u64) -> Option<(i64, i64)> {
        if let Some(s) = self.state.seg_containing(addr) {
            return Some(self.state.segs[s as usize].key.pool);
        }
        self.pending
            .iter()
            .find(|(_, e)| {
                matches!(e.action, Action::SegmentAlloc | Action::SegmentMap)
                    && e.addr <= addr
                    && addr < e.addr.saturating_add(e.size)
            })
            .map(|(i, _)| {
                self.sim
                    .start
                    .new_segment_keys
                    .get(i)
                    .map_or((0, 0), |k| k.pool)
            })
    }

    fn alloc(&mut self, i: u32, e: &TraceEntry, opts: &Options, snapshot: &Snapshot) {
        let settings = self.settings;
        let rounded = rules::round_size(e.size, settings);
        if rounded != rules::round_to_blocks(e.size) {
            self.used(Rule::RoundupPower2);
        }
        let small = rules::is_small(rounded);
        let real_grows = self
            .pending
            .iter()
            .any(|(_, p)| matches!(p.action, Action::SegmentAlloc | Action::SegmentMap));
        // Releases with no new segment after them came before this request's search
        // (`empty_cache`); before a new segment they are the retry after the search failed.
        if !real_grows {
            self.flush(None);
        }
        // The request's pool: the entry's `pool_id` (torch 2.12+) decides; without it, the
        // stream's last one, unless the real address says otherwise (looked up only when the
        // search did not land on it).
        let guess = e
            .pool_id
            .unwrap_or_else(|| self.stream_pool.get(&e.stream).copied().unwrap_or((0, 0)));
        let key_of = |pool| PoolKey {
            pool,
            stream: e.stream,
            small,
        };
        let mut key = key_of(guess);
        let mut key_id = self.state.key_id(key);
        let mut fit = self.state.find_fit(key_id, rounded, settings);
        let lands = matches!(fit, Fit::Block(b) if self.state.blocks[b as usize].addr == e.addr);
        // Without private pools every request is in the default one.
        if e.pool_id.is_none()
            && !lands
            && (self.state.private_pools || guess != (0, 0) || !self.pending.is_empty())
        {
            let pool = self.pool_at(e.addr).unwrap_or((0, 0));
            if pool != guess {
                key = key_of(pool);
                key_id = self.state.key_id(key);
                fit = self.state.find_fit(key_id, rounded, settings);
                self.stream_pool.insert(e.stream, pool);
            }
        }
        if key.pool != (0, 0) {
            self.used(Rule::PrivatePool);
            self.sim.private_allocs.insert(i, key.pool);
        }
        if let Fit::Oversize(_) = fit {
            self.used(Rule::OversizeRefused);
        }
        let mut model: Option<u64> = None;
        let mut chosen: Option<u32> = None;
        let mut rule = Rule::BestFit;
        match (fit, real_grows) {
            (Fit::Block(b), false) => {
                self.used(Rule::BestFit);
                model = Some(self.state.blocks[b as usize].addr);
                chosen = Some(b);
            }
            (Fit::Block(b), true) => {
                let at = self.state.blocks[b as usize].addr;
                let size = self.state.blocks[b as usize].size;
                self.diverge(|_| Divergence {
                    event: i,
                    kind: "missed_malloc",
                    requested: e.size,
                    rounded,
                    stream: e.stream,
                    model: Some(at),
                    real: Some(e.addr),
                    rule: Rule::BestFit,
                    detail: format!(
                        "the model had a cached block of {size} bytes at {at:#x} for it; the real \
                         allocator made a new segment"
                    ),
                });
                model = Some(at);
                self.count_growth(false, rounded, small);
                self.flush(Some(key));
            }
            (_, true) => {
                // The model too needs memory from the driver: the trace says where it went.
                if self.state.free_bytes[key_id as usize] >= rounded {
                    self.unfit_malloc(i, key_id, rounded, snapshot);
                }
                self.count_growth(true, rounded, small);
                self.flush(Some(key));
                rule = if settings.expandable_segments {
                    Rule::ExpandableMap
                } else {
                    Rule::NewSegment
                };
                if let Fit::Block(b) = self.state.find_fit(key_id, rounded, settings) {
                    model = Some(self.state.blocks[b as usize].addr);
                    chosen = Some(b);
                }
            }
            (_, false) => {
                self.sim.unexpected_mallocs += 1;
                self.diverge(|_| Divergence {
                    event: i,
                    kind: "unexpected_malloc",
                    requested: e.size,
                    rounded,
                    stream: e.stream,
                    model: None,
                    real: Some(e.addr),
                    rule: if matches!(fit, Fit::Oversize(_)) {
                        Rule::OversizeRefused
                    } else {
                        Rule::NewSegment
                    },
                    detail: "the model found no cached block and needed a new segment; the real \
                             allocator used a cached block"
                        .to_owned(),
                });
                self.flush(Some(key));
            }
        }
        self.sim.allocs += 1;
        if opts.placements {
            self.sim.placements.push((i, model));
        }
        if model == Some(e.addr) {
            self.sim.placed += 1;
            if let Some(b) = chosen {
                return self.take(b, i, e, rounded);
            }
        } else if let Some(at) = model {
            self.diverge(|run| Divergence {
                event: i,
                kind: "placement",
                requested: e.size,
                rounded,
                stream: e.stream,
                model: Some(at),
                real: Some(e.addr),
                rule,
                detail: run.explain_placement(key_id, rounded, at, e.addr),
            });
        }
        self.place(i, e, rounded);
    }

    /// Hands out the block at the real address: where the model chose, the block it found;
    /// elsewhere the free block that holds the address, cut there.
    fn place(&mut self, i: u32, e: &TraceEntry, rounded: u64) {
        let Some(b) = self.state.block_containing(e.addr) else {
            self.diverge(|_| Divergence {
                event: i,
                kind: "unknown_segment",
                requested: e.size,
                rounded,
                stream: e.stream,
                model: None,
                real: Some(e.addr),
                rule: Rule::NewSegment,
                detail: "the real address lies in no segment the model holds".to_owned(),
            });
            return;
        };
        if self.state.blocks[b as usize].state != BlockState::Free {
            let at = self.state.blocks[b as usize].addr;
            self.diverge(|_| Divergence {
                event: i,
                kind: "placement",
                requested: e.size,
                rounded,
                stream: e.stream,
                model: None,
                real: Some(e.addr),
                rule: Rule::BestFit,
                detail: format!(
                    "the model holds a live block at {at:#x} where the real allocator placed this one"
                ),
            });
            // Follow the trace: the old block is gone, the new one is in its place.
            self.state.free(b);
            if let Some(b) = self.state.block_containing(e.addr) {
                self.place_free(b, i, e, rounded);
            }
            return;
        }
        self.place_free(b, i, e, rounded);
    }

    /// Hands out the part of the free block `b` that starts at the real address.
    fn place_free(&mut self, b: u32, i: u32, e: &TraceEntry, rounded: u64) {
        let size = self.state.blocks[b as usize].end().saturating_sub(e.addr);
        let (taken, split) = self.state.take_at(
            b,
            e.addr,
            rounded.min(size),
            e.size,
            e.frames,
            i,
            self.settings,
        );
        self.count_split(split, size, rounded);
        self.record_size(i, taken);
    }

    fn record_size(&mut self, i: u32, b: u32) {
        if self.block_sizes {
            self.sim
                .block_sizes
                .insert(i, self.state.blocks[b as usize].size);
        }
    }

    /// Hands out the free block `b`, which starts at the real address.
    fn take(&mut self, b: u32, i: u32, e: &TraceEntry, rounded: u64) {
        let settings = self.settings;
        let size = self.state.blocks[b as usize].size;
        let split = self
            .state
            .take(b, rounded.min(size), e.size, e.frames, i, settings);
        self.count_split(split, size, rounded);
        self.record_size(i, b);
    }

    fn count_split(&mut self, split: bool, size: u64, rounded: u64) {
        if split {
            self.used(Rule::Split);
        } else if size > rounded {
            self.used(Rule::UnsplitRemainder);
        }
    }

    /// Why the model's choice differs from the real one.
    fn explain_placement(&self, key: u32, rounded: u64, model: u64, real: u64) -> String {
        let msize = self
            .state
            .block_containing(model)
            .map_or(0, |b| self.state.blocks[b as usize].size);
        match self.state.block_containing(real) {
            Some(b) => {
                let blk = &self.state.blocks[b as usize];
                let seg = &self.state.segs[blk.seg as usize];
                let same_key = self.state.key_of(&seg.key) == Some(key);
                if blk.state != BlockState::Free {
                    format!(
                        "best fit chose the free block of {msize} bytes at {model:#x}; the real \
                         address lies in a block the model holds as live (a state from before the \
                         window or an earlier divergence)"
                    )
                } else if !same_key {
                    format!(
                        "best fit chose the free block of {msize} bytes at {model:#x}; the real \
                         address lies in a free block of another pool or stream (pool {:?}, stream \
                         {:#x})",
                        seg.key.pool, seg.key.stream
                    )
                } else {
                    format!(
                        "best fit chose the free block of {msize} bytes at {model:#x} as the \
                         smallest of at least {rounded} bytes; the real allocator used the free \
                         block of {} bytes at {:#x}",
                        blk.size, blk.addr
                    )
                }
            }
            None => format!(
                "best fit chose {model:#x}; the real address lies in no segment the model holds"
            ),
        }
    }

    /// Counts the pending segment growth against the model's prediction for one request.
    fn count_growth(&mut self, model_grows: bool, rounded: u64, small: bool) {
        let settings = self.settings;
        let mut predicted_map = if model_grows && settings.expandable_segments {
            // The mapped pages the request needs beyond a free tail it can grow.
            let page = rules::page_size(small, settings);
            Some(rounded.div_ceil(page).saturating_mul(page))
        } else {
            None
        };
        let pending = std::mem::take(&mut self.pending);
        let mut first_malloc = true;
        for (j, p) in &pending {
            match p.action {
                Action::SegmentAlloc => {
                    let want = rules::segment_size(rounded, settings);
                    if model_grows && first_malloc && p.size == want {
                        self.sim.mallocs.predicted += 1;
                    } else if model_grows && first_malloc {
                        self.size_divergence(*j, rounded, p, Rule::NewSegment, || {
                            format!(
                                "the model's new segment for {rounded} bytes is {want} bytes; the \
                                 real one is {} bytes",
                                p.size
                            )
                        });
                    }
                    first_malloc = false;
                }
                Action::SegmentMap => {
                    // A map that extends a free tail needs fewer pages than the whole request.
                    if let Some(want) = predicted_map.as_mut() {
                        let tail = self.free_tail_before(p.addr);
                        let need = rounded.saturating_sub(tail);
                        let page = rules::page_size(small, settings);
                        let need = need.div_ceil(page).saturating_mul(page);
                        if p.size <= need.max(page) || p.size == *want {
                            self.sim.maps.predicted += 1;
                        } else {
                            self.size_divergence(*j, rounded, p, Rule::ExpandableMap, || {
                                format!(
                                    "the model maps {need} bytes for {rounded} bytes; the real \
                                     allocator mapped {} bytes",
                                    p.size
                                )
                            });
                        }
                        *want = want.saturating_sub(p.size);
                    }
                }
                _ => {}
            }
        }
        self.pending = pending;
    }

    /// A new segment (or mapped range) of another size than the model's.
    fn size_divergence(
        &mut self,
        event: u32,
        rounded: u64,
        p: &TraceEntry,
        rule: Rule,
        detail: impl FnOnce() -> String,
    ) {
        self.diverge(|_| Divergence {
            event,
            kind: "segment_size",
            requested: rounded,
            rounded,
            stream: p.stream,
            model: None,
            real: Some(p.addr),
            rule,
            detail: detail(),
        });
    }

    /// Free bytes at the end of the expandable range that ends at `addr`.
    fn free_tail_before(&self, addr: u64) -> u64 {
        let Some(b) = self.state.block_containing(addr.wrapping_sub(1)) else {
            return 0;
        };
        let blk = &self.state.blocks[b as usize];
        if blk.state == BlockState::Free && blk.end() == addr {
            blk.size
        } else {
            0
        }
    }

    fn why(&self, key: u32, rounded: u64, event: u32, snapshot: &Snapshot) -> WhyNoFit {
        why_no_fit(
            &self.state,
            key,
            rounded,
            snapshot.trace(self.sim.device),
            event,
        )
    }

    fn unfit_malloc(&mut self, i: u32, key: u32, rounded: u64, snapshot: &Snapshot) {
        self.sim.unfit_count += 1;
        if self.sim.unfit.len() < KEEP_UNFIT && self.only_ooms.is_none() {
            let why = self.why(key, rounded, i, snapshot);
            self.sim.unfit.push(UnfitMalloc {
                event: i,
                segment_bytes: rules::segment_size(rounded, self.settings),
                why,
            });
        }
    }

    /// Applies the pending segment events (`grows`: for the request of this pool key).
    fn flush(&mut self, grows: Option<PoolKey>) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        for (i, e) in &pending {
            self.segment_event(*i, e, grows);
        }
        self.pending = pending;
        self.pending.clear();
    }

    fn segment_event(&mut self, i: u32, e: &TraceEntry, grows: Option<PoolKey>) {
        match e.action {
            Action::SegmentAlloc => {
                self.sim.mallocs.real += 1;
                self.used(Rule::NewSegment);
                if self.state.overlaps(e.addr, e.size) {
                    self.unknown_segment(i, e, "a new segment overlaps one the model holds");
                    return;
                }
                let key = match self.sim.start.new_segment_keys.get(&i) {
                    Some(k) => PoolKey {
                        stream: e.stream,
                        ..*k
                    },
                    None => PoolKey {
                        pool: e.pool_id.unwrap_or(grows.map_or((0, 0), |g| g.pool)),
                        stream: e.stream,
                        small: grows.map_or(e.size == rules::SMALL_BUFFER, |g| g.small),
                    },
                };
                self.state
                    .add_segment(e.addr, e.size, key, false, Vec::new());
            }
            Action::SegmentFree => {
                self.sim.frees.real += 1;
                self.used(Rule::SegmentRelease);
                match self.state.seg_at.get(&e.addr).copied() {
                    Some(s) => {
                        if self.state.seg_is_free(s) {
                            self.sim.frees.predicted += 1;
                        } else {
                            self.diverge(|_| Divergence {
                                event: i,
                                kind: "segment_not_free",
                                requested: 0,
                                rounded: 0,
                                stream: e.stream,
                                model: None,
                                real: Some(e.addr),
                                rule: Rule::SegmentRelease,
                                detail: "the real allocator released a segment that the model \
                                         holds live blocks in"
                                    .to_owned(),
                            });
                        }
                        self.state.remove_segment(s);
                    }
                    None => {
                        self.unknown_segment(i, e, "a segment freed that the model does not hold")
                    }
                }
            }
            Action::SegmentMap => {
                self.sim.maps.real += 1;
                self.used(Rule::ExpandableMap);
                if self.state.overlaps(e.addr, e.size) {
                    self.unknown_segment(i, e, "a mapped range overlaps one the model holds");
                    return;
                }
                let key = match grows {
                    Some(g) => PoolKey {
                        stream: e.stream,
                        ..g
                    },
                    None => {
                        // Joins the range before it, whose pool it is.
                        let before = self
                            .state
                            .seg_containing(e.addr.wrapping_sub(1))
                            .map(|s| self.state.segs[s as usize].key);
                        before.unwrap_or(PoolKey {
                            pool: (0, 0),
                            stream: e.stream,
                            small: !e.size.is_multiple_of(self.settings.large_segment_size),
                        })
                    }
                };
                self.state.map(e.addr, e.size, key);
            }
            Action::SegmentUnmap => {
                self.sim.unmaps.real += 1;
                self.used(Rule::ExpandableUnmap);
                if self.state.unmap(e.addr, e.size) {
                    self.sim.unmaps.predicted += 1;
                } else {
                    self.unknown_segment(
                        i,
                        e,
                        "an unmapped range that is not free in the model (or not mapped)",
                    );
                }
            }
            _ => {}
        }
    }

    fn unknown_segment(&mut self, i: u32, e: &TraceEntry, what: &str) {
        self.diverge(|_| Divergence {
            event: i,
            kind: "unknown_segment",
            requested: 0,
            rounded: 0,
            stream: e.stream,
            model: None,
            real: Some(e.addr),
            rule: Rule::NewSegment,
            detail: format!("{}: {what}", e.action.name()),
        });
    }

    fn free_requested(&mut self, i: u32, e: &TraceEntry) {
        match self.live_block_at(e.addr) {
            Some(b) => {
                self.state.mark_pending(b, i);
            }
            None => self.unknown_free(i, e),
        }
    }

    fn free_completed(&mut self, i: u32, e: &TraceEntry) {
        match self.live_block_at(e.addr) {
            Some(b) => {
                let at = self.state.blocks[b as usize].freed_at;
                if at != NIL && at + 1 != i {
                    self.used(Rule::DelayedFree);
                }
                self.state.free(b);
            }
            None => self.unknown_free(i, e),
        }
    }

    fn live_block_at(&self, addr: u64) -> Option<u32> {
        let &b = self.state.by_addr.get(&addr)?;
        (self.state.blocks[b as usize].state != BlockState::Free).then_some(b)
    }

    fn unknown_free(&mut self, i: u32, e: &TraceEntry) {
        self.sim.unknown_frees += 1;
        self.diverge(|_| Divergence {
            event: i,
            kind: "unknown_free",
            requested: e.size,
            rounded: 0,
            stream: e.stream,
            model: None,
            real: Some(e.addr),
            rule: Rule::BestFit,
            detail: format!(
                "{} of an address that holds no live block in the model",
                e.action.name()
            ),
        });
    }

    fn oom(&mut self, i: u32, e: &TraceEntry, snapshot: &Snapshot) {
        let settings = self.settings;
        let rounded = e.size;
        let small = rules::is_small(rounded);
        let key = PoolKey {
            pool: e
                .pool_id
                .unwrap_or_else(|| self.stream_pool.get(&e.stream).copied().unwrap_or((0, 0))),
            stream: e.stream,
            small,
        };
        let key_id = self.state.key_id(key);
        let fit = self.state.find_fit(key_id, rounded, settings);
        let reproduced = !matches!(fit, Fit::Block(_));
        if let Fit::Block(b) = fit {
            let at = self.state.blocks[b as usize].addr;
            self.diverge(|_| Divergence {
                event: i,
                kind: "oom_fits",
                requested: rounded,
                rounded,
                stream: e.stream,
                model: Some(at),
                real: None,
                rule: Rule::BestFit,
                detail: format!(
                    "the model holds a free block at {at:#x} that fits the request that ran out of memory"
                ),
            });
        }
        self.sim.oom_count += 1;
        // The cached segments released on the way to the OOM are gone when it is raised: the
        // layout it reports (and its message's "reserved but unallocated") is the one after.
        self.flush(None);
        let wanted = match self.only_ooms {
            Some(list) => list.binary_search(&i).is_ok(),
            None => self.sim.ooms.len() < KEEP_OOMS,
        };
        if wanted {
            let why = self.why(key_id, rounded, i, snapshot);
            self.sim.ooms.push(OomReplay {
                event: i,
                rounded,
                stream: e.stream,
                device_free: e.device_free,
                segment_bytes: rules::segment_size(rounded, settings),
                reproduced,
                why,
            });
        }
    }

    /// The model's blocks at the end against the dump's block table.
    fn end_check(&mut self, snapshot: &Snapshot) {
        let device = self.sim.device;
        let mut end = EndCheck::default();
        for s in snapshot.segments_of(device) {
            end.dump_segments += 1;
            end.dump_blocks += s.blocks.len() as u64;
            let Some(&seg) = self.state.seg_at.get(&s.address) else {
                end.first_mismatch.get_or_insert_with(|| {
                    format!("segment {:#x} of the dump is not in the model", s.address)
                });
                continue;
            };
            if self.state.segs[seg as usize].size != s.total_size {
                end.first_mismatch.get_or_insert_with(|| {
                    format!(
                        "segment {:#x}: {} bytes in the dump, {} in the model",
                        s.address, s.total_size, self.state.segs[seg as usize].size
                    )
                });
                continue;
            }
            end.matching_segments += 1;
            let model: Vec<(u64, u64, BlockState)> = self
                .state
                .seg_blocks(seg)
                .map(|(_, b)| (b.addr, b.size, b.state))
                .collect();
            for (k, b) in s.blocks.iter().enumerate() {
                let want = match b.state {
                    DumpState::ActiveAllocated => BlockState::Allocated,
                    DumpState::ActivePendingFree => BlockState::Pending,
                    _ => BlockState::Free,
                };
                if model.get(k) == Some(&(b.address, b.size, want)) {
                    end.matching_blocks += 1;
                } else {
                    let got = model
                        .iter()
                        .find(|m| m.0 == b.address)
                        .map_or("no block there".to_owned(), |m| {
                            format!("{} bytes, {:?}", m.1, m.2)
                        });
                    end.first_mismatch.get_or_insert_with(|| {
                        format!(
                            "segment {:#x}: the dump's block at {:#x} has {} bytes, {}; the \
                             model's: {got}",
                            s.address,
                            b.address,
                            b.size,
                            b.state.name()
                        )
                    });
                }
            }
        }
        self.sim.end = end;
    }
}
