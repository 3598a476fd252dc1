//! Real-shaped big snapshots for tests: a fixture's device-0 trace repeated N times, each copy
//! shifted into its own address range with a copy of its segments, written as CPython's pickler
//! writes protocol 4 (64 KiB frames, MEMOIZE after every container and string, BINGET for
//! every object seen before). The copies keep the sharing of real dumps: frame dicts (and
//! segments' frames lists and pool ids) are shared file-wide, so later copies fetch them from
//! far back in the memo; each copy has its own frames list per allocation, shared by its frees.

use rustc_hash::FxHashMap;
use snapscan::pickle::{self, Document, SeqId, Value};

/// `reps` copies of the device-0 trace and segments of the snapshot in `src`.
pub fn replicate(src: &[u8], reps: usize) -> Vec<u8> {
    let mut doc = pickle::parse(src).expect("fixture parses");
    let Some(Value::Dict(root)) = doc.root else {
        panic!("snapshot root is a dict")
    };
    let key = |doc: &Document, name: &str| doc.strings.lookup(name).map(Value::Str);
    let (k_addr, k_address, k_frames, k_time, k_blocks, k_device) = (
        key(&doc, "addr"),
        key(&doc, "address"),
        key(&doc, "frames"),
        key(&doc, "time_us"),
        key(&doc, "blocks"),
        key(&doc, "device"),
    );
    let field = |doc: &Document, d: Value, k: Option<Value>| -> Option<Value> {
        let Value::Dict(d) = d else { return None };
        let k = k?;
        doc.dict(d)
            .iter()
            .rev()
            .find(|(kk, _)| *kk == k)
            .map(|(_, v)| *v)
    };
    let traces = field(&doc, Value::Dict(root), key(&doc, "device_traces"));
    let segments = field(&doc, Value::Dict(root), key(&doc, "segments"));
    let shifted = |doc: &Document, v: Value, by: i64| match doc.as_int(v) {
        Some(i) => Value::Int(i as i64 + by),
        None => v,
    };

    if let Some(Value::List(traces)) = traces {
        if let Some(&Value::List(trace)) = doc.seq(traces).first() {
            let entries = doc.seq(trace).to_vec();
            let mut copies = Vec::with_capacity(entries.len() * reps);
            for r in 0..reps {
                let off = (r as i64) << 40;
                let mut lists: FxHashMap<SeqId, SeqId> = FxHashMap::default();
                for &e in &entries {
                    let Value::Dict(d) = e else {
                        copies.push(e);
                        continue;
                    };
                    let mut items = doc.dict(d).to_vec();
                    for (k, v) in items.iter_mut() {
                        if Some(*k) == k_addr {
                            *v = shifted(&doc, *v, off);
                        } else if Some(*k) == k_time {
                            *v = shifted(&doc, *v, r as i64 * 10_000_000);
                        } else if let (true, Value::List(l)) = (Some(*k) == k_frames, *v) {
                            let copy = match lists.get(&l) {
                                Some(&c) => c,
                                None => {
                                    let c = SeqId(doc.seqs.len() as u32);
                                    doc.seqs.push(doc.seq(l).to_vec());
                                    lists.insert(l, c);
                                    c
                                }
                            };
                            *v = Value::List(copy);
                        }
                    }
                    doc.dicts.push(items);
                    copies.push(Value::Dict(pickle::DictId(doc.dicts.len() as u32 - 1)));
                }
            }
            doc.seqs[trace.0 as usize] = copies;
        }
    }

    if let Some(Value::List(segs)) = segments {
        let all = doc.seq(segs).to_vec();
        let on_device_0 = |doc: &Document, g: Value| {
            field(doc, g, k_device)
                .and_then(|d| doc.as_int(d))
                .unwrap_or(0)
                == 0
        };
        let (dev0, others): (Vec<Value>, Vec<Value>) =
            all.into_iter().partition(|&g| on_device_0(&doc, g));
        let mut out = Vec::new();
        for r in 0..reps {
            let off = (r as i64) << 40;
            for &g in &dev0 {
                let Value::Dict(gd) = g else { continue };
                let mut items = doc.dict(gd).to_vec();
                for (k, v) in items.iter_mut() {
                    if Some(*k) == k_address {
                        *v = shifted(&doc, *v, off);
                    } else if let (true, Value::List(bl)) = (Some(*k) == k_blocks, *v) {
                        let blocks = doc.seq(bl).to_vec();
                        let mut copied = Vec::with_capacity(blocks.len());
                        for b in blocks {
                            let Value::Dict(bd) = b else {
                                copied.push(b);
                                continue;
                            };
                            let mut bitems = doc.dict(bd).to_vec();
                            for (bk, bv) in bitems.iter_mut() {
                                if Some(*bk) == k_address {
                                    *bv = shifted(&doc, *bv, off);
                                }
                            }
                            doc.dicts.push(bitems);
                            copied.push(Value::Dict(pickle::DictId(doc.dicts.len() as u32 - 1)));
                        }
                        doc.seqs.push(copied);
                        *v = Value::List(SeqId(doc.seqs.len() as u32 - 1));
                    }
                }
                doc.dicts.push(items);
                out.push(Value::Dict(pickle::DictId(doc.dicts.len() as u32 - 1)));
            }
        }
        out.extend(others);
        doc.seqs[segs.0 as usize] = out;
    }
    write(&doc)
}

