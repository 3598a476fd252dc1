//! `snapscan stats` as text.

use std::fmt::Write;

use crate::report::{FileStats, FinalState, StatsOutput};
use crate::units::format_bytes;

fn final_lines(out: &mut String, f: &FinalState, indent: &str) {
    let free = f.free_internal_bytes.saturating_add(f.free_external_bytes);
    let internal_pct = if free > 0 {
        format!(
            " ({:.1}% internal)",
            100.0 * f.free_internal_bytes as f64 / free as f64
        )
    } else {
        String::new()
    };
    let _ = writeln!(out, "{indent}segments            {}", f.segments);
    let _ = writeln!(
        out,
        "{indent}reserved            {:>10}  ({} bytes)",
        format_bytes(f.reserved_bytes),
        f.reserved_bytes
    );
    let _ = writeln!(
        out,
        "{indent}allocated           {:>10}  requested by tensors ({} bytes); {} in blocks",
        format_bytes(f.requested_bytes),
        f.requested_bytes,
        format_bytes(f.allocated_bytes)
    );
    let _ = writeln!(
        out,
        "{indent}free                {:>10}{internal_pct}",
        format_bytes(free)
    );
    let _ = writeln!(
        out,
        "{indent}  internal          {:>10}  rounding inside allocated blocks",
        format_bytes(f.free_internal_bytes)
    );
    let _ = writeln!(
        out,
        "{indent}  external          {:>10}  cached blocks not allocated (pending frees included)",
        format_bytes(f.free_external_bytes)
    );
}

fn file_text(out: &mut String, file: &FileStats) {
    let _ = writeln!(
        out,
        "{}  ({}, {} decoded, stacks {})",
        super::safe::term(&file.path),
        match file.compression {
            crate::input::Compression::None => "uncompressed",
            crate::input::Compression::Gzip => "gzip",
            crate::input::Compression::Zstd => "zstd",
        },
        format_bytes(file.decoded_bytes),
        if file.stacks_recorded {
            "recorded"
        } else {
            "not recorded"
        },
    );
    for dev in &file.devices {
        if dev.final_state.segments == 0 && dev.trace_entries == 0 {
            // The same rule as `report`: named in one line, not printed in full.
            let _ = writeln!(out, "{}", super::report_text::empty_device_line(dev.device));
            continue;
        }
        let _ = writeln!(out, "device {}", dev.device);
        final_lines(out, &dev.final_state, "  ");
        let states: Vec<String> = dev
            .blocks_by_state
            .iter()
            .map(|(k, v)| format!("{} {v}", super::safe::term(k)))
            .collect();
        let _ = writeln!(out, "  blocks              {}", states.join(", "));
        for p in &dev.pools {
            let id = match p.pool_id {
                Some([a, b]) => format!("({a},{b})"),
                None => "default".to_owned(),
            };
            let _ = writeln!(
                out,
                "  pool {id:<8} {:<6} {}, {} reserved, {} allocated",
                p.segment_type,
                crate::units::counted(p.segments, "segment", "segments"),
                format_bytes(p.reserved_bytes),
                format_bytes(p.allocated_bytes)
            );
        }
        for s in &dev.streams {
            let name = if s.stream == 0 {
                "0 (default)".to_owned()
            } else {
                format!("0x{:x}", s.stream)
            };
            let _ = writeln!(
                out,
                "  stream {name:<14} {}, {} reserved",
                crate::units::counted(s.segments, "segment", "segments"),
                format_bytes(s.reserved_bytes)
            );
        }
        let _ = writeln!(out, "  expandable segments {}", dev.expandable_segments);
        let actions: Vec<String> = dev
            .trace_entries_by_action
            .iter()
            .map(|(k, v)| format!("{} {v}", super::safe::term(k)))
            .collect();
        if dev.trace_entries == 0 {
            let _ = writeln!(
                out,
                "  trace entries       0 (memory history was not recorded for this device)"
            );
        } else {
            let _ = writeln!(
                out,
                "  trace entries       {} ({})",
                dev.trace_entries,
                actions.join(", ")
            );
        }
    }
    if file.devices.len() > 1 {
        let _ = writeln!(out, "all devices");
        final_lines(out, &file.total, "  ");
    }
}

pub fn render(stats: &StatsOutput) -> String {
    let mut out = String::new();
    for (i, file) in stats.files.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        file_text(&mut out, file);
    }
    // No string of the file reaches the terminal raw (nothing of this output is coloured).
    super::safe::lines(&out).into_owned()
}
