//! The two binaries' command lines, kept thin: clap `Args` → a plain config → a library `run`.
//! Each subcommand lives in its own file and returns `anyhow::Result<ExitCode>`; [`exit`] is the
//! one place that prints an error and maps it to an exit status:
//!
//! - `Ok(code)`: the subcommand chose its status (0, or 1 for invalid input it has reported);
//! - an error marked [`UsageError`] (bad flags, paths, ports, configuration): 2, as clap uses;
//! - any other error: 1.
//!
//! The subcommands, one file each:
//!
//! - [`spearlet`]: `serve` and `run` (the agent, over `agent_args.rs`, the flags of its doors),
//!   `bridge`, `install` (the init container's copy), `tools`, `registry`, `explain`, `validate`,
//!   `convert`; `tests.rs` parses the webhook's injected containers with these flags.
//! - [`operator`]: `run` (controllers, webhook, admin server) and `crds`.
//!
//! `src/bin/spearlet.rs` and `src/bin/spear-operator.rs` only parse [`spearlet::Args`] and
//! [`operator::Args`] and call their `run`.

pub mod operator;
pub mod spearlet;

use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

/// Exit status of a run that found invalid input (`spearlet validate`, `convert`).
pub(crate) const EXIT_INVALID: u8 = 1;
/// Exit status of a usage error (bad flags, missing paths), as clap uses.
pub(crate) const EXIT_USAGE: u8 = 2;

/// Marks an error the user fixes by changing how the command is called: exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub String);

/// `text` safe to print on a terminal: control characters other than newline and tab (ESC and
/// the rest of C0, DEL, C1) and bidirectional overrides are shown as `\u{..}` escapes. Tool
/// names, descriptions and outputs come from MCP servers, which must not be able to rewrite
/// the user's screen, hide text or fake a prompt.
pub(crate) fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

// === output ===
// Everything the commands print goes through these three: text for a person is made
// [`terminal_safe`] (it carries names and values from manifests, servers and pods), and only
// documents a serializer wrote (JSON, YAML: control characters escaped) are printed as they are.

/// Prints `text` for a person on stdout, as is but for escape sequences.
#[allow(clippy::disallowed_macros, reason = "the one way the commands print for a person")]
pub(crate) fn say(text: &str) {
    print!("{}", terminal_safe(text));
}

/// Prints one line for a person on stderr (warnings, progress, errors), as [`say`] does.
#[allow(clippy::disallowed_macros, reason = "the one way the commands print for a person")]
pub(crate) fn tell(line: std::fmt::Arguments<'_>) {
    eprintln!("{}", terminal_safe(&line.to_string()));
}

/// Prints a document a serializer wrote (JSON, YAML) on stdout, byte for byte.
#[allow(clippy::disallowed_macros, reason = "serialized documents escape control characters")]
pub(crate) fn emit(document: &str) {
    print!("{document}");
}

/// `--extra-ca-file`, for every command of both binaries that makes outbound HTTPS requests.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct TrustArgs {
    /// CA certificates (PEM) trusted beside the system's roots for outbound HTTPS: private CAs
    /// of remote MCP servers, their authorization servers, approval webhooks, the model
    /// upstream. Read again when it changes (a ConfigMap volume rotates in place).
    #[arg(long, global = true, env = crate::api::keys::ENV_EXTRA_CA_FILE, value_name = "FILE")]
    extra_ca_file: Option<std::path::PathBuf>,
    /// The operator's bundle, written into injected agents (PEM); not a flag.
    #[arg(long, hide = true, global = true, env = crate::api::keys::ENV_EXTRA_CA_PEM, value_name = "PEM")]
    extra_ca_pem: Option<String>,
}

impl TrustArgs {
    /// Sets the process's extra roots ([`crate::trust::configure`]); a bad bundle is a usage error.
    pub(crate) fn configure(&self) -> anyhow::Result<()> {
        crate::trust::configure(self.extra_ca_file.as_deref(), self.extra_ca_pem.as_deref()).map_err(usage)?;
        Ok(())
    }
}

/// A usage error with `message`.
pub(crate) fn usage(message: impl std::fmt::Display) -> anyhow::Error {
    UsageError(message.to_string()).into()
}

/// Prints a failed subcommand's error (`error: ...` with its causes) and maps every outcome to
/// the process's exit status.
pub fn exit(outcome: anyhow::Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(error) => {
            tell(format_args!("error: {error:#}"));
            if error.is::<UsageError>() { ExitCode::from(EXIT_USAGE) } else { ExitCode::FAILURE }
        }
    }
}

/// Runs `work` on a Tokio runtime with `worker_threads` threads (1: the current thread only)
/// until it finishes; its token is cancelled on SIGINT or SIGTERM, and the work decides how to
/// stop. The signal handlers are installed before `work` starts, so a SIGTERM during startup is
/// not lost (a container's PID 1 ignores it by default).
pub(crate) fn run_until_signal<F, Fut, T>(worker_threads: usize, work: F) -> anyhow::Result<T>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    runtime(worker_threads)?.block_on(async {
        let cancel = CancellationToken::new();
        let signal = cancel.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            signal.cancel();
        });
        // Let the signal task run once so that its handlers are installed.
        tokio::task::yield_now().await;
        work(cancel).await
    })
}

/// Runs a short command's `work` on the current thread. No signal handling: SIGINT stops the
/// process as usual.
pub(crate) fn block_on<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    runtime(1)?.block_on(work)
}

fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let runtime = if worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(worker_threads).enable_all().build()
    };
    runtime.map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"))
}

/// Resolves on SIGINT or SIGTERM: the one shutdown source of every long-running command.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
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

#[cfg(test)]
mod terminal_tests {
    use super::terminal_safe;

    /// A server's tool name or output cannot drive the user's terminal.
    #[test]
    fn escape_sequences_and_bidi_overrides_are_shown_not_obeyed() {
        let hostile = "read_file\u{1b}]0;pwned\u{7}\u{1b}[2J\rok\u{202e}txt.exe\u{9b}";
        let safe = terminal_safe(hostile);
        assert!(!safe.chars().any(|c| c.is_control() || c == '\u{202e}'), "{safe:?}");
        assert_eq!(safe, "read_file\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\\u{d}ok\\u{202e}txt.exe\\u{9b}");
        assert_eq!(terminal_safe("two\nlines\tand a tab"), "two\nlines\tand a tab");
    }
}
