//! Command-line interface: parse arguments, run, map the result to an exit code.
//! Exit codes: 0 analysed (and within every budget), 1 a budget or finding was crossed,
//! 2 could not analyse (bad input, I/O).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use rayon::prelude::*;

use crate::analysis;
use crate::report::{StatsOutput, SCHEMA_VERSION};
use crate::snapshot::{self, LoadedSnapshot};

const AFTER_HELP: &str = "\
Exit codes: 0 = analysed; 1 = a budget or finding was crossed (check, diff); 2 = could not analyse
(unreadable or invalid input, usage error). A closed pipe (`| head`) exits 0.
Inputs may be pickles (protocol 2-5), gzip or zstd compressed pickles (detected by content),
the JSON form of a snapshot, directories, glob patterns, or `-` for stdin. Nothing in a snapshot
is ever executed.
Colour only when stdout is a terminal (NO_COLOR turns it off); a progress bar for inputs of 50 MB
and more only when stderr is a terminal and CI is not set (--quiet turns it off).";

#[derive(Parser, Debug)]
#[command(
    name = "snapscan",
    version,
    about = "Answers from PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot)",
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// No progress bar (it is also off when stderr is not a terminal or `CI` is set).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// The most bytes one compressed input (or stdin) may decompress to. By default 200x the
    /// compressed size (at least 256 MiB), and never more than a quarter of this machine's
    /// memory (at most 16 GiB): a small file must not take the machine's memory.
    #[arg(long, global = true, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub max_decompressed: Option<u64>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    #[value(alias = "md")]
    Markdown,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The main job: OOM verdict, peak, what was alive at the peak (by call site), what held it
    /// open, and fragmentation, per device. Several files (the ranks of one job) are analysed in
    /// parallel and compared in a table first.
    #[command(
        after_help = "Examples:\n  snapscan report speicher.pickle\n  snapscan report --format markdown speicher.pickle > report.md\n  snapscan report --format markdown --svg out -o out/report.md speicher.pickle\n  snapscan report --format json rank*.pickle > report.json"
    )]
    Report {
        /// Snapshot files or directories (`-` for stdin).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// How many rows per table in text and Markdown.
        #[arg(long, default_value_t = 8)]
        top: usize,
        /// Show whole stacks for the call sites (`--stacks=python`: their Python frames only).
        #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "all")]
        stacks: Option<StackFrames>,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Also write the pictures (timeline.svg, segments.svg; `-<file>` suffixes for several
        /// files) into this directory; the Markdown report links them.
        #[arg(long, value_name = "DIR")]
        svg: Option<PathBuf>,
        /// Recover what is complete from a pickle cut short (a dump killed while writing)
        /// instead of failing; stderr and the report say what is missing.
        #[arg(long)]
        salvage: bool,
        /// Write one self-contained HTML page instead (the report rendered, with the interactive
        /// timeline, segments and search of `snapscan view`); --format is then ignored.
        #[arg(long, conflicts_with = "svg")]
        html: bool,
        /// Every allocation alive at the peak, every segment and every training step in the
        /// report (default: the 100 largest allocations and the 100 segments with the most free
        /// bytes, or `--top` of each when that is more, JSON summing the rest in
        /// `live_at_peak_omitted` / `segments_omitted`; `--top` training steps in text and
        /// Markdown, all of them in JSON).
        #[arg(long)]
        full: bool,
        /// One line per file: the device that ran out of memory, the failing call site and
        /// roughly how much must be freed for the request to fit (or the peak when there was no
        /// OOM); unreadable inputs get a line too.
        #[arg(long, conflicts_with_all = ["format", "full", "svg", "stacks", "html"])]
        brief: bool,
        /// The files are the ranks of one job even without rank numbers in their names: flag
        /// outliers in the cross-file table.
        #[arg(long)]
        ranks: bool,
        /// A section for every device of a file with more than 64 (otherwise: a table of the
        /// devices and sections for those with an OOM, the highest peak and the outliers).
        #[arg(long)]
        all_devices: bool,
    },
    /// Interactive viewer: one self-contained HTML file (no network request of any kind) with
    /// the report, a zoomable memory timeline, allocation details and stacks, the allocator state
    /// at any event and search by call site, one tab per device (the OOM device first).
    #[command(
        after_help = "Examples:\n  snapscan view speicher.pickle -o view.html\n  snapscan view --device 1 rank3.pickle.zst -o rank3.html\nWithout -o the page is written to view.html in the current directory; `-o -` writes it to stdout.\nIn the page: wheel = zoom, drag = zoom into a range, shift+drag = zoom into a box (bytes too),\nalt+drag or arrow keys = pan, double-click = whole trace, click = details; [ ] step the segments' event."
    )]
    View {
        /// Snapshot files (`-` for stdin); several files get one tab per file and device.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        /// How many rows per table in the report.
        #[arg(long, default_value_t = 8)]
        top: usize,
        /// Output file (`-` for stdout).
        #[arg(short, long, default_value = "view.html")]
        output: PathBuf,
        /// Recover what is complete from a pickle cut short instead of failing.
        #[arg(long)]
        salvage: bool,
        /// A tab for every device of a file with more than 64 (otherwise: those with an OOM,
        /// the highest peak and the outliers; the report's table lists every device).
        #[arg(long)]
        all_devices: bool,
        /// A compare page of two snapshots, base then new: both timelines on one axis, the call
        /// sites that grew or shrank at the peak (click one to find it in both), both panels.
        #[arg(long)]
        compare: bool,
    },
    /// Memory timeline picture (SVG that opens offline in any browser): requested bytes of the
    /// allocations stacked over the trace like memory_viz's Active Memory Timeline, with reserved
    /// bytes, the peak, OOMs and phases marked. Hover a shape for its size, lifetime, category,
    /// call site and stack.
    #[command(
        after_help = "Examples:\n  snapscan timeline speicher.pickle -o timeline.svg\n  snapscan timeline --x time --detail 500 --device 1 rank3.pickle -o rank3-timeline.svg\nWithout -o the picture is written to timeline.svg in the current directory; `-o -` writes it to stdout."
    )]
    Timeline {
        /// Snapshot file (`-` for stdin).
        file: PathBuf,
        /// Only this device (default: one panel per device).
        #[arg(long)]
        device: Option<i64>,
        /// x axis: trace events, or seconds from `time_us` (events when the trace has no times).
        #[arg(long, value_enum, default_value_t = crate::render::svg_timeline::XAxis::Events)]
        x: crate::render::svg_timeline::XAxis,
        /// How many of the largest allocations get their own shape; the others form one band
        /// (at most 1000 shapes per file).
        #[arg(long, default_value_t = crate::render::svg_timeline::DEFAULT_DETAIL)]
        detail: usize,
        /// Colour of the allocations: memory `category` (weights, activations, gradients,
        /// optimizer state, temporary) or `call-site`. Default: category when the trace gives
        /// categories, else call site.
        #[arg(long, value_enum, alias = "color", value_name = "BY")]
        colour: Option<crate::render::svg::ColourBy>,
        /// Output file (`-` for stdout).
        #[arg(short, long, default_value = "timeline.svg")]
        output: PathBuf,
    },
    /// Segment layout picture (SVG): every segment as a bar as long as its size, live blocks
    /// coloured by category or call site, free holes hatched, rounding waste red, the largest
    /// hole labelled and, at an OOM, the failed request drawn to the same scale next to it.
    #[command(
        after_help = "Examples:\n  snapscan segments speicher.pickle -o segments.svg\n  snapscan segments --at 1234 speicher.pickle -o after-1234.svg\nWithout -o the picture is written to segments.svg in the current directory; `-o -` writes it to stdout."
    )]
    Segments {
        /// Snapshot file (`-` for stdin).
        file: PathBuf,
        /// Moment: `peak`, `oom` (the first OOM; an error if there is none), `end` (the dump), a
        /// trace event index (state after it), or `auto` = the first OOM if any, else the peak.
        #[arg(long, value_name = "MOMENT", default_value = "auto", value_parser = crate::render::svg_segments::parse_at)]
        at: crate::render::svg_segments::At,
        /// Only this device (default: one panel per device).
        #[arg(long)]
        device: Option<i64>,
        /// Colour of the allocations: memory `category` (weights, activations, gradients,
        /// optimizer state, temporary) or `call-site`. Default: category when the trace gives
        /// categories, else call site.
        #[arg(long, value_enum, alias = "color", value_name = "BY")]
        colour: Option<crate::render::svg::ColourBy>,
        /// Output file (`-` for stdout).
        #[arg(short, long, default_value = "segments.svg")]
        output: PathBuf,
    },
    /// Final allocator state per device: reserved, allocated, free (internal/external), blocks,
    /// pools, streams and trace entries — the figures of `python -m torch.cuda._memory_viz stats`.
    #[command(
        after_help = "Example:\n  snapscan stats speicher.pickle\n  snapscan stats --format json rank*.pickle > stats.json"
    )]
    Stats {
        /// Snapshot files (`-` for stdin); several files are read in parallel.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Recover what is complete from a pickle cut short (a dump killed while writing)
        /// instead of failing; stderr and the report say what is missing.
        #[arg(long)]
        salvage: bool,
    },
    /// Replays the trace through a model of the CUDA caching allocator: how many allocations it
    /// places at the address the real allocator chose, which cudaMalloc/cudaFree it predicts,
    /// where it first parts from the real allocator and by which rule, and at every OOM (and
    /// every cudaMalloc made while the pool had the bytes) why the request did not fit and
    /// which live blocks pinned the hole that would have served it.
    #[command(
        after_help = "Examples:\n  snapscan replay speicher.pickle\n  snapscan replay --format json --full speicher.pickle > placements.json\n  snapscan replay --set max_split_size_mb:256 speicher.pickle"
    )]
    Replay {
        /// Snapshot files (`-` for stdin); several files are replayed in parallel.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The model's address of every alloc (JSON `placements`: `{"event", "address"}`).
        #[arg(long)]
        full: bool,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax over the dump's own (e.g.
        /// `max_split_size_mb:256`); a setting the model does not implement is refused.
        #[arg(long, value_name = "CONF")]
        set: Option<String>,
        /// Recover what is complete from a pickle cut short (a dump killed while writing)
        /// instead of failing; stderr and the report say what is missing.
        #[arg(long)]
        salvage: bool,
    },
    /// Would a change have fitted? Replays the run's requests through the allocator model
    /// under other allocator settings, another capacity, or with requests scaled or removed,
    /// and gives the peaks and every OOM beside the real run's.
    #[command(
        after_help = "Examples:\n  snapscan whatif --set expandable_segments:True speicher.pickle\n  snapscan whatif --scale batch=0.5 speicher.pickle\n  snapscan whatif --gpu A100-80GB --optimizer 8bit speicher.pickle\n  snapscan whatif --set expandable_segments:True --search speicher.pickle\nCategories for --scale: batch, activations, gradients, optimizer_state, temporary, kv_cache.\nGPUs for --gpu: A100-40GB, A100-80GB, H100-80GB, H200, L4, A10G, RTX4090, RTX3090, T4, V100-16GB, V100-32GB."
    )]
    Whatif {
        /// Snapshot files (`-` for stdin).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (e.g.
        /// `expandable_segments:True,max_split_size_mb:256`); one the model does not
        /// implement is refused.
        #[arg(long, value_name = "CONF")]
        set: Option<String>,
        /// What PyTorch may reserve (e.g. 24GiB); default: what the real run could, found at
        /// its OOM, or no limit.
        #[arg(long, value_parser = crate::units::parse_size, conflicts_with = "gpu")]
        capacity: Option<u64>,
        /// The capacity of a named card, less a CUDA context.
        #[arg(long)]
        gpu: Option<String>,
        /// CATEGORY=F: scale the requests of a category (or `batch`: the activations and
        /// temporaries of the forward and backward passes) by F. Repeatable.
        #[arg(long, value_name = "CATEGORY=F")]
        scale: Vec<String>,
        /// Remove the requests of a call site (as the report names it, or a glob). Repeatable.
        #[arg(long, value_name = "CALLSITE")]
        drop: Vec<String>,
        /// `8bit`: optimizer state at 1 byte per value; `paged`: off the device.
        #[arg(long)]
        optimizer: Option<String>,
        /// Bisect for the largest batch factor that fits (with a capacity), or else the
        /// smallest capacity that fits.
        #[arg(long)]
        search: bool,
        /// Add the reserved curve of both runs to the JSON.
        #[arg(long)]
        full: bool,
        /// Also draw the reserved memory of both runs, the capacity and the OOMs (SVG).
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Finds CUDA out-of-memory messages in a log (PyTorch 1.0–2.x wordings) and gives, for each,
    /// the figures, a verdict (fragmentation, other_processes, full, unknown) and first actions:
    /// for CI runs that kept a log but no snapshot.
    #[command(
        after_help = "Examples:\n  snapscan explain train.log\n  python train.py 2>&1 | tee train.log | snapscan explain\n  snapscan explain --format json ci-output.txt > oom.json\nExit code 0 when the log was read, even if no message was found; 2 when it could not be read."
    )]
    Explain {
        /// Log file (`-` for stdin).
        #[arg(default_value = "-")]
        log: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Writes snapshots into a SQLite database for questions of your own: files, devices,
    /// frames, stacks, allocations (with their category and phase), events, the dump's segments
    /// and blocks, OOMs, phases and annotations. Several files (the ranks of a job) go into one
    /// database with a file and rank column. The schema: docs/sql-schema.md.
    #[command(
        after_help = "Examples:\n  snapscan sql speicher.pickle -o snap.db\n  snapscan sql 'rank*.pickle' -o job.db\n  sqlite3 snap.db 'SELECT call_site, SUM(requested_bytes) FROM allocations JOIN stacks USING (file_id, stack_id) GROUP BY 1 ORDER BY 2 DESC LIMIT 5'"
    )]
    Sql {
        /// Snapshot files, directories or glob patterns.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The database to write (it must not exist yet).
        #[arg(short, long)]
        output: PathBuf,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
    },
    /// One read-only SQL question to a database written by `snapscan sql`, or to a snapshot
    /// (its database is then built in memory). Writes and ATTACH are refused.
    #[command(
        after_help = "Examples:\n  snapscan query snap.db 'SELECT * FROM devices'\n  snapscan query speicher.pickle --format csv 'SELECT category, SUM(requested_bytes) FROM allocations GROUP BY 1'\nThe schema and ten example queries: docs/sql-schema.md."
    )]
    Query {
        /// A database from `snapscan sql`, or a snapshot file.
        file: PathBuf,
        /// One SQL statement that reads.
        sql: String,
        #[arg(long, value_enum, default_value_t = QueryFormat::Text)]
        format: QueryFormat,
        /// At most this many rows.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Stop the query after this many seconds.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// A Model Context Protocol server on stdin and stdout, for coding agents: tools for the
    /// report, the peak, the live set at any event, an allocation's life, the segments at any
    /// event, why an OOM happened, diff, explain, check, whatif and read-only SQL. Snapshots
    /// are analysed once and kept within --memory-budget; only files under the --root folders
    /// are read, and nothing is written.
    #[command(
        after_help = "Example (an agent's MCP configuration):\n  {\"mcpServers\": {\"snapscan\": {\"command\": \"snapscan\", \"args\": [\"mcp\", \"--root\", \"/data/snapshots\"]}}}"
    )]
    Mcp {
        /// A folder whose files may be read (repeatable; default: the current folder).
        #[arg(long = "root", value_name = "DIR")]
        roots: Vec<PathBuf>,
        /// Bytes of analysed snapshots kept between calls (the least recently used go first).
        #[arg(long, value_name = "SIZE", default_value = "4GiB", value_parser = crate::units::parse_size)]
        memory_budget: u64,
    },
    /// Memory budgets for CI: exits 1 with one line per crossed budget (file, device, budget,
    /// measured value, limit), 0 when all hold. Peak = peak of requested bytes; reserved = highest
    /// reserved bytes; fragmentation = 1 − largest free hole / free bytes of the reserved
    /// segments, the worst of the peak and every OOM.
    #[command(
        after_help = "Examples:\n  snapscan check --max-peak 20GiB --fail-on-oom speicher.pickle\n  snapscan check --max-reserved 75GB --max-fragmentation 0.5 'snapshots/rank*.pickle'\n  snapscan check --max-peak 1.5e9 --format json run.pickle.zst > check.json\nSizes: 20GiB, 512MB, 1.5e9 (bytes). Ratios: 0.5 or 50%.\nExit codes: 0 = every budget holds; 1 = a budget was crossed; 2 = a file could not be analysed.",
        group(clap::ArgGroup::new("budgets").required(true).multiple(true).args(["max_peak", "max_reserved", "max_fragmentation", "fail_on_oom"]))
    )]
    Check {
        /// Snapshot files, directories or glob patterns (`-` for stdin).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Largest allowed peak of requested bytes per device.
        #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
        max_peak: Option<u64>,
        /// Largest allowed reserved bytes per device (the peak of reserved bytes).
        #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
        max_reserved: Option<u64>,
        /// Largest allowed fragmentation ratio (0..1) at the peak and at every OOM.
        #[arg(long, value_name = "RATIO", value_parser = analysis::check::parse_ratio)]
        max_fragmentation: Option<f64>,
        /// Any OOM event is a failure.
        #[arg(long)]
        fail_on_oom: bool,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Compares two runs: peak delta (bytes and %), allocated and reserved deltas, the call sites
    /// that are new or grew most at the peak, bytes at the peak by phase and category,
    /// fragmentation delta, OOM appeared or disappeared. BASE and NEW are snapshots or JSON
    /// reports (`snapscan report --format json`, e.g. a stored baseline).
    #[command(
        after_help = "Examples:\n  snapscan diff main.pickle branch.pickle\n  snapscan diff --format markdown --fail-on-growth 5% baseline.json new.pickle > diff.md\n  snapscan diff --format json --device 0 old.pickle.gz new.pickle.gz\nExit codes: 0 = compared (and within --fail-on-growth); 1 = the peak grew by more than --fail-on-growth; 2 = a file could not be analysed."
    )]
    Diff {
        /// The earlier run: snapshot or JSON report (`-` for stdin).
        base: PathBuf,
        /// The later run: snapshot or JSON report (`-` for stdin).
        new: PathBuf,
        /// Exit 1 when the peak of any device grew by more than this: `5%` or `0.05`.
        #[arg(long, value_name = "GROWTH", value_parser = analysis::diff::parse_growth)]
        fail_on_growth: Option<f64>,
        /// Only this device.
        #[arg(long)]
        device: Option<i64>,
        /// How many call sites per table in text and Markdown.
        #[arg(long, default_value_t = 8)]
        top: usize,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Cross-rank table (peak per rank, reserved, OOM ranks, outliers) from the JSON reports of
    /// many nodes, without the snapshots: each node runs `snapscan report --format json` on its
    /// own snapshot, and merge combines the small reports.
    #[command(
        after_help = "Examples:\n  snapscan report --format json /scratch/snap_rank$RANK.pickle > reports/rank$RANK.json   # on every node\n  snapscan merge reports/*.json\n  snapscan merge --format markdown 'reports/*.json' > ranks.md\nRanks come from the snapshot names (rank3.pickle), else from the report names (rank3.json).\nExit codes: 0 = merged; 2 = a report could not be read (the others are merged; it is a row with its error)."
    )]
    Merge {
        /// JSON reports, directories or glob patterns (`-` for stdin).
        #[arg(required = true)]
        reports: Vec<PathBuf>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The reports are the ranks of one job even without rank numbers in their names: flag
        /// outliers.
        #[arg(long)]
        ranks: bool,
    },
    /// Shell completion script, printed to stdout.
    #[command(
        after_help = "Examples:\n  snapscan completions bash > ~/.local/share/bash-completion/completions/snapscan\n  snapscan completions zsh > ~/.zfunc/_snapscan\n  snapscan completions fish > ~/.config/fish/completions/snapscan.fish"
    )]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// Which frames `report --stacks` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QueryFormat {
    Text,
    Csv,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StackFrames {
    /// Every recorded frame (allocator, dispatcher and interpreter frames are left out).
    All,
    /// Python frames only.
    Python,
}

