use serde_json::json;

use super::*;

/// One fake sample in each detector's published shape.
fn samples() -> Vec<(Detector, String)> {
    vec![
        (
            Detector::PrivateKey,
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAfakefakefake\n-----END RSA PRIVATE KEY-----".into(),
        ),
        (Detector::PrivateKey, "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIfake\n-----END PRIVATE KEY-----".into()),
        (Detector::PrivateKey, "-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEfake\\n-----END OPENSSH PRIVATE KEY-----".into()),
        (Detector::PrivateKey, "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGfake\n-----END PGP PRIVATE KEY BLOCK-----".into()),
        // AWS's documented example key id.
        (Detector::AwsAccessKey, "AKIAIOSFODNN7EXAMPLE".into()),
        (Detector::AwsAccessKey, "ASIAIOSFODNN7EXAMPLE".into()),
        (Detector::GcpApiKey, format!("AIza{}", "SyFAKE-key_0123456789abcdefghijklmn")),
        (Detector::GithubToken, format!("ghp_{}", "0123456789abcdefghijklmnopqrstuvwxyz")),
        (Detector::GithubToken, format!("ghs_{}", "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")),
        (Detector::GithubToken, format!("github_pat_{}_{}", "11ABCDEFG0123456789abc", "x".repeat(59))),
        (Detector::GitlabToken, "glpat-abcdefghij0123456789".into()),
        (Detector::GitlabToken, "glrt-t1_abcdefghij0123456789".into()),
        (Detector::SlackToken, "xoxb-1234567890-abcdefghijFAKE".into()),
        (Detector::StripeKey, "sk_live_0123456789abcdefFAKE".into()),
        (Detector::StripeKey, "rk_test_0123456789abcdefFAKE".into()),
        (Detector::OpenaiKey, "sk-proj-abcDEF123_ghiJKL456-mnoPQR789stuVWX0".into()),
        (Detector::OpenaiKey, format!("sk-{}", "aB3".repeat(16))),
        // jwt.io's sample token.
        (
            Detector::Jwt,
            "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c".into(),
        ),
    ]
}

/// Near misses: too short, wrong prefix, glued to a word, ordinary prose, a UUID, a git sha.
const NEAR_MISSES: &[&str] = &[
    "AKIAIOSFODNN7EXAMPL",
    "AKIBIOSFODNN7EXAMPLE",
    "xAKIAIOSFODNN7EXAMPLE",
    "akiaiosfodnn7example",
    "AIzaSyFAKE-key_0123456789abcdefghijk",
    "ghp_0123456789abcdefghijklmnopqrstuvwxy",
    "ghx_0123456789abcdefghijklmnopqrstuvwxyz",
    "github_pat_short_1234",
    "glpat-short123",
    "glxyz-abcdefghij0123456789",
    "xoxb-12345",
    "xoxz-1234567890abcdef",
    "sk_live_short",
    "pk_live_0123456789abcdefFAKE",
    "sk-short1",
    "is sk-learn-style-estimators-explained here",
    "task-0123456789012345678901234",
    "eyJhbGciOiJIUzI1NiJ9.notjson.signature12345",
    "eyJabc.eyJdef.sig",
    "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    "123e4567-e89b-12d3-a456-426614174000",
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "The quick brown fox asks whether a skeleton key, an API key or a JSON object {\"a\": 1} is a secret.",
];

#[test]
fn detectors_compile() {
    let all = DetectorSet::new(&Detector::ALL);
    assert_eq!(all.detectors, Detector::ALL);
    for (i, d) in Detector::ALL.into_iter().enumerate() {
        // COMPILED is indexed by discriminant.
        assert_eq!(d as usize, i);
        assert!(compiled(d).found.as_str().contains(d.pattern()));
    }
}

#[test]
fn each_detector_finds_its_published_shape() {
    let set = DetectorSet::new(&Detector::ALL);
    for (detector, sample) in samples() {
        let text = format!("value: {sample} (end)");
        assert_eq!(set.first_in(&text), Some(detector), "{sample}");
        assert_eq!(set.redact(&text), format!("value: [redacted: detector {}] (end)", detector.as_str()), "{sample}");
        // Only its own detector fires.
        let others: Vec<Detector> = Detector::ALL.into_iter().filter(|d| *d != detector).collect();
        assert_eq!(DetectorSet::new(&others).first_in(&text), None, "{sample}");
    }
}

