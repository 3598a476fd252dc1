//! The SQL store: a snapshot's rows in SQLite (`snapscan sql`), for the questions the report
//! does not ask. Every figure in it comes from the report's own analysis
//! ([`analysis::report::analyse_device`]): the allocations' lives are the report's replay,
//! their categories its categorizer, their phases its phases. Several files (the ranks of a
//! job) go into one database, told apart by `file_id` and `rank`. The schema is documented in
//! `docs/sql-schema.md`; [`SCHEMA_VERSION`] is in the `meta` table.

pub mod query;

use std::path::Path;

use rusqlite::{params, Connection, Statement};

use crate::analysis::{
    self,
    category::Categorizer,
    report::{DeviceAnalysis, ReportOptions},
};
use crate::snapshot::{Action, LoadedSnapshot, Segment, Snapshot, StackId, TextId, Trace};

/// Bumped when a table or column changes meaning or goes away (new ones may be added).
pub const SCHEMA_VERSION: u32 = 1;

const SCHEMA: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE files (
    file_id INTEGER PRIMARY KEY, path TEXT NOT NULL, rank INTEGER,
    decoded_bytes INTEGER NOT NULL, compression TEXT NOT NULL);
CREATE TABLE devices (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, events INTEGER NOT NULL,
    peak_requested_bytes INTEGER NOT NULL, peak_event INTEGER, peak_phase TEXT NOT NULL,
    peak_allocated_bytes INTEGER NOT NULL, peak_reserved_bytes INTEGER NOT NULL,
    reserved_at_dump_bytes INTEGER NOT NULL, allocated_at_dump_bytes INTEGER NOT NULL,
    ooms INTEGER NOT NULL,
    PRIMARY KEY (file_id, device));
CREATE TABLE frames (
    file_id INTEGER NOT NULL, frame_id INTEGER NOT NULL,
    name TEXT NOT NULL, filename TEXT NOT NULL, line INTEGER NOT NULL,
    PRIMARY KEY (file_id, frame_id));
CREATE TABLE stacks (
    file_id INTEGER NOT NULL, stack_id INTEGER NOT NULL, depth INTEGER NOT NULL,
    call_site TEXT, code TEXT, your_code TEXT, via TEXT,
    PRIMARY KEY (file_id, stack_id));
CREATE TABLE stack_frames (
    file_id INTEGER NOT NULL, stack_id INTEGER NOT NULL, position INTEGER NOT NULL,
    frame_id INTEGER NOT NULL,
    PRIMARY KEY (file_id, stack_id, position));
CREATE TABLE allocations (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, address INTEGER NOT NULL,
    requested_bytes INTEGER NOT NULL, block_bytes INTEGER NOT NULL,
    alloc_event INTEGER, alloc_time_us INTEGER,
    free_requested_event INTEGER, free_event INTEGER, free_time_us INTEGER,
    stream INTEGER NOT NULL, pool TEXT, stack_id INTEGER,
    category TEXT NOT NULL, confidence TEXT NOT NULL, phase TEXT NOT NULL, step INTEGER,
    origin TEXT NOT NULL, annotation TEXT);
CREATE TABLE events (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, event INTEGER NOT NULL,
    action TEXT NOT NULL, address INTEGER NOT NULL, size INTEGER NOT NULL,
    stream INTEGER NOT NULL, time_us INTEGER, stack_id INTEGER, pool TEXT,
    user_metadata TEXT);
CREATE TABLE segments (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, segment_id INTEGER NOT NULL,
    address INTEGER NOT NULL, total_bytes INTEGER NOT NULL, allocated_bytes INTEGER NOT NULL,
    active_bytes INTEGER NOT NULL, stream INTEGER NOT NULL, pool_kind TEXT NOT NULL,
    pool TEXT, expandable INTEGER NOT NULL, stack_id INTEGER,
    PRIMARY KEY (file_id, segment_id));
CREATE TABLE blocks (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, segment_id INTEGER NOT NULL,
    address INTEGER NOT NULL, size INTEGER NOT NULL, requested_bytes INTEGER NOT NULL,
    state TEXT NOT NULL, stack_id INTEGER);