/// Result of a command: bytes for stdout and the exit code.
struct Outcome {
    output: Vec<u8>,
    target: Option<PathBuf>,
    code: u8,
}

fn load_all(files: &[PathBuf]) -> Result<Vec<LoadedSnapshot>, anyhow::Error> {
    let files = crate::input::expand_inputs(files)?;
    let results: Vec<_> = files.par_iter().map(|f| snapshot::load(f)).collect();
    let mut loaded = Vec::with_capacity(results.len());
    for r in results {
        loaded.push(r?);
    }
    Ok(loaded)
}

/// [`load_all`] for the commands that have `--salvage`: a cut pickle's error suggests it, and
/// with it what was recovered (and what is missing) is said on stderr.
fn load_all_salvage(
    files: &[PathBuf],
    salvage: bool,
) -> Result<Vec<LoadedSnapshot>, anyhow::Error> {
    let (loaded, mut unreadable) = load_readable(files, salvage)?;
    match unreadable.is_empty() {
        true => Ok(loaded),
        false => Err(anyhow::anyhow!(unreadable.remove(0).error)),
    }
}

/// Every input that can be read, and the others with their errors (for the caller to name),
/// so that one bad rank does not hide the rest. An error when nothing could be read.
fn load_readable(
    files: &[PathBuf],
    salvage: bool,
) -> Result<(Vec<LoadedSnapshot>, Vec<crate::report::Unreadable>), anyhow::Error> {
    let files = crate::input::expand_inputs(files)?;
    let results: Vec<_> = files.par_iter().map(|f| load_one(f, salvage)).collect();
    readable(&files, results)
}

