//! `snapscan mcp`: a Model Context Protocol server over stdio (the `rmcp` SDK), so that a coding
//! agent can ask a snapshot questions. It is a front end like the CLI: every answer comes from
//! the report's own analysis, the store's queries or the allocator model, never from a copy of
//! them. A snapshot is analysed once per path and modification time and kept within a memory
//! budget; only files under the roots given at start are read, and nothing is written.

mod answers;
mod cache;
mod framing;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::{
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{ServerCapabilities, ServerConfig},
    schemars, tool, tool_handler, tool_router, ServerHandler, ServiceExt,
};
use serde::Deserialize;

use cache::Cache;

/// How the server was started.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Folders whose files may be read (canonical).
    pub roots: Vec<PathBuf>,
    /// Bytes of analysed snapshots kept between calls.
    pub memory_budget: u64,
}

/// Serves requests on stdin and stdout until the client closes them.
pub fn serve(settings: Settings) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (input, output, writer) = framing::guarded_stdio();
        let server = match Server::new(settings).serve((input, output)).await {
            Ok(server) => server,
            // A client that left before saying anything: nothing to do, nothing wrong.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
            Err(e) => anyhow::bail!("mcp: the client's first messages failed: {e}"),
        };
        server
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("mcp: {e}"))?;
        // The replies still on their way go out before the process ends.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
        Ok(())
    })
}

/// The shared state of every call: the roots and the analysed snapshots.
pub(crate) struct State {
    roots: Vec<PathBuf>,
    cache: Cache,
}

