//! Registry: what exists now, as immutable snapshots published by a source.
