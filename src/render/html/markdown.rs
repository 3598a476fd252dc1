//! Markdown to HTML for the subset the reports are written in (render/report_text.rs):
//! `#` headings, paragraphs, `**bold**`, `` `code` ``, `[text](link)`, pipe tables with
//! alignment rows, fenced code blocks, ordered and unordered lists (one level of nesting).
//! Everything else is text, escaped.

/// HTML-escapes text (the pictures' escaping: HTML takes what XML takes).
pub fn esc(text: &str) -> String {
    crate::render::svg::esc(text)
}

/// The number of backticks `s` starts with.
fn backticks(s: &str) -> usize {
    s.bytes().take_while(|&b| b == b'`').count()
}

/// Where the run of exactly `n` backticks that closes a code span starts in `s`.
fn closing_run(s: &str, n: usize) -> Option<usize> {
    let mut i = 0;
    while let Some(k) = s[i..].find('`') {
        let at = i + k;
        let run = backticks(&s[at..]);
        if run == n {
            return Some(at);
        }
        i = at + run;
    }
    None
}

/// Inline markup: code spans first (their content is literal), then bold and links. A code
/// span opens with a run of backticks and closes with a run of the same length (CommonMark),
/// so that the report's spans around names that hold backticks stay whole.
fn inline(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        out.push_str(&emphasis(&rest[..start]));
        let n = backticks(&rest[start..]);
        let after = &rest[start + n..];
        match closing_run(after, n) {
            Some(end) => {
                let mut code = &after[..end];
                if code.len() >= 2
                    && code.starts_with(' ')
                    && code.ends_with(' ')
                    && !code.trim().is_empty()
                {
                    code = &code[1..code.len() - 1];
                }
                out.push_str("<code>");
                out.push_str(&esc(code));
                out.push_str("</code>");
                rest = &after[end + n..];
            }
            None => {
                out.push_str(&esc(&rest[start..]));
                rest = "";
            }
        }
    }
    out.push_str(&emphasis(rest));
    out
}

/// Whether a link target is one of the report's own pictures: a relative path to an `.svg`
/// file. Nothing else is linked: a target without a scheme can still leave the page
/// (`//host/x`, `/\host/x`, or one that a browser cleans into them).
fn is_own_picture(target: &str) -> bool {
    target.ends_with(".svg")
        && !target.starts_with('/')
        && !target
            .chars()
            .any(|c| c == ':' || c == '\\' || c.is_whitespace() || c.is_control())
}

/// `**bold**` and `[text](target)` (links to the report's own pictures only) in escaped text.
fn emphasis(text: &str) -> String {
    let mut out = String::new();
    let mut bold = false;
    let mut rest = text;
    loop {
        let next_bold = rest.find("**");
        let next_link = rest.find('[');
        match (next_bold, next_link) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                out.push_str(&esc(&rest[..b]));
                out.push_str(if bold { "</strong>" } else { "<strong>" });
                bold = !bold;
                rest = &rest[b + 2..];
            }
            (_, Some(l)) => {
                out.push_str(&esc(&rest[..l]));
                let after = &rest[l + 1..];
                let link = after.find("](").and_then(|m| {
                    let close = after[m + 2..].find(')')?;
                    Some((&after[..m], &after[m + 2..m + 2 + close], m + 2 + close + 1))
                });
                match link {
                    Some((label, target, used)) if is_own_picture(target) => {
                        out.push_str(&format!("<a href=\"{}\">{}</a>", esc(target), esc(label)));
                        rest = &after[used..];
                    }
                    _ => {
                        out.push('[');
                        rest = after;
                    }
                }
            }
            _ => {
                out.push_str(&esc(rest));
                break;
            }
        }
    }
    if bold {
        out.push_str("</strong>");
    }
    out
}

