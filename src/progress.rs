//! The progress bar shown while big inputs load: on stderr, only when stderr is a terminal,
//! never in CI (`CI` set) or with `--quiet`, and only for inputs of [`MIN_BYTES`] or more.
//! Library users get no bar unless they call [`enable`].

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Inputs smaller than this (on disk, read from stdin, or once decompressed) load in well under
/// a second: no bar.
pub const MIN_BYTES: u64 = 50_000_000;

/// How often (in input bytes) the readers report their position.
pub const STEP_BYTES: usize = 4 << 20;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether a bar may be drawn: stderr is a terminal, `--quiet` was not given, `CI` is not set
/// (to anything but `0`/`false`), and the terminal is not `dumb`.
pub fn allowed(
    quiet: bool,
    stderr_is_terminal: bool,
    ci: Option<&OsStr>,
    term: Option<&OsStr>,
) -> bool {
    let in_ci = ci.is_some_and(|v| !v.is_empty() && v != "0" && v != "false");
    let dumb = term.is_some_and(|t| t == "dumb");
    !quiet && stderr_is_terminal && !in_ci && !dumb
}

/// Turns the bar on or off for this process (the command line decides with [`allowed`]).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// [`allowed`] for this process's stderr and environment.
pub fn enable_from_env(quiet: bool) {
    use std::io::IsTerminal;
    enable(allowed(
        quiet,
        std::io::stderr().is_terminal(),
        std::env::var_os("CI").as_deref(),
        std::env::var_os("TERM").as_deref(),
    ));
}

fn multi() -> &'static MultiProgress {
    static MULTI: OnceLock<MultiProgress> = OnceLock::new();
    MULTI.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{msg} [{bar:32}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ")
}

fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

