//! Getting the bytes of a snapshot: memory-mapped files, gzip/zstd detected by magic bytes,
//! stdin (`-`), and recognising inputs that are not snapshots at all.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::pickle::{self, Document, PickleError};
use crate::progress::Loading;

/// Bytes of one input, either mapped from disk or decompressed/read into memory.
pub enum InputBytes {
    /// The file stays open for [`InputBytes::peek`].
    Mapped(memmap2::Mmap, std::fs::File),
    Owned(Vec<u8>),
}

impl InputBytes {
    /// Tells the kernel that `start..end` has been read: mapped pages then leave this process's
    /// resident memory (they stay in the page cache). Readers call it behind them so that a big
    /// file does not count as resident memory; a later read maps the pages again.
    pub fn release(&self, start: usize, end: usize) {
        const PAGE: usize = 4096;
        if let InputBytes::Mapped(m, _) = self {
            let start = start.div_ceil(PAGE) * PAGE;
            let end = end.min(m.len()) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is read-only and backed by a file: dropped pages are read back
                // from the file (unchanged) on the next access, so no data is lost.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
                };
            }
        }
    }

    /// Copies the bytes at `pos` into `buf` (fewer at the end); returns how many. A mapped
    /// file is read with a system call: touching the map for a few bytes maps (and then holds)
    /// every page around them.
    pub fn peek(&self, pos: usize, buf: &mut [u8]) -> usize {
        #[cfg(unix)]
        if let InputBytes::Mapped(m, file) = self {
            use std::os::unix::fs::FileExt;
            let want = buf.len().min(m.len().saturating_sub(pos));
            if let Ok(n) = file.read_at(&mut buf[..want], pos as u64) {
                if n == want {
                    return n;
                }
            }
        }
        peek_slice(self, pos, buf)
    }
}

/// [`InputBytes::peek`] on bytes in memory.
pub fn peek_slice(data: &[u8], pos: usize, buf: &mut [u8]) -> usize {
    let src = data.get(pos..).unwrap_or(&[]);
    let n = src.len().min(buf.len());
    buf[..n].copy_from_slice(&src[..n]);
    n
}

impl std::ops::Deref for InputBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            InputBytes::Mapped(m, _) => m,
            InputBytes::Owned(v) => v,
        }
    }
}

/// How the input was stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// An error while getting or decoding an input, always naming the input.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    // The wrapped errors are part of the message, not `source()`s: `{:#}` would print them
    // twice.
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}: {message}")]
    Format { path: String, message: String },
    #[error("{path}: {error}")]
    Pickle { path: String, error: PickleError },
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const ZIP_MAGIC: &[u8] = b"PK\x03\x04";

/// Display name of an input path (`-` is stdin).
pub fn display_name(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_owned()
    } else {
        path.display().to_string()
    }
}

/// Reads (maps) an input and undoes gzip/zstd compression, detected by magic bytes.
pub fn read_input(path: &Path) -> Result<(InputBytes, Compression), InputError> {
    read_input_with(path, &mut Loading::hidden())
}

/// A reader that reports how many bytes went through it.
struct Counting<'a, R> {
    inner: R,
    count: u64,
    next: u64,
    progress: &'a mut Loading,
    /// Bytes written by the decompressor so far, shown next to the compressed position.
    decoded: Option<&'a std::cell::Cell<u64>>,
}

impl<R: std::io::BufRead> std::io::BufRead for Counting<'_, R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.inner.consume(n);
        self.count += n as u64;
        if self.count >= self.next {
            self.next = self.count + crate::progress::STEP_BYTES as u64;
            self.progress.set(self.count);
        }
    }
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count >= self.next {
            self.next = self.count + crate::progress::STEP_BYTES as u64;
            self.progress.set(self.count);
            if let Some(d) = self.decoded {
                self.progress.detail(&format!(
                    "({} decoded)",
                    crate::units::format_bytes(d.get())
                ));
            }
        }
        Ok(n)
    }
}

