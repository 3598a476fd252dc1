//! What a reader sees cannot be forged: frame names, file names, paths of merged reports and
//! the lines of a log are untrusted. On a terminal none of their control characters (escape
//! sequences, OSC 8 links, OSC 0 titles, OSC 52 clipboard writes, CR, BS, NUL, C1 controls,
//! DEL) nor bidi controls arrives raw, and a newline inside a name stays inside its line; in
//! Markdown (a PR comment) no image, link, heading or HTML comes from them: the document has the
//! same structure as the report of a snapshot with ordinary names.

use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag};
use serde_json::{json, Value as Json};

use crate::common::snapscan;

/// Names built to take over a terminal or a Markdown page, as `(file, function)` frames.
const HOSTILE: &[(&str, &str)] = &[
    (
        "/evil/\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\.py",
        "clear\x1b[2J\x1b[H",
    ),
    (
        "/evil/title\x1b]0;pwned\x07.py",
        "clip\x1b]52;c;cm0gLXJmIH4=\x07",
    ),
    ("/evil/cr.py", "over\r\x1b[Kno OOM here, all good"),
    ("/evil/nul.py", "n\0b\x08c\u{85}d\u{9b}31me\x7f"),
    (
        "/evil/bidi\u{202e}yp.txt.py",
        "w\u{2066}x\u{200f}y\u{2028}z\u{061c}",
    ),
    ("/evil/img.py", "![x](http://evil/x.png)"),
    ("/evil/link.py", "[link](http://evil)"),
    ("/evil/nl.py", "a\n# no OOM here, all good"),
    ("/evil/comment.py", "<!-- hide the rest"),
    ("/evil/fence.py", "x\n```\n## fake"),
    ("/evil/bar.py", "a|b\\|[c](http://evil) `d`"),
    ("/evil/page.py", "[p](//evil/x) [q](/\\evil/x)"),
];

/// The file name of the hostile snapshot (the report prints it).
const HOSTILE_FILE: &str = "snap\x1b]0;t\x07 \u{202e}![i](evil.png) [l](evil) <!-- \n# x.json";

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-forgery-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn frames(file: &str, name: &str) -> Json {
    json!([{"filename": file, "line": 7, "name": name}])
}

/// A snapshot whose allocations come from `sites` (one each, the last largest) and that ends
/// in an OOM at the first; `scale` multiplies the sizes (for a diff).
fn snapshot(sites: &[(String, String)], scale: u64) -> Json {
    let mut trace = Vec::new();
    let mut time = 1000;
    let mut addr = 0x7f00_0000_0000u64;
    for (i, (file, name)) in sites.iter().enumerate() {
        time += 1;
        let size = ((i as u64 + 1) * scale) << 20;
        trace.push(
            json!({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                          "time_us": time, "frames": frames(file, name)}),
        );
        addr += 64 << 20;
    }
    let (file, name) = &sites[0];
    trace.push(
        json!({"action": "oom", "addr": 0, "size": 1u64 << 30, "stream": 0,
                      "time_us": time + 1, "frames": frames(file, name)}),
    );
    json!({"segments": [], "device_traces": [trace], "external_annotations": []})
}

fn hostile_sites() -> Vec<(String, String)> {
    HOSTILE
        .iter()
        .map(|(f, n)| (f.to_string(), n.to_string()))
        .collect()
}

/// The same shape with ordinary names.
fn benign_sites() -> Vec<(String, String)> {
    (0..HOSTILE.len())
        .map(|i| (format!("/ok/file{i}.py"), format!("function{i}")))
        .collect()
}

fn write(dir: &Path, name: &str, doc: &Json) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(doc).unwrap()).unwrap();
    path
}

/// The hostile snapshot (under a hostile file name), a second one for a diff, and a benign one.
struct Inputs {
    hostile: PathBuf,
    hostile2: PathBuf,
    benign: PathBuf,
    benign2: PathBuf,
}

