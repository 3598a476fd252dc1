//! `snapscan diff`: two runs compared device by device, as a pure function from two
//! [`FileReport`]s to a [`DiffReport`].
//!
//! Figures: peak of requested bytes, peak allocated and reserved bytes, reserved bytes at the
//! dump (as [`Delta`]s), the fragmentation ratio at the peak, OOM events appeared or
//! disappeared, and breakdowns of the bytes alive at the peak. A breakdown is a list of
//! `(key, bytes, count)` rows per run; [`key_deltas`] matches the keys of both runs and orders
//! them by growth. The call sites, the allocating phases and the categories of the bytes alive
//! at the peak are such breakdowns; a further breakdown of the report is compared the same way:
//! map both sides to [`Row`]s and add the result as one more field of [`DeviceDiff`].

use std::collections::BTreeMap;

use crate::report::{
    Change, Delta, DeviceDiff, DeviceReport, DiffReport, FileReport, KeyDelta, OomDelta,
    RatioDelta, TextChange, SCHEMA_VERSION,
};

/// One row of a breakdown: key, bytes, number of allocations (when counted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub key: String,
    pub bytes: u64,
    pub count: Option<u64>,
}

/// A figure of both runs as a [`Delta`].
pub fn delta(base: i64, new: i64) -> Delta {
    let d = new.saturating_sub(base);
    Delta {
        base,
        new,
        delta: d,
        ratio: (base != 0).then(|| d as f64 / base as f64),
    }
}

fn to_i64(b: u64) -> i64 {
    i64::try_from(b).unwrap_or(i64::MAX)
}

/// Matches the keys of two breakdowns. Order: by delta, largest growth first, then the smallest
/// shrink down to the largest; ties by key. Keys whose bytes did not change are left out unless
/// `keep_unchanged` (short fixed lists such as categories); keys with 0 bytes in both always are.
pub fn key_deltas(base: &[Row], new: &[Row], keep_unchanged: bool) -> Vec<KeyDelta> {
    let mut keys: BTreeMap<&str, (Option<&Row>, Option<&Row>)> = BTreeMap::new();
    for r in base {
        keys.entry(&r.key).or_default().0 = Some(r);
    }
    for r in new {
        keys.entry(&r.key).or_default().1 = Some(r);
    }
    let mut out: Vec<KeyDelta> = keys
        .into_iter()
        .map(|(key, (b, n))| {
            let base_bytes = b.map_or(0, |r| r.bytes);
            let new_bytes = n.map_or(0, |r| r.bytes);
            let change = match (b, n) {
                (None, _) => Change::New,
                (_, None) => Change::Gone,
                _ if new_bytes > base_bytes => Change::Grew,
                _ if new_bytes < base_bytes => Change::Shrank,
                _ => Change::Same,
            };
            KeyDelta {
                key: key.to_owned(),
                change,
                base_bytes,
                new_bytes,
                delta_bytes: to_i64(new_bytes).saturating_sub(to_i64(base_bytes)),
                base_count: b.map_or(Some(0), |r| r.count),
                new_count: n.map_or(Some(0), |r| r.count),
            }
        })
        .filter(|k| {
            (k.base_bytes, k.new_bytes) != (0, 0)
                && (keep_unchanged
                    || k.delta_bytes != 0
                    || matches!(k.change, Change::New | Change::Gone))
        })
        .collect();
    out.sort_by(|a, b| {
        b.delta_bytes
            .cmp(&a.delta_bytes)
            .then_with(|| a.key.cmp(&b.key))
    });
    out
}

fn call_site_rows(dev: Option<&DeviceReport>) -> Vec<Row> {
    dev.map(|d| {
        d.live_at_peak_by_call_site
            .iter()
            .map(|c| Row {
                key: c.call_site.clone(),
                bytes: c.bytes,
                count: Some(c.count),
            })
            .collect()
    })
    .unwrap_or_default()
}

fn map_rows(
    dev: Option<&DeviceReport>,
    field: impl Fn(&DeviceReport) -> &BTreeMap<String, u64>,
) -> Vec<Row> {
    dev.map(|d| {
        field(d)
            .iter()
            .map(|(k, v)| Row {
                key: k.clone(),
                bytes: *v,
                count: None,
            })
            .collect()
    })
    .unwrap_or_default()
}

fn oom_delta(base: Option<&DeviceReport>, new: Option<&DeviceReport>) -> OomDelta {
    let b = base.map_or(0, |d| d.oom_events());
    let n = new.map_or(0, |d| d.oom_events());
    let change = match (b, n) {
        (0, 0) => "none",
        (0, _) => "appeared",
        (_, 0) => "disappeared",
        _ => "still",
    };
    let first_verdict =
        |d: Option<&DeviceReport>| d.and_then(|d| d.oom.first()).map(|o| o.verdict.clone());
    OomDelta {
        base: b,
        new: n,
        change: change.to_owned(),
        verdict: first_verdict(new).or_else(|| first_verdict(base)),
    }
}