/// Decompresses all of `src` with `decoder`, showing the compressed bytes consumed. On a
/// corrupt or cut stream: the error, and what was decompressed before it.
/// Never more than `cap` bytes: past it, `over` is set and the error returned.
fn decompress<'a, D: Read>(
    make: impl FnOnce(Counting<'a, &'a [u8]>) -> Result<D, String>,
    src: &'a [u8],
    progress: &'a mut Loading,
    decoded: &'a std::cell::Cell<u64>,
    cap: u64,
    over: &'a std::cell::Cell<bool>,
) -> Result<Vec<u8>, (String, Vec<u8>)> {
    progress.phase("decompressing", Some(src.len() as u64));
    let counting = Counting {
        inner: src,
        count: 0,
        next: 0,
        progress,
        decoded: Some(decoded),
    };
    let mut decoder = Capped {
        inner: make(counting).map_err(|e| (e, Vec::new()))?,
        left: cap,
        over,
    };
    // Room for the size the stream's header or trailer states, believed up to a ratio real
    // snapshots never reach (a crafted size must not reserve memory): growing by doubling
    // copied the output once more and, for a moment, held it twice.
    let room = stated_size(src)
        .min(src.len().saturating_mul(MAX_BELIEVED_RATIO))
        .min(usize::try_from(cap).unwrap_or(usize::MAX));
    let mut out: Vec<u8> = Vec::with_capacity(room);
    // No transparent huge pages asked for here: where the kernel's memory is fragmented, each
    // fault in an advised range waits for compaction (a 1 GB output took 2-7 s of system time
    // instead of 1 s), and even with free huge pages it was not faster.
    match decode_into_room(&mut decoder, &mut out, decoded) {
        Ok(true) => {
            out.shrink_to_fit();
            return Ok(out);
        }
        Ok(false) => {}
        Err(e) => return Err((e.to_string(), out)),
    }
    const STEP: usize = 1 << 22;
    // The room never grows past the cap (and one byte, to see the stream go on): doubling
    // from just under it would reserve twice the cap.
    let most = usize::try_from(cap).unwrap_or(usize::MAX).saturating_add(1);
    loop {
        if out.capacity() - out.len() < STEP && out.capacity() < most {
            let target = out.capacity().saturating_mul(2).max(STEP).min(most);
            out.reserve_exact(target - out.len());
        }
        let room = (out.capacity() - out.len()).max(1) as u64;
        // Decoded straight into the output's spare room (`read_to_end` neither zeroes it nor
        // goes through a buffer); what a failing read gave is kept.
        let n = match (&mut decoder).take(room).read_to_end(&mut out) {
            Ok(n) => n,
            Err(e) => return Err((e.to_string(), out)),
        };
        if n == 0 {
            out.shrink_to_fit();
            return Ok(out);
        }
        decoded.set(out.len() as u64);
    }
}