/// Cells of a table row `| a | b |` (`\|` is a literal bar).
fn cells(line: &str) -> Vec<String> {
    let inner = line.trim().trim_start_matches('|');
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut out = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                if let Some(s) = out.last_mut() {
                    s.push('|');
                }
                chars.next();
            }
            '|' => out.push(String::new()),
            c => {
                if let Some(s) = out.last_mut() {
                    s.push(c)
                }
            }
        }
    }
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

fn is_rule_row(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('|') && t.chars().all(|c| matches!(c, '|' | '-' | ':' | ' '))
}

/// A list item marker: (ordered, indent, text).
fn list_item(line: &str) -> Option<(bool, usize, &str)> {
    let indent = line.len() - line.trim_start().len();
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix("- ").or_else(|| t.strip_prefix("* ")) {
        return Some((false, indent, rest));
    }
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    if digits > 0 {
        if let Some(rest) = t[digits..].strip_prefix(". ") {
            return Some((true, indent, rest));
        }
    }
    None
}

/// Renders Markdown to HTML.
pub fn to_html(md: &str) -> String {
    let lines: Vec<&str> = md.lines().collect();
    let mut out = String::with_capacity(md.len() * 2);
    let mut i = 0;
    let mut paragraph: Vec<&str> = Vec::new();
    let flush = |out: &mut String, paragraph: &mut Vec<&str>| {
        if !paragraph.is_empty() {
            out.push_str("<p>");
            out.push_str(&inline(&paragraph.join(" ")));
            out.push_str("</p>\n");
            paragraph.clear();
        }
    };
    while i < lines.len() {
        let line = lines[i];
        let t = line.trim();
        if t.is_empty() {
            flush(&mut out, &mut paragraph);
            i += 1;
        } else if t.starts_with("```") {
            flush(&mut out, &mut paragraph);
            out.push_str("<pre>");
            // Closed by a line of at least as many backticks and nothing else.
            let n = backticks(t);
            let closes = |l: &str| {
                let l = l.trim();
                backticks(l) >= n && l.bytes().all(|b| b == b'`')
            };
            i += 1;
            let mut first = true;
            while i < lines.len() && !closes(lines[i]) {
                if !first {
                    out.push('\n');
                }
                out.push_str(&esc(lines[i]));
                first = false;
                i += 1;
            }
            out.push_str("</pre>\n");
            i += 1;
        } else if let Some(level) =
            (1..=6).find(|&l| t.starts_with(&"#".repeat(l)) && t[l..].starts_with(' '))
        {
            flush(&mut out, &mut paragraph);
            // The report's first heading is the page's title; keep the others below it.
            let h = (level + 1).min(6);
            out.push_str(&format!("<h{h}>{}</h{h}>\n", inline(t[level..].trim())));
            i += 1;
        } else if t.starts_with('|') && lines.get(i + 1).is_some_and(|l| is_rule_row(l)) {
            flush(&mut out, &mut paragraph);
            let head = cells(t);
            let aligns: Vec<&str> = cells(lines[i + 1])
                .iter()
                .map(|c| {
                    if c.ends_with(':') {
                        " class=\"num\""
                    } else {
                        ""
                    }
                })
                .collect();
            out.push_str("<table><thead><tr>");
            for (k, c) in head.iter().enumerate() {
                let a = aligns.get(k).copied().unwrap_or("");
                out.push_str(&format!("<th{a}>{}</th>", inline(c)));
            }
            out.push_str("</tr></thead><tbody>\n");
            i += 2;
            while i < lines.len() && lines[i].trim().starts_with('|') {
                out.push_str("<tr>");
                for (k, c) in cells(lines[i]).iter().enumerate() {
                    let a = aligns.get(k).copied().unwrap_or("");
                    out.push_str(&format!("<td{a}>{}</td>", inline(c)));
                }
                out.push_str("</tr>\n");
                i += 1;
            }
            out.push_str("</tbody></table>\n");
        } else if let Some((ordered, indent, _)) = list_item(line) {
            flush(&mut out, &mut paragraph);
            i = list(&lines, i, ordered, indent, &mut out);
        } else {
            paragraph.push(t);
            i += 1;
        }
    }
    flush(&mut out, &mut paragraph);
    out
}

