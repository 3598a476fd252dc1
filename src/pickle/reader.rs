//! A pickle virtual machine for plain data only.
//!
//! It understands every opcode that builds plain values (protocols 0–5) and refuses every opcode
//! that would import or call Python code. Lengths are checked against the remaining input before
//! anything is allocated, there is no recursion, and every error carries the byte offset of the
//! opcode that caused it.

use super::opcodes as op;
use super::value::{DictId, Document, SeqId, StrId, StringTable, Value};
use super::PickleError;
use rustc_hash::FxHashMap;

/// Memo indices above this (and far beyond the memo's current size) go to a sparse map, so a
/// hostile `LONG_BINPUT 4000000000` cannot make us allocate 64 GB.
const DENSE_MEMO_SLACK: usize = 1 << 20;

/// Integers wider than this many bytes are not snapshot data (addresses and sizes fit in 9).
const MAX_INT_BYTES: usize = 16;

/// A FRAME may claim at most this many bytes beyond the end of the input and still count as
/// cut (CPython's frames are ~64 KiB).
pub(crate) const MAX_CUT_FRAME: u64 = 1 << 32;

/// Memory the document may take per input byte, as the reader counts it (below), beyond
/// [`MIN_BUDGET`]. Real snapshots of a MiB and more take 4.3 to 5.2 (their values are memo
/// references, ints and shared strings of several bytes each); an input of one-byte
/// containers or values takes 16 to 60, which would make a 10 MB file need more than 256 MB.
pub(crate) const BYTES_PER_INPUT_BYTE: u64 = 10;
/// Memory any input may take, whatever its size.
const MIN_BUDGET: u64 = 64 << 20;

/// Memory a document takes as its readers count it (this one and the JSON reader): a value
/// (on the stack, in a container or in the memo) 16 bytes, a container 32 more, a new string
/// or bytes object its length and 96 (rounded up for the index's growth).
#[derive(Debug)]
pub(crate) struct Budget {
    held: u64,
    limit: u64,
}

impl Budget {
    pub const VALUE: u64 = 16;
    pub const CONTAINER: u64 = 32;

    /// The budget of an input of `len` bytes.
    pub fn new(len: usize) -> Budget {
        Budget {
            held: 0,
            limit: (len as u64)
                .saturating_mul(BYTES_PER_INPUT_BYTE)
                .max(MIN_BUDGET),
        }
    }

    pub fn text(len: usize) -> u64 {
        len as u64 + 96
    }

    /// Interns `text` into `strings`, counting it when it is new there.
    pub fn intern(&mut self, strings: &mut StringTable, text: &str) -> StrId {
        let known = strings.len();
        let id = strings.intern(text);
        if strings.len() > known {
            self.add(Budget::text(text.len()));
        }
        id
    }

    /// Counts `bytes` more (checked by [`Budget::over`]).
    pub fn add(&mut self, bytes: u64) {
        self.held = self.held.saturating_add(bytes);
    }

