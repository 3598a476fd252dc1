//! The hand labels of the real snapshots (`fixtures/real/labels.json`, read by a person from the
//! stack frames): every high- or medium-confidence judgement (phase of the peak, phase of each
//! OOM, top category at the peak) is checked, with the expectation read from the file.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::snapshot;

use crate::common;

fn counted(confidence: Option<&str>) -> bool {
    matches!(confidence, Some("high" | "medium"))
}

#[test]
fn every_confident_hand_label_of_the_real_snapshots_holds() {
    let text = std::fs::read_to_string(common::fixture("real/labels.json")).unwrap();
    let labels: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut failures = Vec::new();
    let mut checked = 0;
    for label in labels["labels"].as_array().unwrap() {
        let file = label["file"].as_str().unwrap();
        let path = common::fixture(&format!("real/{file}"));
        let loaded = snapshot::load(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        let report = file_report(&loaded, &ReportOptions::default());
        let device = label["device"].as_i64().unwrap();
        let dev = report
            .devices
            .iter()
            .find(|d| d.device == device)
            .unwrap_or_else(|| panic!("{file}: no device {device}"));
        let phase_confidence = label["peak_phase_confidence"].as_str();
        if counted(phase_confidence) {
            checked += 1;
            let want = label["peak_phase"].as_str().unwrap();
            if dev.peak.phase != want {
                failures.push(format!(
                    "{file}: peak phase {} ({}), label {want}",
                    dev.peak.phase, dev.peak.phase_confidence
                ));
            }
            // -1 = the level before the first event; null = no trace at all.
            let want_event = label["peak_event"].as_i64().filter(|e| *e >= 0);
            if dev.peak.event_index.map(i64::from) != want_event {
                failures.push(format!(
                    "{file}: peak event {:?}, label {want_event:?}",
                    dev.peak.event_index
                ));
            }
        }
        // The top category carries the phase's confidence unless the label gives its own.
        let category_confidence = label["category_confidence"].as_str().or(phase_confidence);
        if counted(category_confidence) {
            checked += 1;
            let shares = label["peak_categories"].as_object().unwrap();
            let want = shares
                .iter()
                .max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap())
                .map(|(k, _)| k.as_str())
                .unwrap();
            let got = dev
                .categories_at_peak
                .iter()
                .max_by_key(|(_, b)| **b)
                .map(|(k, _)| k.as_str())
                .unwrap();
            if got != want {
                failures.push(format!("{file}: top category {got}, label {want}"));
            }
        }
        for (i, oom) in label["ooms"].as_array().unwrap().iter().enumerate() {
            if !counted(oom["phase_confidence"].as_str()) {
                continue;
            }
            checked += 1;
            let got = dev.oom.get(i).map(|o| o.phase.as_str());
            if got != oom["phase"].as_str() {
                failures.push(format!("{file}: OOM {i} phase {got:?}, label {oom}"));
            }
        }
    }
    assert!(checked >= 14, "only {checked} judgements checked");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
