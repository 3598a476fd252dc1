//! The pickle reader against an independent decoder (serde-pickle) and against hostile input.

use snapscan::pickle::{self, Document, Value};

use crate::common;

/// A decoder-neutral tree to compare two decoders' results.
#[derive(Debug, PartialEq)]
enum Canon {
    Null,
    Bool(bool),
    Int(i128),
    Float(u64),
    Str(String),
    Bytes(Vec<u8>),
    Seq(&'static str, Vec<Canon>),
    Map(Vec<(Canon, Canon)>),
}

fn sort_map(mut pairs: Vec<(Canon, Canon)>) -> Canon {
    pairs.sort_by(|a, b| format!("{:?}", a.0).cmp(&format!("{:?}", b.0)));
    Canon::Map(pairs)
}

fn from_ours(doc: &Document, v: Value) -> Canon {
    match v {
        Value::None => Canon::Null,
        Value::Bool(b) => Canon::Bool(b),
        Value::Int(_) | Value::BigInt(_) => Canon::Int(doc.as_int(v).unwrap()),
        Value::Float(f) => Canon::Float(f.to_bits()),
        Value::Str(id) => Canon::Str(doc.str(id).to_owned()),
        Value::Bytes(i) => Canon::Bytes(doc.bytes[i as usize].to_vec()),
        Value::List(id) => Canon::Seq(
            "list",
            doc.seq(id).iter().map(|x| from_ours(doc, *x)).collect(),
        ),
        Value::Tuple(id) => Canon::Seq(
            "tuple",
            doc.seq(id).iter().map(|x| from_ours(doc, *x)).collect(),
        ),
        Value::Set(id) | Value::FrozenSet(id) => {
            let mut items: Vec<Canon> = doc.seq(id).iter().map(|x| from_ours(doc, *x)).collect();
            items.sort_by_key(|c| format!("{c:?}"));
            items.dedup();
            Canon::Seq("set", items)
        }
        Value::Dict(id) => {
            // Later assignments win, as in Python.
            let mut pairs: Vec<(Canon, Canon)> = Vec::new();
            for (k, v) in doc.dict(id) {
                let key = from_ours(doc, *k);
                pairs.retain(|(existing, _)| *existing != key);
                pairs.push((key, from_ours(doc, *v)));
            }
            sort_map(pairs)
        }
    }
}

fn from_serde(v: serde_pickle::Value) -> Canon {
    use serde_pickle::Value as S;
    match v {
        S::None => Canon::Null,
        S::Bool(b) => Canon::Bool(b),
        S::I64(i) => Canon::Int(i as i128),
        S::Int(big) => Canon::Int(big.to_string().parse().expect("fits i128")),
        S::F64(f) => Canon::Float(f.to_bits()),
        S::Bytes(b) => Canon::Bytes(b),
        S::String(s) => Canon::Str(s),
        S::List(items) => Canon::Seq("list", items.into_iter().map(from_serde).collect()),
        S::Tuple(items) => Canon::Seq("tuple", items.into_iter().map(from_serde).collect()),
        S::Set(items) | S::FrozenSet(items) => {
            let mut items: Vec<Canon> = items
                .into_iter()
                .map(|h| from_serde(h.into_value()))
                .collect();
            items.sort_by_key(|c| format!("{c:?}"));
            Canon::Seq("set", items)
        }
        S::Dict(map) => sort_map(
            map.into_iter()
                .map(|(k, v)| (from_serde(k.into_value()), from_serde(v)))
                .collect(),
        ),
    }
}

fn read_fixture(path: &std::path::Path) -> Vec<u8> {
    let (bytes, _) = snapscan::input::read_input(path).expect("readable fixture");
    bytes.to_vec()
}

/// serde-pickle 1.2 cannot decode most real snapshots: a dict shared between two nested lists
/// (every frame dict of a stack) makes it fail with "recursive structure found" (reproduced with
/// `pickle.dumps([x, [x]])`). Where it can decode a fixture, the trees must be equal; the small
/// hand-written pickles below and the CPython digest test cover the rest.
#[test]
fn fixtures_decode_to_the_same_tree_as_serde_pickle_where_it_can() {
    let mut compared = 0;
    for path in common::snapshot_fixtures() {
        let data = read_fixture(&path);
        let ours = pickle::parse(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let Ok(reference) = serde_pickle::value_from_slice(&data, serde_pickle::DeOptions::new())
        else {
            continue;
        };
        let a = from_ours(&ours, ours.root.unwrap());
        let b = from_serde(reference);
        assert!(a == b, "{}: trees differ", path.display());
        compared += 1;
    }
    // The two legacy (torch 2.0) files and the stack-less graphs fixture have no shared dicts.
    assert!(
        compared >= 3,
        "serde-pickle decoded only {compared} fixtures"
    );
}

#[test]
fn small_pickles_decode_like_serde_pickle() {
    // Written by CPython (protocols 0, 2, 4, 5) for plain values of every type.
    let cases: [&[u8]; 4] = [
        b"(dp0\x0aVa\x0ap1\x0a(lp2\x0aI1\x0aaI-5\x0aaF2.5\x0aaI01\x0aaNaL100000000000000000000L\x0aasVb\x0ap3\x0a(Vxy\x0ap4\x0ag4\x0atp5\x0as.",
        b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfb\xff\xff\xffG@\x04\x00\x00\x00\x00\x00\x00\x88N\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00eX\x01\x00\x00\x00bq\x03X\x02\x00\x00\x00xyq\x04h\x04)\x87q\x05u.",
        b"\x80\x04\x95E\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfb\xff\xff\xffM\xe8\x03\x89\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0e\x8c\x01b\x94C\x02xy\x94h\x04\x86\x94\x8c\x01c\x94\x8f\x94(K\x01K\x02\x90\x8c\x01d\x94(K\x03\x91\x94u.",
        b"\x80\x05\x95<\x00\x00\x00\x00\x00\x00\x00]\x94(\x8c\x05caf\xc3\xa9\x94h\x01)\x8c\x00\x94K\x00K\x01\x8c\x01x\x94\x87\x94\x96\x02\x00\x00\x00\x00\x00\x00\x00ab\x94}\x94\x8c\x01k\x94]\x94}\x94\x8c\x01n\x94K\x01sase.",
    ];
    for (i, data) in cases.iter().enumerate() {
        let ours = pickle::parse(data).unwrap_or_else(|e| panic!("case {i}: {e}"));
        let reference = serde_pickle::value_from_slice(data, serde_pickle::DeOptions::new())
            .unwrap_or_else(|e| panic!("serde-pickle case {i}: {e}"));
        assert_eq!(
            from_ours(&ours, ours.root.unwrap()),
            from_serde(reference),
            "case {i}"
        );
    }
}

/// 64-bit FNV-1a, as in scripts/canonical_digest.py.
fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h = (h ^ *b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

#[test]
fn every_fixture_decodes_to_the_same_tree_as_cpython() {
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("tests/expected/canonical.json")).unwrap(),
    )
    .unwrap();
    let fixtures = common::snapshot_fixtures();
    assert_eq!(fixtures.len(), expected.as_object().unwrap().len());
    for path in fixtures {
        let data = read_fixture(&path);
        let doc = pickle::parse(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let text = serde_json::to_string(&doc.to_json(doc.root.unwrap(), 64).unwrap()).unwrap();
        let want = &expected[common::rel(&path)];
        assert_eq!(
            text.len() as u64,
            want["bytes"].as_u64().unwrap(),
            "{}",
            path.display()
        );
        assert_eq!(
            format!("{:016x}", fnv1a64(text.as_bytes())),
            want["fnv1a64"].as_str().unwrap(),
            "{}",
            path.display()
        );
    }
}

#[test]
fn memoized_values_are_shared_not_copied() {
    // A frames list referenced by many entries must exist once in the arena.
    let data = read_fixture(&common::fixture(
        "real/Wedsonlin__assignment2-systems__medium_512_training_memory_snapshot.pickle",
    ));
    let doc = pickle::parse(&data).unwrap();
    let memo_gets = data
        .windows(1)
        .filter(|w| w[0] == b'j' || w[0] == b'h')
        .count();
    // 22k trace entries each hold a frames list; far fewer containers than references exist.
    assert!(
        doc.seqs.len() + doc.dicts.len() < memo_gets,
        "containers: {}",
        doc.seqs.len() + doc.dicts.len()
    );
    let snap = snapscan::snapshot::decode(&doc).unwrap();
    let entries: usize = snap.device_traces.iter().map(|t| t.len()).sum();
    assert!(
        snap.interner.stack_count() < entries / 2,
        "stacks {} entries {entries}",
        snap.interner.stack_count()
    );
}

/// A pickle that calls `os.system("echo pwned > FILE")` when loaded by Python's pickle.
fn os_system_pickle(marker: &str) -> Vec<u8> {
    let mut p = vec![0x80, 0x04];
    // STACK_GLOBAL form: 'os' 'system' STACK_GLOBAL (cmd,) REDUCE STOP
    for s in ["os", "system"] {
        p.push(0x8c);
        p.push(s.len() as u8);
        p.extend_from_slice(s.as_bytes());
    }
    p.push(0x93);
    let cmd = format!("echo pwned > {marker}");
    p.push(0x8c);
    p.push(cmd.len() as u8);
    p.extend_from_slice(cmd.as_bytes());
    p.push(0x85); // TUPLE1
    p.push(b'R'); // REDUCE
    p.push(b'.');
    p
}

#[test]
fn code_executing_pickles_are_refused() {
    let dir = std::env::temp_dir().join(format!("snapscan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("pwned");
    let data = os_system_pickle(&marker.to_string_lossy());
    let err = pickle::parse(&data).unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing opcode STACK_GLOBAL at byte 14: a memory snapshot holds only plain data"
    );
    // Protocol 0 GLOBAL form.
    let legacy = b"cos\nsystem\n(S'echo pwned'\ntR.";
    let err = pickle::parse(legacy).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("refusing opcode GLOBAL at byte 0"),
        "{err}"
    );
    // Through the CLI: exit 2, a message naming the opcode, and nothing ran.
    let file = dir.join("evil.pickle");
    std::fs::write(&file, &data).unwrap();
    common::snapscan()
        .args(["stats", file.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "refusing opcode STACK_GLOBAL at byte 14",
        ));
    assert!(!marker.exists(), "the payload must never run");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lengths_are_checked_before_allocating() {
    // BINUNICODE8 claiming 2^63 bytes.
    let mut p = vec![0x80, 0x04, 0x8d];
    p.extend_from_slice(&(1u64 << 63).to_le_bytes());
    p.extend_from_slice(b"abc.");
    let err = pickle::parse(&p).unwrap_err();
    assert!(err.to_string().contains("at byte 2"), "{err}");
    assert!(
        err.to_string()
            .contains("length field says 9223372036854775808 bytes"),
        "{err}"
    );
}

#[test]
fn every_opcode_form_of_plain_data_decodes() {
    // Protocol 0/1/2 forms that CPython never uses for snapshots but are valid pickles:
    // INT, LONG, FLOAT, STRING, UNICODE, PUT/GET, LIST, DICT, TUPLE, EMPTY_TUPLE, TUPLE3,
    // NONE, NEWTRUE, BINPUT/LONG_BINPUT, LONG4 (negative), EMPTY_SET/ADDITEMS, FROZENSET, DUP, POP.
    let mut p: Vec<u8> = Vec::new();
    p.extend_from_slice(b"(I42\nL-7L\nF1.5\nS'hi'\nVcaf\\u00e9\np0\ng0\nN");
    p.extend_from_slice(&[0x88, 0x89]);
    p.extend_from_slice(b")");
    p.extend_from_slice(&[b'K', 1, b'K', 2, b'K', 3, 0x87]); // TUPLE3
    p.extend_from_slice(&[0x8b, 2, 0, 0, 0, 0x00, 0x80]); // LONG4 -32768
    p.extend_from_slice(&[0x8f, b'(', b'K', 9, 0x90]); // EMPTY_SET MARK 9 ADDITEMS
    p.extend_from_slice(&[b'(', b'K', 5, 0x91]); // FROZENSET
    p.extend_from_slice(&[b'K', 8, b'2', b'0']); // DUP POP
    p.extend_from_slice(b"l"); // LIST from MARK
    p.push(b'.');
    let doc = pickle::parse(&p).unwrap_or_else(|e| panic!("{e}"));
    let json = doc.to_json(doc.root.unwrap(), 10).unwrap();
    assert_eq!(
        json.to_string(),
        r#"[42,-7,1.5,[104,105],"café","café",null,true,false,[],[1,2,3],-32768,[9],[5],8]"#
    );
}

#[test]
fn json_input_gives_the_same_model_as_the_pickle() {
    let pickle_path = common::fixture("synth/load-oom.pickle");
    let data = read_fixture(&pickle_path);
    let doc = pickle::parse(&data).unwrap();
    let json = doc.to_json(doc.root.unwrap(), 64).unwrap();
    let json_bytes = serde_json::to_vec(&json).unwrap();
    let from_pickle = snapscan::snapshot::load_bytes("p", &data).unwrap();
    let from_json = snapscan::snapshot::load_bytes("j", &json_bytes).unwrap();
    assert_eq!(from_pickle.segments.len(), from_json.segments.len());
    assert_eq!(
        from_pickle.device_traces.len(),
        from_json.device_traces.len()
    );
    let stats = |s: &snapscan::snapshot::Snapshot| {
        snapscan::analysis::stats::final_state(s.segments.iter())
    };
    assert_eq!(stats(&from_pickle), stats(&from_json));
    let peaks = |s: &snapscan::snapshot::Snapshot| {
        snapscan::analysis::lifetimes::replay_device(s, 0)
            .requested
            .peak()
    };
    assert_eq!(peaks(&from_pickle), peaks(&from_json));
}

#[test]
fn schema_errors_name_the_path() {
    let data = br#"{"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": "big", "stream": 0}]]}"#;
    let err = snapscan::snapshot::load_bytes("x.json", data).unwrap_err();
    assert_eq!(
        err.to_string(),
        "x.json: device_traces[0][0].size: expected int, found str"
    );
}