    pub fn over(&self) -> bool {
        self.held > self.limit
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

struct Memo {
    dense: Vec<Option<Value>>,
    sparse: FxHashMap<u64, Value>,
}

impl Memo {
    fn put(&mut self, index: u64, value: Value) {
        let len = self.dense.len() as u64;
        if index < len {
            self.dense[index as usize] = Some(value);
        } else if index - len <= (len.max(1024)).min(DENSE_MEMO_SLACK as u64) {
            // Growing at most doubles the table: far indices (a hostile LONG_BINPUT every
            // 2^20) go to the map instead of allocating the gaps.
            self.dense.resize(index as usize, None);
            self.dense.push(Some(value));
        } else {
            self.sparse.insert(index, value);
        }
    }

    fn get(&self, index: u64) -> Option<Value> {
        match self.dense.get(index as usize) {
            Some(v) => *v,
            None => self.sparse.get(&index).copied(),
        }
    }

    fn next_index(&self) -> u64 {
        self.dense.len() as u64
    }
}

/// Parses a pickle cut short (a dump killed while writing): on truncation, keeps what is
/// complete. Open lists keep their complete items, open dicts inside them are dropped (a
/// segment or trace entry cut in the middle), the outermost dict keeps its complete pairs.
/// Returns the document and the truncation error (`None` for a complete pickle).
pub fn parse_salvage(data: &[u8]) -> Result<(Document, Option<PickleError>), PickleError> {
    let mut m = Machine::new(data);
    match m.run_inner(usize::MAX, &mut |_| {}) {
        Ok(()) => Ok((m.doc, None)),
        Err(e @ PickleError::Truncated { .. }) => {
            m.close_for_salvage();
            Ok((m.doc, Some(e)))
        }
        Err(e) => Err(e),
    }
}

/// Parses a complete pickle held in memory.
pub fn parse(data: &[u8]) -> Result<Document, PickleError> {
    Machine::new(data).run(usize::MAX, &mut |_| {})
}

/// [`parse`], calling `progress(bytes parsed so far)` about every `step` bytes of input (for a
/// progress bar on big files; one comparison per opcode otherwise).
pub fn parse_with_progress(
    data: &[u8],
    step: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<Document, PickleError> {
    Machine::new(data).run(step.max(1), progress)
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed (for error messages).
    op_pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    doc: Document,
    /// Memory the document takes so far, as counted: checked once per opcode.
    budget: Budget,
}

impl<'a> Machine<'a> {
    fn new(data: &'a [u8]) -> Self {
        Machine {
            data,
            pos: 0,
            op_pos: 0,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Memo {
                dense: Vec::new(),
                sparse: FxHashMap::default(),
            },
            doc: Document::default(),
            budget: Budget::new(data.len()),
        }
    }

    fn too_many_values(&self) -> PickleError {
        PickleError::TooManyValues {
            offset: self.op_pos as u64,
            len: self.data.len() as u64,
            budget: self.budget.limit(),
            per_byte: BYTES_PER_INPUT_BYTE,
        }
    }

    fn err(&self, message: impl Into<String>) -> PickleError {
        PickleError::Invalid {
            offset: self.op_pos as u64,
            message: message.into(),
        }
    }

    fn truncated(&self, needed: usize) -> PickleError {
        PickleError::Truncated {
            offset: self.op_pos as u64,
            len: self.data.len() as u64,
            needed: needed as u64,
            inside: self.inside(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| self.truncated(n))?;
        let slice = &self.data[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take_array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// A length field: must fit in the remaining input (checked by `take`, before allocating).
    fn len_field(&mut self, raw: u64) -> Result<usize, PickleError> {
        let remaining = self.data.len() - self.pos;
        if raw > remaining as u64 {
            return Err(self.err(format!(
                "length field says {raw} bytes but only {remaining} bytes of input remain"
            )));
        }
        Ok(raw as usize)
    }

    /// A text line ending in `\n` (protocol 0 opcodes), without the newline.
    fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(self.truncated(rest.len() + 1)),
        }
    }

    fn push(&mut self, v: Value) {
        self.budget.add(Budget::VALUE);
        self.stack.push(v);
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow (pop past a MARK or an empty stack)"));
        }
        self.stack.pop().ok_or_else(|| self.err("stack underflow"))
    }

    fn top(&self) -> Result<Value, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.err("stack underflow (no value above the MARK)"));
        }
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.err("stack underflow"))
    }

    /// Pops everything above the last MARK.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.err("no MARK on the stack"))?;
        Ok(self.stack.split_off(mark))
    }

    fn new_seq(&mut self, items: Vec<Value>) -> Result<SeqId, PickleError> {
        self.budget.add(Budget::CONTAINER);
        let id = u32::try_from(self.doc.seqs.len())
            .map_err(|_| self.err("more than 2^32 containers"))?;
        self.doc.seqs.push(items);
        Ok(SeqId(id))
    }

    fn new_dict(&mut self, items: Vec<(Value, Value)>) -> Result<DictId, PickleError> {
        self.budget.add(Budget::CONTAINER);
        let id = u32::try_from(self.doc.dicts.len())
            .map_err(|_| self.err("more than 2^32 containers"))?;
        self.doc.dicts.push(items);
        Ok(DictId(id))
    }

    fn push_str(&mut self, raw: &[u8]) -> Result<(), PickleError> {
        let id = match std::str::from_utf8(raw) {
            Ok(s) => self.budget.intern(&mut self.doc.strings, s),
            Err(_) if is_surrogate_escaped(raw) => {
                // CPython writes lone surrogates with "surrogatepass"; keep the text readable.
                let s = String::from_utf8_lossy(raw);
                self.budget.intern(&mut self.doc.strings, &s)
            }
            Err(e) => {
                return Err(self.err(format!(
                    "invalid UTF-8 in string at string byte {}: {e}",
                    e.valid_up_to()
                )))
            }
        };
        self.push(Value::Str(id));
        Ok(())
    }

    fn push_bytes(&mut self, raw: &[u8]) {
        self.budget.add(Budget::text(raw.len()));
        let i = self.doc.bytes.len() as u32;
        self.doc.bytes.push(raw.into());
        self.push(Value::Bytes(i));
    }

    fn push_int(&mut self, v: i128) {
        match i64::try_from(v) {
            Ok(small) => self.push(Value::Int(small)),
            Err(_) => {
                let i = self.doc.big_ints.len() as u32;
                self.doc.big_ints.push(v);
                self.push(Value::BigInt(i));
            }
        }
    }

    fn push_long_bytes(&mut self, raw: &[u8]) -> Result<(), PickleError> {
        if raw.len() > MAX_INT_BYTES {
            return Err(self.err(format!(
                "integer of {} bytes is too large for a memory snapshot (at most {MAX_INT_BYTES})",
                raw.len()
            )));
        }
        let v = decode_le_signed(raw);
        self.push_int(v);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(index)
            .ok_or_else(|| self.err(format!("memo index {index} was never stored")))?;
        self.push(v);
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Result<(), PickleError> {
        let v = self.top()?;
        self.budget.add(Budget::VALUE);
        self.memo.put(index, v);
        Ok(())
    }

    fn list_target(&self, v: Value, what: &str) -> Result<SeqId, PickleError> {
        match v {
            Value::List(id) => Ok(id),
            other => Err(self.err(format!("{what} needs a list, found {}", other.type_name()))),
        }
    }

    fn dict_target(&self, v: Value, what: &str) -> Result<DictId, PickleError> {
        match v {
            Value::Dict(id) => Ok(id),
            other => Err(self.err(format!("{what} needs a dict, found {}", other.type_name()))),
        }
    }

    fn pairs(&self, items: Vec<Value>) -> Result<Vec<(Value, Value)>, PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.err("odd number of items for dict keys and values"));
        }
        let mut out = Vec::with_capacity(items.len() / 2);
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k, v));
        }
        Ok(out)
    }

    /// Path of the value being built (`device_traces[0][17]`, at most three steps), from the
    /// containers under the open MARKs.
    fn inside(&self) -> Option<String> {
        let levels: Vec<Level> = self
            .marks
            .iter()
            .map(|&m| {
                let container = match m.checked_sub(1).and_then(|i| self.stack.get(i)) {
                    Some(Value::List(id)) => Holder::List(self.doc.seq(*id).len()),
                    Some(Value::Dict(_)) => Holder::Dict,
                    _ => Holder::Other,
                };
                Level { mark: m, container }
            })
            .collect();
        inside_path(&levels, self)
    }

    /// Closes what the cut left open (see [`parse_salvage`]); the root is the outermost value.
    fn close_for_salvage(&mut self) {
        while let Some(m) = self.marks.pop() {
            let mut items = self.stack.split_off(m.min(self.stack.len()));
            let Some(below) = m.checked_sub(1) else {
                continue;
            };
            match self.stack.get(below).copied() {
                Some(Value::List(id)) => {
                    // A container made just before the cut is not complete either.
                    while let Some(v) = items.last() {
                        let empty = match v {
                            Value::List(l) => self.doc.seq(*l).is_empty(),
                            Value::Dict(d) => self.doc.dict(*d).is_empty(),
                            _ => false,
                        };
                        if !empty {
                            break;
                        }
                        items.pop();
                    }
                    self.doc.seqs[id.0 as usize].extend(items);
                }
                Some(Value::Dict(id)) if below == 0 => {
                    // `[…, key, list, item]`: the item awaited its APPEND (CPython fills
                    // one-item lists so, e.g. the only device's trace into device_traces).
                    if items.len() % 2 == 1 && items.len() >= 3 {
                        if let Value::List(l) = items[items.len() - 2] {
                            if let Some(last) = items.pop() {
                                let empty = match last {
                                    Value::List(x) => self.doc.seq(x).is_empty(),
                                    Value::Dict(x) => self.doc.dict(x).is_empty(),
                                    _ => false,
                                };
                                if !empty {
                                    self.doc.seqs[l.0 as usize].push(last);
                                }
                            }
                        }
                    }
                    let n = items.len() / 2 * 2;
                    let pairs: Vec<(Value, Value)> =
                        items[..n].chunks_exact(2).map(|p| (p[0], p[1])).collect();
                    self.doc.dicts[id.0 as usize].extend(pairs);
                }
                // A dict cut in the middle (a segment, a block, an entry) is dropped whole.
                Some(Value::Dict(_)) => self.stack.truncate(below),
                _ => {}
            }
        }
        self.doc.root = self.stack.first().copied();
    }

    fn refuse(&self, code: u8) -> PickleError {
        PickleError::Refused {
            offset: self.op_pos as u64,
            opcode: op::name(code),
        }
    }

    fn run(mut self, step: usize, progress: &mut dyn FnMut(u64)) -> Result<Document, PickleError> {
        let r = self.run_inner(step, progress);
        // Work in bytes stepped over, as every opcode walk counts it.
        crate::work::add(self.pos as u64);
        r?;
        Ok(self.doc)
    }

    fn run_inner(&mut self, step: usize, progress: &mut dyn FnMut(u64)) -> Result<(), PickleError> {
        let mut next_report = step;
        loop {
            if self.pos >= next_report {
                progress(self.pos as u64);
                next_report = self.pos.saturating_add(step);
            }
            self.op_pos = self.pos;
            if self.budget.over() {
                return Err(self.too_many_values());
            }
            let code = match self.data.get(self.pos) {
                Some(&c) => c,
                None => {
                    return Err(PickleError::Truncated {
                        offset: self.pos as u64,
                        len: self.data.len() as u64,
                        needed: 1,
                        inside: self.inside(),
                    })
                }
            };
            self.pos += 1;
            match code {
                op::PROTO => {
                    let v = self.u8()?;
                    if v > 5 {
                        return Err(self.err(format!(
                            "unsupported pickle protocol {v} (this reader knows 0 to 5)"
                        )));
                    }
                }
                op::FRAME => {
                    let n = self.u64()?;
                    let remaining = (self.data.len() - self.pos) as u64;
                    // A frame cut by the end of the input: read on, the first incomplete
                    // opcode says where (and salvage keeps what is complete). A claim far
                    // beyond the input is not a cut.
                    if n > remaining.saturating_add(MAX_CUT_FRAME) {
                        return Err(PickleError::FrameTooLong {
                            offset: self.op_pos as u64,
                            len: self.data.len() as u64,
                            claimed: n,
                        });
                    }
                }
                op::STOP => {
                    if !self.marks.is_empty() {
                        return Err(self.err(format!(
                            "STOP with {} MARK{} still open (containers never closed)",
                            self.marks.len(),
                            if self.marks.len() == 1 { "" } else { "s" }
                        )));
                    }
                    let root = self.pop()?;
                    self.doc.root = Some(root);
                    self.doc.end = Some(self.pos);
                    return Ok(());
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        // POP of a bare MARK (allowed by CPython).
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let v = self.top()?;
                    self.push(v);
                }
                // --- constants and numbers ---
                op::NONE => self.push(Value::None),
                op::NEWTRUE => self.push(Value::Bool(true)),
                op::NEWFALSE => self.push(Value::Bool(false)),
                op::BININT => {
                    let v = i32::from_le_bytes(self.take_array()?);
                    self.push(Value::Int(v as i64));
                }
                op::BININT1 => {
                    let v = self.u8()?;
                    self.push(Value::Int(v as i64));
                }
                op::BININT2 => {
                    let v = self.u16()?;
                    self.push(Value::Int(v as i64));
                }
                op::LONG1 => {
                    let n = self.u8()? as usize;
                    let raw = self.take(n)?;
                    self.push_long_bytes(raw)?;
                }
                op::LONG4 => {
                    let n = i32::from_le_bytes(self.take_array()?);
                    if n < 0 {
                        return Err(self.err("LONG4 with a negative byte count"));
                    }
                    let n = self.len_field(n as u64)?;
                    let raw = self.take(n)?;
                    self.push_long_bytes(raw)?;
                }
                op::INT => {
                    let line = self.line()?;
                    match line {
                        b"01" => self.push(Value::Bool(true)),
                        b"00" => self.push(Value::Bool(false)),
                        _ => {
                            let v = parse_text_int(line)
                                .ok_or_else(|| self.err("INT opcode with a malformed number"))?;
                            self.push_int(v);
                        }
                    }
                }
                op::LONG => {
                    let line = self.line()?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    let v = parse_text_int(digits)
                        .ok_or_else(|| self.err("LONG opcode with a malformed or huge number"))?;
                    self.push_int(v);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.push(Value::Float(v));
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let v = std::str::from_utf8(line)
                        .ok()
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .ok_or_else(|| self.err("FLOAT opcode with a malformed number"))?;
                    self.push(Value::Float(v));
                }
                // --- strings and bytes ---
                op::SHORT_BINUNICODE => {
                    let n = self.u8()? as usize;
                    let raw = self.take(n)?;
                    self.push_str(raw)?;
                }
                op::BINUNICODE => {
                    let n = self.u32()? as u64;
                    let n = self.len_field(n)?;
                    let raw = self.take(n)?;
                    self.push_str(raw)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let n = self.len_field(n)?;
                    let raw = self.take(n)?;
                    self.push_str(raw)?;
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let text = decode_raw_unicode_escape(line)
                        .ok_or_else(|| self.err("UNICODE opcode with a malformed escape"))?;
                    let id = self.budget.intern(&mut self.doc.strings, &text);
                    self.push(Value::Str(id));
                }
                op::SHORT_BINSTRING => {
                    let n = self.u8()? as usize;
                    let raw = self.take(n)?;
                    self.push_bytes(raw);
                }
                op::BINSTRING => {
                    let n = i32::from_le_bytes(self.take_array()?);
                    if n < 0 {
                        return Err(self.err("BINSTRING with a negative length"));
                    }
                    let n = self.len_field(n as u64)?;
                    let raw = self.take(n)?;
                    self.push_bytes(raw);
                }
                op::STRING => {
                    let line = self.line()?;
                    let raw = decode_string_repr(line)
                        .ok_or_else(|| self.err("STRING opcode with a malformed quoted string"))?;
                    self.push_bytes(&raw);
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8()? as usize;
                    let raw = self.take(n)?;
                    self.push_bytes(raw);
                }
                op::BINBYTES => {
                    let n = self.u32()? as u64;
                    let n = self.len_field(n)?;
                    let raw = self.take(n)?;
                    self.push_bytes(raw);
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let n = self.len_field(n)?;
                    let raw = self.take(n)?;
                    self.push_bytes(raw);
                }
                // --- containers ---
                op::EMPTY_LIST => {
                    let id = self.new_seq(Vec::new())?;
                    self.push(Value::List(id));
                }
                op::EMPTY_DICT => {
                    let id = self.new_dict(Vec::new())?;
                    self.push(Value::Dict(id));
                }
                op::EMPTY_TUPLE => {
                    let id = self.new_seq(Vec::new())?;
                    self.push(Value::Tuple(id));
                }
                op::EMPTY_SET => {
                    let id = self.new_seq(Vec::new())?;
                    self.push(Value::Set(id));
                }
                op::LIST => {
                    let items = self.pop_mark()?;
                    let id = self.new_seq(items)?;
                    self.push(Value::List(id));
                }
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    let id = self.new_seq(items)?;
                    self.push(Value::Tuple(id));
                }
                op::FROZENSET => {
                    let items = self.pop_mark()?;
                    let id = self.new_seq(items)?;
                    self.push(Value::FrozenSet(id));
                }
                op::DICT => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    let id = self.new_dict(pairs)?;
                    self.push(Value::Dict(id));
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = (code - op::TUPLE1 + 1) as usize;
                    let mut items = vec![Value::None; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop()?;
                    }
                    let id = self.new_seq(items)?;
                    self.push(Value::Tuple(id));
                }
                op::APPEND => {
                    let item = self.pop()?;
                    let target = self.top()?;
                    let id = self.list_target(target, "APPEND")?;
                    self.doc.seqs[id.0 as usize].push(item);
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    let id = self.list_target(target, "APPENDS")?;
                    self.doc.seqs[id.0 as usize].extend(items);
                }
                op::ADDITEMS => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    match target {
                        Value::Set(id) => self.doc.seqs[id.0 as usize].extend(items),
                        other => {
                            return Err(self
                                .err(format!("ADDITEMS needs a set, found {}", other.type_name())))
                        }
                    }
                }
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let target = self.top()?;
                    let id = self.dict_target(target, "SETITEM")?;
                    self.doc.dicts[id.0 as usize].push((key, value));
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    let target = self.top()?;
                    let id = self.dict_target(target, "SETITEMS")?;
                    self.doc.dicts[id.0 as usize].extend(pairs);
                }
                // --- memo ---
                op::MEMOIZE => {
                    let i = self.memo.next_index();
                    self.memo_put(i)?;
                }
                op::BINPUT => {
                    let i = self.u8()? as u64;
                    self.memo_put(i)?;
                }
                op::LONG_BINPUT => {
                    let i = self.u32()? as u64;
                    self.memo_put(i)?;
                }
                op::PUT => {
                    let line = self.line()?;
                    let i = parse_text_index(line)
                        .ok_or_else(|| self.err("PUT with a malformed memo index"))?;
                    self.memo_put(i)?;
                }
                op::BINGET => {
                    let i = self.u8()? as u64;
                    self.memo_get(i)?;
                }
                op::LONG_BINGET => {
                    let i = self.u32()? as u64;
                    self.memo_get(i)?;
                }
                op::GET => {
                    let line = self.line()?;
                    let i = parse_text_index(line)
                        .ok_or_else(|| self.err("GET with a malformed memo index"))?;
                    self.memo_get(i)?;
                }
                // --- everything that imports, calls or reaches outside the stream ---
                op::GLOBAL
                | op::STACK_GLOBAL
                | op::REDUCE
                | op::BUILD
                | op::INST
                | op::OBJ
                | op::NEWOBJ
                | op::NEWOBJ_EX
                | op::EXT1
                | op::EXT2
                | op::EXT4
                | op::PERSID
                | op::BINPERSID
                | op::NEXT_BUFFER
                | op::READONLY_BUFFER => return Err(self.refuse(code)),
                other => {
                    return Err(self.err(format!("unknown opcode 0x{other:02x}")));
                }
            }
        }
    }
}

