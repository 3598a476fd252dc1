//! Segment dicts read where their SETITEMS runs, by the decoder's rules (`decode::segment` and
//! `decode::block`), so that neither the stitch nor the document ever copies their blocks and
//! frames: in real dumps the segments are a tenth of the bytes and, as generic containers, were
//! a third of the reader's work, all of it on one core.
//!
//! Anything the decoder would judge otherwise (a missing or repeated key, a value of another
//! type, a block or list shared with something else, the legacy `history` layout) leaves the
//! dict as it is: the generic path then gives the decoder's result or error.

use super::*;
use crate::snapshot::decode::segment_sums;
use crate::snapshot::model::{Block, BlockState, PoolKind, Segment};

/// A segment read by a chunk: stack ids are the chunk's slots until the reader remaps them.
#[derive(Clone, Debug)]
pub struct SegRow {
    pub seg: Segment,
    /// Memo index of a `segment_pool_id` tuple stored by an earlier chunk (torch's dumps share
    /// one tuple between the segments of a pool).
    pub pool_ext: Option<u32>,
}

/// Most keys a segment or block dict read here may have (torch writes 12 and 5).
const MAX_KEYS: u32 = 64;

/// Where a segment's blocks come from.
enum Blocks<'x> {
    /// The `blocks` value of a dict the machine made (a list of block dicts).
    Value(LVal),
    /// Block fields read from the bytes by [`Vm::segment_entry`].
    Read(&'x [[Option<LVal>; FIELDS]]),
}