/// Each input loaded and handed to `work`, then let go, files side by side: a job of many files
/// holds a few snapshots at a time, not all of them. The inputs that cannot be read come back
/// with their errors, as [`load_readable`] gives them.
fn each_readable<T: Send>(
    files: &[PathBuf],
    salvage: bool,
    work: impl Fn(&LoadedSnapshot) -> T + Sync,
) -> Result<(Vec<T>, Vec<crate::report::Unreadable>), anyhow::Error> {
    let files = crate::input::expand_inputs(files)?;
    let one = files.len() == 1;
    let results: Vec<_> = files
        .par_iter()
        .map(|f| {
            let (l, salvaged) = load_one(f, salvage)?;
            let out = work(&l);
            if one {
                // The process ends soon: a big snapshot is not worth freeing.
                exit_soon(l);
            }
            Ok((out, salvaged))
        })
        .collect();
    readable(&files, results)
}

/// One input, and what a salvage recovered of it (said on stderr in the inputs' order).
fn load_one(
    path: &std::path::Path,
    salvage: bool,
) -> Result<(LoadedSnapshot, Option<String>), snapshot::LoadError> {
    let opts = snapshot::LoadOptions {
        salvage,
        hint_salvage: true,
    };
    let l = snapshot::load_with(path, opts)?;
    let salvaged =
        (l.snapshot.salvaged.as_ref()).map(|s| format!("{}: {}", l.name, s.describe(&l.snapshot)));
    Ok((l, salvaged))
}

