//! Command-line interfaces of the two binaries. Thin: parse flags, read files, call the library.

pub mod operator;
pub mod run;
pub mod serve;
pub mod spearlet;
pub mod tools;

use std::process::ExitCode;

/// Exit code of a run that found invalid input (`spearlet validate`, `convert`).
pub const EXIT_INVALID: u8 = 1;
/// Exit code of a usage error (bad flags, missing paths), as clap uses.
pub const EXIT_USAGE: u8 = 2;

/// Prints a usage error to stderr and returns [`EXIT_USAGE`].
fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// Resolves on SIGINT or SIGTERM (the one shutdown source, STYLE.md rule 4).
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = interrupt => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = interrupt.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
