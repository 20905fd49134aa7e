//! Client-certificate authentication of the API server at the webhook
//! (`--webhook-client-ca-file`, `--webhook-client-names`).
//!
//! ```text
//! <ca-file> (PEM bundle) ──parse──▶ WebPkiClientVerifier ──swap──▶ ClientVerifier ◀── TLS handshake
//!     ▲ re-read every poll_interval; changed and valid? swap        │ chain ok? (webpki: validity,
//!     └── a Secret/ConfigMap volume (symlink swap on update)        │  clientAuth EKU, signature)
//!                                                                   │ names set? CN or DNS SAN ∈ names
//!                                                                   ▼
//!                                                   handshake completes ─▶ HTTP ─▶ rate limit ─▶ review
//!                                                   refused ─▶ alert, connection closed: no HTTP at all
//! ```
//!
//! Refused at the handshake, not in the handler: a caller without an acceptable certificate never
//! gets an HTTP exchange, so nothing it sends is parsed. Mandatory once configured, with no
//! "optional" mode. Why, and the rest (names narrow a shared CA, no CA hints, rotation without a
//! restart, no revocation lists): `src/operator/README.md`, "Client authentication".

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};

/// Default pause between two reads of the CA file.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

// === config ===

/// Client-certificate authentication of the webhook's callers (`--webhook-client-ca-file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAuth {
    /// PEM bundle of the CA certificates a caller's certificate must chain to.
    pub ca_file: PathBuf,
    /// Accepted subject common names / DNS SANs; empty accepts any certificate the CA issued.
    pub names: Vec<String>,
    /// Pause between two reads of `ca_file`.
    pub poll_interval: Duration,
}

impl ClientAuth {
    /// Trust the CAs in `ca_file`, accept the given names (none: any), re-read every
    /// [`DEFAULT_POLL_INTERVAL`].
    pub fn new(ca_file: impl Into<PathBuf>, names: Vec<String>) -> Self {
        ClientAuth { ca_file: ca_file.into(), names, poll_interval: DEFAULT_POLL_INTERVAL }
    }
}

// === errors ===

/// Why client authentication could not be set up.
#[derive(Debug, Error)]
pub enum ClientAuthError {
    /// The CA file could not be read.
    #[error(
        "reading --webhook-client-ca-file {path} failed (is the client CA's ConfigMap or Secret mounted there? the chart mounts webhook.clientAuth's at /client-ca)"
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The CA file holds no usable CA certificate.
    #[error(
        "--webhook-client-ca-file {path}: {message}; it must hold the PEM certificate(s) of the CA that issued the API server's webhook client certificate"
    )]
    Bundle { path: PathBuf, message: String },
}

// === pure: bundle, names ===

/// A verifier requiring a client certificate chaining to one of the CAs in `pem`; the message
/// says what is wrong with the bundle (it names no key material: a bundle holds none).
pub(crate) fn verifier_for(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for (index, der) in CertificateDer::pem_slice_iter(pem).enumerate() {
        let der = der.map_err(|e| format!("PEM block {} does not parse: {e}", index + 1))?;
        roots.add(der).map_err(|e| format!("certificate {} is not a usable CA certificate: {e}", index + 1))?;
    }
    if roots.is_empty() {
        return Err("no CERTIFICATE block".to_string());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().map_err(|e| e.to_string())
}

/// The names a client certificate claims: its subject common name(s) and DNS subject
/// alternative names, lower-cased. An unparsable certificate claims none.
pub(crate) fn presented_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
    let mut names: Vec<String> =
        cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_ascii_lowercase).collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                names.push(dns.to_ascii_lowercase());
            }
        }
    }
    names
}

/// Whether a certificate presenting `presented` names is accepted under `allowed` (empty:
/// every certificate the CA issued). Exact, ASCII case-insensitive matches only.
pub(crate) fn name_allowed(presented: &[String], allowed: &[String]) -> bool {
    allowed.is_empty() || presented.iter().any(|p| allowed.iter().any(|a| a.eq_ignore_ascii_case(p)))
}

// === the verifier ===

/// The webhook's [`ClientCertVerifier`]: the current CA bundle's webpki verifier (swapped when
/// the file changes), then the name check.
pub struct ClientVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
    names: Vec<String>,
}

impl fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientVerifier").field("names", &self.names).finish_non_exhaustive()
    }
}

impl ClientVerifier {
    fn new(inner: Arc<dyn ClientCertVerifier>, names: Vec<String>) -> Self {
        ClientVerifier { current: RwLock::new(inner), names }
    }

    fn inner(&self) -> Arc<dyn ClientCertVerifier> {
        self.current.read().clone()
    }

    fn set(&self, inner: Arc<dyn ClientCertVerifier>) {
        *self.current.write() = inner;
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Empty on purpose: see the module header.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner().verify_client_cert(end_entity, intermediates, now)?;
        if !name_allowed(&presented_names(end_entity), &self.names) {
            return Err(rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure));
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner().supported_verify_schemes()
    }
}

