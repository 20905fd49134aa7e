//! Logging setup shared by both binaries: tracing to stderr, plain or JSON.
//!
//! stderr only: an MCP stdio stream (the bridge's stdout) must never carry a log line.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

/// Default filter when neither `--log-level` nor `SPEAR_LOG` is set.
pub const DEFAULT_LOG_FILTER: &str = "spear=info,warn";

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Logging flags shared by every subcommand.
#[derive(Args, Clone, Debug)]
pub struct LogArgs {
    /// Log filter in `tracing` EnvFilter syntax (for example `spear=debug,warn`).
    #[arg(long, global = true, env = "SPEAR_LOG", default_value = DEFAULT_LOG_FILTER)]
    pub log_level: String,

    /// Log line format.
    #[arg(long, global = true, env = "SPEAR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

impl LogArgs {
    /// Installs the global subscriber. An invalid filter is an error naming the flag.
    pub fn init(&self) -> anyhow::Result<()> {
        let filter = EnvFilter::try_new(&self.log_level)
            .map_err(|e| anyhow::anyhow!("--log-level '{}' is not a valid filter: {e}", self.log_level))?;
        // Colors only for a terminal: escape codes in a log file or a collector are noise.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
        let result = match self.log_format {
            LogFormat::Plain => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
        result.map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
    }
}
