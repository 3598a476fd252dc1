//! Hostile, malformed and inconsistent inputs.
//!
//! 1. Inputs built to hurt a reader run through the CLI under limits: each must exit 2 with a
//!    message that names the problem (and the byte offset where the input has one) using less
//!    than 2 s of CPU time (the child's own, from `wait4`, so a busy machine does not fail the
//!    test) within an address-space rlimit of 256 MiB (which bounds the resident memory too; a
//!    child that needs more dies on its first failed allocation). Inputs are built here, none is
//!    committed.
//! 2. Regressions found by fuzzing (fuzz/README.md), minimized inputs under tests/regressions/.
//! 3. Data quality: small hand-made JSON snapshots, one per warning of `analysis::quality`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use snapscan::analysis::report::{file_report, ReportOptions};
use snapscan::report::{FileReport, QualityWarning};
use snapscan::snapshot::{self, LoadedSnapshot};

use crate::common;

// ---------------------------------------------------------------------------------------------
// Running the binary under limits.

const MAX_CPU: Duration = Duration::from_secs(2);
/// Address-space limit of the child. (Peak RSS from `wait4` is no measure here: a forked child
/// inherits the high-water mark of the test process, which other tests make large.)
const MAX_ADDRESS_SPACE: u64 = 256 << 20;
/// A child still running after this is killed (a hang).
const WALL_LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct Run {
    /// Exit status; `None` when a signal ended the child.
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    cpu: Duration,
    wall: Duration,
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snapscan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Writes `bytes` to a scratch file named `name`.
fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).expect("write scratch file");
    path
}

#[cfg(unix)]
fn run_limited(args: &[&std::ffi::OsStr]) -> Run {
    run_limited_in(args, MAX_ADDRESS_SPACE, None)
}

/// [`run_limited`] with another address-space limit.
#[cfg(unix)]
fn run_limited_to(args: &[&std::ffi::OsStr], address_space: u64) -> Run {
    run_limited_in(args, address_space, None)
}

/// [`run_limited`] with another address-space limit, and stdin from a file.
#[cfg(unix)]
fn run_limited_in(args: &[&std::ffi::OsStr], address_space: u64, stdin: Option<&Path>) -> Run {
    use std::os::unix::process::CommandExt;

    let dir = scratch_dir();
    let tag = format!("{:?}", std::thread::current().id())
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>();
    let out_path = dir.join(format!("stdout-{tag}"));
    let err_path = dir.join(format!("stderr-{tag}"));
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"));
    let input = match stdin {
        Some(p) => std::process::Stdio::from(std::fs::File::open(p).expect("stdin file")),
        None => std::process::Stdio::null(),
    };
    cmd.args(args)
        .stdin(input)
        .stdout(out)
        .stderr(err)
        // Few threads and one malloc arena (glibc reserves 64 MiB of address space per extra
        // arena): the address-space limit then measures the data.
        .env("RAYON_NUM_THREADS", "2")
        .env("MALLOC_ARENA_MAX", "1");
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = |resource, value: libc::rlim_t| {
                let l = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                if libc::setrlimit(resource, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            limit(libc::RLIMIT_AS, address_space as libc::rlim_t)?;
            limit(libc::RLIMIT_CPU, 30)?;
            limit(libc::RLIMIT_CORE, 0)?;
            Ok(())
        });
    }
    let start = Instant::now();
    let child = cmd.spawn().expect("spawn snapscan");
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waiting for our own child; pointers are valid for the call.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        if start.elapsed() > WALL_LIMIT {
            // SAFETY: signalling and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::wait4(pid, &mut status, 0, &mut usage);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = start.elapsed();
    drop(child); // already reaped above
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    let run = Run {
        code,
        signal,
        stdout: read(&out_path),
        stderr: read(&err_path),
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        wall,
    };
    let _ = std::fs::remove_file(out_path);
    let _ = std::fs::remove_file(err_path);
    run
}

#[cfg(not(unix))]
fn run_limited_in(args: &[&std::ffi::OsStr], _: u64, _: Option<&Path>) -> Run {
    run_limited(args)
}

#[cfg(not(unix))]
fn run_limited_to(args: &[&std::ffi::OsStr], _address_space: u64) -> Run {
    run_limited(args)
}

#[cfg(not(unix))]
fn run_limited(args: &[&std::ffi::OsStr]) -> Run {
    let start = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
        .args(args)
        .output()
        .expect("spawn snapscan");
    let wall = start.elapsed();
    Run {
        code: out.status.code(),
        signal: None,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        cpu: wall,
        wall,
    }
}

/// `snapscan report FILE` on `bytes`, which must fail with exit 2, within the limits, with every
/// `needle` in the message.
fn expect_error(name: &str, bytes: &[u8], needles: &[&str]) -> Run {
    let path = scratch_file(name, bytes);
    let run = run_limited(&["report".as_ref(), path.as_os_str()]);
    let _ = std::fs::remove_file(&path);
    check_error(name, &run, needles);
    run
}

fn check_error(name: &str, run: &Run, needles: &[&str]) {
    let summary = format!(
        "{name}: exit {:?} (signal {:?}), {:.2} s CPU, {:.2} s wall; stderr: {}",
        run.code,
        run.signal,
        run.cpu.as_secs_f64(),
        run.wall.as_secs_f64(),
        run.stderr.chars().take(600).collect::<String>()
    );
    assert!(run.wall < WALL_LIMIT, "hang: {summary}");
    assert!(
        !run.stderr.contains("memory allocation of"),
        "needs more than {} MiB: {summary}",
        MAX_ADDRESS_SPACE >> 20
    );
    assert_eq!(run.code, Some(2), "{summary}");
    assert!(run.cpu < MAX_CPU, "too slow: {summary}");
    assert!(
        run.stderr.starts_with("snapscan: error: "),
        "no error line: {summary}"
    );
    assert!(
        run.stderr.contains(name),
        "the message must name the file: {summary}"
    );
    for n in needles {
        assert!(run.stderr.contains(n), "missing {n:?}: {summary}");
    }
    assert!(!run.stderr.contains("panicked"), "panic: {summary}");
    assert!(run.stdout.is_empty(), "no report on error: {summary}");
}

// ---------------------------------------------------------------------------------------------
// Building pickles by hand.

const PROTO4: &[u8] = &[0x80, 0x04];
const MEMOIZE: u8 = 0x94;

fn text(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len() + 5);
    if b.len() < 256 {
        out.push(0x8c); // SHORT_BINUNICODE
        out.push(b.len() as u8);
    } else {
        out.push(b'X'); // BINUNICODE
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(b);
    out
}

fn int(v: i32) -> Vec<u8> {
    let mut out = vec![b'J'];
    out.extend_from_slice(&v.to_le_bytes());
    out
}

/// LONG_BINGET of memo slot `i`.
fn get(i: u32) -> Vec<u8> {
    let mut out = vec![b'j'];
    out.extend_from_slice(&i.to_le_bytes());
    out
}

fn repeat(piece: &[u8], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(piece.len() * n);
    for _ in 0..n {
        out.extend_from_slice(piece);
    }
    out
}

/// `{k: v, …}` from pickled keys and values (EMPTY_DICT, MARK, …, SETITEMS).
fn dict(items: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = vec![b'}', b'('];
    for (k, v) in items {
        out.extend(text(k));
        out.extend_from_slice(v);
    }
    out.push(b'u');
    out
}

