//! `snapscan explain`: CUDA out-of-memory messages of PyTorch's caching allocator, found in a
//! log (CI output, a pasted traceback) when no snapshot was kept.
//!
//! The log is streamed line by line through [`BufRead`]; nothing but the current line (capped at
//! [`MAX_SEGMENT_BYTES`]) and the message being read (capped at [`MAX_MESSAGE_BYTES`]) is held.
//!
//! A message starts at `CUDA out of memory` and must go on with `Tried to allocate <size>`;
//! ROCm builds print the same message with `HIP out of memory`. Look-alikes (`CUDA error: out
//! of memory`, CPU allocator failures, cuBLAS, MPS, XLA, prose) are not messages. All known wordings are read:
//!
//! * ≈1.0–1.4: `(GPU n; C total capacity; A already allocated; F free; X cached)`
//! * ≈1.5–2.0: `(GPU n; C total capacity; A already allocated; F free; [L allowed;]
//!   R reserved in total by PyTorch)`, with or without the `max_split_size_mb` hint
//! * ≥2.1: `GPU n has a total capacity of C of which F is free. [process entries] [L allowed;]
//!   Of the allocated memory A is allocated by PyTorch, [with P allocated in private pools …,]
//!   and U is reserved by PyTorch but unallocated.` (2.1 spells it `capacty`)
//! * `Tried to allocate more than 1EB memory.` (requests of 2^60 bytes or more)
//!
//! Matching ignores whitespace, so a message wrapped over several lines (at spaces or inside a
//! word) reads the same as on one line; a log prefix that the continuation lines share with the
//! first one (`[rank0]: `, a logger's `… [file.py:12] `) is dropped from them.
//!
//! Figures are converted exactly (decimal, 1024-based units, halves rounded away from zero):
//! `1.06 GiB` = 1138166333. A figure that does not fit in 64 bits (only seen when NVML reported
//! garbage, e.g. `17179869184.00 GiB` = 2^64) is treated as not printed: `null` in JSON, with a
//! note. `requested_bytes` is never null; a requested figure that large would saturate to
//! `u64::MAX` (PyTorch itself refuses such requests with the `more than 1EB` wording).

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use serde::Serialize;

/// Version of the JSON document of `snapscan explain`.
pub const SCHEMA_VERSION: u32 = 1;

/// The text every message starts with. ROCm builds of PyTorch print the same caching-allocator
/// message with `HIP` for `CUDA`.
const ANCHOR: &str = "CUDA out of memory";
const HIP_ANCHOR: &str = "HIP out of memory";

/// The first message start in `s` at or after `from`: its offset and length.
fn find_anchor(s: &str, from: usize) -> Option<(usize, usize)> {
    let rest = s.get(from..)?;
    [ANCHOR, HIP_ANCHOR]
        .iter()
        .filter_map(|a| rest.find(a).map(|k| (from + k, a.len())))
        .min()
}
/// The message starts of one line, asked for left to right (`from` never decreases): each
/// anchor's next match is searched for once and kept until passed, so a line with many messages
/// is walked once per anchor instead of once per message ([`find_anchor`] from every message
/// searched the rest of the line for the anchor that does not occur: a 1 MB line of short
/// messages took 5.2 s).
struct Anchors<'a> {
    s: &'a str,
    /// Per anchor: the offset searched from, and the match found there (`None`: none after it).
    next: [Option<(usize, Option<usize>)>; 2],
}

impl<'a> Anchors<'a> {
    fn new(s: &'a str) -> Self {
        Self { s, next: [None; 2] }
    }

    /// The first message start at or after `from`: its offset and length, as [`find_anchor`].
    fn find(&mut self, from: usize) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (slot, anchor) in self.next.iter_mut().zip([ANCHOR, HIP_ANCHOR]) {
            let fresh = match *slot {
                Some((at, found)) => at <= from && found.is_none_or(|k| k >= from),
                None => false,
            };
            if !fresh {
                let found = self
                    .s
                    .get(from..)
                    .and_then(|rest| rest.find(anchor))
                    .map(|k| from + k);
                *slot = Some((from, found));
            }
            if let Some((_, Some(k))) = *slot {
                if best.is_none_or(|b| (k, anchor.len()) < b) {
                    best = Some((k, anchor.len()));
                }
            }
        }
        best
    }
}

/// Longest stretch of one line (or of one `\r`-separated part of it) that is looked at; the rest
/// of a longer line is skipped.
pub const MAX_SEGMENT_BYTES: usize = 1 << 20;
/// Longest message text kept (a real message is about 1 KiB).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Lines after the first that an unfinished (wrapped) message may take.
const MAX_CONTINUATION_LINES: usize = 8;
/// Messages kept; more are counted in [`Explain::messages_omitted`].
pub const MAX_MESSAGES: usize = 10_000;
/// PyTorch's limit for a single request (`one_exa_bytes`).
const ONE_EXA_BYTES: u64 = 1 << 60;

/// What most likely caused the out-of-memory error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Reserved-but-unallocated memory was at least the request: free memory, in pieces.
    Fragmentation,
    /// Capacity − free − this process's use was at least the request.
    OtherProcesses,
    /// The device was full.
    Full,
    /// The message does not print enough figures to tell.
    Unknown,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fragmentation => "fragmentation",
            Verdict::OtherProcesses => "other_processes",
            Verdict::Full => "full",
            Verdict::Unknown => "unknown",
        }
    }
}

/// Which shape of message it was (tells the PyTorch generation, roughly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Wording {
    /// `(GPU n; …; X cached)`, PyTorch ≈1.0–1.4.
    Cached,
    /// `(GPU n; …; R reserved in total by PyTorch)`, PyTorch ≈1.5–2.0.
    ReservedInTotal,
    /// `GPU n has a total capacity of …`, PyTorch ≥2.1.
    TotalCapacityOf,
    /// Only the requested size (`more than 1EB`, or a message cut short).
    RequestOnly,
}

/// A `Process <pid> has X memory in use.` entry (another process, or this one seen through a
/// container's PID namespace: the message does not say which).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessEntry {
    pub pid: u64,
    pub bytes: Option<u64>,
}

/// One first action, with the figure behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Advice {
    pub action: String,
    pub reason: String,
}

/// One CUDA out-of-memory message. The first ten fields are the JSON contract; the rest are
/// extras.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomMessage {
    /// 1-based line that holds `CUDA out of memory`.
    pub line: u64,
    pub gpu: Option<u32>,
    pub requested_bytes: u64,
    pub capacity_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Only `Including non-PyTorch memory, this process has X memory in use.`
    pub process_in_use_bytes: Option<u64>,
    pub allocated_bytes: Option<u64>,
    /// Only printed by the `reserved in total by PyTorch` wording.
    pub reserved_bytes: Option<u64>,
    pub reserved_unallocated_bytes: Option<u64>,
    pub verdict: Verdict,
    /// Why this verdict, with the figures.
    pub reason: String,
    /// `cuda`, or `hip` for ROCm builds (`HIP out of memory`).
    pub device_type: &'static str,
    pub wording: Wording,
    /// `L allowed;` (a per-process memory fraction was set).
    pub allowed_bytes: Option<u64>,
    /// `with P allocated in private pools (e.g., CUDA Graphs)` (included in allocated).
    pub private_pools_bytes: Option<u64>,
    pub process_entries: Vec<ProcessEntry>,
    pub notes: Vec<String>,
    pub advice: Vec<Advice>,
    /// The message up to its last figure, whitespace collapsed.
    pub text: String,
}

