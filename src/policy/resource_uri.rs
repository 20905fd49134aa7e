//! The spellings of a resource URI the policy decides on: one per resource, so that what a glob
//! of `allowedResources`/`deniedResources` sees is what a server that resolves paths opens.
//!
//! Refused before any pattern is matched ([`super::items`], so on every door that names a
//! resource, and in the lists, which leave such URIs out):
//! - a segment of only dots (`.`, `..`) in the path, query or fragment, where `/`, `?`, `#`, `&`,
//!   `=`, `;` and `,` end a segment (`?path=../x`, `..;/`); `//` after the authority (an empty
//!   segment: `docs//private` is `docs/private` to a file system; a trailing `/` is fine);
//! - a backslash or control character (C0, DEL, C1); a `%` that starts no escape; escapes of
//!   unreserved characters (`%2e`, `%70`: RFC 3986 says never to encode them), of `/`, `\`,
//!   control characters, of a `%` that starts another escape (`%252e`, decoded twice), and
//!   escapes that do not decode to UTF-8 (the overlong `%c0%ae` is a `.` to lax decoders);
//! - no scheme (`/srv/x` is a path to the server), an upper-case scheme, userinfo (`user@host`),
//!   and a `file:` URI not written `file:///path`.
//!
//! A query or fragment goes to the server as it is, so it is held to the same rules.
//!
//! Why refuse rather than normalize (RFC 3986 section 6): servers resolve differently (one
//! decodes before splitting, one after; `\` separates on Windows; `%2F` separates for one and is
//! a name character for another), so no normal form is what every server opens; and the server
//! must receive the very string the policy decided on. Clients take URIs from `resources/list`,
//! where servers write them plainly, so the refusal costs only the attacks. Not covered: servers
//! that fold case, strip path parameters (`;x`), follow symlinks, normalize Unicode or take a
//! path from the query (`?path=private/x`); patterns for those must allow for it.

/// What makes a resource URI ambiguous to a server that resolves paths.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UriProblem {
    #[error("the URI has a '{0}' segment, which a server resolving paths follows out of the matched directory")]
    DotSegment(String),
    #[error("the URI has an empty segment ('//' after the authority), which a server resolving paths skips")]
    EmptySegment,
    #[error("the URI has a backslash, a path separator to some servers")]
    Backslash,
    #[error("the URI has a control character")]
    ControlCharacter,
    #[error("the URI has a '%' that does not start an escape of two hex digits")]
    BadEscape,
    #[error("the URI percent-encodes '{0}', which must be written as itself (RFC 3986 section 2.3)")]
    EncodedUnreserved(char),
    #[error("the URI percent-encodes the separator '{0}', which a server may decode into a path separator")]
    EncodedSeparator(char),
    #[error("the URI percent-encodes a control character")]
    EncodedControl,
    #[error("the URI percent-encodes a '%' that starts another escape (decoded twice, it is a different URI)")]
    DoubleEncoded,
    #[error("the URI's percent-escapes do not decode to UTF-8 (overlong forms spell '.' and '/' to lax decoders)")]
    NotUtf8,
    #[error("the URI has no scheme ('scheme:' first), so a server reads it as a path of its own")]
    NoScheme,
    #[error("the URI's scheme has upper-case letters, which servers read as the lower-case scheme")]
    SchemeCase,
    #[error("the URI has userinfo ('user@' before the host)")]
    UserInfo,
    #[error("a file URI must be written 'file:///<absolute path>' (an authority is ignored or names a network share)")]
    FileForm,
}

impl UriProblem {
    /// The refusal's detail: the problem and the fix.
    pub(crate) fn detail(&self) -> String {
        format!("{self}; ask for the resource by the URI its server lists (resources/list), spelled plainly")
    }
}

/// Characters RFC 3986 section 2.3 calls unreserved.
fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// The byte a `%XX` escape at the start of `bytes` stands for.
fn escape(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [b'%', high, low, ..] if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => {
            let digit = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
            Some(digit(*high)? * 16 + digit(*low)?)
        }
        _ => None,
    }
}

