//! A private CA for HTTPS test servers: its certificate is what a test trusts (or withholds),
//! its leaves are what the servers present.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

const INVARIANT: &str = "rcgen must build certificates from fixed, valid parameters";

/// A self-signed CA.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(common_name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect(INVARIANT);
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        TestCa { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().expect(INVARIANT)).expect(INVARIANT) }
    }

    /// The CA certificate (PEM): what a client trusts.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's private key (PKCS#8 PEM), for a server that issues its own leaf.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// A server certificate and its key (PEM) for `names` (IP addresses become IP SANs).
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_string()).collect::<Vec<_>>()).expect(INVARIANT);
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("server"));
        let key = KeyPair::generate().expect(INVARIANT);
        let cert = params.signed_by(&key, &self.issuer).expect(INVARIANT);
        (cert.pem(), key.serialize_pem())
    }
}