fn device_diff(device: i64, base: Option<&DeviceReport>, new: Option<&DeviceReport>) -> DeviceDiff {
    let fig = |f: &dyn Fn(&DeviceReport) -> i64| delta(base.map_or(0, f), new.map_or(0, f));
    let frag =
        |d: Option<&DeviceReport>| d.map_or(0.0, |d| d.fragmentation_at_peak.fragmentation_ratio);
    DeviceDiff {
        device,
        in_base: base.is_some(),
        in_new: new.is_some(),
        peak: fig(&|d| d.peak.requested_bytes),
        peak_allocated: fig(&|d| d.peak_allocated.bytes),
        peak_reserved: fig(&|d| d.peak_reserved.bytes),
        final_reserved: fig(&|d| to_i64(d.final_state.reserved_bytes)),
        fragmentation_at_peak: RatioDelta {
            base: frag(base),
            new: frag(new),
            delta: frag(new) - frag(base),
        },
        oom: oom_delta(base, new),
        peak_phase: TextChange {
            base: base.map(|d| d.peak.phase.clone()),
            new: new.map(|d| d.peak.phase.clone()),
        },
        call_sites_at_peak: key_deltas(&call_site_rows(base), &call_site_rows(new), false),
        phases_at_peak: key_deltas(
            &map_rows(base, |d| &d.phases_at_peak),
            &map_rows(new, |d| &d.phases_at_peak),
            true,
        ),
        categories_at_peak: key_deltas(
            &map_rows(base, |d| &d.categories_at_peak),
            &map_rows(new, |d| &d.categories_at_peak),
            true,
        ),
    }
}

/// Growth of a peak as a fraction of the base; infinite when it rose from nothing.
fn growth(d: &Delta) -> f64 {
    match d.ratio {
        Some(r) => r,
        None if d.new > 0 => f64::INFINITY,
        None => 0.0,
    }
}

/// Compares two runs, device by device (devices matched by index; a device in one run only is
/// compared with zeros). `fail_on_growth` is a fraction (0.05 = 5 %).
pub fn diff(base: &FileReport, new: &FileReport, fail_on_growth: Option<f64>) -> DiffReport {
    let mut ids: Vec<i64> = base
        .devices
        .iter()
        .chain(&new.devices)
        .map(|d| d.device)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let devices: Vec<DeviceDiff> = ids
        .into_iter()
        .map(|id| {
            device_diff(
                id,
                base.devices.iter().find(|d| d.device == id),
                new.devices.iter().find(|d| d.device == id),
            )
        })
        .collect();
    let peak_growth = devices
        .iter()
        .filter_map(|d| d.peak.ratio)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let failed = fail_on_growth.is_some_and(|limit| {
        devices
            .iter()
            .any(|d| d.peak.delta > 0 && growth(&d.peak) > limit)
    });
    DiffReport {
        schema_version: SCHEMA_VERSION,
        base: base.path.clone(),
        new: new.path.clone(),
        devices,
        peak_growth,
        fail_on_growth,
        failed,
    }
}

/// Parses a growth threshold: a percentage (`5%`) or a fraction (`0.05`). A bare number above 1
/// is refused as ambiguous (write `200%` for a fraction of 2).
pub fn parse_growth(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let value = match t.strip_suffix('%') {
        Some(p) => p
            .trim()
            .parse::<f64>()
            .map(|v| v / 100.0)
            .map_err(|_| format!("`{text}` is not a percentage (examples: 5%, 0.05)"))?,
        None => {
            let v = t
                .parse::<f64>()
                .map_err(|_| format!("`{text}` is not a growth threshold (examples: 5%, 0.05)"))?;
            if v > 1.0 {
                return Err(format!(
                    "`{text}` is ambiguous: write `{text}%` for a percentage or a fraction such as 0.05"
                ));
            }
            v
        }
    };
    if !value.is_finite() || value < 0.0 {
        return Err(format!("`{text}` is not a valid growth threshold"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, bytes: u64) -> Row {
        Row {
            key: key.into(),
            bytes,
            count: Some(1),
        }
    }

    #[test]
    fn breakdowns_are_matched_by_key_and_ordered_by_growth() {
        let base = [row("a", 100), row("b", 50), row("gone", 30), row("same", 7)];
        let new = [row("a", 90), row("b", 80), row("new", 10), row("same", 7)];
        let d = key_deltas(&base, &new, false);
        let keys: Vec<(&str, Change, i64)> = d
            .iter()
            .map(|k| (k.key.as_str(), k.change, k.delta_bytes))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("b", Change::Grew, 30),
                ("new", Change::New, 10),
                ("a", Change::Shrank, -10),
                ("gone", Change::Gone, -30),
            ]
        );
    }

    #[test]
    fn growth_thresholds() {
        assert_eq!(parse_growth("5%"), Ok(0.05));
        assert_eq!(parse_growth("0.05"), Ok(0.05));
        assert_eq!(parse_growth("200%"), Ok(2.0));
        assert!(parse_growth("5").is_err());
        assert!(parse_growth("-1%").is_err());
        assert!(parse_growth("x").is_err());
    }

    #[test]
    fn deltas() {
        assert_eq!(delta(100, 125).ratio, Some(0.25));
        assert_eq!(delta(0, 5).ratio, None);
        assert_eq!(growth(&delta(0, 5)), f64::INFINITY);
        assert_eq!(growth(&delta(0, 0)), 0.0);
    }
}