/// The characters and escapes of `uri` ([`UriProblem`] names what is refused).
fn check_characters(uri: &str) -> Result<(), UriProblem> {
    // C0, DEL and C1 (U+0080 to U+009F, NEL among them): no URI or IRI has them.
    if uri.chars().any(char::is_control) {
        return Err(UriProblem::ControlCharacter);
    }
    let bytes = uri.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        match byte {
            b'\\' => return Err(UriProblem::Backslash),
            b'%' => {
                let value = escape(&bytes[i..]).ok_or(UriProblem::BadEscape)?;
                match value {
                    v if unreserved(v) => return Err(UriProblem::EncodedUnreserved(v as char)),
                    b'/' | b'\\' => return Err(UriProblem::EncodedSeparator(value as char)),
                    b'%' if bytes.get(i + 3..i + 5).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) => {
                        return Err(UriProblem::DoubleEncoded);
                    }
                    _ => decoded.push(value),
                }
                i += 3;
                continue;
            }
            _ => decoded.push(byte),
        }
        i += 1;
    }
    let decoded = std::str::from_utf8(&decoded).map_err(|_| UriProblem::NotUtf8)?;
    if decoded.chars().any(char::is_control) {
        return Err(UriProblem::EncodedControl);
    }
    Ok(())
}

/// `uri` split as RFC 3986 appendix B does: (scheme, authority, the rest: path, query, fragment).
fn split(uri: &str) -> (Option<&str>, Option<&str>, &str) {
    let scheme_end = uri.find([':', '/', '?', '#']).filter(|&at| uri[at..].starts_with(':') && at > 0);
    let (scheme, rest) = match scheme_end {
        Some(at) => (Some(&uri[..at]), &uri[at + 1..]),
        None => (None, uri),
    };
    match rest.strip_prefix("//") {
        Some(hier) => {
            let end = hier.find(['/', '?', '#']).unwrap_or(hier.len());
            (scheme, Some(&hier[..end]), &hier[end..])
        }
        None => (scheme, None, rest),
    }
}