#[test]
fn near_misses_do_not_fire() {
    let set = DetectorSet::new(&Detector::ALL);
    for text in NEAR_MISSES {
        assert_eq!(set.first_in(text), None, "{text}");
        assert!(matches!(set.redact(text), Cow::Borrowed(_)), "{text}");
    }
}

#[test]
fn a_private_key_without_its_end_line_is_redacted_to_the_end() {
    let set = DetectorSet::new(&[Detector::PrivateKey]);
    let text = "key:\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIfake\nmore";
    assert_eq!(set.redact(text), "key:\n[redacted: detector privateKey]");
}

#[test]
fn only_the_chosen_detectors_run() {
    let empty = DetectorSet::new(&[]);
    assert!(empty.is_empty());
    assert_eq!(empty.first_in("AKIAIOSFODNN7EXAMPLE"), None);
    assert!(matches!(empty.redact("AKIAIOSFODNN7EXAMPLE"), Cow::Borrowed(_)));
    let jwt_only = DetectorSet::new(&[Detector::Jwt, Detector::Jwt]);
    assert!(!jwt_only.is_empty());
    assert_eq!(jwt_only.first_in("AKIAIOSFODNN7EXAMPLE"), None);
    // The first in `Detector::ALL` order, wherever it is in the text.
    let text = format!("{} AKIAIOSFODNN7EXAMPLE", samples()[17].1);
    assert_eq!(
        DetectorSet::new(&[Detector::Jwt, Detector::AwsAccessKey]).first_in(&text),
        Some(Detector::AwsAccessKey)
    );
}

#[test]
fn redacted_output_has_no_finding_left() {
    let set = DetectorSet::new(&Detector::ALL);
    let gcp = "AIzaSyFAKE-key_0123456789abcdefghij-";
    let cases = [
        // The second key hides behind the first's last letter until the first is a marker.
        "AKIAIOSFODNN7EXAMPLEAKIAIOSFODNN7EXAMPLEAKIAIOSFODNN7EXAMPLE".to_string(),
        format!("{gcp}eyJhbGciOi.eyJzdWIiOi.signature123"),
        format!("{}{}", samples()[13].1, samples()[4].1),
        samples().into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(""),
        samples().into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(" "),
    ];
    for text in cases {
        let out = set.redact(&text);
        assert!(matches!(out, Cow::Owned(_)), "{text}");
        assert_eq!(set.first_in(&out), None, "{text} -> {out}");
    }
    assert_eq!(
        set.redact("AKIAIOSFODNN7EXAMPLEAKIAIOSFODNN7EXAMPLE and AKIAIOSFODNN7EXAMPLE"),
        "[redacted: detector awsAccessKey] and [redacted: detector awsAccessKey]"
    );
}

#[test]
fn json_strings_and_keys_are_redacted_and_searched() {
    let set = DetectorSet::new(&Detector::ALL);
    let mut value = json!({"AKIAIOSFODNN7EXAMPLE": {"list": ["ok", "token xoxb-1234567890-abcdefghijFAKE"]}, "n": 2});
    assert_eq!(set.first_in_json(&value), Some(Detector::AwsAccessKey));
    assert_eq!(
        set.first_in_json(&json!({"a": ["x", {"b": "xoxb-1234567890-abcdefghijFAKE"}]})),
        Some(Detector::SlackToken)
    );
    assert_eq!(set.redact_json(&mut value), 2);
    assert_eq!(
        value,
        json!({"[redacted: detector awsAccessKey]": {"list": ["ok", "token [redacted: detector slackToken]"]}, "n": 2})
    );
    assert_eq!(set.first_in_json(&value), None);
}

#[test]
fn wire_names_are_the_serde_names() {
    for d in Detector::ALL {
        assert_eq!(serde_json::to_value(d).expect("serializes"), json!(d.as_str()));
        assert_eq!(serde_json::from_value::<Detector>(json!(d.as_str())).expect("its own name"), d);
    }
}

#[test]
fn long_adversarial_runs_finish() {
    let set = DetectorSet::new(&Detector::ALL);
    for text in [
        "xeyJ".repeat(64 * 1024),
        format!("x{}", "sk-".repeat(64 * 1024)),
        "AKIA".repeat(64 * 1024),
        "-----BEGIN PRIVATE KEY-----".repeat(8 * 1024),
        format!("-{}", "sk-aaaaaaaaaaaaaaaaaaaaaaaa ".repeat(8 * 1024)),
    ] {
        let out = set.redact(&text);
        assert_eq!(set.first_in(&out), None);
    }
}
