//! The file-level headline: which devices of one file ran out of memory and where, how much
//! had to go for the failed request to fit, and whether the devices' peaks are out of balance.
//! Computed from the device reports, so it says what the per-device sections say, first.

use crate::report::{DeviceReport, DeviceRow, FileSummary, Imbalance, OomHeadline};

/// Peaks are flagged as out of balance when the highest device peak is at least this many
/// times the lowest one …
pub const IMBALANCE_RATIO: f64 = 1.5;
/// … and the two differ by at least this many bytes (small devices never count).
pub const IMBALANCE_MIN_BYTES: i64 = 256 << 20;

/// The rule behind [`Imbalance`], in words (printed and stored with the flag).
pub fn imbalance_rule() -> String {
    format!(
        "highest device peak ≥ {IMBALANCE_RATIO}× the lowest and at least {} more",
        crate::units::format_bytes(IMBALANCE_MIN_BYTES as u64)
    )
}

/// Roughly how many bytes must be freed for a failed request to fit: the request minus the
/// most it could have got, which is the larger of the device's free memory (new memory from
/// cudaMalloc) and the largest hole of the cache that could serve it. Without `device_free`
/// (older dumps) only the hole counts.
pub fn shortfall_bytes(requested: u64, device_free: Option<u64>, largest_free_block: u64) -> u64 {
    requested.saturating_sub(device_free.unwrap_or(0).max(largest_free_block))
}

/// What the headline needs of one device: its row of the device table and its first OOM in
/// brief (kept when the device's report is dropped, in a file of many devices).
#[derive(Clone, Debug)]
pub struct DeviceDigest {
    pub row: DeviceRow,
    pub first_oom: Option<OomHeadline>,
}

impl DeviceDigest {
    pub fn of(d: &DeviceReport, detailed: bool) -> DeviceDigest {
        let first_oom = d.oom.first().map(|o| OomHeadline {
            device: d.device,
            oom_events: d.oom_events(),
            event_index: o.event_index,
            requested_bytes: o.requested_bytes,
            phase: o.phase.clone(),
            call_site: o.call_site.clone(),
            verdict: o.verdict.clone(),
            shortfall_bytes: shortfall_bytes(
                o.requested_bytes,
                o.device_free_bytes,
                o.largest_free_block_bytes,
            ),
        });
        DeviceDigest {
            row: DeviceRow::of(d, detailed),
            first_oom,
        }
    }
}

/// The headline of one file from its devices.
pub fn file_summary(devices: &[DeviceDigest]) -> FileSummary {
    let oom: Vec<OomHeadline> = devices.iter().filter_map(|d| d.first_oom.clone()).collect();
    let highest = devices
        .iter()
        .map(|d| &d.row)
        .max_by_key(|d| (d.peak_requested_bytes, std::cmp::Reverse(d.device)));
    let lowest = devices
        .iter()
        .map(|d| &d.row)
        .min_by_key(|d| (d.peak_requested_bytes, d.device));
    let imbalance = match (highest, lowest) {
        (Some(h), Some(l)) if devices.len() > 1 => {
            let (hp, lp) = (h.peak_requested_bytes, l.peak_requested_bytes.max(0));
            let flagged = hp.saturating_sub(lp) >= IMBALANCE_MIN_BYTES
                && hp as f64 >= IMBALANCE_RATIO * lp as f64;
            flagged.then(|| Imbalance {
                highest_device: h.device,
                highest_peak_bytes: hp,
                lowest_device: l.device,
                lowest_peak_bytes: lp,
                ratio: (lp > 0).then(|| hp as f64 / lp as f64),
                rule: imbalance_rule(),
            })
        }
        _ => None,
    };
    FileSummary {
        devices: devices.len() as u64,
        oom,
        peak_device: highest.map(|d| d.device),
        peak_requested_bytes: highest.map_or(0, |d| d.peak_requested_bytes),
        imbalance,
        empty_devices: Vec::new(),
    }
}

/// Past this many devices in one file, text, Markdown and the page give a table of the devices
/// and detail only the [`interesting_devices`] (`--all-devices`: every one).
pub const MANY_DEVICES: usize = 64;
/// At most this many devices with an OOM are detailed when there are many devices (the first
/// ones; the table lists every one).
pub const MOST_OOM_DEVICES_DETAILED: usize = 16;

/// The devices worth a section when a file has more than [`MANY_DEVICES`]: the first
/// [`MOST_OOM_DEVICES_DETAILED`] that ran out of memory, the one with the highest peak, and the
/// outliers of an imbalance (highest and lowest peak). Sorted, each once.
pub fn interesting_devices(rows: &[DeviceDigest], summary: &FileSummary) -> Vec<i64> {
    let mut out: Vec<i64> = rows
        .iter()
        .filter(|d| d.row.oom_events > 0)
        .take(MOST_OOM_DEVICES_DETAILED)
        .map(|d| d.row.device)
        .collect();
    out.extend(summary.peak_device);
    if let Some(i) = &summary.imbalance {
        out.push(i.highest_device);
        out.push(i.lowest_device);
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortfall_is_what_the_best_source_could_not_give() {
        assert_eq!(shortfall_bytes(100, Some(30), 10), 70);
        assert_eq!(shortfall_bytes(100, Some(10), 40), 60);
        assert_eq!(shortfall_bytes(100, None, 40), 60);
        assert_eq!(shortfall_bytes(100, Some(200), 0), 0);
    }
}