fn inputs(tag: &str) -> Inputs {
    let dir = scratch().join(tag);
    std::fs::create_dir_all(&dir).unwrap();
    Inputs {
        hostile: write(&dir, HOSTILE_FILE, &snapshot(&hostile_sites(), 1)),
        hostile2: write(&dir, "second.json", &snapshot(&hostile_sites(), 2)),
        benign: write(&dir, "benign.json", &snapshot(&benign_sites(), 1)),
        benign2: write(&dir, "benign2.json", &snapshot(&benign_sites(), 2)),
    }
}

/// Runs the CLI; returns (stdout, stderr) whatever the exit code.
fn run<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> (String, String) {
    let out = snapscan().args(args).output().unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 2),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

/// No raw control character but `\t` and `\n`, no bidi control, no line separator.
fn assert_terminal_safe(what: &str, out: &str) {
    for (i, c) in out.char_indices() {
        let bad = (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
            || matches!(
                c,
                '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{2028}' | '\u{2029}'
            );
        assert!(
            !bad,
            "{what}: raw {:?} at byte {i}: {:?}",
            c,
            &out[i.saturating_sub(60)..(i + 20).min(out.len())]
        );
    }
}

/// No line of `out` starts with what only a forged name could put there.
fn assert_no_forged_lines(what: &str, out: &str) {
    for line in out.lines() {
        let t = line.trim_start();
        assert!(
            !t.starts_with("no OOM here") && !t.starts_with("# no OOM") && !t.starts_with("```"),
            "{what}: a name started a line: {line:?}"
        );
    }
}

/// The block structure of a Markdown document, and every image, link, heading and piece of
/// HTML in it, as GitHub's flavour reads it.
fn structure(md: &str) -> Vec<String> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_FOOTNOTES;
    let mut out = Vec::new();
    let mut in_heading = false;
    for event in Parser::new_ext(md, options) {
        match event {
            Event::Start(Tag::Heading { level, .. }) => {
                in_heading = true;
                out.push(format!("heading {level:?}"));
            }
            Event::End(pulldown_cmark::TagEnd::Heading(_)) => in_heading = false,
            Event::Text(t) if in_heading => out.push(format!("heading text {t}")),
            Event::Start(Tag::Image { dest_url, .. }) => out.push(format!("image {dest_url}")),
            Event::Start(Tag::Link { dest_url, .. }) => out.push(format!("link {dest_url}")),
            Event::Html(h) | Event::InlineHtml(h) => out.push(format!("html {h}")),
            Event::Start(Tag::HtmlBlock) => out.push("html block".into()),
            Event::FootnoteReference(f) => out.push(format!("footnote {f}")),
            Event::TaskListMarker(_) => out.push("task".into()),
            Event::Start(
                t @ (Tag::Paragraph
                | Tag::Table(_)
                | Tag::TableRow
                | Tag::TableCell
                | Tag::CodeBlock(_)
                | Tag::List(_)
                | Tag::Item
                | Tag::BlockQuote(_)),
            ) => out.push(format!("{t:?}").chars().take(12).collect()),
            _ => {}
        }
    }
    // Heading texts differ with the names in them; their number and levels must not.
    out.retain(|e| !e.starts_with("heading text"));
    out
}

/// The Markdown of the hostile input has the structure of the benign one, and no image, link
/// or HTML at all.
fn assert_markdown_safe(what: &str, hostile: &str, benign: &str) {
    assert_terminal_safe(what, hostile);
    let (h, b) = (structure(hostile), structure(benign));
    for e in &h {
        assert!(
            !(e.starts_with("image")
                || e.starts_with("link")
                || e.starts_with("html")
                || e.starts_with("footnote")
                || e == "task"),
            "{what}: {e} from snapshot data in:\n{hostile}"
        );
    }
    assert_eq!(
        h, b,
        "{what}: structure differs from the benign report:\n{hostile}"
    );
}

