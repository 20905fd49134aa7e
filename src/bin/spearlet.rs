//! `spearlet`: thin entry point; everything lives in `spear::cli::spearlet` (which also answers
//! as the kubectl plugin when invoked as `kubectl-spear`).

use std::process::ExitCode;

fn main() -> ExitCode {
    spear::cli::spearlet::main()
}
