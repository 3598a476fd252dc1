//! The allocator's state: segments cut into blocks, and the free blocks of each pool kept in
//! the order the allocator searches them (`BlockPool`: stream, size, address).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::rules;
use super::settings::Settings;
use crate::snapshot::StackId;

pub const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    Free,
    Allocated,
    /// Between `free_requested` and `free_completed`: not reusable, not merged.
    Pending,
}

/// A block of a segment. Blocks of one segment form a list in address order.
#[derive(Clone, Debug)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    pub seg: u32,
    pub prev: u32,
    pub next: u32,
    pub state: BlockState,
    pub requested: u64,
    pub stack: StackId,
    /// The trace event that allocated it; `NIL` for a block alive before the window.
    pub birth: u32,
    /// The event of its `free_requested` while it is pending.
    pub freed_at: u32,
}

impl Block {
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }
}

/// Which free list a block belongs to: (memory pool, stream, small or large).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub pool: (i64, i64),
    pub stream: u64,
    pub small: bool,
}

#[derive(Clone, Debug)]
pub struct Seg {
    pub addr: u64,
    pub size: u64,
    pub key: PoolKey,
    /// `key`'s index in the state's free lists.
    pub key_id: u32,
    pub expandable: bool,
    pub first: u32,
    pub alive: bool,
}

impl Seg {
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }
}

#[derive(Default)]
pub struct State {
    pub blocks: Vec<Block>,
    spare: Vec<u32>,
    /// Start address → block, for every block of every live segment.
    pub by_addr: BTreeMap<u64, u32>,
    pub segs: Vec<Seg>,
    /// Start address → segment, for the live segments.
    pub seg_at: BTreeMap<u64, u32>,
    /// Free blocks per pool key: (size, address) packed in one number, the order the
    /// allocator searches them in, to the block.
    free: Vec<BTreeMap<u128, u32>>,
    pub free_bytes: Vec<u64>,
    pub keys: Vec<PoolKey>,
    key_index: FxHashMap<PoolKey, u32>,
    /// Whether any pool but the default one has been seen.
    pub private_pools: bool,
    /// Σ segment bytes (`memory_reserved()`) and Σ bytes of blocks not free (allocated or
    /// pending: `memory_allocated()` counts a block until its free completes).
    pub reserved: u64,
    pub allocated: u64,
    /// Live segments that are one free block (what `release_cached_blocks` can give back): a
    /// release walks these, not every segment.
    pub whole_free: std::collections::BTreeSet<u32>,
}

impl State {
    pub fn key_id(&mut self, key: PoolKey) -> u32 {
        if let Some(&k) = self.key_index.get(&key) {
            return k;
        }
        let k = self.keys.len() as u32;
        self.private_pools |= key.pool != (0, 0);
        self.keys.push(key);
        self.key_index.insert(key, k);
        self.free.push(BTreeMap::new());
        self.free_bytes.push(0);
        k
    }

    pub fn key_of(&self, key: &PoolKey) -> Option<u32> {
        self.key_index.get(key).copied()
    }

    fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn seg_key(&self, seg: u32) -> u32 {
        self.segs[seg as usize].key_id
    }

    fn free_insert(&mut self, b: u32) {
        let blk = &self.blocks[b as usize];
        let (size, addr) = (blk.size, blk.addr);
        let k = self.seg_key(blk.seg) as usize;
        self.free[k].insert(order(size, addr), b);
        self.free_bytes[k] = self.free_bytes[k].saturating_add(size);
    }

    fn free_remove(&mut self, b: u32) {
        let blk = &self.blocks[b as usize];
        let (size, addr) = (blk.size, blk.addr);
        let k = self.seg_key(blk.seg) as usize;
        if self.free[k].remove(&order(size, addr)).is_some() {
            self.free_bytes[k] = self.free_bytes[k].saturating_sub(size);
        }
    }

