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