/// Decodes into `out`'s spare room (up to its capacity) while another thread zeroes the pieces
/// ahead of the decoder: faulting in a gigabyte of fresh memory costs about a third of
/// decoding it, and this way another core pays for it. True when the stream ended inside the
/// room; `out` holds what was decoded (also on an error). Small rooms are left to the caller.
fn decode_into_room<D: Read>(
    decoder: &mut D,
    out: &mut Vec<u8>,
    decoded: &std::cell::Cell<u64>,
) -> std::io::Result<bool> {
    const PIECE: usize = 8 << 20;
    let start = out.len();
    let spare = out.spare_capacity_mut();
    if spare.len() < 4 * PIECE {
        return Ok(false);
    }
    let mut written = 0usize;
    let (ready, pieces) = std::sync::mpsc::sync_channel::<&mut [u8]>(2);
    let ended = std::thread::scope(|s| {
        s.spawn(move || {
            for piece in spare.chunks_mut(PIECE) {
                piece.fill(std::mem::MaybeUninit::new(0));
                // SAFETY: every byte of the piece was just written.
                let piece =
                    unsafe { &mut *(piece as *mut [std::mem::MaybeUninit<u8>] as *mut [u8]) };
                if ready.send(piece).is_err() {
                    break; // the stream ended: the rest stays untouched
                }
            }
        });
        // Owned here: dropped on return, which stops the zeroing thread before the scope waits.
        let pieces = pieces;
        for piece in pieces.iter() {
            let mut at = 0;
            while at < piece.len() {
                match decoder.read(&mut piece[at..]) {
                    Ok(0) => return Ok(true),
                    Ok(n) => {
                        at += n;
                        written += n;
                        decoded.set((start + written) as u64);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(false)
    });
    // SAFETY: the first `written` bytes of the spare room were zeroed, then decoded into.
    unsafe { out.set_len(start + written) };
    ended
}

/// A zstd input that is one frame stating its size, decompressed in one call straight into
/// the output: the streaming decoder decodes into its window and copies out of it (on
/// notHanmin x280's `.zst`, `SNAPSCAN_TIMING=1`, the load less its chunk stage took 625 ms
/// against 667-710 ms). Meanwhile a second thread has the kernel map the output's pages ahead
/// of the decoder. `None`, with nothing decoded, for
/// anything else; a corrupt frame too, which the streaming path then decodes as far as it
/// goes and words.
fn zstd_at_once(src: &[u8], progress: &mut Loading, cap: u64) -> Option<Vec<u8>> {
    if zstd::zstd_safe::find_frame_compressed_size(src).ok()? != src.len() {
        return None;
    }
    let size = zstd::zstd_safe::get_frame_content_size(src).ok()??;
    let size = usize::try_from(size).ok()?;
    if size == 0 || size > src.len().saturating_mul(MAX_BELIEVED_RATIO) || size as u64 > cap {
        return None;
    }
    let mut decoder = zstd::bulk::Decompressor::new().ok()?;
    // No position to show: a spinner.
    progress.phase("decompressing", None);
    let mut out: Vec<u8> = Vec::with_capacity(size);
    let room = (out.as_mut_ptr() as usize, out.capacity());
    let finished = std::sync::atomic::AtomicBool::new(false);
    let written = std::thread::scope(|s| {
        s.spawn(|| populate_ahead(room, &finished));
        let written = decoder.decompress_to_buffer(src, &mut out);
        finished.store(true, std::sync::atomic::Ordering::Relaxed);
        written
    });
    (written.ok()? == size && out.len() == size).then_some(out)
}

/// Has the kernel map the pages of `(start, len)` for writing, 8 MiB at a time, until `stop`:
/// a fault per 4 KiB page in the decoder costs it more than this costs the other core. Only
/// page tables change (MADV_POPULATE_WRITE neither reads nor writes the bytes), so the decoder
/// writing the same range meanwhile is fine. Kernels without it (before 5.14) skip it.
fn populate_ahead((start, len): (usize, usize), stop: &std::sync::atomic::AtomicBool) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const PIECE: usize = 8 << 20;
        const PAGE: usize = 4096;
        let end = (start + len) / PAGE * PAGE;
        let mut at = start.next_multiple_of(PAGE);
        while at < end && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let n = PIECE.min(end - at);
            // SAFETY: the range lies inside one live allocation (the caller's output, which
            // outlives this thread), and the advice changes no byte of it.
            let r = unsafe { libc::madvise(at as *mut libc::c_void, n, libc::MADV_POPULATE_WRITE) };
            if r != 0 {
                return;
            }
            at += n;
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (start, len, stop);
}

/// The largest decompressed size per compressed byte that [`stated_size`] is believed for.
const MAX_BELIEVED_RATIO: usize = 64;

/// How many bytes a compressed input (or stdin) may decompress to by default, per compressed
/// byte. Real snapshots compress 9-50x (zstd -19 and gzip -9 on every real fixture); a bomb
/// reaches 1000x and more.
pub const DEFAULT_MAX_RATIO: u64 = 200;
/// Whatever the ratio, a compressed input may always decompress to this much: small files
/// compress best, and this much is cheap.
pub const RATIO_FLOOR: u64 = 256 << 20;
/// The absolute default: a quarter of the machine's memory, at most 16 GiB.
const ABSOLUTE_CEILING: u64 = 16 << 30;

/// `--max-decompressed`: 0 while not given.
static MAX_DECOMPRESSED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets the most bytes any input may decompress to (or be read from stdin), replacing both
/// the ratio and the absolute default (`--max-decompressed`). A process-wide setting, as every
/// command loads its inputs through here.
pub fn set_max_decompressed(bytes: u64) {
    MAX_DECOMPRESSED.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// The cap on what `compressed` bytes may decompress to (`None`: stdin, whose size is not
/// known ahead), and how to word it.
#[derive(Clone, Copy, Debug)]
struct Cap {
    bytes: u64,
    /// The compressed size when the ratio decided it.
    ratio_of: Option<u64>,
    user_set: bool,
}

impl Cap {
    fn for_input(compressed: Option<u64>) -> Cap {
        let user = MAX_DECOMPRESSED.load(std::sync::atomic::Ordering::Relaxed);
        if user > 0 {
            return Cap {
                bytes: user,
                ratio_of: None,
                user_set: true,
            };
        }
        let absolute = absolute_default();
        match compressed {
            Some(c) => {
                let by_ratio = c.saturating_mul(DEFAULT_MAX_RATIO).max(RATIO_FLOOR);
                Cap {
                    bytes: by_ratio.min(absolute),
                    ratio_of: (by_ratio < absolute).then_some(c),
                    user_set: false,
                }
            }
            None => Cap {
                bytes: absolute,
                ratio_of: None,
                user_set: false,
            },
        }
    }

    /// The message for an input that went past the cap.
    fn exceeded(&self, what: &str) -> String {
        let size = crate::units::format_bytes(self.bytes);
        let why = match (self.user_set, self.ratio_of) {
            (true, _) => "the cap set by --max-decompressed".to_owned(),
            (false, Some(c)) => format!(
                "the default cap for a compressed input: {DEFAULT_MAX_RATIO}x its {}, at least {}",
                crate::units::format_bytes(c),
                crate::units::format_bytes(RATIO_FLOOR)
            ),
            (false, None) => {
                "the default cap: a quarter of this machine's memory, at most 16 GiB".to_owned()
            }
        };
        format!(
            "{what} more than {size} ({why}); stopped there. If this is a real snapshot, raise \
             the cap with --max-decompressed SIZE (e.g. --max-decompressed 64GiB)"
        )
    }
}

/// A quarter of the physical memory, at most [`ABSOLUTE_CEILING`].
fn absolute_default() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: sysconf only reads system constants.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if pages > 0 && page > 0 {
            return ((pages as u64).saturating_mul(page as u64) / 4).min(ABSOLUTE_CEILING);
        }
    }
    ABSOLUTE_CEILING
}

/// A reader that gives at most `left` bytes and then, if the inner reader has more, fails and
/// sets `over`: the decompressor never writes beyond the cap.
struct Capped<'a, R> {
    inner: R,
    left: u64,
    over: &'a std::cell::Cell<bool>,
}

impl<R: Read> Read for Capped<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.over.set(true);
                    Err(std::io::Error::other("over the decompressed-size cap"))
                }
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The decompressed size a zstd frame header states, or a gzip trailer (its size modulo 2^32,
/// exact below 4 GiB); 0 when there is none.
fn stated_size(src: &[u8]) -> usize {
    if src.starts_with(ZSTD_MAGIC) {
        return match zstd::zstd_safe::get_frame_content_size(src) {
            Ok(Some(n)) => usize::try_from(n).unwrap_or(0),
            _ => 0,
        };
    }
    if src.starts_with(GZIP_MAGIC) && src.len() >= 18 {
        let t = &src[src.len() - 4..];
        return u32::from_le_bytes([t[0], t[1], t[2], t[3]]) as usize;
    }
    0
}

/// [`read_input`] with a progress bar for big inputs.
pub fn read_input_with(
    path: &Path,
    progress: &mut Loading,
) -> Result<(InputBytes, Compression), InputError> {
    read_input_salvage(path, progress, false).map(|(bytes, compression, _)| (bytes, compression))
}

/// [`read_input_with`] that, with `salvage`, keeps what a cut or corrupt gzip/zstd stream
/// decompressed to before it broke instead of failing: the third value then says what happened
/// (`None`: the stream was whole).
pub fn read_input_salvage(
    path: &Path,
    progress: &mut Loading,
    salvage: bool,
) -> Result<(InputBytes, Compression, Option<String>), InputError> {
    let name = display_name(path);
    let io_err = |error| InputError::Io {
        path: name.clone(),
        error,
    };
    let format_err = |message: String| InputError::Format {
        path: name.clone(),
        message,
    };
    let raw = if path.as_os_str() == "-" {
        read_stdin(progress).map_err(|e| match e {
            StdinError::Io(e) => io_err(e),
            StdinError::Refused(m) => format_err(m),
        })?
    } else {
        let file = open_regular(path).map_err(|e| match e {
            OpenError::Io(e) => io_err(e),
            OpenError::NotRegular(m) => format_err(m),
        })?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.len() == 0 {
            InputBytes::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only. A file truncated underneath us by another process
            // (a snapshot still being written) would fault on the lost pages: the SIGBUS
            // handler (`crate::guard`) then ends the process with a message and exit 2.
            match unsafe { memmap2::Mmap::map(&file) } {
                Ok(m) => {
                    crate::guard::note_mapped(&name);
                    // For the test of a file that shrinks while mapped: time to shrink it.
                    if let Some(ms) = std::env::var_os("SNAPSCAN_TEST_PAUSE_AFTER_MAP") {
                        let ms = ms.to_str().and_then(|t| t.parse().ok()).unwrap_or(0);
                        std::thread::sleep(std::time::Duration::from_millis(ms));
                    }
                    InputBytes::Mapped(m, file)
                }
                Err(_) => {
                    let mut buf = Vec::new();
                    (&file)
                        .take(meta.len())
                        .read_to_end(&mut buf)
                        .map_err(io_err)?;
                    InputBytes::Owned(buf)
                }
            }
        }
    };
    progress.note_size(raw.len() as u64);
    Ok(match decompress_bytes(&name, &raw, progress, salvage)? {
        None => (raw, Compression::None, None),
        Some(d) => (InputBytes::Owned(d.bytes), d.compression, d.note),
    })
}

/// What [`decompress_bytes`] made of a gzip or zstd input.
#[derive(Debug)]
pub struct Decompressed {
    pub bytes: Vec<u8>,
    pub compression: Compression,
    /// With `salvage`, for a stream cut short or corrupt: what was wrong and what was kept.
    pub note: Option<String>,
}

/// Undoes the gzip or zstd compression of an input's bytes (`raw`, named `name` in messages),
/// detected by magic bytes, as [`read_input_salvage`] does for a file: the same cap on the
/// decompressed size, gzip members one after another, zstd frames and skippable frames.
/// `None` when `raw` is not compressed.
pub fn decompress_bytes(
    name: &str,
    raw: &[u8],
    progress: &mut Loading,
    salvage: bool,
) -> Result<Option<Decompressed>, InputError> {
    let format_err = |message: String| InputError::Format {
        path: name.to_owned(),
        message,
    };
    let decoded = std::cell::Cell::new(0u64);
    let compression = if raw.starts_with(GZIP_MAGIC) {
        Compression::Gzip
    } else if raw.starts_with(ZSTD_MAGIC) || is_zstd_skippable(raw) {
        Compression::Zstd
    } else {
        return Ok(None);
    };
    let what = match compression {
        Compression::Gzip => "gzip",
        _ => "zstd",
    };
    let cap = Cap::for_input(Some(raw.len() as u64));
    let over = std::cell::Cell::new(false);
    // Bytes after the last gzip member that start no other member (tar padding, a log line):
    // ignored, as `gzip -d` ignores them, and said.
    let trailing = std::cell::Cell::new(0u64);
    let result = match compression {
        Compression::Gzip => decompress(
            |r| Ok(GzMembers::new(r, &trailing)),
            raw,
            progress,
            &decoded,
            cap.bytes,
            &over,
        ),
        _ => match zstd_at_once(raw, progress, cap.bytes) {
            Some(out) => Ok(out),
            None => decompress(
                |r| zstd::stream::read::Decoder::new(r).map_err(|e| e.to_string()),
                raw,
                progress,
                &decoded,
                cap.bytes,
                &over,
            ),
        },
    };
    if over.get() {
        return Err(format_err(
            cap.exceeded(&format!("the {what} data decompresses to")),
        ));
    }
    let (out, note) = match result {
        Ok(out) => (out, None),
        // A zstd decoder keeps its last window (up to megabytes) until the frame ends, so
        // a cut frame is closed after its last complete block and decoded again.
        Err((e, partial)) if salvage && compression == Compression::Zstd => {
            let closed = zstd_complete_blocks(raw).and_then(|frame| {
                let cell = std::cell::Cell::new(0u64);
                let mut hidden = Loading::hidden();
                let over = std::cell::Cell::new(false);
                decompress(
                    |r| zstd::stream::read::Decoder::new(r).map_err(|e| e.to_string()),
                    &frame,
                    &mut hidden,
                    &cell,
                    cap.bytes,
                    &over,
                )
                .ok()
            });
            match closed {
                Some(out) if out.len() > partial.len() => {
                    let note = format!(
                        "the zstd stream breaks off ({e}): decompressed the {} bytes of its \
                         complete blocks",
                        out.len()
                    );
                    (out, Some(note))
                }
                _ if !partial.is_empty() => {
                    let note = format!(
                        "the zstd stream breaks off ({e}): decompressed the {} bytes that \
                         arrived",
                        partial.len()
                    );
                    (partial, Some(note))
                }
                _ => return Err(format_err(format!("zstd data is corrupt: {e}"))),
            }
        }
        Err((e, partial)) if salvage && !partial.is_empty() => {
            let note = format!(
                "the {what} stream breaks off ({e}): decompressed the {} bytes that arrived",
                partial.len()
            );
            (partial, Some(note))
        }
        Err((e, _)) => {
            return Err(format_err(if salvage {
                format!("{what} data is corrupt: {e}")
            } else {
                // A cut download or a job killed while writing: say what recovers it.
                format!("{what} data is corrupt: {e}; if the file was cut short, try --salvage")
            }));
        }
    };
    if trailing.get() > 0 {
        eprintln!(
            "snapscan: warning: {}: {} bytes after the end of the gzip data were ignored (as gzip -d ignores them)",
            crate::render::safe::term(name),
            trailing.get()
        );
    }
    // The phases after this one work on the decompressed bytes.
    progress.note_size(out.len() as u64);
    Ok(Some(Decompressed {
        bytes: out,
        compression,
        note,
    }))
}

enum OpenError {
    Io(std::io::Error),
    NotRegular(String),
}

/// Opens a snapshot file for reading, refusing anything but a regular file: a FIFO (one in a
/// tar artifact named `rank0.pickle`, say) would block `open` forever, a device such as
/// `/dev/zero` never ends. Opened without blocking, then looked at.
fn open_regular(path: &Path) -> Result<std::fs::File, OpenError> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(OpenError::Io)?;
    let meta = file.metadata().map_err(OpenError::Io)?;
    if meta.is_file() {
        return Ok(file);
    }
    Err(OpenError::NotRegular(format!(
        "is {}, not a regular file: snapscan reads snapshot files (or stdin, given as -)",
        file_kind(&meta)
    )))
}

