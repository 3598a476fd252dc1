//! Strings that come from a snapshot, a log or a merged report (frame names, file names, paths,
//! messages) are untrusted: printed byte for byte they could drive the reader's terminal (clear
//! the screen, set the window title, write the clipboard, overwrite the verdict line, hide text
//! with bidi overrides) or, in Markdown, turn into images, links, headings and HTML in a PR
//! comment. Everything the text and Markdown outputs print goes through here.
//!
//! A renderer that builds prose marks each untrusted string with [`name`]. On a terminal the
//! marks go and the string shows as it is, with its control characters as visible escapes
//! (`\x1b`, `\u{202e}`, `\n`); in Markdown each marked string becomes a code span whose
//! backtick run is longer than any inside it, so nothing in it is read as Markdown.

use std::borrow::Cow;
use std::fmt::Write;

/// Start and end of a marked untrusted string inside rendered prose (private-use characters;
/// an untrusted string holding them has them escaped like controls).
const OPEN: char = '\u{E000}';
const CLOSE: char = '\u{E001}';

/// Bidi embeddings, overrides, isolates and marks: they reorder what the reader sees.
fn is_bidi(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
    )
}

/// A character a terminal or a Markdown renderer must never get raw from untrusted text: C0
/// and C1 controls, DEL, bidi controls, the Unicode line and paragraph separators, and the
/// marks of this module. `\t` and `\n` count too; callers decide where those may stay.
fn is_unsafe(c: char) -> bool {
    c.is_control() || is_bidi(c) || matches!(c, '\u{2028}' | '\u{2029}' | OPEN | CLOSE)
}

fn escape_char(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `s` with every unsafe character except those `keep` accepts as a visible escape.
fn escape_with(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) && !keep(c) {
            escape_char(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One untrusted string, terminal-safe: every control character (a tab kept), DEL, bidi
/// control and line separator as a visible escape, a newline included, so that it stays on
/// its line. Unchanged (borrowed) for an ordinary name.
pub fn term(s: &str) -> Cow<'_, str> {
    escape_with(s, |c| c == '\t')
}

/// Lines of output, terminal-safe: like [`term`], but the lines' own `\n` stay. For text
/// that mixes the program's lines with untrusted strings (error messages, a log's lines).
pub fn lines(s: &str) -> Cow<'_, str> {
    escape_with(s, |c| c == '\t' || c == '\n')
}

/// `s` marked as untrusted, for prose that a renderer of this module prints: made
/// terminal-safe ([`term`]), so the marks cannot be forged from inside it.
pub fn name(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 6);
    out.push(OPEN);
    out.push_str(&term(s));
    out.push(CLOSE);
    out
}

/// Rendered prose for a terminal: the marks removed (the marked strings are already safe)
/// and any control character left as a visible escape (`\t` and `\n` stay: the program's
/// own line breaks).
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && c != '\t' && c != '\n') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            OPEN | CLOSE => {}
            '\t' | '\n' => out.push(c),
            c if is_unsafe(c) => escape_char(&mut out, c),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Whether `s` holds a marked string.
pub fn has_names(s: &str) -> bool {
    s.contains(OPEN)
}