/// The progress of loading one input. Draws nothing until a phase is big enough; cleared when
/// dropped.
pub struct Loading {
    name: String,
    label: &'static str,
    total: Option<u64>,
    /// The largest size known for this input (on disk, decompressed): phases without a
    /// position of their own show a spinner when it is big.
    size: u64,
    bar: Option<ProgressBar>,
    /// The thread that moves the bar for a [`Loading::parallel_phase`], and its stop flag.
    watcher: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Loading {
    /// Progress for the input called `name` (shown in the bar).
    pub fn new(name: &str) -> Loading {
        Loading {
            name: crate::render::safe::term(&short_name(name)).into_owned(),
            label: "",
            total: None,
            size: 0,
            bar: None,
            watcher: None,
        }
    }

    /// A loader that never draws.
    pub fn hidden() -> Loading {
        Loading {
            name: String::new(),
            label: "",
            total: None,
            size: 0,
            bar: None,
            watcher: None,
        }
    }

    fn visible_for(&self, bytes: u64) -> bool {
        bytes >= MIN_BYTES && !self.name.is_empty() && ENABLED.load(Ordering::Relaxed)
    }

    /// Records the size of the input (e.g. the file on disk) once it is known.
    pub fn note_size(&mut self, bytes: u64) {
        self.size = self.size.max(bytes);
    }

    /// Starts a phase (`reading`, `decompressing`, `parsing`, …) over `total` bytes (`None` =
    /// no position: a spinner). The bar appears when `total` (or the input's known size) is
    /// big; with neither, when [`Loading::set`] passes [`MIN_BYTES`].
    pub fn phase(&mut self, label: &'static str, total: Option<u64>) {
        self.stop_watcher();
        self.label = label;
        self.total = total;
        if let Some(t) = total {
            self.note_size(t);
        }
        if self.bar.is_none() && self.visible_for(self.size) {
            self.bar = Some(multi().add(ProgressBar::new(0)));
        }
        if let Some(bar) = &self.bar {
            // Position, elapsed time and rate start again for the new phase.
            bar.reset();
            self.restyle(bar);
        }
    }

    /// A phase over `total` bytes done by several threads: they add the bytes they finish to the
    /// returned counter (`fetch_add`, relaxed), and the bar follows it ten times a second.
    pub fn parallel_phase(&mut self, label: &'static str, total: u64) -> Arc<AtomicU64> {
        self.phase(label, Some(total));
        let counter = Arc::new(AtomicU64::new(0));
        if let Some(bar) = &self.bar {
            let stop = Arc::new(AtomicBool::new(false));
            let (bar, done, flag) = (bar.clone(), Arc::clone(&counter), Arc::clone(&stop));
            let handle = std::thread::spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    bar.set_position(done.load(Ordering::Relaxed));
                    std::thread::park_timeout(Duration::from_millis(100));
                }
            });
            self.watcher = Some((stop, handle));
        }
        counter
    }

    fn stop_watcher(&mut self) {
        if let Some((stop, handle)) = self.watcher.take() {
            stop.store(true, Ordering::Relaxed);
            handle.thread().unpark();
            let _ = handle.join();
        }
    }

    /// A spinner for work on an input of `size` bytes that reports no position (analysing a
    /// big snapshot); drawn only when the input is big.
    pub fn busy(name: &str, size: u64, label: &'static str) -> Loading {
        let mut l = Loading::new(name);
        l.label = label;
        l.size = size;
        if l.visible_for(size) {
            let bar = multi().add(ProgressBar::new(0));
            l.restyle(&bar);
            l.bar = Some(bar);
        }
        l
    }

    fn restyle(&self, bar: &ProgressBar) {
        match self.total {
            Some(t) => {
                bar.disable_steady_tick();
                bar.set_style(bar_style());
                bar.set_length(t);
            }
            None => {
                bar.set_style(spinner_style());
                bar.enable_steady_tick(Duration::from_millis(120));
            }
        }
        if self.total.is_none() && self.size > 0 {
            bar.set_message(format!(
                "{}: {} {}",
                self.name,
                self.label,
                crate::units::format_bytes(self.size)
            ));
        } else {
            bar.set_message(format!("{}: {}", self.name, self.label));
        }
    }

    /// Bytes of the current phase done so far.
    pub fn set(&mut self, bytes: u64) {
        if self.bar.is_none() && self.total.is_none() && self.visible_for(bytes) {
            let bar = multi().add(ProgressBar::new(0));
            self.restyle(&bar);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
            if self.total.is_none() {
                bar.set_message(format!(
                    "{}: {} {}",
                    self.name,
                    self.label,
                    crate::units::format_bytes(bytes)
                ));
            }
        }
    }

    /// Replaces the message after the phase label (e.g. bytes decoded so far).
    pub fn detail(&self, detail: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{}: {} {detail}", self.name, self.label));
        }
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        self.stop_watcher();
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            multi().remove(&bar);
        }
    }
}

/// The file name without its directories, shortened to 40 characters.
fn short_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let count = base.chars().count();
    if count <= 40 {
        base.to_owned()
    } else {
        let tail: String = base.chars().skip(count - 39).collect();
        format!("…{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_only_on_a_terminal_outside_ci_and_without_quiet() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert!(allowed(false, true, None, os("xterm-256color")));
        assert!(!allowed(true, true, None, None), "--quiet");
        assert!(!allowed(false, false, None, None), "pipe or file");
        assert!(!allowed(false, true, os("true"), None), "CI=true");
        assert!(!allowed(false, true, os("1"), None), "CI=1");
        assert!(allowed(false, true, os("false"), None), "CI=false");
        assert!(!allowed(false, true, None, os("dumb")), "TERM=dumb");
    }

    #[test]
    fn hidden_unless_enabled_and_big() {
        let mut l = Loading::new("x.pickle");
        l.phase("parsing", Some(MIN_BYTES * 2));
        // Tests never enable the bar: nothing is drawn, and no thread is started.
        assert!(l.bar.is_none());
        let counter = l.parallel_phase("parsing", MIN_BYTES * 2);
        counter.fetch_add(10, Ordering::Relaxed);
        assert!(l.watcher.is_none());
        assert_eq!(short_name("a/b/rank3.pickle"), "rank3.pickle");
        assert_eq!(short_name(&"x".repeat(50)).chars().count(), 40);
    }
}
