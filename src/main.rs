use std::process::ExitCode;

fn main() -> ExitCode {
    snapscan::cli::main()
}
