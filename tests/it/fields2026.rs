//! The 2026 snapshot fields (torch 2.12-2.15): each read, used, and shown in text and JSON; what
//! this version does not read named and counted.

use crate::common;

fn report(rel: &str) -> serde_json::Value {
    let path = common::fixture(rel);
    common::snapscan_json(&["report", "--format", "json", path.to_str().unwrap()])
}

fn text(rel: &str) -> String {
    let path = common::fixture(rel);
    let out = common::snapscan()
        .args(["report", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    // Words only: the text wraps its paragraphs.
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn pools_are_named_by_kind_and_by_the_metadata_they_ran_under() {
    let r = report("torch215/training-2026.pickle");
    let pools = r["files"][0]["devices"][0]["pools"].as_array().unwrap();
    let kinds: Vec<(&str, Option<&str>)> = pools
        .iter()
        .map(|p| (p["kind"].as_str().unwrap(), p["name"].as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("default", None),
            ("mempool", Some("comm")),
            ("cuda_graph", None)
        ]
    );
    let mib = |p: &serde_json::Value, k: &str| (p[k].as_u64().unwrap() + (1 << 19)) >> 20;
    // The MemPool: two 16 MiB communication buffers, both alive.
    assert_eq!(
        (
            mib(&pools[1], "reserved_bytes"),
            mib(&pools[1], "allocated_bytes")
        ),
        (32, 32)
    );
    // The default pool keeps the freed activations' segments: 116 MiB free, 26 MiB the largest.
    assert_eq!(
        (
            mib(&pools[0], "free_bytes"),
            mib(&pools[0], "largest_free_block_bytes")
        ),
        (116, 26)
    );
    let t = text("torch215/training-2026.pickle");
    assert!(t.contains("MemPool (0, 1) comm"), "{t}");
    assert!(t.contains("CUDA graph pool (1, 0)"), "{t}");
}

#[test]
fn an_annotation_is_attached_to_its_allocation_and_names_its_category() {
    let r = report("torch215/training-2026.pickle");
    let live = r["files"][0]["devices"][0]["live_at_peak"]
        .as_array()
        .unwrap();
    let annotated: Vec<&serde_json::Value> = live
        .iter()
        .filter(|a| a.get("annotations").is_some())
        .collect();
    assert_eq!(annotated.len(), 1);
    assert_eq!(annotated[0]["annotations"][0], "kv cache");
    assert_eq!(annotated[0]["category"], "kv_cache");
    assert_eq!(annotated[0]["confidence"], "high");
    assert_eq!(annotated[0]["requested_bytes"], 32 << 20);
    assert_eq!(r["files"][0]["snapshot_fields"]["annotations"], 1);
    assert!(text("torch215/training-2026.pickle").contains("annotated by you"));
}

#[test]
fn pinned_host_memory_has_its_peak_and_what_was_still_held() {
    let r = report("torch215/training-2026.pickle");
    let h = &r["files"][0]["host_memory"];
    assert_eq!(h["peak_allocated_bytes"], 96 << 20);
    assert_eq!(h["allocated_bytes_at_dump"], 64 << 20);
    assert_eq!(h["reserved_bytes_at_dump"], 96 << 20);
    assert_eq!(h["segments"], 2);
    let held = &h["held_at_dump_by_call_site"][0];
    assert!(
        held["call_site"].as_str().unwrap().contains("train.py:66"),
        "{held}"
    );
    let t = text("torch215/training-2026.pickle");
    assert!(t.contains("Pinned host memory"), "{t}");
    assert!(t.contains("Peak 96.0MiB pinned"), "{t}");
    // A snapshot without host memory has no such section.
    let old = report("real/MAGMA27__assignment2-systems__memory_snapshot.pickle");
    assert!(old["files"][0].get("host_memory").is_none());
}

#[test]
fn metadata_pool_ids_and_allocator_tags_are_read_and_kept_apart() {
    let r = report("torch215/training-2026.pickle");
    let f = &r["files"][0]["snapshot_fields"];
    assert_eq!(f["accelerator"], "cuda");
    assert_eq!(f["pool_ids"], true);
    assert_eq!(
        f["user_metadata"][0]["name"],
        r#"{"pool":"comm","name":"nccl buffers"}"#
    );
    assert_eq!(f["user_metadata"][0]["entries"], 4);
    // The annotation's text is its own, not a metadata context.
    assert_eq!(f["user_metadata"].as_array().unwrap().len(), 1);
    assert_eq!(f["internal_metadata"][0]["name"], "mallocWithAddress");
    assert_eq!(f["internal_metadata"][0]["entries"], 5);
    assert_eq!(f["unknown_entry_keys"].as_array().unwrap().len(), 0);
    // The allocator model uses each entry's pool: every allocation placed.
    let path = common::fixture("torch215/training-2026.pickle");
    let replay = common::snapscan_json(&["replay", "--format", "json", path.to_str().unwrap()]);
    let d = &replay["files"][0]["devices"][0];
    assert_eq!(d["placed"], d["allocs"], "{d}");
    assert_eq!(d["allocs"], 18);
}

#[test]
fn keys_and_actions_this_version_does_not_read_are_counted_and_named() {
    let r = report("torch215/unknown-fields.pickle");
    let f = &r["files"][0]["snapshot_fields"];
    assert_eq!(f["unknown_entry_keys"][0]["name"], "stream_priority");
    assert_eq!(f["unknown_entry_keys"][0]["entries"], 18);
    assert_eq!(f["unknown_actions"][0]["name"], "defragment");
    assert_eq!(f["unknown_actions"][0]["entries"], 1);
    assert_eq!(f["other_top_level_keys"][0], "process_info");
    let t = text("torch215/unknown-fields.pickle");
    assert!(
        t.contains("18 entries with key stream_priority; 1 entry with action defragment; top-level key process_info"),
        "{t}"
    );
}
