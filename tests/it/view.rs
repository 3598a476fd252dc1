//! `snapscan view` / `report --html`: one self-contained page whose embedded data decodes to the
//! analysis' figures (the browser side is tested in tests/browser).

use std::io::Read;

use serde_json::Value;

use crate::common::{self, fixture, snapscan};

fn view(args: &[&str]) -> String {
    let out = snapscan()
        .current_dir(common::root())
        .arg("view")
        .args(args)
        .args(["-o", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn report_json(path: &str) -> Value {
    let out = snapscan()
        .current_dir(common::root())
        .args(["report", "--format", "json", "--full", path])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).expect("json")
}

fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for c in bytes.chunks(4) {
        let v = c
            .iter()
            .enumerate()
            .fold(0u32, |v, (i, &b)| v | (u32::from(b) << (18 - 6 * i)));
        out.extend_from_slice(&v.to_be_bytes()[1..c.len()]);
    }
    out
}

/// The page's blob: header and column bytes.
struct Blob {
    header: Value,
    body: Vec<u8>,
}

impl Blob {
    fn of(page: &str) -> Blob {
        let tag = "<script type=\"application/x-snapscan-gzip-base64\" class=\"snapscan-data\">";
        let mut blob = Vec::new();
        for part in page.split(tag).skip(1) {
            let b64 = part.split("</script>").next().unwrap();
            let gz = unbase64(b64);
            let mut d = flate2::read::GzDecoder::new(&gz[..]);
            d.read_to_end(&mut blob).expect("gzip");
        }
        let n = u32::from_le_bytes(blob[..4].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&blob[4..4 + n]).expect("header");
        Blob {
            header,
            body: blob[4 + n..].to_vec(),
        }
    }

    fn device(&self, i: usize) -> &Value {
        &self.header["devices"][i]
    }

    /// A column of varints (`signed`: zigzag), as the page decodes it.
    fn column(&self, device: usize, name: &str, signed: bool) -> Vec<i128> {
        let c = &self.device(device)["columns"][name];
        let (off, len) = (
            c[0].as_u64().unwrap() as usize,
            c[1].as_u64().unwrap() as usize,
        );
        let bytes = &self.body[off..off + len];
        let mut out = Vec::new();
        let (mut v, mut shift) = (0u128, 0);
        for &b in bytes {
            v |= u128::from(b & 127) << shift;
            shift += 7;
            if b < 128 {
                let x = v as i128;
                out.push(if signed { (x >> 1) ^ -(x & 1) } else { x });
                v = 0;
                shift = 0;
            }
        }
        out
    }

    fn running(values: Vec<i128>) -> Vec<i128> {
        let mut acc = 0;
        values
            .into_iter()
            .map(|v| {
                acc += v;
                acc
            })
            .collect()
    }
}

#[test]
fn the_page_is_self_contained_and_holds_the_report() {
    let page = view(&["fixtures/synth/train-oom-forward.pickle"]);
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'"
    ));
    // No external resource: no src attribute, no link to a stylesheet, no URL but the docs'.
    assert!(!page.contains(" src="));
    assert!(!page.contains("<link"));
    assert!(!page.contains("@import"));
    assert!(!page.contains("url("));
    // The report, rendered (the same content as --format markdown).
    assert!(page.contains("<h2>snapscan report</h2>"));
    assert!(page.contains("OUT OF MEMORY in the forward pass"));
    assert!(page.contains("<table><thead><tr><th class=\"num\">bytes</th>"));
    // The script and style are the repository's files.
    assert!(page.contains("class Panel {"));
    assert!(page.contains(".details {"));
}

