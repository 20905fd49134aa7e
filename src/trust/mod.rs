//! Extra CA certificates that every outbound HTTPS client of the process trusts beside the
//! platform's roots: remote MCP servers, their authorization servers, approval webhooks, the
//! model upstream, the operator's probes. For private CAs (`--extra-ca-file`; an injected agent
//! gets the operator's bundle in `SPEAR_EXTRA_CA_PEM`).
//!
//! - **Added, never instead.** The platform's roots stay (`SSL_CERT_FILE` would replace them),
//!   so a public server keeps working beside a private one.
//! - **Process-wide**, like the crypto provider: [`configure`] once at start; every client
//!   starts from [`client_builder`].
//! - **A file follows rotation.** It is read again whenever a client is built (a connection, a
//!   probe) and parsed when its bytes change: in a pod it is a ConfigMap volume the kubelet
//!   updates in place. A bad file fails the start, naming it; one that turns bad later keeps the
//!   last good bundle, with a warning, so a broken edit cannot cut the process off its servers.
//!   A file that is not there trusts nothing extra until it is (an optional ConfigMap).
//! - **Injected agents get it inline.** The webhook writes the operator's bundle into the agent
//!   container's environment at admission, so nobody who can write ConfigMaps in a workload's
//!   namespace can add a CA to what its agent trusts.

mod bundle;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

pub use self::bundle::{Bundle, BundleError, MAX_CERTIFICATES, MAX_DER_BYTES};

/// Why the extra CA certificates cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("--extra-ca-file {path} {source}")]
    File { path: String, source: BundleError },
    #[error("--extra-ca-file {path}: cannot read it: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{var} (the operator's trust bundle, written at injection) {source}", var = crate::api::keys::ENV_EXTRA_CA_PEM)]
    Inline { source: BundleError },
    #[error("the extra CA certificates were configured already in this process")]
    Again,
}

/// What the process trusts beside the platform's roots.
#[derive(Debug)]
pub struct Trust {
    file: Option<PathBuf>,
    inline: Bundle,
    current: Mutex<Current>,
}

#[derive(Debug, Default)]
struct Current {
    /// The file's bytes when last read; `None`: not there (or no file).
    seen: Option<Vec<u8>>,
    /// The file's bundle (the last good one) with the inline one.
    bundle: Bundle,
    /// `bundle` as PEM, shared with every injection until it changes; `None` when empty.
    pem: Option<Arc<str>>,
    /// Counts the changes of `bundle`, so that clients built before one are built again.
    generation: u64,
}

impl Trust {
    /// Reads `file` now (a bad one is an error; a missing one trusts nothing extra yet) and
    /// `inline` PEM text.
    pub fn new(file: Option<&Path>, inline: Option<&str>) -> Result<Self, TrustError> {
        let inline = match inline.map(str::trim).filter(|text| !text.is_empty()) {
            Some(text) => Bundle::parse(text.as_bytes()).map_err(|source| TrustError::Inline { source })?,
            None => Bundle::default(),
        };
        let trust = Trust { file: file.map(Path::to_path_buf), inline, current: Mutex::default() };
        let mut current = trust.lock();
        current.bundle = trust.inline.clone();
        if let Some(path) = &trust.file {
            match std::fs::read(path) {
                Ok(bytes) => {
                    let parsed = Bundle::parse(&bytes)
                        .map_err(|source| TrustError::File { path: path.display().to_string(), source })?;
                    current.bundle = parsed.with(&trust.inline);
                    current.seen = Some(bytes);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => tracing::warn!(
                    file = %path.display(),
                    "--extra-ca-file does not exist: no extra CA is trusted until it does"
                ),
                Err(source) => return Err(TrustError::Read { path: path.display().to_string(), source }),
            }
        }
        current.pem = pem_of(&current.bundle);
        drop(current);
        Ok(trust)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Current> {
        self.current.lock()
    }

    /// The bundle now: the file read again if it changed.
    pub fn bundle(&self) -> Bundle {
        let mut current = self.lock();
        self.refresh(&mut current);
        current.bundle.clone()
    }

    /// The number of the bundle now: it changes whenever the bundle does.
    pub fn generation(&self) -> u64 {
        let mut current = self.lock();
        self.refresh(&mut current);
        current.generation
    }

    /// The bundle now as PEM, for the agents the operator injects; `None` when empty.
    pub fn pem(&self) -> Option<Arc<str>> {
        let mut current = self.lock();
        self.refresh(&mut current);
        current.pem.clone()
    }

    fn refresh(&self, current: &mut Current) {
        let Some(path) = &self.file else { return };
        let read = match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "cannot read --extra-ca-file; the last bundle read stays trusted");
                return;
            }
        };
        if read == current.seen {
            return;
        }
        match &read {
            None => {
                tracing::warn!(file = %path.display(), "--extra-ca-file is gone: no extra CA from it is trusted any more");
                current.bundle = self.inline.clone();
            }
            Some(bytes) => match Bundle::parse(bytes) {
                Ok(parsed) => {
                    tracing::info!(
                        file = %path.display(),
                        certificates = parsed.certificates().len(),
                        "--extra-ca-file changed; its CA certificates are trusted from now on"
                    );
                    current.bundle = parsed.with(&self.inline);
                }
                Err(error) => tracing::warn!(
                    file = %path.display(),
                    %error,
                    "--extra-ca-file changed into something unusable; the last good bundle stays trusted"
                ),
            },
        }
        current.seen = read;
        current.pem = pem_of(&current.bundle);
        current.generation += 1;
    }
}

