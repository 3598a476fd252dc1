//! Why a rank (or a device) stands out from the others of its job: the category of memory at
//! its peak that is furthest from the median of the others, and the call site that holds most
//! of it ("6.1 GiB more activations than the median, most of it from `stage_2.py:40`").

use crate::report::{DeviceReport, OutlierReason, RankRow, RankTable};

/// Fills `outlier_reason` of every outlier row of `table`; `peak_device(i)` is the report of
/// row `i`'s device with the highest peak (`None` where there is none: unreadable, or a device
/// of a many-device file without a section).
pub fn explain_outliers<'a>(
    table: &mut RankTable,
    peak_device: impl Fn(usize) -> Option<&'a DeviceReport>,
) {
    let devices: Vec<Option<&DeviceReport>> = (0..table.rows.len()).map(&peak_device).collect();
    let peers: Vec<&DeviceReport> = devices.iter().flatten().copied().collect();
    for (row, device) in table.rows.iter_mut().zip(&devices) {
        if let (true, Some(device)) = (row.outlier, device) {
            row.outlier_reason = reason(row, device, &peers);
        }
    }
}

/// The category whose bytes at the peak differ most from the median of `peers` (in the
/// direction of the row's deviation), with the call site holding most of them.
fn reason(row: &RankRow, device: &DeviceReport, peers: &[&DeviceReport]) -> Option<OutlierReason> {
    let high = row_is_high(row, peers);
    let mut best: Option<(i128, &str, u64, u64)> = None;
    for (category, &bytes) in &device.categories_at_peak {
        let mut others: Vec<u64> = peers
            .iter()
            .map(|p| p.categories_at_peak.get(category).copied().unwrap_or(0))
            .collect();
        others.sort_unstable();
        let median = others.get(others.len() / 2).copied().unwrap_or(0);
        let diff = i128::from(bytes) - i128::from(median);
        // Above the median: the category that grew most; below: the one that shrank most.
        let signed = if high { diff } else { -diff };
        if signed > 0 && best.is_none_or(|b| signed > b.0) {
            best = Some((signed, category, bytes, median));
        }
    }
    let (_, category, bytes, median_bytes) = best?;
    let top = device.top_call_site_by_category_at_peak.get(category);
    Some(OutlierReason {
        category: category.to_owned(),
        bytes,
        median_bytes,
        call_site: top.map(|t| t.call_site.clone()),
        call_site_bytes: top.map_or(0, |t| t.bytes),
    })
}

/// Whether the row's peak is above the median peak of the peers.
fn row_is_high(row: &RankRow, peers: &[&DeviceReport]) -> bool {
    let mut peaks: Vec<i64> = peers.iter().map(|p| p.peak.requested_bytes).collect();
    peaks.sort_unstable();
    let median = peaks.get(peaks.len() / 2).copied().unwrap_or(0);
    row.peak_requested_bytes >= median
}

/// The reason in words, for a rank (`who`: "rank 5", "device 3"); `name` marks the call site
/// as untrusted text for the renderer at hand.
pub fn reason_text(who: &str, r: &OutlierReason, name: impl Fn(&str) -> String) -> String {
    use crate::units::format_bytes;
    let (word, gap) = if r.bytes >= r.median_bytes {
        ("more", r.bytes - r.median_bytes)
    } else {
        ("less", r.median_bytes - r.bytes)
    };
    let mut text = format!(
        "{who}: {} {word} {} than the median ({} against {})",
        format_bytes(gap),
        r.category,
        format_bytes(r.bytes),
        format_bytes(r.median_bytes)
    );
    if let Some(site) = &r.call_site {
        text.push_str(&format!(
            ", most of it from {} ({})",
            name(site),
            format_bytes(r.call_site_bytes)
        ));
    }
    text
}
