//! Test helpers (feature `testing`).
