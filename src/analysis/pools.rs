//! Memory pools by kind: the default pool, CUDA-graph capture pools (`(n, 0)`, cudagraph trees
//! when their frames say so), `torch.cuda.MemPool`s (`(0, n)`, named by the `pool` or `name` key
//! of the `user_metadata` their allocations ran under), and symmetric memory. A free block in one
//! pool never serves another, so memory reserved in other pools is out of a request's reach.
//!
//! A segment event's pool is the trace entry's `pool_id` (torch 2.12+); without it, the pool of
//! the dump's segment at that address, else the default pool.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::lifetimes::DeviceReplay;
use crate::report::PoolReport;
use crate::snapshot::{Action, BlockState, Interner, Snapshot, StackId};

pub type PoolId = (i64, i64);
pub const DEFAULT_POOL: PoolId = (0, 0);

/// What a pool is, from its id and the frames of the code that allocated in it.
pub fn kind_of(pool: PoolId, frames_say: FrameHint) -> &'static str {
    match (pool, frames_say) {
        ((0, 0), _) => "default",
        (_, FrameHint::SymmetricMemory) => "symmetric_memory",
        (_, FrameHint::CudagraphTrees) => "cudagraph_trees",
        ((_, 0), _) => "cuda_graph",
        ((0, _), _) => "mempool",
        _ => "private",
    }
}

/// What the frames of a pool's allocations show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum FrameHint {
    #[default]
    Nothing,
    CudagraphTrees,
    SymmetricMemory,
}

fn frame_hint(interner: &Interner, stack: StackId) -> FrameHint {
    let mut hint = FrameHint::Nothing;
    for &f in interner.get_stack(stack) {
        let file = interner.get_text(interner.get_frame(f).filename);
        if file.contains("_symmetric_memory") || file.contains("symm_mem") {
            return FrameHint::SymmetricMemory;
        }
        if file.contains("cudagraph_trees") {
            hint = FrameHint::CudagraphTrees;
        }
    }
    hint
}

/// The name a pool's allocations give it: the `pool` or `name` key of a JSON object in their
/// `user_metadata` (torch 2.15 stores `_set_memory_metadata(dict)` as compact JSON).
pub fn name_from_metadata(text: &str) -> Option<String> {
    let t = text.trim_start();
    if !t.starts_with('{') || t.len() > 64 * 1024 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(t).ok()?;
    let o = v.as_object()?;
    ["pool", "name"]
        .iter()
        .find_map(|k| o.get(*k)?.as_str().map(str::to_owned))
}

#[derive(Default)]
struct Acc {
    reserved: u64,
    allocated: u64,
    free: u64,
    largest_free: u64,
    segments: u64,
    /// Net bytes the trace's segment events added (to undo from the dump) and the running peak
    /// over the window, relative to the window start.
    net: i128,
    running: i128,
    peak_rise: i128,
    hint: FrameHint,
    name: Option<String>,
}

/// What each pool of a device holds at the dump, and the pool of each segment: one pass
/// over the dump's blocks (millions in a big dump), made beside the replay.
#[derive(Default)]
pub struct AtDump {
    pools: BTreeMap<PoolId, Acc>,
    pool_by_segment: FxHashMap<u64, PoolId>,
}

pub fn at_dump(snapshot: &Snapshot, device: i64) -> AtDump {
    let mut out = AtDump::default();
    for s in snapshot.segments_of(device) {
        let id = s.pool_id.unwrap_or(DEFAULT_POOL);
        if id != DEFAULT_POOL {
            out.pool_by_segment.insert(s.address, id);
        }
        let acc = out.pools.entry(id).or_default();
        acc.reserved = acc.reserved.saturating_add(s.total_size);
        acc.allocated = acc.allocated.saturating_add(s.allocated_size);
        acc.segments += 1;
        for b in &s.blocks {
            if b.state == BlockState::Inactive {
                acc.free = acc.free.saturating_add(b.size);
                acc.largest_free = acc.largest_free.max(b.size);
            }
        }
        if id != DEFAULT_POOL && acc.hint == FrameHint::Nothing {
            acc.hint = frame_hint(&snapshot.interner, s.frames);
        }
    }
    out
}