impl StackView for Machine<'_> {
    fn key(&self, i: usize) -> Option<String> {
        match self.stack.get(i) {
            Some(Value::Str(id)) => Some(self.doc.str(*id).to_owned()),
            _ => None,
        }
    }

    fn list_len(&self, i: usize) -> Option<usize> {
        match self.stack.get(i) {
            Some(Value::List(id)) => Some(self.doc.seq(*id).len()),
            _ => None,
        }
    }
}

/// What sits under an open MARK.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Holder {
    /// A list with this many items so far.
    List(usize),
    Dict,
    Other,
}

/// An open MARK: its stack position and the container under it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Level {
    pub mark: usize,
    pub container: Holder,
}

/// How [`inside_path`] sees the stack.
pub(crate) trait StackView {
    /// Text of the string at stack position `i`.
    fn key(&self, i: usize) -> Option<String>;
    /// Length of the list at stack position `i`.
    fn list_len(&self, i: usize) -> Option<usize>;
    /// How many list items position `i` stands for (1; more for runs of trace records).
    fn count(&self, _i: usize) -> usize {
        1
    }
}

/// The path of the value being built, from the open marks (outermost first): a dict level adds
/// the key of its pending value, a list level the index of its pending item (at most three
/// steps). CPython fills one-item containers without a MARK (`item APPEND`), so a dict's
/// pending value may be a list with one more item after it: that item is the list's next.
pub(crate) fn inside_path(levels: &[Level], view: &dyn StackView) -> Option<String> {
    let mut path = String::new();
    for (depth, w) in levels.windows(2).enumerate() {
        if depth == 3 {
            break;
        }
        let (outer, inner) = (w[0], w[1]);
        // The value being built at this level sits right under the next MARK.
        let Some(child) = inner.mark.checked_sub(1) else {
            break;
        };
        if child < outer.mark {
            break;
        }
        match outer.container {
            Holder::List(len) => {
                let before: usize = (outer.mark..child).map(|i| view.count(i)).sum();
                path.push_str(&format!("[{}]", len + before));
            }
            Holder::Dict => {
                let c = child - outer.mark;
                let (key_at, append_to) = if c % 2 == 1 {
                    (child - 1, None)
                } else if c >= 2 {
                    (child - 2, Some(child - 1))
                } else {
                    break;
                };
                let Some(k) = view.key(key_at) else {
                    break;
                };
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&k);
                if let Some(list) = append_to {
                    let Some(len) = view.list_len(list) else {
                        break;
                    };
                    path.push_str(&format!("[{len}]"));
                }
            }
            Holder::Other => break,
        }
    }
    // Paths start at a key of the outermost dict.
    (!path.is_empty() && !path.starts_with('[')).then_some(path)
}