/// Everything found in one log.
#[derive(Clone, Debug, Serialize)]
pub struct Explain {
    pub schema_version: u32,
    pub messages: Vec<OomMessage>,
    /// Messages beyond [`MAX_MESSAGES`] (not in `messages`).
    #[serde(skip_serializing_if = "is_zero")]
    pub messages_omitted: u64,
    /// Lines read.
    #[serde(skip)]
    pub lines: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// ---------------------------------------------------------------------------------------------
// Figures

/// A printed size: bytes, or a figure too large for 64 bits (with its text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Figure {
    Bytes(u64),
    TooLarge(String),
}

impl Figure {
    fn bytes(&self) -> Option<u64> {
        match self {
            Figure::Bytes(b) => Some(*b),
            Figure::TooLarge(_) => None,
        }
    }
}

/// Parses one printed figure such as `1.06 GiB`, `0 bytes`, `1024.00 KiB` (whitespace anywhere
/// is ignored). Units: `bytes`, `KiB`, `MiB`, `GiB`, `TiB`, `PiB`, `EiB` (1024-based). `None`
/// when the text is not exactly one figure.
pub fn parse_figure(text: &str) -> Option<Figure> {
    let (compact, _) = compact(text);
    let mut cur = Cur::new(&compact);
    let figure = cur.size()?;
    cur.at_end().then_some(figure)
}

/// Formats bytes like PyTorch's `format_size` (2 decimals, 1024-based): `0 bytes`, `20.00 MiB`,
/// `1.06 GiB`, so figures can be found in the log again.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

/// A cursor over the whitespace-free text of a message.
struct Cur<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cur<'a> {
    fn new(s: &'a [u8]) -> Self {
        Cur { s, i: 0 }
    }

    fn rest(&self) -> &'a [u8] {
        self.s.get(self.i..).unwrap_or(&[])
    }

    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Consumes `lit` (written without spaces) if the text goes on with it.
    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    /// Moves past the next occurrence of `lit`.
    fn find(&mut self, lit: &str) -> bool {
        let pat = lit.as_bytes();
        if pat.is_empty() {
            return true;
        }
        match self.rest().windows(pat.len()).position(|w| w == pat) {
            Some(p) => {
                self.i += p + pat.len();
                true
            }
            None => false,
        }
    }

    /// Decimal digits as an integer; `None` (and nothing consumed) without a digit or when the
    /// number does not fit.
    fn uint(&mut self) -> Option<u64> {
        let start = self.i;
        let mut value: Option<u64> = Some(0);
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            value = value
                .and_then(|v| v.checked_mul(10))
                .and_then(|v| v.checked_add(u64::from(d - b'0')));
            self.i += 1;
        }
        if self.i == start {
            return None;
        }
        if value.is_none() {
            self.i = start;
        }
        value
    }

    /// `<digits>[.<digits>]<unit>`, converted exactly. Nothing is consumed on failure.
    fn size(&mut self) -> Option<Figure> {
        let start = self.i;
        let mut mantissa: u128 = 0;
        let mut too_large = false;
        let mut int_digits = 0;
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            int_digits += 1;
            match mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(d - b'0')))
            {
                Some(m) => mantissa = m,
                None => too_large = true,
            }
            self.i += 1;
        }
        if int_digits == 0 {
            self.i = start;
            return None;
        }
        // Fractional digits: up to 18 are kept exactly; further ones (never printed by
        // PyTorch, which prints two) are ignored.
        let mut scale: u128 = 1;
        if self.peek() == Some(b'.') && self.s.get(self.i + 1).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
            let mut kept = 0;
            while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
                if kept < 18 && !too_large {
                    if let Some(m) = mantissa
                        .checked_mul(10)
                        .and_then(|m| m.checked_add(u128::from(d - b'0')))
                    {
                        mantissa = m;
                        scale *= 10;
                        kept += 1;
                    }
                }
                self.i += 1;
            }
        }
        let number_end = self.i;
        let factor: u128 = if self.eat("bytes") || self.eat("byte") {
            1
        } else if self.eat("KiB") {
            1 << 10
        } else if self.eat("MiB") {
            1 << 20
        } else if self.eat("GiB") {
            1 << 30
        } else if self.eat("TiB") {
            1 << 40
        } else if self.eat("PiB") {
            1 << 50
        } else if self.eat("EiB") {
            1 << 60
        } else {
            self.i = start;
            return None;
        };
        let printed = || {
            let number = String::from_utf8_lossy(&self.s[start..number_end]).into_owned();
            let unit = String::from_utf8_lossy(&self.s[number_end..self.i]).into_owned();
            format!("{number} {unit}")
        };
        if too_large {
            return Some(Figure::TooLarge(printed()));
        }
        let Some(product) = mantissa.checked_mul(factor) else {
            return Some(Figure::TooLarge(printed()));
        };
        let mut bytes = product / scale;
        // Halves away from zero: the remainder is below `scale` ≤ 10^18, so doubling is safe.
        if 2 * (product % scale) >= scale {
            bytes += 1;
        }
        match u64::try_from(bytes) {
            Ok(b) => Some(Figure::Bytes(b)),
            Err(_) => Some(Figure::TooLarge(printed())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One message

/// Which variable the message's own hint names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HintVar {
    /// `PYTORCH_ALLOC_CONF` (PyTorch ≥ 2.9).
    AllocConf,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    CudaAllocConf,
    None,
}

/// Figures of one message as printed.
#[derive(Debug)]
struct Parsed {
    wording: Wording,
    gpu: Option<u32>,
    requested: Figure,
    more_than_1eb: bool,
    capacity: Option<Figure>,
    free: Option<Figure>,
    process_in_use: Option<Figure>,
    allocated: Option<Figure>,
    reserved: Option<Figure>,
    cached: Option<Figure>,
    unallocated: Option<Figure>,
    allowed: Option<Figure>,
    private_pools: Option<Figure>,
    entries: Vec<(u64, Figure)>,
    /// `HIP out of memory` (a ROCm build).
    hip: bool,
    /// The last figure of the wording was read.
    complete: bool,
    /// Index in the compact text just after the last figure (or label) read.
    end: usize,
    hint: HintVar,
}

impl Parsed {
    fn new(requested: Figure) -> Self {
        Parsed {
            wording: Wording::RequestOnly,
            gpu: None,
            requested,
            more_than_1eb: false,
            capacity: None,
            free: None,
            process_in_use: None,
            allocated: None,
            reserved: None,
            cached: None,
            unallocated: None,
            allowed: None,
            private_pools: None,
            entries: Vec::new(),
            hip: false,
            complete: false,
            end: 0,
            hint: HintVar::None,
        }
    }
}

/// Whitespace-free copy of `text`, with the byte offset in `text` of every byte kept.
/// Unicode whitespace (no-break spaces of pasted logs included) and zero-width characters
/// are dropped.
fn compact(text: &str) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::with_capacity(text.len());
    let mut map = Vec::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        if is_blank(c) {
            continue;
        }
        let mut buf = [0u8; 4];
        for b in c.encode_utf8(&mut buf).bytes() {
            out.push(b);
            map.push(i);
        }
    }
    (out, map)
}

fn is_blank(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{200b}' | '\u{200c}' | '\u{200d}' | '\u{feff}')
}

