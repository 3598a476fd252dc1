//! The SVG pictures (`timeline`, `segments`, `report --svg`): golden files (bless with
//! `SNAPSCAN_BLESS=1`), every picture of every fixture parses and rasterizes to a non-blank
//! image, size stays bounded, and the command line behaves.

use std::path::{Path, PathBuf};

use snapscan::render::svg::ColourBy;
use snapscan::render::svg_segments::{self, At, SegmentsOptions};
use snapscan::render::svg_timeline::{self, TimelineOptions, XAxis};

use crate::common;

const MAX_BYTES: usize = 3 * 1024 * 1024;

fn golden_path(name: &str) -> PathBuf {
    common::root().join("tests").join("golden").join(name)
}

fn blessing() -> bool {
    std::env::var("SNAPSCAN_BLESS").as_deref() == Ok("1")
}

/// Compares with the golden file byte for byte, or rewrites it when blessing.
fn check_golden(name: &str, actual: &[u8]) {
    let path = golden_path(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with SNAPSCAN_BLESS=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let got = std::env::temp_dir().join(format!("snapscan-actual-{name}"));
        let _ = std::fs::write(&got, actual);
        let exp = String::from_utf8_lossy(&expected);
        let act = String::from_utf8_lossy(actual);
        let line = exp
            .lines()
            .zip(act.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| exp.lines().count().min(act.lines().count()));
        panic!(
            "{name} differs from {} at line {} (actual written to {}); \
             if the change is intended, rerun with SNAPSCAN_BLESS=1",
            path.display(),
            line + 1,
            got.display()
        );
    }
}

