//! Command-line interfaces of the two binaries.
