//! The webhook's serving certificate: the operator's own CA and leaf (self-signed mode), or
//! files written by cert-manager (files mode), hot-reloaded into the TLS server.
//!
//! ```text
//! self-signed:  Secret spear-operator-webhook-tls ──parse──▶ renewal(now, ca, leaf, names) (pure)
//!                 ▲ create / replace (resourceVersion)          │ Keep │ Leaf │ Ca
//!                 └────────── issue (rcgen) ◀───────────────────┘
//!               MutatingWebhookConfiguration.webhooks[*].clientConfig.caBundle ◀── ca.crt
//!               CertResolver ◀── tls.crt + tls.key           (every recheck, and at renewal time)
//! files:        <dir>/tls.crt + <dir>/tls.key ──poll, changed?──▶ CertResolver
//! ```
//!
//! One Secret for all replicas, written with its `resourceVersion`; a new CA reaches the
//! `caBundle` before the Secret, so the API server trusts it before any replica serves a leaf it
//! signed. Why, lifetimes, the issuer check and files mode: `src/operator/README.md`,
//! "Certificates".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::api::keys::FIELD_MANAGER;
use crate::api::keys::{WEBHOOK_CERT_SECRET, WEBHOOK_CONFIGURATION};
use crate::operator::rbac;

/// Secret key of the CA bundle (current CA first); also what the `caBundle` is set to.
pub const SECRET_CA_CERT: &str = "ca.crt";
/// Secret key of the current CA's private key.
pub(crate) const SECRET_CA_KEY: &str = "ca.key";
/// Secret key (and file name in files mode) of the serving certificate.
pub const SECRET_TLS_CERT: &str = "tls.crt";
/// Secret key (and file name in files mode) of the serving key.
pub const SECRET_TLS_KEY: &str = "tls.key";
/// Prefix of the CA's common name; the creation time follows the `@`.
pub(crate) const CA_NAME_PREFIX: &str = "spear-operator-webhook-ca@";

const DAY: u64 = 24 * 60 * 60;
/// Default CA lifetime: one year.
pub(crate) const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(365 * DAY);
/// Default serving-certificate lifetime: 90 days.
pub(crate) const DEFAULT_LEAF_VALIDITY: Duration = Duration::from_secs(90 * DAY);
/// Default pause between two reads of the Secret and the `caBundle`: a minute keeps a reset
/// `caBundle` (or another replica's renewal) from lasting long, for one GET each.
pub(crate) const DEFAULT_RECHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Default pause between two reads of the files in files mode.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);
/// Certificates start five minutes in the past, so a node whose clock is a little behind
/// still accepts a certificate issued a moment ago.
const BACKDATE_SECONDS: i64 = 5 * 60;
/// Attempts of a read-decide-write cycle that lost a race to another replica.
const CONFLICT_RETRIES: usize = 5;
/// Attempts to get the first certificate before `start` gives up (1 + 2 + 4 + 8 + 16 s of
/// backoff): long enough for an API server that is restarting, short enough that a missing
/// permission shows up as a crash loop rather than a silent hang.
const START_ATTEMPTS: u32 = 6;

// === config ===

/// Where the webhook's serving certificate comes from (`--cert-mode`).
#[derive(Clone, Debug)]
pub enum CertSource {
    /// The operator's own CA and leaf, kept in a Secret and rotated (`--cert-mode self-signed`).
    SelfSigned(SelfSigned),
    /// `tls.crt` and `tls.key` in a directory, for example a cert-manager Secret volume
    /// (`--cert-mode files`).
    Files(Files),
}

/// Self-signed mode: what to issue and where to keep it.
#[derive(Clone, Debug)]
pub struct SelfSigned {
    /// The operator's namespace, where the Secret lives.
    pub(crate) namespace: String,
    /// The webhook Service's name; the certificate is for `<service>.<namespace>.svc`.
    pub(crate) service: String,
    /// Name of the Secret holding the CA and the leaf.
    pub secret_name: String,
    /// The MutatingWebhookConfiguration whose `caBundle` is kept current; `None` leaves every
    /// configuration alone.
    pub webhook_config_name: Option<String>,
    /// More subject alternative names (DNS names or IP addresses), for example `127.0.0.1`.
    pub extra_sans: Vec<String>,
    /// Lifetime of a new CA.
    pub(crate) ca_validity: Duration,
    /// Lifetime of a new serving certificate.
    pub(crate) leaf_validity: Duration,
    /// Pause between two checks of the Secret and the `caBundle`.
    pub recheck_interval: Duration,
}

impl SelfSigned {
    /// The defaults: Secret [`WEBHOOK_CERT_SECRET`], configuration [`WEBHOOK_CONFIGURATION`],
    /// a 1-year CA and a 90-day leaf.
    pub fn new(namespace: impl Into<String>, service: impl Into<String>) -> Self {
        SelfSigned {
            namespace: namespace.into(),
            service: service.into(),
            secret_name: WEBHOOK_CERT_SECRET.to_string(),
            webhook_config_name: Some(WEBHOOK_CONFIGURATION.to_string()),
            extra_sans: Vec::new(),
            ca_validity: DEFAULT_CA_VALIDITY,
            leaf_validity: DEFAULT_LEAF_VALIDITY,
            recheck_interval: DEFAULT_RECHECK_INTERVAL,
        }
    }