/// `[…]` from pickled items (EMPTY_LIST, MARK, …, APPENDS).
fn list(items: &[u8]) -> Vec<u8> {
    let mut out = vec![b']', b'('];
    out.extend_from_slice(items);
    out.push(b'e');
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

// ---------------------------------------------------------------------------------------------
// 1. Code-executing opcodes.

/// `os.system(command)` as pickle.dumps writes it with protocol 4 (STACK_GLOBAL + REDUCE).
fn os_system_protocol4(command: &str) -> Vec<u8> {
    cat(&[
        PROTO4,
        &text("os"),
        &text("system"),
        &[0x93], // STACK_GLOBAL
        &text(command),
        &[0x85, b'R', b'.'], // TUPLE1, REDUCE, STOP
    ])
}

#[test]
fn os_system_via_stack_global_and_reduce_is_refused_and_runs_nothing() {
    let marker = scratch_dir().join("pwned-stack-global");
    let _ = std::fs::remove_file(&marker);
    let data = os_system_protocol4(&format!("touch {}", marker.display()));
    expect_error(
        "stack-global.pickle",
        &data,
        &["refusing opcode STACK_GLOBAL at byte 14", "only plain data"],
    );
    assert!(!marker.exists(), "the pickle's command ran");
}

#[test]
fn os_system_via_global_and_reduce_is_refused_and_runs_nothing() {
    let marker = scratch_dir().join("pwned-global");
    let _ = std::fs::remove_file(&marker);
    // Protocol 2: GLOBAL 'os system', then the argument tuple and REDUCE.
    let mut data = b"\x80\x02cos\nsystem\n".to_vec();
    data.extend(text(&format!("touch {}", marker.display())));
    data.extend_from_slice(b"\x85R.");
    expect_error(
        "global.pickle",
        &data,
        &["refusing opcode GLOBAL at byte 2", "only plain data"],
    );
    // Protocol 0 has no header: refused before any opcode runs, naming the first byte.
    let legacy = format!("cos\nsystem\n(S'touch {}'\ntR.", marker.display());
    expect_error(
        "global-protocol0.pickle",
        legacy.as_bytes(),
        &["not a memory snapshot", "first byte 0x63"],
    );
    assert!(!marker.exists(), "the pickle's command ran");
}

#[test]
fn every_code_executing_opcode_is_refused_with_its_offset() {
    use snapscan::pickle::opcodes as op;
    let refused = [
        (op::GLOBAL, "GLOBAL"),
        (op::STACK_GLOBAL, "STACK_GLOBAL"),
        (op::REDUCE, "REDUCE"),
        (op::BUILD, "BUILD"),
        (op::INST, "INST"),
        (op::OBJ, "OBJ"),
        (op::NEWOBJ, "NEWOBJ"),
        (op::NEWOBJ_EX, "NEWOBJ_EX"),
        (op::EXT1, "EXT1"),
        (op::EXT2, "EXT2"),
        (op::EXT4, "EXT4"),
        (op::PERSID, "PERSID"),
        (op::BINPERSID, "BINPERSID"),
        (op::NEXT_BUFFER, "NEXT_BUFFER"),
        (op::READONLY_BUFFER, "READONLY_BUFFER"),
    ];
    for (code, name) in refused {
        // A plausible prefix (an empty dict and a string), then the opcode at byte 6.
        let mut data = cat(&[PROTO4, b"}", &text("x")]);
        data.push(code);
        data.extend_from_slice(b"\0\0\0\0\0\0\0\0.");
        let err = snapshot::load_bytes("evil", &data)
            .expect_err(name)
            .to_string();
        assert!(
            err.contains(&format!("refusing opcode {name} at byte 6")),
            "{name}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Memo bombs: one object memoized and referenced millions of times. The reader must keep
// references (16 bytes each), and whatever builds on the document must not copy the object once
// per reference.

/// The reader shares the list (16 bytes per reference). Found by this test (fixed): the decoder
/// reserved a `Segment` (112 bytes) per item of `segments` before looking at the first one, so
/// 8 MB of input asked for 448 MB at once.
#[test]
fn memo_bomb_list_referenced_four_million_times_is_shared() {
    // {"segments": [L, L, …]} with L = [] memoized once: 8 MB of BINGETs.
    let data = cat(&[
        PROTO4,
        b"]",
        &[MEMOIZE],
        b"0", // POP: L stays in the memo only
        &dict(&[("segments", list(&repeat(&[b'h', 0], 4_000_000)))]),
        b".",
    ]);
    expect_error(
        "memo-list.pickle",
        &data,
        &["segments[0]: expected dict, found list"],
    );
}

/// A block dict (memo 0), a list of 1000 references to it (memo 1), a segment dict holding that
/// list (memo 2).
fn shared_segment_prefix() -> Vec<u8> {
    let block = dict(&[
        ("size", int(512)),
        ("requested_size", int(512)),
        ("state", text("active_allocated")),
    ]);
    let mut out = PROTO4.to_vec();
    // EMPTY_DICT MEMOIZE, then fill it: memo 0 is the block dict.
    out.extend_from_slice(&block[..1]);
    out.push(MEMOIZE);
    out.extend_from_slice(&block[1..]);
    out.push(b'0');
    out.extend_from_slice(b"]");
    out.push(MEMOIZE);
    out.extend(list(&repeat(&get(0), 1000))[1..].iter().copied());
    out.push(b'0');
    let segment = dict(&[
        ("device", int(0)),
        ("address", int(0)),
        ("total_size", int(512_000)),
        ("blocks", get(1)),
    ]);
    out.extend_from_slice(&segment[..1]);
    out.push(MEMOIZE);
    out.extend_from_slice(&segment[1..]);
    out.push(b'0');
    out
}

/// Found by these tests: the decoder copies a segment (and its 1000 blocks) once per reference,
/// so 5 MB of input asks for 10^9 blocks (out of memory).
#[test]
fn memo_bomb_segment_referenced_a_million_times() {
    let data = cat(&[
        &shared_segment_prefix(),
        &dict(&[
            ("segments", list(&repeat(&get(2), 1_000_000))),
            ("device_traces", b"]".to_vec()),
        ]),
        b".",
    ]);
    expect_error("memo-segment.pickle", &data, &["segments[1]", "memo bomb"]);
}

/// One trace-entry dict (memo 0).
fn shared_entry_prefix() -> Vec<u8> {
    let entry = dict(&[
        ("action", text("alloc")),
        ("addr", int(4096)),
        ("size", int(512)),
    ]);
    let mut out = PROTO4.to_vec();
    out.extend_from_slice(&entry[..1]);
    out.push(MEMOIZE);
    out.extend_from_slice(&entry[1..]);
    out.push(b'0');
    out
}

/// Found by these tests: one trace list of 200,000 entries shared by 1000 devices is decoded
/// 1000 times (2 × 10^8 entries from 1 MB: out of time and memory).
#[test]
fn memo_bomb_trace_list_shared_by_a_thousand_devices() {
    let mut traces = b"]".to_vec();
    traces.push(MEMOIZE); // memo 1: the shared trace list
    traces.extend(list(&repeat(&get(0), 200_000))[1..].iter().copied());
    let data = cat(&[
        &shared_entry_prefix(),
        &dict(&[
            ("segments", b"]".to_vec()),
            (
                "device_traces",
                list(&cat(&[&traces, &repeat(&get(1), 999)])),
            ),
        ]),
        b".",
    ]);
    expect_error(
        "memo-traces.pickle",
        &data,
        &["device_traces[", "memo bomb"],
    );
}

/// Found by these tests: one entry dict referenced 2 million times becomes 2 million entries
/// (exit 0 with a report, about 260 MB): references must be counted, not copied.
#[test]
fn memo_bomb_trace_entry_referenced_two_million_times() {
    let data = cat(&[
        &shared_entry_prefix(),
        &dict(&[
            ("segments", b"]".to_vec()),
            ("device_traces", list(&list(&repeat(&get(0), 2_000_000)))),
        ]),
        b".",
    ]);
    expect_error(
        "memo-entry.pickle",
        &data,
        &["device_traces[0][1]", "memo bomb"],
    );
}

/// Found by these tests: "billion laughs" in `allocator_settings` (kept whole as JSON): 14
/// levels of lists, each holding 100 references to the level below, is 7 KB of input and 10^28
/// nodes once expanded.
#[test]
fn memo_bomb_nested_lists_in_allocator_settings() {
    let mut data = PROTO4.to_vec();
    data.extend_from_slice(b"]");
    data.push(MEMOIZE); // memo 0: []
    data.push(b'0');
    for level in 1..15u32 {
        data.extend_from_slice(b"]");
        data.push(MEMOIZE); // memo `level`
        data.push(b'(');
        data.extend(repeat(&get(level - 1), 100));
        data.push(b'e');
        data.push(b'0');
    }
    data.extend(dict(&[
        ("segments", b"]".to_vec()),
        ("device_traces", b"]".to_vec()),
        ("allocator_settings", dict(&[("x", get(14))])),
    ]));
    data.push(b'.');
    expect_error(
        "memo-settings.pickle",
        &data,
        &["allocator_settings", "memo bomb"],
    );
}

/// Found by these tests: memo indices 2^20 apart make the reader grow its dense memo table by
/// 2^20 slots per 5-byte opcode (4000 opcodes: 20 KB of input, gigabytes of memory).
#[test]
fn memo_indices_far_apart_do_not_allocate_the_gaps() {
    let mut data = PROTO4.to_vec();
    data.extend_from_slice(b"]");
    for k in 1..=4000u32 {
        data.push(b'r'); // LONG_BINPUT
        data.extend_from_slice(&(k << 20).to_le_bytes());
    }
    data.extend_from_slice(b"0K\x05."); // POP, then the root is the int 5
    expect_error(
        "memo-sparse.pickle",
        &data,
        &["expected a dict with `segments`", "found int"],
    );
}

// ---------------------------------------------------------------------------------------------
// 2b. Byte budgets. The rule for the whole process: on any input, its memory stays within
//     256 MiB plus the size of the pickle after decompression, which is itself capped; a
//     failed allocation is an error (exit 2), never an abort. Checked under an address-space
//     limit of that size (which bounds the resident memory too).

/// What a small compressed input may decompress to by default.
const DECOMPRESSED_CAP: u64 = snapscan::input::RATIO_FLOOR;

/// The memory rule for an input that decompresses to `decompressed` bytes.
fn memory_rule(decompressed: u64) -> u64 {
    MAX_ADDRESS_SPACE + decompressed
}

/// `report FILE` on `bytes` within `address_space`, which must fail with exit 2 naming the
/// file and every needle.
fn expect_error_within(name: &str, bytes: &[u8], address_space: u64, needles: &[&str]) -> Run {
    let path = scratch_file(name, bytes);
    let run = run_limited_in(&["report".as_ref(), path.as_os_str()], address_space, None);
    let _ = std::fs::remove_file(&path);
    check_error(name, &run, needles);
    run
}

/// A pickle whose one BINBYTES8 claims 24 GiB, followed by `zeros` zero bytes of it, written
/// into `w` a MiB at a time (the test never holds the whole of it).
fn zeros_after_binbytes8(w: &mut impl std::io::Write, zeros: u64) {
    w.write_all(&cat(&[PROTO4, &[0x8e], &(24u64 << 30).to_le_bytes()]))
        .unwrap();
    let piece = vec![0u8; 1 << 20];
    for _ in 0..zeros >> 20 {
        w.write_all(&piece).unwrap();
    }
}

const OVER_THE_CAP: u64 = DECOMPRESSED_CAP + (64 << 20);

/// Found by an attack on the release build: a 98 KB `.zst` of one BINBYTES8 took 24 GB before
/// the kernel killed it. Its frame states its size; the cap refuses it before decoding.
#[test]
fn zstd_bomb_stating_its_size_stops_at_the_cap() {
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    enc.set_pledged_src_size(Some(11 + OVER_THE_CAP)).unwrap();
    zeros_after_binbytes8(&mut enc, OVER_THE_CAP);
    let zst = enc.finish().unwrap();
    assert!(zst.len() < 200_000, "{}", zst.len());
    let run = expect_error_within(
        "bomb-sized.zst",
        &zst,
        memory_rule(DECOMPRESSED_CAP),
        &[
            "zstd data decompresses to more than 256.0MiB",
            "--max-decompressed",
        ],
    );
    assert!(run.wall < Duration::from_secs(5), "{run:?}");
}

/// Found by the same attack: zero blocks in a frame without a content size aborted at a 4 GiB
/// allocation. The stream is cut at the cap.
#[test]
fn zstd_bomb_without_a_content_size_stops_at_the_cap() {
    let mut enc = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    enc.include_contentsize(false).unwrap();
    zeros_after_binbytes8(&mut enc, OVER_THE_CAP);
    let zst = enc.finish().unwrap();
    assert!(zstd::zstd_safe::get_frame_content_size(&zst)
        .unwrap()
        .is_none());
    expect_error_within(
        "bomb-unsized.zst",
        &zst,
        memory_rule(DECOMPRESSED_CAP),
        &[
            "zstd data decompresses to more than",
            "--max-decompressed 64GiB",
        ],
    );
}

/// Found by the same attack: a 10 MB `.gz` of 160 concatenated members aborted at a 4 GiB
/// allocation (each member's trailer states a small size).
#[test]
fn gzip_of_many_members_stops_at_the_cap() {
    let mut gz = Vec::new();
    let members = 160u64;
    for m in 0..members {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        if m == 0 {
            zeros_after_binbytes8(&mut enc, OVER_THE_CAP / members);
        } else {
            std::io::Write::write_all(&mut enc, &vec![0u8; (OVER_THE_CAP / members) as usize])
                .unwrap();
        }
        gz.extend(enc.finish().unwrap());
    }
    expect_error_within(
        "bomb-members.gz",
        &gz,
        memory_rule(DECOMPRESSED_CAP),
        &["gzip data decompresses to more than", "--max-decompressed"],
    );
}

/// `report - < /dev/zero` grew to 8.4 GB: stdin that starts like no snapshot is refused at
/// its first bytes, and stdin that does is read only up to the cap.
#[test]
#[cfg(unix)]
fn stdin_is_read_within_the_cap() {
    let run = run_limited_in(
        &["report".as_ref(), "-".as_ref()],
        MAX_ADDRESS_SPACE,
        Some(Path::new("/dev/zero")),
    );
    check_error(
        "<stdin>",
        &run,
        &["not a memory snapshot", "first byte 0x00"],
    );

    let path = scratch_dir().join("stdin-endless.pickle");
    zeros_after_binbytes8(&mut std::fs::File::create(&path).unwrap(), 64 << 20);
    let run = run_limited_in(
        &[
            "report".as_ref(),
            "--max-decompressed".as_ref(),
            "16MiB".as_ref(),
            "-".as_ref(),
        ],
        memory_rule(16 << 20),
        Some(&path),
    );
    let _ = std::fs::remove_file(&path);
    check_error(
        "<stdin>",
        &run,
        &[
            "stdin holds more than 16.0MiB",
            "the cap set by --max-decompressed",
        ],
    );
}

/// A snapshot dict with `top`'s keys (empty `segments` and `device_traces` unless given), a
/// `stored` value memoized first (memo 0).
fn with_shared(stored: &[u8], top: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut data = PROTO4.to_vec();
    data.extend_from_slice(stored);
    data.push(MEMOIZE);
    data.push(b'0');
    let mut items: Vec<(&str, Vec<u8>)> = [("segments", b"]"), ("device_traces", b"]")]
        .into_iter()
        .filter(|(k, _)| !top.iter().any(|(t, _)| t == k))
        .map(|(k, v)| (k, v.to_vec()))
        .collect();
    items.extend(top.iter().cloned());
    data.extend(dict(&items));
    data.push(b'.');
    data
}

/// Found by an attack on the release build: one annotation with a 100 KB name, referenced
/// 100 000 times from 600 KB of input, asked for 10 GB. The name is interned, not copied.
#[test]
fn memo_bomb_long_annotation_name_is_shared() {
    for (name, data) in [
        // The whole annotation dict shared.
        (
            "memo-annotation.pickle",
            with_shared(
                &dict(&[
                    ("name", text(&"x".repeat(100_000))),
                    ("stage", text("START")),
                ]),
                &[("external_annotations", list(&repeat(&get(0), 100_000)))],
            ),
        ),
        // Only its name shared, by 60 000 dicts.
        (
            "memo-annotation-name.pickle",
            with_shared(
                &text(&"y".repeat(100_000)),
                &[(
                    "external_annotations",
                    list(&repeat(
                        &dict(&[("name", get(0)), ("stage", text("START"))]),
                        60_000,
                    )),
                )],
            ),
        ),
    ] {
        let path = scratch_file(name, &data);
        let run = run_limited(&["report".as_ref(), path.as_os_str()]);
        let _ = std::fs::remove_file(&path);
        assert_eq!(run.code, Some(0), "{name}: {run:?}");
        assert!(run.cpu < MAX_CPU, "{name}: {run:?}");
    }
}

/// Found by an attack on the release build: `allocator_settings`' budget counted values, not
/// bytes, so a 100 KB string referenced 60 000 times, or a 1 MiB bytes value referenced 2 000
/// times, aborted at 3.9 GB. Every copy is charged by its length.
#[test]
fn memo_bomb_long_values_in_allocator_settings_are_charged_by_bytes() {
    let long_bytes = cat(&[b"B", &(1u32 << 20).to_le_bytes(), &vec![0u8; 1 << 20]]);
    for (name, stored, refs) in [
        (
            "memo-settings-text.pickle",
            text(&"z".repeat(100_000)),
            60_000,
        ),
        ("memo-settings-bytes.pickle", long_bytes, 2_000),
    ] {
        let data = with_shared(
            &stored,
            &[(
                "allocator_settings",
                dict(&[("x", list(&repeat(&get(0), refs)))]),
            )],
        );
        expect_error(
            name,
            &data,
            &["allocator_settings: more than 4.0MiB", "memo bomb"],
        );
    }
}

/// Found by these tests: every trace entry's frame names one 1 MB file name (shared in the
/// pickle, one text in the model), and the report copied the name into each of its rows: a 16
/// MB file took 436 MB and gave 300 MB of JSON. Texts are kept shortened past 16 KiB.
#[test]
fn memo_bomb_long_file_name_shared_by_every_frame() {
    let mut entries = Vec::new();
    for i in 0..200_000i32 {
        let frame = dict(&[
            ("filename", get(0)),
            ("line", int(i % 100)),
            ("name", text("fn")),
        ]);
        entries.extend(dict(&[
            ("action", text("alloc")),
            ("addr", int((i + 1) * 4096)),
            ("size", int(512)),
            ("frames", list(&frame)),
        ]));
    }
    let data = with_shared(
        &text(&"f".repeat(1_000_000)),
        &[("device_traces", list(&list(&entries)))],
    );
    let path = scratch_file("memo-file-name.pickle", &data);
    for format in ["text", "json"] {
        let run = run_limited_in(
            &[
                "report".as_ref(),
                "--format".as_ref(),
                format.as_ref(),
                path.as_os_str(),
            ],
            memory_rule(data.len() as u64),
            None,
        );
        assert_eq!(run.code, Some(0), "{format}: {run:?}");
        assert!(
            run.stdout.len() < 8 << 20,
            "{format}: {} bytes",
            run.stdout.len()
        );
        assert!(
            run.stdout.contains("(shortened: 1000000 bytes in all)"),
            "{format}"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// Found by these tests: a top-level dict listing one 100 KB key 100 000 times copied the key
/// each time into the snapshot's list of other keys (10 GB).
#[test]
fn memo_bomb_repeated_top_level_key_is_kept_once() {
    let mut data = PROTO4.to_vec();
    data.extend(text(&"k".repeat(100_000)));
    data.extend_from_slice(&[MEMOIZE, b'0', b'}', b'(']);
    data.extend(cat(&[
        &text("segments"),
        b"]",
        &text("device_traces"),
        b"]",
    ]));
    data.extend(repeat(&cat(&[&get(0), b"N"]), 100_000));
    data.extend_from_slice(b"u.");
    let path = scratch_file("memo-top-key.pickle", &data);
    let run = run_limited(&["report".as_ref(), path.as_os_str()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, Some(0), "{run:?}");
}

/// Whatever the budgets miss, a failed allocation ends the process with a message and exit
/// 2, never an abort (134): a real snapshot under an address-space limit far too small.
#[test]
#[cfg(unix)]
fn a_failed_allocation_is_an_error_not_an_abort() {
    let fixture = common::fixture("real/notHanmin__assignment2-systems__memory_snapshot.pickle");
    let (mut failed, mut oom, mut tried) = (0, 0, 0);
    for mib in [10u64, 12, 14, 16, 20, 24, 32] {
        // Below the address space the binary and its libraries take to be loaded at all, the
        // loader fails before any of snapscan's code runs: such limits test nothing.
        let loads = run_limited_in(&["--version".as_ref()], mib << 20, None);
        if loads.code != Some(0) {
            continue;
        }
        tried += 1;
        let run = run_limited_in(&["report".as_ref(), fixture.as_os_str()], mib << 20, None);
        assert_eq!(run.signal, None, "{mib} MiB: {run:?}");
        match run.code {
            Some(0) => {}
            Some(2) => {
                oom += run.stderr.contains("out of memory") as u32;
                assert!(
                    run.stderr.contains("snapscan: error: out of memory")
                        || run
                            .stderr
                            .contains("snapscan: error: cannot start a worker thread"),
                    "{mib} MiB: {run:?}"
                );
                failed += 1;
            }
            _ => panic!("{mib} MiB: {run:?}"),
        }
    }
    assert!(
        tried >= 4,
        "the binary loads under only {tried} of the limits"
    );
    assert!(
        failed > 0 && oom > 0,
        "no limit was small enough to fail an allocation"
    );
}

/// A FIFO (a tar artifact can carry one named `rank0.pickle`) blocked forever in `open`, and
/// `/dev/zero` was "the file is empty": anything but a regular file is refused, by its kind.
#[test]
#[cfg(unix)]
fn only_regular_files_are_read() {
    let fifo = scratch_dir().join("rank0.pickle");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let run = run_limited(&["report".as_ref(), fifo.as_os_str()]);
    check_error(
        "rank0.pickle",
        &run,
        &["is a FIFO (named pipe), not a regular file"],
    );
    let pattern = scratch_dir().join("rank*.pickle");
    let run = run_limited(&["report".as_ref(), pattern.as_os_str()]);
    check_error("rank0.pickle", &run, &["is a FIFO"]);
    let _ = std::fs::remove_file(&fifo);

    let run = run_limited(&["report".as_ref(), "/dev/zero".as_ref()]);
    check_error(
        "/dev/zero",
        &run,
        &["is a character device, not a regular file"],
    );
}

/// `gzip -d` ignores bytes after the last member and `zstd -d` skips a skippable frame; so
/// does snapscan (with a warning for the gzip bytes).
#[test]
fn gzip_trailing_bytes_and_zstd_skippable_frames_are_read_as_the_tools_read_them() {
    let plain = std::fs::read(common::fixture("synth/train-oom-forward.pickle")).unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, &plain).unwrap();
    let mut gz = enc.finish().unwrap();
    gz.extend_from_slice(&[0u8; 512]); // tar padding
    let path = scratch_file("trailing.pickle.gz", &gz);
    let run = run_limited(&["report".as_ref(), path.as_os_str()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("OUT OF MEMORY"), "{run:?}");
    assert!(
        run.stderr
            .contains("512 bytes after the end of the gzip data were ignored"),
        "{run:?}"
    );

    let mut zst = cat(&[&[0x50, 0x2a, 0x4d, 0x18], &4u32.to_le_bytes(), b"meta"]);
    zst.extend(zstd::bulk::compress(&plain, 1).unwrap());
    let path = scratch_file("skippable.pickle.zst", &zst);
    let run = run_limited(&["report".as_ref(), path.as_os_str()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("OUT OF MEMORY"), "{run:?}");
}

/// A snapshot still being written, or replaced, can shrink while it is mapped: that gave
/// SIGBUS (exit 135, no message). Now: "the file changed while being read", exit 2. The reader
/// pauses after mapping (a test switch) while the test cuts the file.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn a_file_that_shrinks_while_mapped_is_an_error() {
    let fixture = std::fs::read(common::fixture("captured/protocol5_eval.pickle")).unwrap();
    let path = scratch_dir().join("shrinking.pickle");
    for pause_ms in [1000u64, 3000, 8000] {
        std::fs::write(&path, &fixture).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .args(["report".as_ref(), path.as_os_str()])
            .env("SNAPSCAN_TEST_PAUSE_AFTER_MAP", pause_ms.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(pause_ms / 4));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("the file is empty") {
            continue; // cut before the reader mapped it: try with more time
        }
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("shrinking.pickle: the file changed while being read"),
            "{stderr}"
        );
        let _ = std::fs::remove_file(&path);
        return;
    }
    panic!("the file was cut before it was mapped every time");
}

// ---------------------------------------------------------------------------------------------
// 3. Length fields, nesting, integers, text.

#[test]
fn length_fields_claiming_2_pow_63_bytes_are_refused_before_allocating() {
    let huge = (1u64 << 63).to_le_bytes();
    let cases: [(&str, u8, &[u8], &str); 4] = [
        ("binunicode8", 0x8d, &huge, "9223372036854775808"),
        ("binbytes8", 0x8e, &huge, "9223372036854775808"),
        ("bytearray8", 0x96, &huge, "9223372036854775808"),
        ("frame", 0x95, &huge, "9223372036854775"),
    ];
    for (name, opcode, len, shown) in cases {
        let mut data = PROTO4.to_vec();
        data.push(opcode);
        data.extend_from_slice(len);
        data.extend_from_slice(b"abc.");
        expect_error(&format!("{name}.pickle"), &data, &["at byte 2", shown]);
    }
    // 32-bit length fields at their maximum.
    for (name, opcode) in [("binunicode", b'X'), ("binbytes", b'B')] {
        let mut data = PROTO4.to_vec();
        data.push(opcode);
        data.extend_from_slice(&u32::MAX.to_le_bytes());
        data.extend_from_slice(b"abc.");
        expect_error(
            &format!("{name}.pickle"),
            &data,
            &["at byte 2", "4294967295"],
        );
    }
}

#[test]
fn a_million_nested_lists_give_a_schema_error() {
    // [[[[…]]]] a million deep: MARK/EMPTY_LIST pairs closed by APPENDS.
    let n = 1_000_000;
    let data = cat(&[PROTO4, b"]", &repeat(b"(]", n), &repeat(b"e", n), b"."]);
    expect_error(
        "nested.pickle",
        &data,
        &["segments[0]: expected dict, found list"],
    );
}

/// `{"segments": [items…]}` written as CPython writes a big list: the list memoized, its
/// items in batches of 1000 under a MARK and APPENDS, in frames of about 64 KiB, until the
/// file has about `size` bytes. `item(i)` is the i-th item's opcodes.
fn cpython_list(size: usize, item: impl Fn(usize) -> Vec<u8>) -> Vec<u8> {
    let mut body = cat(&[
        b"}",
        &[MEMOIZE],
        &text("segments"),
        &[MEMOIZE],
        b"]",
        &[MEMOIZE],
    ]);
    let mut out = PROTO4.to_vec();
    let mut i = 0;
    let flush = |out: &mut Vec<u8>, body: &mut Vec<u8>| {
        out.push(0x95); // FRAME
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.append(body);
    };
    while out.len() + body.len() < size {
        body.push(b'(');
        for _ in 0..1000 {
            body.extend(item(i));
            i += 1;
        }
        body.push(b'e');
        if body.len() >= 64 << 10 {
            flush(&mut out, &mut body);
        }
    }
    body.extend_from_slice(b"s.");
    flush(&mut out, &mut body);
    out
}

/// 10 MB of tiny containers or values, in the shapes CPython writes and as bare opcodes: a
/// clear error within the time and memory limits, where the document would have needed 16 to
/// 60 bytes per input byte. Found by this test: 10 MB of empty lists took 5 s and 860 MB (the
/// parallel reader's machines copied them twice before handing over), 10 MB of short distinct
/// strings 3.8 s; a million nested lists went through three readers.
#[test]
fn ten_megabytes_of_tiny_values_stop_at_the_memory_budget() {
    let size = 10 << 20;
    let name = |i: usize| {
        // Six distinct letters per item: 1.1 million different strings.
        let mut s = String::new();
        let mut k = i;
        for _ in 0..6 {
            s.push((b'a' + (k % 26) as u8) as char);
            k /= 26;
        }
        s
    };
    let nested = size / 3;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "empty-lists.pickle",
            cpython_list(size, |_| vec![b']', MEMOIZE]),
        ),
        (
            "empty-dicts.pickle",
            cpython_list(size, |_| vec![b'}', MEMOIZE]),
        ),
        ("nones.pickle", cpython_list(size, |_| vec![b'N'])),
        (
            "strings.pickle",
            cpython_list(size, |i| cat(&[&text(&name(i)), &[MEMOIZE]])),
        ),
        (
            "bare-lists.pickle",
            cat(&[PROTO4, &list(&repeat(b"]", size)), b"."]),
        ),
        (
            "nested-lists.pickle",
            cat(&[
                PROTO4,
                b"]",
                &repeat(b"(]", nested),
                &repeat(b"e", nested),
                b".",
            ]),
        ),
    ];
    for (name, data) in cases {
        assert!(
            data.len() >= size - (64 << 10),
            "{name}: {} bytes",
            data.len()
        );
        expect_error(
            name,
            &data,
            &["stopped at byte", "MiB", "tiny containers or values"],
        );
    }
    // The JSON form: `{"segments": [[], [], …]}` (its value tree first took ~50 bytes per value).
    let items = repeat(b"[],", size / 3);
    let json = cat(&[b"{\"segments\": [", &items[..items.len() - 1], b"]}"]);
    expect_error(
        "empty-lists.json",
        &json,
        &["invalid JSON", "MiB", "tiny containers or values", "column"],
    );
}

/// Found by these tests: STOP with a million MARKs still open is accepted (the top of the
/// stack becomes the root) and the CLI reports "nothing to report" with exit 0.
#[test]
fn stop_with_a_million_unclosed_marks_is_an_error() {
    let n = 1_000_000;
    let data = cat(&[PROTO4, &repeat(b"(]", n), b"."]);
    let stop = (2 + 2 * n).to_string();
    expect_error(
        "unclosed.pickle",
        &data,
        &["MARK", &format!("at byte {stop}")],
    );
}

#[test]
fn huge_integers_are_refused() {
    // LONG4 of 100,000 bytes (a 800,000-bit integer).
    let mut data = PROTO4.to_vec();
    data.push(0x8b);
    data.extend_from_slice(&100_000i32.to_le_bytes());
    data.extend(repeat(&[0x01], 100_000));
    data.push(b'.');
    expect_error(
        "long4.pickle",
        &data,
        &["at byte 2", "integer of 100000 bytes is too large"],
    );
    // LONG4 claiming 2^31 - 1 bytes.
    let mut data = PROTO4.to_vec();
    data.push(0x8b);
    data.extend_from_slice(&i32::MAX.to_le_bytes());
    data.extend_from_slice(b"\x01\x02.");
    expect_error("long4-len.pickle", &data, &["at byte 2", "2147483647"]);
    // LONG1 of 255 bytes.
    let mut data = PROTO4.to_vec();
    data.extend_from_slice(&[0x8a, 0xff]);
    data.extend(repeat(&[0x7f], 255));
    data.push(b'.');
    expect_error(
        "long1.pickle",
        &data,
        &["at byte 2", "integer of 255 bytes"],
    );
    // Protocol 0 LONG with 5000 digits.
    let mut data = b"(L".to_vec();
    data.extend(repeat(b"9", 5000));
    data.extend_from_slice(b"L\nl.");
    expect_error("long-text.pickle", &data, &["at byte 1", "LONG"]);
}

#[test]
fn invalid_utf8_is_refused_with_its_offset() {
    let data = cat(&[
        PROTO4,
        b"}(",
        &text("segments"),
        b"]",
        b"\x8c\x02\xff\xfe",
        &text("x"),
        b"u.",
    ]);
    expect_error("utf8.pickle", &data, &["invalid UTF-8", "at byte 15"]);
    // In JSON: serde_json names line and column.
    let json = b"{\"segments\": [], \"device_traces\": [], \"x\": \"\xff\xfe\"}";
    expect_error("utf8.json", json, &["invalid JSON", "line 1 column"]);
}

#[test]
fn inputs_that_are_not_snapshots() {
    // A torch.save archive: a zip whose first entry is the pickled object.
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x00\x00".to_vec();
    zip.extend_from_slice(&[0; 16]);
    zip.extend_from_slice(&16u16.to_le_bytes());
    zip.extend_from_slice(&0u16.to_le_bytes());
    zip.extend_from_slice(b"archive/data.pkl");
    zip.extend_from_slice(b"\x80\x02}q\x00.");
    expect_error("model.pt", &zip, &["zip archive (as torch.save writes)"]);
    expect_error("empty.pickle", b"", &["the file is empty"]);
    expect_error(
        "train.log",
        b"epoch 1: loss 0.5\nepoch 2: loss 0.4\n",
        &["not a memory snapshot", "first byte 0x65"],
    );
    expect_error(
        "binary.bin",
        &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0],
        &["not a memory snapshot", "first byte 0x7f"],
    );
}

#[test]
fn json_of_the_wrong_shape() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "number.json",
            r#"{"segments": 5}"#,
            "segments: expected list, found int",
        ),
        (
            "ints.json",
            "[1, 2, 3]",
            "segments[0]: expected dict, found int",
        ),
        (
            "no-segments.json",
            r#"{"device_traces": []}"#,
            "segments: missing required key",
        ),
        (
            "address.json",
            r#"{"segments": [{"device": 0, "address": "0x10", "total_size": 1, "blocks": []}]}"#,
            "segments[0].address: expected int, found str",
        ),
        (
            "entry.json",
            r#"{"segments": [], "device_traces": [[{"action": 7, "addr": 0, "size": 1}]]}"#,
            "device_traces[0][0].action: expected str, found int",
        ),
        (
            "report.json",
            r#"{"schema_version": 1, "files": []}"#,
            "segments",
        ),
        ("cut.json", r#"{"segments": [{"device": 0"#, "line 1 column"),
    ];
    for (name, text, want) in cases {
        expect_error(name, text.as_bytes(), &[want]);
    }
    // 100,000 nested arrays: serde_json's depth limit, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    expect_error("deep.json", deep.as_bytes(), &["recursion limit exceeded"]);
}

/// Negative sizes stay schema errors naming the field: PyTorch writes sizes as `size_t`, so a
/// negative one is corruption, and no total can be computed from it. (Sizes that fit in 64 bits
/// but exceed any device memory are accepted and flagged by `implausible_size`.)
#[test]
fn negative_sizes_are_errors_naming_the_field() {
    let mut s = clean_snapshot();
    s["segments"][0]["blocks"][1]["size"] = json!(-512);
    expect_error(
        "negative-block.json",
        s.to_string().as_bytes(),
        &["segments[0].blocks[1].size: expected a non-negative int below 2^64, found -512"],
    );
    let mut s = clean_snapshot();
    s["device_traces"][0][1]["size"] = json!(-1);
    expect_error(
        "negative-entry.json",
        s.to_string().as_bytes(),
        &["device_traces[0][1].size: expected a non-negative int below 2^64, found -1"],
    );
}

/// Found by these tests: every pickle and schema error is printed twice
/// (`file: invalid pickle at byte 2: …: invalid pickle at byte 2: …`).
#[test]
fn error_messages_do_not_repeat_themselves() {
    let data = cat(&[PROTO4, b"}(", &text("segments")]);
    let run = expect_error("cut.pickle", &data, &["truncated at byte"]);
    assert_eq!(
        run.stderr.matches("truncated at byte").count(),
        1,
        "{}",
        run.stderr
    );
    let run = expect_error("shape.json", br#"{"segments": 5}"#, &[]);
    assert_eq!(
        run.stderr.matches("expected list").count(),
        1,
        "{}",
        run.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Regressions found by fuzzing (inputs under tests/regressions/, see fuzz/README.md).

/// Decodes and analyses one regression input in-process: an error or a report, no panic.
fn regression(name: &str) -> Option<FileReport> {
    let path = common::root().join("tests/regressions").join(name);
    let bytes = std::fs::read(&path).expect("regression input");
    report_of(name, &bytes)
}

fn report_of(name: &str, bytes: &[u8]) -> Option<FileReport> {
    match snapshot::load_bytes(name, bytes) {
        Ok(s) => {
            let loaded = LoadedSnapshot {
                name: name.to_owned(),
                decoded_bytes: bytes.len() as u64,
                compression: snapscan::input::Compression::None,
                snapshot: s,
            };
            let report = file_report(&loaded, &ReportOptions::default());
            let r = snapscan::report::Report {
                schema_version: snapscan::report::SCHEMA_VERSION,
                files: vec![report.clone()],
                ranks: None,
                unreadable: Vec::new(),
            };
            let view = snapscan::render::report_text::View {
                top: 5,
                stacks: true,
                python_only: false,
                full: false,
                all_devices: false,
            };
            assert!(!snapscan::render::report_text::text(&r, &view).is_empty());
            assert!(!snapscan::render::json(&r).is_empty());
            // What the fuzz targets run too: stats and budgets.
            let stats = snapscan::report::StatsOutput {
                schema_version: snapscan::report::SCHEMA_VERSION,
                files: vec![snapscan::analysis::stats::file_stats(&loaded, None)],
            };
            assert!(!snapscan::render::stats_text::render(&stats).is_empty());
            let budgets = snapscan::report::Budgets {
                max_peak_bytes: Some(1 << 30),
                max_reserved_bytes: Some(1 << 30),
                max_fragmentation_ratio: Some(0.5),
                fail_on_oom: true,
            };
            let _ = snapscan::analysis::check::check(&r, &budgets);
            Some(report)
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            None
        }
    }
}

/// The quality warnings of every device of a regression input that must load.
fn regression_warnings(name: &str) -> Vec<QualityWarning> {
    let report = regression(name).expect("the regression input loads");
    report
        .devices
        .into_iter()
        .flat_map(|d| d.data_quality)
        .collect()
}

/// Found by fuzzing (json_report, first minutes, from the `inconsistent.json` seed): the replay
/// corrected an estimated block size to the dump's exact one with a subtraction that overflows
/// when the trace claims `i64::MAX` bytes (panic with overflow checks, a wrapped total without).
#[test]
fn regression_replay_block_size_correction_overflow() {
    let warnings = regression_warnings("fuzz-replay-block-size-correction-overflow.json");
    for kind in [
        "implausible_size",
        "duplicate_segments",
        "overlapping_blocks",
        "device_out_of_range",
    ] {
        assert!(has(&warnings, kind), "{kind}: {warnings:#?}");
    }
}

/// Found by fuzzing (parallel_reader, differential): the parallel reader ignores the length of
/// a FRAME, so a pickle whose frame claims more bytes than the file holds (13 bytes here:
/// PROTO 4, FRAME 2^60, EMPTY_LIST, STOP) gives a report ("nothing to report", exit 0) where
/// the sequential reader, like CPython, says it is truncated.
#[test]
fn regression_parallel_reader_ignores_frame_length() {
    let path =
        common::root().join("tests/regressions/fuzz-parallel-reader-ignores-frame-length.pickle");
    let data = std::fs::read(path).expect("regression input");
    let err = snapshot::load_bytes_sequential("frame", &data)
        .expect_err("the sequential reader refuses it")
        .to_string();
    assert!(err.contains("truncated at byte 2 of 13"), "{err}");
    match snapshot::load_bytes("frame", &data) {
        Ok(_) => panic!("load_bytes accepted a pickle whose FRAME runs past the end"),
        Err(e) => assert!(e.to_string().contains("truncated at byte 2"), "{e}"),
    }
}

/// Found by fuzzing (parallel_reader): BINUNICODE8 opcodes outside any frame whose 8-byte
/// lengths are near 2^64. Measuring them for the chunk plan added the opcode's own 9 bytes to
/// the length and overflowed (a panic where overflow is checked; elsewhere a wrapped, short
/// length). Both readers must give the sequential reader's error.
#[test]
fn regression_parallel_reader_length_near_2_pow_64() {
    refused_by_both_readers(
        "fuzz-parallel-reader-length-near-2-pow-64.pickle",
        "invalid pickle at byte 40: unknown opcode 0xff",
    );
}

/// A regression input that the sequential reader refuses with `want`: the parallel reader must
/// leave it to the sequential one, and loading gives that error.
fn refused_by_both_readers(name: &str, want: &str) {
    let path = common::root().join("tests/regressions").join(name);
    let data = std::fs::read(path).expect("regression input");
    let err = snapshot::load_bytes_sequential(name, &data)
        .expect_err("the sequential reader refuses it")
        .to_string();
    assert!(err.contains(want), "{err}");
    assert!(
        snapshot::load_bytes_parallel(&data).is_none(),
        "{name}: the parallel reader must leave it to the sequential one"
    );
    match snapshot::load_bytes(name, &data) {
        Ok(_) => panic!("load_bytes accepted {name}"),
        Err(e) => assert!(e.to_string().contains(want), "{e}"),
    }
}

/// Found by fuzzing (parallel_reader, differential, after the FRAME fix above): a FRAME opcode
/// inside a frame's body, claiming 7.4 × 10^18 bytes. The sequential reader refuses it; the
/// parallel one walked over it as a 9-byte opcode and gave a report.
#[test]
fn regression_parallel_reader_frame_inside_a_frame() {
    refused_by_both_readers(
        "fuzz-parallel-reader-frame-inside-a-frame.pickle",
        "the FRAME there claims 7451309385787663464 bytes",
    );
}

/// Found by fuzzing (parallel_reader, differential): one byte changed in a fixture makes a trace
/// entry's `frames` a frame dict instead of a list (LONG_BINGET of the neighbouring memo slot);
/// the sequential reader names the path, the parallel reader accepts the file. Built from the
/// fixture at run time (the input is 160 kB).
#[test]
fn regression_parallel_reader_accepts_a_frame_dict_as_frames() {
    let mut data = std::fs::read(common::fixture("synth/truncated.pickle")).expect("fixture");
    // LONG_BINGET 3121 (the entry's frames list) becomes LONG_BINGET 3122 (its first frame).
    assert_eq!(
        &data[89308..89313],
        b"j1\x0c\x00\x00",
        "the fixture changed"
    );
    data[89309] = b'2';
    let want = ".frames: expected list, found dict";
    let err = snapshot::load_bytes_sequential("mutant", &data)
        .expect_err("the sequential reader refuses it")
        .to_string();
    assert!(err.contains(want), "{err}");
    match snapshot::load_bytes("mutant", &data) {
        Ok(_) => panic!("load_bytes accepted a trace entry whose frames is a dict"),
        Err(e) => assert!(e.to_string().contains(want), "{e}"),
    }
}

/// Found by the extreme-value seeds run through the fuzz targets: a trace size of `i64::MAX`
/// overflowed the requested curve (and the block-size correction).
#[test]
fn regression_trace_size_i64_max_overflowed_the_curves() {
    let warnings = regression_warnings("trace-size-i64-max.json");
    assert!(has(&warnings, "implausible_size"), "{warnings:#?}");
}

/// Found by the extreme-value seeds: a segment at address 2^64 − 1 overflowed `address + size`
/// in the layout at the peak.
#[test]
fn regression_segment_address_near_2_pow_64_overflowed_the_layout() {
    regression("segment-address-near-2-pow-64.json").expect("loads");
}

/// Found by the extreme-value seeds: a segment of 2^64 − 1 bytes overflowed the merge of
/// expandable runs in the layout and the fragmentation sums.
#[test]
fn regression_segment_size_near_2_pow_64_overflowed_the_layout_sums() {
    let warnings = regression_warnings("segment-size-near-2-pow-64.json");
    assert!(has(&warnings, "implausible_size"), "{warnings:#?}");
    assert!(has(&warnings, "blocks_do_not_tile"), "{warnings:#?}");
}

/// Found by the extreme-value seeds: a block of 2^64 − 1 bytes overflowed the free-bytes sum of
/// `snapscan stats`.
#[test]
fn regression_block_size_near_2_pow_64_overflowed_the_stats() {
    let warnings = regression_warnings("block-size-near-2-pow-64.json");
    assert!(has(&warnings, "implausible_size"), "{warnings:#?}");
}

/// Found by fuzzing (json_report, 3 minutes from the seeds of `fuzz/seed.sh`, which had cut
/// `allocated_size` out of a segment): a segment without `allocated_size`, `active_size` or
/// `requested_size` gets them as the sums over its blocks, as PyTorch does, and two blocks of
/// 2^64 − 1 bytes overflowed those sums (a panic where overflow is checked, a wrapped figure
/// in a release build). Both readers share the sums: the same snapshot as a pickle
/// (CPython's `pickle.dumps(protocol=4)` of the JSON) goes through both. The sums now
/// saturate, and the sizes are flagged as implausible.
#[test]
fn regression_segment_sums_of_blocks_near_2_pow_64() {
    let name = "fuzz-segment-sums-of-blocks-near-2-pow-64";
    let warnings = regression_warnings(&format!("{name}.json"));
    assert!(has(&warnings, "implausible_size"), "{warnings:#?}");
    let path = common::root().join(format!("tests/regressions/{name}.pickle"));
    let pickle = std::fs::read(path).expect("regression input");
    let parallel = snapshot::load_bytes_parallel(&pickle).expect("the parallel reader reads it");
    let sequential = snapshot::load_bytes_sequential(name, &pickle).expect("and the other one");
    for s in [&parallel, &sequential] {
        let seg = &s.segments[0];
        assert_eq!(
            (seg.allocated_size, seg.active_size, seg.requested_size),
            (u64::MAX, u64::MAX, u64::MAX)
        );
    }
    assert!(report_of(name, &pickle).is_some());
}

/// Found by the extreme-value seeds: three segments of 2^63 bytes overflowed the dump's totals
/// (`final_state`) and the OOM's reserved bytes.
#[test]
fn regression_three_segments_of_2_pow_63_overflowed_the_totals() {
    let warnings = regression_warnings("three-segments-of-2-pow-63.json");
    assert!(has(&warnings, "implausible_size"), "{warnings:#?}");
}

/// Found by the extreme-value seeds: `time_us` = i64::MIN overflowed the window duration and
/// the "+N s" of the text report.
#[test]
fn regression_time_us_at_i64_min_overflowed_the_duration() {
    let report = regression("time-us-at-i64-min.json").expect("loads");
    assert!(report.devices[0].window.duration_s.is_some());
}

#[test]
fn huge_sizes_do_not_overflow_the_replay() {
    // Two allocations of 2^62 bytes: the requested curve would pass i64::MAX.
    let mut s = clean_snapshot();
    let big = 1u64 << 62;
    s["device_traces"][0] = json!([
        {"action": "alloc", "addr": 4096, "size": big, "stream": 0},
        {"action": "alloc", "addr": 8192, "size": big, "stream": 0},
        {"action": "alloc", "addr": 12288, "size": big, "stream": 0},
    ]);
    let report = report_of("huge.json", s.to_string().as_bytes()).expect("a report");
    let dev = &report.devices[0];
    assert!(
        has(&dev.data_quality, "implausible_size"),
        "{:#?}",
        dev.data_quality
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Data quality: one hand-made snapshot per warning.

const SEG: u64 = 0x7f00_0000_0000;
const MIB2: u64 = 2 << 20;

/// One consistent device-0 snapshot: a 2 MiB segment with an allocated 1 KiB block and the free
/// rest, and a trace that created both.
fn clean_snapshot() -> Json {
    json!({
        "segments": [segment(0, SEG, &[(1024, 1000, "active_allocated"), (MIB2 - 1024, 0, "inactive")])],
        "device_traces": [[
            {"action": "segment_alloc", "addr": SEG, "size": MIB2, "stream": 0, "time_us": 1},
            {"action": "alloc", "addr": SEG, "size": 1000, "stream": 0, "time_us": 2},
            {"action": "snapshot", "addr": 0, "size": 1024, "stream": 0, "time_us": 3},
        ]],
    })
}

/// A segment whose blocks tile it, with consistent sums.
fn segment(device: i64, address: u64, blocks: &[(u64, u64, &str)]) -> Json {
    let mut at = address;
    let mut items = Vec::new();
    let (mut allocated, mut active, mut requested, mut total) = (0, 0, 0, 0);
    for &(size, req, state) in blocks {
        items.push(json!({"address": at, "size": size, "requested_size": req, "state": state, "frames": []}));
        if state == "active_allocated" {
            allocated += size;
        }
        if state != "inactive" {
            active += size;
            requested += req;
        }
        at += size;
        total += size;
    }
    json!({
        "device": device, "address": address, "total_size": total,
        "allocated_size": allocated, "active_size": active, "requested_size": requested,
        "stream": 0, "segment_type": "small", "segment_pool_id": [0, 0],
        "is_expandable": false, "frames": [], "blocks": items,
    })
}

/// Data-quality warnings of every device of a JSON snapshot (device order).
fn quality(s: &Json) -> Vec<(i64, QualityWarning)> {
    let report = report_of("quality.json", s.to_string().as_bytes()).expect("a report");
    report
        .devices
        .iter()
        .flat_map(|d| d.data_quality.iter().map(move |w| (d.device, w.clone())))
        .collect()
}

fn has(warnings: &[QualityWarning], kind: &str) -> bool {
    warnings.iter().any(|w| w.kind == kind)
}

/// The only warning of `s`, which must be of `kind`, with `count` and a message containing
/// `needle`.
fn only_warning(s: &Json, kind: &str, count: u64, needle: &str) -> QualityWarning {
    let all = quality(s);
    assert_eq!(all.len(), 1, "expected one {kind}: {all:#?}");
    let w = all[0].1.clone();
    assert_eq!(w.kind, kind, "{w:#?}");
    assert_eq!(w.count, count, "{w:#?}");
    assert!(w.message.contains(needle), "{needle:?} not in {w:#?}");
    w
}

#[test]
fn clean_snapshot_has_no_quality_warnings() {
    assert!(quality(&clean_snapshot()).is_empty());
}

#[test]
fn every_fixture_is_clean() {
    for path in common::snapshot_fixtures() {
        let loaded = snapshot::load(&path).expect("fixture loads");
        let report = file_report(&loaded, &ReportOptions::default());
        for d in &report.devices {
            assert!(
                d.data_quality.is_empty(),
                "{} device {}: {:#?}",
                path.display(),
                d.device,
                d.data_quality
            );
        }
    }
}

#[test]
fn overlapping_blocks_are_flagged() {
    let mut s = clean_snapshot();
    // The free block starts 512 bytes inside the allocated one (and the sums stay right).
    s["segments"][0]["blocks"][1]["address"] = json!(SEG + 512);
    s["segments"][0]["blocks"][1]["size"] = json!(MIB2 - 512);
    let all = quality(&s);
    let w = all
        .iter()
        .find(|(_, w)| w.kind == "overlapping_blocks")
        .expect("overlap");
    assert_eq!(w.1.count, 1);
    assert!(w.1.message.contains("counted twice"), "{w:#?}");
    assert!(w
        .1
        .affects
        .contains(&"final.free_external_bytes".to_owned()));
}

#[test]
fn blocks_that_do_not_tile_their_segment_are_flagged() {
    // A gap: the free block starts 512 bytes after the allocated one ends.
    let mut s = clean_snapshot();
    s["segments"][0]["blocks"][1]["address"] = json!(SEG + 1024 + 512);
    s["segments"][0]["blocks"][1]["size"] = json!(MIB2 - 1024 - 512);
    let w = only_warning(&s, "blocks_do_not_tile", 1, "no block covers");
    assert!(w.affects.contains(&"fragmentation_at_end".to_owned()));
    // Blocks that stop short of the segment's end.
    let mut s = clean_snapshot();
    s["segments"][0]["total_size"] = json!(2 * MIB2);
    s["device_traces"][0][0]["size"] = json!(2 * MIB2);
    only_warning(&s, "blocks_do_not_tile", 1, "its blocks end at");
    // A segment without blocks.
    let mut s = clean_snapshot();
    s["segments"]
        .as_array_mut()
        .unwrap()
        .push(segment(0, SEG + MIB2, &[]));
    s["segments"][1]["total_size"] = json!(MIB2);
    s["device_traces"][0]
        .as_array_mut()
        .unwrap()
        .push(json!({"action": "segment_alloc", "addr": SEG + MIB2, "size": MIB2, "stream": 0}));
    only_warning(&s, "blocks_do_not_tile", 1, "has no blocks");
}

#[test]
fn segment_sums_that_disagree_with_blocks_are_flagged() {
    let mut s = clean_snapshot();
    s["segments"][0]["allocated_size"] = json!(4096);
    let w = only_warning(
        &s,
        "segment_sums_disagree",
        1,
        "allocated_size 4096 (blocks: 1024)",
    );
    assert!(w.affects.is_empty(), "the report uses the blocks: {w:#?}");
}

#[test]
fn duplicate_and_overlapping_segments_are_flagged() {
    let mut s = clean_snapshot();
    let again = s["segments"][0].clone();
    s["segments"].as_array_mut().unwrap().push(again);
    let all = quality(&s);
    let w = all
        .iter()
        .find(|(_, w)| w.kind == "duplicate_segments")
        .expect("duplicate");
    assert!(w.1.message.contains("listed twice"), "{w:#?}");
    assert!(w.1.affects.contains(&"final.reserved_bytes".to_owned()));
    // A second segment starting 1 MiB into the first.
    let mut s = clean_snapshot();
    s["segments"].as_array_mut().unwrap().push(segment(
        0,
        SEG + (1 << 20),
        &[(MIB2, 0, "inactive")],
    ));
    s["device_traces"][0].as_array_mut().unwrap().push(
        json!({"action": "segment_alloc", "addr": SEG + (1 << 20), "size": MIB2, "stream": 0}),
    );
    only_warning(&s, "overlapping_segments", 1, "starts inside segment");
}

#[test]
fn devices_out_of_range_are_flagged() {
    // Segments of device 3 with trace lists for devices 0 and 1 only.
    let mut s = clean_snapshot();
    s["device_traces"].as_array_mut().unwrap().push(json!([]));
    s["segments"]
        .as_array_mut()
        .unwrap()
        .push(segment(3, SEG * 2, &[(MIB2, 0, "inactive")]));
    let all = quality(&s);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].0, 3);
    assert_eq!(all[0].1.kind, "device_out_of_range");
    assert!(all[0].1.message.contains("devices 0 to 1 only"), "{all:#?}");
    // A negative device.
    let mut s = clean_snapshot();
    s["segments"]
        .as_array_mut()
        .unwrap()
        .push(segment(-1, SEG * 2, &[(MIB2, 0, "inactive")]));
    let all = quality(&s);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].0, -1);
    assert!(all[0].1.message.contains("not a CUDA ordinal"), "{all:#?}");
}

#[test]
fn frees_of_addresses_already_freed_are_flagged() {
    let mut s = clean_snapshot();
    let trace = s["device_traces"][0].as_array_mut().unwrap();
    trace.pop(); // the snapshot marker no longer holds
    trace.extend([
        json!({"action": "alloc", "addr": SEG + 1024, "size": 4096, "stream": 0}),
        json!({"action": "free_requested", "addr": SEG + 1024, "size": 4096, "stream": 0}),
        json!({"action": "free_completed", "addr": SEG + 1024, "size": 4096, "stream": 0}),
        json!({"action": "free_completed", "addr": SEG + 1024, "size": 4096, "stream": 0}),
    ]);
    let w = only_warning(&s, "double_free", 1, "event 5 frees");
    assert!(w.affects.contains(&"peak.requested_bytes".to_owned()));
}

#[test]
fn trace_addresses_outside_every_segment_are_flagged() {
    let mut s = clean_snapshot();
    let trace = s["device_traces"][0].as_array_mut().unwrap();
    trace.pop();
    trace.extend([
        json!({"action": "alloc", "addr": 64, "size": 4096, "stream": 0}),
        json!({"action": "free_requested", "addr": 64, "size": 4096, "stream": 0}),
        json!({"action": "free_completed", "addr": 64, "size": 4096, "stream": 0}),
    ]);
    only_warning(&s, "address_outside_segments", 3, "event 2 (alloc) at 0x40");
}

#[test]
fn segment_events_that_do_not_add_up_are_flagged() {
    // The trace creates a second segment that is neither in the dump nor freed.
    let mut s = clean_snapshot();
    s["device_traces"][0]
        .as_array_mut()
        .unwrap()
        .push(json!({"action": "segment_alloc", "addr": SEG + MIB2, "size": MIB2, "stream": 0}));
    let w = only_warning(
        &s,
        "negative_level",
        1,
        "reserved bytes replay to -2097152 at window start",
    );
    assert!(w.affects.contains(&"peak_reserved".to_owned()));
}

#[test]
fn snapshot_markers_that_disagree_with_the_replay_are_flagged() {
    let mut s = clean_snapshot();
    s["device_traces"][0][2]["size"] = json!(512);
    only_warning(
        &s,
        "snapshot_marker_mismatch",
        1,
        "event 2 records 512 active bytes, the replay has 1024",
    );
    // Far more than the replay can hold, even with every estimate at its largest.
    let mut s = clean_snapshot();
    s["device_traces"][0][2]["size"] = json!(1u64 << 40);
    only_warning(
        &s,
        "snapshot_marker_mismatch",
        1,
        "records 1099511627776 active bytes",
    );
}

#[test]
fn implausible_sizes_are_flagged() {
    let mut s = clean_snapshot();
    s["device_traces"][0][1]["size"] = json!(u64::MAX - 511);
    let all = quality(&s);
    assert!(
        all.iter().any(|(_, w)| w.kind == "implausible_size"
            && w.message
                .contains("event 1 (alloc) has size 18446744073709551104")),
        "{all:#?}"
    );
    let mut s = clean_snapshot();
    s["segments"][0]["blocks"][0]["requested_size"] = json!(1u64 << 60);
    s["segments"][0]["requested_size"] = json!(1u64 << 60);
    let all = quality(&s);
    assert!(
        all.iter()
            .any(|(_, w)| w.kind == "implausible_size" && w.message.contains("in the dump")),
        "{all:#?}"
    );
}

#[test]
fn unknown_block_states_are_flagged() {
    let mut s = clean_snapshot();
    s["segments"][0]["blocks"][1]["state"] = json!("reserved_for_later");
    only_warning(&s, "unknown_block_state", 1, "counted as free");
}

#[test]
fn data_quality_is_rendered_in_text_and_json() {
    let mut s = clean_snapshot();
    s["segments"][0]["allocated_size"] = json!(4096);
    let path = scratch_file("quality.json", s.to_string().as_bytes());
    let text = common::snapscan()
        .arg("report")
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("Data quality:"), "{text}");
    assert!(text.contains("segment_sums_disagree (1):"), "{text}");
    assert!(
        text.contains("Affects: no figure of this report."),
        "{text}"
    );
    let json_out = common::snapscan()
        .args(["report", "--format", "json"])
        .arg(&path)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: Json = serde_json::from_slice(&json_out).unwrap();
    let dq = &report["files"][0]["devices"][0]["data_quality"];
    assert_eq!(dq[0]["kind"], "segment_sums_disagree", "{dq}");
    assert_eq!(dq[0]["count"], 1);
    assert!(dq[0]["affects"].as_array().is_some());
    let _ = std::fs::remove_file(path);
}

// ---------------------------------------------------------------------------------------------
// Time linear in the input, whatever its shape: inputs of a few MB whose shape once took
// seconds (a stretch parsed byte by byte, a walk per device or per OOM, a search per message or
// per name). Each is run at two sizes, a quarter and the whole: the whole must cost at most
// [`LINEAR_GROWTH`] times the quarter (linear work gives 4 or less, quadratic 16), and less than
// [`LINEAR_CEILING`] of CPU time. A ratio, not a fixed time: CI machines differ in speed by
// more than the margin a fixed time could have.

const LINEAR_GROWTH: f64 = 8.0;
/// Startup and the smallest inputs' fixed costs, which the ratio must not be made of.
const LINEAR_SLACK: Duration = Duration::from_millis(150);
/// Each input took more than this before its fix (20 s for the many-devices input).
const LINEAR_CEILING: Duration = Duration::from_secs(8);
/// The device reports of the many-devices input need more room than the error cases.
const LINEAR_ADDRESS_SPACE: u64 = 2 << 30;

/// A trace entry dict: `{action, addr, size, stream}` (`device_free` for an OOM).
fn entry(action: &str, addr: i32, size: i32) -> Vec<u8> {
    let place = if action == "oom" {
        "device_free"
    } else {
        "addr"
    };
    cat(&[
        b"}(",
        &text("action"),
        &text(action),
        &text(place),
        &int(addr),
        &text("size"),
        &int(size),
        &text("stream"),
        &int(0),
        b"u",
    ])
}

/// `{"segments": [], "device_traces": [...]}` with the given device lists (each a list of
/// entries).
fn snapshot_of(devices: &[Vec<Vec<u8>>]) -> Vec<u8> {
    let mut out = cat(&[
        PROTO4,
        b"}(",
        &text("segments"),
        b"]",
        &text("device_traces"),
        b"](",
    ]);
    for d in devices {
        out.extend_from_slice(b"](");
        for e in d {
            out.extend_from_slice(e);
        }
        out.extend_from_slice(b"e");
    }
    out.extend_from_slice(b"eu.");
    out
}

fn expect_fast(what: &str, args: &[&std::ffi::OsStr]) -> Run {
    let run = run_limited_to(args, LINEAR_ADDRESS_SPACE);
    let summary = format!(
        "{what}: exit {:?} (signal {:?}), {:.2} s CPU, {:.2} s wall; stderr: {}",
        run.code,
        run.signal,
        run.cpu.as_secs_f64(),
        run.wall.as_secs_f64(),
        run.stderr.chars().take(600).collect::<String>()
    );
    assert_eq!(run.code, Some(0), "{summary}");
    assert!(run.cpu < LINEAR_CEILING, "too slow: {summary}");
    run
}

/// Runs `args` on the input that `input(n)` writes, for `n / 4` and for `n`, and checks that
/// the work grew no faster than linearly. Returns the run of the whole.
fn expect_linear(what: &str, n: usize, args: &[&str], input: impl Fn(usize) -> PathBuf) -> Run {
    let mut runs = Vec::new();
    for size in [n / 4, n] {
        let path = input(size);
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        all.push(path.as_os_str());
        runs.push(expect_fast(&format!("{what} ({size})"), &all));
        let _ = std::fs::remove_file(&path);
    }
    let (quarter, whole) = (runs[0].cpu, runs[1].cpu);
    eprintln!(
        "{what}: {:.3} s CPU for a quarter, {:.3} s for the whole",
        quarter.as_secs_f64(),
        whole.as_secs_f64()
    );
    assert!(
        whole < quarter.mul_f64(LINEAR_GROWTH) + LINEAR_SLACK,
        "{what}: 4 times the input cost {:.1} times the CPU ({:.2} s against {:.2} s)",
        whole.as_secs_f64() / quarter.as_secs_f64().max(1e-3),
        whole.as_secs_f64(),
        quarter.as_secs_f64()
    );
    runs.pop().unwrap()
}

#[test]
fn bytes_after_stop_are_skipped_at_once_with_a_warning() {
    let data = snapshot_of(&[vec![entry("alloc", 4096, 512)]]);
    let end = data.len();
    let zeros = 8 << 20;
    let run = expect_linear("after STOP", zeros, &["report", "--format", "json"], |n| {
        let mut bytes = data.clone();
        bytes.resize(end + n, 0);
        scratch_file("after-stop.pickle", &bytes)
    });
    let report: Json = serde_json::from_str(&run.stdout).expect("JSON report");
    let w = &report["files"][0]["devices"][0]["data_quality"][0];
    assert_eq!(w["kind"], "bytes_after_stop", "{w}");
    assert_eq!(w["count"], zeros);
    assert!(w["message"]
        .as_str()
        .unwrap()
        .contains(&format!("at byte {}", end - 1)));
}

#[test]
fn many_devices_take_linear_time_and_a_table() {
    let run = expect_linear("many devices", 48_000, &["report"], |n| {
        let devices: Vec<Vec<Vec<u8>>> = (0..n)
            .map(|d| vec![entry("alloc", 4096, 512 * (1 + d as i32 % 7))])
            .collect();
        scratch_file("many-devices.pickle", &snapshot_of(&devices))
    });
    assert!(run.stdout.contains("Devices (48000):"), "no device table");
    // Only the device with the highest peak (3.5 KiB, device 6 first) has a section.
    assert_eq!(run.stdout.matches("== ").count(), 2, "sections");
    assert!(run.stdout.contains("— device 6\n"));
}

/// A report per device would take a few KB each: 48 000 devices in 1.2 MB once took 317 MB (text)
/// and 550 MB (JSON, of 250 MB). Within the memory rule, the JSON has a section for the device
/// with the highest peak and a row for every device.
#[test]
fn many_devices_stay_within_the_memory_rule() {
    let n = 48_000;
    let devices: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|d| vec![entry("alloc", 4096, 512 * (1 + d as i32 % 7))])
        .collect();
    let bytes = snapshot_of(&devices);
    let path = scratch_file("many-devices-memory.pickle", &bytes);
    let limit = memory_rule(bytes.len() as u64);
    let run = run_limited_to(
        &[
            "report".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
            path.as_os_str(),
        ],
        limit,
    );
    let text = run_limited_to(&["report".as_ref(), path.as_os_str()], limit);
    let check = run_limited_to(
        &[
            "check".as_ref(),
            "--max-peak".as_ref(),
            "3KiB".as_ref(),
            path.as_os_str(),
        ],
        limit,
    );
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    let report: Json = serde_json::from_str(&run.stdout).expect("JSON report");
    let file = &report["files"][0];
    assert_eq!(file["summary"]["devices"], n);
    let detailed: Vec<i64> = file["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(detailed, [6]);
    let table = file["device_table"].as_array().expect("device_table");
    assert_eq!(table.len(), n);
    assert_eq!(table[6]["detailed"], true);
    assert_eq!(table[13]["peak_requested_bytes"], 3584);
    assert_eq!(table[13]["detailed"], false);
    // Budgets see every device, not only the detailed ones: one in 7 peaks at 3.5 KiB.
    assert_eq!(check.code, Some(1), "{}", check.stderr);
    let over = check
        .stdout
        .lines()
        .filter(|l| l.contains("max-peak"))
        .count();
    let expected = (0..n).filter(|d| d % 7 == 6).count();
    assert_eq!(over, expected, "{}", &check.stdout[..400]);
}

#[test]
fn many_ooms_are_detailed_first_last_and_worst() {
    let n = 32_000;
    let run = expect_linear("many OOMs", n, &["report", "--format", "json"], |n| {
        let mut trace = vec![entry("segment_alloc", 1 << 30, 1 << 30)];
        for i in 0..n as i32 {
            trace.push(entry("alloc", 1 << 30, 1 << 20));
            trace.push(entry("oom", 1 << 20, (1 << 30) + 512 * (i % 977)));
            trace.push(entry("free_requested", 1 << 30, 1 << 20));
            trace.push(entry("free_completed", 1 << 30, 1 << 20));
        }
        scratch_file("many-ooms.pickle", &snapshot_of(&[trace]))
    });
    let report: Json = serde_json::from_str(&run.stdout).expect("JSON report");
    let dev = &report["files"][0]["devices"][0];
    let detailed = dev["oom"].as_array().unwrap().len() as u64;
    assert_eq!(detailed, 8);
    assert_eq!(dev["oom_omitted"].as_u64().unwrap() + detailed, n as u64);
    assert_eq!(dev["oom"][0]["event_index"], 2);
    assert_eq!(dev["oom"][7]["event_index"], 4 * (n - 1) + 2);
    assert_eq!(report["files"][0]["summary"]["oom"][0]["oom_events"], n);
}

#[test]
fn explain_reads_a_long_line_of_messages_in_one_pass() {
    let run = expect_linear("explain", 20_000, &["explain"], |n| {
        let line = "CUDA out of memory. Tried to allocate 2.00 GiB. ".repeat(n);
        scratch_file("long-line.log", format!("{line}\n").as_bytes())
    });
    assert!(run.stdout.contains("10000 more messages were not kept"));
}

#[test]
fn picture_names_of_many_inputs_with_one_name_are_made_unique_at_once() {
    let dir = scratch_dir().join("ranks");
    let one = snapshot_of(&[vec![entry("alloc", 4096, 512)]]);
    let mut files = Vec::new();
    for r in 0..2000 {
        let d = dir.join(format!("rank{r}"));
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("x.pickle");
        std::fs::write(&p, &one).unwrap();
        files.push(p);
    }
    let out = scratch_dir().join("pictures");
    std::fs::create_dir_all(&out).unwrap();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "report".as_ref(),
        "--format".as_ref(),
        "json".as_ref(),
        "--svg".as_ref(),
        out.as_os_str(),
    ];
    args.extend(files.iter().map(|f| f.as_os_str()));
    let run = run_limited_to(&args, LINEAR_ADDRESS_SPACE);
    let written = std::fs::read_dir(&out).map(|d| d.count()).unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&out);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(written, 4000);
    // The names alone once took seconds; loading and drawing 2 000 files takes most of this.
    assert!(
        run.cpu < Duration::from_secs(3),
        "too slow: {:.2} s CPU",
        run.cpu.as_secs_f64()
    );
}