#[test]
fn the_embedded_data_gives_the_report_s_peak_oom_and_segments() {
    let path = "fixtures/synth/train-oom-forward.pickle";
    let blob = Blob::of(&view(&[path]));
    let report = report_json(path);
    let d = &report["files"][0]["devices"][0];
    let h = blob.device(0);
    assert_eq!(h["peak"]["bytes"], d["peak"]["requested_bytes"]);
    assert_eq!(h["peak"]["event"], d["peak"]["event_index"]);
    assert_eq!(h["ooms"][0]["event"], d["oom"][0]["event_index"]);
    assert_eq!(h["ooms"][0]["size"], d["oom"][0]["requested_bytes"]);
    let n = h["allocations"].as_u64().unwrap() as usize;
    // Requested bytes alive at the peak state, from the columns.
    let birth = Blob::running(blob.column(0, "birth", false));
    let life = blob.column(0, "life", false);
    let req = blob.column(0, "req", false);
    assert_eq!((birth.len(), life.len(), req.len()), (n, n, n));
    let peak_state = d["peak"]["event_index"].as_i64().unwrap() as i128 + 1;
    let alive: i128 = (0..n)
        .filter(|&i| birth[i] <= peak_state && peak_state < birth[i] + life[i])
        .map(|i| req[i])
        .sum();
    assert_eq!(
        alive,
        d["peak"]["requested_bytes"].as_i64().unwrap() as i128
    );
    // Reserved bytes at the OOM, from the segment lifetimes.
    let s = h["segments"].as_u64().unwrap() as usize;
    let first = blob.column(0, "seg_first", false);
    let span = blob.column(0, "seg_span", false);
    let size = blob.column(0, "seg_size", false);
    assert_eq!(first.len(), s);
    let oom_state = d["oom"][0]["event_index"].as_i64().unwrap() as i128 + 1;
    let reserved: i128 = (0..s)
        .filter(|&i| first[i] <= oom_state && oom_state <= first[i] + span[i])
        .map(|i| size[i])
        .sum();
    assert_eq!(
        reserved,
        d["oom"][0]["reserved_bytes"].as_i64().unwrap() as i128
    );
    // The report's largest allocation at the peak is there, with its call site.
    let largest = &d["live_at_peak"][0];
    let stacks = blob.column(0, "stack", false);
    let found = (0..n).any(|i| {
        req[i] == largest["requested_bytes"].as_i64().unwrap() as i128
            && birth[i] <= peak_state
            && peak_state < birth[i] + life[i]
            && h["sites"][h["stack_site"][stacks[i] as usize].as_i64().unwrap() as usize]
                == largest["call_site"]
    });
    assert!(found, "{largest}");
}

#[test]
fn report_html_is_the_view_page() {
    let path = "fixtures/synth/fragmented.pickle";
    let out = snapscan()
        .current_dir(common::root())
        .args(["report", "--html", path])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), view(&[path]));
}

#[test]
fn the_oom_device_and_file_come_first() {
    let blob = Blob::of(&view(&[
        "fixtures/synth/train.pickle",
        "fixtures/synth/train-oom-forward.pickle",
    ]));
    let files: Vec<&str> = blob.header["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            "fixtures/synth/train-oom-forward.pickle",
            "fixtures/synth/train.pickle"
        ]
    );
    let two = Blob::of(&view(&["fixtures/synth/load-oom-2dev.pickle"]));
    assert_eq!(two.header["devices"].as_array().unwrap().len(), 2);
    let one = Blob::of(&view(&[
        "--device",
        "1",
        "fixtures/synth/load-oom-2dev.pickle",
    ]));
    assert_eq!(one.header["devices"].as_array().unwrap().len(), 1);
    assert_eq!(one.device(0)["device"], 1);
}