#[test]
fn report_text_brief_full_and_stacks_show_names_escaped() {
    let i = inputs("report");
    for extra in [&[][..], &["--brief"], &["--full"], &["--stacks=all"]] {
        let mut args = vec![os("report")];
        args.extend(extra.iter().map(os));
        args.push(i.hostile.as_os_str());
        let (out, err) = run(&args);
        let what = format!("report {extra:?}");
        assert_terminal_safe(&what, &out);
        assert_terminal_safe(&what, &err);
        assert_no_forged_lines(&what, &out);
        // The names are there, visibly.
        assert!(out.contains("\\x1b[2J"), "{what}: {out}");
    }
    let (out, _) = run(&[
        os("report"),
        os("--stacks=all"),
        os("--top"),
        os("20"),
        i.hostile.as_os_str(),
    ]);
    assert!(out.contains("a\\n# no OOM here, all good"), "{out}");
    assert!(out.contains("bidi\\u{202e}yp.txt.py"), "{out}");
    assert!(
        out.contains("n\\x00b\\x08c\\u{85}d\\u{9b}31me\\x7f"),
        "{out}"
    );
    // Several files: the cross-file table names them.
    let (out, err) = run(&[os("report"), i.hostile.as_os_str(), i.hostile2.as_os_str()]);
    assert_terminal_safe("report of two files", &out);
    assert_terminal_safe("report of two files", &err);
}

#[test]
fn report_markdown_has_the_structure_of_an_ordinary_report() {
    let i = inputs("markdown");
    for extra in [&[][..], &["--full"], &["--stacks=all"]] {
        let args = |file: &Path| {
            let mut a = vec![os("report"), os("--format"), os("markdown")];
            a.extend(extra.iter().map(os));
            a.push(file.as_os_str());
            a.into_iter().map(|s| s.to_owned()).collect::<Vec<_>>()
        };
        let (hostile, _) = run(&args(&i.hostile));
        let (benign, _) = run(&args(&i.benign));
        assert_markdown_safe(
            &format!("report --format markdown {extra:?}"),
            &hostile,
            &benign,
        );
    }
    let (hostile, _) = run(&[
        os("report"),
        os("--format"),
        os("markdown"),
        i.hostile.as_os_str(),
        i.hostile2.as_os_str(),
    ]);
    let (benign, _) = run(&[
        os("report"),
        os("--format"),
        os("markdown"),
        i.benign.as_os_str(),
        i.benign2.as_os_str(),
    ]);
    assert_markdown_safe("report of two files", &hostile, &benign);
}

#[test]
fn stats_diff_and_check_show_names_escaped() {
    let i = inputs("others");
    let (out, err) = run(&[os("stats"), i.hostile.as_os_str()]);
    assert_terminal_safe("stats", &out);
    assert_terminal_safe("stats", &err);
    assert_no_forged_lines("stats", &out);

    let (out, err) = run(&[os("diff"), i.hostile.as_os_str(), i.hostile2.as_os_str()]);
    assert_terminal_safe("diff", &out);
    assert_terminal_safe("diff", &err);
    assert_no_forged_lines("diff", &out);
    let (hostile, _) = run(&[
        os("diff"),
        os("--format"),
        os("markdown"),
        i.hostile.as_os_str(),
        i.hostile2.as_os_str(),
    ]);
    let (benign, _) = run(&[
        os("diff"),
        os("--format"),
        os("markdown"),
        i.benign.as_os_str(),
        i.benign2.as_os_str(),
    ]);
    assert_markdown_safe("diff --format markdown", &hostile, &benign);

    let check = |file: &Path, format: &str| {
        run(&[
            os("check"),
            os("--max-peak"),
            os("1MiB"),
            os("--fail-on-oom"),
            os("--format"),
            os(format),
            file.as_os_str(),
        ])
    };
    let (out, err) = check(&i.hostile, "text");
    assert_terminal_safe("check", &out);
    assert_terminal_safe("check", &err);
    assert_no_forged_lines("check", &out);
    assert!(out.contains("\\n# x.json"), "{out}");
    let (hostile, _) = check(&i.hostile, "markdown");
    let (benign, _) = check(&i.benign, "markdown");
    assert_markdown_safe("check --format markdown", &hostile, &benign);
}