    /// Every subject alternative name of the leaf: the Service's DNS names, then the extras.
    pub(crate) fn sans(&self) -> Vec<String> {
        let mut sans = service_dns_names(&self.service, &self.namespace);
        for extra in &self.extra_sans {
            if !sans.contains(extra) {
                sans.push(extra.clone());
            }
        }
        sans
    }
}

/// Files mode: a directory holding `tls.crt` and `tls.key`.
#[derive(Clone, Debug)]
pub struct Files {
    /// The directory (`--cert-dir`).
    pub dir: PathBuf,
    /// Pause between two reads of the files.
    pub poll_interval: Duration,
}

impl Files {
    /// Files in `dir`, read every [`DEFAULT_POLL_INTERVAL`].
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        Files { dir: dir.into(), poll_interval: DEFAULT_POLL_INTERVAL }
    }
}

// === errors ===

/// Why a certificate could not be issued, stored, read or loaded.
#[derive(Debug, Error)]
pub enum CertError {
    /// rcgen refused to build a key or certificate.
    #[error("generating the webhook's {what} failed")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    /// A PEM block or certificate does not parse.
    #[error("{what} is not a valid PEM certificate or key: {message}")]
    Parse {
        /// Where it came from.
        what: String,
        message: String,
    },
    /// rustls refused the key or the key does not match the certificate.
    #[error("{what}: the certificate and key cannot serve TLS (does tls.key belong to tls.crt?)")]
    Load {
        /// Where they came from.
        what: String,
        #[source]
        source: rustls::Error,
    },
    /// A file of files mode could not be read.
    #[error("reading {path} failed (is --cert-dir mounted from the certificate's Secret?)")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An API call failed.
    #[error(
        "{action} failed; the operator needs get/create/update on Secret {namespace}/{name} and get/update on its MutatingWebhookConfiguration (see the chart's RBAC)"
    )]
    Kube {
        /// What was attempted.
        action: &'static str,
        /// Namespace of the object ("" for cluster-scoped).
        namespace: String,
        name: String,
        /// The cause (boxed: it is large, and this error travels through every result here).
        #[source]
        source: Box<kube::Error>,
    },
    /// Other writers kept changing the object between this replica's read and write.
    #[error("{what} changed under every one of {CONFLICT_RETRIES} attempts to update it")]
    Conflicts { what: String },
    /// The MutatingWebhookConfiguration to keep current does not exist.
    #[error(
        "MutatingWebhookConfiguration {name} does not exist, so its caBundle cannot be set: install the chart (it creates it) or fix --webhook-config-name"
    )]
    ConfigurationMissing { name: String },
    /// Shutdown came before the first certificate.
    #[error("stopped before the first certificate was loaded")]
    Cancelled,
}

fn kube_error(action: &'static str, namespace: &str, name: &str) -> impl FnOnce(kube::Error) -> CertError {
    move |source| CertError::Kube {
        action,
        namespace: namespace.to_string(),
        name: name.to_string(),
        source: Box::new(source),
    }
}

fn is_status(error: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(error, kube::Error::Api(status) if check(status))
}

// === pure: names, inspection, renewal ===

/// The DNS names the API server uses for a webhook Service: `<service>.<namespace>.svc` (what
/// it dials) and the fully qualified `<service>.<namespace>.svc.cluster.local`.
pub(crate) fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")]
}

/// One name as certificates compare it: an IP address in its canonical text, a DNS name in
/// lower case.
fn normalize_name(name: &str) -> String {
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_ascii_lowercase(),
    }
}

/// The names a leaf must carry, normalized.
pub(crate) fn wanted_names(sans: &[String]) -> BTreeSet<String> {
    sans.iter().map(|s| normalize_name(s)).collect()
}

/// What rotation needs to know about one certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// Start of validity, unix seconds.
    pub(crate) not_before: i64,
    /// End of validity, unix seconds.
    pub(crate) not_after: i64,
    /// Subject alternative names (DNS names, IP addresses as text), normalized.
    pub(crate) names: BTreeSet<String>,
    /// Whether it is a CA (basic constraints).
    pub(crate) is_ca: bool,
    /// DER of the subject name.
    pub(crate) subject: Vec<u8>,
    /// DER of the issuer name.
    pub(crate) issuer: Vec<u8>,
}

