//! One read-only question to a store (`snapscan query`, the MCP `query` tool). The database is
//! opened read-only with `query_only` set, no database can be attached, the schema's own SQL is
//! not trusted, and a query that runs past its time is stopped: a database handed over with a
//! bug report is as untrusted as a pickle.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{types::ValueRef, Connection, OpenFlags};

/// A query's answer: the columns' names and the rows, each cell a JSON value (integers,
/// reals, text, null; a blob as its length).
#[derive(Debug, Default, serde::Serialize)]
pub struct Answer {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
    /// Rows past `limit` that were not read (`true` when the answer was cut).
    pub truncated: bool,
}

/// Opens a store for reading only.
pub fn open(path: &Path) -> anyhow::Result<Connection> {
    let mut conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| anyhow::anyhow!("{}: cannot open the database: {e}", path.display()))?;
    lock_down(&mut conn).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    // A file that is not a database says so on first read, not at open.
    conn.query_row(
        "SELECT value FROM meta WHERE key = 'schema_version'",
        [],
        |r| r.get::<_, String>(0),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "{}: not a snapscan database (no meta table with a schema_version: {e})",
            path.display()
        )
    })?;
    Ok(conn)
}

/// What every connection that answers queries gets: no writes, no ATTACH, no PRAGMA that sets
/// anything, no trusted schema SQL, defensive mode, and no value longer than 256 MB.
pub fn lock_down(conn: &mut Connection) -> rusqlite::Result<()> {
    use rusqlite::config::DbConfig;
    use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
    use rusqlite::limits::Limit;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    conn.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0)?;
    conn.set_limit(Limit::SQLITE_LIMIT_LENGTH, 256 << 20)?;
    conn.execute_batch("PRAGMA query_only = ON;")?;
    // Decided as each statement is prepared: reading is allowed, and nothing else.
    conn.authorizer(Some(|ctx: AuthContext<'_>| match ctx.action {
        AuthAction::Select
        | AuthAction::Read { .. }
        | AuthAction::Function { .. }
        | AuthAction::Recursive => Authorization::Allow,
        AuthAction::Pragma {
            pragma_name,
            pragma_value,
        } if pragma_value.is_none() || READ_PRAGMAS.contains(&pragma_name) => Authorization::Allow,
        _ => Authorization::Deny,
    }))?;
    Ok(())
}

/// PRAGMAs that take an argument and only read (the schema's shape).
const READ_PRAGMAS: [&str; 6] = [
    "table_info",
    "table_xinfo",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
];

/// Runs one statement, reading at most `limit` rows, stopped after `time_limit`.
pub fn run(
    conn: &mut Connection,
    sql: &str,
    limit: usize,
    time_limit: Duration,
) -> anyhow::Result<Answer> {
    let deadline = Instant::now() + time_limit;
    // Called every 10,000 virtual-machine steps: a true return interrupts the query.
    conn.progress_handler(10_000, Some(move || Instant::now() > deadline))?;
    let answer = run_unguarded(conn, sql, limit);
    conn.progress_handler(0, None::<fn() -> bool>)?;
    answer.map_err(|e| match e {
        rusqlite::Error::SqliteFailure(f, _)
            if f.code == rusqlite::ErrorCode::OperationInterrupted =>
        {
            anyhow::anyhow!(
                "the query ran past its time limit ({} s) and was stopped",
                time_limit.as_secs_f64()
            )
        }
        e => anyhow::anyhow!("{e}"),
    })
}

fn run_unguarded(conn: &Connection, sql: &str, limit: usize) -> rusqlite::Result<Answer> {
    let mut statement = conn.prepare(sql)?;
    if !statement.readonly() {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("only queries that read are allowed (the database is opened read-only)".into()),
        ));
    }
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let width = columns.len();
    let mut rows_out = Vec::new();
    let mut truncated = false;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        if rows_out.len() == limit {
            truncated = true;
            break;
        }
        let mut cells = Vec::with_capacity(width);
        for i in 0..width {
            cells.push(match row.get_ref(i)? {
                ValueRef::Null => serde_json::Value::Null,
                ValueRef::Integer(v) => v.into(),
                ValueRef::Real(v) => serde_json::Number::from_f64(v)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
                ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned().into(),
                ValueRef::Blob(b) => format!("<blob of {} bytes>", b.len()).into(),
            });
        }
        rows_out.push(cells);
    }
    Ok(Answer {
        columns,
        rows: rows_out,
        truncated,
    })
}

fn cell_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => String::new(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Aligned columns for a terminal; every cell made safe to print (a snapshot's text may hold
/// terminal controls).
pub fn text(answer: &Answer) -> String {
    let cells: Vec<Vec<String>> = answer
        .rows
        .iter()
        .map(|r| {
            r.iter()
                .map(|c| crate::render::safe::term(&cell_text(c)).into_owned())
                .collect()
        })
        .collect();
    let header: Vec<String> = answer
        .columns
        .iter()
        .map(|c| crate::render::safe::term(c).into_owned())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &cells {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |r: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in r.iter().zip(&widths).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(c);
            if i + 1 < r.len() {
                s.push_str(&" ".repeat(w - c.chars().count()));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&header);
    for r in &cells {
        out.push_str(&line(r));
    }
    out.push_str(&format!(
        "({} row{}{})\n",
        cells.len(),
        if cells.len() == 1 { "" } else { "s" },
        if answer.truncated {
            "; more were left out: raise --limit"
        } else {
            ""
        }
    ));
    out
}

/// RFC 4180 CSV, a header line first. A cell that a spreadsheet would run as a formula
/// (`=`, `+`, `-`, `@` first) is quoted with a leading apostrophe.
pub fn csv(answer: &Answer) -> String {
    fn field(s: &str) -> String {
        let guarded = match s.chars().next() {
            Some('=' | '+' | '@' | '\t' | '\r') => format!("'{s}"),
            Some('-') if s.parse::<f64>().is_err() => format!("'{s}"),
            _ => s.to_owned(),
        };
        if guarded.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", guarded.replace('"', "\"\""))
        } else {
            guarded
        }
    }
    let mut out = String::new();
    let header: Vec<String> = answer.columns.iter().map(|c| field(c)).collect();
    out.push_str(&header.join(","));
    out.push_str("\r\n");
    for r in &answer.rows {
        let cells: Vec<String> = r.iter().map(|c| field(&cell_text(c))).collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out
}
