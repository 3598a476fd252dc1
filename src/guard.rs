//! The last line of defence against hostile input: whatever the budgets miss, the process ends
//! with a message and exit 2, never with an abort (134) or a bus error (135).
//!
//! * [`Guarded`], the binary's global allocator: the system allocator, except that a failed
//!   allocation (the machine's memory or `ulimit -v` exhausted) ends the process with a
//!   message instead of Rust's abort.
//! * A SIGBUS handler: a mapped input that shrinks while it is read (a snapshot still being
//!   written, a file replaced) faults on the lost pages; the handler names the mapped files.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;

/// The system allocator, with a failed allocation ending the process cleanly.
pub struct Guarded;

// SAFETY: every call is forwarded to `System` unchanged; only a null result is acted on.
unsafe impl GlobalAlloc for Guarded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if p.is_null() {
            out_of_memory(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            out_of_memory(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if p.is_null() {
            out_of_memory(new_size);
        }
        p
    }
}

/// Writes `parts` to stderr without allocating (this runs where allocation failed, or in a
/// signal handler).
fn write_stderr(parts: &[&[u8]]) {
    #[cfg(unix)]
    for part in parts {
        // SAFETY: write(2) on fd 2 with a valid buffer; async-signal-safe.
        unsafe {
            libc::write(2, part.as_ptr().cast(), part.len());
        }
    }
    #[cfg(not(unix))]
    {
        use std::io::Write;
        let mut err = std::io::stderr();
        for part in parts {
            let _ = err.write_all(part);
        }
    }
}

/// `n` in decimal, into `buf`, without allocating.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

fn exit_2() -> ! {
    #[cfg(unix)]
    // SAFETY: _exit ends the process at once; nothing of ours needs to run after this.
    unsafe {
        libc::_exit(2)
    }
    #[cfg(not(unix))]
    std::process::exit(2)
}

#[cold]
fn out_of_memory(size: usize) -> ! {
    let mut buf = [0u8; 20];
    write_stderr(&[
        b"snapscan: error: out of memory: an allocation of ",
        decimal(size, &mut buf),
        b" bytes failed. The input needs more memory than this process may take (the \
machine's memory or its ulimit -v); a compressed input is capped by --max-decompressed\n",
    ]);
    exit_2()
}

/// Names of the files mapped so far, for the SIGBUS message.
static MAPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records that `name` is read through a memory map (its bytes can vanish under us).
pub fn note_mapped(name: &str) {
    if let Ok(mut names) = MAPPED.lock() {
        names.push(crate::render::safe::term(name).into_owned());
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn on_sigbus(_: libc::c_int) {
    write_stderr(&[b"snapscan: error: "]);
    // try_lock: a handler must not wait; without the names the message still holds.
    if let Ok(names) = MAPPED.try_lock() {
        for (i, n) in names.iter().enumerate() {
            if i > 0 {
                write_stderr(&[b", "]);
            }
            write_stderr(&[n.as_bytes()]);
        }
        if !names.is_empty() {
            write_stderr(&[b": "]);
        }
    }
    write_stderr(&[
        b"the file changed while being read (it shrank: a snapshot still \
being written, or replaced); read it again once it is complete\n",
    ]);
    exit_2()
}

/// Installs the SIGBUS handler (the allocator needs no installing).
pub fn install() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a plain handler that only writes to stderr and calls _exit.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn decimal_without_allocating() {
        let mut buf = [0u8; 20];
        assert_eq!(super::decimal(0, &mut buf), b"0");
        assert_eq!(super::decimal(1_048_576, &mut buf), b"1048576");
        assert_eq!(
            super::decimal(usize::MAX, &mut buf),
            usize::MAX.to_string().as_bytes()
        );
    }
}
