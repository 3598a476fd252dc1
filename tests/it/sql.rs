//! `snapscan sql` and `snapscan query`: the ten example queries of docs/sql-schema.md, run on
//! real snapshots, agree with the report; the database is read-only to queries.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use snapscan::analysis::report::{analyse_device, file_report, ReportOptions};
use snapscan::snapshot::{self, Action, LoadedSnapshot};
use snapscan::store::{self, query};

use crate::common::{fixture, root, snapscan};

/// The named queries of docs/sql-schema.md (`### N. name: …` then a ```sql block).
fn documented_queries() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(root().join("docs/sql-schema.md")).expect("doc");
    let mut out = BTreeMap::new();
    let mut name = None;
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if let Some(h) = line.strip_prefix("### ") {
            let (_, rest) = h.split_once(". ").expect("numbered heading");
            name = Some(rest.split(':').next().unwrap().trim().to_owned());
        } else if line.trim() == "```sql" {
            let sql: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            let n = name.take().expect("a heading before each query");
            out.insert(n, sql.join("\n"));
        }
    }
    out
}

fn database(files: &[LoadedSnapshot]) -> rusqlite::Connection {
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    store::fill(&mut conn, files, None).expect("store");
    query::lock_down(&mut conn).unwrap();
    conn
}

fn ask(conn: &mut rusqlite::Connection, sql: &str) -> Vec<Vec<Value>> {
    let answer = query::run(conn, sql, 100_000, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    answer.rows
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

const FIXTURES: [&str; 6] = [
    "real/ZidongLiu__DeComFL__memory.pickle",
    "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    "real/volcengine__verl__mem_mempools.pickle",
    "captured/oom_backward.pickle",
    "captured/fragmentation_oom.pickle",
    "torch215/training-2026.pickle",
];

#[test]
fn the_ten_documented_queries_agree_with_the_report_on_real_snapshots() {
    let queries = documented_queries();
    assert_eq!(queries.len(), 10, "{:?}", queries.keys());
    let mut checked_steps = 0;
    let mut checked_ooms = 0;
    for rel in FIXTURES {
        let loaded = snapshot::load(&fixture(rel)).unwrap();
        let report = file_report(&loaded, &ReportOptions::default());
        let d = &report.devices[0];
        let analysed = analyse_device(&loaded.snapshot, d.device, &ReportOptions::default());
        let replay = &analysed.parts.replay;
        let mut conn = database(std::slice::from_ref(&loaded));
        let q = |name: &str| queries[name].as_str();

        // 1. The live set at the peak: every site with a stack has the report's bytes and
        // count, and all of them sum to the peak.
        let rows = ask(&mut conn, q("live-at-peak"));
        let by_site: BTreeMap<&str, (u64, u64)> = d
            .live_at_peak_by_call_site
            .iter()
            .map(|s| (s.call_site.as_str(), (s.bytes, s.count)))
            .collect();
        let mut total = 0;
        for r in &rows {
            let site = r[0].as_str().unwrap();
            total += int(&r[2]);
            if !site.starts_with('<') && by_site.contains_key(site) {
                assert_eq!(
                    by_site[site],
                    (int(&r[2]) as u64, int(&r[1]) as u64),
                    "{rel}: {site}"
                );
            }
        }
        if rows.len() < 20 {
            assert_eq!(total, d.peak.requested_bytes, "{rel}: live at peak");
        }
        let top_with_stack = rows
            .iter()
            .find(|r| !r[0].as_str().unwrap().starts_with('<'));
        let report_top = d
            .live_at_peak_by_call_site
            .iter()
            .find(|s| !s.call_site.starts_with('<'));
        if let (Some(r), Some(s)) = (top_with_stack, report_top) {
            assert_eq!(int(&r[2]) as u64, s.bytes, "{rel}: the largest site");
        }

        // 2. Categories at the peak.
        let rows = ask(&mut conn, q("categories-at-peak"));
        let sql_categories: BTreeMap<String, u64> = rows
            .iter()
            .map(|r| (r[0].as_str().unwrap().to_owned(), int(&r[1]) as u64))
            .filter(|(_, b)| *b > 0)
            .collect();
        let report_categories: BTreeMap<String, u64> = d
            .categories_at_peak
            .iter()
            .filter(|(_, b)| **b > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        assert_eq!(sql_categories, report_categories, "{rel}: categories");

        // 3. The level at the start of each step.
        let rows = ask(&mut conn, q("step-start"));
        let sql_steps: Vec<(i64, i64)> = rows.iter().map(|r| (int(&r[0]), int(&r[1]))).collect();
        let report_steps: Vec<(i64, i64)> = d
            .steps
            .iter()
            .filter(|s| s.start_requested_bytes > 0)
            .map(|s| (s.step as i64, s.start_requested_bytes))
            .collect();
        assert_eq!(sql_steps, report_steps, "{rel}: step starts");
        checked_steps += report_steps.len();

        // 4. The largest allocation born in the backward.
        let rows = ask(&mut conn, q("largest-in-backward"));
        let largest = replay
            .allocations
            .births()
            .filter(|b| analysed.parts.phases.at(Some(b.born)).name() == "backward")
            .map(|b| b.requested_bytes)
            .max();
        assert_eq!(
            rows.first().map(|r| int(&r[0]) as u64),
            largest,
            "{rel}: backward"
        );

        // 5. Never freed: born in the window, alive at the end.
        let rows = ask(&mut conn, q("never-freed"));
        let never_freed: u64 = replay
            .allocations
            .births()
            .filter(|b| b.free_event.is_none())
            .map(|b| b.requested_bytes)
            .sum();
        let sql_sum: i64 = rows.iter().map(|r| int(&r[2])).sum();
        if rows.len() < 20 {
            assert_eq!(sql_sum as u64, never_freed, "{rel}: never freed");
        }

        // 6. The OOMs: one row per `oom` entry, the report's figures on those it describes.
        let rows = ask(&mut conn, q("ooms"));
        let entries = loaded
            .snapshot
            .trace(d.device)
            .iter()
            .filter(|e| e.action == Action::Oom)
            .count();
        assert_eq!(rows.len(), entries, "{rel}: ooms");
        for o in &d.oom {
            let r = rows
                .iter()
                .find(|r| int(&r[2]) == o.event_index as i64)
                .expect("the report's OOM is a row");
            assert_eq!(int(&r[3]) as u64, o.requested_bytes);
            assert_eq!(r[5].as_str(), Some(o.phase.as_str()));
            assert_eq!(r[6].as_str(), Some(o.verdict.as_str()));
            checked_ooms += 1;
        }

        // 7. Free bytes at the dump: the most free segment, as the dump has it.
        let rows = ask(&mut conn, q("free-at-dump"));
        let most_free = loaded
            .snapshot
            .segments_of(d.device)
            .map(|s| s.total_size - s.allocated_size)
            .max();
        assert_eq!(
            rows.first().map(|r| int(&r[3]) as u64),
            most_free,
            "{rel}: free"
        );
        let sql_free: i64 = rows.iter().map(|r| int(&r[3])).sum();
        if rows.len() < 20 {
            assert_eq!(
                sql_free as u64,
                d.final_state.reserved_bytes - d.final_state.allocated_bytes,
                "{rel}: free at dump"
            );
        }

        // 9. Alive after the first segment_alloc: the report's requested curve there.
        let rows = ask(&mut conn, q("alive-at-event"));
        let first = loaded
            .snapshot
            .trace(d.device)
            .iter()
            .position(|e| e.action == Action::SegmentAlloc);
        match first {
            Some(e) => assert_eq!(
                rows[0][0].as_i64().unwrap_or(0),
                replay.requested.at(Some(e as u32)),
                "{rel}: alive at event {e}"
            ),
            None => assert!(rows[0][0].is_null()),
        }

        // 10. The stack of the largest allocation alive at the peak that has one.
        let rows = ask(&mut conn, q("stack-of-largest"));
        let mut live: Vec<_> = replay
            .live_map(d.peak.event_index, |a| a)
            .into_iter()
            .filter(|a| a.stack != snapshot::StackId::EMPTY)
            .collect();
        live.sort_by(|a, b| {
            b.requested_bytes
                .cmp(&a.requested_bytes)
                .then(a.address.cmp(&b.address))
        });
        match live.first() {
            Some(a) => {
                let interner = &loaded.snapshot.interner;
                let names: Vec<&str> = interner
                    .get_stack(a.stack)
                    .iter()
                    .map(|&f| interner.get_text(interner.get_frame(f).name))
                    .collect();
                let sql_names: Vec<&str> = rows.iter().map(|r| r[1].as_str().unwrap()).collect();
                assert_eq!(sql_names, names, "{rel}: stack of the largest");
            }
            None => assert!(rows.is_empty()),
        }
    }
    assert!(checked_steps >= 5, "steps checked: {checked_steps}");
    assert!(checked_ooms >= 2, "OOMs checked: {checked_ooms}");
}

#[test]
fn ranks_go_into_one_database_and_one_query_compares_them() {
    let dir = tempfile_dir("ranks");
    let a = dir.join("rank0.pickle");
    let b = dir.join("rank1.pickle");
    std::fs::copy(
        fixture("real/MAGMA27__assignment2-systems__memory_snapshot.pickle"),
        &a,
    )
    .unwrap();
    std::fs::copy(fixture("captured/oom_backward.pickle"), &b).unwrap();
    let db = dir.join("job.db");
    snapscan()
        .args([
            "sql",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "-o",
            db.to_str().unwrap(),
        ])
        .assert()
        .success();
    let ranks = &documented_queries()["ranks"];
    let out = query_ok(&[db.to_str().unwrap(), ranks, "--format", "json"]);
    let answer: Value = serde_json::from_str(&out).unwrap();
    let rows = answer["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (path, rank) in [(&a, 0), (&b, 1)] {
        let loaded = snapshot::load(path).unwrap();
        let report = file_report(&loaded, &ReportOptions::default());
        let row = rows.iter().find(|r| r[0] == rank).expect("a row per rank");
        assert_eq!(row[3], report.devices[0].peak.requested_bytes);
        assert_eq!(row[4], report.devices[0].peak_reserved.bytes);
    }
    // Highest peak first.
    assert!(rows[0][3].as_i64() >= rows[1][3].as_i64());
    // A second write to the same path is refused, the database left as it was.
    snapscan()
        .args(["sql", a.to_str().unwrap(), "-o", db.to_str().unwrap()])
        .assert()
        .failure()
        .stderr(predicates::str::contains("exists"));
}

#[test]
fn queries_cannot_write_attach_or_run_forever() {
    let dir = tempfile_dir("readonly");
    let db = dir.join("snap.db");
    let snap = fixture("captured/oom_backward.pickle");
    snapscan()
        .args(["sql", snap.to_str().unwrap(), "-o", db.to_str().unwrap()])
        .assert()
        .success();
    let refused = [
        "DELETE FROM allocations",
        "DROP TABLE events",
        "INSERT INTO meta VALUES ('x', 'y')",
        "CREATE TABLE t (x)",
        "ATTACH DATABASE 'other.db' AS other",
        "PRAGMA query_only = OFF",
        "PRAGMA writable_schema = 1",
        "SELECT load_extension('x')",
    ];
    for sql in refused {
        let out = snapscan()
            .args(["query", db.to_str().unwrap(), sql])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{sql} was not refused");
        assert!(!dir.join("other.db").exists());
    }
    let rows: i64 = {
        let conn = query::open(&db).unwrap();
        conn.query_row("SELECT COUNT(*) FROM allocations", [], |r| r.get(0))
            .unwrap()
    };
    assert!(rows > 0, "the refused statements changed nothing");
    // Reading the schema is allowed.
    let out = query_ok(&[db.to_str().unwrap(), "PRAGMA table_info(allocations)"]);
    assert!(out.contains("requested_bytes"));
    // A query that would never end is stopped at its time limit.
    let out = snapscan()
        .args([
            "query",
            db.to_str().unwrap(),
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n",
            "--timeout",
            "1",
        ])
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("time limit"));
    // A file that is not a database, and not a snapshot, is named in the error.
    let junk = dir.join("junk.db");
    std::fs::write(&junk, b"SQLite format 3\0 and then nothing useful").unwrap();
    let out = snapscan()
        .args(["query", junk.to_str().unwrap(), "SELECT 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("junk.db"));
}

#[test]
fn a_snapshot_can_be_queried_directly_and_cells_cannot_forge_the_terminal_or_a_spreadsheet() {
    let snap = fixture("torch215/training-2026.pickle");
    let text = query_ok(&[
        snap.to_str().unwrap(),
        "SELECT annotation FROM allocations WHERE annotation IS NOT NULL",
    ]);
    assert!(text.contains("(1 row)") || text.contains("rows)"), "{text}");
    let answer = query::Answer {
        columns: vec!["x".into()],
        rows: vec![
            vec![Value::from("=HYPERLINK(\"http://x\")")],
            vec![Value::from("\u{1b}]8;;http://x\u{7}click")],
            vec![Value::from(-12)],
        ],
        truncated: false,
    };
    let csv = query::csv(&answer);
    assert!(csv.contains("\"'=HYPERLINK(\"\"http://x\"\")\""), "{csv}");
    assert!(csv.contains("\r\n-12\r\n"), "{csv}");
    assert!(!query::text(&answer).contains('\u{1b}'));
}

/// `snapscan query ARGS…`, which must succeed: its stdout.
fn query_ok(args: &[&str]) -> String {
    let out = snapscan().arg("query").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-sql-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