impl CertInfo {
    /// Reads one DER certificate.
    pub(crate) fn parse_der(der: &[u8], what: &str) -> Result<Self, CertError> {
        let parse_error = |message: String| CertError::Parse { what: what.to_string(), message };
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| parse_error(e.to_string()))?;
        let mut names = BTreeSet::new();
        let san = cert.subject_alternative_name().map_err(|e| parse_error(e.to_string()))?;
        for name in san.iter().flat_map(|ext| &ext.value.general_names) {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    names.insert(normalize_name(dns));
                }
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        names.insert(ip.to_string());
                    }
                }
                _ => {}
            }
        }
        Ok(CertInfo {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            names,
            is_ca: cert.is_ca(),
            subject: cert.subject().as_raw().to_vec(),
            issuer: cert.issuer().as_raw().to_vec(),
        })
    }

    /// When it should be replaced: at 2/3 of its lifetime.
    pub(crate) fn renew_at(&self) -> i64 {
        self.not_before + (self.not_after - self.not_before) * 2 / 3
    }

    /// Whether `ca` issued it (by name; CA names are unique per CA, see the module header).
    pub(crate) fn issued_by(&self, ca: &CertInfo) -> bool {
        self.issuer == ca.subject
    }
}

/// Why a certificate is replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RenewReason {
    /// It is missing or does not parse (or, for the CA, its key is missing).
    Missing,
    /// The CA certificate is not a CA.
    NotACa,
    /// It reached 2/3 of its lifetime.
    Expiring,
    /// The leaf was issued by another CA than the current one.
    OtherIssuer,
    /// The leaf's names differ from the ones wanted (the Service or namespace changed).
    NamesChanged,
}

impl RenewReason {
    /// A short, stable label for logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RenewReason::Missing => "missing",
            RenewReason::NotACa => "not_a_ca",
            RenewReason::Expiring => "expiring",
            RenewReason::OtherIssuer => "other_issuer",
            RenewReason::NamesChanged => "names_changed",
        }
    }
}

/// What to do with the stored certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Keep both; look again at `next` (unix seconds) at the latest.
    Keep {
        /// When the first of the two is due for renewal.
        next: i64,
    },
    /// Issue a new leaf with the current CA.
    Leaf(RenewReason),
    /// Issue a new CA (the old one stays in the bundle) and a new leaf.
    Ca(RenewReason),
}

/// Decides on renewal at `now` (unix seconds). `ca` is `None` when the CA or its key is missing
/// or unreadable; `wanted` comes from [`wanted_names`].
pub(crate) fn renewal(now: i64, ca: Option<&CertInfo>, leaf: Option<&CertInfo>, wanted: &BTreeSet<String>) -> Renewal {
    let Some(ca) = ca else { return Renewal::Ca(RenewReason::Missing) };
    if !ca.is_ca {
        return Renewal::Ca(RenewReason::NotACa);
    }
    if now >= ca.renew_at() {
        return Renewal::Ca(RenewReason::Expiring);
    }
    let Some(leaf) = leaf else { return Renewal::Leaf(RenewReason::Missing) };
    if !leaf.issued_by(ca) {
        return Renewal::Leaf(RenewReason::OtherIssuer);
    }
    if &leaf.names != wanted {
        return Renewal::Leaf(RenewReason::NamesChanged);
    }
    if now >= leaf.renew_at() {
        return Renewal::Leaf(RenewReason::Expiring);
    }
    Renewal::Keep { next: leaf.renew_at().min(ca.renew_at()) }
}

/// Unix seconds now (0 for a clock before 1970, which no certificate decision can use anyway).
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)).unwrap_or(0)
}

fn seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

// === material ===

/// The PEMs of self-signed mode, as stored in the Secret. Empty strings are missing entries.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Material {
    /// The CA bundle: the current CA, then earlier CAs that have not expired.
    pub ca_bundle: String,
    ca_key: String,
    /// The serving certificate.
    pub cert: String,
    key: String,
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are secrets: never in a log line or a panic message.
        f.debug_struct("Material").field("ca_bundle", &self.ca_bundle).field("cert", &self.cert).finish_non_exhaustive()
    }
}

/// A PEM stream's certificates, each with its DER.
fn pem_certs(pem: &str, what: &str) -> Result<Vec<(CertificateDer<'static>, CertInfo)>, CertError> {
    let mut certs = Vec::new();
    for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = der.map_err(|e| CertError::Parse { what: what.to_string(), message: e.to_string() })?;
        let info = CertInfo::parse_der(&der, what)?;
        certs.push((der, info));
    }
    Ok(certs)
}

