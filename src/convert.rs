//! Conversion from the file-based registry format.
