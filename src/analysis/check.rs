//! `snapscan check`: memory budgets for CI, as a pure function from a [`Report`] to the
//! violations.
//!
//! What each budget measures, per device of each file:
//! * `max-peak`: the peak of requested bytes (`peak.requested_bytes`, the headline peak of the
//!   report: what tensors asked for, including the level at the start of the trace window).
//! * `max-reserved`: the highest reserved bytes (`peak_reserved.bytes`, the peak of segment bytes
//!   held by the caching allocator over the trace; the dump's reserved bytes when higher).
//! * `max-fragmentation`: the fragmentation ratio `1 − largest free hole / free bytes` of the
//!   reserved segments (0 = all cached free memory in one hole, towards 1 = scattered in many small
//!   holes; 0 when nothing is free), taken at the peak (`fragmentation_at_peak`) and at every OOM
//!   (from the segment layout recorded with the OOM); the worst of these moments is compared.
//! * `fail-on-oom`: any `oom` event in the trace.

use crate::report::{
    Amount, Budget, Budgets, CheckReport, CheckedDevice, CheckedFile, Moment, Report, Violation,
    SCHEMA_VERSION,
};

pub use crate::report::fragmentation_ratio;

fn bytes_amount(b: u64) -> Amount {
    Amount::Int(i64::try_from(b).unwrap_or(i64::MAX))
}

/// Compares every device of every file with the budgets.
pub fn check(report: &Report, budgets: &Budgets) -> CheckReport {
    let mut violations = Vec::new();
    let mut files = Vec::with_capacity(report.files.len());
    for file in &report.files {
        let rows = file.rows();
        let mut devices = Vec::with_capacity(rows.len());
        for dev in rows.iter() {
            let violation = |budget, measured, limit, at, event_index| Violation {
                path: file.path.clone(),
                device: dev.device,
                budget,
                measured,
                limit,
                at,
                event_index,
            };
            let peak = dev.peak_requested_bytes;
            if let Some(limit) = budgets.max_peak_bytes {
                if i128::from(peak) > i128::from(limit) {
                    violations.push(violation(
                        Budget::MaxPeak,
                        Amount::Int(peak),
                        bytes_amount(limit),
                        Moment::Peak,
                        dev.peak_event_index,
                    ));
                }
            }
            let reserved = dev.max_reserved_bytes;
            if let Some(limit) = budgets.max_reserved_bytes {
                if i128::from(reserved) > i128::from(limit) {
                    violations.push(violation(
                        Budget::MaxReserved,
                        Amount::Int(reserved),
                        bytes_amount(limit),
                        dev.max_reserved_at,
                        dev.max_reserved_event_index,
                    ));
                }
            }
            let ratio = dev.worst_fragmentation_ratio;
            if let Some(limit) = budgets.max_fragmentation_ratio {
                if ratio > limit {
                    violations.push(violation(
                        Budget::MaxFragmentation,
                        Amount::Ratio(ratio),
                        Amount::Ratio(limit),
                        dev.worst_fragmentation_at,
                        dev.worst_fragmentation_event_index,
                    ));
                }
            }
            if budgets.fail_on_oom {
                if let Some(first) = dev.first_oom_event_index {
                    violations.push(violation(
                        Budget::FailOnOom,
                        Amount::Int(dev.oom_events as i64),
                        Amount::Int(0),
                        Moment::Oom,
                        Some(first),
                    ));
                }
            }
            devices.push(CheckedDevice {
                device: dev.device,
                peak_requested_bytes: peak,
                reserved_bytes: reserved,
                fragmentation_ratio: ratio,
                oom_events: dev.oom_events,
            });
        }
        files.push(CheckedFile {
            path: file.path.clone(),
            devices,
        });
    }
    CheckReport {
        schema_version: SCHEMA_VERSION,
        budgets: budgets.clone(),
        passed: violations.is_empty(),
        violations,
        files,
    }
}

/// Parses a fragmentation ratio: a fraction in [0, 1] (`0.5`) or a percentage (`50%`).
pub fn parse_ratio(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let value = match t.strip_suffix('%') {
        Some(p) => p
            .trim()
            .parse::<f64>()
            .map(|v| v / 100.0)
            .map_err(|_| format!("`{text}` is not a percentage (examples: 50%, 0.5)"))?,
        None => t
            .parse::<f64>()
            .map_err(|_| format!("`{text}` is not a ratio (examples: 0.5, 50%)"))?,
    };
    if !(0.0..=1.0).contains(&value) {
        return Err(format!(
            "`{text}` is outside 0..1 (the ratio is 1 − largest hole / free bytes)"
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::SegmentReport;

    #[test]
    fn ratios_parse_as_fractions_or_percentages() {
        assert_eq!(parse_ratio("0.5"), Ok(0.5));
        assert_eq!(parse_ratio("25%"), Ok(0.25));
        assert!(parse_ratio("1.5").is_err());
        assert!(parse_ratio("lots").is_err());
    }

    #[test]
    fn ratio_of_a_layout() {
        let seg = |free, largest| SegmentReport {
            address: 0,
            total_bytes: 100,
            allocated_bytes: 100 - free,
            holes: 1,
            largest_hole_bytes: largest,
            free_bytes: free,
            internal_waste_bytes: 0,
            stream: 0,
            pool: None,
            segment_type: "large".into(),
            expandable: false,
        };
        assert_eq!(fragmentation_ratio(&[]), 0.0);
        assert_eq!(fragmentation_ratio(&[seg(40, 40)]), 0.0);
        assert!((fragmentation_ratio(&[seg(40, 10), seg(60, 30)]) - 0.7).abs() < 1e-12);
    }
}