fn gpu_index(cur: &mut Cur) -> Option<u32> {
    cur.uint().and_then(|n| u32::try_from(n).ok())
}

/// Parses the compact text of a message (starting at the anchor). `None` when it is not an
/// allocator message (no `Tried to allocate <size>`).
fn parse(c: &[u8]) -> Option<Parsed> {
    let mut cur = Cur::new(c);
    let hip = cur.eat("HIPoutofmemory");
    if !hip && !cur.eat("CUDAoutofmemory") {
        return None;
    }
    cur.eat(".");
    if !cur.eat("Triedtoallocate") {
        return None;
    }
    if cur.eat("morethan1EBmemory") {
        let mut p = Parsed::new(Figure::Bytes(ONE_EXA_BYTES));
        p.hip = hip;
        p.more_than_1eb = true;
        p.complete = true;
        p.end = cur.i;
        return Some(p);
    }
    let requested = cur.size()?;
    let mut p = Parsed::new(requested);
    p.hip = hip;
    p.end = cur.i;
    cur.eat(".");
    if cur.eat("(GPU") {
        p.wording = Wording::ReservedInTotal;
        parenthesised(&mut cur, &mut p);
    } else if cur.eat("GPU") {
        p.wording = Wording::TotalCapacityOf;
        let _ = sentences(&mut cur, &mut p);
    } else if !cur.at_end() {
        // Something else follows the request: nothing more to wait for.
        p.complete = true;
    }
    p.hint = if contains(&c[p.end..], b"PYTORCH_ALLOC_CONF") {
        HintVar::AllocConf
    } else if contains(&c[p.end..], b"PYTORCH_CUDA_ALLOC_CONF") {
        HintVar::CudaAllocConf
    } else {
        HintVar::None
    };
    Some(p)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `(GPU n; C total capacity; A already allocated; F free; [L allowed;] X cached|R reserved in
/// total by PyTorch)`; items are read by their labels, in any order.
fn parenthesised(cur: &mut Cur, p: &mut Parsed) {
    p.gpu = gpu_index(cur);
    p.end = cur.i;
    cur.eat(";");
    loop {
        let rest = cur.rest();
        let delimiter = rest.iter().position(|&b| b == b';' || b == b')');
        // The last item of a message whose closing parenthesis was lost (pasted, cut) ends the
        // message; its label is followed by whatever came next.
        let lost_paren = delimiter.is_none()
            && Cur::new(rest).size().is_some()
            && [&b"reservedintotalbyPyTorch"[..], b"cached"]
                .iter()
                .any(|label| contains(rest, label));
        let Some(k) = delimiter.or(lost_paren.then_some(rest.len())) else {
            return;
        };
        let item = &rest[..k];
        let closing = lost_paren || rest[k] == b')';
        let mut ic = Cur::new(item);
        if let Some(figure) = ic.size() {
            let label = ic.rest();
            // Labels are read as prefixes: without the parenthesis, text runs on after them.
            let is = |l: &[u8]| label == l || (lost_paren && label.starts_with(l));
            let slot = if is(b"totalcapacity") || is(b"totalcapacty") {
                Some(&mut p.capacity)
            } else if is(b"alreadyallocated") {
                Some(&mut p.allocated)
            } else if is(b"free") {
                Some(&mut p.free)
            } else if label.starts_with(b"cached") {
                Some(&mut p.cached)
            } else if label.starts_with(b"reservedintotalbyPyTorch") {
                Some(&mut p.reserved)
            } else if is(b"allowed") {
                Some(&mut p.allowed)
            } else {
                None
            };
            if let Some(slot) = slot {
                *slot = Some(figure);
                p.end = cur.i + k + 1;
            }
        }
        cur.i += (k + 1).min(rest.len());
        if closing {
            p.complete = true;
            p.end = cur.i;
            if p.cached.is_some() && p.reserved.is_none() {
                p.wording = Wording::Cached;
            }
            return;
        }
    }
}

/// `GPU n has a total capacity of C of which F is free. [entries] Of the allocated memory A is
/// allocated by PyTorch, [with P allocated in private pools (…),] and U is reserved by PyTorch
/// but unallocated.` `None` where the text stops matching (cut short, or not yet joined).
fn sentences(cur: &mut Cur, p: &mut Parsed) -> Option<()> {
    p.gpu = gpu_index(cur);
    p.end = cur.i;
    if !(cur.eat("has") && cur.eat("atotal") && (cur.eat("capacityof") || cur.eat("capactyof"))) {
        return None;
    }
    p.capacity = Some(cur.size()?);
    p.end = cur.i;
    if !cur.eat("ofwhich") {
        return None;
    }
    p.free = Some(cur.size()?);
    if !cur.eat("isfree") {
        return None;
    }
    p.end = cur.i;
    cur.eat(".");
    // Process entries and the `allowed` cap, in any order.
    loop {
        let save = cur.i;
        if cur.eat("Includingnon-PyTorchmemory,thisprocesshas") {
            match cur.size() {
                Some(f) if cur.eat("memoryinuse") => p.process_in_use = Some(f),
                _ => {
                    cur.i = save;
                    break;
                }
            }
        } else if cur.eat("Process") {
            let pid = cur.uint();
            match (pid, cur.eat("has"), cur.size()) {
                (Some(pid), true, Some(f)) if cur.eat("memoryinuse") => p.entries.push((pid, f)),
                _ => {
                    cur.i = save;
                    break;
                }
            }
        } else if let Some(f) = cur.size() {
            if cur.eat("allowed") {
                p.allowed = Some(f);
            } else {
                cur.i = save;
                break;
            }
        } else {
            break;
        }
        p.end = cur.i;
        if !(cur.eat(".") || cur.eat(";")) {
            break;
        }
    }
    if !cur.find("Oftheallocatedmemory") {
        return None;
    }
    p.allocated = Some(cur.size()?);
    if !cur.eat("isallocatedbyPyTorch") {
        return None;
    }
    p.end = cur.i;
    cur.eat(",");
    if cur.eat("with") {
        p.private_pools = cur.size();
        if !cur.find(",and") {
            return None;
        }
    } else if !cur.eat("and") {
        return None;
    }
    let unallocated = cur.size()?;
    if !cur.eat("isreservedbyPyTorchbutunallocated") {
        return None;
    }
    p.unallocated = Some(unallocated);
    p.complete = true;
    p.end = cur.i;
    cur.eat(".");
    Some(())
}

/// Could `c` (compact, from the anchor) still become a message once more lines are joined?
fn may_continue(c: &[u8]) -> bool {
    let t = c
        .strip_prefix(b"CUDAoutofmemory")
        .or_else(|| c.strip_prefix(b"HIPoutofmemory"))
        .unwrap_or(c);
    let t = t.strip_prefix(b".").unwrap_or(t);
    const TRIED: &[u8] = b"Triedtoallocate";
    if TRIED.starts_with(t) {
        return true;
    }
    // `Tried to allocate 20.0` + next line `0 MiB (GPU 0; …`.
    t.strip_prefix(TRIED)
        .is_some_and(|r| r.len() < 24 && r.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'.'))
}

fn known(f: &Option<Figure>) -> Option<u64> {
    f.as_ref().and_then(Figure::bytes)
}