/// Runs the CLI in the repository root (so that the picture names the fixture by its
/// repository path) and returns stdout.
fn cli_svg(args: &[&str]) -> Vec<u8> {
    let out = common::snapscan()
        .current_dir(common::root())
        .args(args)
        .args(["-o", "-"])
        .output()
        .expect("run snapscan");
    assert!(
        out.status.success(),
        "snapscan {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

const GOLDEN_FIXTURES: [(&str, &str); 2] = [
    (
        "fixtures/synth/train-oom-forward.pickle",
        "train-oom-forward",
    ),
    (
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
        "MAGMA27",
    ),
];

#[test]
fn svg_golden_timeline() {
    for (fixture, stem) in GOLDEN_FIXTURES {
        let svg = cli_svg(&["timeline", fixture]);
        check_golden(&format!("{stem}.timeline.svg"), &svg);
    }
}

#[test]
fn svg_golden_segments() {
    for (fixture, stem) in GOLDEN_FIXTURES {
        let svg = cli_svg(&["segments", fixture]);
        check_golden(&format!("{stem}.segments.svg"), &svg);
    }
}

/// Parses with usvg, rasterizes with resvg at 600 px wide; returns (width, height, non-white
/// pixels).
fn rasterize(name: &str, svg: &[u8]) -> (u32, u32, usize) {
    use resvg::{tiny_skia, usvg};
    let tree = usvg::Tree::from_data(svg, &usvg::Options::default())
        .unwrap_or_else(|e| panic!("{name}: usvg cannot parse the SVG: {e}"));
    let size = tree.size();
    assert!(
        (size.width() - 1200.0).abs() < 0.5,
        "{name}: picture is {} wide, expected the 1200 viewBox",
        size.width()
    );
    let scale = 600.0 / size.width();
    let w = 600;
    let h = (size.height() * scale).ceil().max(1.0) as u32;
    let mut pixmap = tiny_skia::Pixmap::new(w, h).expect("pixmap");
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    let non_white = pixmap
        .pixels()
        .iter()
        .filter(|p| p.alpha() > 0 && (p.red() < 235 || p.green() < 235 || p.blue() < 235))
        .count();
    (w, h, non_white)
}

#[test]
fn svg_every_fixture_parses_and_rasterizes() {
    let fixtures = common::snapshot_fixtures();
    assert!(fixtures.len() >= 10, "fixtures missing");
    for path in fixtures {
        let name = common::rel(&path);
        let loaded = snapscan::snapshot::load(&path).expect("load fixture");
        let timeline = svg_timeline::timeline(&name, &loaded.snapshot, &TimelineOptions::default())
            .expect("timeline");
        let segments = svg_segments::segments(
            &name,
            &loaded.snapshot,
            &SegmentsOptions {
                device: None,
                at: At::End,
                colour: None,
            },
        )
        .expect("segments");
        for (kind, svg) in [("timeline", &timeline), ("segments", &segments)] {
            let label = format!("{name} ({kind})");
            assert!(svg.len() < MAX_BYTES, "{label}: {} bytes", svg.len());
            let (w, h, non_white) = rasterize(&label, svg);
            let share = non_white as f64 / (w as f64 * h as f64);
            assert!(
                share > 0.02,
                "{label}: only {non_white} non-white pixels of {w}x{h}: blank picture"
            );
        }
    }
}

fn largest_real_fixture() -> PathBuf {
    common::snapshot_fixtures()
        .into_iter()
        .filter(|p| common::rel(p).starts_with("fixtures/real/"))
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .expect("a real fixture")
}

#[test]
fn svg_size_is_bounded_on_the_largest_fixture() {
    let path = largest_real_fixture();
    let name = common::rel(&path);
    let loaded = snapscan::snapshot::load(&path).expect("load");
    for detail in [svg_timeline::DEFAULT_DETAIL, 100_000] {
        for x in [XAxis::Events, XAxis::Time] {
            for colour in [ColourBy::Category, ColourBy::CallSite] {
                let svg = svg_timeline::timeline(
                    &name,
                    &loaded.snapshot,
                    &TimelineOptions {
                        device: None,
                        x,
                        detail,
                        colour: Some(colour),
                    },
                )
                .expect("timeline");
                assert!(
                    svg.len() < MAX_BYTES,
                    "{name}: timeline (detail {detail}, {x:?}, {colour:?}) is {} bytes",
                    svg.len()
                );
            }
        }
    }
    for at in [At::Peak, At::End, At::Auto] {
        let svg = svg_segments::segments(
            &name,
            &loaded.snapshot,
            &SegmentsOptions {
                device: None,
                at,
                colour: None,
            },
        )
        .expect("segments");
        assert!(
            svg.len() < MAX_BYTES,
            "{name}: segments at {at:?} is {} bytes",
            svg.len()
        );
    }
}

fn text_of(svg: &[u8]) -> String {
    String::from_utf8(svg.to_vec()).expect("SVG is UTF-8")
}

#[test]
fn svg_every_shape_has_a_tooltip_and_output_is_deterministic() {
    let path = common::fixture("synth/train-oom-forward.pickle");
    let loaded = snapscan::snapshot::load(&path).expect("load");
    let options = TimelineOptions::default();
    let a = svg_timeline::timeline("x", &loaded.snapshot, &options).expect("timeline");
    let b = svg_timeline::timeline("x", &loaded.snapshot, &options).expect("timeline");
    assert_eq!(a, b, "same input, different bytes");
    let t = text_of(&a);
    let polygons = t.matches("<polygon ").count();
    assert!(polygons > 100, "{polygons} polygons");
    for chunk in t.split("<polygon ").skip(1) {
        let head = chunk.split("</polygon>").next().unwrap_or("");
        assert!(
            head.contains("<title>"),
            "polygon without tooltip: {}",
            &head[..head.len().min(200)]
        );
    }
    // A drawn allocation's tooltip: size, lifetime, call site and at most 6 stack lines.
    let title = t
        .split("<title>")
        .find(|s| s.contains("requested") && s.contains("call site:"))
        .expect("an allocation tooltip");
    assert!(title.contains("born "), "{title}");
    assert!(
        title.contains("freed ") || title.contains("alive at the end"),
        "{title}"
    );
    let stack_lines = title
        .split("</title>")
        .next()
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("  …"))
        .count();
    assert!(stack_lines <= 6, "{stack_lines} stack lines in {title}");
    // Numbers have at most one decimal.
    for cap in t.split("points=\"").skip(1) {
        let pts = cap.split('"').next().unwrap_or("");
        for n in pts.split([' ', ',']) {
            let decimals = n.split('.').nth(1).map_or(0, str::len);
            assert!(decimals <= 1, "coordinate {n} has more than one decimal");
        }
    }
    // Peak and OOM are marked.
    assert!(t.contains("peak 5.7GiB"), "peak label missing");
    assert!(t.contains(">OOM</text>"), "OOM mark missing");

    let s = svg_segments::segments("x", &loaded.snapshot, &SegmentsOptions::default())
        .expect("segments");
    let s = text_of(&s);
    assert!(
        s.contains("At the OOM (event 7777)"),
        "auto moment is the OOM"
    );
    assert!(
        s.contains("failed request 750.0MiB (same scale)"),
        "failed request missing"
    );
    assert!(
        s.contains("largest usable hole"),
        "largest hole label missing"
    );
    assert!(s.contains("url(#snapscan-hatch)"), "holes are hatched");
}

#[test]
fn svg_time_axis_and_devices() {
    let out = cli_svg(&["timeline", "--x", "time", "fixtures/synth/train.pickle"]);
    assert!(text_of(&out).contains("seconds since the first trace entry"));
    let both = text_of(&cli_svg(&[
        "timeline",
        "fixtures/synth/load-oom-2dev.pickle",
    ]));
    assert!(
        both.contains("device 0: memory timeline") && both.contains("device 1: memory timeline")
    );
    let one = text_of(&cli_svg(&[
        "segments",
        "--device",
        "1",
        "fixtures/synth/load-oom-2dev.pickle",
    ]));
    assert!(one.contains("device 1: segments") && !one.contains("device 0: segments"));
    let at = text_of(&cli_svg(&[
        "segments",
        "--at",
        "100",
        "fixtures/synth/train.pickle",
    ]));
    assert!(at.contains("After event 100"));
    // A snapshot without a trace still draws its allocations.
    let none = text_of(&cli_svg(&[
        "timeline",
        "fixtures/real/volcengine__verl__mem_mempools.pickle",
    ]));
    assert!(none.contains("No trace recorded"));
}

#[test]
fn svg_phases_and_categories() {
    // A training run: phase band with steps, colours by category with a legend, the summarized
    // allocations striped by category, tooltips with the category.
    let fixture = "fixtures/synth/train-oom-forward.pickle";
    let t = text_of(&cli_svg(&["timeline", fixture]));
    assert!(
        t.contains("Colour = memory category"),
        "default is by category"
    );
    assert!(t.contains(">phase</text>") && t.contains(">step</text>"));
    assert!(
        t.contains("<title>forward, step 0\nevents "),
        "phase tooltip"
    );
    assert!(t.contains("found from: "), "how the phase was found");
    assert!(t.contains(">backward</text>"), "wide phases are labelled");
    assert!(t.contains("fill=\"url(#snapscan-rest-activations)\""));
    assert!(t.contains("category: activations (confidence "));
    assert!(
        t.contains("activations  3.9GiB (69%)"),
        "legend bytes at the peak"
    );
    assert!(!t.contains("No phase band"));
    // By call site on request (`--color` too); the phase band stays.
    for flag in ["--colour", "--color"] {
        let c = text_of(&cli_svg(&["timeline", flag, "call-site", fixture]));
        assert!(c.contains("Colour = call site") && c.contains(">phase</text>"));
        assert!(!c.contains("fill=\"url(#snapscan-rest-"), "one grey band");
    }
    let s = text_of(&cli_svg(&["segments", fixture]));
    assert!(s.contains("Colour = memory category") && s.contains("category: "));
    let s = text_of(&cli_svg(&["segments", "--colour", "call-site", fixture]));
    assert!(s.contains("Colour = call site"));

    // No stacks, no annotations: no band, a line saying why, colours by call site.
    let none = text_of(&cli_svg(&[
        "timeline",
        "fixtures/synth/graphs-stacks-none.pickle",
    ]));
    assert!(none.contains("No phase band: the trace has no stacks"));
    assert!(!none.contains(">phase</text>"));
    assert!(none.contains("Colour = call site"));
}

#[test]
fn svg_cli_errors() {
    let fail = |args: &[&str], needle: &str| {
        let out = common::snapscan()
            .current_dir(common::root())
            .args(args)
            .args(["-o", "-"])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    fail(
        &["segments", "--at", "oom", "fixtures/synth/train.pickle"],
        "no OOM",
    );
    fail(
        &[
            "segments",
            "--at",
            "99999999",
            "fixtures/synth/train.pickle",
        ],
        "trace entries",
    );
    fail(
        &["segments", "--at", "soon", "fixtures/synth/train.pickle"],
        "not a moment",
    );
    fail(
        &["timeline", "--device", "7", "fixtures/synth/train.pickle"],
        "device 7",
    );
    fail(
        &[
            "timeline",
            "--colour",
            "rainbow",
            "fixtures/synth/train.pickle",
        ],
        "rainbow",
    );
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-svg-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn assert_svg_file(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"<?xml"),
        "{} is not an SVG",
        path.display()
    );
}

#[test]
fn svg_default_output_and_report_links() {
    // Without -o: timeline.svg in the current directory.
    let dir = temp_dir("default");
    common::snapscan()
        .current_dir(&dir)
        .arg("timeline")
        .arg(common::fixture("synth/load-oom.pickle"))
        .assert()
        .success();
    assert_svg_file(&dir.join("timeline.svg"));

    // report --svg DIR: one file → timeline.svg and segments.svg, linked from the Markdown.
    let dir = temp_dir("report");
    let report = dir.join("report.md");
    common::snapscan()
        .args(["report", "--format", "markdown", "--svg"])
        .arg(&dir)
        .arg("-o")
        .arg(&report)
        .arg(common::fixture("synth/load-oom.pickle"))
        .assert()
        .success();
    assert_svg_file(&dir.join("timeline.svg"));
    assert_svg_file(&dir.join("segments.svg"));
    let md = std::fs::read_to_string(&report).expect("report");
    assert!(md.contains("(timeline.svg)"), "{md}");
    assert!(md.contains("(segments.svg)"), "{md}");
    assert!(md.starts_with("# snapscan report\n\n## Pictures"), "{md}");

    // Several files: a suffix per file; pictures in a subdirectory are linked relative to it.
    let dir = temp_dir("ranks");
    let pics = dir.join("pics");
    let report = dir.join("report.md");
    common::snapscan()
        .args(["report", "--format", "markdown", "--svg"])
        .arg(&pics)
        .arg("-o")
        .arg(&report)
        .arg(common::fixture("synth/load-oom.pickle"))
        .arg(common::fixture("synth/train.pickle"))
        .assert()
        .success();
    for f in [
        "timeline-load-oom.svg",
        "segments-load-oom.svg",
        "timeline-train.svg",
        "segments-train.svg",
    ] {
        assert_svg_file(&pics.join(f));
    }
    let md = std::fs::read_to_string(&report).expect("report");
    assert!(md.contains("(pics/timeline-train.svg)"), "{md}");
}

/// Pictures of damaged files: whatever loads is drawn without a panic.
#[test]
fn svg_mutated_inputs_never_panic() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let data = std::fs::read(common::fixture("synth/tiny.pickle")).expect("tiny fixture");
    let mut drawn = 0;
    // Every 29th byte flipped, and a few cuts: a sample that keeps the test fast.
    let mut mutants: Vec<Vec<u8>> = (0..data.len())
        .step_by(29)
        .map(|pos| {
            let mut m = data.clone();
            m[pos] ^= 0xff;
            m
        })
        .collect();
    mutants.extend((1..8).map(|k| data[..data.len() * k / 8].to_vec()));
    for (i, bytes) in mutants.iter().enumerate() {
        let Ok(snap) = snapscan::snapshot::load_bytes("mutant", bytes) else {
            continue;
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            let t = svg_timeline::timeline("mutant", &snap, &TimelineOptions::default());
            let s = svg_segments::segments("mutant", &snap, &SegmentsOptions::default());
            let e = svg_segments::segments(
                "mutant",
                &snap,
                &SegmentsOptions {
                    device: None,
                    at: At::End,
                    colour: None,
                },
            );
            for svg in [t, s, e].into_iter().flatten() {
                assert!(svg.starts_with(b"<?xml") && svg.len() < MAX_BYTES);
            }
        }));
        assert!(result.is_ok(), "panic drawing mutant {i}");
        drawn += 1;
    }
    assert!(drawn > 0, "no mutant loaded");
}

