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