/// "a directory", "a FIFO (named pipe)", … for a message.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    if meta.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

enum StdinError {
    Io(std::io::Error),
    Refused(String),
}

/// Reads stdin whole, within the absolute cap (see [`Cap`]). Its first bytes must look like a
/// snapshot (pickle, JSON, gzip or zstd): `report - < /dev/zero` is refused at once instead of
/// read until the cap.
fn read_stdin(progress: &mut Loading) -> Result<InputBytes, StdinError> {
    let cap = Cap::for_input(None);
    progress.phase("reading", None);
    let mut reader = Counting {
        inner: std::io::stdin().lock(),
        count: 0,
        next: 0,
        progress: &mut *progress,
        decoded: None,
    };
    let mut buf = Vec::new();
    (&mut reader)
        .take(64 << 10)
        .read_to_end(&mut buf)
        .map_err(StdinError::Io)?;
    if !buf.is_empty() && !could_be_snapshot(&buf) {
        return Err(StdinError::Refused(format!(
            "not a memory snapshot: expected a pickle (first byte 0x80), JSON, gzip or zstd, \
             found first byte 0x{:02x}",
            buf[0]
        )));
    }
    let limit = cap.bytes.saturating_add(1);
    (&mut reader)
        .take(limit.saturating_sub(buf.len() as u64))
        .read_to_end(&mut buf)
        .map_err(StdinError::Io)?;
    if buf.len() as u64 > cap.bytes {
        return Err(StdinError::Refused(cap.exceeded("stdin holds")));
    }
    Ok(InputBytes::Owned(buf))
}

