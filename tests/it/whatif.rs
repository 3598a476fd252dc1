//! What if: the model with no change reproduces the real run; changes move it the way the
//! allocator would.

use std::process::Command;

use snapscan::analysis::whatif::{whatif_device, Request};
use snapscan::snapshot;

use crate::common;

fn json(args: &[&str]) -> serde_json::Value {
    common::snapscan_json(args)
}

/// Identity: on every fixture with a trace from a real run, the model left to decide alone
/// (real settings, the real limit) makes every segment change at its event with its size and
/// reproduces every real OOM.
#[test]
fn with_no_change_the_model_reproduces_every_real_run() {
    let mut checked = 0;
    for dir in ["real", "captured"] {
        for path in common::snapshot_fixtures() {
            if !path.to_string_lossy().contains(&format!("/{dir}/")) {
                continue;
            }
            let loaded = snapshot::load(&path).unwrap();
            let s = &loaded.snapshot;
            for d in s.devices() {
                if s.trace(d).is_empty() {
                    continue;
                }
                let w = whatif_device(s, d, &Request::default());
                let id = &w.identity;
                assert_eq!(
                    id.segment_changes_matched, id.segment_changes_real,
                    "{}: {:?}",
                    loaded.name, id.first_difference
                );
                assert_eq!(id.ooms_reproduced, id.ooms_real, "{}", loaded.name);
                assert_eq!(
                    w.whatif.first_oom_event, w.real.first_oom_event,
                    "{}",
                    loaded.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "{checked}");
}

fn scenario(path: &str, args: &[&str]) -> serde_json::Value {
    let path = common::fixture(path);
    let mut all = vec!["whatif", "--format", "json"];
    all.extend_from_slice(args);
    all.push(path.to_str().unwrap());
    let v = json(&all);
    v["files"][0]["devices"][0].clone()
}

#[test]
fn expandable_segments_fit_a_fragmentation_oom_but_not_a_full_one() {
    let d = scenario(
        "synth/fragmented.pickle",
        &["--set", "expandable_segments:True"],
    );
    assert_eq!(d["real"]["ooms"][0]["fits"], false);
    let oom = &d["whatif"]["ooms"][0];
    assert_eq!(oom["fits"], true, "{d}");
    assert!(oom["margin_bytes"].as_i64().unwrap() > 0);
    assert_eq!(d["whatif"]["settings"]["expandable_segments"], true);
    let d = scenario(
        "synth/train-oom-forward.pickle",
        &["--set", "expandable_segments:True"],
    );
    assert_eq!(d["whatif"]["ooms"][0]["fits"], false, "{d}");
    assert!(d["whatif"]["first_oom_event"].is_u64());
}

#[test]
fn a_capacity_just_above_the_real_peak_fits() {
    let d = scenario("synth/train.pickle", &[]);
    let peak = d["real"]["peak_reserved"]["bytes"].as_u64().unwrap();
    let cap = (peak + (2 << 20)).to_string();
    let d = scenario("synth/train.pickle", &["--capacity", &cap]);
    assert!(d["whatif"]["ooms"].as_array().unwrap().is_empty(), "{d}");
    assert!(d["whatif"]["first_oom_event"].is_null());
    assert_eq!(
        d["whatif"]["capacity_bytes"].as_u64(),
        Some(peak + (2 << 20))
    );
    // Less than the peak does not.
    let cap = (peak / 2).to_string();
    let d = scenario("synth/train.pickle", &["--capacity", &cap]);
    assert!(d["whatif"]["first_oom_event"].is_u64(), "{d}");
}

#[test]
fn a_smaller_batch_lowers_the_peak_and_search_finds_the_largest_that_fits() {
    let d = scenario(
        "synth/train-oom-forward.pickle",
        &["--scale", "batch=0.5", "--search"],
    );
    let real = d["real"]["peak_allocated"]["bytes"].as_u64().unwrap();
    let half = d["whatif"]["peak_allocated"]["bytes"].as_u64().unwrap();
    assert!(half < real, "{half} {real}");
    assert_eq!(d["whatif"]["ooms"][0]["fits"], true);
    let f = d["search"]["value"].as_f64().expect("a factor");
    assert!(f > 0.5 && f < 1.0, "{f}");
    // The factor found fits; a bit more does not.
    let at = |f: f64| {
        let s = format!("batch={f}");
        scenario("synth/train-oom-forward.pickle", &["--scale", &s])["whatif"]["first_oom_event"]
            .is_null()
    };
    assert!(at(f));
    assert!(!at(f + 0.05));
}

#[test]
fn requests_that_are_not_understood_are_refused() {
    let path = common::fixture("synth/train.pickle");
    for args in [
        vec!["--set", "pinned_use_background_threads:True"],
        vec!["--scale", "bananas=0.5"],
        vec!["--scale", "batch"],
        vec!["--gpu", "Z80"],
        vec!["--optimizer", "4bit"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .arg("whatif")
            .args(&args)
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
}

/// Every real OOM fixture's advice carries a replay verdict, and the text names a change the
/// replay found to fit.
#[test]
fn the_reports_advice_is_checked_by_replay() {
    for name in [
        "captured/fragmentation_oom.pickle",
        "captured/oom_backward.pickle",
        "synth/train-oom-forward.pickle",
        "synth/fragmented.pickle",
        "synth/load-oom.pickle",
    ] {
        let path = common::fixture(name);
        let v = json(&["report", "--format", "json", path.to_str().unwrap()]);
        let dev = &v["files"][0]["devices"][0];
        assert!(!dev["oom"].as_array().unwrap().is_empty(), "{name}");
        let advice = dev["advice"].as_array().unwrap();
        let checked: Vec<&serde_json::Value> =
            advice.iter().filter(|a| a["checked"].is_object()).collect();
        assert!(!checked.is_empty(), "{name}: {advice:?}");
        assert!(
            checked.iter().any(|a| a["checked"]["fits"] == true),
            "{name}: no checked change fits: {checked:?}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .args(["report"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Checked by replay"), "{name}");
        assert!(
            text.contains("Replay verdict: the first change above that fits is"),
            "{name}"
        );
    }
}

#[test]
fn the_picture_draws_both_runs() {
    let dir = std::env::temp_dir().join(format!("snapscan-whatif-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("w.svg");
    let path = common::fixture("synth/train-oom-forward.pickle");
    let v = json(&[
        "whatif",
        "--format",
        "json",
        "--set",
        "expandable_segments:True",
        "--svg",
        svg.to_str().unwrap(),
        path.to_str().unwrap(),
    ]);
    // The curves are in the picture, not in the JSON without --full.
    assert!(v["files"][0]["devices"][0]["whatif"]
        .get("reserved_curve")
        .is_none());
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(text.matches("<polyline").count(), 2, "{text}");
    assert!(text.contains("real run: peak") && text.contains("what if: peak"));
    let tree = resvg::usvg::Tree::from_str(&text, &Default::default());
    assert!(tree.is_ok(), "the picture does not parse");
    std::fs::remove_dir_all(&dir).ok();
}