/// Builds the message (figures, verdict, advice) from what was parsed.
fn build(line: u64, text: &str, map: &[usize], p: Parsed) -> OomMessage {
    let mut notes = Vec::new();
    let mut note_too_large = |field: &str, f: &Option<Figure>| {
        if let Some(Figure::TooLarge(printed)) = f {
            notes.push(format!(
                "the figure for {field}, `{printed}`, does not fit in 64 bits (16 EiB or more), so it \
                 is treated as not printed; the driver most likely reported an invalid value"
            ));
        }
    };
    note_too_large("capacity", &p.capacity);
    note_too_large("free", &p.free);
    note_too_large("this process's memory in use", &p.process_in_use);
    note_too_large("allocated", &p.allocated);
    note_too_large("reserved", &p.reserved);
    note_too_large("cached", &p.cached);
    note_too_large("unallocated", &p.unallocated);
    note_too_large("allowed", &p.allowed);
    note_too_large("private pools", &p.private_pools);
    let requested_bytes = match &p.requested {
        Figure::Bytes(b) => *b,
        Figure::TooLarge(printed) => {
            notes.push(format!(
                "the requested figure `{printed}` does not fit in 64 bits; shown as the largest \
                 64-bit value"
            ));
            u64::MAX
        }
    };
    if p.more_than_1eb {
        notes.push(
            "PyTorch refused a request of 1 EiB or more (`more than 1EB`); requested_bytes is \
             that lower bound"
                .to_owned(),
        );
    }
    if !p.complete {
        notes.push("the message is cut short; figures after the cut are unknown".to_owned());
    }

    let capacity = known(&p.capacity);
    let free = known(&p.free);
    let process_in_use = known(&p.process_in_use);
    let allocated = known(&p.allocated);
    let reserved = known(&p.reserved);
    let reserved_unallocated = match p.wording {
        Wording::Cached => known(&p.cached),
        Wording::ReservedInTotal => match (reserved, allocated) {
            (Some(r), Some(a)) => r.checked_sub(a),
            _ => None,
        },
        Wording::TotalCapacityOf | Wording::RequestOnly => known(&p.unallocated),
    };
    let entries: Vec<ProcessEntry> = p
        .entries
        .iter()
        .map(|(pid, f)| ProcessEntry {
            pid: *pid,
            bytes: f.bytes(),
        })
        .collect();
    for (pid, f) in &p.entries {
        if let Figure::TooLarge(printed) = f {
            notes.push(format!(
                "the figure `{printed}` of process {pid} does not fit in 64 bits and is ignored"
            ));
        }
    }

    let req = requested_bytes;
    let hip = p.hip;
    let others = match (capacity, free, process_in_use) {
        (Some(c), Some(f), Some(u)) => Some(i128::from(c) - i128::from(f) - i128::from(u)),
        // Without the `this process` line (containers list every process by PID), the
        // `Process N has X memory in use` entries are other processes, except at most one that
        // could be this one: at least what PyTorch reserved, and at most 2 GiB or 5 % of the
        // device more (CUDA context, cuBLAS/NCCL workspaces, non-PyTorch memory).
        (_, _, None) if !entries.is_empty() => {
            let floor = allocated
                .unwrap_or(0)
                .saturating_add(reserved_unallocated.unwrap_or(0))
                .max(reserved.unwrap_or(0));
            let slack = (2u64 << 30).max(capacity.unwrap_or(0) / 20);
            let maybe_self = entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.bytes.map(|b| (i, b)))
                .filter(|(_, b)| floor > 0 && *b >= floor && *b - floor <= slack)
                .min_by_key(|(_, b)| *b - floor)
                .map(|(i, _)| i);
            Some(
                entries
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != maybe_self)
                    .filter_map(|(_, e)| e.bytes)
                    .map(i128::from)
                    .sum(),
            )
        }
        _ => None,
    };
    let verdict = if reserved_unallocated.is_some_and(|u| u >= req) {
        Verdict::Fragmentation
    } else if others.is_some_and(|o| o >= i128::from(req)) {
        Verdict::OtherProcesses
    } else if capacity.is_some() && free.is_some() {
        Verdict::Full
    } else {
        Verdict::Unknown
    };

    let fs = format_size;
    let reason = match verdict {
        Verdict::Fragmentation => format!(
            "{} was reserved by PyTorch but unallocated, at least the {} requested: the cache \
             held enough free memory, but no single free block large enough",
            fs(reserved_unallocated.unwrap_or(0)),
            fs(req)
        ),
        Verdict::OtherProcesses if process_in_use.is_none() => format!(
            "the message lists other processes holding {} (`Process N has X memory in use`), at \
             least the {} requested",
            fs(others.and_then(|o| u64::try_from(o).ok()).unwrap_or(0)),
            fs(req)
        ),
        Verdict::OtherProcesses => format!(
            "capacity {} − free {} − this process {} leaves {} used outside this process, at \
             least the {} requested",
            fs(capacity.unwrap_or(0)),
            fs(free.unwrap_or(0)),
            fs(process_in_use.unwrap_or(0)),
            fs(others.and_then(|o| u64::try_from(o).ok()).unwrap_or(0)),
            fs(req)
        ),
        Verdict::Full => {
            let unalloc = match reserved_unallocated {
                Some(u) => format!("{} reserved but unallocated", fs(u)),
                None => "no figure for reserved-but-unallocated memory".to_owned(),
            };
            let cap = capacity.unwrap_or(0);
            let why = if req > cap {
                format!(
                    "the request alone is larger than the whole device ({})",
                    fs(cap)
                )
            } else {
                "the memory was in use".to_owned()
            };
            format!(
                "{} of {} was free and the cache had {unalloc}, not enough for the {} \
                 requested: {why}",
                fs(free.unwrap_or(0)),
                fs(cap),
                fs(req)
            )
        }
        Verdict::Unknown => format!(
            "the message prints the request ({}) but not the device's capacity and free \
             memory, so the cause cannot be told from the log",
            fs(req)
        ),
    };

    // Notes on figures that change how to read the verdict.
    if let (Some(a), Some(c)) = (allocated, capacity) {
        if a > c {
            notes.push(format!(
                "PyTorch reports {} allocated on a device of {}: the driver is probably spilling \
                 into shared system memory (Windows does this), which is slow; treat the device \
                 as full",
                fs(a),
                fs(c)
            ));
        }
    }
    if let (None, [entry], Some(a), Some(u)) = (
        process_in_use,
        entries.as_slice(),
        allocated,
        reserved_unallocated,
    ) {
        let own = a.saturating_add(u);
        if let Some(b) = entry.bytes.filter(|b| *b >= own && *b - own <= 1 << 30) {
            notes.push(format!(
                "process {} holds {}, close to the {} this process reserved (allocated + \
                 unallocated): it may be this process seen through a container's PID namespace",
                entry.pid,
                fs(b),
                fs(own)
            ));
        }
    }
    if let Some(l) = known(&p.allowed) {
        notes.push(format!(
            "a per-process memory fraction caps this process at {} \
             (torch.cuda.set_per_process_memory_fraction)",
            fs(l)
        ));
    }
    if verdict != Verdict::Fragmentation && free.is_some_and(|f| f >= req) {
        notes.push(format!(
            "the device still had {} free, at least the {} requested: something limits this \
             process below the device (a memory fraction, or a limit imposed by the container \
             or GPU-sharing layer)",
            fs(free.unwrap_or(0)),
            fs(req)
        ));
    }

    let facts = Facts {
        verdict,
        wording: p.wording,
        hint: p.hint,
        gpu: p.gpu,
        req,
        capacity,
        free,
        process_in_use,
        allocated,
        reserved_unallocated,
        others,
        entries: &entries,
        more_than_1eb: p.more_than_1eb,
    };
    let advice = advise(&facts);

    let cut = map.get(p.end).copied().unwrap_or(text.len());
    let text = text
        .get(..cut)
        .unwrap_or(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");

    OomMessage {
        line,
        gpu: p.gpu,
        requested_bytes,
        capacity_bytes: capacity,
        free_bytes: free,
        process_in_use_bytes: process_in_use,
        allocated_bytes: allocated,
        reserved_bytes: reserved,
        reserved_unallocated_bytes: reserved_unallocated,
        verdict,
        reason,
        device_type: if hip { "hip" } else { "cuda" },
        wording: p.wording,
        allowed_bytes: known(&p.allowed),
        private_pools_bytes: known(&p.private_pools),
        process_entries: entries,
        notes,
        advice,
        text,
    }
}

