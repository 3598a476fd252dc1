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

impl Vm<'_, '_> {
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
    fn scalar(&mut self, v: LVal) -> Option<LVal> {
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
        let block_values = self.seq_items(blocks_value)?;
        let mut blocks = Vec::with_capacity(block_values.len());
        let mut next_address = address;
        for bv in &block_values {
            let LVal::Dict(bd) = *bv else { return None };
            let block = self.block(bd, next_address)?;
            next_address = block.address.saturating_add(block.size);
            blocks.push(block);
        }
        let (allocated_size, active_size, requested_size) =
            segment_sums(&blocks, allocated_size, active_size, requested_size);
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
        self.segs.push(SegRow {
            seg: Segment {
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
                blocks,
            },
            pool_ext,
        });
        Some(row)
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

    /// The decoder's `block`, for blocks with a `frames` key (the layout since torch 2.1).
    fn block(&mut self, bd: u32, implied_address: u64) -> Option<Block> {
        let s = self.a.dicts[bd as usize];
        if s.flushed || s.sealed {
            return None;
        }
        let mut f = [None; FIELDS];
        self.fields_of(bd, &mut f)?;
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