CREATE TABLE ooms (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, event INTEGER NOT NULL,
    time_us INTEGER, requested_bytes INTEGER NOT NULL, device_free_bytes INTEGER,
    stream INTEGER NOT NULL, stack_id INTEGER,
    reserved_bytes INTEGER, allocated_bytes INTEGER, reserved_unallocated_bytes INTEGER,
    largest_free_block_bytes INTEGER, verdict TEXT, phase TEXT, call_site TEXT,
    PRIMARY KEY (file_id, device, event));
CREATE TABLE phases (
    file_id INTEGER NOT NULL, device INTEGER NOT NULL, first_event INTEGER NOT NULL,
    last_event INTEGER NOT NULL, phase TEXT NOT NULL, step INTEGER, source TEXT NOT NULL);
CREATE TABLE annotations (
    file_id INTEGER NOT NULL, device INTEGER, event INTEGER, time_us INTEGER,
    kind TEXT NOT NULL, stage TEXT, name TEXT NOT NULL, address INTEGER);
";

/// Made after the rows are in (one sort each, instead of a B-tree kept up to date per row).
/// Each costs about a second per two million rows to make, so only the questions users ask
/// most get one: what was alive at an event (by birth), the largest allocations (by size).
/// A question by call site reads the whole table, as a `GROUP BY` over it would anyway.
const INDEXES: &str = "
CREATE INDEX allocations_by_birth ON allocations (file_id, device, alloc_event);
CREATE INDEX allocations_by_size ON allocations (requested_bytes);
CREATE INDEX blocks_by_segment ON blocks (file_id, segment_id);
";

/// What `snapscan sql` wrote.
#[derive(Debug, Default, serde::Serialize)]
pub struct Written {
    pub files: u64,
    pub devices: u64,
    pub allocations: u64,
    pub events: u64,
    pub stacks: u64,
}

/// SQLite's INTEGER is signed 64-bit: a larger count (never in a real dump) is stored as the
/// largest it holds.
fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn stack_id(s: StackId) -> Option<i64> {
    (s != StackId::EMPTY).then_some(s.0 as i64)
}

fn pool_text(p: Option<(i64, i64)>) -> Option<String> {
    p.map(|(a, b)| format!("{a},{b}"))
}

/// The name serde gives a unit variant (the JSON report's spelling).
fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

/// Writes `files` into a new database at `path` (which must not exist: a store is written
/// once, whole). `device` keeps one device of each file.
pub fn write(
    path: &Path,
    files: &[LoadedSnapshot],
    device: Option<i64>,
) -> anyhow::Result<Written> {
    let mut conn = Connection::open(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot create the database: {e}", path.display()))?;
    fill(&mut conn, files, device)
        .map_err(|e| anyhow::anyhow!("{}: writing the database: {e}", path.display()))
}

/// Writes `files` into `conn` (an empty database).
pub fn fill(
    conn: &mut Connection,
    files: &[LoadedSnapshot],
    device: Option<i64>,
) -> rusqlite::Result<Written> {
    // Written once, start to end: a crash leaves a file to delete, not one to recover.
    conn.execute_batch(
        "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -262144;
         PRAGMA temp_store = MEMORY; PRAGMA threads = 4;",
    )?;
    let tx = conn.transaction()?;
    tx.execute_batch(SCHEMA)?;
    tx.execute(
        "INSERT INTO meta VALUES ('schema_version', ?1), ('snapscan_version', ?2)",
        params![SCHEMA_VERSION.to_string(), env!("CARGO_PKG_VERSION")],
    )?;
    let mut written = Written::default();
    let mut timer = crate::timing::Timer::new();
    for (file_id, loaded) in files.iter().enumerate() {
        let file_id = file_id as i64;
        let snapshot = &loaded.snapshot;
        tx.execute(
            "INSERT INTO files VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                file_id,
                loaded.name,
                analysis::report::rank_from_name(&loaded.name).map(int),
                int(loaded.decoded_bytes),
                serde_name(&loaded.compression),
            ],
        )?;
        written.files += 1;
        written.stacks += stacks(&tx, file_id, snapshot)?;
        // The report's lists capped as in its JSON: the rows come from the replay, and only
        // the device's and the OOMs' figures from the report, which a cap does not change
        // (uncapped, every allocation alive at the peak would be described one by one).
        let options = ReportOptions {
            device,
            list_limit: Some(crate::report::JSON_LIST_LIMIT),
            ..Default::default()
        };
        for d in snapshot.devices() {
            if device.is_some_and(|want| want != d) {
                continue;
            }
            let analysed = analysis::report::analyse_device(snapshot, d, &options);
            timer.lap("store: the report's analysis");
            let trace = snapshot.trace(d);
            device_row(&tx, file_id, &analysed)?;
            written.allocations += allocations(&tx, file_id, snapshot, &analysed)?;
            timer.lap("store: allocations");
            written.events += events(&tx, file_id, d, trace, snapshot)?;
            timer.lap("store: events");
            ooms(&tx, file_id, d, trace, &analysed)?;
            phases(&tx, file_id, d, &analysed)?;
            segments(&tx, file_id, snapshot.segments_of(d))?;
            written.devices += 1;
        }
        annotations(&tx, file_id, snapshot, device)?;
    }
    timer.lap("store: the rest");
    tx.execute_batch(INDEXES)?;
    tx.commit()?;
    timer.lap("store: indexes");
    // Statistics for the query planner from a sample of each index (a full ANALYZE reads
    // every row again).
    conn.execute_batch("PRAGMA analysis_limit = 1000; ANALYZE;")?;
    timer.lap("store: analyze");
    Ok(written)
}