impl Material {
    /// Reads the Secret's entries (missing ones become empty).
    pub(crate) fn from_secret(secret: &Secret) -> Self {
        let get = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .unwrap_or_default()
        };
        Material {
            ca_bundle: get(SECRET_CA_CERT),
            ca_key: get(SECRET_CA_KEY),
            cert: get(SECRET_TLS_CERT),
            key: get(SECRET_TLS_KEY),
        }
    }

    /// The Secret's `data`.
    fn secret_data(&self) -> BTreeMap<String, ByteString> {
        [
            (SECRET_CA_CERT, &self.ca_bundle),
            (SECRET_CA_KEY, &self.ca_key),
            (SECRET_TLS_CERT, &self.cert),
            (SECRET_TLS_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.clone().into_bytes())))
        .collect()
    }

    /// The current CA (first of the bundle) with its DER, if it and its key are readable.
    fn current_ca(&self) -> Option<(CertificateDer<'static>, CertInfo)> {
        KeyPair::from_pem(&self.ca_key).ok()?;
        pem_certs(&self.ca_bundle, SECRET_CA_CERT).ok()?.into_iter().next()
    }

    /// The leaf, if readable.
    fn leaf(&self) -> Option<CertInfo> {
        pem_certs(&self.cert, SECRET_TLS_CERT).ok()?.into_iter().next().map(|(_, info)| info)
    }

    /// What [`renewal`] says about this material.
    pub(crate) fn renewal(&self, now: i64, wanted: &BTreeSet<String>) -> Renewal {
        let ca = self.current_ca().map(|(_, info)| info);
        renewal(now, ca.as_ref(), self.leaf().as_ref(), wanted)
    }

    /// The leaf and its key, ready for rustls.
    pub(crate) fn certified_key(&self) -> Result<Arc<CertifiedKey>, CertError> {
        certified_key(self.cert.as_bytes(), self.key.as_bytes(), "Secret tls.crt/tls.key")
    }

    /// New material per `renewal` (which must not be `Keep`), keeping what it does not replace.
    fn issue(&self, now: i64, renewal: Renewal, sans: &[String], config: &SelfSigned) -> Result<Material, CertError> {
        let mut next = self.clone();
        if let Renewal::Ca(_) = renewal {
            let (ca_pem, ca_key) = new_ca(now, config.ca_validity)?;
            // Earlier CAs stay trusted until they expire: other replicas may serve their leaves.
            let mut bundle = ca_pem;
            if let Ok(old) = pem_certs(&self.ca_bundle, SECRET_CA_CERT) {
                for (der, info) in old.into_iter().filter(|(_, info)| info.not_after > now) {
                    bundle.push_str(&pem_encode(&der));
                    debug!(not_after = info.not_after, "keeping an earlier CA in the bundle");
                }
            }
            next.ca_bundle = bundle;
            next.ca_key = ca_key;
        } else if let Ok(certs) = pem_certs(&self.ca_bundle, SECRET_CA_CERT) {
            // Drop expired earlier CAs whenever the Secret is written anyway.
            let (current, rest) = certs.split_first().map(|(c, r)| (Some(c), r)).unwrap_or((None, &[]));
            let mut bundle = current.map(|(der, _)| pem_encode(der)).unwrap_or_default();
            for (der, _) in rest.iter().filter(|(_, info)| info.not_after > now) {
                bundle.push_str(&pem_encode(der));
            }
            next.ca_bundle = bundle;
        }
        let (ca_der, ca_info) = next.current_ca().ok_or_else(|| CertError::Parse {
            what: SECRET_CA_CERT.to_string(),
            message: "the CA just issued or read does not load with its key".to_string(),
        })?;
        let ca_key =
            KeyPair::from_pem(&next.ca_key).map_err(|source| CertError::Generate { what: "CA key", source })?;
        let issuer = Issuer::from_ca_cert_der(&ca_der, ca_key)
            .map_err(|source| CertError::Generate { what: "CA issuer", source })?;
        let not_after = (now + seconds(config.leaf_validity)).min(ca_info.not_after);
        let (cert, key) = new_leaf(now, not_after, sans, &issuer)?;
        next.cert = cert;
        next.key = key;
        Ok(next)
    }
}

fn pem_encode(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let body = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in body.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(chunk));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn offset(unix: i64) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map_err(|e| CertError::Parse { what: "a validity date".to_string(), message: e.to_string() })
}