/// A numeric attribute of an SVG element (`x="12.5"`).
fn attr(element: &str, name: &str) -> Option<f64> {
    let key = format!(" {name}=\"");
    let at = element.find(&key)? + key.len();
    element[at..].split('"').next()?.parse().ok()
}

/// Every `<tag …>` start tag of the document.
fn elements<'a>(svg: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag} ");
    svg.match_indices(&open)
        .map(|(i, _)| {
            let end = svg[i..].find('>').map_or(svg.len(), |e| i + e);
            &svg[i..end]
        })
        .collect()
}

/// Boxes and labels end inside the picture: every rect inside [0, width − right margin]; every
/// text inside it too, by its `textLength` when set, else by a generous width estimate of its
/// content (0.66 em per character when bold, 0.6 otherwise), for left-anchored text.
fn assert_inside(name: &str, svg: &str) {
    use snapscan::render::svg::{RIGHT, WIDTH};
    let limit = WIDTH - RIGHT + 0.05;
    for r in elements(svg, "rect") {
        if let (Some(x), Some(w)) = (attr(r, "x"), attr(r, "width")) {
            assert!(x >= 0.0 && x + w <= limit, "{name}: {r}");
        }
    }
    for (i, _) in svg.match_indices("<text ") {
        let head_end = i + svg[i..].find('>').unwrap();
        let head = &svg[i..head_end];
        let body_end = head_end + svg[head_end..].find("</text>").unwrap();
        let content = &svg[head_end + 1..body_end];
        let chars = content
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&quot;", "\"")
            .chars()
            .count() as f64;
        // Rotated axis titles are placed by a transform, in the left margin.
        let Some(x) = attr(head, "x") else { continue };
        let size = attr(head, "font-size").unwrap();
        let em = if head.contains("bold") { 0.66 } else { 0.6 };
        let width = attr(head, "textLength").unwrap_or(chars * size * em);
        let (start, end) = if head.contains("text-anchor=\"end\"") {
            (x - width, x)
        } else if head.contains("text-anchor=\"middle\"") {
            (x - width / 2.0, x + width / 2.0)
        } else {
            (x, x + width)
        };
        assert!(
            start >= -0.05 && end <= limit,
            "{name}: text runs out of the picture: {head}>{content}"
        );
    }
}