/// The inputs' results split into what was read and what could not be, with its error; the
/// error itself when there is one input, or when nothing could be read.
fn readable<T>(
    files: &[PathBuf],
    results: Vec<Result<(T, Option<String>), snapshot::LoadError>>,
) -> Result<(Vec<T>, Vec<crate::report::Unreadable>), anyhow::Error> {
    let mut done = Vec::with_capacity(results.len());
    let mut unreadable = Vec::new();
    for (path, r) in files.iter().zip(results) {
        match r {
            Ok((out, salvaged)) => {
                if let Some(w) = salvaged {
                    warn(&w);
                }
                done.push(out);
            }
            Err(e) if files.len() == 1 => return Err(e.into()),
            Err(e) => unreadable.push(crate::report::Unreadable {
                path: crate::input::display_name(path),
                error: format!("{e:#}"),
            }),
        }
    }
    if done.is_empty() {
        if let Some(u) = unreadable.first() {
            anyhow::bail!("{}", u.error);
        }
    }
    Ok((done, unreadable))
}

/// One file's report and its panels' page data (every device, or only `options.device`; a
/// device of a many-device file only where its report has a section for it).
fn file_page_data(
    loaded: &LoadedSnapshot,
    options: &analysis::report::ReportOptions,
) -> Result<
    (
        crate::report::FileReport,
        Vec<crate::render::html::PanelData>,
    ),
    anyhow::Error,
> {
    if let Some(d) = options.device {
        crate::render::svg::devices(&loaded.snapshot, Some(d))?;
    }
    let (report, parts) = {
        let _spinner =
            crate::progress::Loading::busy(&loaded.name, loaded.decoded_bytes, "analysing");
        analysis::report::file_report_keeping(loaded, options)
    };
    let file = (loaded.name.as_str(), &loaded.snapshot, parts.as_slice());
    let mut panels = crate::render::html::panels(&[file], options.device)?;
    // A file of many devices gets tabs for the devices its report has a section for: a
    // browser took 53 s to open the page of 8 000 devices.
    panels.retain(|p| {
        report.device_table.is_empty() || report.devices.iter().any(|d| d.device == p.device)
    });
    Ok((report, crate::render::html::panel_data(&panels)))
}

/// `value` in the chosen format: its JSON, or what its text or Markdown renderer makes (colour
/// only for a terminal).
fn formatted<T: serde::Serialize>(
    format: Format,
    output: &Option<PathBuf>,
    value: &T,
    text: fn(&T, bool) -> String,
    markdown: fn(&T) -> String,
) -> Vec<u8> {
    let color = output.is_none() && crate::render::style::stdout_allows_color();
    match format {
        Format::Json => crate::render::json(value),
        Format::Text => text(value, color).into_bytes(),
        Format::Markdown => markdown(value).into_bytes(),
    }
}