    /// The live segment holding `addr`.
    pub fn seg_containing(&self, addr: u64) -> Option<u32> {
        let (_, &s) = self.seg_at.range(..=addr).next_back()?;
        (addr < self.segs[s as usize].end()).then_some(s)
    }

    /// The block holding `addr`.
    pub fn block_containing(&self, addr: u64) -> Option<u32> {
        let (_, &b) = self.by_addr.range(..=addr).next_back()?;
        (addr < self.blocks[b as usize].end()).then_some(b)
    }

    /// Whether `[addr, addr + size)` overlaps a live segment.
    pub fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        if let Some((_, &s)) = self.seg_at.range(..end).next_back() {
            return self.segs[s as usize].end() > addr;
        }
        false
    }

    /// Adds a segment cut into the given blocks (address order, tiling it: the caller's
    /// gaps are free blocks). Returns the segment.
    pub fn add_segment(
        &mut self,
        addr: u64,
        size: u64,
        key: PoolKey,
        expandable: bool,
        mut blocks: Vec<Block>,
    ) -> u32 {
        let key_id = self.key_id(key);
        let seg = self.segs.len() as u32;
        if blocks.is_empty() {
            blocks.push(free_block(addr, size));
        }
        self.segs.push(Seg {
            addr,
            size,
            key,
            key_id,
            expandable,
            first: NIL,
            alive: true,
        });
        self.seg_at.insert(addr, seg);
        self.reserved = self.reserved.saturating_add(size);
        let mut prev = NIL;
        for mut b in blocks {
            b.seg = seg;
            b.prev = prev;
            b.next = NIL;
            let id = self.new_block(b);
            if prev == NIL {
                self.segs[seg as usize].first = id;
            } else {
                self.blocks[prev as usize].next = id;
            }
            self.by_addr.insert(self.blocks[id as usize].addr, id);
            if self.blocks[id as usize].state == BlockState::Free {
                self.free_insert(id);
            } else {
                self.allocated = self.allocated.saturating_add(self.blocks[id as usize].size);
            }
            prev = id;
        }
        self.refresh_whole(seg);
        seg
    }

    /// A state made of whole segments at once (address order, each tiled by its blocks): the
    /// indexes are built from sorted lists instead of one insertion at a time.
    pub fn build(segments: Vec<(u64, u64, PoolKey, bool, Vec<Block>)>) -> State {
        let mut st = State::default();
        let mut addrs: Vec<(u64, u32)> = Vec::new();
        let mut seg_addrs: Vec<(u64, u32)> = Vec::with_capacity(segments.len());
        let mut free: Vec<Vec<(u128, u32)>> = Vec::new();
        for (addr, size, key, expandable, blocks) in segments {
            let key_id = st.key_id(key);
            if free.len() < st.keys.len() {
                free.resize_with(st.keys.len(), Vec::new);
            }
            let seg = st.segs.len() as u32;
            seg_addrs.push((addr, seg));
            let first = st.blocks.len() as u32;
            let n = blocks.len() as u32;
            for (k, mut b) in blocks.into_iter().enumerate() {
                let id = first + k as u32;
                b.seg = seg;
                b.prev = if k == 0 { NIL } else { id - 1 };
                b.next = if k as u32 + 1 == n { NIL } else { id + 1 };
                addrs.push((b.addr, id));
                if b.state == BlockState::Free {
                    free[key_id as usize].push((order(b.size, b.addr), id));
                    st.free_bytes[key_id as usize] =
                        st.free_bytes[key_id as usize].saturating_add(b.size);
                } else {
                    st.allocated = st.allocated.saturating_add(b.size);
                }
                st.blocks.push(b);
            }
            st.reserved = st.reserved.saturating_add(size);
            st.segs.push(Seg {
                addr,
                size,
                key,
                key_id,
                expandable,
                first: if n == 0 { NIL } else { first },
                alive: true,
            });
        }
        st.by_addr = addrs.into_iter().collect();
        st.seg_at = seg_addrs.into_iter().collect();
        for seg in 0..st.segs.len() as u32 {
            st.refresh_whole(seg);
        }
        for (k, mut list) in free.into_iter().enumerate() {
            list.sort_unstable();
            st.free[k] = list.into_iter().collect();
        }
        st
    }

    /// Removes a segment and its blocks; returns how many of them were not free.
    pub fn remove_segment(&mut self, seg: u32) -> u32 {
        let mut live = 0;
        let mut b = self.segs[seg as usize].first;
        while b != NIL {
            let next = self.blocks[b as usize].next;
            if self.blocks[b as usize].state == BlockState::Free {
                self.free_remove(b);
            } else {
                live += 1;
                self.allocated = self.allocated.saturating_sub(self.blocks[b as usize].size);
            }
            self.by_addr.remove(&self.blocks[b as usize].addr);
            self.spare.push(b);
            b = next;
        }
        let s = &mut self.segs[seg as usize];
        s.alive = false;
        s.first = NIL;
        self.reserved = self.reserved.saturating_sub(s.size);
        let addr = s.addr;
        self.seg_at.remove(&addr);
        self.whole_free.remove(&seg);
        live
    }

    /// Records whether a (non-expandable) segment is one free block now.
    fn refresh_whole(&mut self, seg: u32) {
        let whole = self.segs[seg as usize].alive
            && !self.segs[seg as usize].expandable
            && self.seg_is_free(seg);
        if whole {
            self.whole_free.insert(seg);
        } else {
            self.whole_free.remove(&seg);
        }
    }

    /// Whether the segment is one free block (what `release_block` can `cudaFree`).
    pub fn seg_is_free(&self, seg: u32) -> bool {
        let f = self.segs[seg as usize].first;
        f != NIL
            && self.blocks[f as usize].state == BlockState::Free
            && self.blocks[f as usize].next == NIL
    }

    /// `get_free_block`: the best fit in the pool for a rounded request, or why there is none.
    pub fn find_fit(&self, key: u32, rounded: u64, settings: &Settings) -> Fit {
        let set = &self.free[key as usize];
        let mut it = set.range(order(rounded, 0)..);
        let Some((&first, &b)) = it.next() else {
            return Fit::None;
        };
        let (mut size, mut b) = ((first >> 64) as u64, b);
        if settings.expandable_segments
            && self.segs[self.blocks[b as usize].seg as usize].expandable
        {
            // A free block at the end of a mapped range counts as the size it could grow to;
            // the search moves on while the next one could grow to less.
            let grow = |b: u32| -> u64 {
                let blk = &self.blocks[b as usize];
                if blk.next == NIL {
                    blk.size.saturating_add(self.unmapped_after(blk.seg))
                } else {
                    blk.size
                }
            };
            for (&o2, &b2) in it {
                let s2 = (o2 >> 64) as u64;
                if !self.segs[self.blocks[b2 as usize].seg as usize].expandable
                    || grow(b2) >= grow(b)
                {
                    break;
                }
                b = b2;
                size = s2;
            }
        }
        if rules::oversize_refused(size, rounded, settings) {
            return Fit::Oversize(b);
        }
        Fit::Block(b)
    }

    /// The unmapped address space after an expandable range: up to the next mapped range of
    /// its pool (the same reservation), or the rest of the reservation (unknown: taken as
    /// unbounded) when none follows.
    fn unmapped_after(&self, seg: u32) -> u64 {
        let s = &self.segs[seg as usize];
        // Ranges of other pools may lie between; a few are looked at, not all.
        self.seg_at
            .range(s.end()..)
            .take(64)
            .map(|(_, &n)| &self.segs[n as usize])
            .find(|n| n.expandable && n.key == s.key)
            .map_or(u64::MAX / 2, |n| n.addr - s.end())
    }

    /// `alloc_found_block`: hands out block `b` for a rounded request, splitting off the
    /// remainder when the split rule says so. Returns whether it split.
    pub fn take(
        &mut self,
        b: u32,
        rounded: u64,
        requested: u64,
        stack: StackId,
        birth: u32,
        settings: &Settings,
    ) -> bool {
        self.take_block(b, true, rounded, requested, stack, birth, settings)
    }

    #[allow(clippy::too_many_arguments)]
    fn take_block(
        &mut self,
        b: u32,
        listed: bool,
        rounded: u64,
        requested: u64,
        stack: StackId,
        birth: u32,
        settings: &Settings,
    ) -> bool {
        if listed {
            self.free_remove(b);
        }
        let seg = self.blocks[b as usize].seg;
        self.whole_free.remove(&seg);
        let small = self.segs[seg as usize].key.small;
        let size = self.blocks[b as usize].size;
        let split = rounded < size && rules::should_split(size, rounded, small, settings);
        if split {
            let blk = &self.blocks[b as usize];
            let rest = Block {
                addr: blk.addr.saturating_add(rounded),
                size: size - rounded,
                seg: blk.seg,
                prev: b,
                next: blk.next,
                ..free_block(0, 0)
            };
            let next = blk.next;
            let r = self.new_block(rest);
            if next != NIL {
                self.blocks[next as usize].prev = r;
            }
            self.blocks[b as usize].next = r;
            self.blocks[b as usize].size = rounded;
            self.by_addr.insert(self.blocks[r as usize].addr, r);
            self.free_insert(r);
        }
        let blk = &mut self.blocks[b as usize];
        blk.state = BlockState::Allocated;
        self.allocated = self.allocated.saturating_add(blk.size);
        blk.requested = requested;
        blk.stack = stack;
        blk.birth = birth;
        blk.freed_at = NIL;
        split
    }

    /// Cuts the free block `b` so that a block starts at `addr` (inside it); returns that
    /// block, free. For following the real allocator where the model chose otherwise.
    pub fn cut_at(&mut self, b: u32, addr: u64) -> u32 {
        let (high, listed) = self.carve(b, addr);
        if !listed {
            self.free_insert(high);
        }
        high
    }

    /// [`State::cut_at`] for a block about to be handed out: the high part is left out of the
    /// free lists (it would be taken out again at once). Returns it and whether it is listed.
    fn carve(&mut self, b: u32, addr: u64) -> (u32, bool) {
        let blk = &self.blocks[b as usize];
        if addr <= blk.addr || addr >= blk.end() {
            return (b, true);
        }
        let (end, next, seg) = (blk.end(), blk.next, blk.seg);
        self.free_remove(b);
        self.whole_free.remove(&seg);
        let high = self.new_block(Block {
            addr,
            size: end - addr,
            seg,
            prev: b,
            next,
            ..free_block(0, 0)
        });
        if next != NIL {
            self.blocks[next as usize].prev = high;
        }
        let low = &mut self.blocks[b as usize];
        low.next = high;
        low.size = addr - low.addr;
        self.by_addr.insert(addr, high);
        self.free_insert(b);
        (high, false)
    }

    /// Hands out the part of free block `b` that starts at `addr` (the real allocator's
    /// choice where the model's differed): [`State::cut_at`] then [`State::take`].
    #[allow(clippy::too_many_arguments)]
    pub fn take_at(
        &mut self,
        b: u32,
        addr: u64,
        rounded: u64,
        requested: u64,
        stack: StackId,
        birth: u32,
        settings: &Settings,
    ) -> (u32, bool) {
        let (high, listed) = self.carve(b, addr);
        let split = self.take_block(high, listed, rounded, requested, stack, birth, settings);
        (high, split)
    }

    /// `free_requested`: the block stays in place, not reusable.
    pub fn mark_pending(&mut self, b: u32, event: u32) {
        let blk = &mut self.blocks[b as usize];
        if blk.state == BlockState::Allocated {
            blk.state = BlockState::Pending;
            blk.freed_at = event;
        }
    }

    /// `free_block`: the block returns to its pool, merged with free neighbours
    /// (`try_merge_blocks`: not allocated, no pending events). Returns the merged block.
    pub fn free(&mut self, b: u32) -> u32 {
        if self.blocks[b as usize].state == BlockState::Free {
            return b;
        }
        self.allocated = self.allocated.saturating_sub(self.blocks[b as usize].size);
        self.blocks[b as usize].state = BlockState::Free;
        let mut b = b;
        let prev = self.blocks[b as usize].prev;
        if prev != NIL && self.blocks[prev as usize].state == BlockState::Free {
            self.free_remove(prev);
            self.absorb_next(prev);
            b = prev;
        }
        let next = self.blocks[b as usize].next;
        if next != NIL && self.blocks[next as usize].state == BlockState::Free {
            self.free_remove(next);
            self.absorb_next(b);
        }
        self.free_insert(b);
        let seg = self.blocks[b as usize].seg;
        if self.blocks[b as usize].prev == NIL && self.blocks[b as usize].next == NIL {
            self.refresh_whole(seg);
        }
        b
    }

    /// Joins the block after `b` into `b` (neither in a free list).
    fn absorb_next(&mut self, b: u32) {
        let n = self.blocks[b as usize].next;
        let (size, after, addr) = {
            let nb = &self.blocks[n as usize];
            (nb.size, nb.next, nb.addr)
        };
        self.by_addr.remove(&addr);
        self.spare.push(n);
        let blk = &mut self.blocks[b as usize];
        blk.size = blk.size.saturating_add(size);
        blk.next = after;
        if after != NIL {
            self.blocks[after as usize].prev = b;
        }
    }

    /// `segment_map`: `[addr, addr + size)` mapped in an expandable pool; it joins the mapped
    /// range that ends at `addr` (its free tail grows) or that starts at its end, or becomes a
    /// range of its own.
    pub fn map(&mut self, addr: u64, size: u64, key: PoolKey) {
        self.reserved = self.reserved.saturating_add(size);
        let before = self.seg_containing(addr.wrapping_sub(1)).filter(|&s| {
            let seg = &self.segs[s as usize];
            seg.end() == addr && seg.expandable && seg.key == key
        });
        let seg = match before {
            Some(s) => {
                self.segs[s as usize].size = self.segs[s as usize].size.saturating_add(size);
                let last = self.last_block(s);
                if self.blocks[last as usize].state == BlockState::Free {
                    self.free_remove(last);
                    self.blocks[last as usize].size =
                        self.blocks[last as usize].size.saturating_add(size);
                    self.free_insert(last);
                } else {
                    let nb = self.new_block(Block {
                        seg: s,
                        prev: last,
                        ..free_block(addr, size)
                    });
                    self.blocks[last as usize].next = nb;
                    self.by_addr.insert(addr, nb);
                    self.free_insert(nb);
                }
                s
            }
            None => {
                // add_segment counts the range again.
                self.reserved = self.reserved.saturating_sub(size);
                self.add_segment(addr, size, key, true, Vec::new())
            }
        };
        // A mapped range that starts where this one now ends is the same run.
        let end = self.segs[seg as usize].end();
        if let Some(&after) = self.seg_at.get(&end) {
            if self.segs[after as usize].expandable && self.segs[after as usize].key == key {
                self.join_segments(seg, after);
            }
        }
    }

    fn last_block(&self, seg: u32) -> u32 {
        let mut b = self.segs[seg as usize].first;
        // Blocks are few per mapped run in practice; the address index finds the last one.
        let end = self.segs[seg as usize].end();
        if let Some((_, &last)) = self.by_addr.range(..end).next_back() {
            if self.blocks[last as usize].seg == seg {
                return last;
            }
        }
        while self.blocks[b as usize].next != NIL {
            b = self.blocks[b as usize].next;
        }
        b
    }

    /// Gives the blocks from `first` to the end of its list to segment `seg`, of the same pool
    /// key (so the free lists, keyed by pool, stay as they are).
    fn move_blocks(&mut self, first: u32, seg: u32) {
        let mut x = first;
        while x != NIL {
            self.blocks[x as usize].seg = seg;
            x = self.blocks[x as usize].next;
        }
    }

    fn join_segments(&mut self, a: u32, b: u32) {
        let last = self.last_block(a);
        let first = self.segs[b as usize].first;
        let size = self.segs[b as usize].size;
        self.seg_at.remove(&self.segs[b as usize].addr);
        self.segs[b as usize].alive = false;
        self.move_blocks(first, a);
        self.blocks[last as usize].next = first;
        self.blocks[first as usize].prev = last;
        self.segs[a as usize].size = self.segs[a as usize].size.saturating_add(size);
        if self.blocks[last as usize].state == BlockState::Free
            && self.blocks[first as usize].state == BlockState::Free
        {
            self.free_remove(last);
            self.free_remove(first);
            self.absorb_next(last);
            self.free_insert(last);
        }
    }

    /// `segment_unmap`: `[addr, addr + size)` of an expandable range unmapped. It must lie in
    /// one free block; the range is cut there. Returns false when it does not.
    pub fn unmap(&mut self, addr: u64, size: u64) -> bool {
        let Some(b) = self.block_containing(addr) else {
            return false;
        };
        let end = addr.saturating_add(size);
        let blk = &self.blocks[b as usize];
        if blk.state != BlockState::Free || end > blk.end() {
            return false;
        }
        let seg = blk.seg;
        let key = self.segs[seg as usize].key;
        self.reserved = self.reserved.saturating_sub(size);
        // Cut the block so that [addr, end) is a block of its own, then split the segment.
        let mid = self.cut_at(b, addr);
        if end < self.blocks[mid as usize].end() {
            self.cut_at(mid, end);
        }
        let (prev, next) = (
            self.blocks[mid as usize].prev,
            self.blocks[mid as usize].next,
        );
        self.free_remove(mid);
        self.by_addr.remove(&addr);
        self.spare.push(mid);
        let seg_end = self.segs[seg as usize].end();
        if prev == NIL {
            self.seg_at.remove(&self.segs[seg as usize].addr);
            self.segs[seg as usize].alive = false;
        } else {
            self.blocks[prev as usize].next = NIL;
            self.segs[seg as usize].size = addr - self.segs[seg as usize].addr;
        }
        if next != NIL {
            // The blocks after the hole form a mapped range of their own.
            self.blocks[next as usize].prev = NIL;
            let new = self.segs.len() as u32;
            let key_id = self.segs[seg as usize].key_id;
            self.segs.push(Seg {
                addr: end,
                size: seg_end - end,
                key,
                key_id,
                expandable: true,
                first: next,
                alive: true,
            });
            self.seg_at.insert(end, new);
            self.move_blocks(next, new);
        }
        true
    }

    /// The blocks of a segment in address order.
    pub fn seg_blocks(&self, seg: u32) -> SegBlocks<'_> {
        SegBlocks {
            state: self,
            at: self.segs[seg as usize].first,
        }
    }

    /// The free blocks of a pool key of at least `size` bytes, smallest first.
    pub fn free_at_least(&self, key: u32, size: u64) -> impl Iterator<Item = u32> + '_ {
        self.free[key as usize]
            .range(order(size, 0)..)
            .map(|(_, &b)| b)
    }

    /// The largest free block of a pool key.
    pub fn largest_free(&self, key: u32) -> u64 {
        self.free[key as usize]
            .keys()
            .next_back()
            .map_or(0, |&o| (o >> 64) as u64)
    }
}