/// Little-endian two's complement, as LONG1/LONG4 write it (at most 16 bytes).
fn decode_le_signed(raw: &[u8]) -> i128 {
    if raw.is_empty() {
        return 0;
    }
    let mut buf = if raw[raw.len() - 1] & 0x80 != 0 {
        [0xffu8; 16]
    } else {
        [0u8; 16]
    };
    buf[..raw.len()].copy_from_slice(raw);
    i128::from_le_bytes(buf)
}

fn parse_text_int(line: &[u8]) -> Option<i128> {
    std::str::from_utf8(line).ok()?.trim().parse::<i128>().ok()
}

fn parse_text_index(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim().parse::<u64>().ok()
}

/// True when `raw` is valid UTF-8 except for CESU-style encoded surrogates (ED A0..BF xx).
fn is_surrogate_escaped(raw: &[u8]) -> bool {
    let mut rest = raw;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return true,
            Err(e) => {
                let at = e.valid_up_to();
                let bad = &rest[at..];
                if bad.len() >= 3
                    && bad[0] == 0xED
                    && (0xA0..=0xBF).contains(&bad[1])
                    && (0x80..=0xBF).contains(&bad[2])
                {
                    rest = &bad[3..];
                } else {
                    return false;
                }
            }
        }
    }
}