// ---------------------------------------------------------------------------------------------
// Advice

struct Facts<'a> {
    verdict: Verdict,
    wording: Wording,
    hint: HintVar,
    gpu: Option<u32>,
    req: u64,
    capacity: Option<u64>,
    free: Option<u64>,
    process_in_use: Option<u64>,
    allocated: Option<u64>,
    reserved_unallocated: Option<u64>,
    others: Option<i128>,
    entries: &'a [ProcessEntry],
    more_than_1eb: bool,
}

fn advice(action: impl Into<String>, reason: impl Into<String>) -> Advice {
    Advice {
        action: action.into(),
        reason: reason.into(),
    }
}

/// Two to four first actions, each tied to a figure of the message.
fn advise(f: &Facts) -> Vec<Advice> {
    let fs = format_size;
    let gpu = match f.gpu {
        Some(g) => format!("GPU {g}"),
        None => "the GPU".to_owned(),
    };
    let mut out = Vec::new();
    if f.more_than_1eb {
        return vec![
            advice(
                "Print the shapes of the tensors created on the failing line",
                "a request of 1 EiB or more comes from a wrong shape, not from a lack of memory",
            ),
            advice(
                "Check the size arithmetic behind that shape: a negative value turned unsigned, \
                 a product of dimensions that overflowed, an `expand` or `repeat` over the wrong \
                 axis",
                "no GPU has 1 EiB; fixing the shape fixes the error",
            ),
        ];
    }
    match f.verdict {
        Verdict::Fragmentation => {
            let unalloc = fs(f.reserved_unallocated.unwrap_or(0));
            let req = fs(f.req);
            if f.wording == Wording::TotalCapacityOf {
                let var = match f.hint {
                    HintVar::CudaAllocConf => {
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the name this \
                         PyTorch prints; from 2.9 on it is PYTORCH_ALLOC_CONF)"
                    }
                    _ => {
                        "PYTORCH_ALLOC_CONF=expandable_segments:True (before PyTorch 2.9: \
                         PYTORCH_CUDA_ALLOC_CONF)"
                    }
                };
                out.push(advice(
                    format!("Set {var} in the job's environment"),
                    format!(
                        "{unalloc} sat in cached blocks too small for the {req} request; \
                         expandable segments grow in place, so freed memory can be reused for \
                         requests of any size"
                    ),
                ));
                out.push(advice(
                    "Or set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 (lower it if the \
                     error persists)",
                    format!(
                        "blocks above the limit are never split for small requests, so large \
                         free blocks stay whole for requests like this {req} one"
                    ),
                ));
            } else {
                let since = if f.wording == Wording::Cached {
                    "needs PyTorch ≥ 1.10; this message comes from ≈1.0–1.4"
                } else {
                    "PyTorch ≥ 1.10"
                };
                out.push(advice(
                    format!(
                        "Set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 in the job's \
                         environment ({since})"
                    ),
                    format!(
                        "{unalloc} was reserved but unallocated, at least the {req} request; \
                         blocks above the limit are never split for small requests, so large \
                         free blocks stay whole"
                    ),
                ));
                out.push(advice(
                    "Upgrade to PyTorch ≥ 2.1 and set \
                     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    format!(
                        "expandable segments grow in place, so the {unalloc} held in pieces can \
                         serve one {req} request"
                    ),
                ));
            }
            out.push(advice(
                "Keep tensor shapes stable between steps: pad or bucket variable sequence \
                 lengths and image sizes",
                format!(
                    "shapes that change every step leave freed blocks of the wrong size \
                     ({unalloc} here); repeated shapes reuse them exactly"
                ),
            ));
        }
        Verdict::OtherProcesses => {
            let others = u64::try_from(f.others.unwrap_or(0)).unwrap_or(0);
            let named: Vec<String> = f
                .entries
                .iter()
                .map(|e| match e.bytes {
                    Some(b) => format!("PID {} ({})", e.pid, fs(b)),
                    None => format!("PID {}", e.pid),
                })
                .collect();
            let named = if named.is_empty() {
                String::new()
            } else {
                format!("; the message names {}", named.join(", "))
            };
            out.push(advice(
                format!(
                    "Find the other processes on {gpu} (nvidia-smi \
                     --query-compute-apps=pid,used_memory --format=csv) and stop them, or run \
                     this job on a GPU they do not use (CUDA_VISIBLE_DEVICES)"
                ),
                format!(
                    "{} of {gpu}'s {} is used outside this process{named}",
                    fs(others),
                    fs(f.capacity.unwrap_or(0))
                ),
            ));
            let small: Vec<&ProcessEntry> = f
                .entries
                .iter()
                .filter(|e| e.bytes.is_some_and(|b| b <= 1 << 30))
                .collect();
            if small.is_empty() {
                out.push(advice(
                    "Check for leftovers of earlier runs: crashed jobs, DataLoader workers, \
                     other notebook kernels",
                    format!(
                        "they keep their memory until they exit; {} is held outside this process",
                        fs(others)
                    ),
                ));
            } else {
                out.push(advice(
                    "In multi-GPU jobs call torch.cuda.set_device(local_rank) (or give each \
                     rank its own CUDA_VISIBLE_DEVICES) before any CUDA work, and keep CUDA out \
                     of DataLoader workers",
                    format!(
                        "{} process entr{} of at most 1 GiB on {gpu} look like CUDA contexts of \
                         other ranks or workers that touched this device",
                        small.len(),
                        if small.len() == 1 { "y" } else { "ies" }
                    ),
                ));
            }
            if let Some(c) = f.capacity {
                let left = c.saturating_sub(others);
                out.push(advice(
                    format!(
                        "If the GPU has to be shared, size this job for {} (smaller batch or \
                         sequence length)",
                        fs(left)
                    ),
                    format!(
                        "that is what the other processes leave of {}; this process used {}",
                        fs(c),
                        fs(f.process_in_use.unwrap_or(0))
                    ),
                ));
            }
        }
        Verdict::Full | Verdict::Unknown => {
            let req = fs(f.req);
            if f.verdict == Verdict::Unknown && !f.more_than_1eb {
                out.push(advice(
                    "Record a snapshot of the failing run: \
                     torch.cuda.memory._record_memory_history(max_entries=100000) at start, \
                     torch.cuda.memory._dump_snapshot(\"oom.pickle\") when the error is \
                     caught, then `snapscan report oom.pickle`",
                    format!(
                        "the log only says that {req} could not be allocated; the snapshot \
                         shows what held the memory"
                    ),
                ));
            }
            match f.capacity {
                Some(c) if f.req > c => out.push(advice(
                    "Shrink the tensor of the failing line (smaller batch, sequence length or \
                     resolution; process it in chunks) or split the model across GPUs",
                    format!(
                        "the single request of {req} is larger than the whole device ({}); no \
                         allocator setting can help",
                        fs(c)
                    ),
                )),
                _ => {
                    let share = match f.capacity {
                        Some(c) if c > 0 => {
                            format!(", {:.0}% of the device", 100.0 * f.req as f64 / c as f64)
                        }
                        _ => String::new(),
                    };
                    out.push(advice(
                        "Reduce the batch size or sequence length (gradient accumulation keeps \
                         the effective batch)",
                        format!(
                            "activations grow with batch × sequence length; the failed request \
                             alone was {req}{share}"
                        ),
                    ));
                }
            }
            if f.verdict == Verdict::Full {
                let held = match f.allocated {
                    Some(a) => format!("PyTorch held {} in live tensors", fs(a)),
                    None => format!("only {} was free", fs(f.free.unwrap_or(0))),
                };
                out.push(advice(
                    "In training, turn on activation checkpointing (torch.utils.checkpoint, or \
                     model.gradient_checkpointing_enable() in transformers)",
                    format!(
                        "{held}; checkpointing keeps only block inputs and recomputes the rest \
                         in backward"
                    ),
                ));
                out.push(advice(
                    "Use less precision: bf16/fp16 weights or autocast, an 8-bit optimizer \
                     (bitsandbytes), 8- or 4-bit weights for inference",
                    "Adam keeps 8 bytes of state per parameter, an 8-bit optimizer 2; bf16 halves \
                     weights and activations",
                ));
            }
        }
    }
    out.truncate(4);
    out
}