fn stacks(tx: &Connection, file_id: i64, snapshot: &Snapshot) -> rusqlite::Result<u64> {
    let interner = &snapshot.interner;
    let mut frame = tx.prepare("INSERT INTO frames VALUES (?1, ?2, ?3, ?4, ?5)")?;
    for i in 0..interner.frame_count() {
        let f = interner.get_frame(crate::snapshot::FrameId(i as u32));
        frame.execute(params![
            file_id,
            i as i64,
            interner.get_text(f.name),
            interner.get_text(f.filename),
            f.line
        ])?;
    }
    let mut stack = tx.prepare("INSERT INTO stacks VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?;
    let mut member = tx.prepare("INSERT INTO stack_frames VALUES (?1, ?2, ?3, ?4)")?;
    let mut count = 0;
    // Stack 0 is the empty stack: rows name it with a NULL stack_id.
    for i in 1..interner.stack_count() {
        let id = StackId(i as u32);
        let frames = interner.get_stack(id);
        let path = analysis::callsite::code_path(interner, id);
        stack.execute(params![
            file_id,
            i as i64,
            frames.len() as i64,
            analysis::callsite::call_site(interner, id),
            path.class.map(|c| c.name()),
            path.your_code,
            path.via,
        ])?;
        for (position, f) in frames.iter().enumerate() {
            member.execute(params![file_id, i as i64, position as i64, f.0 as i64])?;
        }
        count += 1;
    }
    Ok(count)
}

fn device_row(tx: &Connection, file_id: i64, analysed: &DeviceAnalysis) -> rusqlite::Result<()> {
    let r = &analysed.report;
    let oom_count = r.oom.len() as u64 + r.oom_omitted.unwrap_or(0);
    tx.execute(
        "INSERT INTO devices VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            file_id,
            r.device,
            analysed.parts.replay.events as i64,
            r.peak.requested_bytes,
            // -1: the window's start, so that "alive after the peak" needs no NULL case.
            r.peak.event_index.map_or(-1, i64::from),
            r.peak.phase,
            r.peak_allocated.bytes,
            r.peak_reserved.bytes,
            int(r.final_state.reserved_bytes),
            int(r.final_state.allocated_bytes),
            int(oom_count),
        ],
    )?;
    Ok(())
}

/// Rows made on one thread and written on another: SQLite writes on one core, and making a
/// row (its category, phase, times) costs about as much as writing it.
fn pipelined<T: Send>(
    produce: impl FnOnce(&mut dyn FnMut(Vec<T>) -> bool) + Send,
    mut write: impl FnMut(T) -> rusqlite::Result<()>,
) -> rusqlite::Result<u64> {
    let (send, receive) = std::sync::mpsc::sync_channel::<Vec<T>>(4);
    std::thread::scope(|scope| {
        scope.spawn(move || produce(&mut |batch| send.send(batch).is_ok()));
        let mut count = 0;
        // On an error the receiver is dropped, and the producer's next send fails and stops it.
        for batch in receive {
            for row in batch {
                write(row)?;
                count += 1;
            }
        }
        Ok(count)
    })
}

/// Rows are made in batches of this many.
const BATCH: usize = 8192;

