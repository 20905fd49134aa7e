//! A skip-gram gate in front of the automaton: whether a text can hold any spelling at all,
//! answered by looking at one short window of bytes in every stride instead of at every byte.
//!
//! Why: tool output is mostly words, numbers and base64-looking runs, where the Aho-Corasick
//! crate's prefilter finds candidates at nearly every position and scanned at ~110 MB/s, and its
//! DFA without a prefilter at ~500 MB/s; both are most of a small call's cost. Every spelling is at
//! least `shortest` bytes long, so any occurrence covers `shortest - q + 1` consecutive window
//! starts, one of which is a multiple of the stride: probing only those windows, against the set of
//! every q-byte window a spelling has in its first `shortest` bytes, misses no occurrence (the
//! Wu-Manber idea, used here as a yes/no gate). A probe that hits sends the whole text to the
//! automaton, so the gate decides speed only, never what is found.
//!
//! The set is exact (sorted `u64` windows), so ordinary text almost never hits by chance; a bitmap
//! of their hashes (32 KiB) turns most probes away before the binary search. Past [`MAX_WINDOWS`]
//! (a PEM key's spellings, or hundreds of tokens) the gate is off and every text goes to the
//! automaton.

/// Windows in the set past which the gate is not built: the bitmap would be a quarter ones, and
/// the set 512 KiB.
const MAX_WINDOWS: usize = 1 << 16;
const BITMAP_BITS: usize = 1 << 18;

pub(super) struct Gate {
    /// Window length in bytes (4 to 8).
    q: usize,
    /// Distance between probes: `shortest - q + 1`.
    stride: usize,
    bitmap: Box<[u64]>,
    windows: Box<[u64]>,
}

impl Gate {
    /// None when a gate would not pay (a short spelling, or too many windows).
    pub(super) fn new<'a>(spellings: impl Iterator<Item = &'a [u8]> + Clone) -> Option<Gate> {
        let shortest = spellings.clone().map(<[u8]>::len).min()?;
        // Longer windows hit less by chance; shorter ones stride further. Half the shortest
        // spelling, within 4..=8 bytes, balances the two (shortest 8: q 4, stride 5; 35: q 8, stride 28).
        let q = (shortest / 2).clamp(4, 8);
        if shortest < q {
            return None;
        }
        let stride = shortest - q + 1;
        let mut windows: Vec<u64> = spellings.flat_map(|s| s[..shortest].windows(q).map(load)).collect();
        windows.sort_unstable();
        windows.dedup();
        if windows.len() > MAX_WINDOWS {
            return None;
        }
        let mut bitmap = vec![0u64; BITMAP_BITS / 64].into_boxed_slice();
        for &w in &windows {
            let h = hash(w);
            bitmap[h / 64] |= 1 << (h % 64);
        }
        Some(Gate { q, stride, bitmap, windows: windows.into_boxed_slice() })
    }

    /// False only when `text` holds no spelling.
    pub(super) fn may_match(&self, text: &[u8]) -> bool {
        let mut at = 0;
        while at + self.q <= text.len() {
            let w = load(&text[at..at + self.q]);
            let h = hash(w);
            if self.bitmap[h / 64] & (1 << (h % 64)) != 0 && self.windows.binary_search(&w).is_ok() {
                return true;
            }
            at += self.stride;
        }
        false
    }
}

/// Up to 8 bytes as an integer (zero-extended: all windows of one gate have the same length).
fn load(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(buf)
}

/// A bitmap index: the top 18 bits of a multiplicative (Fibonacci) hash.
fn hash(w: u64) -> usize {
    (w.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITMAP_BITS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(spellings: &[&str]) -> Gate {
        Gate::new(spellings.iter().map(|s| s.as_bytes())).expect("a gate")
    }

    #[test]
    fn an_occurrence_at_every_offset_and_length_is_let_through() {
        let spellings = ["ghp_K7v2LxQ9mZ4tR8wY1nB6cD3fH5jS0aP", "Z2hwX0s3djJMeFE5bVo0dFI4", "password"];
        let g = gate(&spellings);
        for spelling in spellings {
            for before in 0..40 {
                for after in 0..3 {
                    let text = format!("{}{spelling}{}", ".".repeat(before), "-".repeat(after));
                    assert!(g.may_match(text.as_bytes()), "{spelling} after {before} bytes");
                }
            }
        }
    }

    #[test]
    fn ordinary_text_is_turned_away() {
        let g = gate(&["ghp_K7v2LxQ9mZ4tR8wY1nB6cD3fH5jS0aP"]);
        let text = "the server returned 12 rows: id token config path value error ".repeat(50);
        assert!(!g.may_match(text.as_bytes()));
        assert!(!g.may_match(b""));
        assert!(!g.may_match(b"ghp_K7v"), "shorter than any spelling");
    }

    #[test]
    fn too_many_windows_build_no_gate() {
        // Five windows of each spelling hold all of its five-digit number: 100,000 in all.
        let many: Vec<String> = (0..20_000).map(|i| format!("{i:08}abcdefgh")).collect();
        assert!(Gate::new(many.iter().map(|s| s.as_bytes())).is_none());
        assert!(Gate::new(std::iter::empty::<&[u8]>()).is_none());
    }
}