/// Whether the policy may decide on `uri` as it is; the problem otherwise.
pub(crate) fn check(uri: &str) -> Result<(), UriProblem> {
    check_characters(uri)?;
    let (scheme, authority, rest) = split(uri);
    let scheme = scheme.ok_or(UriProblem::NoScheme)?;
    let mut characters = scheme.bytes();
    let well_formed = characters.next().is_some_and(|b| b.is_ascii_alphabetic())
        && characters.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !well_formed {
        return Err(UriProblem::NoScheme);
    }
    if scheme.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(UriProblem::SchemeCase);
    }
    if authority.is_some_and(|a| a.contains('@')) {
        return Err(UriProblem::UserInfo);
    }
    if scheme == "file" && (authority != Some("") || !rest.starts_with('/')) {
        return Err(UriProblem::FileForm);
    }
    if rest.contains("//") {
        return Err(UriProblem::EmptySegment);
    }
    let dots = rest
        .split(['/', '?', '#', '&', '=', ';', ','])
        .find(|segment| !segment.is_empty() && segment.bytes().all(|b| b == b'.'));
    match dots {
        Some(segment) => Err(UriProblem::DotSegment(segment.to_string())),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain URIs as servers list them pass: files, other schemes, templates, reserved
    /// characters escaped, a trailing slash, dots inside names.
    #[test]
    fn plain_uris_pass() {
        for uri in [
            "file:///D/srv/docs/a.md",
            "file:///D/srv/docs/",
            "file:///C:/docs/a.md",
            "file:///srv/docs/My%20File.md",
            "file:///srv/docs/caf%C3%A9.md",
            "file:///srv/docs/café.md",
            "file:///srv/docs/100%25",
            "file:///srv/docs/.hidden",
            "file:///srv/docs/a..b",
            "file:///srv/docs/v1.2..3/notes.txt",
            "file:///srv/docs/{path}",
            "test://static/resource/1",
            "test://static/resource/{id}",
            "postgres://db.internal:5432/app/users",
            "repo://Owner/Name/README.md",
            "https://example.com/a?b=c&d=1..3#top",
            "urn:isbn:0451450523",
            "screen://localhost/display1",
        ] {
            assert_eq!(check(uri), Ok(()), "{uri}");
        }
    }

    /// The review's table and its variants: every spelling that a path-resolving server reads
    /// differently from the glob is refused, each with its own problem.
    #[test]
    fn ambiguous_spellings_are_refused() {
        use UriProblem::*;
        let dots = |s: &str| DotSegment(s.to_string());
        for (uri, problem) in [
            ("file:///D/srv/docs/../../secret.txt", dots("..")),
            ("file:///D/srv/docs/%2e%2e/%2e%2e/secret.txt", EncodedUnreserved('.')),
            ("file:///D/srv/docs/%2E%2e/secret.txt", EncodedUnreserved('.')),
            ("file:///D/srv/docs/.%2e/secret.txt", EncodedUnreserved('.')),
            ("file:///D/srv/docs//private/key.txt", EmptySegment),
            ("file:///D/srv/docs/./private/key.txt", dots(".")),
            ("file:///D/srv/docs/%70rivate/key.txt", EncodedUnreserved('p')),
            ("file:///D/srv/docs/%7Euser", EncodedUnreserved('~')),
            ("file:///D/srv/docs/..%2Fsecret.txt", EncodedSeparator('/')),
            ("file:///D/srv/docs/..%2fsecret.txt", EncodedSeparator('/')),
            ("file:///D/srv/docs/..%5Csecret.txt", EncodedSeparator('\\')),
            ("file:///D/srv/docs/..\\..\\secret.txt", Backslash),
            ("file:///D/srv/docs\\private\\key.txt", Backslash),
            ("file:///D/srv/docs/%252e%252e/secret.txt", DoubleEncoded),
            ("file:///D/srv/docs/%c0%ae%c0%ae/secret.txt", NotUtf8),
            ("file:///D/srv/docs/key.txt%00.md", EncodedControl),
            ("file:///D/srv/docs/a\n.md", ControlCharacter),
            ("file:///D/srv/docs/a\u{85}.md", ControlCharacter),
            ("file:///D/srv/docs/a\u{9b}31m.md", ControlCharacter),
            ("file:///D/srv/docs/a%C2%9B31m.md", EncodedControl),
            ("file:///D/srv/docs/a%C2%85.md", EncodedControl),
            ("file:///D/srv/docs/a%7F.md", EncodedControl),
            ("file:///D/srv/docs/%zz", BadEscape),
            ("file:///D/srv/docs/%2", BadEscape),
            ("file:///D/srv/docs/%+1", BadEscape),
            ("file:///D/srv/docs/...", dots("...")),
            ("file:///D/srv/docs/..", dots("..")),
            ("file:///D/srv/docs/..;/secret.txt", dots("..")),
            ("file:////D/srv/docs/a.md", EmptySegment),
            ("file://localhost/D/srv/docs/private/key.txt", FileForm),
            ("file:/D/srv/docs/private/key.txt", FileForm),
            ("file:D/srv/docs/a.md", FileForm),
            ("FILE:///D/srv/docs/private/key.txt", SchemeCase),
            ("File:///D/srv/docs/private/key.txt", SchemeCase),
            ("https://docs.example@evil.example/a", UserInfo),
            ("../secret.txt", NoScheme),
            ("/D/srv/docs/private/key.txt", NoScheme),
            ("1x:/D/srv/docs/private/key.txt", NoScheme),
            ("a b:/D/srv/docs/private/key.txt", NoScheme),
            ("custom:../secret.txt", dots("..")),
            ("custom:a//b", EmptySegment),
        ] {
            assert_eq!(check(uri), Err(problem), "{uri}");
        }
    }

    /// A query and a fragment reach the server as they are; a server may take a path from them
    /// (`?path=`), so dot segments and `//` are refused there too, with `=`, `&`, `;` and `,`
    /// also ending a segment. Dots inside a value (`1..3`) are not a segment.
    #[test]
    fn queries_and_fragments_are_held_to_the_same_rules() {
        for uri in [
            "file:///D/srv/docs/view?path=../../secret.txt",
            "file:///D/srv/docs/view?path=..",
            "file:///D/srv/docs/view?a=1&path=./private/key.txt",
            "file:///D/srv/docs/a.md#../../secret.txt",
            "file:///D/srv/docs/a.md#..",
            "file:///D/srv/docs/a.md?x#y/../z",
            "file:///D/srv/docs/a.md?..",
            "file:///D/srv/docs/view?path=docs//private",
            "file:///D/srv/docs/view?path=%2e%2e",
            "file:///D/srv/docs/view?path=..%2F..",
        ] {
            assert!(check(uri).is_err(), "{uri}");
        }
        for uri in ["file:///D/srv/docs/a.md?v=1..3", "file:///D/srv/docs/a.md#section.2", "file:///D/srv/docs/a?q="] {
            assert_eq!(check(uri), Ok(()), "{uri}");
        }
    }

    #[test]
    fn every_refusal_names_the_fix() {
        let problem = check("file:///D/srv/docs/../x").expect_err("refused");
        let detail = problem.detail();
        assert!(detail.contains("'..' segment") && detail.contains("resources/list"), "{detail}");
    }
}