struct AllocationRow {
    a: crate::analysis::lifetimes::Allocation,
    alloc_time_us: Option<i64>,
    free_time_us: Option<i64>,
    pool: Option<(i64, i64)>,
    category: &'static str,
    confidence: &'static str,
    phase: &'static str,
    step: Option<u32>,
    annotation: Option<String>,
}

fn allocations(
    tx: &Connection,
    file_id: i64,
    snapshot: &Snapshot,
    analysed: &DeviceAnalysis,
) -> rusqlite::Result<u64> {
    let device = analysed.report.device;
    let trace = snapshot.trace(device);
    let phases = &analysed.parts.phases;
    let categorizer = Categorizer::new(snapshot, phases, &analysed.parts.replay);
    let has_pools = trace
        .distinct_combinations()
        .iter()
        .any(|c| c.pool_id.is_some());
    let row_of = |a: &crate::analysis::lifetimes::Allocation| {
        let (category, confidence) = categorizer.categorize(a);
        let born = a.alloc_event;
        let entry = |e: Option<u32>| e.and_then(|i| trace.get(i as usize));
        let birth = entry(born);
        let texts = categorizer.annotations.of_allocation(a);
        AllocationRow {
            a: *a,
            alloc_time_us: birth.and_then(|t| t.time_us),
            free_time_us: entry(a.free_event).and_then(|t| t.time_us),
            pool: birth.filter(|_| has_pools).and_then(|t| t.pool_id),
            category: category.name(),
            confidence: confidence.name(),
            phase: phases.at(born).name(),
            step: phases.step_at(born),
            annotation: (!texts.is_empty()).then(|| {
                texts
                    .iter()
                    .map(|&t| snapshot.interner.get_text(t))
                    .collect::<Vec<_>>()
                    .join("; ")
            }),
        }
    };
    let all = analysed.parts.replay.allocations.as_slice();
    let mut insert = tx.prepare(
        "INSERT INTO allocations VALUES
         (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    )?;
    pipelined(
        |send| {
            for chunk in all.chunks(BATCH) {
                if !send(chunk.iter().map(row_of).collect()) {
                    return;
                }
            }
        },
        |r: AllocationRow| {
            let a = &r.a;
            insert.execute(params![
                file_id,
                device,
                int(a.address),
                int(a.requested_bytes),
                int(a.block_bytes),
                a.alloc_event,
                r.alloc_time_us,
                a.free_requested_event,
                a.free_event,
                r.free_time_us,
                int(a.stream),
                pool_text(r.pool),
                stack_id(a.stack),
                r.category,
                r.confidence,
                r.phase,
                r.step,
                a.origin.name(),
                r.annotation,
            ])?;
            Ok(())
        },
    )
}

fn action_text(snapshot: &Snapshot, action: Action, raw: Option<TextId>) -> &str {
    match (action, raw) {
        (Action::Other, Some(t)) => snapshot.interner.get_text(t),
        _ => action.name(),
    }
}

fn events(
    tx: &Connection,
    file_id: i64,
    device: i64,
    trace: &Trace,
    snapshot: &Snapshot,
) -> rusqlite::Result<u64> {
    let mut insert: Statement =
        tx.prepare("INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)")?;
    let text = |t: Option<TextId>| t.map(|t| snapshot.interner.get_text(t));
    // Written as read: an entry costs little to read, and handing it to another thread more.
    for (i, e) in trace.iter().enumerate() {
        insert.execute(params![
            file_id,
            device,
            i as i64,
            action_text(snapshot, e.action, e.action_text),
            int(e.addr),
            int(e.size),
            int(e.stream),
            e.time_us,
            stack_id(e.frames),
            pool_text(e.pool_id),
            text(e.user_metadata),
        ])?;
    }
    Ok(trace.len() as u64)
}

fn ooms(
    tx: &Connection,
    file_id: i64,
    device: i64,
    trace: &Trace,
    analysed: &DeviceAnalysis,
) -> rusqlite::Result<()> {
    if !trace.may_have(Action::Oom) {
        return Ok(());
    }
    let described: rustc_hash::FxHashMap<u32, &crate::report::Oom> = analysed
        .report
        .oom
        .iter()
        .map(|o| (o.event_index, o))
        .collect();
    let mut insert = tx.prepare(
        "INSERT INTO ooms VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    for (i, e) in trace.iter().enumerate() {
        if e.action != Action::Oom {
            continue;
        }
        let o = described.get(&(i as u32));
        insert.execute(params![
            file_id,
            device,
            i as i64,
            e.time_us,
            int(e.size),
            e.device_free.map(int),
            int(e.stream),
            stack_id(e.frames),
            o.map(|o| int(o.reserved_bytes)),
            o.map(|o| int(o.allocated_bytes)),
            o.map(|o| int(o.reserved_unallocated_bytes)),
            o.map(|o| int(o.largest_free_block_bytes)),
            o.map(|o| o.verdict.as_str()),
            o.map(|o| o.phase.as_str()),
            o.and_then(|o| o.call_site.as_deref()),
        ])?;
    }
    Ok(())
}

fn phases(
    tx: &Connection,
    file_id: i64,
    device: i64,
    analysed: &DeviceAnalysis,
) -> rusqlite::Result<()> {
    let mut insert = tx.prepare("INSERT INTO phases VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")?;
    for iv in &analysed.parts.phases.intervals {
        insert.execute(params![
            file_id,
            device,
            iv.first_event,
            iv.last_event,
            iv.name.name(),
            iv.step,
            serde_name(&iv.source),
        ])?;
    }
    Ok(())
}

fn segments<'a>(
    tx: &Connection,
    file_id: i64,
    segments: impl Iterator<Item = &'a Segment>,
) -> rusqlite::Result<()> {
    let mut seg = tx.prepare(
        "INSERT INTO segments VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?;
    let mut block = tx.prepare("INSERT INTO blocks VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")?;
    // Numbered within the file: a segment's position among the file's segments.
    let next: i64 = tx.query_row(
        "SELECT COALESCE(MAX(segment_id) + 1, 0) FROM segments WHERE file_id = ?1",
        [file_id],
        |r| r.get(0),
    )?;
    for (i, s) in segments.enumerate() {
        let id = next + i as i64;
        seg.execute(params![
            file_id,
            s.device,
            id,
            int(s.address),
            int(s.total_size),
            int(s.allocated_size),
            int(s.active_size),
            int(s.stream),
            serde_name(&s.pool_kind),
            pool_text(s.pool_id),
            s.is_expandable,
            stack_id(s.frames),
        ])?;
        for b in &s.blocks {
            block.execute(params![
                file_id,
                s.device,
                id,
                int(b.address),
                int(b.size),
                int(b.requested_size),
                b.state.name(),
                stack_id(b.frames),
            ])?;
        }
    }
    Ok(())
}

fn annotations(
    tx: &Connection,
    file_id: i64,
    snapshot: &Snapshot,
    device: Option<i64>,
) -> rusqlite::Result<()> {
    let mut insert =
        tx.prepare("INSERT INTO annotations VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)")?;
    let text = |t: TextId| snapshot.interner.get_text(t);
    for a in &snapshot.annotations {
        if device.is_some_and(|want| a.device != Some(want)) {
            continue;
        }
        insert.execute(params![
            file_id,
            a.device,
            Option::<i64>::None,
            a.time_us,
            "range",
            text(a.stage),
            text(a.name),
            Option::<i64>::None,
        ])?;
    }
    for d in snapshot.devices() {
        if device.is_some_and(|want| want != d) {
            continue;
        }
        let trace = snapshot.trace(d);
        if !trace.may_have(Action::Annotate) {
            continue;
        }
        for (i, e) in trace.iter().enumerate() {
            if e.action != Action::Annotate {
                continue;
            }
            insert.execute(params![
                file_id,
                d,
                i as i64,
                e.time_us,
                "tensor",
                Option::<&str>::None,
                e.user_metadata.map(text).unwrap_or_default(),
                int(e.addr),
            ])?;
        }
    }
    Ok(())
}

/// Whether `path` starts like a SQLite database.
pub fn is_database(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|_| &head == b"SQLite format 3\0")
}

/// A connection that answers queries: the database at `path` read-only, or, for a snapshot,
/// its store built in memory and then locked the same way.
pub fn open_any(path: &Path) -> anyhow::Result<Connection> {
    if is_database(path) {
        return query::open(path);
    }
    let loaded = crate::snapshot::load(path)?;
    let mut conn = Connection::open_in_memory()?;
    fill(&mut conn, std::slice::from_ref(&loaded), None)
        .map_err(|e| anyhow::anyhow!("{}: building its database: {e}", loaded.name))?;
    query::lock_down(&mut conn)?;
    Ok(conn)
}
