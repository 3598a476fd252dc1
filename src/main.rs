use std::process::ExitCode;

/// A failed allocation ends the process with a message and exit 2, not an abort.
#[global_allocator]
static ALLOCATOR: snapscan::guard::Guarded = snapscan::guard::Guarded;

fn main() -> ExitCode {
    snapscan::cli::main()
}
