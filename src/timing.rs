//! Stage timings for the benchmarks.

/// Phase timings on stderr when `SNAPSCAN_TIMING` is set (for the benchmarks).
pub(crate) struct Timer {
    pub(crate) on: bool,
    last: std::time::Instant,
}

impl Timer {
    pub(crate) fn new() -> Timer {
        Timer {
            on: std::env::var_os("SNAPSCAN_TIMING").is_some(),
            last: std::time::Instant::now(),
        }
    }

    pub(crate) fn lap(&mut self, what: &str) {
        if self.on {
            let now = std::time::Instant::now();
            // Resident memory now and at its peak (Linux).
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let field = |name: &str| {
                status
                    .lines()
                    .find(|l| l.starts_with(name))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .unwrap_or("?")
                    .to_owned()
            };
            eprintln!(
                "timing: {what}: {:.1} ms (rss {} kB, peak {} kB; anon {} kB, file {} kB)",
                (now - self.last).as_secs_f64() * 1e3,
                field("VmRSS:"),
                field("VmHWM:"),
                field("RssAnon:"),
                field("RssFile:")
            );
            self.last = now;
        }
    }
}
