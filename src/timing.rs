//! Stage timings for the benchmarks.

/// Phase timings on stderr when `SNAPSCAN_TIMING` is set (for the benchmarks).
pub(crate) struct Timer {
    pub(crate) on: bool,
    last: std::time::Instant,
    last_usage: Usage,
}

/// CPU seconds (user and system, all threads), of them in the kernel, and page faults this
/// process has had so far; zeros where unknown.
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu: f64,
    system: f64,
    faults: i64,
}

fn usage() -> Usage {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0 {
            let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
            return Usage {
                cpu: t(u.ru_utime) + t(u.ru_stime),
                system: t(u.ru_stime),
                faults: u.ru_minflt + u.ru_majflt,
            };
        }
    }
    Usage::default()
}

impl Timer {
    pub(crate) fn new() -> Timer {
        Timer {
            on: std::env::var_os("SNAPSCAN_TIMING").is_some(),
            last: std::time::Instant::now(),
            last_usage: usage(),
        }
    }

    pub(crate) fn lap(&mut self, what: &str) {
        if self.on {
            let now = std::time::Instant::now();
            let u = usage();
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
                "timing: {what}: {:.1} ms, cpu {:.0} ms (system {:.0} ms, {} page faults; rss {} kB, \
                 peak {} kB; anon {} kB, file {} kB)",
                (now - self.last).as_secs_f64() * 1e3,
                (u.cpu - self.last_usage.cpu) * 1e3,
                (u.system - self.last_usage.system) * 1e3,
                u.faults - self.last_usage.faults,
                field("VmRSS:"),
                field("VmHWM:"),
                field("RssAnon:"),
                field("RssFile:")
            );
            self.last = now;
            self.last_usage = u;
        }
    }
}