/// Sizes chosen so that the levels pass 2^63: the saturated sums printed "16.0 EiB reserved …
/// peak before that 8.0 EiB". The trace is called inconsistent, with the field and the event,
/// and no level of the device is printed.
#[test]
fn sums_past_64_bits_are_reported_as_inconsistent_not_printed() {
    let warnings = regression_warnings("three-segments-of-2-pow-63.json");
    let overflow: Vec<_> = warnings
        .iter()
        .filter(|w| w.kind == "sums_overflow")
        .collect();
    assert!(!overflow.is_empty(), "{warnings:#?}");
    assert!(
        overflow
            .iter()
            .any(|w| w.message.contains("reserved bytes")),
        "{overflow:#?}"
    );
    let path = common::root().join("tests/regressions/three-segments-of-2-pow-63.json");
    for format in ["text", "markdown"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .args(["report", "--format", format])
            .arg(&path)
            .output()
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("The trace is inconsistent"), "{text}");
        assert!(!text.contains("EiB reserved"), "{text}");
        assert!(!text.contains("Peak"), "{text}");
    }
}

/// The allocator model on a trace that defeats it at every step: one big segment whose allocs
/// come from its top down (the model's best fit is always the bottom, so each alloc is a
/// divergence that the replay follows by cutting the free block at the real address), frees of
/// addresses no block holds, and OOMs, each of which is explained. `replay` and `whatif` stay
/// linear and exit 0.
#[test]
fn the_allocator_model_stays_linear_on_a_trace_it_cannot_follow() {
    let base: i32 = 1 << 20;
    let size: i32 = 1 << 30;
    let input = |n: usize| {
        let mut entries = vec![entry("segment_alloc", base, size)];
        for k in 0..n as i32 {
            entries.push(entry("alloc", base + size - (k + 1) * 512, 512));
            if k % 8 == 0 {
                entries.push(entry("free_completed", 7 * 512 + k * 4096, 512));
            }
            if k % 64 == 0 {
                entries.push(entry("oom", 0, 1 << 29));
            }
        }
        scratch_file("allocator-defeated.pickle", &snapshot_of(&[entries]))
    };
    for command in ["replay", "whatif"] {
        let run = expect_linear(command, 200_000, &[command, "--format", "json"], input);
        let v: Json = serde_json::from_str(&run.stdout).expect("JSON");
        assert!(v["files"][0]["devices"][0].is_object(), "{command}");
    }
}