/// CPython's frame size target.
const FRAME: usize = 64 * 1024;

/// The document as a protocol 4 pickle, the way CPython's pickler writes plain data.
pub fn write(doc: &Document) -> Vec<u8> {
    let mut w = Writer {
        doc,
        out: vec![pickle::opcodes::PROTO, 4],
        frame: Vec::new(),
        memo: FxHashMap::default(),
    };
    w.value(doc.root.expect("a root"));
    w.frame.push(pickle::opcodes::STOP);
    w.commit();
    w.out
}

/// What the memo is keyed by: containers by identity, strings by their interned text.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Obj {
    Seq(u32),
    Dict(u32),
    Str(u32),
    Bytes(u32),
}

struct Writer<'d> {
    doc: &'d Document,
    out: Vec<u8>,
    frame: Vec<u8>,
    memo: FxHashMap<Obj, u32>,
}

impl Writer<'_> {
    fn commit(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        self.out.push(pickle::opcodes::FRAME);
        self.out
            .extend_from_slice(&(self.frame.len() as u64).to_le_bytes());
        self.out.append(&mut self.frame);
    }

    fn op(&mut self, code: u8) {
        self.frame.push(code);
    }

    /// A memo fetch when `obj` was written before.
    fn fetched(&mut self, obj: Obj) -> bool {
        let Some(&i) = self.memo.get(&obj) else {
            return false;
        };
        match u8::try_from(i) {
            Ok(b) => self.frame.extend_from_slice(&[pickle::opcodes::BINGET, b]),
            Err(_) => {
                self.op(pickle::opcodes::LONG_BINGET);
                self.frame.extend_from_slice(&i.to_le_bytes());
            }
        }
        true
    }

    fn memoize(&mut self, obj: Obj) {
        let i = self.memo.len() as u32;
        self.memo.insert(obj, i);
        self.op(pickle::opcodes::MEMOIZE);
    }

    fn int(&mut self, i: i128) {
        use pickle::opcodes as op;
        if (0..=0xff).contains(&i) {
            self.frame.extend_from_slice(&[op::BININT1, i as u8]);
        } else if (0..=0xffff).contains(&i) {
            self.op(op::BININT2);
            self.frame.extend_from_slice(&(i as u16).to_le_bytes());
        } else if i32::try_from(i).is_ok() {
            self.op(op::BININT);
            self.frame.extend_from_slice(&(i as i32).to_le_bytes());
        } else {
            // Shortest two's complement, as CPython's encode_long.
            let mut bytes = i.to_le_bytes().to_vec();
            while bytes.len() > 1 {
                let (last, prev) = (bytes[bytes.len() - 1], bytes[bytes.len() - 2]);
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    bytes.pop();
                } else {
                    break;
                }
            }
            self.frame
                .extend_from_slice(&[op::LONG1, bytes.len() as u8]);
            self.frame.extend_from_slice(&bytes);
        }
    }

    fn items(&mut self, items: &[Value], one: u8, many: u8) {
        for batch in items.chunks(1000) {
            if batch.len() == 1 {
                self.value(batch[0]);
                self.op(one);
            } else {
                self.op(pickle::opcodes::MARK);
                for &v in batch {
                    self.value(v);
                }
                self.op(many);
            }
        }
    }

    fn value(&mut self, v: Value) {
        use pickle::opcodes as op;
        // CPython commits a full frame before it writes the next object.
        if self.frame.len() >= FRAME {
            self.commit();
        }
        let doc = self.doc;
        match v {
            Value::None => self.op(op::NONE),
            Value::Bool(b) => self.op(if b { op::NEWTRUE } else { op::NEWFALSE }),
            Value::Int(i) => self.int(i as i128),
            Value::BigInt(_) => self.int(doc.as_int(v).expect("big int")),
            Value::Float(f) => {
                self.op(op::BINFLOAT);
                self.frame.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(id) => {
                if self.fetched(Obj::Str(id.0)) {
                    return;
                }
                let s = doc.str(id).as_bytes();
                if s.len() < 256 {
                    self.frame
                        .extend_from_slice(&[op::SHORT_BINUNICODE, s.len() as u8]);
                } else {
                    self.op(op::BINUNICODE);
                    self.frame
                        .extend_from_slice(&(s.len() as u32).to_le_bytes());
                }
                self.frame.extend_from_slice(s);
                self.memoize(Obj::Str(id.0));
            }
            Value::Bytes(i) => {
                if self.fetched(Obj::Bytes(i)) {
                    return;
                }
                let b = &doc.bytes[i as usize];
                self.op(op::BINBYTES);
                self.frame
                    .extend_from_slice(&(b.len() as u32).to_le_bytes());
                self.frame.extend_from_slice(b);
                self.memoize(Obj::Bytes(i));
            }
            Value::List(id) => {
                if self.fetched(Obj::Seq(id.0)) {
                    return;
                }
                self.op(op::EMPTY_LIST);
                self.memoize(Obj::Seq(id.0));
                self.items(doc.seq(id), op::APPEND, op::APPENDS);
            }
            Value::Set(id) | Value::FrozenSet(id) => {
                if self.fetched(Obj::Seq(id.0)) {
                    return;
                }
                self.op(op::EMPTY_SET);
                self.memoize(Obj::Seq(id.0));
                self.op(op::MARK);
                for &x in doc.seq(id) {
                    self.value(x);
                }
                self.op(op::ADDITEMS);
            }
            Value::Tuple(id) => {
                if self.fetched(Obj::Seq(id.0)) {
                    return;
                }
                let items = doc.seq(id);
                if items.is_empty() {
                    self.op(op::EMPTY_TUPLE);
                    return;
                }
                if items.len() > 3 {
                    self.op(op::MARK);
                }
                for &x in items {
                    self.value(x);
                }
                self.op(match items.len() {
                    1 => op::TUPLE1,
                    2 => op::TUPLE2,
                    3 => op::TUPLE3,
                    _ => op::TUPLE,
                });
                self.memoize(Obj::Seq(id.0));
            }
            Value::Dict(id) => {
                if self.fetched(Obj::Dict(id.0)) {
                    return;
                }
                self.op(op::EMPTY_DICT);
                self.memoize(Obj::Dict(id.0));
                let flat: Vec<Value> = doc.dict(id).iter().flat_map(|&(k, v)| [k, v]).collect();
                for batch in flat.chunks(2000) {
                    if batch.len() == 2 {
                        self.value(batch[0]);
                        self.value(batch[1]);
                        self.op(op::SETITEM);
                    } else {
                        self.op(op::MARK);
                        for &x in batch {
                            self.value(x);
                        }
                        self.op(op::SETITEMS);
                    }
                }
            }
        }
    }
}