/// The longest run of backticks in `s`.
fn longest_backtick_run(s: &str) -> usize {
    let (mut longest, mut run) = (0, 0);
    for c in s.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

/// In a table cell: `|` as `\|` (GFM splits rows before it reads code spans), and a backslash
/// just before a `|` shown as `\x5c`, so that it cannot escape the `\` of the `\|`.
fn table_bars(s: &str) -> Cow<'_, str> {
    if !s.contains('|') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 4);
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => out.push_str("\\x5c"),
            '|' => out.push_str("\\|"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `s` (untrusted) as one Markdown code span: terminal-safe, fenced by a backtick run longer
/// than any inside it, padded with a space where it starts or ends with a backtick or a space
/// (which the span would otherwise eat). `in_table`: for a table cell. Empty for "".
pub fn md_code(s: &str, in_table: bool) -> String {
    let body = term(s);
    if body.is_empty() {
        return String::new();
    }
    let fence = "`".repeat(longest_backtick_run(&body) + 1);
    let pad = body.starts_with('`')
        || body.ends_with('`')
        || (body.starts_with(' ') && body.ends_with(' ') && body.trim() != "");
    let pad = if pad || fence.len() > 1 { " " } else { "" };
    let body = if in_table { table_bars(&body) } else { body };
    format!("{fence}{pad}{body}{pad}{fence}")
}

/// Rendered prose for Markdown: each marked string as a code span ([`md_code`]), the program's
/// text around them as it is (control characters escaped; in a table cell `|` as `\|` and no
/// line break).
pub fn markdown(s: &str, in_table: bool) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    loop {
        let (prose, marked) = match rest.split_once(OPEN) {
            Some((prose, after)) => (prose, Some(after)),
            None => (rest, None),
        };
        let prose = if in_table {
            escape_with(prose, |c| c == '\t').replace('|', "\\|")
        } else {
            escape_with(prose, |c| c == '\t' || c == '\n').into_owned()
        };
        out.push_str(&prose.replace(CLOSE, ""));
        let Some(after) = marked else { break };
        let (inner, next) = after.split_once(CLOSE).unwrap_or((after, ""));
        out.push_str(&md_code(inner, in_table));
        rest = next;
    }
    out
}

/// The lines of a fenced code block, made safe: marks removed, controls escaped. Returns the
/// fence to open and close it with: a run of backticks longer than any inside (three at least),
/// so that no line of it can close the block early.
pub fn md_fence(lines: &[String]) -> (String, Vec<String>) {
    let lines: Vec<String> = lines
        .iter()
        .map(|l| escape_with(&text(l), |c| c == '\t').into_owned())
        .collect();
    let longest = lines
        .iter()
        .map(|l| longest_backtick_run(l))
        .max()
        .unwrap_or(0);
    ("`".repeat(longest.max(2) + 1), lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_become_visible_escapes() {
        assert_eq!(term("a.py:1:f"), "a.py:1:f");
        assert!(matches!(term("a.py:1:f"), Cow::Borrowed(_)));
        assert_eq!(term("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(term("x\ny\rz\0\x08\x7f"), "x\\ny\\rz\\x00\\x08\\x7f");
        assert_eq!(term("\u{85}\u{9b}"), "\\u{85}\\u{9b}");
        assert_eq!(
            term("ab\u{202e}cd\u{2066}\u{2028}"),
            "ab\\u{202e}cd\\u{2066}\\u{2028}"
        );
        assert_eq!(term("a\tb"), "a\tb");
        assert_eq!(lines("a\nb\x1b"), "a\nb\\x1b");
        assert_eq!(term("\u{E000}"), "\\u{e000}");
    }

    #[test]
    fn marks_cannot_be_forged() {
        let s = format!("at {} now", name("x\u{E001}\u{E000}y"));
        assert_eq!(text(&s), "at x\\u{e001}\\u{e000}y now");
        assert_eq!(markdown(&s, false), "at `x\\u{e001}\\u{e000}y` now");
    }

    #[test]
    fn code_spans_outlast_their_content() {
        assert_eq!(md_code("a.py:1:f", false), "`a.py:1:f`");
        assert_eq!(md_code("a`b", false), "`` a`b ``");
        assert_eq!(md_code("``x", false), "``` ``x ```");
        assert_eq!(md_code("a|b", true), "`a\\|b`");
        assert_eq!(md_code("a\\|b", true), "`a\\x5c\\|b`");
        assert_eq!(md_code("", false), "");
        assert_eq!(
            markdown(&format!("x {} | y", name("![i](h)\n# z")), false),
            "x `![i](h)\\n# z` | y"
        );
        assert_eq!(markdown(&format!("{} | y", name("a")), true), "`a` \\| y");
    }

    #[test]
    fn fences_outlast_their_content() {
        let (f, l) = md_fence(&["```".to_owned(), "a\u{1b}".to_owned()]);
        assert_eq!(f, "````");
        assert_eq!(l, vec!["```".to_owned(), "a\\x1b".to_owned()]);
        assert_eq!(md_fence(&["x".to_owned()]).0, "```");
    }
}
