//! The parallel reader against the sequential one: the same snapshot (by content: ids may be
//! numbered differently) and the same report for every fixture, and never a result where the
//! sequential reader finds an error.

use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::snapshot::{self, Interner, LoadedSnapshot, Snapshot, StackId, TextId};

use crate::common;

fn stack(i: &Interner, s: StackId) -> Vec<(String, String, i64)> {
    i.get_stack(s)
        .iter()
        .map(|&f| {
            let f = i.get_frame(f);
            (
                i.get_text(f.name).to_owned(),
                i.get_text(f.filename).to_owned(),
                f.line,
            )
        })
        .collect()
}

fn text(i: &Interner, t: Option<TextId>) -> Option<String> {
    t.map(|t| i.get_text(t).to_owned())
}

/// One line per segment (with its blocks), stacks spelled out.
pub fn segment_lines(s: &Snapshot) -> Vec<String> {
    let i = &s.interner;
    s.segments
        .iter()
        .map(|seg| {
            let mut line = format!(
                "seg {} {} {} {} {} {} {} {:?} {:?} {} {:?}",
                seg.device,
                seg.address,
                seg.total_size,
                seg.allocated_size,
                seg.active_size,
                seg.requested_size,
                seg.stream,
                seg.pool_kind,
                seg.pool_id,
                seg.is_expandable,
                stack(i, seg.frames)
            );
            for b in &seg.blocks {
                line.push_str(&format!(
                    " | block {} {} {} {:?} {:?}",
                    b.address,
                    b.size,
                    b.requested_size,
                    b.state,
                    stack(i, b.frames)
                ));
            }
            line
        })
        .collect()
}

/// One line per trace entry of device `d`, ids spelled out.
pub fn entry_lines(s: &Snapshot, d: usize) -> Vec<String> {
    let i = &s.interner;
    s.device_traces[d]
        .iter()
        .map(|e| {
            format!(
                "{:?} {:?} {} {} {} {:?} {:?} {:?} {:?} {:?}",
                e.action,
                text(i, e.action_text),
                e.addr,
                e.size,
                e.stream,
                e.device_free,
                e.time_us,
                stack(i, e.frames),
                text(i, e.user_metadata),
                text(i, e.compile_context)
            )
        })
        .collect()
}

/// Everything in a snapshot, with ids replaced by what they stand for.
pub fn canonical(s: &Snapshot) -> Vec<String> {
    let mut out = vec![
        format!("{:?}", s.layout),
        format!("{:?}", s.other_top_level_keys),
        // Annotation texts by their content: the readers intern in different orders.
        format!(
            "{:?}",
            s.annotations
                .iter()
                .map(|a| (
                    s.interner.get_text(a.name),
                    s.interner.get_text(a.stage),
                    a.device,
                    a.time_us
                ))
                .collect::<Vec<_>>()
        ),
        format!(
            "{:?}",
            s.allocator_settings.as_ref().map(|a| (
                &a.conf,
                a.expandable_segments,
                a.max_split_size,
                &a.raw
            ))
        ),
        format!("{:?}", s.salvaged),
    ];
    out.extend(segment_lines(s));
    for d in 0..s.device_traces.len() {
        out.push(format!("device {d}: {} entries", s.device_traces[d].len()));
        out.extend(entry_lines(s, d));
    }
    out
}

fn report_json(s: Snapshot) -> String {
    let loaded = LoadedSnapshot {
        name: "x".into(),
        decoded_bytes: 0,
        compression: snapscan::input::Compression::None,
        snapshot: s,
    };
    serde_json::to_string(&file_report(&loaded, &ReportOptions::default())).unwrap()
}

pub fn read(path: &std::path::Path) -> Vec<u8> {
    let (bytes, _) = snapscan::input::read_input(path).expect("readable fixture");
    bytes.to_vec()
}

