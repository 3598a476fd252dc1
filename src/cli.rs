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
Exit codes: 0 = analysed; 1 = a budget or finding was crossed (check, diff); 2 = could not analyse.
Inputs may be pickles (protocol 2-5), gzip or zstd compressed pickles (detected by content),
the JSON form of a snapshot, or `-` for stdin. Nothing in a snapshot is ever executed.";

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
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Markdown,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The main job: OOM verdict, peak, what was alive at the peak (by call site), what held it
    /// open, and fragmentation, per device. Several files (the ranks of one job) are analysed in
    /// parallel and compared in a table first.
    #[command(after_help = "Examples:\n  snapscan report speicher.pickle\n  snapscan report --format markdown speicher.pickle > report.md\n  snapscan report --format json rank*.pickle > report.json")]
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
        /// Show whole stacks for the call sites.
        #[arg(long)]
        stacks: bool,
        /// Write to this file instead of stdout.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Final allocator state per device: reserved, allocated, free (internal/external), blocks,
    /// pools, streams and trace entries — the figures of `python -m torch.cuda._memory_viz stats`.
    #[command(after_help = "Example:\n  snapscan stats speicher.pickle\n  snapscan stats --format json rank*.pickle > stats.json")]
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
    },
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

fn run(cli: Cli) -> Result<Outcome, anyhow::Error> {
    match cli.command {
        Command::Report {
            files,
            device,
            format,
            top,
            stacks,
            output,
        } => {
            let loaded = load_all(&files)?;
            let options = analysis::report::ReportOptions {
                device,
                ..Default::default()
            };
            let reports: Vec<_> = loaded
                .par_iter()
                .map(|l| analysis::report::file_report(l, &options))
                .collect();
            let ranks = (reports.len() > 1).then(|| analysis::report::rank_table(&reports));
            let report = crate::report::Report {
                schema_version: SCHEMA_VERSION,
                files: reports,
                ranks,
            };
            let view = crate::render::report_text::View { top, stacks };
            let bytes = match format {
                Format::Json => crate::render::json(&report),
                Format::Text => crate::render::report_text::text(&report, &view).into_bytes(),
                Format::Markdown => crate::render::report_text::markdown(&report, &view).into_bytes(),
            };
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
        Command::Stats {
            files,
            device,
            format,
            output,
        } => {
            let loaded = load_all(&files)?;
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
            Ok(Outcome {
                output: bytes,
                target: output,
                code: 0,
            })
        }
    }
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
    match run(cli) {
        Ok(outcome) => {
            let written = match &outcome.target {
                Some(path) => std::fs::write(path, &outcome.output)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display())),
                None => {
                    let mut stdout = std::io::stdout().lock();
                    match stdout.write_all(&outcome.output).and_then(|_| stdout.flush()) {
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
                    eprintln!("snapscan: error: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Err(e) => {
            eprintln!("snapscan: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