/// A JSON report of `snapshot` whose file paths are all `path`.
fn json_report(snapshot: &Path, path: &str, dir: &Path, name: &str) -> PathBuf {
    let (out, _) = run(&[
        os("report"),
        os("--format"),
        os("json"),
        snapshot.as_os_str(),
    ]);
    let mut doc: Json = serde_json::from_str(&out).unwrap();
    for f in doc["files"].as_array_mut().unwrap() {
        f["path"] = json!(path);
    }
    write(dir, name, &doc)
}

#[test]
fn merge_shows_the_paths_of_merged_reports_escaped() {
    let i = inputs("merge");
    let dir = scratch().join("merge-reports");
    std::fs::create_dir_all(&dir).unwrap();
    let forged = "rank0\x1b[2J\r\x1b[K\n# no OOM here, all good ![i](http://evil/i.png) <!--";
    let h = [
        json_report(&i.hostile, forged, &dir, "h0.json"),
        json_report(
            &i.hostile2,
            "rank1 [l](http://evil) |x| `y`\u{202e}",
            &dir,
            "h1.json",
        ),
    ];
    let b = [
        json_report(&i.benign, "rank0.pickle", &dir, "b0.json"),
        json_report(&i.benign2, "rank1.pickle", &dir, "b1.json"),
    ];
    let (out, err) = run(&[os("merge"), h[0].as_os_str(), h[1].as_os_str()]);
    assert_terminal_safe("merge", &out);
    assert_terminal_safe("merge", &err);
    assert_no_forged_lines("merge", &out);
    let md = |r: &[PathBuf; 2]| {
        run(&[
            os("merge"),
            os("--format"),
            os("markdown"),
            r[0].as_os_str(),
            r[1].as_os_str(),
        ])
        .0
    };
    assert_markdown_safe("merge --format markdown", &md(&h), &md(&b));
}

#[test]
fn explain_shows_a_hostile_log_escaped() {
    let dir = scratch();
    let message = |junk: &str| {
        format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a \
             total capacity of 23.65 GiB of which 1.06 GiB is free. Process 4821 has 9.10 GiB \
             memory in use.{junk} Of the allocated memory 11.80 GiB is allocated by PyTorch, and \
             120.00 MiB is reserved by PyTorch but unallocated.\n"
        )
    };
    let junk = "\x1b]0;pwned\x07\x1b[2J\r\x1b[K\u{9b}1m\u{202e} ![i](http://evil/i.png) <!-- \
                ``` [l](http://evil)";
    let hostile = dir.join("hostile.log");
    std::fs::write(&hostile, message(junk)).unwrap();
    let benign = dir.join("benign.log");
    std::fs::write(&benign, message(" ordinary words")).unwrap();
    let (out, err) = run(&[os("explain"), hostile.as_os_str()]);
    assert_terminal_safe("explain", &out);
    assert_terminal_safe("explain", &err);
    let (h, _) = run(&[
        os("explain"),
        os("--format"),
        os("markdown"),
        hostile.as_os_str(),
    ]);
    let (b, _) = run(&[
        os("explain"),
        os("--format"),
        os("markdown"),
        benign.as_os_str(),
    ]);
    assert!(h.contains("\\x1b]0;pwned\\x07"), "{h}");
    assert_markdown_safe("explain --format markdown", &h, &b);
}