/// Whether the first bytes of an input could start a snapshot in any form this reads.
fn could_be_snapshot(head: &[u8]) -> bool {
    let first_text = head.iter().copied().find(|b| !b.is_ascii_whitespace());
    head.starts_with(GZIP_MAGIC)
        || head.starts_with(ZSTD_MAGIC)
        || is_zstd_skippable(head)
        || matches!(
            head[0],
            pickle::opcodes::PROTO
                | pickle::opcodes::EMPTY_DICT
                | pickle::opcodes::EMPTY_LIST
                | pickle::opcodes::MARK
        )
        || matches!(first_text, Some(b'{' | b'['))
        // Only whitespace so far: the rest decides.
        || first_text.is_none()
}

/// A zstd skippable frame (magic 0x184D2A50-5F) at the start: `zstd -d` skips it, and so does
/// the zstd decoder.
fn is_zstd_skippable(src: &[u8]) -> bool {
    src.len() >= 8 && src[0] & 0xf0 == 0x50 && src[1..4] == [0x2a, 0x4d, 0x18]
}

/// gzip members one after another, as `gzip -d` reads them. Bytes after a member that do not
/// start another one end the stream; how many there were goes to `trailing`.
struct GzMembers<'a, R: std::io::BufRead> {
    member: Option<flate2::bufread::GzDecoder<R>>,
    trailing: &'a std::cell::Cell<u64>,
}