/// MAGMA27's segments at the peak: 85 fully allocated 96 MiB activation segments and others
/// alike were one bar each (1,245 px in all); now each run is one labelled row.
#[test]
fn alike_segments_are_folded_into_one_labelled_row() {
    let svg = String::from_utf8(cli_svg(&[
        "segments",
        "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ]))
    .unwrap();
    let height = svg
        .split("viewBox=\"0 0 1200 ")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|h| h.parse::<f64>().ok())
        .unwrap();
    assert!(height < 900.0, "{height} px");
    assert!(svg
        .contains(">× 85 alike: 96.0MiB each, 8.0GiB in all (8.0GiB allocated, 0.0B free)</text>"));
    assert!(svg.contains("196 alike segments folded into the row of one like them"));
    let bars = svg.matches("fill=\"url(#snapscan-hatch)\" stroke=").count();
    assert!(bars < 40, "{bars} segment bars for 216 segments");
    // Every segment is still accounted for: the folded ones in the labels' tooltips.
    assert!(svg.contains("85 segments alike in size, pool, stream, holes, free bytes and colour"));
}

/// The failed request (750 MiB, wider than any segment) ends on the right-hand gridline, and
/// every box and label of the pictures stays inside, whatever the title's length.
#[test]
fn boxes_and_labels_stay_inside_the_picture() {
    let svg = String::from_utf8(cli_svg(&[
        "segments",
        "fixtures/synth/train-oom-forward.pickle",
    ]))
    .unwrap();
    let grid_right = elements(&svg, "line")
        .iter()
        .filter(|l| l.contains("stroke=\"#e") || l.contains("stroke=\"#d"))
        .filter_map(|l| attr(l, "x1"))
        .fold(0.0, f64::max);
    let request = elements(&svg, "rect")
        .into_iter()
        .find(|r| r.contains("fill-opacity=\"0.2\""))
        .unwrap();
    let end = attr(request, "x").unwrap() + attr(request, "width").unwrap();
    assert!(
        end <= grid_right + 0.05,
        "request box ends at {end}, last gridline {grid_right}"
    );
    assert_inside("train-oom-forward segments", &svg);
    for (cmd, fixture) in [
        (
            "segments",
            "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
        ),
        ("timeline", "fixtures/synth/train-oom-forward.pickle"),
        (
            "timeline",
            "fixtures/real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
        ),
        ("segments", "fixtures/synth/load-oom-2dev.pickle"),
    ] {
        let svg = String::from_utf8(cli_svg(&[cmd, fixture])).unwrap();
        assert_inside(&format!("{cmd} {fixture}"), &svg);
    }
    // Long names: an empty snapshot (the "nothing to draw" title) and a real one.
    let dir = temp_dir("long-names");
    let deep =
        dir.join("artifacts-of-the-nightly-fine-tuning-job-on-the-shared-cluster-partition-a100");
    std::fs::create_dir_all(&deep).unwrap();
    let empty =
        deep.join("rank-0007-of-0064-memory-snapshot-written-at-the-end-of-the-run-empty.pickle");
    std::fs::write(
        &empty,
        b"\x80\x04\x95\x24\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94u.",
    )
    .unwrap();
    let real = deep.join("rank-0007-of-0064-memory-snapshot-written-at-the-end-of-the-run.pickle");
    std::fs::copy(common::fixture("synth/train-oom-forward.pickle"), &real).unwrap();
    for file in [&empty, &real] {
        for cmd in ["segments", "timeline"] {
            let svg = String::from_utf8(cli_svg(&[cmd, file.to_str().unwrap()])).unwrap();
            assert_inside(&format!("{cmd} {}", file.display()), &svg);
            if file == &empty {
                assert!(
                    svg.contains("nothing to draw</text>"),
                    "the end of the title shows"
                );
            } else {
                assert!(svg.contains("— device 0: "), "the device shows");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The timeline of a dump with pinned host memory has the host lane (its peaks as the report
/// gives them), and tooltips say whose code made an allocation and through what.
#[test]
fn svg_timeline_has_the_host_lane_and_whose_code() {
    let svg = text_of(&cli_svg(&[
        "timeline",
        "fixtures/torch215/training-2026.pickle",
    ]));
    assert!(
        svg.contains(
            "Pinned host memory (host_traces): peak 96.0MiB pinned, 96.0MiB reserved; placed by time"
        ),
        "no host lane"
    );
    assert!(
        svg.contains("pinned host memory allocated; peak 96.0MiB ("),
        "no lane tooltip"
    );
    assert!(
        svg.contains("your code, via torch.nn.modules.linear.forward"),
        "no code path in the tooltips"
    );
    // A dump without host memory has no lane.
    let plain = text_of(&cli_svg(&[
        "timeline",
        "fixtures/synth/train-oom-forward.pickle",
    ]));
    assert!(!plain.contains("Pinned host memory"));
}
