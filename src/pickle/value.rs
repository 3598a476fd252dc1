//! The decoded pickle as plain data: an arena of containers addressed by small ids.
//!
//! Containers live in the arena and are referenced by id, so a value memoized once and referenced
//! 50,000 times (`BINGET`) is 50,000 copies of a 16-byte `Value`, never 50,000 deep copies.

use std::hash::BuildHasher;

use rustc_hash::FxHashMap;

/// Index of an interned string in [`Document::strings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrId(pub u32);

/// Index of a list, tuple or set in [`Document::seqs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqId(pub u32);

/// Index of a dict in [`Document::dicts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DictId(pub u32);

/// One pickle value. `Copy`: containers are shared by id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// Integers outside `i64` (e.g. `SIZE_MAX` written as LONG1 with 9 bytes); index into `big_ints`.
    BigInt(u32),
    Float(f64),
    Str(StrId),
    /// Index into `bytes`.
    Bytes(u32),
    List(SeqId),
    Tuple(SeqId),
    Set(SeqId),
    FrozenSet(SeqId),
    Dict(DictId),
}

impl Value {
    /// Python type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
            Value::Dict(_) => "dict",
        }
    }
}

/// Strings interned by value: every distinct text is stored once, back to back in one buffer
/// (a table of a million short strings is three allocations, not two million).
///
/// Texts are found by a keyed hash (std's `RandomState`, fresh keys per table): an input cannot
/// be made of texts that all land in one bucket, as it could with a fixed hash.
#[derive(Debug)]
pub struct StringTable {
    buf: String,
    /// Start of each text in `buf` (the next one's start, or `buf`'s end, is its end).
    starts: Vec<usize>,
    /// Hash of a text → the last text interned with that hash; `same_hash` chains the others.
    by_hash: FxHashMap<u64, u32>,
    same_hash: Vec<u32>,
    keys: std::collections::hash_map::RandomState,
}

impl Default for StringTable {
    fn default() -> Self {
        StringTable {
            buf: String::new(),
            starts: Vec::new(),
            by_hash: FxHashMap::default(),
            same_hash: Vec::new(),
            keys: std::collections::hash_map::RandomState::new(),
        }
    }
}

/// End of a `same_hash` chain.
const NO_TEXT: u32 = u32::MAX;

impl StringTable {
    pub fn intern(&mut self, text: &str) -> StrId {
        let hash = self.keys.hash_one(text);
        let head = self.by_hash.get(&hash).copied().unwrap_or(NO_TEXT);
        if let Some(id) = self.find(head, text) {
            return id;
        }
        let id = self.starts.len() as u32;
        self.starts.push(self.buf.len());
        self.buf.push_str(text);
        self.same_hash.push(head);
        self.by_hash.insert(hash, id);
        StrId(id)
    }

    pub fn get(&self, id: StrId) -> &str {
        let i = id.0 as usize;
        let start = self.starts[i];
        let end = self.starts.get(i + 1).copied().unwrap_or(self.buf.len());
        &self.buf[start..end]
    }

    pub fn lookup(&self, text: &str) -> Option<StrId> {
        self.find(*self.by_hash.get(&self.keys.hash_one(text))?, text)
    }

    /// `text` in the `same_hash` chain that starts at `at`.
    fn find(&self, mut at: u32, text: &str) -> Option<StrId> {
        while at != NO_TEXT {
            if self.get(StrId(at)) == text {
                return Some(StrId(at));
            }
            at = self.same_hash[at as usize];
        }
        None
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }
}

/// A whole decoded pickle (or JSON) document.
#[derive(Default, Debug)]
pub struct Document {
    pub strings: StringTable,
    pub seqs: Vec<Vec<Value>>,
    /// Dict items in insertion order. A repeated key is stored again; lookups take the last one,
    /// which is Python's "later assignment wins" without an O(n) scan per insert.
    pub dicts: Vec<Vec<(Value, Value)>>,
    pub big_ints: Vec<i128>,
    pub bytes: Vec<Box<[u8]>>,
    pub root: Option<Value>,
    /// Offset just after the STOP that ended the pickle (`None`: no STOP ran, e.g. JSON).
    pub end: Option<usize>,
}

