//! What the first lines say: the file-level headline of a multi-device snapshot (which device
//! ran out of memory, where, how much must go; peaks out of balance), `report --brief`, and the
//! cross-file table (peak and reserved of the same device at the same moment; outliers only
//! among the ranks of one job).

use crate::common::{self, snapscan};

/// Three devices: 0 = LfieLike (real, no trace, 15.3 GiB), 1 = train-oom-forward (OOM in the
/// forward pass), 2 = MAGMA27 (real, 13.0 GiB peak). See fixtures/README.md.
const THREE: &str = "fixtures/synth/three-devices.pickle";

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = snapscan()
        .current_dir(common::root())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn an_oom_on_a_later_device_is_the_first_line_of_the_file() {
    let (code, text, _) = run(&["report", THREE]);
    assert_eq!(code, Some(0));
    let head: Vec<&str> = text.lines().take(7).collect();
    let head = head.join("\n");
    assert!(
        head.starts_with(&format!("== {THREE} — 3 devices\n")),
        "{head}"
    );
    let first = head.lines().nth(1).unwrap();
    assert!(
        first.starts_with("OOM on device 1 of 3: 750.0MiB request in the forward pass at"),
        "{head}"
    );
    let flat = head.replace('\n', " ");
    assert!(
        flat.contains("modeling_llama.py:434:forward, FULL; about 274.0MiB must be freed"),
        "{flat}"
    );
    assert!(
        flat.contains("No OOM on: device 0 peak 15.3GiB, device 2 peak 13.0GiB."),
        "{flat}"
    );
    assert!(
        flat.contains("Imbalance: device 0 peaks at 15.3GiB, 2.7× device 1's 5.7GiB")
            && flat.contains("highest device peak ≥ 1.5× the lowest and at least 256.0MiB more"),
        "{flat}"
    );
    // The per-device sections follow, device 0 first.
    assert!(text.find("— device 0").unwrap() > text.find("OOM on device 1").unwrap());

    let (_, md, _) = run(&["report", "--format", "markdown", THREE]);
    let top = &md[..md.find("— device 0").unwrap()];
    assert!(
        top.contains("OOM on device 1 of 3: 750.0MiB request"),
        "{top}"
    );
    assert!(
        top.contains("Imbalance: device 0 peaks at 15.3GiB"),
        "{top}"
    );

    let (_, json, _) = run(&["report", "--format", "json", THREE]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let s = &v["files"][0]["summary"];
    assert_eq!(s["devices"], 3);
    assert_eq!(s["oom"].as_array().unwrap().len(), 1);
    let o = &s["oom"][0];
    let dev1 = &v["files"][0]["devices"][1]["oom"][0];
    assert_eq!(o["device"], 1);
    assert_eq!(o["verdict"], "full");
    assert_eq!(o["phase"], "forward");
    assert_eq!(o["requested_bytes"], dev1["requested_bytes"]);
    assert_eq!(
        o["shortfall_bytes"].as_u64().unwrap(),
        dev1["requested_bytes"].as_u64().unwrap() - dev1["device_free_bytes"].as_u64().unwrap()
    );
    assert_eq!(s["peak_device"], 0);
    assert_eq!(s["imbalance"]["highest_device"], 0);
    assert_eq!(s["imbalance"]["lowest_device"], 1);
    // One device is never out of balance with itself.
    let (_, json, _) = run(&["report", "--format", "json", "--device", "1", THREE]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["files"][0]["summary"]["imbalance"].is_null());
}

#[test]
fn brief_is_one_line_per_file() {
    let dir = std::env::temp_dir().join(format!("snapscan-brief-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join("rank3.pickle");
    let whole = std::fs::read(common::fixture("synth/truncated.pickle")).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let (code, text, _) = run(&[
        "report",
        "--brief",
        THREE,
        "fixtures/synth/train.pickle",
        "fixtures/synth/fragmented.pickle",
        cut.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "an unreadable input still exits 2");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with(&format!(
        "{THREE}: OOM on device 1 of 3: 750.0MiB request in the forward pass at "
    )));
    assert!(lines[0].ends_with("FULL; about 274.0MiB must be freed for it to fit [imbalance]"));
    assert_eq!(
        lines[1],
        "fixtures/synth/train.pickle: no OOM; peak 3.8GiB on device 0"
    );
    assert!(
        lines[2].contains(": OOM on device 0: 64.0MiB request"),
        "{}",
        lines[2]
    );
    assert!(lines[2].contains("FRAGMENTATION"), "{}", lines[2]);
    assert!(
        lines[3].contains("rank3.pickle: could not read: "),
        "{}",
        lines[3]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-table-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_cross_file_table_takes_peak_and_reserved_of_one_device_at_one_moment() {
    let dir = temp_dir("moment");
    let bad = dir.join("cut.pickle");
    let whole = std::fs::read(common::fixture("synth/truncated.pickle")).unwrap();
    std::fs::write(&bad, &whole[..whole.len() / 3]).unwrap();
    let bad = bad.to_str().unwrap();
    let files = [
        THREE,
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
        "fixtures/real/LfieLike__SketchKV2__my_snapshot.pickle",
        "fixtures/synth/truncated.pickle",
    ];
    let mut args = vec!["report", "--format", "json"];
    args.extend(files);
    args.push(bad);
    let (code, json, _) = run(&args);
    assert_eq!(code, Some(2));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows = v["ranks"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 5, "the unreadable file is a row too");
    for (row, file) in rows.iter().zip(&v["files"].as_array().unwrap()[..]) {
        let devices = file["devices"].as_array().unwrap();
        let top = devices
            .iter()
            .max_by_key(|d| d["peak"]["requested_bytes"].as_i64().unwrap())
            .unwrap();
        assert_eq!(row["peak_device"], top["device"]);
        assert_eq!(row["peak_requested_bytes"], top["peak"]["requested_bytes"]);
        assert_eq!(row["reserved_at_peak_bytes"], top["peak"]["reserved_bytes"]);
        // The same moment on the same device: reserved holds the peak's blocks.
        assert!(
            row["reserved_at_peak_bytes"].as_i64() >= row["peak_requested_bytes"].as_i64(),
            "{row}"
        );
        let max = devices
            .iter()
            .map(|d| {
                d["peak_reserved"]["bytes"]
                    .as_u64()
                    .unwrap()
                    .max(d["final"]["reserved_bytes"].as_u64().unwrap())
            })
            .max()
            .unwrap();
        assert_eq!(row["max_reserved_bytes"], max);
    }
    let three = &rows[0];
    assert_eq!(three["peak_device"], 0);
    assert_eq!(three["oom"], true, "device 1 ran out of memory");
    let cut = &rows[4];
    assert!(cut["path"].as_str().unwrap().ends_with("cut.pickle"));
    assert!(cut["error"].as_str().unwrap().contains("truncated"));
    assert_eq!(v["ranks"]["ranks_of_one_job"], false);
    assert!(
        rows.iter().all(|r| r["outlier"] == false),
        "unrelated files"
    );

    let mut args = vec!["report"];
    args.extend(files);
    args.push(bad);
    let (_, text, _) = run(&args);
    let head: String = text.lines().take(3).collect::<Vec<_>>().join(" ");
    assert!(
        head.contains("peak and reserved at peak: the device with the highest peak, at the moment of that peak; max reserved: the highest reserved bytes of any device"),
        "{head}"
    );
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("file"))
        .unwrap();
    for col in [
        "rank",
        "device",
        "peak",
        "reserved at peak",
        "max reserved",
        "OOM",
        "outlier",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let cut_row = text
        .lines()
        .find(|l| l.contains("cut.pickle") && l.contains("unreadable"));
    assert!(cut_row.is_some(), "{text}");
    assert!(text.contains("Outliers: not flagged, the files are not ranks of one job"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn outliers_only_among_the_ranks_of_one_job_by_a_printed_rule() {
    let ranked = temp_dir("ranked");
    let unranked = temp_dir("unranked");
    let sources = [
        "synth/train.pickle",
        "synth/train.pickle",
        "synth/train.pickle",
        "synth/load-oom.pickle",
    ];
    for (r, src) in sources.iter().enumerate() {
        std::fs::copy(
            common::fixture(src),
            ranked.join(format!("snap_rank{r}.pickle")),
        )
        .unwrap();
        std::fs::copy(
            common::fixture(src),
            unranked.join(format!("job-{}.pickle", ["a", "b", "c", "d"][r])),
        )
        .unwrap();
    }
    let rule = "Outliers: a rank is an outlier when its peak is ≥ 1.2× or ≤ 0.8× the median peak";
    let outliers = |args: &[&str]| {
        let (code, json, _) = run(args);
        assert_eq!(code, Some(0));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["ranks"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outlier"] == true)
            .map(|r| {
                r["path"]
                    .as_str()
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    let (r, u) = (ranked.to_str().unwrap(), unranked.to_str().unwrap());
    assert_eq!(
        outliers(&["report", "--format", "json", r]),
        ["snap_rank3.pickle"]
    );
    assert!(outliers(&["report", "--format", "json", u]).is_empty());
    assert_eq!(
        outliers(&["report", "--format", "json", "--ranks", u]),
        ["job-d.pickle"]
    );
    let (_, text, _) = run(&["report", r]);
    let table_end = text.find("\n\n== ").unwrap();
    assert!(text[..table_end].contains(rule), "{}", &text[..table_end]);

    // merge: the same rule, the ranks from the names; an unreadable report is a row and exit 2.
    let reports = temp_dir("reports");
    for r in 0..4 {
        let (_, json, _) = run(&[
            "report",
            "--format",
            "json",
            ranked
                .join(format!("snap_rank{r}.pickle"))
                .to_str()
                .unwrap(),
        ]);
        std::fs::write(reports.join(format!("node{r}.json")), json).unwrap();
    }
    std::fs::write(reports.join("node4.json"), "{ not json").unwrap();
    let (code, text, err) = run(&["merge", reports.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("node4.json"), "{err}");
    assert!(text.contains("Outliers: rank 3 (+"), "{text}");
    assert!(text.contains(rule), "{text}");
    assert!(
        text.contains("reserved at peak") && text.contains("max reserved"),
        "{text}"
    );
    let bad = text.lines().find(|l| l.contains("node4.json")).unwrap();
    assert!(bad.contains("unreadable"), "{bad}");
    let (_, json, _) = run(&["merge", "--format", "json", reports.to_str().unwrap()]);
    let m: snapscan::report::MergeReport = serde_json::from_str(&json).unwrap();
    assert_eq!(m.ranks.rows.len(), 5);
    assert_eq!(m.unreadable.len(), 1);
    let top = m.ranks.rows.iter().find(|r| r.rank == Some(3)).unwrap();
    assert!(top.outlier && top.reserved_at_peak_bytes >= top.peak_requested_bytes as u64);
    for d in [ranked, unranked, reports] {
        let _ = std::fs::remove_dir_all(&d);
    }
}
