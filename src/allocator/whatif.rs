//! What if: the trace's requests replayed through the model under other settings, other sizes
//! or another capacity, with the model deciding everything the real allocator decided (which
//! block, when a new segment, when cached segments go back, when a request fails). Nothing of
//! the real allocator's choices is followed, only the program's requests and frees.

use rustc_hash::FxHashMap;

use super::rules;
use super::settings::Settings;
use super::start;
use super::state::{BlockState, Fit, PoolKey, Seg, State, NIL};
use crate::snapshot::{Action, Snapshot, TraceEntry};

/// What to change. Sizes are the program's requested bytes, by trace event (an `alloc` or an
/// `oom`); 0 drops the request.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub sizes: FxHashMap<u32, u64>,
    /// Bytes PyTorch may reserve on the device; `None`: no limit.
    pub capacity: Option<u64>,
    /// The private pool of the allocs that were in one (as the exact replay found them).
    pub pools: FxHashMap<u32, (i64, i64)>,
    /// Take every release of cached segments in the trace as the program's `empty_cache()`,
    /// also those right before a new segment (which may be the allocator's retry after a
    /// failed `cudaMalloc`): where the real limit is unknown, that is what reproduces the run.
    pub follow_releases: bool,
}

/// A request that ran out of memory in the what-if, or a real OOM and whether it fits now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WhatifOom {
    pub event: u32,
    /// The event is a real OOM (else: an alloc that fitted in the real run).
    pub real: bool,
    pub fits: bool,
    /// Capacity left after the request (negative: how much it was short).
    pub margin: i64,
    pub rounded: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Σ block bytes of live allocations, with the event after which it was reached (`None`:
    /// at the window start).
    pub peak_allocated: (u64, Option<u32>),
    pub peak_reserved: (u64, Option<u32>),
    /// Real OOMs (fit or not) and the new ones, in trace order.
    pub ooms: Vec<WhatifOom>,
    pub first_oom_event: Option<u32>,
    /// Reserved bytes after each event where they changed.
    pub reserved_curve: Vec<(u32, u64)>,
    /// Segment growth (`+`) and release (`-`) in bytes, at the event of the request or the
    /// `empty_cache` that made it.
    pub segment_changes: Vec<(u32, i64)>,
    pub dropped_requests: u64,
    pub notes: Vec<String>,
}

/// Bytes as a signed figure, saturating (a hostile file can claim sizes near 2^64).
pub fn signed(bytes: u64) -> i64 {
    bytes.min(i64::MAX as u64) as i64
}