impl State {
    /// `path` (relative ones from the first root) as a file under one of the roots; a path
    /// outside them, or that cannot be resolved, is refused with a reason.
    fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        if path.is_empty() || path == "-" {
            return Err(format!(
                "{path:?}: give a file's path (stdin carries the protocol)"
            ));
        }
        let given = Path::new(path);
        let joined = match given.is_absolute() {
            true => given.to_path_buf(),
            false => self.roots[0].join(given),
        };
        let real = joined.canonicalize().map_err(|e| format!("{path}: {e}"))?;
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            return Err(format!(
                "{path}: outside the folders this server may read ({}); start it with --root to allow more",
                self.roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(real)
    }
}

#[derive(Clone)]
pub struct Server {
    state: Arc<State>,
    tool_router: ToolRouter<Self>,
}

/// Runs `work` on the blocking pool (analyses take seconds on big files) and makes its answer
/// the tool's: JSON text, or a tool error with the CLI's message.
async fn answer(
    state: &Arc<State>,
    work: impl FnOnce(&State) -> Result<serde_json::Value, String> + Send + 'static,
) -> Result<String, String> {
    let state = state.clone();
    let value = tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| format!("the analysis failed: {e}"))??;
    serde_json::to_string(&value).map_err(|e| e.to_string())
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReportArgs {
    /// Snapshot file (a `.pickle` from torch.cuda.memory._dump_snapshot, gzip or zstd too).
    pub path: String,
    /// Only this device (default: every device).
    pub device: Option<i64>,
    /// Entries kept of each list (live allocations, call sites, segments, OOMs); default 10.
    pub top: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DeviceArgs {
    /// Snapshot file.
    pub path: String,
    /// The device (default: the report's first: the one that ran out of memory, else the
    /// highest peak).
    pub device: Option<i64>,
    /// Call sites listed; default 10.
    pub top: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LiveAtArgs {
    /// Snapshot file.
    pub path: String,
    /// The device (default: the report's first).
    pub device: Option<i64>,
    /// After this trace event (its index in device_traces[device]); default: the peak.
    pub event: Option<u32>,
    /// Or: after the last event at or before this time (microseconds, as in the trace).
    pub time_us: Option<i64>,
    /// Call sites listed; default 20.
    pub top: Option<usize>,
    /// Skip this many call sites (the `next_cursor` of an earlier answer).
    pub cursor: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AllocationArgs {
    /// Snapshot file.
    pub path: String,
    /// The device (default: the report's first).
    pub device: Option<i64>,
    /// Every allocation made at this address (decimal, or hex with 0x).
    pub address: Option<String>,
    /// Or: the allocation made, freed or asked to be freed at this trace event.
    pub event: Option<u32>,
    /// Allocations listed; default 10.
    pub top: Option<usize>,
    /// Skip this many (the `next_cursor` of an earlier answer).
    pub cursor: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SegmentsAtArgs {
    /// Snapshot file.
    pub path: String,
    /// The device (default: the report's first).
    pub device: Option<i64>,
    /// After this trace event; default: the peak. Use `dump` for the dump's own state.
    pub event: Option<String>,
    /// Segments listed, most free bytes first; default 10.
    pub top: Option<usize>,
    /// Skip this many (the `next_cursor` of an earlier answer).
    pub cursor: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WhyOomArgs {
    /// Snapshot file.
    pub path: String,
    /// The device (default: the report's first).
    pub device: Option<i64>,
    /// Which OOM of the device, in trace order (default 0: the first).
    pub index: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DiffArgs {
    /// The baseline snapshot (or `snapscan report --format json` output).
    pub base: String,
    /// The snapshot compared with it.
    pub new: String,
    /// Only this device.
    pub device: Option<i64>,
    /// Call sites kept in the answer; default 10.
    pub top: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExplainArgs {
    /// Text holding a `torch.OutOfMemoryError` message (a log, a traceback).
    pub message: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CheckArgs {
    /// Snapshot file.
    pub path: String,
    /// Limit on the peak of requested bytes (20GiB, 512MB, 1.5e9).
    pub max_peak: Option<String>,
    /// Limit on reserved bytes.
    pub max_reserved: Option<String>,
    /// Limit on the fragmentation ratio (0.5 or 50%).
    pub max_fragmentation: Option<String>,
    /// Any OOM fails the check.
    pub fail_on_oom: Option<bool>,
    /// Only this device.
    pub device: Option<i64>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct WhatifArgs {
    /// Snapshot file.
    pub path: String,
    /// Only this device.
    pub device: Option<i64>,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax (expandable_segments:True).
    pub set: Option<String>,
    /// Bytes PyTorch may reserve (80GiB).
    pub capacity: Option<String>,
    /// A card by name (A100-80GB, H100-80GB, L4, ...).
    pub gpu: Option<String>,
    /// CATEGORY=FACTOR (batch=0.5, activations=0.5, kv_cache=0.25).
    #[serde(default)]
    pub scale: Vec<String>,
    /// Call sites (as the report names them) or globs whose requests are removed.
    #[serde(default)]
    pub drop: Vec<String>,
    /// `8bit` or `paged`.
    pub optimizer: Option<String>,
    /// Bisect for the largest batch factor (or smallest capacity) that fits.
    #[serde(default)]
    pub search: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct QueryArgs {
    /// A database from `snapscan sql`, or a snapshot (its database is built once and kept).
    pub path: String,
    /// One SQL statement that reads (the schema: docs/sql-schema.md; `SELECT name FROM
    /// sqlite_master` lists the tables).
    pub sql: String,
    /// Rows returned at most; default 100.
    pub limit: Option<usize>,
}

#[tool_router]
impl Server {
    pub fn new(settings: Settings) -> Server {
        Server {
            state: Arc::new(State {
                roots: settings.roots,
                cache: Cache::new(settings.memory_budget),
            }),
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "The snapscan JSON report of a PyTorch CUDA memory snapshot: OOM verdict, peak (requested, allocated, reserved) with its phase, what was alive at the peak by call site, what held it open, fragmentation, phases, steps and advice, per device. Lists are cut to `top` entries (schema: snapscan's docs/json-schema.md)."
    )]
    async fn report(&self, Parameters(args): Parameters<ReportArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::report(s, &args)).await
    }

    #[tool(
        description = "The peak of one device: requested, allocated and reserved bytes, the event and phase, the categories (weights, activations, gradients, optimizer state...) and the largest call sites alive at that moment."
    )]
    async fn peak(&self, Parameters(args): Parameters<DeviceArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::peak(s, &args)).await
    }

    #[tool(
        description = "What was alive after a given trace event (or time, default the peak), grouped by call site, largest first, with each site's stack; `next_cursor` pages through the rest."
    )]
    async fn live_at(&self, Parameters(args): Parameters<LiveAtArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::live_at(s, &args)).await
    }

    #[tool(
        description = "One allocation's life, found by address (every allocation made there) or by trace event: sizes, when it was made and freed, stream, category, phase, call site and stack, the user's annotations."
    )]
    async fn allocation(
        &self,
        Parameters(args): Parameters<AllocationArgs>,
    ) -> Result<String, String> {
        answer(&self.state, move |s| answers::allocation(s, &args)).await
    }

    #[tool(
        description = "The caching allocator's segments after a trace event (default the peak, or `dump`): reserved, allocated and free bytes, holes and the largest hole per segment, most free first, with the device's totals."
    )]
    async fn segments_at(
        &self,
        Parameters(args): Parameters<SegmentsAtArgs>,
    ) -> Result<String, String> {
        answer(&self.state, move |s| answers::segments_at(s, &args)).await
    }