#[test]
fn every_fixture_reads_the_same_in_parallel() {
    let mut parallel = 0;
    for path in common::snapshot_fixtures() {
        let data = read(&path);
        let seq = snapshot::load_bytes_sequential("f", &data)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let Some(par) = snapshot::load_bytes_parallel(&data) else {
            // Only protocol 2/3 files (no frames) are left to the sequential reader.
            assert!(
                data.get(1).is_some_and(|&p| p < 4),
                "{}: the parallel reader gave up on a protocol {} file",
                path.display(),
                data[1]
            );
            continue;
        };
        parallel += 1;
        let a = canonical(&seq);
        // Default chunks, and one frame per chunk: every structure then crosses chunks.
        let small = snapshot::load_bytes_parallel_chunked(&data, 1)
            .unwrap_or_else(|| panic!("{}: small chunks", path.display()));
        // The stitch reading every opcode back from the input (as it does for long ones).
        snapshot::keep_raw_opcode_bytes(false);
        let read_back = snapshot::load_bytes_parallel_chunked(&data, 1);
        snapshot::keep_raw_opcode_bytes(true);
        let read_back = read_back.unwrap_or_else(|| panic!("{}: read back", path.display()));
        for b in [canonical(&par), canonical(&small), canonical(&read_back)] {
            assert_eq!(a.len(), b.len(), "{}", path.display());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x, y, "{}", path.display());
            }
        }
        assert_eq!(
            report_json(seq),
            report_json(par),
            "{}: reports differ",
            path.display()
        );
    }
    assert!(parallel >= 10, "only {parallel} fixtures read in parallel");
}

/// Cut or changed inputs: the parallel reader either declines or agrees with the sequential one.
#[test]
fn cut_and_mutated_inputs_never_read_differently() {
    for path in common::snapshot_fixtures() {
        let data = read(&path);
        let check = |bytes: &[u8], what: &str, small: bool| {
            for par in [
                snapshot::load_bytes_parallel(bytes),
                small
                    .then(|| snapshot::load_bytes_parallel_chunked(bytes, 1))
                    .flatten(),
            ]
            .into_iter()
            .flatten()
            {
                match snapshot::load_bytes_sequential("m", bytes) {
                    Ok(seq) => assert!(
                        canonical(&seq) == canonical(&par),
                        "{} {what}: results differ",
                        path.display()
                    ),
                    Err(e) => panic!(
                        "{} {what}: the sequential reader fails ({e}) but the parallel one \
                         reads it",
                        path.display()
                    ),
                }
            }
        };
        for k in 1..16 {
            let cut = data.len() * k / 16;
            check(&data[..cut], &format!("cut at {cut}"), k % 4 == 0);
        }
        let mut rng = 0x9e3779b97f4a7c15u64 ^ data.len() as u64;
        for i in 0..32 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let pos = (rng % data.len() as u64) as usize;
            let mut m = data.clone();
            m[pos] = (rng >> 32) as u8;
            check(
                &m,
                &format!("byte {pos} set to {:#04x}", m[pos]),
                i % 4 == 0,
            );
        }
    }
}

/// The parallel reader gives the same snapshot on one thread and on many (chunks are cut by
/// size, not by thread count; ids are assigned in file order after the chunks ran), and the
/// report is the same whether its passes cut the trace into a few big pieces or many small
/// ones (the fixtures are smaller than the default piece).
#[test]
fn one_thread_and_many_threads_read_the_same() {
    let default_piece = snapscan::analysis::summary::piece_entries();
    let whole: Vec<_> = common::snapshot_fixtures()
        .iter()
        .map(|path| snapshot::load_bytes_parallel_chunked(&read(path), 1).map(report_json))
        .collect();
    // Other tests may run while the pieces are small: their results must not change either.
    snapscan::analysis::summary::set_piece_entries(7);
    for (path, whole) in common::snapshot_fixtures().iter().zip(whole) {
        let data = read(path);
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    snapshot::load_bytes_parallel_chunked(&data, 1)
                        .map(|s| (canonical(&s), report_json(s)))
                })
        };
        // One thread reads the chunks in order; two split them between a first thread and a
        // helper that walks ahead; four walk every chunk first.
        let one = run(1);
        assert!(one == run(2), "{}: two threads", path.display());
        assert!(one == run(4), "{}: four threads", path.display());
        assert!(
            one.map(|(_, report)| report) == whole,
            "{}: the pieces change the report",
            path.display()
        );
    }
    snapscan::analysis::summary::set_piece_entries(default_piece);
}

/// With two threads the second one walks ahead and reads from a chunk on, then takes the
/// first one's last chunks back (forced here: the first waits for it): wherever they meet, the
/// snapshot is the same.
#[test]
fn two_threads_read_the_same_wherever_they_meet() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for path in common::snapshot_fixtures() {
        let data = read(&path);
        let whole = snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s));
        for split in [0, 1, 2, 3, 5, 9, 17, 40, 1000] {
            snapshot::force_in_order_split(Some(split));
            let got = pool
                .install(|| snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s)));
            snapshot::force_in_order_split(None);
            assert!(got == whole, "{}: split at chunk {split}", path.display());
        }
    }
}