/// What is left of `limit` after `used` (negative: how much `used` is over it), saturating.
pub fn margin(limit: u64, used: u64) -> i64 {
    (i128::from(limit) - i128::from(used)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Where new segments go: addresses no real segment uses, so that they cannot collide.
const SYNTHETIC_BASE: u64 = 1 << 56;
/// Free blocks of a page or more one release looks at per pool (a hostile trace could keep
/// thousands that hold no whole page, which every release would otherwise walk again).
const MAX_RANGES_RELEASED: usize = 4096;
/// Virtual space of one expandable reservation.
const RESERVATION: u64 = 1 << 44;

struct Run<'a> {
    settings: &'a Settings,
    changes: &'a Changes,
    state: State,
    /// Real address → the model's block (NIL: a request the what-if dropped or refused).
    blocks: FxHashMap<u64, u32>,
    next_addr: u64,
    /// Expandable reservations: pool key → base address.
    reservations: FxHashMap<PoolKey, u64>,
    out: Outcome,
    pending: Vec<(u32, TraceEntry)>,
    /// The real run's new segments (or mapped ranges) for the request at hand: where the
    /// model makes one of the same size, it goes at the same address, so that ties between
    /// equal blocks are broken as they were.
    real_growth: Vec<(u64, u64)>,
    event: u32,
}

pub fn whatif(snapshot: &Snapshot, device: i64, settings: &Settings, changes: &Changes) -> Outcome {
    let mut timer = crate::timing::Timer::new();
    // The window starts as it really did: what was alive then was made under the real settings.
    let (real_settings, _) = Settings::from_snapshot(snapshot);
    let (state, _) = start::build(snapshot, device, &real_settings);
    let mut run = Run {
        settings,
        changes,
        blocks: state
            .by_addr
            .iter()
            .filter(|(_, &b)| state.blocks[b as usize].state != BlockState::Free)
            .map(|(&a, &b)| (a, b))
            .collect(),
        state,
        next_addr: SYNTHETIC_BASE,
        reservations: FxHashMap::default(),
        out: Outcome::default(),
        pending: Vec::new(),
        real_growth: Vec::new(),
        event: 0,
    };
    run.out.peak_allocated = (run.state.allocated, None);
    run.out.peak_reserved = (run.state.reserved, None);
    let trace = snapshot.trace(device);
    for (i, e) in trace.iter().enumerate() {
        let i = i as u32;
        run.event = i;
        match e.action {
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap => {
                run.pending.push((i, e));
            }
            Action::Alloc => {
                run.settle(false);
                run.alloc(i, &e);
            }
            Action::Oom => {
                run.settle(true);
                run.oom(i, &e);
            }
            Action::FreeRequested => {
                run.settle(false);
                if let Some(&b) = run.blocks.get(&e.addr) {
                    if b != NIL {
                        run.state.mark_pending(b, i);
                    }
                }
            }
            Action::FreeCompleted => {
                run.settle(false);
                if let Some(b) = run.blocks.remove(&e.addr) {
                    if b != NIL && run.state.blocks[b as usize].state != BlockState::Free {
                        run.state.free(b);
                    }
                }
            }
            _ => run.settle(false),
        }
        run.peaks(i);
    }
    run.settle(false);
    run.out.first_oom_event = run.out.ooms.iter().find(|o| !o.fits).map(|o| o.event);
    timer.lap("allocator: one what-if replay");
    run.out
}

impl Run<'_> {
    fn peaks(&mut self, i: u32) {
        let st = &self.state;
        if st.allocated > self.out.peak_allocated.0 {
            self.out.peak_allocated = (st.allocated, Some(i));
        }
        if st.reserved > self.out.peak_reserved.0 {
            self.out.peak_reserved = (st.reserved, Some(i));
        }
    }

    /// Records a change of the reserved bytes (the state has made it).
    fn reserved_changed(&mut self, delta: i64) {
        let reserved = self.state.reserved;
        self.out.segment_changes.push((self.event, delta));
        match self.out.reserved_curve.last_mut() {
            Some(last) if last.0 == self.event => last.1 = reserved,
            _ => self.out.reserved_curve.push((self.event, reserved)),
        }
    }

    /// The trace's own segment events are the real allocator's; the model makes its own. Only
    /// the program's `empty_cache()` is taken from them: releases with no new segment after
    /// them and no OOM (`oom`: the request that follows failed, so they were its retry).
    fn settle(&mut self, oom: bool) {
        if self.pending.is_empty() {
            return;
        }
        let releases = self
            .pending
            .iter()
            .any(|(_, e)| matches!(e.action, Action::SegmentFree | Action::SegmentUnmap));
        let grows = self
            .pending
            .iter()
            .any(|(_, e)| matches!(e.action, Action::SegmentAlloc | Action::SegmentMap));
        self.real_growth.clear();
        for (_, e) in &self.pending {
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                self.real_growth.push((e.addr, e.size));
            }
        }
        let named: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, e)| e.action == Action::SegmentFree)
            .map(|(_, e)| e.addr)
            .collect();
        self.pending.clear();
        if releases && ((!grows && !oom) || self.changes.follow_releases) {
            self.release_cached();
        }
        // The private-pool segments the trace releases (a graph or MemPool freed).
        for addr in named {
            if let Some(&s) = self.state.seg_at.get(&addr) {
                let seg = &self.state.segs[s as usize];
                if seg.key.pool != (0, 0) && self.state.seg_is_free(s) {
                    let size = seg.size;
                    self.state.remove_segment(s);
                    self.reserved_changed(-signed(size));
                }
            }
        }
    }

    /// `release_cached_blocks`: every segment that is one free block goes back to the driver;
    /// expandable ranges give back their free whole pages.
    fn release_cached(&mut self) {
        // The segments that are one free block and the expandable ranges, not every segment:
        // a trace of many releases over many segments stays linear.
        let whole: Vec<u32> = self.state.whole_free.iter().copied().collect();
        for s in whole {
            let seg: &Seg = &self.state.segs[s as usize];
            // A private pool goes back only once its graph or MemPool is gone, which only
            // the trace's own releases of it tell (`settle`).
            if !seg.alive || seg.key.pool != (0, 0) {
                continue;
            }
            let size = seg.size;
            self.state.remove_segment(s);
            self.reserved_changed(-signed(size));
        }
        // Expandable ranges give back the whole pages of their free blocks: those of at least
        // a page, found in the free lists of the default pool's keys.
        let keys: Vec<(u32, PoolKey)> = self
            .state
            .keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.pool == (0, 0))
            .map(|(i, k)| (i as u32, *k))
            .collect();
        for (key_id, key) in keys {
            let page = rules::page_size(key.small, self.settings);
            let free: Vec<(u64, u64)> = self
                .state
                .free_at_least(key_id, page)
                .filter(|&b| {
                    let seg = self.state.blocks[b as usize].seg;
                    self.state.segs[seg as usize].expandable
                })
                .take(MAX_RANGES_RELEASED)
                .map(|b| {
                    (
                        self.state.blocks[b as usize].addr,
                        self.state.blocks[b as usize].end(),
                    )
                })
                .collect();
            for (lo, hi) in free {
                let lo = lo.div_ceil(page).saturating_mul(page);
                let hi = hi / page * page;
                if hi > lo && self.state.unmap(lo, hi - lo) {
                    self.reserved_changed(-signed(hi - lo));
                }
            }
        }
    }

    fn key(&self, i: u32, stream: u64, rounded: u64) -> PoolKey {
        PoolKey {
            pool: self.changes.pools.get(&i).copied().unwrap_or((0, 0)),
            stream,
            small: rules::is_small(rounded),
        }
    }

    /// The malloc path: a cached block, else new memory within the capacity, else the cached
    /// segments released and new memory again. The block, or how much was missing.
    fn get_block(&mut self, key: PoolKey, rounded: u64) -> Result<u32, i64> {
        let settings = self.settings;
        let key_id = self.state.key_id(key);
        if let Fit::Block(b) = self.state.find_fit(key_id, rounded, settings) {
            return Ok(b);
        }
        for attempt in 0..2 {
            let need = self.growth(key, rounded);
            let limit = self.changes.capacity.unwrap_or(u64::MAX);
            if self.state.reserved.saturating_add(need) <= limit {
                self.grow(key, rounded);
                if let Fit::Block(b) = self.state.find_fit(key_id, rounded, settings) {
                    return Ok(b);
                }
                return Err(0);
            }
            if attempt == 0 {
                self.release_cached();
                if let Fit::Block(b) = self.state.find_fit(key_id, rounded, settings) {
                    return Ok(b);
                }
            } else {
                return Err(margin(limit, self.state.reserved.saturating_add(need)));
            }
        }
        Err(0)
    }

    /// The bytes a new segment (or the pages mapped) for this request would add.
    fn growth(&self, key: PoolKey, rounded: u64) -> u64 {
        if !self.settings.expandable_segments {
            return rules::segment_size(rounded, self.settings);
        }
        let page = rules::page_size(key.small, self.settings);
        let tail = self.spot(key, rounded).map_or(0, |(_, free)| free);
        rounded
            .saturating_sub(tail)
            .div_ceil(page)
            .saturating_mul(page)
    }

    /// `find_expandable_block`: where an expandable pool maps pages for a request: after the
    /// lowest mapped range whose free tail and the unmapped space after it can hold it (the
    /// space up to the next range of the pool, or the rest of the reservation). The address,
    /// and the free tail the request starts in.
    fn spot(&self, key: PoolKey, rounded: u64) -> Option<(u64, u64)> {
        let base = *self.reservations.get(&key)?;
        // Ranges of other pools may lie in the same span of addresses; a few are looked at.
        let ranges: Vec<u32> = self
            .state
            .seg_at
            .range(base..base.saturating_add(RESERVATION))
            .map(|(_, &s)| s)
            .filter(|&s| self.state.segs[s as usize].key == key)
            .take(64)
            .collect();
        let tail_of = |s: u32| {
            self.state
                .seg_blocks(s)
                .last()
                .filter(|(_, b)| b.state == BlockState::Free)
                .map_or(0, |(_, b)| b.size)
        };
        for (k, &s) in ranges.iter().enumerate() {
            let end = self.state.segs[s as usize].end();
            let gap = ranges.get(k + 1).map_or(u64::MAX, |&n| {
                self.state.segs[n as usize].addr.saturating_sub(end)
            });
            let tail = tail_of(s);
            if tail.saturating_add(gap) >= rounded {
                return Some((end, tail));
            }
        }
        let &last = ranges.last()?;
        Some((self.state.segs[last as usize].end(), tail_of(last)))
    }

    fn grow(&mut self, key: PoolKey, rounded: u64) {
        let need = self.growth(key, rounded);
        let real = self
            .real_growth
            .iter()
            .position(|&(a, n)| n == need && !self.state.overlaps(a, n))
            .map(|k| self.real_growth.remove(k).0);
        if !self.settings.expandable_segments {
            let addr = real.unwrap_or_else(|| {
                let a = self.next_addr;
                self.next_addr = a.saturating_add(
                    need.div_ceil(rules::ROUND_LARGE)
                        .saturating_mul(rules::ROUND_LARGE),
                );
                a
            });
            self.state.add_segment(addr, need, key, false, Vec::new());
            self.reserved_changed(signed(need));
            return;
        }
        if let Some(at) = real {
            self.state.map(at, need, key);
            self.reservations.entry(key).or_insert(at);
            self.reserved_changed(signed(need));
            return;
        }
        let at = match self.spot(key, rounded) {
            Some((at, _)) => at,
            None => {
                let base = self.next_addr;
                self.next_addr = self.next_addr.saturating_add(RESERVATION);
                self.reservations.insert(key, base);
                base
            }
        };
        self.state.map(at, need, key);
        self.reserved_changed(signed(need));
    }

    fn size_of(&self, i: u32, e: &TraceEntry) -> u64 {
        self.changes.sizes.get(&i).copied().unwrap_or(e.size)
    }

    fn alloc(&mut self, i: u32, e: &TraceEntry) {
        let n = self.size_of(i, e);
        if n == 0 {
            self.out.dropped_requests += 1;
            self.blocks.insert(e.addr, NIL);
            return;
        }
        let rounded = rules::round_size(n, self.settings);
        let key = self.key(i, e.stream, rounded);
        match self.get_block(key, rounded) {
            Ok(b) => {
                self.state.take(b, rounded, n, e.frames, i, self.settings);
                self.blocks.insert(e.addr, b);
            }
            Err(short) => {
                self.out.ooms.push(WhatifOom {
                    event: i,
                    real: false,
                    fits: false,
                    margin: short,
                    rounded,
                });
                self.blocks.insert(e.addr, NIL);
            }
        }
    }

    /// A real OOM: the request tried again under the what-if. It is given back at once: what
    /// the program did after its failure is in the trace, not what it would have done.
    fn oom(&mut self, i: u32, e: &TraceEntry) {
        let n = self.size_of(i, e);
        if n == 0 {
            self.out.ooms.push(WhatifOom {
                event: i,
                real: true,
                fits: true,
                margin: self.headroom(),
                rounded: 0,
            });
            return;
        }
        let rounded = rules::round_size(n, self.settings);
        let key = PoolKey {
            pool: (0, 0),
            stream: e.stream,
            small: rules::is_small(rounded),
        };
        match self.get_block(key, rounded) {
            Ok(b) => {
                self.state.take(b, rounded, n, e.frames, i, self.settings);
                self.peaks(i);
                let margin = self.headroom();
                self.state.free(b);
                self.out.ooms.push(WhatifOom {
                    event: i,
                    real: true,
                    fits: true,
                    margin,
                    rounded,
                });
            }
            Err(short) => self.out.ooms.push(WhatifOom {
                event: i,
                real: true,
                fits: false,
                margin: short,
                rounded,
            }),
        }
    }

    /// Capacity not reserved.
    fn headroom(&self) -> i64 {
        match self.changes.capacity {
            Some(c) => margin(c, self.state.reserved),
            None => i64::MAX,
        }
    }
}
