use std::fs;

use super::*;
use crate::testing::test_ca::TestCa;

fn der_of(pem: &str) -> Vec<u8> {
    Bundle::parse(pem.as_bytes()).expect("one certificate").certificates()[0].to_vec()
}

#[test]
fn a_bundle_reads_every_certificate_and_ignores_the_text_around_them() {
    let (a, b) = (TestCa::new("a"), TestCa::new("b"));
    let text = format!("subject=CN = a\n{}\n# the second\nsubject=CN = b\n{}", a.cert_pem(), b.cert_pem());
    let bundle = Bundle::parse(text.as_bytes()).expect("valid");
    assert_eq!(bundle.certificates().len(), 2);
    assert_eq!(bundle.certificates()[1].to_vec(), der_of(&b.cert_pem()));
    // Re-encoded, it reads back the same, without the text around it.
    let pem = bundle.to_pem();
    assert!(!pem.contains("subject="), "{pem}");
    assert_eq!(Bundle::parse(pem.as_bytes()).expect("its own PEM"), bundle);
    assert!(pem.lines().all(|l| l.len() <= 64), "{pem}");
}

#[test]
fn a_bundle_is_refused_whole_naming_what_is_wrong() {
    let ca = TestCa::new("a");
    assert_eq!(Bundle::parse(b""), Err(BundleError::Empty));
    assert_eq!(Bundle::parse(b"not a certificate at all"), Err(BundleError::Empty));
    // A private key pasted beside the certificate: refused, never trusted or echoed.
    let with_key = format!("{}{}", ca.cert_pem(), ca.key_pem());
    assert_eq!(Bundle::parse(with_key.as_bytes()), Err(BundleError::NotCertificate("PRIVATE KEY")));
    // A block that is not base64, or not a certificate inside.
    let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
    assert!(matches!(Bundle::parse(broken.as_bytes()), Err(BundleError::Pem(_))));
    let not_x509 = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
    let with_good_first = format!("{}{not_x509}", ca.cert_pem());
    assert!(
        matches!(Bundle::parse(with_good_first.as_bytes()), Err(BundleError::Invalid { index: 2, .. })),
        "{:?}",
        Bundle::parse(with_good_first.as_bytes())
    );
    let unterminated = ca.cert_pem().replace("-----END CERTIFICATE-----", "");
    assert!(matches!(Bundle::parse(unterminated.as_bytes()), Err(BundleError::Pem(_))));
}

#[test]
fn a_bundle_too_big_for_an_agents_environment_is_refused() {
    let one = TestCa::new("a").cert_pem();
    let many = one.repeat(MAX_CERTIFICATES + 1);
    let error = Bundle::parse(many.as_bytes()).expect_err("too many");
    assert!(
        matches!(error, BundleError::TooBig { certificates, .. } if certificates == MAX_CERTIFICATES + 1),
        "{error}"
    );
    assert!(error.to_string().contains("system's public roots are trusted already"), "{error}");
    assert!(Bundle::parse(one.repeat(MAX_CERTIFICATES).as_bytes()).is_ok());
}

#[test]
fn the_union_keeps_each_certificate_once() {
    let (a, b) = (TestCa::new("a"), TestCa::new("b"));
    let ab = Bundle::parse(format!("{}{}", a.cert_pem(), b.cert_pem()).as_bytes()).expect("valid");
    let b_only = Bundle::parse(b.cert_pem().as_bytes()).expect("valid");
    assert_eq!(b_only.clone().with(&ab).certificates().len(), 2);
    assert_eq!(ab.clone().with(&b_only), ab);
}

#[test]
fn a_file_follows_rotation_keeps_the_last_good_bundle_and_drops_a_removed_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ca.crt");
    let (a, b, inline) = (TestCa::new("a"), TestCa::new("b"), TestCa::new("inline"));
    fs::write(&path, a.cert_pem()).expect("write");
    let trust = Trust::new(Some(&path), Some(&inline.cert_pem())).expect("valid");
    let ders = |trust: &Trust| trust.bundle().certificates().iter().map(|c| c.to_vec()).collect::<Vec<_>>();
    assert_eq!(ders(&trust), vec![der_of(&a.cert_pem()), der_of(&inline.cert_pem())]);

    // Rotated in place (the kubelet's update of a ConfigMap volume).
    fs::write(&path, format!("{}{}", a.cert_pem(), b.cert_pem())).expect("write");
    assert_eq!(ders(&trust).len(), 3);
    let pem = trust.pem().expect("not empty");
    assert_eq!(Bundle::parse(pem.as_bytes()).expect("its PEM").certificates().len(), 3);
    // The same bytes again: the same shared PEM, not a new one.
    assert!(Arc::ptr_eq(&pem, &trust.pem().expect("not empty")));

    // A broken edit: the last good bundle stays.
    fs::write(&path, "-----BEGIN CERTIFICATE-----\n").expect("write");
    assert_eq!(ders(&trust).len(), 3);
    // Removed: only the inline certificate is left.
    fs::remove_file(&path).expect("remove");
    assert_eq!(ders(&trust), vec![der_of(&inline.cert_pem())]);
    // Back again.
    fs::write(&path, b.cert_pem()).expect("write");
    assert_eq!(ders(&trust), vec![der_of(&b.cert_pem()), der_of(&inline.cert_pem())]);
}

#[test]
fn at_start_a_bad_file_is_an_error_naming_it_and_a_missing_one_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ca.crt");
    fs::write(&path, "hello").expect("write");
    let error = Trust::new(Some(&path), None).expect_err("no certificate");
    assert_eq!(
        error.to_string(),
        format!(
            "--extra-ca-file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the CA certificates in PEM",
            path.display()
        )
    );
    let missing = dir.path().join("missing.crt");
    let trust = Trust::new(Some(&missing), None).expect("a missing file is not an error");
    assert!(trust.bundle().is_empty() && trust.pem().is_none());
    let error = Trust::new(None, Some("junk")).expect_err("bad inline");
    assert!(error.to_string().starts_with("SPEAR_EXTRA_CA_PEM (the operator's trust bundle"), "{error}");
    let error = Trust::new(Some(dir.path()), None).expect_err("a directory");
    assert!(error.to_string().contains("cannot read it"), "{error}");
}