/// Every pool of `device` with what it holds at the dump and its peak reserved bytes over the
/// window. Pools are few; without private pools the replay's reserved curve is the default
/// pool's, else one pass over the segment events.
pub fn pools_of(
    snapshot: &Snapshot,
    device: i64,
    replay: &DeviceReplay,
    at_dump: AtDump,
) -> Vec<PoolReport> {
    let segment_events = &replay.segment_events;
    let AtDump {
        mut pools,
        pool_by_segment,
    } = at_dump;
    let trace = snapshot.trace(device);
    let interner = &snapshot.interner;
    // Names: the metadata the pool's entries ran under (the trace's few combinations).
    let combinations = trace.distinct_combinations();
    let one_pool = pools.keys().all(|&id| id == DEFAULT_POOL)
        && combinations
            .iter()
            .all(|c| c.pool_id.is_none_or(|p| p == DEFAULT_POOL));
    if one_pool {
        // The default pool alone: its peak is the device's (the replay's reserved curve); a
        // pass over the segment events would only find it again.
        let acc = pools.entry(DEFAULT_POOL).or_default();
        return vec![PoolReport {
            pool_id: [0, 0],
            kind: "default".to_owned(),
            name: None,
            segments: acc.segments,
            reserved_bytes: acc.reserved,
            allocated_bytes: acc.allocated,
            free_bytes: acc.free,
            largest_free_block_bytes: acc.largest_free,
            peak_reserved_bytes: u64::try_from(replay.reserved.peak().0)
                .unwrap_or(0)
                .max(acc.reserved),
        }];
    }
    for c in combinations {
        let (Some(id), Some(m)) = (c.pool_id, c.user_metadata) else {
            continue;
        };
        if id == DEFAULT_POOL {
            continue;
        }
        let acc = pools.entry(id).or_default();
        if acc.name.is_none() {
            acc.name = name_from_metadata(interner.get_text(m));
        }
    }
    for &i in segment_events {
        let e = trace.at(i as usize);
        let delta: i128 = match e.action {
            Action::SegmentAlloc | Action::SegmentMap => i128::from(e.size),
            Action::SegmentFree | Action::SegmentUnmap => -i128::from(e.size),
            _ => continue,
        };
        let id = e
            .pool_id
            .or_else(|| pool_by_segment.get(&e.addr).copied())
            .unwrap_or(DEFAULT_POOL);
        let acc = pools.entry(id).or_default();
        if id != DEFAULT_POOL && acc.hint == FrameHint::Nothing {
            acc.hint = frame_hint(interner, e.frames);
        }
        acc.net += delta;
        acc.running += delta;
        acc.peak_rise = acc.peak_rise.max(acc.running);
    }
    pools
        .into_iter()
        .map(|(id, acc)| {
            // Reserved at the window start: the dump's with the trace undone (clamped: a cut
            // trace can free more than the dump shows).
            let start = (i128::from(acc.reserved) - acc.net).max(0);
            let peak = (start + acc.peak_rise).max(i128::from(acc.reserved));
            PoolReport {
                pool_id: [id.0, id.1],
                kind: kind_of(id, acc.hint).to_owned(),
                name: acc.name,
                segments: acc.segments,
                reserved_bytes: acc.reserved,
                allocated_bytes: acc.allocated,
                free_bytes: acc.free,
                largest_free_block_bytes: acc.largest_free,
                peak_reserved_bytes: u64::try_from(peak).unwrap_or(u64::MAX),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_names() {
        assert_eq!(kind_of((0, 0), FrameHint::Nothing), "default");
        assert_eq!(kind_of((3, 0), FrameHint::Nothing), "cuda_graph");
        assert_eq!(
            kind_of((3, 0), FrameHint::CudagraphTrees),
            "cudagraph_trees"
        );
        assert_eq!(kind_of((0, 2), FrameHint::Nothing), "mempool");
        assert_eq!(
            kind_of((0, 2), FrameHint::SymmetricMemory),
            "symmetric_memory"
        );
        assert_eq!(
            name_from_metadata(r#"{"pool":"comm","name":"nccl"}"#).as_deref(),
            Some("comm")
        );
        assert_eq!(
            name_from_metadata(r#"{"name":"kv"}"#).as_deref(),
            Some("kv")
        );
        assert_eq!(name_from_metadata("step 3"), None);
        assert_eq!(name_from_metadata(r#"{"pool":3}"#), None);
    }
}