    #[tool(
        description = "Why an OOM happened: the request, free and reserved bytes, the largest free block in the request's pool, the verdict (fragmentation or not enough memory), the phase, the failing call site, what was alive by call site, and the allocator model's reasons (which live blocks pinned the hole that would have fitted)."
    )]
    async fn why_oom(&self, Parameters(args): Parameters<WhyOomArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::why_oom(s, &args)).await
    }

    #[tool(
        description = "Compares two runs (snapshots or JSON reports): peaks, reserved bytes, OOMs and the call sites that grew or shrank at the peak, as `snapscan diff --format json` gives them."
    )]
    async fn diff(&self, Parameters(args): Parameters<DiffArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::diff(s, &args)).await
    }

    #[tool(
        description = "Reads a torch.OutOfMemoryError message (no snapshot needed): what was asked for, the GPU's capacity and free bytes, allocated against reserved, whether it is fragmentation, and what to try first."
    )]
    async fn explain_message(
        &self,
        Parameters(args): Parameters<ExplainArgs>,
    ) -> Result<String, String> {
        answer(&self.state, move |_| answers::explain_message(&args)).await
    }

    #[tool(
        description = "Memory budgets, as `snapscan check` checks them in CI: max peak, max reserved, max fragmentation, fail on OOM. Says which budget was crossed, by how much."
    )]
    async fn check(&self, Parameters(args): Parameters<CheckArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::check(s, &args)).await
    }

    #[tool(
        description = "Would a change have fitted? Replays the run's requests through the caching allocator model under other settings (expandable_segments:True), another capacity or card, with categories scaled (batch=0.5) or call sites removed, and gives the peaks and OOMs beside the real run's."
    )]
    async fn whatif(&self, Parameters(args): Parameters<WhatifArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::whatif(s, &args)).await
    }

    #[tool(
        description = "A read-only SQL query over a snapshot's tables (files, devices, frames, stacks, stack_frames, allocations, events, segments, blocks, ooms, phases, annotations) or a database written by `snapscan sql`. An allocation is alive after event E when (alloc_event IS NULL OR alloc_event <= E) AND (free_event IS NULL OR free_event > E)."
    )]
    async fn query(&self, Parameters(args): Parameters<QueryArgs>) -> Result<String, String> {
        answer(&self.state, move |s| answers::query(s, &args)).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new(
                "snapscan",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "snapscan answers questions about PyTorch CUDA memory snapshots \
             (torch.cuda.memory._dump_snapshot): start with `report` or `why_oom`, then \
             `live_at`, `allocation` and `segments_at` for details, `whatif` to test a fix, \
             `query` for anything else in SQL. Sizes are bytes; events are trace indices.",
            )
    }
}