impl<'a> Vm<'a, '_> {
    /// The fields of dict `d` by `F_*` code; `None` for a repeated field or a key that cannot be
    /// read here.
    fn fields_of(&mut self, d: u32, f: &mut [Option<LVal>; FIELDS]) -> Option<()> {
        let s = self.a.dicts[d as usize];
        if s.len > MAX_KEYS || s.rec != NONE_U32 || s.seg != NONE_U32 {
            return None;
        }
        *f = [None; FIELDS];
        for i in 0..s.len as usize {
            let (k, v) = self.a.dict_items(d)[i];
            let field = self.field(k).ok()? as usize;
            if field == F_OTHER as usize || field == F_NOT_STR as usize {
                continue;
            }
            if f[field].replace(v).is_some() {
                return None;
            }
        }
        Some(())
    }

    /// A scalar with other chunks' values read in; `None` for containers and what cannot be read.
    #[inline(always)]
    fn scalar(&mut self, v: LVal) -> Option<LVal> {
        // Values of this chunk as they are: going through `deref`'s result for them stalled
        // on copying the 16-byte value through memory (a seventh of a segment chunk's time).
        if !matches!(v, LVal::Ext(_)) {
            return Some(v);
        }
        match self.deref(v).ok()? {
            LVal::Ext(_) => None,
            v => Some(v),
        }
    }

    /// The decoder's `u64_value`.
    fn u64_of(&mut self, v: LVal) -> Option<u64> {
        match self.scalar(v)? {
            LVal::Int(i) => u64::try_from(i).ok(),
            LVal::Big(b) => u64::try_from(*self.a.bigs.get(b as usize)?).ok(),
            _ => None,
        }
    }

    /// The decoder's `opt_u64`: absent or None → `Some(None)`.
    fn opt_u64_of(&mut self, v: Option<LVal>) -> Option<Option<u64>> {
        match v {
            None => Some(None),
            Some(v) => match self.scalar(v)? {
                LVal::None => Some(None),
                _ => self.u64_of(v).map(Some),
            },
        }
    }

    fn str_of(&mut self, v: LVal) -> Option<&'_ str> {
        match self.scalar(v)? {
            LVal::Str(i) => self.a.strs.get(i as usize).copied(),
            _ => None,
        }
    }

    /// The items of a local list or tuple that nothing else extends.
    fn seq_items(&self, v: LVal) -> Option<Vec<LVal>> {
        match v {
            LVal::List(l) => {
                let s = self.a.lists[l as usize];
                (!s.flushed).then(|| self.a.list_items(l).to_vec())
            }
            LVal::Tuple(t) => Some(self.a.tuple_items(t).to_vec()),
            _ => None,
        }
    }

    /// Segment dict `d` (whose SETITEMS just ran) as a row, or `None` to leave it generic.
    pub(super) fn try_segment(&mut self, d: u32) -> Option<u32> {
        // Cheap refusal first: most dicts completed here are frame and block dicts.
        if self.a.dicts[d as usize].len < 3 {
            return None;
        }
        let mut f = [None; FIELDS];
        self.fields_of(d, &mut f)?;
        let blocks_value = f[F_BLOCKS as usize]?;
        let (seg, pool_ext, block_values) = self.segment_of(&f, Blocks::Value(blocks_value))?;
        // What the row was read from must not change behind it.
        if let LVal::List(l) = blocks_value {
            self.a.lists[l as usize].sealed = true;
        }
        for bv in &block_values {
            if let LVal::Dict(bd) = *bv {
                self.a.dicts[bd as usize].sealed = true;
            }
        }
        let row = u32::try_from(self.segs.len()).ok()?;
        self.drop_segment_dicts(d, &block_values, blocks_value, row);
        self.segs.push(SegRow { seg, pool_ext });
        Some(row)
    }

    /// The decoder's `segment` on fields `f`, its blocks taken from `blocks`: the segment, the
    /// memo index of a `segment_pool_id` tuple of another chunk, and the block dicts (for
    /// [`Blocks::Value`]). `None` to leave the dict generic.
    fn segment_of(
        &mut self,
        f: &[Option<LVal>; FIELDS],
        blocks: Blocks<'_>,
    ) -> Option<(Segment, Option<u32>, Vec<LVal>)> {
        let device = match f[F_DEVICE as usize] {
            None => 0,
            Some(v) => match self.scalar(v)? {
                LVal::Int(i) => i,
                _ => return None,
            },
        };
        let address = self.u64_of(f[F_ADDRESS as usize]?)?;
        let total_size = self.u64_of(f[F_TOTAL_SIZE as usize]?)?;
        let allocated_size = self.opt_u64_of(f[F_ALLOCATED_SIZE as usize])?;
        let active_size = self.opt_u64_of(f[F_ACTIVE_SIZE as usize])?;
        let requested_size = self.opt_u64_of(f[F_REQUESTED_SIZE as usize])?;
        let stream = self.opt_u64_of(f[F_STREAM as usize])?.unwrap_or(0);
        let pool_kind = match f[F_SEGMENT_TYPE as usize] {
            None => PoolKind::Unknown,
            Some(v) => match self.str_of(v)? {
                "small" => PoolKind::Small,
                "large" => PoolKind::Large,
                _ => PoolKind::Unknown,
            },
        };
        let (pool_id, pool_ext) = match f[F_POOL_ID as usize] {
            None => (None, None),
            Some(v) => match self.deref(v).ok()? {
                LVal::None => (None, None),
                LVal::Ext(g) => (None, Some(g)),
                seq => match self.seq_items(seq)?.as_slice() {
                    [a, b] => match (self.scalar(*a)?, self.scalar(*b)?) {
                        (LVal::Int(a), LVal::Int(b)) => (Some((a, b)), None),
                        _ => return None,
                    },
                    _ => return None,
                },
            },
        };
        let is_expandable = match f[F_IS_EXPANDABLE as usize] {
            Some(v) => matches!(self.scalar(v)?, LVal::Bool(true)),
            None => false,
        };
        let frames = self.frames_slot(f[F_FRAMES as usize])?;
        let (block_values, read) = match blocks {
            Blocks::Value(v) => (self.seq_items(v)?, &[][..]),
            Blocks::Read(read) => (Vec::new(), read),
        };
        let mut out = Vec::with_capacity(block_values.len() + read.len());
        let mut next_address = address;
        let mut push = |vm: &mut Self, fields: &[Option<LVal>; FIELDS]| -> Option<()> {
            let block = vm.block(fields, next_address)?;
            next_address = block.address.saturating_add(block.size);
            out.push(block);
            Some(())
        };
        // One of the two holds the blocks.
        for &bv in &block_values {
            let LVal::Dict(bd) = bv else { return None };
            let s = self.a.dicts[bd as usize];
            if s.flushed || s.sealed {
                return None;
            }
            let mut fields = [None; FIELDS];
            self.fields_of(bd, &mut fields)?;
            push(self, &fields)?;
        }
        for fields in read {
            push(self, fields)?;
        }
        let (allocated_size, active_size, requested_size) =
            segment_sums(&out, allocated_size, active_size, requested_size);
        let seg = Segment {
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
            blocks: out,
        };
        Some((seg, pool_ext, block_values))
    }

    /// A segment dict as torch writes it, read straight from the bytes at `p` (after `MARK`)
    /// into its row: keys fetched from the memo with `device` first, scalar values, a `frames`
    /// list and a `blocks` list of block dicts. The general path built the dicts of the
    /// segment and of its blocks, then read them again key by key: a chunk of segments took
    /// five times as long as a chunk of trace entries. Decodes as [`Vm::try_segment`] does;
    /// `None` for anything else (the caller rolls back and reads the dict the general way).
    /// The memo slots of the dicts and of the blocks list refuse a fetch, as a segment's do.
    /// The caller has seen the `device` key at `p`.
    pub(super) fn segment_entry(&mut self, data: &'a [u8], p: usize) -> Option<usize> {
        self.memo_refused();
        let mut f = [None; FIELDS];
        let mut blocks = std::mem::take(&mut self.scratch_blocks);
        blocks.clear();
        let end = self.dict_fields(data, p, &mut f, Some(&mut blocks));
        let seg = match end {
            // `try_segment` leaves dicts of fewer pairs generic.
            Some((_, keys)) if keys >= 3 && f[F_BLOCKS as usize].is_some() => {
                self.segment_of(&f, Blocks::Read(&blocks))
            }
            _ => None,
        };
        let end = end.map(|(end, _)| end);
        self.scratch_blocks = blocks;
        let (seg, pool_ext, _) = seg?;
        let row = u32::try_from(self.segs.len()).ok()?;
        if self.segs.capacity() == 0 && self.mode == Mode::Chunk {
            // A segment with one block takes 110 bytes or more: room for the rest of the
            // chunk's, so the rows are not copied as they grow (untouched room costs no memory).
            let rest = self.ctx.spans[self.src as usize].end.saturating_sub(p);
            self.segs.reserve(rest / 100);
        }
        self.segs.push(SegRow { seg, pool_ext });
        self.stack.push(LVal::Seg { src: self.src, row });
        end
    }

    /// A memo slot that refuses a fetch (a segment's dicts and blocks list).
    fn memo_refused(&mut self) {
        self.memo.push(LVal::Seg {
            src: self.src,
            row: NONE_U32,
        });
        self.memo_next += 1;
    }

    /// The pairs of a segment or block dict from `p` up to its SETITEMS, into `f`: the
    /// position after SETITEMS and how many pairs. A segment's blocks (with `blocks` given) go
    /// there, `f[F_BLOCKS]` set once they are read; a block dict has none.
    fn dict_fields(
        &mut self,
        data: &'a [u8],
        mut p: usize,
        f: &mut [Option<LVal>; FIELDS],
        mut blocks: Option<&mut Vec<[Option<LVal>; FIELDS]>>,
    ) -> Option<(usize, u32)> {
        let mut keys = 0u32;
        loop {
            if *data.get(p)? == op::SETITEMS {
                return Some((p + 1, keys));
            }
            let (field, np) = self.fetched_key(data, p)?;
            keys += 1;
            if keys > MAX_KEYS || field == F_NOT_STR || field == F_ACTION {
                return None;
            }
            let (v, np) = match (field, blocks.as_deref_mut()) {
                (F_BLOCKS, None) => return None,
                (F_BLOCKS, Some(_)) if f[F_BLOCKS as usize].is_some() => return None,
                (F_BLOCKS, Some(blocks)) => (LVal::None, self.block_list(data, np, blocks)?),
                _ => self.segment_value(data, np, field)?,
            };
            p = np;
            if field != F_OTHER && f[field as usize].replace(v).is_some() {
                return None;
            }
        }
    }

    /// A `blocks` list at `p`: `EMPTY_LIST MEMOIZE`, then one block dict and APPEND, or
    /// batches of them between MARK and APPENDS (or nothing). The position after it.
    fn block_list(
        &mut self,
        data: &'a [u8],
        mut p: usize,
        blocks: &mut Vec<[Option<LVal>; FIELDS]>,
    ) -> Option<usize> {
        if *data.get(p)? != op::EMPTY_LIST || *data.get(p + 1)? != op::MEMOIZE {
            return None;
        }
        self.memo_refused();
        p += 2;
        loop {
            match *data.get(p)? {
                op::EMPTY_DICT => {
                    p = self.block_dict(data, p, blocks)?;
                    if *data.get(p)? != op::APPEND {
                        return None;
                    }
                    p += 1;
                }
                op::MARK => {
                    p += 1;
                    while *data.get(p)? == op::EMPTY_DICT {
                        p = self.block_dict(data, p, blocks)?;
                    }
                    if *data.get(p)? != op::APPENDS {
                        return None;
                    }
                    p += 1;
                }
                _ => return Some(p),
            }
        }
    }

    /// A block dict at `p` (`EMPTY_DICT MEMOIZE MARK (key value)* SETITEMS`), its fields
    /// pushed to `blocks`; the position after it.
    fn block_dict(
        &mut self,
        data: &'a [u8],
        p: usize,
        blocks: &mut Vec<[Option<LVal>; FIELDS]>,
    ) -> Option<usize> {
        if *data.get(p + 1)? != op::MEMOIZE || *data.get(p + 2)? != op::MARK {
            return None;
        }
        self.memo_refused();
        let mut f = [None; FIELDS];
        let (end, _) = self.dict_fields(data, p + 3, &mut f, None)?;
        blocks.push(f);
        Some(end)
    }

    /// A value of a segment or block dict at `p`: an int, None, a bool, a string, a memo
    /// fetch, or (for `frames`) a list, empty or of frames fetched from other chunks. The
    /// value as the machine would hold it and the position after it.
    fn segment_value(&mut self, data: &'a [u8], p: usize, field: u8) -> Option<(LVal, usize)> {
        let code = *data.get(p)?;
        Some(match code {
            op::BININT1 | op::BININT2 | op::BININT | op::LONG1 => {
                let (v, len) = small_int(data, p)?;
                let np = p + len;
                // torch's `segment_pool_id`: a tuple of two ints, its own for each segment.
                if field == F_POOL_ID {
                    let (w, len) = small_int(data, np)?;
                    if *data.get(np + len)? != op::TUPLE2 {
                        return None;
                    }
                    let t = self.a.new_tuple(&[LVal::Int(v), LVal::Int(w)]).ok()?;
                    let mut np = np + len + 1;
                    self.memoize_if_next(data, &mut np, t);
                    return Some((t, np));
                }
                (LVal::Int(v), np)
            }
            op::NONE => (LVal::None, p + 1),
            op::NEWTRUE => (LVal::Bool(true), p + 1),
            op::NEWFALSE => (LVal::Bool(false), p + 1),
            op::SHORT_BINUNICODE => self.short_str(data, p)?,
            op::BINGET | op::LONG_BINGET => self.fetch(data, p).ok()?,
            op::EMPTY_LIST if field == F_FRAMES => self.frames_list(data, p)?,
            _ => return None,
        })
    }

    /// Gives back the pairs of segment dict `d` and of its block dicts once the segment is a
    /// row: they are the last pairs of the pool (read whole, in order), and a chunk of segments
    /// otherwise grows the pool to megabytes of dead pairs (fresh pages each chunk). Nothing
    /// reads them again: the dicts are marked as the segment (a fetch of any of them, or of the
    /// blocks list, is refused, as a fetch of a segment is). Chunk mode only.
    fn drop_segment_dicts(&mut self, d: u32, blocks: &[LVal], list: LVal, row: u32) {
        let LVal::List(l) = list else { return };
        if self.mode != Mode::Chunk {
            return;
        }
        let ids = || {
            blocks
                .iter()
                .filter_map(|v| match v {
                    LVal::Dict(bd) => Some(*bd),
                    _ => None,
                })
                .chain(std::iter::once(d))
        };
        let mut low = usize::MAX;
        let mut pairs = 0usize;
        for id in ids() {
            let s = self.a.dicts[id as usize];
            if s.own != NONE_U32 {
                return;
            }
            low = low.min(s.start as usize);
            pairs += s.len as usize;
        }
        // Only when they are exactly the pool's tail (nothing else among them).
        if low.checked_add(pairs) != Some(self.a.dpool.len()) {
            return;
        }
        for id in ids() {
            let s = &mut self.a.dicts[id as usize];
            s.seg = row;
            s.sealed = true;
            s.start = low as u32;
            s.len = 0;
        }
        self.a.lists[l as usize].dropped = true;
        self.a.dpool.truncate(low);
    }

    /// The decoder's `block` on fields `f`, for blocks with a `frames` key (the layout since
    /// torch 2.1).
    fn block(&mut self, f: &[Option<LVal>; FIELDS], implied_address: u64) -> Option<Block> {
        let address = self
            .opt_u64_of(f[F_ADDRESS as usize])?
            .unwrap_or(implied_address);
        let size = self.u64_of(f[F_SIZE as usize]?)?;
        let state = match self.str_of(f[F_STATE as usize]?)? {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            _ => BlockState::Unknown,
        };
        // Without `frames` the decoder reads the legacy `history`.
        let frames_value = f[F_FRAMES as usize]?;
        let requested_size = self.opt_u64_of(f[F_REQUESTED_SIZE as usize])??;
        let frames = self.frames_slot(Some(frames_value))?;
        Some(Block {
            address,
            size,
            requested_size,
            state,
            frames,
        })
    }

    /// A `frames` value as this machine's stack slot (the decoder's `stack`).
    fn frames_slot(&mut self, v: Option<LVal>) -> Option<StackId> {
        if let Some(LVal::List(l)) = v {
            if self.a.lists[l as usize].flushed {
                return None;
            }
        }
        let v = match v {
            Some(v @ LVal::Ext(_)) => match self.deref(v).ok()? {
                LVal::None => None,
                LVal::Ext(g) => Some(LVal::Ext(g)),
                _ => return None,
            },
            v => v,
        };
        self.stack_slot(v).ok().map(StackId)
    }
}
