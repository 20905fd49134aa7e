//! The doors' key check (`src/api/api_key.rs`): any `Authorization` bytes against any key.
//!
//! Properties:
//! - a header is admitted exactly when it is `bearer` in any case, at least one space, and then
//!   the key byte for byte (nothing after it);
//! - `Bearer <key>` is always admitted, and changing any byte of the key in it never is;
//! - a key is accepted only from its alphabet and length, and never shows in `Debug`.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::api::api_key::ApiKey;

#[derive(Arbitrary, Debug)]
struct Input {
    key: String,
    header: Vec<u8>,
    flip: (u16, u8),
}

fn expected(header: &[u8], key: &[u8]) -> bool {
    if header.len() < 7 || !header[..6].eq_ignore_ascii_case(b"bearer") || header[6] != b' ' {
        return false;
    }
    let token = header[6..].trim_ascii_start();
    token == key
}

fuzz_target!(|input: Input| {
    let Ok(key) = ApiKey::parse(&input.key) else {
        let fine = input.key.len() >= 16
            && input.key.len() <= 512
            && input.key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
        assert!(!fine, "a valid key was refused: {:?}", input.key);
        return;
    };
    assert!(!format!("{key:?}").contains(key.expose()), "Debug shows the key");
    let secret = key.expose().as_bytes();
    assert_eq!(key.admits(Some(&input.header)).is_ok(), expected(&input.header, secret), "{:?}", input.header);

    let mut header = b"Bearer ".to_vec();
    header.extend_from_slice(secret);
    assert!(key.admits(Some(&header)).is_ok());
    let at = 7 + usize::from(input.flip.0) % secret.len();
    let changed = header[at] ^ input.flip.1.max(1);
    header[at] = changed;
    assert!(key.admits(Some(&header)).is_err(), "a changed key was admitted");
});
