//! The final state of the allocator as the dump shows it: the figures of
//! `python -m torch.cuda._memory_viz stats`, per device and in total, plus counts.

use std::collections::BTreeMap;

use crate::report::{DeviceStats, FileStats, FinalState, PoolStats, StreamStats};
use crate::snapshot::{BlockState, LoadedSnapshot, Segment, Snapshot};

/// Final-state figures over a set of segments, defined as `_memory_viz.py stats` defines them:
/// requested bytes of `active_allocated` blocks are "allocated"; internal free is their
/// rounding (size − requested); everything not `active_allocated` is external free.
pub fn final_state<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> FinalState {
    // Saturating: a corrupt file can hold sizes near 2^64 (flagged by `analysis::quality`).
    fn add(sum: &mut u64, v: u64) {
        *sum = sum.saturating_add(v);
    }
    let mut f = FinalState::default();
    for seg in segments {
        f.segments += 1;
        add(&mut f.reserved_bytes, seg.total_size);
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                add(&mut f.allocated_bytes, b.size);
                add(&mut f.requested_bytes, b.requested_size);
                // Legacy files can hold requested > size; PyTorch's tool would count a negative
                // internal waste there, we clamp it (and the totals stay consistent below).
                add(
                    &mut f.free_internal_bytes,
                    b.size.saturating_sub(b.requested_size),
                );
            } else {
                add(&mut f.free_external_bytes, b.size);
            }
            if b.state.is_active() {
                add(&mut f.active_bytes, b.size);
            }
        }
    }
    f
}

fn device_stats(snapshot: &Snapshot, device: i64) -> DeviceStats {
    let segments: Vec<&Segment> = snapshot.segments_of(device).collect();
    let mut blocks_by_state: BTreeMap<String, u64> = BTreeMap::new();
    // Keyed by (pool id, small/large) so the output order is stable.
    type PoolKey = (Option<(i64, i64)>, &'static str);
    let mut pools: BTreeMap<PoolKey, PoolStats> = BTreeMap::new();
    let mut streams: BTreeMap<u64, StreamStats> = BTreeMap::new();
    for seg in &segments {
        for b in &seg.blocks {
            *blocks_by_state
                .entry(b.state.name().to_owned())
                .or_default() += 1;
        }
        let kind = match seg.pool_kind {
            crate::snapshot::PoolKind::Small => "small",
            crate::snapshot::PoolKind::Large => "large",
            crate::snapshot::PoolKind::Unknown => "unknown",
        };
        let pool = pools
            .entry((seg.pool_id, kind))
            .or_insert_with(|| PoolStats {
                pool_id: seg.pool_id.map(|(a, b)| [a, b]),
                segment_type: kind.to_owned(),
                segments: 0,
                reserved_bytes: 0,
                allocated_bytes: 0,
            });
        pool.segments += 1;
        pool.reserved_bytes = pool.reserved_bytes.saturating_add(seg.total_size);
        pool.allocated_bytes = pool.allocated_bytes.saturating_add(seg.allocated_size);
        let stream = streams.entry(seg.stream).or_insert_with(|| StreamStats {
            stream: seg.stream,
            segments: 0,
            reserved_bytes: 0,
        });
        stream.segments += 1;
        stream.reserved_bytes = stream.reserved_bytes.saturating_add(seg.total_size);
    }
    let trace = snapshot.trace(device);
    let mut by_action: BTreeMap<String, u64> = BTreeMap::new();
    for e in trace {
        let name = match e.action_text {
            Some(t) => snapshot.interner.get_text(t).to_owned(),
            None => e.action.name().to_owned(),
        };
        *by_action.entry(name).or_default() += 1;
    }
    DeviceStats {
        device,
        final_state: final_state(segments.iter().copied()),
        blocks_by_state,
        pools: pools.into_values().collect(),
        streams: streams.into_values().collect(),
        expandable_segments: segments.iter().filter(|s| s.is_expandable).count() as u64,
        trace_entries: trace.len() as u64,
        trace_entries_by_action: by_action,
    }
}

/// Stats of one file; `device` restricts the output to one device.
pub fn file_stats(loaded: &LoadedSnapshot, device: Option<i64>) -> FileStats {
    let snapshot = &loaded.snapshot;
    let devices: Vec<i64> = snapshot
        .devices()
        .into_iter()
        .filter(|d| device.is_none_or(|want| want == *d))
        .collect();
    let total = final_state(
        snapshot
            .segments
            .iter()
            .filter(|s| device.is_none_or(|want| want == s.device)),
    );
    FileStats {
        path: loaded.name.clone(),
        compression: loaded.compression,
        layout: snapshot.layout,
        decoded_bytes: loaded.decoded_bytes,
        stacks_recorded: snapshot.has_stacks(),
        allocator_settings: snapshot.allocator_settings.as_ref().map(|s| s.raw.clone()),
        devices: devices.iter().map(|&d| device_stats(snapshot, d)).collect(),
        total,
    }
}