fn pem_of(bundle: &Bundle) -> Option<Arc<str>> {
    (!bundle.is_empty()).then(|| Arc::from(bundle.to_pem()))
}

static TRUST: OnceLock<Trust> = OnceLock::new();

/// Sets what this process trusts beside the platform's roots, once, at start: `file`
/// (`--extra-ca-file`) and `inline` PEM (`SPEAR_EXTRA_CA_PEM`). Returns how many certificates
/// are trusted now.
pub fn configure(file: Option<&Path>, inline: Option<&str>) -> Result<usize, TrustError> {
    if file.is_none() && inline.is_none_or(|text| text.trim().is_empty()) {
        return Ok(0);
    }
    let trust = Trust::new(file, inline)?;
    let count = trust.lock().bundle.certificates().len();
    TRUST.set(trust).map_err(|_| TrustError::Again)?;
    if count > 0 {
        tracing::info!(certificates = count, "trusting extra CA certificates beside the system's roots");
    }
    Ok(count)
}

/// The process's bundle as PEM (what the webhook gives injected agents); `None`: none.
pub fn pem() -> Option<Arc<str>> {
    TRUST.get().and_then(Trust::pem)
}

/// A client builder that trusts the platform's roots and the process's extra CA certificates:
/// where every outbound HTTPS client starts.
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    let Some(trust) = TRUST.get() else { return builder };
    let bundle = trust.bundle();
    if bundle.is_empty() {
        return builder;
    }
    builder.tls_certs_merge(bundle.certificates().iter().filter_map(|der| reqwest::Certificate::from_der(der).ok()))
}

/// A client that is built again when the process's bundle changes, for the clients that live
/// as long as the process (an OAuth client per server, the chat upstream); the others are built
/// per connection from [`client_builder`].
pub(crate) struct TrustingClient {
    /// Everything but the roots: applied to [`client_builder`].
    configure: Box<dyn Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder + Send + Sync>,
    built: Mutex<(u64, Result<reqwest::Client, String>)>,
}

impl std::fmt::Debug for TrustingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustingClient").finish_non_exhaustive()
    }
}

impl TrustingClient {
    pub(crate) fn new(
        configure: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder + Send + Sync + 'static,
    ) -> Self {
        let generation = TRUST.get().map_or(0, Trust::generation);
        let built = build(&configure);
        TrustingClient { configure: Box::new(configure), built: Mutex::new((generation, built)) }
    }

    /// The client for the bundle now (a clone shares the connection pool); an error when the
    /// TLS backend could not start.
    pub(crate) fn get(&self) -> Result<reqwest::Client, String> {
        let generation = TRUST.get().map_or(0, Trust::generation);
        let mut built = self.built.lock();
        if built.0 != generation {
            *built = (generation, build(&self.configure));
        }
        built.1.clone()
    }
}

fn build(configure: &dyn Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder) -> Result<reqwest::Client, String> {
    configure(client_builder()).build().map_err(|e| crate::telemetry::error_chain(&e))
}

#[cfg(test)]
mod tests;