// ---------------------------------------------------------------------------------------------
// Scanning a log

/// A message whose first line was seen, possibly waiting for continuation lines.
struct Pending {
    line: u64,
    /// Start of the first line, before the anchor (at most 256 bytes): a log prefix that
    /// continuation lines may repeat.
    prefix: String,
    /// From the anchor on; continuation lines appended after `\n`.
    text: String,
    continuation: usize,
}

/// Streaming scanner: feed lines, then [`Scanner::finish`].
#[derive(Default)]
pub struct Scanner {
    pending: Option<Pending>,
    messages: Vec<OomMessage>,
    omitted: u64,
    lines: u64,
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Drops from `line` a log prefix it shares with the message's first line: the common start,
/// cut back to just after a delimiter (`]`, `)`, `|`, `>`, `:` before a space, or a space that
/// ends a word), so `[rank0]: `, `worker-1  | `, pytest's `E   ` go. A leading timestamp on
/// both lines (`2025-11-12T11:25:13.4961658Z `, `2024-01-01 12:00:00,123 `) is dropped first,
/// since it differs from line to line.
fn strip_continuation_prefix<'a>(prefix: &str, line: &'a str) -> &'a str {
    let (prefix, line) = match (strip_timestamp(prefix), strip_timestamp(line)) {
        (Some(p), Some(l)) => (p, l),
        _ => (prefix, line),
    };
    let lb = line.as_bytes();
    let common = prefix
        .bytes()
        .zip(lb.iter())
        .take_while(|(a, b)| a == *b)
        .count();
    let mut cut = 0;
    for i in 0..common {
        match lb[i] {
            b']' | b')' | b'|' | b'>' => cut = i + 1,
            b':' if lb.get(i + 1).is_none_or(|b| *b == b' ') => cut = i + 1,
            b' ' | b'\t' if i > 0 && !lb[i - 1].is_ascii_whitespace() => cut = i + 1,
            _ => {}
        }
    }
    if cut > 0 {
        while lb.get(cut).is_some_and(|c| *c == b' ' || *c == b'\t') {
            cut += 1;
        }
    }
    // `cut` follows an ASCII byte, so it is a character boundary.
    line.get(cut..).unwrap_or(line)
}

/// `line` without a leading ISO-like timestamp (`YYYY-MM-DD`, then `T` or a space and a time)
/// and the spaces after it; `None` without one.
fn strip_timestamp(line: &str) -> Option<&str> {
    let b = line.as_bytes();
    let date_ok = b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit);
    if !date_ok {
        return None;
    }
    let mut i = 10;
    if matches!(b.get(i), Some(b'T' | b' ')) && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
        i += 1;
        while b.get(i).is_some_and(|c| {
            c.is_ascii_digit() || matches!(c, b':' | b'.' | b',' | b'+' | b'-' | b'Z')
        }) {
            i += 1;
        }
    }
    while b.get(i).is_some_and(|c| *c == b' ' || *c == b'\t') {
        i += 1;
    }
    // Only ASCII bytes were skipped, so `i` is a character boundary.
    line.get(i..)
}

enum State {
    Done,
    Wait,
    NotOom,
}

fn state(text: &str) -> State {
    let (c, _) = compact(text);
    match parse(&c) {
        Some(p) if p.complete => State::Done,
        Some(_) => State::Wait,
        None if may_continue(&c) => State::Wait,
        None => State::NotOom,
    }
}

impl Scanner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next line (without its line ending).
    pub fn push_line(&mut self, line: &str) {
        self.push_part(self.lines + 1, line);
        self.lines += 1;
    }

    /// Feeds part of the next line: the text before a lone `\r` (progress bars redraw a line
    /// that way). The line number does not move.
    pub fn push_line_part(&mut self, part: &str) {
        self.push_part(self.lines + 1, part);
    }

    fn push_part(&mut self, line: u64, seg: &str) {
        let first_anchor = find_anchor(seg, 0).map(|(k, _)| k);
        if let Some(mut p) = self.pending.take() {
            if first_anchor.is_none() && !seg.trim().is_empty() {
                let cont = strip_continuation_prefix(&p.prefix, seg);
                let room = MAX_MESSAGE_BYTES.saturating_sub(p.text.len() + 1);
                p.text.push('\n');
                p.text.push_str(head(cont, room));
                p.continuation += 1;
                let full =
                    p.continuation >= MAX_CONTINUATION_LINES || p.text.len() >= MAX_MESSAGE_BYTES;
                match state(&p.text) {
                    State::Wait if !full => self.pending = Some(p),
                    State::NotOom => {}
                    _ => self.finalize(p),
                }
                return;
            }
            self.finalize(p);
        }
        let Some(first) = first_anchor else {
            return;
        };
        let prefix = head(&seg[..first], 256).to_owned();
        let mut start = first;
        let mut anchors = Anchors::new(seg);
        loop {
            let next = anchors
                .find(start)
                .and_then(|(k, len)| anchors.find(k + len))
                .map(|(k, _)| k);
            let end = next.unwrap_or(seg.len());
            let p = Pending {
                line,
                prefix: prefix.clone(),
                text: head(&seg[start..end], MAX_MESSAGE_BYTES).to_owned(),
                continuation: 0,
            };
            match next {
                // Another message follows on this line: this one cannot go on.
                Some(n) => {
                    self.finalize(p);
                    start = n;
                }
                None => {
                    match state(&p.text) {
                        State::Done => self.finalize(p),
                        State::Wait => self.pending = Some(p),
                        State::NotOom => {}
                    }
                    return;
                }
            }
        }
    }

    fn finalize(&mut self, p: Pending) {
        let (c, map) = compact(&p.text);
        let Some(parsed) = parse(&c) else {
            return;
        };
        if self.messages.len() >= MAX_MESSAGES {
            self.omitted += 1;
            return;
        }
        self.messages.push(build(p.line, &p.text, &map, parsed));
    }

    /// Ends the log.
    pub fn finish(mut self) -> Explain {
        if let Some(p) = self.pending.take() {
            self.finalize(p);
        }
        Explain {
            schema_version: SCHEMA_VERSION,
            messages: self.messages,
            messages_omitted: self.omitted,
            lines: self.lines,
        }
    }
}