/// Protocol 0 `UNICODE` argument: raw-unicode-escape (only `\uXXXX` and `\UXXXXXXXX` escapes).
fn decode_raw_unicode_escape(line: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
            let width = if line[i + 1] == b'u' { 4 } else { 8 };
            let hex = line.get(i + 2..i + 2 + width)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            i += 2 + width;
        } else {
            // raw-unicode-escape stores other characters as Latin-1 bytes.
            out.push(b as char);
            i += 1;
        }
    }
    Some(out)
}

/// Protocol 0 `STRING` argument: a Python 2 `repr()` of a byte string, quoted.
fn decode_string_repr(line: &[u8]) -> Option<Vec<u8>> {
    if line.len() < 2 {
        return None;
    }
    let q = line[0];
    if (q != b'\'' && q != b'"') || line[line.len() - 1] != q {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let c = *body.get(i + 1)?;
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'x' => {
                let hex = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (c - b'0') as u32;
                let mut digits = 1;
                while digits < 3 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    digits += 1;
                }
                out.push((v & 0xff) as u8);
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn le_signed_matches_python() {
        assert_eq!(decode_le_signed(&[]), 0);
        assert_eq!(decode_le_signed(&[0xff]), -1);
        assert_eq!(decode_le_signed(&[0xff, 0x00]), 255);
        assert_eq!(decode_le_signed(&[0x00, 0x80]), -32768);
        // 2**64 - 1 as Python writes it: nine bytes.
        assert_eq!(
            decode_le_signed(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]),
            u64::MAX as i128
        );
    }

    #[test]
    fn surrogate_escape_detection() {
        assert!(is_surrogate_escaped(b"ab\xed\xa0\x80cd"));
        assert!(!is_surrogate_escaped(b"ab\xffcd"));
    }

    #[test]
    fn string_repr() {
        assert_eq!(decode_string_repr(b"'a\\nb\\x41\\101'").unwrap(), b"a\nbAA");
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// Real snapshots read by this reader stay well under the budget. Per input byte, the
    /// fixtures of a MiB and more count 4.3 to 5.2 bytes: their frames and strings repeat.
    /// Small ones count up to 9 (their first appearances dominate), but they stay far under
    /// [`MIN_BUDGET`], and so would a whole file of first appearances below 7 MB.
    #[test]
    fn real_snapshots_stay_well_under_the_budget() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real");
        let (mut big, mut worst_big) = (0, 0.0f64);
        for entry in std::fs::read_dir(&dir).expect("fixtures/real") {
            let path = entry.expect("entry").path();
            if path.extension().and_then(|e| e.to_str()) != Some("pickle") {
                continue;
            }
            let data = std::fs::read(&path).expect("fixture");
            let mut m = Machine::new(&data);
            m.run_inner(usize::MAX, &mut |_| {})
                .expect("a real snapshot reads");
            let per_byte = m.budget.held as f64 / data.len() as f64;
            eprintln!(
                "{}: {per_byte:.2} counted bytes per input byte",
                path.display()
            );
            assert!(
                m.budget.held * 2 < m.budget.limit,
                "{}: {:?}",
                path.display(),
                m.budget
            );
            if data.len() >= 1 << 20 {
                big += 1;
                worst_big = worst_big.max(per_byte);
            }
        }
        assert!(big >= 3, "only {big} real fixtures of a MiB or more");
        assert!(
            worst_big <= 0.6 * BYTES_PER_INPUT_BYTE as f64,
            "{worst_big:.2} bytes per input byte"
        );
    }

    /// One-byte containers: refused at the budget, with the offset, not read to the end.
    #[test]
    fn tiny_containers_stop_at_the_budget() {
        let n = 8 << 20;
        let mut data = b"\x80\x04](".to_vec();
        data.extend(std::iter::repeat_n(b']', n));
        data.extend(b"e.");
        let err = parse(&data).expect_err("over the budget");
        let PickleError::TooManyValues { offset, budget, .. } = err else {
            panic!("{err}");
        };
        assert_eq!(
            budget,
            MIN_BUDGET.max(data.len() as u64 * BYTES_PER_INPUT_BYTE)
        );
        // 48 counted bytes per empty list: the budget is met about a fifth of the way in.
        assert!(offset > 4 && offset < data.len() as u64 / 3, "{offset}");
    }
}
