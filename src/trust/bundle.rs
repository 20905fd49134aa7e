//! A bundle of extra CA certificates, read from PEM text (pure).
//!
//! - Every certificate must parse as a trust anchor (rustls' reading, the one the verifier
//!   uses), so a bundle is taken whole or refused whole: half a bundle would trust some servers
//!   and fail others with a TLS error far from its cause.
//! - Anything between the PEM blocks (the `subject=` lines `openssl` and trust-manager write,
//!   comments) is ignored; other PEM blocks (a private key pasted by mistake) are refused.
//! - At most [`MAX_CERTIFICATES`] and [`MAX_DER_BYTES`]: the operator hands the bundle to every
//!   injected agent in one environment variable, which Linux caps at 128 KiB, and the
//!   platform's public roots (which the agent trusts already) do not belong in it.

use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::{self, PemObject as _, SectionKind};

/// Certificates one bundle may hold.
pub const MAX_CERTIFICATES: usize = 64;
/// Bytes of DER one bundle may hold (its PEM, re-encoded, stays under 64 KiB).
pub const MAX_DER_BYTES: usize = 46 * 1024;

/// A bundle that is not a usable set of CA certificates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the CA certificates in PEM")]
    Empty,
    #[error("is not PEM: {0}")]
    Pem(String),
    #[error("holds a {0} block: only CERTIFICATE blocks belong in a CA bundle (never a private key)")]
    NotCertificate(&'static str),
    #[error("certificate {index} is not a valid X.509 certificate: {reason}")]
    Invalid { index: usize, reason: String },
    #[error(
        "holds {certificates} certificates ({bytes} bytes): at most {MAX_CERTIFICATES} and {MAX_DER_BYTES} bytes; \
         list only the private CAs, the system's public roots are trusted already"
    )]
    TooBig { certificates: usize, bytes: usize },
}

/// Extra CA certificates, each a valid trust anchor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bundle {
    certificates: Vec<CertificateDer<'static>>,
}

impl Bundle {
    /// Reads `text` (PEM): every CERTIFICATE block, none of another kind.
    pub fn parse(text: &[u8]) -> Result<Self, BundleError> {
        let mut certificates = Vec::new();
        let mut bytes = 0usize;
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text) {
            let (kind, der) = section.map_err(|e| BundleError::Pem(pem_error(&e)))?;
            if kind != SectionKind::Certificate {
                return Err(BundleError::NotCertificate(kind_name(kind)));
            }
            bytes = bytes.saturating_add(der.len());
            let index = certificates.len() + 1;
            if index > MAX_CERTIFICATES || bytes > MAX_DER_BYTES {
                let (certificates, bytes) = totals(text);
                return Err(BundleError::TooBig { certificates, bytes });
            }
            let der = CertificateDer::from(der);
            rustls::RootCertStore::empty()
                .add(der.clone())
                .map_err(|e| BundleError::Invalid { index, reason: e.to_string() })?;
            certificates.push(der);
        }
        if certificates.is_empty() {
            return Err(BundleError::Empty);
        }
        Ok(Bundle { certificates })
    }

    pub fn certificates(&self) -> &[CertificateDer<'static>] {
        &self.certificates
    }

    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// The union of two bundles, each certificate once, in order of first appearance.
    #[must_use]
    pub fn with(mut self, other: &Bundle) -> Bundle {
        for cert in &other.certificates {
            if !self.certificates.contains(cert) {
                self.certificates.push(cert.clone());
            }
        }
        self
    }

    /// The certificates as PEM again, without whatever surrounded them: what the operator gives
    /// the agents it injects.
    pub fn to_pem(&self) -> String {
        let mut out = String::new();
        for cert in &self.certificates {
            let encoded = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
            out.push_str("-----BEGIN CERTIFICATE-----\n");
            // Base64 is ASCII, so every 64-byte chunk is whole characters.
            for line in encoded.as_bytes().chunks(64) {
                out.push_str(std::str::from_utf8(line).unwrap_or_default());
                out.push('\n');
            }
            out.push_str("-----END CERTIFICATE-----\n");
        }
        out
    }
}

/// The blocks of `text` and their bytes, for the message of a bundle too big.
fn totals(text: &[u8]) -> (usize, usize) {
    <(SectionKind, Vec<u8>)>::pem_slice_iter(text)
        .filter_map(Result::ok)
        .fold((0, 0), |(count, bytes), (_, der)| (count + 1, bytes.saturating_add(der.len())))
}

fn kind_name(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::RsaPrivateKey => "RSA PRIVATE KEY",
        SectionKind::PrivateKey => "PRIVATE KEY",
        SectionKind::EcPrivateKey => "EC PRIVATE KEY",
        SectionKind::Crl => "X509 CRL",
        SectionKind::Csr => "CERTIFICATE REQUEST",
        SectionKind::EchConfigList => "ECHCONFIG",
        _ => "non-certificate",
    }
}

fn pem_error(error: &pem::Error) -> String {
    match error {
        pem::Error::MissingSectionEnd { .. } => "a BEGIN line has no END line".to_string(),
        pem::Error::IllegalSectionStart { .. } => "a BEGIN line is malformed".to_string(),
        pem::Error::Base64Decode(_) => "a block's base64 does not decode".to_string(),
        other => format!("{other:?}"),
    }
}