/// `-o` naming an input (directly or through a link) would replace the snapshot with its own
/// report: refused, the input untouched. An output path that is a symlink is replaced, not
/// followed (a tar artifact can carry `out/timeline.svg -> ~/.bashrc`).
#[test]
fn outputs_never_replace_an_input_or_follow_a_link() {
    let dir = scratch_dir().join(format!("outputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.pickle");
    std::fs::copy(common::fixture("synth/tiny.pickle"), &input).unwrap();
    let before = std::fs::read(&input).unwrap();
    let link = dir.join("link.pickle");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&input, &link).unwrap();
    for target in [&input, &link] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .args(["report", "-o"])
            .arg(target)
            .arg(&input)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{target:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("input of the command"), "{err}");
        assert_eq!(std::fs::read(&input).unwrap(), before);
    }
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    let out_link = dir.join("out.txt");
    let _ = std::fs::remove_file(&out_link);
    std::os::unix::fs::symlink(&victim, &out_link).unwrap();
    let svg_dir = dir.join("pictures");
    std::fs::create_dir_all(&svg_dir).unwrap();
    let pic_link = svg_dir.join("timeline.svg");
    let _ = std::fs::remove_file(&pic_link);
    std::os::unix::fs::symlink(&victim, &pic_link).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
        .args(["report", "--svg"])
        .arg(&svg_dir)
        .arg("-o")
        .arg(&out_link)
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    for written in [&out_link, &pic_link] {
        let meta = std::fs::symlink_metadata(written).unwrap();
        assert!(meta.file_type().is_file(), "{written:?} is still a link");
    }
    assert!(std::fs::read_to_string(&out_link)
        .unwrap()
        .contains("device 0"));
    // A pipe (as /dev/null or /dev/stdout) is written into, not replaced by a plain file.
    let fifo = dir.join("pipe");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read(&fifo).unwrap_or_default())
        };
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapscan"))
            .args(["report", "-o"])
            .arg(&fifo)
            .arg(&input)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let read = reader.join().unwrap();
        assert!(String::from_utf8_lossy(&read).contains("device 0"));
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The timeline of a long trace: each level of the requested and reserved curves was read from
/// a checkpoint again (thousands of steps per event) and each allocation's call site worked out
/// again; now one sweep. Linear in the trace, default `--detail`.
#[test]
fn the_timeline_is_linear_in_the_trace() {
    let input = |n: usize| {
        let mut entries = vec![entry("segment_alloc", 1 << 20, 1 << 30)];
        for k in 0..n as i32 {
            let addr = (1 << 20) + (k % 100_000) * 8192;
            entries.push(entry("alloc", addr, 512 * (1 + k % 13)));
            if k >= 64 {
                let old = (1 << 20) + ((k - 64) % 100_000) * 8192;
                entries.push(entry("free_requested", old, 512 * (1 + (k - 64) % 13)));
                entries.push(entry("free_completed", old, 512 * (1 + (k - 64) % 13)));
            }
        }
        scratch_file("timeline-long.pickle", &snapshot_of(&[entries]))
    };
    expect_linear("timeline", 160_000, &["timeline", "-o", "-"], input);
}