fn run(cli: Cli) -> Result<Outcome, anyhow::Error> {
    match cli.command {
        Command::Report {
            files,
            device,
            format,
            top,
            stacks,
            output,
            svg,
            salvage,
            full,
            brief,
            ranks,
            html,
            all_devices,
        } => {
            if html {
                return view_page(
                    &files,
                    device,
                    top,
                    stacks,
                    output,
                    salvage,
                    PageOptions {
                        ranks,
                        all_devices,
                        compare: false,
                    },
                );
            }
            let mut timer = crate::timing::Timer::new();
            let options = analysis::report::ReportOptions {
                device,
                all_devices,
                // The lists are capped (`--full`: complete): JSON at its limit, text and
                // Markdown at what their tables show, which spares describing each of the
                // tens of thousands of tensors alive at a real peak.
                list_limit: (!full).then_some(match format {
                    Format::Json => crate::report::JSON_LIST_LIMIT,
                    Format::Text | Format::Markdown => top.max(crate::report::JSON_LIST_LIMIT),
                }),
                ..Default::default()
            };
            // The pictures need every snapshot at once; without them each file is let go
            // once its report is made, so a job holds a few snapshots at a time.
            let (reports, unreadable, loaded) = if svg.is_some() {
                let (loaded, unreadable) = load_readable(&files, salvage)?;
                let reports: Vec<_> = loaded.par_iter().map(|l| report_of(l, &options)).collect();
                (reports, unreadable, loaded)
            } else {
                let (reports, unreadable) =
                    each_readable(&files, salvage, |l| report_of(l, &options))?;
                (reports, unreadable, Vec::new())
            };
            for u in &unreadable {
                error(&u.error);
            }
            timer.lap("load and analysis");
            let ranks = (reports.len() + unreadable.len() > 1)
                .then(|| analysis::report::rank_table(&reports, &unreadable, ranks));
            let report = crate::report::Report {
                schema_version: SCHEMA_VERSION,
                files: reports,
                ranks,
                unreadable,
            };
            let unreadable_lines: String = report
                .unreadable
                .iter()
                .map(|u| {
                    let (path, error) = match format {
                        Format::Markdown => (
                            crate::render::safe::md_code(&u.path, false),
                            crate::render::safe::md_code(&u.error, false),
                        ),
                        _ => (
                            crate::render::safe::term(&u.path).into_owned(),
                            crate::render::safe::term(&u.error).into_owned(),
                        ),
                    };
                    format!("\nCould not read {path}: {error}\n")
                })
                .collect();
            let code = if report.unreadable.is_empty() { 0 } else { 2 };
            let view = crate::render::report_text::View {
                top,
                stacks: stacks.is_some(),
                python_only: stacks == Some(StackFrames::Python),
                full,
                all_devices,
            };
            let pictures = match &svg {
                Some(dir) => write_pictures(
                    &loaded,
                    dir,
                    device,
                    output.as_deref(),
                    &Inputs::new(files.clone()),
                )?,
                None => Vec::new(),
            };
            let mut bytes = match format {
                _ if brief => crate::render::report_text::brief(&report).into_bytes(),
                Format::Json => crate::render::json(&report),
                Format::Text => crate::render::report_text::text_styled(
                    &report,
                    &view,
                    output.is_none() && crate::render::style::stdout_allows_color(),
                )
                .into_bytes(),
                Format::Markdown => {
                    crate::render::report_text::markdown_with_pictures(&report, &view, &pictures)
                        .into_bytes()
                }
            };
            timer.lap("render");
            exit_soon(loaded);
            if format == Format::Text {
                for p in &pictures {
                    bytes.extend(
                        format!(
                            "\nPictures of {}: {} {}\n",
                            crate::render::safe::term(&p.file),
                            crate::render::safe::term(&p.timeline),
                            crate::render::safe::term(&p.segments)
                        )
                        .bytes(),
                    );
                }
            }
            if format != Format::Json && !brief {
                bytes.extend(unreadable_lines.bytes());
            }
            Ok(Outcome {
                output: bytes,
                target: output,
                code,
            })
        }
        Command::View {
            files,
            device,
            top,
            output,
            salvage,
            all_devices,
            compare,
        } => view_page(
            &files,
            device,
            top,
            None,
            (output.as_os_str() != "-").then_some(output),
            salvage,
            PageOptions {
                ranks: false,
                all_devices,
                compare,
            },
        ),
        Command::Timeline {
            file,
            device,
            x,
            detail,
            colour,
            output,
        } => {
            let loaded = snapshot::load(&file)?;
            let options = crate::render::svg_timeline::TimelineOptions {
                device,
                x,
                detail,
                colour,
            };
            let bytes =
                crate::render::svg_timeline::timeline(&loaded.name, &loaded.snapshot, &options)?;
            Ok(Outcome {
                output: bytes,
                target: (output.as_os_str() != "-").then_some(output),
                code: 0,
            })
        }
        Command::Segments {
            file,
            at,
            device,
            colour,
            output,
        } => {
            let loaded = snapshot::load(&file)?;
            let options = crate::render::svg_segments::SegmentsOptions { device, at, colour };
            let bytes =
                crate::render::svg_segments::segments(&loaded.name, &loaded.snapshot, &options)?;
            Ok(Outcome {
                output: bytes,
                target: (output.as_os_str() != "-").then_some(output),
                code: 0,
            })
        }
        Command::Stats {
            files,
            device,
            format,
            output,
            salvage,
        } => {
            let loaded = load_all_salvage(&files, salvage)?;
            let stats = StatsOutput {
                schema_version: SCHEMA_VERSION,
                files: loaded
                    .iter()
                    .map(|l| analysis::stats::file_stats(l, device))
                    .collect(),
            };
            let bytes = match format {
                Format::Json => crate::render::json(&stats),
                Format::Text | Format::Markdown => {
                    crate::render::stats_text::render(&stats).into_bytes()
                }
            };
            exit_soon(loaded);
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
        Command::Replay {
            files,
            device,
            format,
            output,
            full,
            set,
            salvage,
        } => {
            let loaded = load_all_salvage(&files, salvage)?;
            let files = loaded
                .par_iter()
                .map(|l| {
                    let (mut settings, notes) =
                        crate::allocator::Settings::from_snapshot(&l.snapshot);
                    if let Some(conf) = &set {
                        settings.apply_conf(conf)?;
                    }
                    Ok(analysis::allocator_replay::replay_file(
                        &l.name,
                        &l.snapshot,
                        device,
                        &settings,
                        &notes,
                        full,
                    ))
                })
                .collect::<Result<Vec<_>, crate::allocator::SettingsError>>()?;
            let out = crate::report::replay::ReplayOutput {
                schema_version: SCHEMA_VERSION,
                files,
            };
            let bytes = formatted(
                format,
                &output,
                &out,
                crate::render::replay_text::text,
                crate::render::replay_text::markdown,
            );
            exit_soon(loaded);
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
        Command::Whatif {
            files,
            device,
            format,
            output,
            set,
            capacity,
            gpu,
            scale,
            drop,
            optimizer,
            search,
            full,
            svg,
        } => {
            let scales = scale
                .iter()
                .map(|s| analysis::whatif::parse_scale(s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("--scale {e}"))?;
            let request = analysis::whatif::Request {
                set,
                capacity,
                gpu,
                scales,
                drops: drop,
                optimizer,
                search,
                full,
            };
            analysis::whatif::validate(&request).map_err(|e| anyhow::anyhow!(e))?;
            let loaded = load_all(&files)?;
            let inputs = Inputs::new(files);
            let files = loaded
                .par_iter()
                .map(|l| analysis::whatif::whatif_file(&l.name, &l.snapshot, device, &request))
                .collect();
            let mut out = crate::report::whatif::WhatifOutput {
                schema_version: SCHEMA_VERSION,
                files,
            };
            if let Some(path) = &svg {
                write_output(path, &crate::render::svg_whatif::picture(&out), &inputs)?;
            }
            if !full {
                for d in out.files.iter_mut().flat_map(|f| f.devices.iter_mut()) {
                    d.real.reserved_curve = None;
                    d.whatif.reserved_curve = None;
                }
            }
            let bytes = formatted(
                format,
                &output,
                &out,
                crate::render::whatif_text::text,
                crate::render::whatif_text::markdown,
            );
            exit_soon(loaded);
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
        Command::Check {
            files,
            max_peak,
            max_reserved,
            max_fragmentation,
            fail_on_oom,
            device,
            format,
            output,
        } => {
            let report = analyse(&files, device)?;
            require_devices(&report, device)?;
            let budgets = crate::report::Budgets {
                max_peak_bytes: max_peak,
                max_reserved_bytes: max_reserved,
                max_fragmentation_ratio: max_fragmentation,
                fail_on_oom,
            };
            let checked = analysis::check::check(&report, &budgets);
            let color = output.is_none() && crate::render::style::stdout_allows_color();
            let bytes = match format {
                Format::Json => crate::render::json(&checked),
                Format::Text => crate::render::check_text::text(&checked, color).into_bytes(),
                Format::Markdown => crate::render::check_text::markdown(&checked).into_bytes(),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: if checked.passed { 0 } else { 1 },
            })
        }
        Command::Diff {
            base,
            new,
            fail_on_growth,
            device,
            top,
            format,
            output,
        } => {
            let (b, n) = rayon::join(
                || file_report_of(&base, device),
                || file_report_of(&new, device),
            );
            let diff = analysis::diff::diff(&b?, &n?, fail_on_growth);
            let view = crate::render::diff_text::DiffView { top };
            let color = output.is_none() && crate::render::style::stdout_allows_color();
            let bytes = match format {
                Format::Json => crate::render::json(&diff),
                Format::Text => crate::render::diff_text::text(&diff, &view, color).into_bytes(),
                Format::Markdown => crate::render::diff_text::markdown(&diff, &view).into_bytes(),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: if diff.failed { 1 } else { 0 },
            })
        }
        Command::Merge {
            reports,
            format,
            output,
            ranks,
        } => {
            let paths = crate::input::expand_inputs(&reports)?;
            if paths.is_empty() {
                anyhow::bail!("no JSON report found in {}", display_paths(&reports));
            }
            let merged = analysis::merge::merge_files(&paths, ranks)?;
            for u in &merged.unreadable {
                error(&u.error);
            }
            let color = output.is_none() && crate::render::style::stdout_allows_color();
            let bytes = match format {
                Format::Json => crate::render::json(&merged),
                Format::Text => crate::render::merge_text::text(&merged, color).into_bytes(),
                Format::Markdown => crate::render::merge_text::markdown(&merged).into_bytes(),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: if merged.unreadable.is_empty() { 0 } else { 2 },
            })
        }
        Command::Sql {
            files,
            output,
            device,
        } => {
            // Not followed: a link there (even a dangling one) is refused like a file.
            if std::fs::symlink_metadata(&output).is_ok() {
                anyhow::bail!(
                    "{}: the file exists; snapscan sql writes a new database (remove it first)",
                    output.display()
                );
            }
            let loaded = load_all(&files)?;
            // Written beside the target and renamed: nobody opens half a database, and a
            // failed run leaves none behind.
            let partial = output.with_file_name(format!(
                ".{}.partial-{}",
                output
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                std::process::id()
            ));
            let written = crate::store::write(&partial, &loaded, device)
                .and_then(|w| Ok(std::fs::rename(&partial, &output).map(|_| w)?));
            if written.is_err() {
                let _ = std::fs::remove_file(&partial);
            }
            let written = written?;
            exit_soon(loaded);
            Ok(Outcome {
                output: format!(
                    "{}: {} files, {} devices, {} allocations, {} events, {} stacks\n",
                    crate::render::safe::term(&output.display().to_string()),
                    written.files,
                    written.devices,
                    written.allocations,
                    written.events,
                    written.stacks
                )
                .into_bytes(),
                target: None,
                code: 0,
            })
        }
        Command::Query {
            file,
            sql,
            format,
            limit,
            timeout,
            output,
        } => {
            if !(timeout.is_finite() && timeout > 0.0) {
                anyhow::bail!("--timeout {timeout}: expected a positive number of seconds");
            }
            let mut conn = crate::store::open_any(&file)?;
            let answer = crate::store::query::run(
                &mut conn,
                &sql,
                limit,
                std::time::Duration::from_secs_f64(timeout),
            )?;
            let bytes = match format {
                QueryFormat::Text => crate::store::query::text(&answer).into_bytes(),
                QueryFormat::Csv => crate::store::query::csv(&answer).into_bytes(),
                QueryFormat::Json => crate::render::json(&answer),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
        Command::Mcp {
            roots,
            memory_budget,
        } => {
            let roots = if roots.is_empty() {
                vec![PathBuf::from(".")]
            } else {
                roots
            };
            let roots = roots
                .iter()
                .map(|r| {
                    r.canonicalize()
                        .map_err(|e| anyhow::anyhow!("--root {}: {e}", r.display()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            crate::mcp::serve(crate::mcp::Settings {
                roots,
                memory_budget,
            })?;
            Ok(Outcome {
                output: Vec::new(),
                target: None,
                code: 0,
            })
        }
        Command::Completions { shell } => {
            let mut bytes = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "snapscan",
                &mut bytes,
            );
            Ok(Outcome {
                output: bytes,
                target: None,
                code: 0,
            })
        }
        Command::Explain {
            log,
            format,
            output,
        } => {
            let found = crate::explain::scan_path(&log)
                .map_err(|e| anyhow::anyhow!("{}: {e}", crate::input::display_name(&log)))?;
            let bytes = match format {
                Format::Json => crate::render::json(&found),
                Format::Text => crate::render::explain_text::text(&found).into_bytes(),
                Format::Markdown => crate::render::explain_text::markdown(&found).into_bytes(),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
    }
}

/// Past this many files a page's report has sections for the interesting ones only.
const PAGE_FILE_SECTIONS: usize = 16;

/// What kind of page `view_page` makes.
struct PageOptions {
    /// The files are ranks of one job (`--ranks`).
    ranks: bool,
    all_devices: bool,
    /// Two files compared, base then new (`view --compare`).
    compare: bool,
}

/// `view` and `report --html`: the report and the interactive panels in one HTML page.
fn view_page(
    files: &[PathBuf],
    device: Option<i64>,
    top: usize,
    stacks: Option<StackFrames>,
    output: Option<PathBuf>,
    salvage: bool,
    page: PageOptions,
) -> Result<Outcome, anyhow::Error> {
    let PageOptions {
        ranks: rank_files,
        all_devices,
        compare,
    } = page;
    if compare && files.len() != 2 {
        anyhow::bail!(
            "view --compare takes two snapshots, the base then the new run (got {})",
            files.len()
        );
    }
    if compare {
        let (loaded, unreadable) = load_readable(files, salvage)?;
        if let Some(u) = unreadable.first() {
            anyhow::bail!("{}", u.error);
        }
        // A directory or a glob can stand for any number of snapshots.
        if loaded.len() != 2 {
            anyhow::bail!(
                "view --compare takes two snapshots, the base then the new run (the arguments \
                 gave {})",
                loaded.len()
            );
        }
        return compare_page(&loaded, device, top, output);
    }
    // The page is drawn from what the report was made of: one decode, one analysis. Each file's
    // panels are made while it is loaded, then it is let go: a job holds a few snapshots at a
    // time, not all of them.
    let options = analysis::report::ReportOptions {
        device,
        all_devices,
        model_blocks: true,
        // The page's report is Markdown: its lists capped as `report --format markdown` caps
        // them (a 1 GB file's full segment list was 100 MB held while the panels were made).
        list_limit: Some(top.max(crate::report::JSON_LIST_LIMIT)),
        ..Default::default()
    };
    let (made, unreadable) = each_readable(files, salvage, |l| file_page_data(l, &options))?;
    for u in &unreadable {
        error(&u.error);
    }
    let mut reports = Vec::with_capacity(made.len());
    let mut panels = Vec::new();
    for m in made {
        let (report, data) = m?;
        reports.push(report);
        panels.extend(data);
    }
    // Stable: file order, then device order, within "has an OOM" and "has none".
    panels.sort_by_key(|p| !p.oom);
    let title = match reports.as_slice() {
        [one] => format!("snapscan view: {}", one.path),
        many => format!("snapscan view: {} files", many.len()),
    };
    let code = if unreadable.is_empty() { 0 } else { 2 };
    // A job's page opens on an overview: a row per rank file, or per device of one file.
    let ranks = (reports.len() > 1)
        .then(|| analysis::report::rank_table(&reports, &unreadable, rank_files));
    let keys: Vec<(&str, i64)> = panels.iter().map(|p| (p.name.as_str(), p.device)).collect();
    let overview = match (&ranks, reports.as_slice()) {
        (Some(t), _) => Some(crate::render::html::data::overview(t, false, &keys)),
        (None, [one]) if one.rows().len() > 1 => {
            let t = analysis::report::device_table_as_ranks(one);
            Some(crate::render::html::data::overview(&t, true, &keys))
        }
        _ => None,
    };
    let markdown = {
        // A big job's page has report sections for the files worth one (the outliers, those
        // with an OOM, the highest peak): the page of 1 000 ranks with a section each was
        // 21 MB of HTML that a browser took 12 s to read. The rank table lists every file.
        let total = reports.len();
        let mut files = reports;
        let mut note = String::new();
        if let (Some(t), true) = (&ranks, total > PAGE_FILE_SECTIONS) {
            let top = t
                .rows
                .iter()
                .filter(|r| r.error.is_none())
                .max_by_key(|r| r.peak_requested_bytes)
                .map(|r| r.path.clone());
            let keep: Vec<&str> = t
                .rows
                .iter()
                .filter(|r| r.outlier || r.oom || Some(&r.path) == top.as_ref())
                .map(|r| r.path.as_str())
                .take(PAGE_FILE_SECTIONS)
                .collect();
            files.retain(|f| keep.contains(&f.path.as_str()));
            note = format!(
                "This page's report has sections for {} of the {total} files (the outliers, those \
                 with an OOM, the highest peak); `snapscan report` on the same files gives every \
                 one.\n\n",
                files.len()
            );
        }
        let report = crate::report::Report {
            schema_version: SCHEMA_VERSION,
            files,
            ranks,
            unreadable,
        };
        let view = crate::render::report_text::View {
            top,
            stacks: stacks.is_some(),
            python_only: stacks == Some(StackFrames::Python),
            full: false,
            all_devices,
        };
        note + &crate::render::report_text::markdown(&report, &view)
    };
    let bytes = crate::render::html::page_of_data(
        &title,
        &markdown,
        panels,
        overview.map(|o| ("overview", o)),
    );
    Ok(Outcome {
        output: bytes,
        target: output,
        code,
    })
}

/// `view --compare BASE NEW`: one device of each (`device`, else the base's device with the
/// highest peak, and the same device of the new run where it has one), the diff of the two
/// reports as the page's report, and the compare section on top.
fn compare_page(
    loaded: &[LoadedSnapshot],
    device: Option<i64>,
    top: usize,
    output: Option<PathBuf>,
) -> Result<Outcome, anyhow::Error> {
    let options = analysis::report::ReportOptions {
        device,
        model_blocks: true,
        ..Default::default()
    };
    let (reports, parts) = page_analysis(loaded, &options)?;
    let peak_device = |r: &crate::report::FileReport| {
        r.devices
            .iter()
            .max_by_key(|d| (d.peak.requested_bytes, std::cmp::Reverse(d.device)))
            .map(|d| d.device)
    };
    let base_device = device.or_else(|| peak_device(&reports[0]));
    let new_device = base_device
        .filter(|d| reports[1].devices.iter().any(|x| x.device == *d))
        .or_else(|| peak_device(&reports[1]));
    let mut panels = Vec::new();
    for (i, want) in [base_device, new_device].into_iter().enumerate() {
        let (l, p) = (&loaded[i], &parts[i]);
        let Some(part) = want.and_then(|d| p.iter().find(|x| x.replay.device == d)) else {
            anyhow::bail!(
                "{}: no device with segments or trace entries to compare",
                l.name
            );
        };
        panels.push(crate::render::html::Panel {
            name: &l.name,
            snapshot: &l.snapshot,
            device: part.replay.device,
            parts: part,
        });
    }
    let diff = analysis::diff::diff(&reports[0], &reports[1], None);
    let device_reports: Vec<&crate::report::DeviceReport> = panels
        .iter()
        .zip(&reports)
        .filter_map(|(p, r)| r.devices.iter().find(|d| d.device == p.device))
        .collect();
    anyhow::ensure!(
        device_reports.len() == panels.len(),
        "a compared device has no report"
    );
    let compare = crate::render::html::data::compare(&diff, &panels, &device_reports);
    let title = format!("snapscan compare: {} → {}", loaded[0].name, loaded[1].name);
    let markdown =
        || crate::render::diff_text::markdown(&diff, &crate::render::diff_text::DiffView { top });
    let bytes = crate::render::html::page(&title, markdown, &panels, Some(("compare", compare)));
    Ok(Outcome {
        output: bytes,
        target: output,
        code: 0,
    })
}

/// `report --svg DIR`: writes timeline and segments pictures of every file into `dir` and
/// returns the links the Markdown report shows (relative to the report file when possible).
fn write_pictures(
    loaded: &[LoadedSnapshot],
    dir: &std::path::Path,
    device: Option<i64>,
    report_path: Option<&std::path::Path>,
    inputs: &Inputs,
) -> Result<Vec<crate::render::report_text::PictureLinks>, anyhow::Error> {
    use crate::render::{svg, svg_segments, svg_timeline};
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let names: Vec<String> = loaded.iter().map(|l| l.name.clone()).collect();
    let stems = svg::picture_stems(&names);
    // Links are relative to the report's directory when the pictures are inside it.
    let report_dir = report_path.map(|p| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    });
    let prefix = match report_dir.as_ref().and_then(|r| r.canonicalize().ok()) {
        Some(r) => match dir.canonicalize() {
            Ok(d) => d
                .strip_prefix(&r)
                .map(|p| p.to_path_buf())
                .unwrap_or_else(|_| dir.to_path_buf()),
            Err(_) => dir.to_path_buf(),
        },
        None => dir.to_path_buf(),
    };
    let rendered: Vec<_> = loaded
        .par_iter()
        .map(|l| {
            let timeline = svg_timeline::timeline(
                &l.name,
                &l.snapshot,
                &svg_timeline::TimelineOptions {
                    device,
                    ..Default::default()
                },
            )?;
            let segments = svg_segments::segments(
                &l.name,
                &l.snapshot,
                &svg_segments::SegmentsOptions {
                    device,
                    ..Default::default()
                },
            )?;
            Ok::<_, anyhow::Error>((timeline, segments))
        })
        .collect();
    let mut links = Vec::with_capacity(loaded.len());
    for ((l, stem), r) in loaded.iter().zip(&stems).zip(rendered) {
        let (timeline, segments) = r?;
        let suffix = if loaded.len() > 1 {
            format!("-{stem}")
        } else {
            String::new()
        };
        let link = |kind: &str, bytes: &[u8]| -> Result<String, anyhow::Error> {
            let file = format!("{kind}{suffix}.svg");
            let path = dir.join(&file);
            write_output(&path, bytes, inputs)?;
            Ok(prefix.join(&file).to_string_lossy().replace('\\', "/"))
        };
        links.push(crate::render::report_text::PictureLinks {
            file: l.name.clone(),
            timeline: link("timeline", &timeline)?,
            segments: link("segments", &segments)?,
        });
    }
    Ok(links)
}

/// [`analysis::report::file_report`] with a spinner on the terminal for big snapshots.
/// The reports of a page's files, keeping what each device's report was made of (the page
/// draws its panels from it); a `--device` that a file lacks is an error before any analysis.
fn page_analysis(
    loaded: &[LoadedSnapshot],
    options: &analysis::report::ReportOptions,
) -> Result<
    (
        Vec<crate::report::FileReport>,
        Vec<Vec<analysis::report::DeviceParts>>,
    ),
    anyhow::Error,
> {
    if let Some(d) = options.device {
        for l in loaded {
            crate::render::svg::devices(&l.snapshot, Some(d))?;
        }
    }
    Ok(loaded
        .par_iter()
        .map(|l| {
            let _spinner = crate::progress::Loading::busy(&l.name, l.decoded_bytes, "analysing");
            analysis::report::file_report_keeping(l, options)
        })
        .unzip())
}

fn report_of(
    loaded: &LoadedSnapshot,
    options: &analysis::report::ReportOptions,
) -> crate::report::FileReport {
    let _spinner = crate::progress::Loading::busy(&loaded.name, loaded.decoded_bytes, "analysing");
    analysis::report::file_report(loaded, options)
}

/// Loads and analyses snapshot files (globs and directories expanded) into one report.
fn analyse(files: &[PathBuf], device: Option<i64>) -> Result<crate::report::Report, anyhow::Error> {
    let loaded = load_all(files)?;
    let options = analysis::report::ReportOptions {
        device,
        ..Default::default()
    };
    let reports: Vec<_> = loaded.par_iter().map(|l| report_of(l, &options)).collect();
    Ok(crate::report::Report {
        schema_version: SCHEMA_VERSION,
        files: reports,
        ranks: None,
        unreadable: Vec::new(),
    })
}

/// Why a file gave no device to `what` (check, compare).
fn nothing_analysed(path: &str, device: Option<i64>, what: &str) -> String {
    match device {
        Some(d) => format!("{path}: no device {d} in this snapshot"),
        None => format!("{path}: an empty snapshot (no segments, no trace): nothing to {what}"),
    }
}

/// A budget check that checked nothing must not pass: every file needs a device analysed.
fn require_devices(report: &crate::report::Report, device: Option<i64>) -> anyhow::Result<()> {
    let empty: Vec<String> = report
        .files
        .iter()
        .filter(|f| f.devices.is_empty())
        .map(|f| nothing_analysed(&f.path, device, "check"))
        .collect();
    if empty.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "nothing was checked for {} of {} files:\n  {}",
        empty.len(),
        report.files.len(),
        empty.join("\n  ")
    )
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| crate::input::display_name(p))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One file's report for `diff`: analysed from a snapshot, or read from a JSON report (which
/// must hold exactly one file).
fn file_report_of(
    path: &std::path::Path,
    device: Option<i64>,
) -> Result<crate::report::FileReport, anyhow::Error> {
    let mut file = if analysis::merge::looks_like_json_report(path) {
        analysis::merge::read_one_report(path)?
    } else {
        let loaded = snapshot::load(path)?;
        report_of(
            &loaded,
            &analysis::report::ReportOptions {
                device,
                ..Default::default()
            },
        )
    };
    if let Some(d) = device {
        file.devices.retain(|x| x.device == d);
    }
    // A diff of nothing would report "unchanged".
    if file.devices.is_empty() {
        anyhow::bail!(nothing_analysed(
            &path.display().to_string(),
            device,
            "compare"
        ));
    }
    Ok(file)
}

/// Leaves `loaded` to the end of the process: a big snapshot is hundreds of MB in many
/// allocations, and freeing them one by one just before exiting costs tens of milliseconds
/// that the exit, which drops the whole address space at once, does not.
fn exit_soon<T>(loaded: T) {
    std::mem::forget(loaded);
}

/// `snapscan: error: …` on stderr (a terminal too): the file names and the strings of a file
/// that an error quotes have their control characters shown as escapes.
fn error(message: &str) {
    eprintln!("snapscan: error: {}", crate::render::safe::lines(message));
}

/// `snapscan: warning: …` on stderr, made safe like [`error`].
fn warn(message: &str) {
    eprintln!("snapscan: warning: {}", crate::render::safe::lines(message));
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    crate::progress::enable_from_env(cli.quiet);
    if let Some(bytes) = cli.max_decompressed {
        crate::input::set_max_decompressed(bytes);
    }
    crate::guard::install();
    // Started here rather than on first use, where a failure to start threads (a tight
    // ulimit, a full process table) is a panic: with fewer threads, or an error.
    if let Err(e) = rayon::ThreadPoolBuilder::new().build_global() {
        if rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .is_err()
        {
            error(&format!("cannot start a worker thread: {e}"));
            return ExitCode::from(2);
        }
    }
    let code = run_and_write(cli);
    // For the linear-work test: the work counted by the reader and the analysis.
    if std::env::var_os("SNAPSCAN_WORK").is_some() {
        eprintln!("work: {} units", crate::work::units());
        eprintln!("document: {} values", crate::work::document_values());
        eprintln!("machine: {} opcodes", crate::work::machine_opcodes());
    }
    code
}

/// The files a command reads, identified (device and inode) once, when an output first needs
/// it: only an output path that already exists can be one of them, so most commands never
/// expand or stat their inputs a second time.
pub struct Inputs {
    given: Vec<PathBuf>,
    ids: std::sync::OnceLock<rustc_hash::FxHashMap<(u64, u64), PathBuf>>,
}

impl Inputs {
    pub fn new(given: Vec<PathBuf>) -> Inputs {
        Inputs {
            given,
            ids: std::sync::OnceLock::new(),
        }
    }

    fn of(command: &Command) -> Inputs {
        Inputs::new(match command {
            Command::Report { files, .. }
            | Command::View { files, .. }
            | Command::Stats { files, .. }
            | Command::Check { files, .. }
            | Command::Replay { files, .. }
            | Command::Whatif { files, .. }
            | Command::Sql { files, .. } => files.clone(),
            Command::Query { file, .. } => vec![file.clone()],
            Command::Timeline { file, .. } | Command::Segments { file, .. } => vec![file.clone()],
            Command::Explain { log, .. } => vec![log.clone()],
            Command::Diff { base, new, .. } => vec![base.clone(), new.clone()],
            Command::Merge { reports, .. } => reports.clone(),
            Command::Completions { .. } | Command::Mcp { .. } => Vec::new(),
        })
    }

    /// The input that is the file `target` describes, if any (patterns and folders expanded).
    fn holding(&self, target: &std::fs::Metadata) -> Option<&PathBuf> {
        let ids = self.ids.get_or_init(|| {
            let mut paths = crate::input::expand_inputs(&self.given).unwrap_or_default();
            paths.extend(self.given.iter().cloned());
            paths
                .into_iter()
                .filter(|p| p.as_os_str() != "-")
                .filter_map(|p| std::fs::metadata(&p).ok().map(|m| (file_id(&m), p)))
                .collect()
        });
        ids.get(&file_id(target))
    }
}

/// Writes `bytes` to `path` as a new file: written to a temporary file in the same folder and
/// renamed over `path`, so that a symlink there is replaced, not followed, and nobody reads
/// half a file. A path that is one of the command's inputs is refused: the output would
/// replace the snapshot it was made from.
pub fn write_output(path: &std::path::Path, bytes: &[u8], inputs: &Inputs) -> anyhow::Result<()> {
    let existing = std::fs::metadata(path).ok();
    if let Some(input) = existing.as_ref().and_then(|t| inputs.holding(t)) {
        anyhow::bail!(
            "{}: this is an input of the command ({}); the output would replace it, so it is \
             not written: name another file",
            crate::render::safe::term(&path.display().to_string()),
            crate::render::safe::term(&input.display().to_string())
        );
    }
    let shown = || crate::render::safe::term(&path.display().to_string()).into_owned();
    // A device, pipe or terminal (`-o /dev/null`, `/dev/stdout`, a FIFO) is a stream to write
    // into, not a file to replace: renaming over it would put a plain file in its place.
    if let Some(meta) = &existing {
        if !meta.is_file() && !meta.is_dir() {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", shown()))?;
            return f
                .write_all(bytes)
                .and_then(|_| f.flush())
                .map_err(|e| anyhow::anyhow!("{}: {e}", shown()));
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| anyhow::anyhow!("{}: not a file name", shown()))?;
    let tmp = dir.join(format!(
        ".{}.{}.snapscan-tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        // create_new: never through a file or link already there.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.flush()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::anyhow!("{}: {e}", shown())
    })
}

/// What identifies a file whatever the path to it.
#[cfg(unix)]
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

#[cfg(not(unix))]
fn file_id(m: &std::fs::Metadata) -> (u64, u64) {
    let modified = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    (m.len(), modified)
}

fn run_and_write(cli: Cli) -> ExitCode {
    let inputs = Inputs::of(&cli.command);
    match run(cli) {
        Ok(outcome) => {
            let written = match &outcome.target {
                Some(path) => write_output(path, &outcome.output, &inputs),
                None => {
                    let mut stdout = std::io::stdout().lock();
                    match stdout
                        .write_all(&outcome.output)
                        .and_then(|_| stdout.flush())
                    {
                        Ok(()) => Ok(()),
                        // `snapscan report … | head` closing the pipe is not an error.
                        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                        Err(e) => Err(anyhow::anyhow!("writing output: {e}")),
                    }
                }
            };
            match written {
                Ok(()) => ExitCode::from(outcome.code),
                Err(e) => {
                    error(&format!("{e:#}"));
                    ExitCode::from(2)
                }
            }
        }
        Err(e) => {
            error(&format!("{e:#}"));
            ExitCode::from(2)
        }
    }
}