#[test]
fn errors_on_stderr_show_file_names_escaped() {
    let dir = scratch().join("errors");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad\x1b]0;pwned\x07\r\x1b[K\u{202e}.pickle");
    std::fs::write(&bad, b"\x80\x04not a pickle").unwrap();
    for cmd in [&["report"][..], &["stats"], &["check", "--fail-on-oom"]] {
        let mut args: Vec<&std::ffi::OsStr> = cmd.iter().map(os).collect();
        args.push(bad.as_os_str());
        let (_, err) = run(&args);
        assert!(err.contains("snapscan: error:"), "{cmd:?}: {err}");
        assert_terminal_safe(cmd[0], &err);
    }
    // One unreadable file among readable ones is named in the report too.
    let good = write(&dir, "good.json", &snapshot(&benign_sites(), 1));
    let (out, err) = run(&[os("report"), good.as_os_str(), bad.as_os_str()]);
    assert_terminal_safe("report with an unreadable file", &out);
    assert_terminal_safe("report with an unreadable file", &err);
    let (md, _) = run(&[
        os("report"),
        os("--format"),
        os("markdown"),
        good.as_os_str(),
        bad.as_os_str(),
    ]);
    assert_terminal_safe("markdown report with an unreadable file", &md);
}

#[test]
fn the_page_links_only_its_own_pictures() {
    // The OOM's call site (in a paragraph of the report) is the one with the links.
    let mut sites = hostile_sites();
    sites.rotate_right(1);
    let dir = scratch();
    let file = write(&dir, "page.json", &snapshot(&sites, 1));
    let (page, _) = run(&[os("view"), file.as_os_str(), os("-o"), os("-")]);
    for bad in ["href=\"//", "href=\"/\\", "href=\"http"] {
        assert!(!page.contains(bad), "the page links {bad}…");
    }
}

/// `replay` and `whatif` name call sites (the holders and pinners of a failed request) and
/// the file: escaped in text, and Markdown with the structure of the benign input's.
#[test]
fn replay_and_whatif_show_names_escaped() {
    let dir = scratch().join("replay");
    std::fs::create_dir_all(&dir).unwrap();
    // Each alloc in a segment of its own, so that the OOM's chain names who holds them.
    let with_segments = |sites: &[(String, String)]| {
        let mut doc = snapshot(sites, 1);
        let trace = doc["device_traces"][0].as_array().unwrap().clone();
        let mut out = Vec::new();
        for e in trace {
            if e["action"] == "alloc" {
                out.push(json!({"action": "segment_alloc", "addr": e["addr"].clone(),
                                "size": 64u64 << 20, "stream": 0}));
            }
            out.push(e);
        }
        doc["device_traces"][0] = Json::Array(out);
        doc
    };
    let hostile = write(&dir, HOSTILE_FILE, &with_segments(&hostile_sites()));
    let benign = write(&dir, "benign.json", &with_segments(&benign_sites()));
    for cmd in [
        &["replay"][..],
        &["whatif", "--set", "expandable_segments:True"],
    ] {
        let text = |file: &Path| {
            let mut args: Vec<&std::ffi::OsStr> = cmd.iter().map(os).collect();
            args.push(file.as_os_str());
            run(&args)
        };
        let (out, err) = text(&hostile);
        assert_terminal_safe(&format!("{cmd:?} text"), &out);
        assert_terminal_safe(&format!("{cmd:?} stderr"), &err);
        assert_no_forged_lines(&format!("{cmd:?} text"), &out);
        let md = |file: &Path| {
            let mut args: Vec<&std::ffi::OsStr> = cmd.iter().map(os).collect();
            args.extend([os("--format"), os("markdown"), file.as_os_str()]);
            run(&args).0
        };
        assert_markdown_safe(&format!("{cmd:?} markdown"), &md(&hostile), &md(&benign));
    }
    // The chain does name the hostile sites (escaped), so the test reads what it means to.
    let (out, _) = run(&[os("replay"), hostile.as_os_str()]);
    assert!(out.contains("held open mostly by"), "{out}");
}
