//! `spear-operator`: thin entry point; everything lives in `spear::cli::operator`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    spear::cli::operator::Args::parse().run()
}