pub struct SegBlocks<'a> {
    state: &'a State,
    at: u32,
}

impl<'a> Iterator for SegBlocks<'a> {
    type Item = (u32, &'a Block);
    fn next(&mut self) -> Option<Self::Item> {
        if self.at == NIL {
            return None;
        }
        let id = self.at;
        let b = &self.state.blocks[id as usize];
        self.at = b.next;
        Some((id, b))
    }
}

/// A free block's place in its pool's search order: by size, then address.
fn order(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

/// A free block (list links set by the caller).
pub fn free_block(addr: u64, size: u64) -> Block {
    Block {
        addr,
        size,
        seg: NIL,
        prev: NIL,
        next: NIL,
        state: BlockState::Free,
        requested: 0,
        stack: StackId::EMPTY,
        birth: NIL,
        freed_at: NIL,
    }
}

/// What the best-fit search found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    Block(u32),
    /// The best fit is refused by a `max_split_size` rule.
    Oversize(u32),
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn key(small: bool) -> PoolKey {
        PoolKey {
            pool: (0, 0),
            stream: 0,
            small,
        }
    }

    fn layout(st: &State, seg: u32) -> Vec<(u64, u64, BlockState)> {
        st.seg_blocks(seg)
            .map(|(_, b)| (b.addr, b.size, b.state))
            .collect()
    }

    #[test]
    fn take_splits_and_free_merges_back() {
        let s = Settings::default();
        let mut st = State::default();
        let seg = st.add_segment(20 * MIB, 20 * MIB, key(false), false, Vec::new());
        assert!(st.whole_free.contains(&seg));
        let k = st.key_of(&key(false)).unwrap();
        let Fit::Block(b) = st.find_fit(k, 4 * MIB, &s) else {
            panic!("a 20 MiB segment fits 4 MiB")
        };
        assert!(st.take(b, 4 * MIB, 4 * MIB - 100, StackId::EMPTY, 0, &s));
        assert!(!st.whole_free.contains(&seg));
        assert_eq!(st.allocated, 4 * MIB);
        let Fit::Block(c) = st.find_fit(k, 15 * MIB, &s) else {
            panic!("the remainder fits 15 MiB")
        };
        // 16 MiB left for 15 MiB: the 1 MiB remainder is not split off (large pool).
        assert!(!st.take(c, 15 * MIB, 15 * MIB, StackId::EMPTY, 1, &s));
        assert_eq!(
            layout(&st, seg)[1],
            (24 * MIB, 16 * MIB, BlockState::Allocated)
        );
        st.mark_pending(b, 2);
        st.free(c);
        // The pending block is not merged with its free neighbour.
        assert_eq!(layout(&st, seg).len(), 2);
        st.free(b);
        assert_eq!(
            layout(&st, seg),
            vec![(20 * MIB, 20 * MIB, BlockState::Free)]
        );
        assert!(st.whole_free.contains(&seg));
        assert_eq!(st.allocated, 0);
        assert_eq!(st.remove_segment(seg), 0);
        assert_eq!(st.reserved, 0);
    }

    #[test]
    fn mapped_ranges_join_and_unmapping_cuts_them() {
        let mut st = State::default();
        st.map(64 * MIB, 20 * MIB, key(false));
        st.map(84 * MIB, 20 * MIB, key(false));
        // One range of 40 MiB, one free block.
        assert_eq!(st.seg_at.len(), 1);
        let seg = *st.seg_at.values().next().unwrap();
        assert_eq!(
            layout(&st, seg),
            vec![(64 * MIB, 40 * MIB, BlockState::Free)]
        );
        // A range of another pool that ends where the next one starts is not joined to it.
        st.map(104 * MIB, 2 * MIB, key(true));
        assert_eq!(st.seg_at.len(), 2);
        assert_eq!(st.reserved, 42 * MIB);
        // Unmapping the middle leaves two ranges.
        assert!(st.unmap(74 * MIB, 20 * MIB));
        assert_eq!(st.seg_at.len(), 3);
        assert_eq!(st.reserved, 22 * MIB);
        let ranges: Vec<(u64, u64)> = st
            .seg_at
            .values()
            .map(|&s| (st.segs[s as usize].addr, st.segs[s as usize].size))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (64 * MIB, 10 * MIB),
                (94 * MIB, 10 * MIB),
                (104 * MIB, 2 * MIB)
            ]
        );
        // Not free, or not mapped: refused.
        assert!(!st.unmap(80 * MIB, 2 * MIB));
    }
}