// === I/O ===

async fn read(config: &ClientAuth) -> Result<Vec<u8>, ClientAuthError> {
    tokio::fs::read(&config.ca_file)
        .await
        .map_err(|source| ClientAuthError::Read { path: config.ca_file.clone(), source })
}

fn load(config: &ClientAuth, pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, ClientAuthError> {
    verifier_for(pem).map_err(|message| ClientAuthError::Bundle { path: config.ca_file.clone(), message })
}

/// Loads the CA bundle (an error when it cannot be read or holds no CA: the operator must not
/// start believing it authenticates its callers when it cannot), then keeps it current in a
/// background task until `shutdown`.
pub async fn start(
    config: ClientAuth,
    shutdown: CancellationToken,
) -> Result<(Arc<ClientVerifier>, JoinHandle<()>), ClientAuthError> {
    let pem = read(&config).await?;
    let verifier = Arc::new(ClientVerifier::new(load(&config, &pem)?, config.names.clone()));
    info!(ca_file = %config.ca_file.display(), names = ?config.names, "the webhook requires a client certificate");
    let span = info_span!("webhook_client_ca", ca_file = %config.ca_file.display());
    let task = tokio::spawn(keep_current(config, verifier.clone(), pem, shutdown).instrument(span));
    Ok((verifier, task))
}

async fn keep_current(config: ClientAuth, verifier: Arc<ClientVerifier>, last: Vec<u8>, shutdown: CancellationToken) {
    let read = || read(&config);
    let apply = |current: &Vec<u8>| load(&config, current).map(|inner| verifier.set(inner));
    super::certs::poll_changes("client CA bundle", config.poll_interval, last, read, apply, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(rcgen::DnType::CommonName, "client-ca");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().expect("a key");
        let pem = params.self_signed(&key).expect("a CA").pem();
        (rcgen::Issuer::new(params, key), pem)
    }

    fn client(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, cn: &str, sans: &[&str]) -> CertificateDer<'static> {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(sans).expect("leaf params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().expect("a key");
        params.signed_by(&key, issuer).expect("a leaf").der().clone()
    }

    #[test]
    fn names_match_exactly_and_case_insensitively() {
        let allowed = vec!["kube-apiserver-webhook-client".to_string()];
        assert!(name_allowed(&["kube-apiserver-webhook-client".into()], &allowed));
        assert!(name_allowed(&["Kube-APIServer-Webhook-Client".to_ascii_lowercase()], &allowed));
        assert!(!name_allowed(&["kube-apiserver-webhook-client.evil".into()], &allowed));
        assert!(!name_allowed(&["system:node:worker-1".into()], &allowed));
        assert!(!name_allowed(&[], &allowed), "a certificate without names is refused when names are set");
        assert!(name_allowed(&[], &[]), "no names configured: the CA alone decides");
    }

    #[test]
    fn presented_names_are_the_common_name_and_dns_sans() {
        let (issuer, _) = ca();
        let der = client(&issuer, "API-Server", &["apiserver.example", "127.0.0.1"]);
        assert_eq!(presented_names(&der), ["api-server", "apiserver.example"]);
        assert!(presented_names(b"not a certificate").is_empty());
    }

    #[test]
    fn a_bundle_without_a_ca_is_refused_with_the_reason() {
        assert!(verifier_for(b"").expect_err("empty").contains("no CERTIFICATE block"));
        let garbage = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(verifier_for(garbage).is_err());
    }

    #[test]
    fn the_verifier_requires_the_ca_and_the_name() {
        crate::install_crypto_provider();
        let (issuer, pem) = ca();
        let (other, _) = ca();
        let inner = verifier_for(pem.as_bytes()).expect("a CA bundle loads");
        let verifier = ClientVerifier::new(inner, vec!["apiserver".into()]);
        assert!(verifier.client_auth_mandatory() && verifier.root_hint_subjects().is_empty());
        let now = UnixTime::now();
        verifier.verify_client_cert(&client(&issuer, "apiserver", &[]), &[], now).expect("the right CA and name");
        let wrong_name = verifier.verify_client_cert(&client(&issuer, "system:node:n1", &[]), &[], now);
        assert!(matches!(
            wrong_name,
            Err(rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure))
        ));
        assert!(verifier.verify_client_cert(&client(&other, "apiserver", &[]), &[], now).is_err(), "another CA");

        // A rotated bundle (new CA added) is trusted once swapped in.
        let (next, next_pem) = ca();
        assert!(verifier.verify_client_cert(&client(&next, "apiserver", &[]), &[], now).is_err());
        verifier.set(verifier_for(format!("{pem}{next_pem}").as_bytes()).expect("a two-CA bundle loads"));
        verifier.verify_client_cert(&client(&next, "apiserver", &[]), &[], now).expect("the new CA");
        verifier.verify_client_cert(&client(&issuer, "apiserver", &[]), &[], now).expect("the old CA still");
    }
}
