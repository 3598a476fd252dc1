//! `snapscan explain` as text (terminal) and Markdown (bug reports, PR comments).

use std::fmt::Write;

use crate::explain::{format_size, Explain, OomMessage};

/// The figures of a message that were printed, as (label, bytes).
fn figures(m: &OomMessage) -> Vec<(&'static str, u64)> {
    let mut rows = vec![("requested", m.requested_bytes)];
    let optional = [
        ("capacity", m.capacity_bytes),
        ("free", m.free_bytes),
        ("in use by this process", m.process_in_use_bytes),
        ("allocated by PyTorch", m.allocated_bytes),
        ("  in private pools", m.private_pools_bytes),
        ("reserved by PyTorch", m.reserved_bytes),
        ("reserved but unallocated", m.reserved_unallocated_bytes),
        ("allowed (memory fraction)", m.allowed_bytes),
    ];
    rows.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    rows
}

/// `line 5, GPU 0` (with `word` for "line").
fn place(m: &OomMessage, word: &str) -> String {
    match m.gpu {
        Some(g) => format!("{word} {}, GPU {g}", m.line),
        None => format!("{word} {}", m.line),
    }
}

fn lines_read(n: u64) -> String {
    if n == 1 {
        "1 line read".to_owned()
    } else {
        format!("{n} lines read")
    }
}

fn processes(m: &OomMessage) -> Option<String> {
    if m.process_entries.is_empty() {
        return None;
    }
    let list: Vec<String> = m
        .process_entries
        .iter()
        .map(|e| match e.bytes {
            Some(b) => format!("PID {} {}", e.pid, format_size(b)),
            None => format!("PID {}", e.pid),
        })
        .collect();
    Some(list.join(", "))
}

fn omitted_line(e: &Explain) -> Option<String> {
    (e.messages_omitted > 0).then(|| {
        format!(
            "{} more messages were not kept (only the first {} are shown)",
            e.messages_omitted,
            e.messages.len()
        )
    })
}

/// Plain text: one block per message, verdict first, then figures, then first actions.
pub fn text(e: &Explain) -> String {
    let mut out = String::new();
    if e.messages.is_empty() {
        let _ = writeln!(
            out,
            "no CUDA out-of-memory message found ({})",
            lines_read(e.lines)
        );
        return out;
    }
    for (i, m) in e.messages.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "{}  ({})", m.verdict.as_str(), place(m, "line"));
        let _ = writeln!(out, "  {}.", m.reason);
        out.push('\n');
        for (label, bytes) in figures(m) {
            let _ = writeln!(out, "  {label:<26} {:>18}", format_size(bytes));
        }
        if let Some(p) = processes(m) {
            let _ = writeln!(out, "  {:<26} {p}", "process entries");
        }
        for note in &m.notes {
            let _ = writeln!(out, "  note: {note}.");
        }
        if !m.advice.is_empty() {
            let _ = writeln!(out, "\n  first actions:");
            for (k, a) in m.advice.iter().enumerate() {
                let _ = writeln!(out, "  {}. {}.", k + 1, a.action);
                let _ = writeln!(out, "     why: {}.", a.reason);
            }
        }
    }
    if let Some(line) = omitted_line(e) {
        let _ = writeln!(out, "\n{line}.");
    }
    // The log is untrusted: none of its characters reaches the terminal raw.
    super::safe::lines(&out).into_owned()
}

/// Markdown: one section per message with a figures table and a numbered list of actions.
pub fn markdown(e: &Explain) -> String {
    let mut out = String::from("# CUDA out-of-memory messages\n\n");
    if e.messages.is_empty() {
        let _ = writeln!(
            out,
            "No CUDA out-of-memory message found ({}).",
            lines_read(e.lines)
        );
        return out;
    }
    for m in &e.messages {
        let _ = writeln!(out, "## {}: {}\n", place(m, "Line"), m.verdict.as_str());
        let _ = writeln!(out, "**{}** — {}.\n", m.verdict.as_str(), m.reason);
        if !m.text.is_empty() {
            let lines: Vec<String> = m.text.lines().map(str::to_owned).collect();
            let (f, lines) = super::safe::md_fence(&lines);
            let _ = writeln!(out, "{f}text\n{}\n{f}\n", lines.join("\n"));
        }
        out.push_str("| figure | size | bytes |\n|---|---:|---:|\n");
        for (label, bytes) in figures(m) {
            let _ = writeln!(
                out,
                "| {} | {} | {bytes} |",
                label.trim(),
                format_size(bytes)
            );
        }
        out.push('\n');
        if let Some(p) = processes(m) {
            let _ = writeln!(out, "Process entries: {p}.\n");
        }
        for note in &m.notes {
            let _ = writeln!(out, "> Note: {note}.\n");
        }
        if !m.advice.is_empty() {
            out.push_str("**First actions**\n\n");
            for (k, a) in m.advice.iter().enumerate() {
                let _ = writeln!(out, "{}. **{}.** {}.", k + 1, a.action, a.reason);
            }
            out.push('\n');
        }
    }
    if let Some(line) = omitted_line(e) {
        let _ = writeln!(out, "{line}.");
    }
    super::safe::lines(&out).into_owned()
}