/// A list starting at line `i` whose items are indented by `indent`; returns the next line.
fn list(lines: &[&str], mut i: usize, ordered: bool, indent: usize, out: &mut String) -> usize {
    let tag = if ordered { "ol" } else { "ul" };
    out.push_str(&format!("<{tag}>\n"));
    let mut open = false;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            // A blank line ends the list unless an item of it follows.
            match lines.get(i + 1).and_then(|l| list_item(l)) {
                Some((_, ind, _)) if ind >= indent => {
                    i += 1;
                    continue;
                }
                _ => break,
            }
        }
        match list_item(line) {
            Some((_, ind, text)) if ind == indent => {
                if open {
                    out.push_str("</li>\n");
                }
                out.push_str("<li>");
                out.push_str(&inline(text));
                open = true;
                i += 1;
            }
            Some((o, ind, _)) if ind > indent => {
                i = list(lines, i, o, ind, out);
            }
            Some(_) => break,
            None => {
                let cont = line.len() - line.trim_start().len() > indent;
                if !cont {
                    break;
                }
                out.push(' ');
                out.push_str(&inline(line.trim()));
                i += 1;
            }
        }
    }
    if open {
        out.push_str("</li>\n");
    }
    out.push_str(&format!("</{tag}>\n"));
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_report_subset() {
        let md = "# snapscan report\n\n## `a.pickle — device 0`\n\nOUT OF MEMORY: a **750MiB** request <x>.\n\n1. **Reduce the batch**\n   - Why: `x|y` it.\n   - Saving: 2GiB.\n2. Second\n\n| bytes | site |\n| ---: | --- |\n| 1.0GiB | `a.py:1:f` |\n\n```\nstack of <the> largest:\n    a.py:1:f\n```\n";
        let html = to_html(md);
        assert!(html.contains("<h2>snapscan report</h2>"), "{html}");
        assert!(
            html.contains("<h3><code>a.pickle — device 0</code></h3>"),
            "{html}"
        );
        assert!(
            html.contains("a <strong>750MiB</strong> request &lt;x&gt;."),
            "{html}"
        );
        assert!(html.contains("<ol>\n<li><strong>Reduce the batch</strong><ul>\n<li>Why: <code>x|y</code> it.</li>\n<li>Saving: 2GiB.</li>\n</ul>\n</li>\n<li>Second</li>\n</ol>"), "{html}");
        assert!(
            html.contains("<th class=\"num\">bytes</th><th>site</th>"),
            "{html}"
        );
        assert!(
            html.contains("<td class=\"num\">1.0GiB</td><td><code>a.py:1:f</code></td>"),
            "{html}"
        );
        assert!(
            html.contains("<pre>stack of &lt;the&gt; largest:\n    a.py:1:f</pre>"),
            "{html}"
        );
    }

    #[test]
    fn links_stay_local() {
        assert_eq!(
            inline("see [timeline](out/timeline.svg) and [x](https://example.com)"),
            "see <a href=\"out/timeline.svg\">timeline</a> and [x](https://example.com)"
        );
        for target in [
            "//evil/x.svg",
            "/\\evil/x.svg",
            "\\\\evil/x.svg",
            "x",
            "/x.svg",
            "a\tb.svg",
        ] {
            let html = inline(&format!("[a]({target})"));
            assert!(!html.contains("<a"), "{target}: {html}");
        }
    }

    #[test]
    fn code_spans_and_fences_close_on_their_own_run() {
        assert_eq!(
            inline("`` a`[x](y.svg)` `` b"),
            "<code>a`[x](y.svg)`</code> b"
        );
        let html = to_html("````\n```\n## x\n````\n");
        assert_eq!(html, "<pre>```\n## x</pre>\n");
    }
}
