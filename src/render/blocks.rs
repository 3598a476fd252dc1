//! A small document model (title, headings, paragraphs, tables) rendered as terminal text or as
//! Markdown, for the `check`, `diff` and `merge` outputs: both forms always say the same thing.

use std::fmt::Write;

use super::safe;
use super::style::{paint, Tone};

/// One table cell: its text and how it should stand out on a colour terminal.
#[derive(Clone, Debug)]
pub struct Cell {
    pub text: String,
    pub tone: Option<Tone>,
}

impl Cell {
    pub fn toned(text: impl Into<String>, tone: Option<Tone>) -> Cell {
        Cell {
            text: text.into(),
            tone,
        }
    }
}

impl<T: Into<String>> From<T> for Cell {
    fn from(text: T) -> Cell {
        Cell {
            text: text.into(),
            tone: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Column {
    pub name: &'static str,
    /// Right-aligned (numbers).
    pub right: bool,
    /// Shown as `code` in Markdown (paths, call sites).
    pub code: bool,
}

/// A left-aligned column.
pub fn left(name: &'static str) -> Column {
    Column {
        name,
        right: false,
        code: false,
    }
}

/// A right-aligned (number) column.
pub fn right(name: &'static str) -> Column {
    Column {
        name,
        right: true,
        code: false,
    }
}

/// A left-aligned column shown as code in Markdown.
pub fn code(name: &'static str) -> Column {
    Column {
        name,
        right: false,
        code: true,
    }
}

#[derive(Clone, Debug)]
pub enum Block {
    /// The document's title (first line in text, `##` in Markdown).
    Title(String, Option<Tone>),
    Heading(String),
    Para(String, Option<Tone>),
    Table {
        title: Option<String>,
        columns: Vec<Column>,
        rows: Vec<Vec<Cell>>,
    },
}

impl Block {
    /// The block as a terminal shows it: the untrusted strings in it unmarked, every control
    /// character as a visible escape ([`safe::text`]).
    fn for_terminal(&self) -> Block {
        let t = |s: &str| safe::text(s).into_owned();
        match self {
            Block::Title(s, tone) => Block::Title(t(s), *tone),
            Block::Heading(h) => Block::Heading(t(h)),
            Block::Para(p, tone) => Block::Para(t(p), *tone),
            Block::Table {
                title,
                columns,
                rows,
            } => Block::Table {
                title: title.as_deref().map(t),
                columns: columns.clone(),
                rows: rows
                    .iter()
                    .map(|r| r.iter().map(|c| Cell::toned(t(&c.text), c.tone)).collect())
                    .collect(),
            },
        }
    }
}

/// Terminal text; colour escapes only when `color`.
pub fn text(blocks: &[Block], color: bool) -> String {
    let mut out = String::new();
    for block in blocks.iter().map(Block::for_terminal) {
        let block = &block;
        match block {
            Block::Title(t, tone) => {
                let _ = writeln!(out, "{}", paint(t, tone.unwrap_or(Tone::Strong), color));
            }
            Block::Heading(h) => {
                let _ = writeln!(out, "\n{}", paint(&format!("== {h}"), Tone::Strong, color));
            }
            Block::Para(p, tone) => {
                let _ = writeln!(
                    out,
                    "{}",
                    match tone {
                        Some(t) => paint(p, *t, color),
                        None => p.clone(),
                    }
                );
            }
            Block::Table {
                title,
                columns,
                rows,
            } => {
                if !out.is_empty() {
                    out.push('\n');
                }
                if let Some(t) = title {
                    let _ = writeln!(out, "{t}:");
                }
                if rows.is_empty() {
                    let _ = writeln!(out, "  (none)");
                    continue;
                }
                let mut widths: Vec<usize> =
                    columns.iter().map(|c| c.name.chars().count()).collect();
                for r in rows {
                    for (w, c) in widths.iter_mut().zip(r) {
                        *w = (*w).max(c.text.chars().count());
                    }
                }
                let line = |cells: Vec<(String, Option<Tone>)>| {
                    let mut s = String::from(" ");
                    let last = cells.len().saturating_sub(1);
                    for (i, (c, tone)) in cells.into_iter().enumerate() {
                        s.push(' ');
                        let pad = " ".repeat(widths[i].saturating_sub(c.chars().count()));
                        let painted = match tone {
                            Some(t) => paint(&c, t, color),
                            None => c,
                        };
                        if columns[i].right {
                            s.push_str(&pad);
                            s.push_str(&painted);
                        } else {
                            s.push_str(&painted);
                            if i != last {
                                s.push_str(&pad);
                            }
                        }
                    }
                    s
                };
                let _ = writeln!(
                    out,
                    "{}",
                    line(columns.iter().map(|c| (c.name.to_owned(), None)).collect())
                );
                for r in rows {
                    let _ = writeln!(
                        out,
                        "{}",
                        line(r.iter().map(|c| (c.text.clone(), c.tone)).collect())
                    );
                }
            }
        }
    }
    out
}

/// GitHub-flavoured Markdown, ready to paste into a PR comment.
pub fn markdown(blocks: &[Block]) -> String {
    let mut out = String::new();
    for block in blocks {
        match block {
            Block::Title(t, _) => {
                let _ = writeln!(out, "## {}\n", safe::markdown(t, false));
            }
            Block::Heading(h) => {
                let _ = writeln!(out, "### {}\n", safe::markdown(h, false));
            }
            Block::Para(p, tone) => match tone {
                Some(Tone::Bad) | Some(Tone::Strong) => {
                    let _ = writeln!(out, "**{}**\n", safe::markdown(p.trim(), false));
                }
                _ => {
                    let _ = writeln!(out, "{}\n", safe::markdown(p, false));
                }
            },
            Block::Table {
                title,
                columns,
                rows,
            } => {
                if let Some(t) = title {
                    let _ = writeln!(out, "**{}**\n", safe::markdown(t, false));
                }
                if rows.is_empty() {
                    out.push_str("(none)\n\n");
                    continue;
                }
                let names: Vec<&str> = columns.iter().map(|c| c.name).collect();
                let _ = writeln!(out, "| {} |", names.join(" | "));
                let aligns: Vec<&str> = columns
                    .iter()
                    .map(|c| if c.right { "---:" } else { "---" })
                    .collect();
                let _ = writeln!(out, "| {} |", aligns.join(" | "));
                for r in rows {
                    let cells: Vec<String> = r
                        .iter()
                        .zip(columns)
                        .map(|(c, col)| {
                            if col.code && !safe::has_names(&c.text) {
                                safe::md_code(&c.text, true)
                            } else {
                                safe::markdown(&c.text, true)
                            }
                        })
                        .collect();
                    let _ = writeln!(out, "| {} |", cells.join(" | "));
                }
                out.push('\n');
            }
        }
    }
    out
}
