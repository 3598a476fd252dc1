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

#[test]
fn the_default_json_report_of_every_fixture_is_under_a_megabyte() {
    for path in common::snapshot_fixtures() {
        let out = common::snapscan()
            .args(["report", "--format", "json", path.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.stdout.len() <= 1 << 20,
            "{}: {} bytes",
            path.display(),
            out.stdout.len()
        );
    }
}

#[test]
fn many_call_sites_with_long_stacks_are_capped_and_each_stack_kept_once() {
    // 700 call sites alive at the peak, each with a 30-frame C++ stack of long names (a
    // forward-only dump of this shape gave a 2.4 MB report).
    use crate::synthetic;
    let long = "at::native::(anonymous namespace)::structured_addmm_out_cuda_functional::impl(at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&, at::Tensor const&)";
    let mut s = synthetic::Snapshot::default();
    let names: Vec<String> = (0..700).map(|i| format!("layer_{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let mut frames: Vec<(&str, &str)> = vec![("/home/me/model.py", name.as_str())];
        for _ in 0..29 {
            frames.push(("??", long));
        }
        let stack: synthetic::Stack = Box::leak(frames.into_boxed_slice());
        s.alloc(1 << 20 | (i as u64) << 9, stack);
    }
    let doc = s.json();
    let path = synthetic::write_json("many-sites.json", &doc);
    let out = common::snapscan()
        .args(["report", "--format", "json", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.stdout.len() <= 1 << 20, "{} bytes", out.stdout.len());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dev = &v["files"][0]["devices"][0];
    let sites = dev["live_at_peak_by_call_site"].as_array().unwrap();
    assert_eq!(sites.len(), 50);
    assert_eq!(dev["live_at_peak_by_call_site_omitted"]["count"], 650);
    // Every listed site names its stack in the table.
    let stacks = dev["stacks"].as_array().unwrap();
    for site in sites {
        let id = site["stack_id"].as_u64().unwrap() as usize;
        assert!(
            stacks[id][0].as_str().unwrap().contains("model.py"),
            "{}",
            stacks[id][0]
        );
    }
    // --full lists them all.
    let full = common::snapscan_json(&[
        "report",
        "--format",
        "json",
        "--full",
        path.to_str().unwrap(),
    ]);
    let all = full["files"][0]["devices"][0]["live_at_peak_by_call_site"]
        .as_array()
        .unwrap();
    assert_eq!(all.len(), 700);
}

/// The recording gaps of device 0 of a fixture: (kind, fix).
fn gaps(rel: &str) -> Vec<(String, String, Option<u64>)> {
    let r = report(rel);
    r["files"][0]["devices"][0]["recording"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|g| {
                    (
                        g["kind"].as_str().unwrap().to_owned(),
                        g["fix"].as_str().unwrap().to_owned(),
                        g["max_entries"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn why_a_snapshot_says_little_with_the_call_that_records_it() {
    // Captured with max_entries=2000: the ring buffer wrapped; a larger value is named.
    let g = gaps("captured/multistream_truncated.pickle");
    assert_eq!(g[0].0, "ring_buffer_wrapped");
    assert!(g[0].2.unwrap() > 2000);
    assert!(
        g[0].1.contains("_record_memory_history(max_entries="),
        "{}",
        g[0].1
    );
    // The simulator's ring buffer of 1,500 entries.
    assert_eq!(gaps("synth/truncated.pickle")[0].0, "ring_buffer_wrapped");
    // A state-only recording (one entry).
    let g = gaps("real/Yiyi-philosophy__LLM-inference__1.3b_snapshot.pickle");
    assert_eq!(g[0].0, "state_only");
    assert!(g[0].1.contains("enabled=\"all\""));
    // context=None.
    let g = gaps("diagnosis/train-oom-stacks-none.pickle");
    assert!(
        g.iter()
            .any(|(k, f, _)| k == "no_stacks" && f.contains("context=\"all\"")),
        "{g:?}"
    );
    // Recording started after the model was loaded (227 weights have no event at all).
    assert_eq!(
        gaps("real/MAGMA27__assignment2-systems__memory_snapshot.pickle")[0].0,
        "late_start"
    );
    // A whole recording says nothing of the kind.
    assert!(gaps("torch215/training-2026.pickle").is_empty());
    // Segments but no trace: history was never recorded.
    let doc = serde_json::json!({
        "segments": [{"device": 0, "address": 1u64 << 40, "total_size": 2097152,
                      "allocated_size": 512, "active_size": 512, "requested_size": 500,
                      "stream": 0, "segment_type": "small", "segment_pool_id": [0, 0],
                      "is_expandable": false, "frames": [],
                      "blocks": [{"address": 1u64 << 40, "size": 512, "requested_size": 500,
                                  "state": "active_allocated", "frames": []},
                                 {"address": (1u64 << 40) + 512, "size": 2097152 - 512,
                                  "requested_size": 0, "state": "inactive", "frames": []}]}],
        "device_traces": [[]],
    });
    let r = crate::synthetic::report_of_json("no-trace.json", &doc);
    let g = &r.devices[0].recording;
    assert_eq!(g[0].kind, "no_trace");
    assert!(g[0].fix.contains("_record_memory_history("));
}

#[test]
fn call_sites_say_whose_code_they_are_and_what_they_went_through() {
    let r = report("real/MAGMA27__assignment2-systems__memory_snapshot.pickle");
    let sites = r["files"][0]["devices"][0]["live_at_peak_by_call_site"]
        .as_array()
        .unwrap();
    // einops (a package) called from the user's model: the package path and the user's frame.
    let einsum = sites
        .iter()
        .find(|s| {
            s["call_site"]
                .as_str()
                .unwrap()
                .contains("einops/_backends.py")
        })
        .unwrap();
    assert_eq!(einsum["code"], "package");
    assert!(einsum["your_code"]
        .as_str()
        .unwrap()
        .contains("cs336_basics/model.py:39:forward"));
    assert_eq!(einsum["via"], "einops → torch.functional.einsum");
    // The user's own code.
    let silu = sites
        .iter()
        .find(|s| {
            s["call_site"]
                .as_str()
                .unwrap()
                .contains("model.py:532:silu")
        })
        .unwrap();
    assert_eq!(silu["code"], "user");
    let t = text("real/MAGMA27__assignment2-systems__memory_snapshot.pickle");
    assert!(
        t.contains("einops/_backends.py:291:einsum via einops → torch.functional.einsum (package code, from your"),
        "{t}"
    );
}

/// The settings and the pinned host allocator's knobs (2.13+) are shown, the defaults counted.
#[test]
fn allocator_settings_are_shown_with_the_pinned_host_knobs() {
    let t = text("torch215/training-2026.pickle");
    assert!(
        t.contains(
            "Allocator settings: PYTORCH_CUDA_ALLOC_CONF not set, expandable_segments off, \
             max_split_size unlimited; pinned host allocator: max_cached_size unlimited, \
             max_round_threshold unlimited; 6 others at their defaults."
        ),
        "{t}"
    );
    let t = text("captured/expandable.pickle");
    assert!(
        t.contains("PYTORCH_CUDA_ALLOC_CONF \"expandable_segments:True\", expandable_segments on"),
        "{t}"
    );
}

/// An XPU dump (the same schema, `PYTORCH_ALLOC_CONF` and `expandable_segments` as its only
/// settings) is told the XPU API, and no "CUDA" where it was not CUDA: a small dump whose trace
/// starts mid-run and has no stacks, with most of its reserved memory cached, so that the report
/// advises recording and remarks on the cache.
#[test]
fn an_xpu_dump_is_not_told_to_call_cuda() {
    use serde_pickle::{HashableValue as K, Value as V};
    let dict = |kv: Vec<(&str, V)>| {
        V::Dict(
            kv.into_iter()
                .map(|(k, v)| (K::String(k.to_owned()), v))
                .collect(),
        )
    };
    let (mib, base) = (1i64 << 20, 0x7f00_0000_0000i64);
    let block = |addr: i64, size: i64, req: i64, state: &str| {
        dict(vec![
            ("address", V::I64(addr)),
            ("size", V::I64(size)),
            ("requested_size", V::I64(req)),
            ("state", V::String(state.to_owned())),
            ("frames", V::List(vec![])),
        ])
    };
    let segment = dict(vec![
        ("device", V::I64(0)),
        ("address", V::I64(base)),
        ("total_size", V::I64(512 * mib)),
        ("allocated_size", V::I64(2 * mib)),
        ("active_size", V::I64(2 * mib)),
        ("requested_size", V::I64(2 * mib)),
        ("stream", V::I64(0)),
        ("segment_type", V::String("large".into())),
        ("segment_pool_id", V::Tuple(vec![V::I64(0), V::I64(0)])),
        ("is_expandable", V::Bool(false)),
        ("frames", V::List(vec![])),
        (
            "blocks",
            V::List(vec![
                block(base, 2 * mib, 2 * mib, "active_allocated"),
                block(base + 2 * mib, 510 * mib, 0, "inactive"),
            ]),
        ),
    ]);
    let entry = |action: &str, addr: i64, size: i64, t: i64| {
        dict(vec![
            ("action", V::String(action.to_owned())),
            ("addr", V::I64(addr)),
            ("size", V::I64(size)),
            ("stream", V::I64(0)),
            ("time_us", V::I64(t)),
            ("frames", V::List(vec![])),
        ])
    };
    let trace = V::List(vec![
        // A free of what was allocated before the window: the ring buffer wrapped.
        entry("free_requested", base + 300 * mib, 64 * mib, 1),
        entry("free_completed", base + 300 * mib, 64 * mib, 2),
        entry("alloc", base, 2 * mib, 3),
    ]);
    let root = dict(vec![
        ("segments", V::List(vec![segment])),
        ("device_traces", V::List(vec![trace])),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_ALLOC_CONF", V::String(String::new())),
                ("expandable_segments", V::Bool(false)),
            ]),
        ),
    ]);
    let dir = std::env::temp_dir().join(format!("snapscan-xpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("xpu.pickle");
    std::fs::write(
        &path,
        serde_pickle::value_to_vec(&root, serde_pickle::SerOptions::new()).unwrap(),
    )
    .unwrap();
    let out = common::snapscan()
        .args(["report", path.to_str().unwrap()])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(t.contains("written by the XPU allocator"), "{t}");
    assert!(t.contains("torch.xpu.memory._record_memory_history"), "{t}");
    assert!(t.contains("torch.xpu.empty_cache()"), "{t}");
    assert!(
        t.contains("Allocator settings: PYTORCH_ALLOC_CONF not set, expandable_segments off."),
        "{t}"
    );
    for cuda in ["cuda", "CUDA", "nvidia-smi"] {
        assert!(!t.contains(cuda), "{cuda} in an XPU report: {t}");
    }
}