/// With two threads the second one reads its memo base from inside its first chunk (a
/// `free_completed` fetching the frames list its `free_requested` stored) instead of counting
/// the chunks before it. A wrong base is caught where the first thread reaches that chunk, and
/// the input is read again the counted way: the snapshot is the same.
#[test]
fn a_wrong_probed_base_is_caught() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for name in [
        "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
        "real/ZidongLiu__DeComFL__memory.pickle",
        "captured/protocol5_eval.pickle",
    ] {
        let data = read(&common::fixture(name));
        let whole = snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s));
        assert!(whole.is_some(), "{name}: the parallel reader takes it");
        for error in [1, u32::MAX] {
            for split in [1, 5, 17] {
                snapshot::force_in_order_split(Some(split));
                snapshot::force_probe_error(error);
                let got = pool.install(|| {
                    snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s))
                });
                snapshot::force_probe_error(0);
                snapshot::force_in_order_split(None);
                assert!(
                    got == whole,
                    "{name}: split at {split}, base off by {error}"
                );
            }
        }
    }
}

/// With two threads the second one helps only if the pool starts it: here the pool's other
/// thread is busy until the read is done, so the first thread must read every chunk itself
/// rather than wait for a helper that never comes.
#[test]
fn a_helper_the_pool_never_starts_does_not_stall_the_read() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let data = read(&common::fixture(
        "real/notHanmin__assignment2-systems__memory_snapshot.pickle",
    ));
    let whole = snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s));
    assert!(whole.is_some(), "the parallel reader takes the fixture");
    let read_done = AtomicBool::new(false);
    let busy_started = AtomicBool::new(false);
    let got = std::sync::Mutex::new(None);
    pool.scope(|scope| {
        scope.spawn(|_| {
            busy_started.store(true, Ordering::Release);
            while !read_done.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        });
        scope.spawn(|_| {
            while !busy_started.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            let s = snapshot::load_bytes_parallel_chunked(&data, 1).map(|s| canonical(&s));
            *got.lock().unwrap() = Some(s);
            read_done.store(true, Ordering::Release);
        });
    });
    assert!(got.into_inner().unwrap() == Some(whole));
}

/// PyTorch writes 2^64 − 1 (a 9-byte LONG1, outside int64) as the line of C++ frames its unwinder
/// could not resolve. Both readers take the file and read those lines as 0, no line: the same
/// snapshot as the source fixture, whose C++ frames have line 0.
#[test]
fn unresolved_cpp_frame_lines_are_read_as_no_line() {
    let odd = read(&common::fixture("synth/stacks-all-unresolved-lines.pickle"));
    let src = read(&common::fixture("synth/truncated-stacks-all.pickle"));
    let long1_max = [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0];
    assert!(
        odd.windows(long1_max.len()).any(|w| w == long1_max),
        "the fixture holds 2^64 - 1 as LONG1"
    );
    let want = canonical(&snapshot::load_bytes_sequential("src", &src).expect("source reads"));
    let seq = snapshot::load_bytes_sequential("odd", &odd).expect("sequential reader takes it");
    assert_eq!(canonical(&seq), want);
    let par = snapshot::load_bytes_parallel(&odd).expect("parallel reader takes it");
    assert_eq!(canonical(&par), want);
    common::snapscan()
        .args(["report", "--format", "json"])
        .arg(common::fixture("synth/stacks-all-unresolved-lines.pickle"))
        .assert()
        .success();
}

