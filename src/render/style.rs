//! Colour for the terminal: only when stdout is a terminal, `NO_COLOR` is unset (or empty) and
//! the terminal is not `dumb`. Files, pipes and golden files never get escape codes.

use std::ffi::OsStr;

/// Whether to colour output written to stdout, from the facts (testable).
pub fn allowed(stdout_is_terminal: bool, no_color: Option<&OsStr>, term: Option<&OsStr>) -> bool {
    let no_color = no_color.is_some_and(|v| !v.is_empty());
    let dumb = term.is_some_and(|t| t == "dumb");
    stdout_is_terminal && !no_color && !dumb
}

/// [`allowed`] for this process's stdout and environment.
pub fn stdout_allows_color() -> bool {
    use std::io::IsTerminal;
    allowed(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("TERM").as_deref(),
    )
}

/// What a piece of text means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tone {
    /// An OOM, a crossed budget, a regression: bold red.
    Bad,
    /// All budgets hold, an improvement: green.
    Good,
    /// Headings: bold.
    Strong,
}

/// `text` in the tone's colour when `color` is on, unchanged otherwise.
pub fn paint(text: &str, tone: Tone, color: bool) -> String {
    if !color || text.is_empty() {
        return text.to_owned();
    }
    let code = match tone {
        Tone::Bad => "1;31",
        Tone::Good => "32",
        Tone::Strong => "1",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert!(allowed(true, None, os("xterm")));
        assert!(!allowed(false, None, os("xterm")));
        assert!(!allowed(true, os("1"), None));
        assert!(allowed(true, os(""), None), "empty NO_COLOR does not count");
        assert!(!allowed(true, None, os("dumb")));
        assert_eq!(paint("x", Tone::Bad, false), "x");
        assert_eq!(paint("x", Tone::Bad, true), "\x1b[1;31mx\x1b[0m");
    }
}
