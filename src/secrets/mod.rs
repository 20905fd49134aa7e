//! Secret values kept out of what leaves through tools (pure: no I/O, no async).
//!
//! - [`Redactor`]: the values the agent holds (server secrets, OAuth tokens, its own and the
//!   upstream's keys), each with where it came from and which server it was granted to. Output
//!   is redacted before a caller or the model sees it; arguments going to a server are checked
//!   for values granted elsewhere ([`Redactor::foreign_in`]).
//! - [`DetectorSet`]: opt-in patterns for credentials the agent does not hold (cloud keys, PEM
//!   private keys, JWTs), redacted the same way.
//!
//! Decisions, and why:
//! - A value is searched in every spelling an encoder in common use gives it (JSON escapes,
//!   base64 at each alignment in both alphabets, hex, percent-encodings), not only verbatim: a
//!   tool that base64-encodes a config file must not hand its token out. `spell.rs` lists the
//!   families and what is left out.
//! - One Aho-Corasick automaton over all spellings of all values, behind a skip-gram gate
//!   (`gate.rs`) that turns away a text holding none of them after looking at one window per
//!   stride: that text is the common case, and costs no allocation.
//! - Values under [`MIN_SECRET_BYTES`] are not searched: they would redact ordinary words.
//! - A replacement names the origin (`[redacted: header Authorization of github]`), never any part of
//!   the value, so a person reading output knows what was removed without learning it. No
//!   `Debug` here prints a value.
//! - Cut output (truncated to a budget) can end inside a value: [`Redactor::redact_cut`] also
//!   removes a trailing prefix of a spelling, so a cut cannot reveal a value's first bytes.
//! - On failure to build (never for realistic sizes) a redactor fails closed: it redacts every
//!   text whole, and finds a foreign value in every text.

mod detect;
mod filters;
mod gate;
mod held;
mod json;
mod redact;
mod spell;

pub use detect::Detector;
pub(crate) use detect::DetectorSet;
pub(crate) use filters::OutputFilters;
pub use held::HeldSecrets;
pub(crate) use redact::{MIN_SECRET_BYTES, Redactor, Secret};
/// For the fuzz targets' properties (`src/fuzzing.rs`).
#[cfg(feature = "fuzzing")]
pub(crate) use redact::{sanitize_origin, searched_spellings};