/// A new CA: its certificate PEM and key PEM.
fn new_ca(now: i64, validity: Duration) -> Result<(String, String), CertError> {
    let generate = |source| CertError::Generate { what: "CA", source };
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.distinguished_name.push(DnType::CommonName, format!("{CA_NAME_PREFIX}{now}"));
    // pathlen 0: this CA signs serving certificates only, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = offset(now - BACKDATE_SECONDS)?;
    params.not_after = offset(now.saturating_add(seconds(validity)))?;
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.self_signed(&key).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new serving certificate for `sans`: its PEM and key PEM.
fn new_leaf(
    now: i64,
    not_after: i64,
    sans: &[String],
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), CertError> {
    let generate = |source| CertError::Generate { what: "serving certificate", source };
    // rcgen turns names that parse as IP addresses into IP SANs.
    let mut params = CertificateParams::new(sans.to_vec()).map_err(generate)?;
    if let Some(first) = sans.first() {
        params.distinguished_name.push(DnType::CommonName, first.clone());
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = offset(now - BACKDATE_SECONDS)?;
    params.not_after = offset(not_after)?;
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, issuer).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A certificate chain and key (PEM) loaded for rustls (ring), checked to belong together.
pub(crate) fn certified_key(cert_pem: &[u8], key_pem: &[u8], what: &str) -> Result<Arc<CertifiedKey>, CertError> {
    let parse = |message: String| CertError::Parse { what: what.to_string(), message };
    let chain =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>().map_err(|e| parse(e.to_string()))?;
    if chain.is_empty() {
        return Err(parse("no CERTIFICATE block".to_string()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| parse(e.to_string()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|source| CertError::Load { what: what.to_string(), source })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(Arc::new(certified)),
        Err(source) => Err(CertError::Load { what: what.to_string(), source }),
    }
}

// === impl CertResolver ===

/// The serving certificate the TLS server presents, swapped in place on rotation: new
/// handshakes get the new certificate, open connections keep theirs.
#[derive(Default)]
pub struct CertResolver {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    /// The presented leaf's not-after in unix seconds (0 before the first), for the
    /// certificate-expiry alert: set here, where every certificate of both modes passes.
    expiry: prometheus_client::metrics::gauge::Gauge,
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver").field("loaded", &self.current().is_some()).finish()
    }
}

impl CertResolver {
    /// A resolver that keeps `expiry` at the presented leaf's not-after (unix seconds).
    pub(crate) fn with_expiry_gauge(expiry: prometheus_client::metrics::gauge::Gauge) -> Self {
        CertResolver { current: RwLock::default(), expiry }
    }

    /// Presents `key` from the next handshake on.
    pub(crate) fn set(&self, key: Arc<CertifiedKey>) {
        match key.cert.first().map(|leaf| CertInfo::parse_der(leaf, "the served certificate")) {
            Some(Ok(leaf)) => {
                self.expiry.set(leaf.not_after);
            }
            // rustls loaded it, so this is unlikely; the gauge then keeps the previous value.
            Some(Err(error)) => warn!(%error, "reading the served certificate's expiry for the metric failed"),
            None => {}
        }
        *self.current.write() = Some(key);
    }

    /// The presented leaf's not-after in unix seconds (0 before the first certificate).
    pub fn expiry(&self) -> i64 {
        self.expiry.get()
    }

    /// What is presented now (`None` before the first certificate).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.read().clone()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

// === I/O: self-signed ===

/// One read-decide-write cycle of self-signed mode at `now`: makes sure the Secret holds a CA
/// and a leaf good for now, and the `caBundle` matches. Returns what the server should present
/// and when to look again (unix seconds). Safe to run from every replica at once.
pub async fn reconcile(client: &Client, config: &SelfSigned, now: i64) -> Result<(Material, i64), CertError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let name = &config.secret_name;
    let sans = config.sans();
    let wanted = wanted_names(&sans);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PostParams::default() };
    for _ in 0..CONFLICT_RETRIES {
        let existing = secrets.get_opt(name).await.map_err(kube_error(
            "reading the webhook certificate Secret",
            &config.namespace,
            name,
        ))?;
        let stored = existing.as_ref().map(Material::from_secret).unwrap_or_default();
        let decision = stored.renewal(now, &wanted);
        let material = match decision {
            Renewal::Keep { .. } => stored,
            Renewal::Leaf(reason) | Renewal::Ca(reason) => {
                let kind = if matches!(decision, Renewal::Ca(_)) {
                    "CA and serving certificate"
                } else {
                    "serving certificate"
                };
                let fresh = stored.issue(now, decision, &sans, config)?;
                if matches!(decision, Renewal::Ca(_)) && existing.is_some() {
                    // Trusted first, served second (module header): a failure here is retried
                    // below and at the next check; the old CA keeps working meanwhile.
                    publish_ca_bundle(client, config, &fresh.ca_bundle).await;
                }
                let written = match existing {
                    None => {
                        let secret = Secret {
                            metadata: ObjectMeta {
                                name: Some(name.clone()),
                                namespace: Some(config.namespace.clone()),
                                labels: Some(rbac::labels()),
                                ..ObjectMeta::default()
                            },
                            type_: Some("kubernetes.io/tls".to_string()),
                            data: Some(fresh.secret_data()),
                            ..Secret::default()
                        };
                        secrets.create(&params, &secret).await
                    }
                    Some(mut secret) => {
                        // The resourceVersion read above makes a concurrent writer a Conflict.
                        secret.data = Some(fresh.secret_data());
                        secret.string_data = None;
                        secrets.replace(name, &params, &secret).await
                    }
                };
                match written {
                    Ok(_) => {
                        info!(secret = %name, reason = reason.as_str(), "issued a new webhook {kind}");
                        fresh
                    }
                    Err(e)
                        if is_status(&e, kube::core::Status::is_conflict)
                            || is_status(&e, kube::core::Status::is_already_exists) =>
                    {
                        debug!(secret = %name, "another replica wrote the certificate Secret first; reading it again");
                        continue;
                    }
                    Err(e) => {
                        return Err(kube_error("writing the webhook certificate Secret", &config.namespace, name)(e));
                    }
                }
            }
        };
        publish_ca_bundle(client, config, &material.ca_bundle).await;
        let next = match material.renewal(now, &wanted) {
            Renewal::Keep { next } => next,
            // Just written, so due only if the lifetimes are absurdly short: look again soon.
            _ => now + 1,
        };
        return Ok((material, next));
    }
    Err(CertError::Conflicts { what: format!("Secret {}/{name}", config.namespace) })
}

/// Sets the `caBundle` (best effort: a failure is logged, the next check tries again).
async fn publish_ca_bundle(client: &Client, config: &SelfSigned, bundle: &str) {
    let Some(name) = &config.webhook_config_name else { return };
    match ensure_ca_bundle(client, name, bundle).await {
        Ok(true) => info!(configuration = %name, "set the webhook caBundle"),
        Ok(false) => {}
        Err(error) => warn!(%error, configuration = %name, "could not set the webhook caBundle"),
    }
}

/// Sets every webhook's `clientConfig.caBundle` in configuration `name` to `bundle`; `true` when
/// it changed something.
pub(crate) async fn ensure_ca_bundle(client: &Client, name: &str, bundle: &str) -> Result<bool, CertError> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let want = ByteString(bundle.as_bytes().to_vec());
    let params = PostParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PostParams::default() };
    for _ in 0..CONFLICT_RETRIES {
        let Some(mut configuration) =
            api.get_opt(name).await.map_err(kube_error("reading the MutatingWebhookConfiguration", "", name))?
        else {
            return Err(CertError::ConfigurationMissing { name: name.to_string() });
        };
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if webhook.client_config.ca_bundle.as_ref() != Some(&want) {
                webhook.client_config.ca_bundle = Some(want.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &params, &configuration).await {
            Ok(_) => return Ok(true),
            Err(e) if is_status(&e, kube::core::Status::is_conflict) => continue,
            Err(e) => return Err(kube_error("updating the MutatingWebhookConfiguration's caBundle", "", name)(e)),
        }
    }
    Err(CertError::Conflicts { what: format!("MutatingWebhookConfiguration {name}") })
}

// === I/O: start ===

/// Loads the first certificate into `resolver` (retrying a failing API server with backoff),
/// then keeps it current in a background task until `shutdown`. An error means no certificate
/// could be had at all; later failures are logged and retried.
pub async fn start(
    client: Client,
    source: CertSource,
    resolver: Arc<CertResolver>,
    shutdown: CancellationToken,
) -> Result<JoinHandle<()>, CertError> {
    match source {
        CertSource::SelfSigned(config) => {
            let mut delay = Duration::from_secs(1);
            let mut attempt = 1;
            let (material, next) = loop {
                match reconcile(&client, &config, unix_now()).await {
                    Ok(done) => break done,
                    Err(error) if attempt < START_ATTEMPTS => {
                        warn!(%error, attempt, "getting the webhook certificate failed; retrying");
                    }
                    Err(error) => return Err(error),
                }
                tokio::select! {
                    () = shutdown.cancelled() => return Err(CertError::Cancelled),
                    () = tokio::time::sleep(delay) => {}
                }
                attempt += 1;
                delay *= 2;
            };
            resolver.set(material.certified_key()?);
            let span = info_span!("webhook_certs", mode = "self-signed", secret = %config.secret_name);
            Ok(tokio::spawn(keep_self_signed(client, config, resolver, material, next, shutdown).instrument(span)))
        }
        CertSource::Files(files) => {
            let (cert, key) = read_files(&files).await?;
            resolver.set(certified_key(&cert, &key, &files.dir.display().to_string())?);
            let span = info_span!("webhook_certs", mode = "files", dir = %files.dir.display());
            Ok(tokio::spawn(keep_files(files, resolver, (cert, key), shutdown).instrument(span)))
        }
    }
}

async fn keep_self_signed(
    client: Client,
    config: SelfSigned,
    resolver: Arc<CertResolver>,
    mut material: Material,
    mut next: i64,
    shutdown: CancellationToken,
) {
    loop {
        let until_due = Duration::from_secs(u64::try_from(next - unix_now()).unwrap_or(0));
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(config.recheck_interval.min(until_due)) => {}
        }
        match reconcile(&client, &config, unix_now()).await {
            Ok((fresh, due)) => {
                next = due;
                if fresh.cert != material.cert {
                    match fresh.certified_key() {
                        Ok(key) => {
                            resolver.set(key);
                            info!("serving the renewed webhook certificate");
                            material = fresh;
                        }
                        Err(error) => {
                            warn!(%error, "the renewed webhook certificate does not load; keeping the old one")
                        }
                    }
                }
            }
            Err(error) => {
                warn!(%error, "checking the webhook certificate failed; retrying at the next check");
                next = unix_now() + seconds(config.recheck_interval);
            }
        }
    }
}