fn push_capped(seg: &mut Vec<u8>, bytes: &[u8]) {
    let room = MAX_SEGMENT_BYTES.saturating_sub(seg.len());
    seg.extend_from_slice(&bytes[..bytes.len().min(room)]);
}

/// Scans a log. Lines end at `\n` (a `\r` before it is dropped); a lone `\r` splits a line into
/// parts that are scanned separately under the same line number. Bytes that are not UTF-8 are
/// replaced. Only I/O errors fail.
pub fn scan<R: BufRead>(mut reader: R) -> io::Result<Explain> {
    let mut scanner = Scanner::new();
    let mut seg: Vec<u8> = Vec::new();
    let mut after_cr = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        let len = buf.len();
        let mut i = 0;
        while i < len {
            if after_cr {
                after_cr = false;
                if buf[i] == b'\n' {
                    scanner.push_line(&String::from_utf8_lossy(&seg));
                    seg.clear();
                    i += 1;
                    continue;
                }
                scanner.push_line_part(&String::from_utf8_lossy(&seg));
                seg.clear();
            }
            match buf[i..].iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(off) => {
                    push_capped(&mut seg, &buf[i..i + off]);
                    if buf[i + off] == b'\n' {
                        scanner.push_line(&String::from_utf8_lossy(&seg));
                        seg.clear();
                    } else {
                        after_cr = true;
                    }
                    i += off + 1;
                }
                None => {
                    push_capped(&mut seg, &buf[i..]);
                    i = len;
                }
            }
        }
        reader.consume(len);
    }
    if after_cr || !seg.is_empty() {
        scanner.push_line(&String::from_utf8_lossy(&seg));
    }
    Ok(scanner.finish())
}

/// Scans a text held in memory.
pub fn scan_str(text: &str) -> Explain {
    match scan(text.as_bytes()) {
        Ok(e) => e,
        // Reading from a byte slice cannot fail.
        Err(_) => Scanner::new().finish(),
    }
}

