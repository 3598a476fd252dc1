//! Why a snapshot says little, and the call that records what is missing: no trace at all
//! (memory history never recorded), a trace of one entry (`enabled="state"`, or the legacy
//! API's default of one entry), a ring buffer that wrapped (`max_entries` too small for the
//! window, with the value that would have held it), recording that started mid-run, and stacks
//! that are missing (`context=None`) or hold no Python frame.

use crate::report::{DeviceReport, RecordingGap};
use crate::snapshot::Snapshot;

/// A round value at or above `n`: 1, 2 or 5 times a power of ten.
pub fn round_up(n: u64) -> u64 {
    let mut p = 1u64;
    loop {
        for m in [1, 2, 5] {
            let v = p.saturating_mul(m);
            if v >= n || v == u64::MAX {
                return v;
            }
        }
        p = p.saturating_mul(10);
    }
}

/// A buffer size a user would set: a power of two, or a multiple of 100 (a ring buffer that
/// wrapped holds exactly `max_entries`).
fn looks_set(n: u64) -> bool {
    n >= 2 && (n.is_power_of_two() || n.is_multiple_of(100))
}

pub fn recording_gaps(snapshot: &Snapshot, dev: &DeviceReport) -> Vec<RecordingGap> {
    let mut out = Vec::new();
    let module = super::fields::Accelerator::of(snapshot).memory_module();
    let record = format!("{module}._record_memory_history");
    let gap = |kind: &str, what: String, fix: String| RecordingGap {
        kind: kind.to_owned(),
        what,
        fix,
        max_entries: None,
    };
    let events = dev.window.events;
    let before = dev.window.allocations_before_window;
    if events == 0 {
        out.push(gap(
            "no_trace",
            "the snapshot has the allocator's segments but no trace: memory history was never \
             recorded on this device (_record_memory_history not called, or called with \
             enabled=None, which also clears it), so there is no timeline, no peak and no OOM \
             event"
                .to_owned(),
            format!(
                "{record}(max_entries=100000) before the work, then {module}._dump_snapshot(path)"
            ),
        ));
    } else if events == 1 && dev.truncated {
        out.push(gap(
            "state_only",
            "the trace holds one entry: history was recorded with enabled=\"state\" (or the \
             legacy _record_memory_history(True) API, whose trace keeps 1 entry), which keeps \
             the live blocks' stacks but not the timeline"
                .to_owned(),
            format!("{record}(enabled=\"all\", max_entries=100000)"),
        ));
    } else if dev.truncated && looks_set(events) {
        // Full at exactly max_entries: the oldest entries were overwritten. The allocations
        // alive when the window starts each needed an entry before it.
        let needed = events.saturating_add(before);
        let suggest = round_up(needed.saturating_mul(2));
        let mut g = gap(
            "ring_buffer_wrapped",
            format!(
                "the trace holds exactly {events} entries and starts mid-run: the ring buffer \
                 (max_entries={events}) wrapped and overwrote the oldest entries; the {before} \
                 allocations alive when the window starts needed at least {needed} entries in all"
            ),
            format!("{record}(max_entries={suggest})"),
        );
        g.max_entries = Some(suggest);
        out.push(g);
    } else if dev.truncated {
        out.push(gap(
            "late_start",
            format!(
                "recording started mid-run: {before} allocations predate the first entry (or \
                 history was cleared with clear_history=True)"
            ),
            format!("{record}(max_entries=100000) before the model is built or loaded"),
        ));
    }
    if events > 0 && !snapshot.has_stacks() {
        out.push(gap(
            "no_stacks",
            "no entry or block has frames: history was recorded with context=None, so call \
             sites cannot be named and phases rest on annotations alone"
                .to_owned(),
            format!("{record}(context=\"all\", stacks=\"python\")"),
        ));
    } else if events > 0 && !python_frames(snapshot) {
        out.push(gap(
            "no_python_frames",
            "the stacks hold C++ frames only (recorded from C++, or by a thread without Python): \
             the code that allocated is not named in Python"
                .to_owned(),
            format!("{record}(stacks=\"all\") from the Python process"),
        ));
    }
    out
}

/// Any frame from a Python source file.
fn python_frames(snapshot: &Snapshot) -> bool {
    let interner = &snapshot.interner;
    (0..interner.frame_count()).any(|i| {
        let f = interner.get_frame(crate::snapshot::FrameId(i as u32));
        let file = interner.get_text(f.filename);
        file.ends_with(".py") || file.starts_with('<')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_values() {
        assert_eq!(round_up(1), 1);
        assert_eq!(round_up(3), 5);
        assert_eq!(round_up(7), 10);
        assert_eq!(round_up(4001), 5000);
        assert_eq!(round_up(120_000), 200_000);
        assert!(looks_set(4000) && looks_set(2048) && !looks_set(1303));
    }
}