// === I/O: files ===

async fn read_files(files: &Files) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let read = |name: &'static str| {
        let path = files.dir.join(name);
        async move { tokio::fs::read(&path).await.map_err(|source| CertError::Read { path, source }) }
    };
    Ok((read(SECRET_TLS_CERT).await?, read(SECRET_TLS_KEY).await?))
}

async fn keep_files(files: Files, resolver: Arc<CertResolver>, last: (Vec<u8>, Vec<u8>), shutdown: CancellationToken) {
    let what = "the webhook certificate files";
    let read = || read_files(&files);
    // A half-written pair (cert updated, key not yet) fails to load: the old one is kept and the
    // files read again at the next poll, by which time the writer has finished.
    let apply = |current: &(Vec<u8>, Vec<u8>)| {
        certified_key(&current.0, &current.1, &files.dir.display().to_string()).map(|key| resolver.set(key))
    };
    poll_changes(what, files.poll_interval, last, read, apply, shutdown).await;
}

/// Re-reads something every `interval` until `shutdown` and applies it when it changed and
/// loads; a read or load failure is logged and what was loaded stays (files mode here, and the
/// webhook's client CA bundle). Polling, not a file watch: Secret and ConfigMap volumes update by
/// an atomic symlink swap that watches handle poorly, and a read of a small file is cheap.
pub(crate) async fn poll_changes<T, E, R, Fut, A, LE>(
    what: &str,
    interval: Duration,
    mut last: T,
    read: R,
    mut apply: A,
    shutdown: CancellationToken,
) where
    T: PartialEq,
    E: std::fmt::Display,
    R: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    A: FnMut(&T) -> Result<(), LE>,
    LE: std::fmt::Display,
{
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let current = match read().await {
            Ok(current) => current,
            Err(error) => {
                warn!(%error, "reading {what} failed; keeping the loaded one");
                continue;
            }
        };
        if current == last {
            continue;
        }
        match apply(&current) {
            Ok(()) => {
                info!("loaded the changed {what}");
                last = current;
            }
            Err(error) => warn!(%error, "{what} changed but failed to load; keeping the loaded one"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn config() -> SelfSigned {
        SelfSigned::new("spear-system", "spear-operator-webhook")
    }

    fn issue(material: &Material, now: i64, renewal: Renewal) -> Material {
        let config = config();
        material.issue(now, renewal, &config.sans(), &config).expect("issuing from valid parameters must succeed")
    }

    fn fresh() -> Material {
        issue(&Material::default(), NOW, Renewal::Ca(RenewReason::Missing))
    }

    fn wanted() -> BTreeSet<String> {
        wanted_names(&config().sans())
    }

    fn info(not_before: i64, not_after: i64) -> CertInfo {
        CertInfo {
            not_before,
            not_after,
            names: wanted(),
            is_ca: false,
            subject: b"leaf".to_vec(),
            issuer: b"ca".to_vec(),
        }
    }

    fn ca_info(not_before: i64, not_after: i64) -> CertInfo {
        CertInfo {
            is_ca: true,
            subject: b"ca".to_vec(),
            issuer: b"ca".to_vec(),
            names: BTreeSet::new(),
            ..info(not_before, not_after)
        }
    }

    #[test]
    fn sans_are_the_service_names_then_the_extras() {
        let mut c = config();
        c.extra_sans = vec!["127.0.0.1".into(), "spear-operator-webhook.spear-system.svc".into()];
        assert_eq!(
            c.sans(),
            [
                "spear-operator-webhook.spear-system.svc",
                "spear-operator-webhook.spear-system.svc.cluster.local",
                "127.0.0.1"
            ]
        );
    }

    #[test]
    fn renews_at_two_thirds_of_the_lifetime() {
        let ca = ca_info(0, 3000);
        let leaf = info(0, 900);
        assert_eq!(renewal(599, Some(&ca), Some(&leaf), &wanted()), Renewal::Keep { next: 600 });
        assert_eq!(renewal(600, Some(&ca), Some(&leaf), &wanted()), Renewal::Leaf(RenewReason::Expiring));
        let late_leaf = info(1900, 2800);
        assert_eq!(renewal(1999, Some(&ca), Some(&late_leaf), &wanted()), Renewal::Keep { next: 2000 });
        assert_eq!(renewal(2000, Some(&ca), Some(&late_leaf), &wanted()), Renewal::Ca(RenewReason::Expiring));
    }

    #[test]
    fn missing_or_foreign_parts_are_replaced() {
        let ca = ca_info(0, 3000);
        assert_eq!(renewal(10, None, Some(&info(0, 900)), &wanted()), Renewal::Ca(RenewReason::Missing));
        assert_eq!(renewal(10, Some(&info(0, 3000)), None, &wanted()), Renewal::Ca(RenewReason::NotACa));
        assert_eq!(renewal(10, Some(&ca), None, &wanted()), Renewal::Leaf(RenewReason::Missing));
        let foreign = CertInfo { issuer: b"other".to_vec(), ..info(0, 900) };
        assert_eq!(renewal(10, Some(&ca), Some(&foreign), &wanted()), Renewal::Leaf(RenewReason::OtherIssuer));
        let renamed = CertInfo { names: wanted_names(&["other.svc".to_string()]), ..info(0, 900) };
        assert_eq!(renewal(10, Some(&ca), Some(&renamed), &wanted()), Renewal::Leaf(RenewReason::NamesChanged));
    }

    #[test]
    fn names_compare_case_and_ip_spelling_insensitively() {
        let a = wanted_names(&["Svc.NS.svc".to_string(), "::0:1".to_string()]);
        let b = wanted_names(&["svc.ns.svc".to_string(), "::1".to_string()]);
        assert_eq!(a, b);
    }

    #[test]
    fn fresh_material_is_kept_and_loads() {
        let material = fresh();
        let expected_next = NOW - BACKDATE_SECONDS + (seconds(DEFAULT_LEAF_VALIDITY) + BACKDATE_SECONDS) * 2 / 3;
        assert_eq!(material.renewal(NOW, &wanted()), Renewal::Keep { next: expected_next });
        material.certified_key().expect("a fresh leaf must load with its key");
        let leaf = material.leaf().expect("the leaf parses");
        assert_eq!(leaf.names, wanted());
        assert!(!leaf.is_ca);
    }

    #[test]
    fn leaf_renewal_keeps_the_ca() {
        let material = fresh();
        let later = NOW + 70 * DAY as i64;
        assert_eq!(material.renewal(later, &wanted()), Renewal::Leaf(RenewReason::Expiring));
        let renewed = issue(&material, later, Renewal::Leaf(RenewReason::Expiring));
        assert_eq!(renewed.ca_bundle, material.ca_bundle);
        assert_ne!(renewed.cert, material.cert);
        assert!(matches!(renewed.renewal(later, &wanted()), Renewal::Keep { .. }));
    }

    #[test]
    fn ca_rotation_keeps_the_old_ca_in_the_bundle_until_it_expires() {
        let material = fresh();
        let later = NOW + 250 * DAY as i64;
        assert_eq!(material.renewal(later, &wanted()), Renewal::Ca(RenewReason::Expiring));
        let rotated = issue(&material, later, Renewal::Ca(RenewReason::Expiring));
        let bundle = pem_certs(&rotated.ca_bundle, "bundle").expect("the bundle parses");
        assert_eq!(bundle.len(), 2, "new CA first, old CA second");
        assert!(rotated.ca_bundle.ends_with(&material.ca_bundle), "{}", rotated.ca_bundle);
        assert!(matches!(rotated.renewal(later, &wanted()), Renewal::Keep { .. }));
        let leaf = rotated.leaf().expect("the leaf parses");
        assert!(leaf.issued_by(&bundle[0].1), "the new leaf is issued by the new CA");

        // Once the old CA has expired, the next write drops it.
        let much_later = NOW + 400 * DAY as i64;
        let pruned = issue(&rotated, much_later, Renewal::Leaf(RenewReason::Expiring));
        assert_eq!(pem_certs(&pruned.ca_bundle, "bundle").expect("parses").len(), 1);
    }

    #[test]
    fn a_leaf_never_outlives_its_ca() {
        let mut c = config();
        c.ca_validity = Duration::from_secs(30 * DAY);
        let material =
            Material::default().issue(NOW, Renewal::Ca(RenewReason::Missing), &c.sans(), &c).expect("issues");
        let ca = material.current_ca().expect("the CA loads").1;
        assert_eq!(material.leaf().expect("the leaf parses").not_after, ca.not_after);
    }

    #[test]
    fn material_round_trips_through_a_secret() {
        let material = fresh();
        let secret = Secret { data: Some(material.secret_data()), ..Secret::default() };
        assert_eq!(Material::from_secret(&secret), material);
        assert!(!format!("{material:?}").contains("PRIVATE KEY"), "Debug must not print keys");
    }

    #[test]
    fn a_mismatched_key_is_refused() {
        let a = fresh();
        let b = fresh();
        let error = certified_key(a.cert.as_bytes(), b.key.as_bytes(), "test").expect_err("keys differ");
        assert!(matches!(error, CertError::Load { .. }), "{error}");
    }

    #[test]
    fn resolver_swaps_the_presented_certificate() {
        let resolver = CertResolver::default();
        assert!(resolver.current().is_none());
        let first = fresh().certified_key().expect("loads");
        resolver.set(first.clone());
        assert!(Arc::ptr_eq(&resolver.current().expect("set"), &first));
        let second = fresh().certified_key().expect("loads");
        resolver.set(second.clone());
        assert!(Arc::ptr_eq(&resolver.current().expect("set"), &second));
    }

    #[test]
    fn resolver_keeps_the_expiry_gauge_at_the_presented_leafs_not_after() {
        let gauge = prometheus_client::metrics::gauge::Gauge::default();
        let resolver = CertResolver::with_expiry_gauge(gauge.clone());
        assert_eq!(gauge.get(), 0, "no certificate yet");
        let material = fresh();
        resolver.set(material.certified_key().expect("loads"));
        let leaf = material.leaf().expect("the leaf parses");
        assert_eq!(gauge.get(), leaf.not_after);
        assert_eq!(resolver.expiry(), leaf.not_after);
        // A renewed leaf moves it (files mode and self-signed renewals both pass through `set`).
        let renewed = issue(&material, NOW + 70 * DAY as i64, Renewal::Leaf(RenewReason::Expiring));
        resolver.set(renewed.certified_key().expect("loads"));
        assert!(gauge.get() > leaf.not_after, "{} after {}", gauge.get(), leaf.not_after);
    }
}
