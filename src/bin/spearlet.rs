//! `spearlet`: thin entry point; everything lives in `spear::cli::spearlet`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    spear::cli::spearlet::Args::parse().run()
}
