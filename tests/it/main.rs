//! The single integration-test binary (STYLE.md rule 11): one module per area.

mod control_plane;
mod fixtures;
mod registry;