impl<'a, R: std::io::BufRead> GzMembers<'a, R> {
    fn new(inner: R, trailing: &'a std::cell::Cell<u64>) -> Self {
        GzMembers {
            member: Some(flate2::bufread::GzDecoder::new(inner)),
            trailing,
        }
    }
}

impl<R: std::io::BufRead> Read for GzMembers<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(member) = self.member.as_mut() else {
                return Ok(0);
            };
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut rest = self.member.take().expect("a member").into_inner();
            let mut left = 0u64;
            loop {
                let avail = rest.fill_buf()?;
                if avail.is_empty() {
                    break;
                }
                if left == 0 && avail.starts_with(GZIP_MAGIC) {
                    self.member = Some(flate2::bufread::GzDecoder::new(rest));
                    break;
                }
                left += avail.len() as u64;
                let len = avail.len();
                rest.consume(len);
            }
            if self.member.is_none() {
                self.trailing.set(left);
                return Ok(0);
            }
        }
    }
}

/// The first zstd frame of `src` cut after its last complete block, that block marked as the
/// last one and the checksum flag cleared, so that a decoder gives out everything up to it:
/// what a cut `.zst` holds. `None` when no block is complete.
fn zstd_complete_blocks(src: &[u8]) -> Option<Vec<u8>> {
    let descriptor = *src.get(4)?;
    let single_segment = descriptor & 0x20 != 0;
    let dict_id_bytes = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let content_size_bytes = match descriptor >> 6 {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let mut pos = 5 + usize::from(!single_segment) + dict_id_bytes + content_size_bytes;
    let mut last_complete = None;
    while let Some(h) = src.get(pos..pos + 3) {
        let header = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
        let size = (header >> 3) as usize;
        let content = match (header >> 1) & 3 {
            0 | 2 => size,
            1 => 1,
            _ => return None,
        };
        let end = pos + 3 + content;
        if end > src.len() {
            break;
        }
        last_complete = Some((pos, end));
        if header & 1 != 0 {
            break;
        }
        pos = end;
    }
    let (header_at, end) = last_complete?;
    let mut frame = src[..end].to_vec();
    frame[4] &= !0x04;
    frame[header_at] |= 1;
    Some(frame)
}

/// Decodes the bytes of an input as a pickle or as JSON, with a clear message for inputs that
/// are neither (empty files, `torch.save` zip archives, text).
pub fn decode_document(name: &str, data: &[u8]) -> Result<Document, InputError> {
    decode_document_with(name, data, &mut Loading::hidden())
}

/// [`decode_document`] with a progress bar for big inputs.
pub fn decode_document_with(
    name: &str,
    data: &[u8],
    progress: &mut Loading,
) -> Result<Document, InputError> {
    progress.phase("parsing", Some(data.len() as u64));
    let mut parse = |data: &[u8]| {
        pickle::parse_with_progress(data, crate::progress::STEP_BYTES, &mut |pos| {
            progress.set(pos)
        })
    };
    let format_err = |message: &str| InputError::Format {
        path: name.to_owned(),
        message: message.to_owned(),
    };
    if data.is_empty() {
        return Err(format_err(
            "the file is empty (expected a pickle written by torch.cuda.memory._dump_snapshot)",
        ));
    }
    if data.starts_with(ZIP_MAGIC) {
        return Err(format_err(
            "this is a zip archive (as torch.save writes), not a memory snapshot from torch.cuda.memory._dump_snapshot",
        ));
    }
    let first = data
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    let result = if data[0] == pickle::opcodes::PROTO {
        parse(data)
    } else if first == b'{' || first == b'[' {
        pickle::parse_json(data)
    } else if data[0] == pickle::opcodes::EMPTY_DICT
        || data[0] == pickle::opcodes::EMPTY_LIST
        || data[0] == pickle::opcodes::MARK
    {
        // Protocol 0/1 pickles have no PROTO header.
        parse(data)
    } else {
        return Err(format_err(&format!(
            "not a memory snapshot: expected a pickle (first byte 0x80) or JSON, found first byte 0x{:02x}",
            data[0]
        )));
    };
    result.map_err(|error| InputError::Pickle {
        path: name.to_owned(),
        error,
    })
}

/// Whether an argument is a glob pattern (`*`, `?`, `[…]`) rather than a file name. A file that
/// exists under that exact name is taken as it is.
fn is_glob(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s.contains(['*', '?', '[']) && !path.exists()
}

/// Expands a glob pattern (for arguments the shell did not expand, e.g. quoted ones) into the
/// matching paths, sorted; an error when nothing matches.
fn expand_glob(pattern: &Path) -> Result<Vec<PathBuf>, InputError> {
    let text = pattern.to_string_lossy();
    let err = |message: String| InputError::Format {
        path: text.to_string(),
        message,
    };
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: true,
        require_literal_leading_dot: true,
    };
    let mut out = Vec::new();
    for entry in
        glob::glob_with(&text, options).map_err(|e| err(format!("invalid pattern: {e}")))?
    {
        out.push(entry.map_err(|e| InputError::Io {
            path: e.path().display().to_string(),
            error: std::io::Error::new(e.error().kind(), e.error().to_string()),
        })?);
    }
    if out.is_empty() {
        return Err(err("no file matches this pattern".into()));
    }
    out.sort();
    Ok(out)
}