impl Document {
    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id)
    }

    pub fn seq(&self, id: SeqId) -> &[Value] {
        &self.seqs[id.0 as usize]
    }

    pub fn dict(&self, id: DictId) -> &[(Value, Value)] {
        &self.dicts[id.0 as usize]
    }

    /// Elements of a list or tuple (sets too), or `None` for any other value.
    pub fn as_seq(&self, value: Value) -> Option<&[Value]> {
        match value {
            Value::List(id) | Value::Tuple(id) | Value::Set(id) | Value::FrozenSet(id) => {
                Some(self.seq(id))
            }
            _ => None,
        }
    }

    pub fn as_str(&self, value: Value) -> Option<&str> {
        match value {
            Value::Str(id) => Some(self.str(id)),
            _ => None,
        }
    }

    /// Integer value widened to i128 (bools count as ints, as in Python).
    pub fn as_int(&self, value: Value) -> Option<i128> {
        match value {
            Value::Int(v) => Some(v as i128),
            Value::BigInt(i) => self.big_ints.get(i as usize).copied(),
            Value::Bool(b) => Some(b as i128),
            _ => None,
        }
    }

    /// Looks a string key up in a dict; the last occurrence wins.
    pub fn dict_get(&self, dict: DictId, key: StrId) -> Option<Value> {
        self.dict(dict)
            .iter()
            .rev()
            .find(|(k, _)| *k == Value::Str(key))
            .map(|(_, v)| *v)
    }

    /// Converts to `serde_json::Value` (tuples and sets become arrays, non-string keys are
    /// rendered as text). Iterative depth is bounded by `max_depth`.
    pub fn to_json(&self, value: Value, max_depth: usize) -> Option<serde_json::Value> {
        let mut budget = usize::MAX;
        self.to_json_limited(value, max_depth, &mut budget)
    }

    /// [`to_json`](Self::to_json) within `budget` bytes of JSON values (each node counts its
    /// size, texts and bytes their length, once per reference to a shared container); `None`
    /// with `*budget == 0` when that is not enough.
    pub fn to_json_limited(
        &self,
        value: Value,
        max_depth: usize,
        budget: &mut usize,
    ) -> Option<serde_json::Value> {
        // Charged by the bytes the JSON value takes: a node, plus its text or its bytes (one
        // node each), so a long string shared by many references costs each copy.
        const NODE: usize = std::mem::size_of::<serde_json::Value>();
        let cost = NODE.saturating_add(match value {
            Value::Str(id) => self.str(id).len(),
            Value::Bytes(i) => self.bytes[i as usize].len().saturating_mul(NODE),
            _ => 0,
        });
        if max_depth == 0 {
            return None;
        }
        if *budget < cost {
            *budget = 0;
            return None;
        }
        *budget -= cost;
        Some(match value {
            Value::None => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(b),
            Value::Int(v) => serde_json::Value::from(v),
            Value::BigInt(i) => {
                let v = self.big_ints[i as usize];
                match u64::try_from(v) {
                    Ok(u) => serde_json::Value::from(u),
                    Err(_) => serde_json::Value::String(v.to_string()),
                }
            }
            Value::Float(f) => serde_json::Number::from_f64(f)
                .map(serde_json::Value::Number)
                .unwrap_or(serde_json::Value::Null),
            Value::Str(id) => serde_json::Value::String(self.str(id).to_owned()),
            Value::Bytes(i) => serde_json::Value::Array(
                self.bytes[i as usize]
                    .iter()
                    .map(|b| serde_json::Value::from(*b))
                    .collect(),
            ),
            Value::List(id) | Value::Tuple(id) | Value::Set(id) | Value::FrozenSet(id) => {
                let mut out = Vec::with_capacity(self.seq(id).len());
                for item in self.seq(id) {
                    out.push(self.to_json_limited(*item, max_depth - 1, budget)?);
                }
                serde_json::Value::Array(out)
            }
            Value::Dict(id) => {
                let mut out = serde_json::Map::new();
                for (k, v) in self.dict(id) {
                    let key = match k {
                        Value::Str(s) => {
                            let key = self.str(*s);
                            if *budget < key.len() {
                                *budget = 0;
                                return None;
                            }
                            *budget -= key.len();
                            key.to_owned()
                        }
                        other => self
                            .to_json_limited(*other, max_depth - 1, budget)?
                            .to_string(),
                    };
                    out.insert(key, self.to_json_limited(*v, max_depth - 1, budget)?);
                }
                serde_json::Value::Object(out)
            }
        })
    }
}