/// Scans a file, or stdin for `-`.
pub fn scan_path(path: &Path) -> io::Result<Explain> {
    if path.as_os_str() == "-" {
        scan(io::stdin().lock())
    } else {
        scan(BufReader::with_capacity(1 << 16, File::open(path)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(text: &str) -> Option<u64> {
        match parse_figure(text) {
            Some(Figure::Bytes(b)) => Some(b),
            _ => None,
        }
    }

    #[test]
    fn figures_are_exact_and_1024_based() {
        assert_eq!(bytes("20.00 MiB"), Some(20971520));
        assert_eq!(bytes("1.06 GiB"), Some(1138166333));
        assert_eq!(bytes("1024.00 KiB"), Some(1048576));
        assert_eq!(bytes("1003.31 MiB"), Some(1052046787));
        assert_eq!(bytes("0 bytes"), Some(0));
        assert_eq!(bytes("1024 bytes"), Some(1024));
        assert_eq!(bytes("17.20 GiB"), Some(18468359373));
        // Halves away from zero; more than 18 decimals are ignored, not a crash.
        assert_eq!(bytes("0.5 bytes"), Some(1));
        assert_eq!(bytes("2.5 bytes"), Some(3));
        assert_eq!(bytes("0.01 KiB"), Some(10));
        assert_eq!(bytes("1.0000000000000000000000000001 KiB"), Some(1024));
        // Whitespace (a wrapped line) anywhere.
        assert_eq!(bytes("20.0\n0 Mi\nB"), Some(20971520));
        assert_eq!(bytes("5 GB"), None);
        assert_eq!(bytes("5 MB"), None);
        assert_eq!(bytes("GiB"), None);
        assert_eq!(bytes(".5 GiB"), None);
        assert_eq!(bytes("5"), None);
        assert_eq!(bytes("5 GiB extra"), None);
        assert_eq!(bytes(""), None);
    }

    #[test]
    fn figures_beyond_64_bits_do_not_crash() {
        // 2^64 exactly: one more than u64::MAX.
        assert_eq!(
            parse_figure("17179869184.00 GiB"),
            Some(Figure::TooLarge("17179869184.00 GiB".to_owned()))
        );
        // Just below 2^64 still fits.
        assert_eq!(bytes("17179869183.99 GiB"), Some(18446744073698814198));
        assert_eq!(bytes("18446744073709551615 bytes"), Some(u64::MAX));
        assert!(matches!(
            parse_figure("18446744073709551616 bytes"),
            Some(Figure::TooLarge(_))
        ));
        let huge = format!("{} EiB", "9".repeat(200));
        assert!(matches!(parse_figure(&huge), Some(Figure::TooLarge(_))));
        // 18 decimals are kept, the rest ignored: just under 2 EiB.
        let long_fraction = format!("1.{} EiB", "9".repeat(200));
        assert_eq!(bytes(&long_fraction), Some((1 << 61) - 1));
        let long_fraction = format!("16.{} EiB", "0".repeat(200));
        assert!(matches!(
            parse_figure(&long_fraction),
            Some(Figure::TooLarge(_))
        ));
    }

    #[test]
    fn format_size_is_pytorch_like() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1048576), "1024.00 KiB");
        assert_eq!(format_size(20971520), "20.00 MiB");
        assert_eq!(format_size(1138166333), "1.06 GiB");
        assert_eq!(format_size(u64::MAX), "17179869184.00 GiB");
    }

    #[test]
    fn wrapped_message_with_rank_prefix() {
        let log = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.0\n\
                   [rank1]: 0 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.2\n\
                   [rank1]: 0 GiB is free. Including non-PyTorch memory, this process has 77.9\n\
                   [rank1]: 0 GiB memory in use. Of the allocated memory 70.00 GiB is allocated\n\
                   [rank1]: by PyTorch, and 7.00 GiB is reserved by PyTorch but unallocated.\n\
                   [rank1]: next line\n";
        let e = scan_str(log);
        assert_eq!(e.messages.len(), 1);
        let m = &e.messages[0];
        assert_eq!(m.line, 1);
        assert_eq!(m.gpu, Some(1));
        assert_eq!(m.requested_bytes, 2 << 30);
        assert_eq!(bytes("79.15 GiB"), m.capacity_bytes);
        assert_eq!(bytes("1.20 GiB"), m.free_bytes);
        assert_eq!(bytes("77.90 GiB"), m.process_in_use_bytes);
        assert_eq!(m.reserved_unallocated_bytes, Some(7 << 30));
        assert_eq!(m.verdict, Verdict::Fragmentation);
        assert!(m.text.ends_with("unallocated"), "{}", m.text);
        assert_eq!(e.lines, 6);
    }

    #[test]
    fn continuation_prefixes() {
        let strip = strip_continuation_prefix;
        assert_eq!(
            strip("[rank0]: torch.OutOfMemoryError: ", "[rank0]: 0 GiB"),
            "0 GiB"
        );
        assert_eq!(
            strip("worker-1  | RuntimeError: ", "worker-1  | of 8 GiB"),
            "of 8 GiB"
        );
        assert_eq!(
            strip("E       RuntimeError: ", "E       free; 1 GiB"),
            "free; 1 GiB"
        );
        assert_eq!(
            strip(
                "2025-11-12T11:25:13.4961658Z torch.OutOfMemoryError: ",
                "2025-11-12T11:25:13.4971658Z 0 GiB is free"
            ),
            "0 GiB is free"
        );
        assert_eq!(
            strip(
                "2024-01-01 12:00:00,123 ERROR train: ",
                "2024-01-01 12:00:01,456 ERROR train: by PyTorch"
            ),
            "by PyTorch"
        );
        // Nothing shared: the line stays.
        assert_eq!(strip("RuntimeError: ", "Runtime is 3 s"), "Runtime is 3 s");
        assert_eq!(strip("", "[rank0]: x"), "[rank0]: x");
        assert_eq!(strip_timestamp("2024-01-0"), None);
        assert_eq!(strip_timestamp("2024-01-01"), Some(""));
    }

    #[test]
    fn no_break_spaces_and_timestamped_wrap() {
        let e = scan_str("CUDA out of memory. Tried to allocate 20.00\u{a0}MiB (GPU\u{a0}0; 1.00 GiB total capacity; 0 bytes already allocated; 0 bytes free; 0 bytes reserved in total by PyTorch)");
        assert_eq!(e.messages.len(), 1);
        assert_eq!(e.messages[0].requested_bytes, 20 << 20);
        assert_eq!(e.messages[0].capacity_bytes, Some(1 << 30));
        let e = scan_str(
            "2025-11-12T11:25:13.1Z RuntimeError: CUDA out of memory. Tried to allocate 2\n\
             2025-11-12T11:25:13.2Z 0.00 MiB (GPU 0; 1.00 GiB total capacity; 0 bytes already\n\
             2025-11-12T11:25:13.3Z allocated; 0 bytes free; 0 bytes reserved in total by PyTorch)\n",
        );
        assert_eq!(e.messages.len(), 1);
        assert_eq!(e.messages[0].requested_bytes, 20 << 20);
        assert_eq!(e.messages[0].allocated_bytes, Some(0));
        assert_eq!(e.messages[0].verdict, Verdict::Full);
    }

    #[test]
    fn hard_wrap_inside_words_and_crlf() {
        let one = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.93 GiB \
                   total capacity; 2.81 GiB already allocated; 25.38 MiB free; 3.06 GiB reserved \
                   in total by PyTorch)";
        let wrapped: String = one
            .as_bytes()
            .chunks(37)
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("\r\n");
        let a = scan_str(one);
        let b = scan_str(&format!("first\r\n{wrapped}\r\nafter\r\n"));
        assert_eq!(a.messages.len(), 1);
        assert_eq!(b.messages.len(), 1);
        let (ma, mb) = (&a.messages[0], &b.messages[0]);
        assert_eq!(mb.line, 2);
        assert_eq!(
            (
                ma.requested_bytes,
                ma.capacity_bytes,
                ma.free_bytes,
                ma.allocated_bytes
            ),
            (
                mb.requested_bytes,
                mb.capacity_bytes,
                mb.free_bytes,
                mb.allocated_bytes
            )
        );
        assert_eq!(ma.reserved_bytes, mb.reserved_bytes);
        assert_eq!(mb.verdict, Verdict::Fragmentation);
    }

    #[test]
    fn two_messages_on_one_line_and_progress_bar_parts() {
        let msg = "CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of \
                   8.00 GiB of which 0 bytes is free. Of the allocated memory 7.00 GiB is \
                   allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.";
        let e = scan_str(&format!(
            "a\n{msg} x {msg}\nepoch 1: 50%\repoch 1: 99%\r{msg}\n"
        ));
        let lines: Vec<u64> = e.messages.iter().map(|m| m.line).collect();
        assert_eq!(lines, vec![2, 2, 3]);
        assert!(e.messages.iter().all(|m| m.verdict == Verdict::Full));
        assert_eq!(e.lines, 3);
    }

    #[test]
    fn look_alikes_are_not_messages() {
        for text in [
            "RuntimeError: CUDA error: out of memory",
            "I got CUDA out of memory when training",
            "RuntimeError: CUDA out of memory",
            "RuntimeError: CUDA out of memory.\n\nnext",
            "MPS backend out of memory (MPS allocated: 18.02 GB). Tried to allocate 4.50 MB",
            "CUDA out of memory. Tried to allocate lots",
            "CUDA out of memory. Tried to allocate 20.00 MB",
        ] {
            assert!(scan_str(text).messages.is_empty(), "{text}");
        }
    }

    #[test]
    fn request_only_and_more_than_1eb() {
        let e =
            scan_str("RuntimeError: CUDA out of memory. Tried to allocate more than 1EB memory.\n");
        assert_eq!(e.messages.len(), 1);
        assert_eq!(e.messages[0].requested_bytes, 1 << 60);
        assert_eq!(e.messages[0].verdict, Verdict::Unknown);
        let e = scan_str("CUDA out of memory. Tried to allocate 20.00 MiB\n\nTraceback\n");
        assert_eq!(e.messages.len(), 1);
        assert_eq!(e.messages[0].requested_bytes, 20 << 20);
        assert_eq!(e.messages[0].wording, Wording::RequestOnly);
        assert_eq!(e.messages[0].verdict, Verdict::Unknown);
        assert!(!e.messages[0].advice.is_empty());
    }

    #[test]
    fn garbage_never_panics() {
        let mut junk = String::new();
        for i in 0..2000u32 {
            junk.push(char::from_u32(i * 37 % 0x2FFF).unwrap_or('x'));
            if i % 97 == 0 {
                junk.push_str("CUDA out of memory. Tried to allocate 9");
            }
            if i % 89 == 0 {
                junk.push_str(" (GPU ;;) GPU has a total capacty of ");
            }
        }
        let _ = scan_str(&junk);
        let _ = scan(&b"\xff\xfeCUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; \xff)"[..]);
        for cut in 0.."CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 2.00 GiB total capacity; 1.00 GiB already allocated; 0 bytes free; 1.50 GiB reserved in total by PyTorch)".len() {
            let s = &"CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 2.00 GiB total capacity; 1.00 GiB already allocated; 0 bytes free; 1.50 GiB reserved in total by PyTorch)"[..cut];
            let _ = scan_str(s);
        }
    }

    #[test]
    fn very_long_line_is_bounded() {
        let mut log = "x".repeat(MAX_SEGMENT_BYTES + 10);
        log.push_str(" CUDA out of memory. Tried to allocate 1.00 GiB\n");
        log.push_str("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 1.00 GiB is free. Of the allocated memory 5.00 GiB is allocated by PyTorch, and 1.00 GiB is reserved by PyTorch but unallocated.\n");
        let e = scan_str(&log);
        // The message past the kept part of line 1 is not seen; line 2 is.
        assert_eq!(e.messages.len(), 1);
        assert_eq!(e.messages[0].line, 2);
        assert_eq!(e.messages[0].verdict, Verdict::Full);
    }
}