#[test]
fn writes_view_html_by_default() {
    let dir = std::env::temp_dir().join(format!("snapscan-view-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    snapscan()
        .current_dir(&dir)
        .args(["view", fixture("synth/tiny.pickle").to_str().unwrap()])
        .assert()
        .success();
    let page = std::fs::read_to_string(dir.join("view.html")).unwrap();
    assert!(page.contains("snapscan view: "));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every fixture gives a page whose columns hold as many values as the header says.
#[test]
fn every_fixture_gives_a_decodable_page() {
    for path in common::snapshot_fixtures() {
        let rel = common::rel(&path);
        let blob = Blob::of(&view(&[&rel]));
        for (i, h) in blob.header["devices"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let n = h["allocations"].as_u64().unwrap() as usize;
            let s = h["segments"].as_u64().unwrap() as usize;
            let e = h["events"].as_u64().unwrap() as usize;
            for name in [
                "birth", "life", "req", "blk", "addr", "stack", "stream", "pend",
            ] {
                assert_eq!(blob.column(i, name, false).len(), n, "{rel} {name}");
            }
            assert_eq!(blob.column(i, "time", true).len(), e, "{rel} time");
            for name in ["seg_addr", "seg_size", "seg_first", "seg_span"] {
                assert_eq!(blob.column(i, name, false).len(), s, "{rel} {name}");
            }
            let stacks = h["stacks"].as_array().unwrap().len() as i128;
            assert!(blob.column(i, "stack", false).iter().all(|&k| k < stacks));
        }
    }
}

#[test]
fn the_page_carries_the_user_s_annotation_on_its_allocation() {
    let path = "fixtures/torch215/training-2026.pickle";
    let blob = Blob::of(&view(&[path]));
    let h = blob.device(0);
    let notes = h["annotations"].as_array().unwrap();
    assert_eq!(notes.len(), 1);
    assert_eq!(notes[0][1], "kv cache");
    // The row is the annotated allocation: 32 MiB requested.
    let row = notes[0][0].as_u64().unwrap() as usize;
    let req = blob.column(0, "req", false);
    assert_eq!(req[row], 32 << 20);
}

/// A job of `ranks` rank files: copies of the real snapshot `normal`, rank `big` a copy of
/// `other` (a run of the same course assignment with a larger model and optimizer).
fn job_from(normal: &str, other: &str, ranks: usize, big: usize, tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-job-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for r in 0..ranks {
        let src = if r == big { other } else { normal };
        std::fs::copy(fixture(src), dir.join(format!("rank{r}.pickle"))).unwrap();
    }
    dir
}

#[test]
fn a_job_page_opens_on_an_overview_that_names_the_outlier_and_why() {
    let dir = job_from(
        "real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle",
        "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
        6,
        3,
        "overview",
    );
    let d = dir.to_str().unwrap();
    // The report names rank 3 as the outlier, and why: the category that grew most against
    // the median rank, and the call site that holds most of it.
    let out = snapscan()
        .args(["report", "--format", "json", d])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["ranks"]["rows"].as_array().unwrap();
    let outliers: Vec<&Value> = rows.iter().filter(|r| r["outlier"] == true).collect();
    assert_eq!(outliers.len(), 1, "{rows:?}");
    assert_eq!(outliers[0]["rank"], 3);
    let files = v["files"].as_array().unwrap();
    let of = |rank: &str| {
        let f = files
            .iter()
            .find(|f| f["path"].as_str().unwrap().ends_with(rank))
            .unwrap();
        f["devices"][0].clone()
    };
    let (normal, big) = (of("rank0.pickle"), of("rank3.pickle"));
    // The median rank is one of the five copies: the category furthest above it is the one
    // where the two runs differ most.
    let bytes = |d: &Value, c: &str| d["categories_at_peak"][c].as_u64().unwrap_or(0) as i64;
    let largest = big["categories_at_peak"]
        .as_object()
        .unwrap()
        .keys()
        .max_by_key(|c| bytes(&big, c) - bytes(&normal, c))
        .cloned()
        .unwrap();
    let why = &outliers[0]["outlier_reason"];
    assert_eq!(why["category"], largest.as_str());
    assert_eq!(why["bytes"], big["categories_at_peak"][&largest]);
    assert_eq!(why["median_bytes"], normal["categories_at_peak"][&largest]);
    let top = &big["top_call_site_by_category_at_peak"][&largest];
    assert_eq!(why["call_site"], top["call_site"]);
    assert_eq!(why["call_site_bytes"], top["bytes"]);
    assert!(why["call_site_bytes"].as_u64().unwrap() > 0);
    let text = String::from_utf8(snapscan().args(["report", d]).output().unwrap().stdout).unwrap();
    let line = format!("more {largest} than the median");
    assert!(text.contains("Rank 3 (") && text.contains(&line), "{text}");

    // The page carries the same overview: a row per rank, the outlier with its reason, and
    // the panel that each row opens.
    let page = view(&[d]);
    let blob = Blob::of(&page);
    let o = &blob.header["overview"];
    assert_eq!(o["kind"], "ranks");
    let rows = o["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    let flagged: Vec<&Value> = rows.iter().filter(|r| r["outlier"] == true).collect();
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0]["label"], "rank 3");
    let reason = flagged[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("rank 3: ") && reason.contains(&line),
        "{reason}"
    );
    for r in rows {
        let p = r["panel"].as_i64().unwrap() as usize;
        let panel = blob.device(p);
        assert!(r["path"]
            .as_str()
            .unwrap()
            .ends_with(panel["file"].as_str().unwrap()));
        assert_eq!(panel["peak"]["bytes"], r["peak"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_many_device_snapshot_gets_an_overview_by_device() {
    let page = view(&["fixtures/synth/three-devices.pickle"]);
    let blob = Blob::of(&page);
    let o = &blob.header["overview"];
    assert_eq!(o["kind"], "devices");
    let rows = o["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let report = report_json("fixtures/synth/three-devices.pickle");
    for d in report["files"][0]["devices"].as_array().unwrap() {
        let row = rows
            .iter()
            .find(|r| r["label"] == format!("device {}", d["device"]).as_str())
            .unwrap();
        assert_eq!(row["peak"], d["peak"]["requested_bytes"]);
        let panel = blob.device(row["panel"].as_u64().unwrap() as usize);
        assert_eq!(panel["device"], d["device"]);
    }
    // One device, one file: no overview.
    let one = Blob::of(&view(&[
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ]));
    assert!(one.header["overview"].is_null());
}

#[test]
fn the_compare_page_carries_both_curves_and_the_diff_s_call_sites() {
    let base =
        "fixtures/real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle";
    let new = "fixtures/real/notHanmin__assignment2-systems__memory_snapshot.pickle";
    let blob = Blob::of(&view(&["--compare", base, new]));
    let c = &blob.header["compare"];
    let diff: Value = serde_json::from_slice(
        &snapscan()
            .current_dir(common::root())
            .args(["diff", "--format", "json", base, new])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let d = &diff["devices"][0];
    assert_eq!(c["peak_delta"], d["peak"]["delta"]);
    for (i, path) in [base, new].into_iter().enumerate() {
        let run = &c["runs"][i];
        let report = report_json(path);
        let peak = &report["files"][0]["devices"][0]["peak"];
        assert_eq!(run["peak"], peak["requested_bytes"]);
        assert_eq!(run["peak_event"], peak["event_index"]);
        // The curve's points keep the exact peak: the highest point is it.
        let top = run["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_i64().unwrap())
            .max()
            .unwrap();
        assert_eq!(Value::from(top), peak["requested_bytes"]);
        // Each run's panel is its own file, base first.
        assert_eq!(blob.device(i)["file"].as_str().unwrap(), path);
    }
    // The call sites that changed most, as the diff gives them.
    let mut changed: Vec<&Value> = d["call_sites_at_peak"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["change"] != "same")
        .collect();
    changed.sort_by_key(|k| std::cmp::Reverse(k["delta_bytes"].as_i64().unwrap().abs()));
    let sites = c["sites"].as_array().unwrap();
    assert!(!sites.is_empty());
    for (row, want) in sites.iter().zip(changed) {
        assert_eq!(row["delta"], want["delta_bytes"]);
        assert_eq!(row["key"], want["key"]);
    }
    // Two snapshots exactly.
    let out = snapscan()
        .current_dir(common::root())
        .args(["view", "--compare", base, "-o", "-"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("takes two snapshots"));
}

/// Pinned host memory gets its own lane on the device's events (the report's peaks), and every
/// stack says whose code it is as the report's call sites do (your code, packages, runtime).
#[test]
fn the_page_carries_pinned_host_memory_and_whose_code_each_stack_is() {
    let path = "fixtures/torch215/training-2026.pickle";
    let blob = Blob::of(&view(&[path]));
    let report = report_json(path);
    let h = blob.device(0);
    let host = &h["host"];
    let real = &report["files"][0]["host_memory"];
    assert_eq!(host["peak_allocated"], real["peak_allocated_bytes"]);
    assert_eq!(host["peak_reserved"], real["peak_reserved_bytes"]);
    assert_eq!(host["by_time"], true);
    // The lane ends at the dump's level, and its states are on the device's axis.
    let last = host["allocated"].as_array().unwrap().last().unwrap();
    assert_eq!(last, &real["allocated_bytes_at_dump"]);
    let events = h["events"].as_u64().unwrap();
    let states = host["state"].as_array().unwrap();
    assert!(states.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()));
    assert!(states.iter().all(|s| s.as_u64().unwrap() <= events + 1));

    // The annotated KV cache's stack: the user's model.py:50, via torch's linear, as the
    // report's call site says.
    let notes = h["annotations"].as_array().unwrap();
    let row = notes[0][0].as_u64().unwrap() as usize;
    let stack = blob.column(0, "stack", false)[row] as usize;
    let code = &h["code_paths"][h["stack_code"][stack].as_u64().unwrap() as usize];
    let sites = report["files"][0]["devices"][0]["live_at_peak_by_call_site"]
        .as_array()
        .unwrap();
    let site = sites
        .iter()
        .find(|s| {
            s["call_site"]
                .as_str()
                .unwrap()
                .ends_with("model.py:50:forward")
        })
        .unwrap();
    assert_eq!(code[0], site["code"]);
    assert_eq!(code[1], site["your_code"]);
    assert_eq!(code[2], site["via"]);
    assert_eq!(code[0], "user");
    // Each frame is classed: the user's model.py, torch's runtime.
    let frames = h["frames"].as_array().unwrap();
    let class_of = |needle: &str| {
        frames
            .iter()
            .find(|f| f[0].as_str().unwrap().contains(needle))
            .map(|f| f[2].as_u64().unwrap())
    };
    assert_eq!(class_of("model.py:50"), Some(0));
    assert_eq!(class_of("torch/nn/modules/linear.py"), Some(2));
}
