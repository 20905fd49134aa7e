//! The single integration-test binary (STYLE.md rule 11): one module per area.

mod cli;
mod control_plane;
mod fixtures;
mod registry;
