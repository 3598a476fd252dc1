//! Stage timings for the benchmarks.

/// Phase timings on stderr when `SNAPSCAN_TIMING` is set (for the benchmarks).
pub(crate) struct Timer {
    pub(crate) on: bool,
    last: std::time::Instant,
    last_cpu: f64,
}

/// Seconds of CPU (user and system, all threads) this process has used; 0 where unknown.
fn cpu_seconds() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0 {
            let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
            return t(u.ru_utime) + t(u.ru_stime);
        }
    }
    0.0
}

impl Timer {
    pub(crate) fn new() -> Timer {
        Timer {
            on: std::env::var_os("SNAPSCAN_TIMING").is_some(),
            last: std::time::Instant::now(),
            last_cpu: cpu_seconds(),
        }
    }

    pub(crate) fn lap(&mut self, what: &str) {
        if self.on {
            let now = std::time::Instant::now();
            let cpu = cpu_seconds();
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
                "timing: {what}: {:.1} ms, cpu {:.0} ms (rss {} kB, peak {} kB; anon {} kB, file {} kB)",
                (now - self.last).as_secs_f64() * 1e3,
                (cpu - self.last_cpu) * 1e3,
                field("VmRSS:"),
                field("VmHWM:"),
                field("RssAnon:"),
                field("RssFile:")
            );
            self.last = now;
            self.last_cpu = cpu;
        }
    }
}