/// Two segments that hold one blocks list (the second fetches it from the memo). The parallel
/// reader gives back the pool room of a segment's dicts once the segment is a row; the list
/// fetched again must not be read from what is left of them: the parallel reader declines the
/// file or reads what the sequential reader reads, at default chunks and one frame per chunk.
#[test]
fn a_blocks_list_shared_by_two_segments_is_never_read_from_dropped_dicts() {
    use snapscan::pickle::{self, Value};
    let src = read(&common::fixture(
        "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ));
    let mut doc = pickle::parse(&src).expect("fixture parses");
    let field = |doc: &pickle::Document, d: Value, name: &str| -> Option<(usize, Value)> {
        let (Value::Dict(d), Some(k)) = (d, doc.strings.lookup(name)) else {
            return None;
        };
        let items = doc.dict(d);
        let i = items.iter().rposition(|(kk, _)| *kk == Value::Str(k))?;
        Some((i, items[i].1))
    };
    let root = doc.root.expect("a root");
    let Some((_, Value::List(segments))) = field(&doc, root, "segments") else {
        panic!("segments list")
    };
    let segs = doc.seq(segments).to_vec();
    let (first, second) = (segs[0], segs[1]);
    let (_, blocks) = field(&doc, first, "blocks").expect("first segment's blocks");
    let (i, theirs) = field(&doc, second, "blocks").expect("second segment's blocks");
    assert_ne!(blocks, theirs);
    let Value::Dict(d) = second else {
        unreachable!()
    };
    doc.dicts[d.0 as usize][i].1 = blocks;
    let bytes = crate::replica::write(&doc);
    assert!(
        bytes.len() < src.len(),
        "the second list is a memo fetch now"
    );

    let seq = snapshot::load_bytes_sequential("shared", &bytes);
    for par in [
        snapshot::load_bytes_parallel(&bytes),
        snapshot::load_bytes_parallel_chunked(&bytes, 1),
    ] {
        match (&seq, par) {
            (_, None) => {}
            (Ok(seq), Some(par)) => assert_eq!(canonical(seq), canonical(&par)),
            (Err(e), Some(_)) => panic!("the sequential reader fails ({e}), the parallel reads"),
        }
    }
    // What the sequential reader makes of it, as users see it: the file reads, and both
    // segments list the first one's blocks.
    let seq = seq.expect("the sequential reader takes a shared blocks list");
    assert_eq!(seq.segments[0].blocks.len(), seq.segments[1].blocks.len());
}

/// Segments as torch writes them, read by the chunk machines straight from their bytes: a
/// segment of 2,500 blocks (three batches of APPENDS), one of a single block (APPEND), one of
/// none, each with its own `segment_pool_id` tuple. The parallel reader takes the file and
/// reads what the sequential reader reads, at default chunks and one frame per chunk.
#[test]
fn segments_of_many_one_and_no_blocks_read_the_same_in_parallel() {
    use snapscan::pickle::{self, DictId, Value};
    let src = read(&common::fixture(
        "real/MAGMA27__assignment2-systems__memory_snapshot.pickle",
    ));
    let mut doc = pickle::parse(&src).expect("fixture parses");
    let key = |doc: &pickle::Document, name: &str| Value::Str(doc.strings.lookup(name).unwrap());
    let field = |doc: &pickle::Document, d: Value, k: Value| -> Option<(usize, Value)> {
        let Value::Dict(d) = d else { return None };
        let items = doc.dict(d);
        let i = items.iter().position(|(kk, _)| *kk == k)?;
        Some((i, items[i].1))
    };
    let root = doc.root.expect("a root");
    let (blocks_key, address_key) = (key(&doc, "blocks"), key(&doc, "address"));
    let Some((_, Value::List(segments))) = field(&doc, root, key(&doc, "segments")) else {
        panic!("segments list")
    };
    let segs = doc.seq(segments).to_vec();
    assert!(segs.len() >= 3, "the fixture has segments to change");
    let blocks_of = |doc: &pickle::Document, seg: Value| match field(doc, seg, blocks_key) {
        Some((i, Value::List(l))) => (i, l),
        _ => panic!("a blocks list"),
    };
    // Many blocks: copies of the first segment's first block, each its own dict.
    let (_, first_blocks) = blocks_of(&doc, segs[0]);
    let Value::Dict(model) = doc.seq(first_blocks)[0] else {
        panic!("a block dict")
    };
    let mut many = Vec::new();
    for n in 0..2500i64 {
        let mut items = doc.dict(model).to_vec();
        for (k, v) in &mut items {
            if *k == address_key {
                *v = Value::Int(0x7f00_0000_0000 + n * 512);
            }
        }
        doc.dicts.push(items);
        many.push(Value::Dict(DictId(doc.dicts.len() as u32 - 1)));
    }
    doc.seqs[first_blocks.0 as usize] = many;
    let (_, one) = blocks_of(&doc, segs[1]);
    doc.seqs[one.0 as usize].truncate(1);
    let (_, none) = blocks_of(&doc, segs[2]);
    doc.seqs[none.0 as usize].clear();
    let bytes = crate::replica::write(&doc);

    let seq = snapshot::load_bytes_sequential("segments", &bytes).expect("the file reads");
    assert_eq!(seq.segments[0].blocks.len(), 2500);
    assert_eq!(seq.segments[1].blocks.len(), 1);
    assert!(seq.segments[2].blocks.is_empty());
    for par in [
        snapshot::load_bytes_parallel(&bytes),
        snapshot::load_bytes_parallel_chunked(&bytes, 1),
    ] {
        let par = par.expect("the parallel reader takes torch's segment layout");
        assert_eq!(segment_lines(&seq), segment_lines(&par));
        assert_eq!(canonical(&seq), canonical(&par));
    }
}

/// Frames lists whose memo fetches hold APPENDS and SETITEMS side by side inside an index
/// (LONG_BINGET of 0x7565 is `6a 65 75 00 00`). The chunk machines find the end of a frames
/// list that closes its entry by searching for those two bytes and take it only when the bytes
/// before are a list read before; here the search stops inside an index first. The file must
/// still read as the sequential reader reads it, at default chunks and one frame per chunk.
#[test]
fn frames_lists_with_appends_and_setitems_inside_an_index_read_the_same_in_parallel() {
    use snapscan::pickle::{DictId, Document, SeqId, Value};
    let mut doc = Document::default();
    let text = |doc: &mut Document, t: &str| Value::Str(doc.strings.intern(t));
    let dict = |doc: &mut Document, items: Vec<(Value, Value)>| {
        doc.dicts.push(items);
        Value::Dict(DictId(doc.dicts.len() as u32 - 1))
    };
    let list = |doc: &mut Document, items: Vec<Value>| {
        doc.seqs.push(items);
        Value::List(SeqId(doc.seqs.len() as u32 - 1))
    };
    // 30,000 strings come first: the frame dicts after them are memoized from about index
    // 30,010 on, one index each (their name, file name and line are shared or not memoized).
    let pad: Vec<Value> = (0..30_000)
        .map(|i| text(&mut doc, &format!("p{i}")))
        .collect();
    let pad = list(&mut doc, pad);
    let (name, filename, line) = (
        text(&mut doc, "name"),
        text(&mut doc, "filename"),
        text(&mut doc, "line"),
    );
    let (fun, file) = (text(&mut doc, "forward"), text(&mut doc, "model.py"));
    let frames: Vec<Value> = (0..120)
        .map(|n| {
            dict(
                &mut doc,
                vec![(name, fun), (filename, file), (line, Value::Int(n))],
            )
        })
        .collect();
    let keys = ["action", "addr", "size", "stream", "time_us", "frames"].map(|k| text(&mut doc, k));
    let actions = ["alloc", "free_requested", "free_completed"].map(|a| text(&mut doc, a));
    let mut entries = Vec::new();
    for k in 0..600i64 {
        // The first list defines all 120 frames; later ones repeat five stacks of 60 frames,
        // each list its own object shared by its frees, as torch writes them.
        let stack = match k {
            0 => frames.clone(),
            _ => frames[(k as usize % 5) * 12..][..60].to_vec(),
        };
        let stack = list(&mut doc, stack);
        for (j, &action) in actions.iter().enumerate() {
            let values = [
                action,
                Value::Int(0x7f00_0000_0000 + k * 1024),
                Value::Int(512),
                Value::Int(0),
                Value::Int(k * 10 + j as i64),
                stack,
            ];
            let items = keys.iter().copied().zip(values).collect();
            entries.push(dict(&mut doc, items));
        }
    }
    let trace = list(&mut doc, entries);
    let traces = list(&mut doc, vec![trace]);
    let segments = list(&mut doc, vec![]);
    let root_keys = ["pad", "segments", "device_traces"].map(|k| text(&mut doc, k));
    let root = dict(
        &mut doc,
        root_keys.into_iter().zip([pad, segments, traces]).collect(),
    );
    doc.root = Some(root);
    let bytes = crate::replica::write(&doc);
    assert!(
        bytes.windows(3).any(|w| w == [0x6a, 0x65, 0x75]),
        "a frames list fetches a memo index whose bytes hold APPENDS, SETITEMS"
    );

    let seq = snapshot::load_bytes_sequential("frames", &bytes).expect("the file reads");
    assert_eq!(seq.device_traces[0].len(), 1800);
    for par in [
        snapshot::load_bytes_parallel(&bytes),
        snapshot::load_bytes_parallel_chunked(&bytes, 1),
    ] {
        let par = par.expect("the parallel reader takes torch's trace layout");
        assert_eq!(canonical(&seq), canonical(&par));
    }
}