/// Expands glob patterns and directories into the snapshot files inside them (sorted), keeps
/// files as they are.
pub fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut globbed = Vec::with_capacity(paths.len());
    for p in paths {
        if is_glob(p) {
            globbed.extend(expand_glob(p)?);
        } else {
            globbed.push(p.clone());
        }
    }
    let mut out = Vec::new();
    for p in &globbed {
        if p.is_dir() {
            let entries = std::fs::read_dir(p).map_err(|error| InputError::Io {
                path: display_name(p),
                error,
            })?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && looks_like_snapshot_name(f))
                .collect();
            files.sort();
            // An empty folder is most often a missing artifact: never a silent success.
            if files.is_empty() {
                return Err(InputError::Format {
                    path: display_name(p),
                    message: "no snapshot in this directory (looked for *.pickle, *.pkl and \
                              *.json, also .gz or .zst compressed)"
                        .into(),
                });
            }
            out.extend(files);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn looks_like_snapshot_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    [
        ".pickle",
        ".pkl",
        ".pickle.gz",
        ".pickle.zst",
        ".pkl.gz",
        ".pkl.zst",
        ".json",
    ]
    .iter()
    .any(|ext| name.ends_with(ext))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40 MiB that compress well: more than the room below which the plain loop decodes.
    fn big_input() -> Vec<u8> {
        (0..40u32 << 20)
            .map(|i| ((i / 7) ^ (i >> 13)) as u8)
            .collect()
    }

    fn zstd_of(src: &[u8]) -> Result<Vec<u8>, (String, Vec<u8>)> {
        decompress(
            |r| zstd::stream::read::Decoder::new(r).map_err(|e| e.to_string()),
            src,
            &mut Loading::hidden(),
            &std::cell::Cell::new(0),
            u64::MAX,
            &std::cell::Cell::new(false),
        )
    }

    /// Streams big enough for the zeroing thread decode to the same bytes; a cut one keeps what
    /// came before the cut, and nothing the zeroing thread wrote beyond it.
    #[test]
    fn big_streams_decode_whole_and_cut_ones_keep_what_came_before() {
        let plain = big_input();
        let zst = zstd::bulk::compress(&plain, 1).unwrap();
        assert!(stated_size(&zst) == plain.len());
        assert!(zstd_of(&zst).unwrap() == plain);
        let (error, kept) = zstd_of(&zst[..zst.len() / 2]).unwrap_err();
        assert!(!error.is_empty());
        assert!(
            !kept.is_empty() && kept.len() < plain.len(),
            "{}",
            kept.len()
        );
        assert!(plain.starts_with(&kept));

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &plain).unwrap();
        let gz = gz.finish().unwrap();
        let trailing = std::cell::Cell::new(0);
        let back = decompress(
            |r| Ok(GzMembers::new(r, &trailing)),
            &gz,
            &mut Loading::hidden(),
            &std::cell::Cell::new(0),
            u64::MAX,
            &std::cell::Cell::new(false),
        )
        .unwrap();
        assert!(back == plain);
    }

    /// One frame that states its size decodes in one call, to the same bytes; two frames, a
    /// corrupt frame or a cut one are left to the streaming path (`None`), which decodes the
    /// two frames whole and words what is wrong with the others.
    #[test]
    fn a_sized_zstd_frame_decodes_in_one_call_and_anything_else_streams() {
        let plain = big_input();
        let zst = zstd::bulk::compress(&plain, 1).unwrap();
        let once = zstd_at_once(&zst, &mut Loading::hidden(), u64::MAX);
        assert!(once.as_ref() == Some(&plain), "one call");

        let mut two = zstd::bulk::compress(&plain[..1000], 1).unwrap();
        two.extend(zstd::bulk::compress(&plain[1000..], 1).unwrap());
        assert!(zstd_at_once(&two, &mut Loading::hidden(), u64::MAX).is_none());
        assert!(zstd_of(&two).unwrap() == plain);

        let mut corrupt = zst.clone();
        let mid = corrupt.len() / 2;
        corrupt[mid..mid + 64].fill(0xa5);
        assert!(zstd_at_once(&corrupt, &mut Loading::hidden(), u64::MAX).is_none());
        assert!(zstd_of(&corrupt).is_err());

        assert!(zstd_at_once(&zst[..zst.len() - 10], &mut Loading::hidden(), u64::MAX).is_none());
    }
}
