//! A profile's `outputFilters`, compiled once per catalog: the detectors whose findings are
//! redacted, and those whose findings refuse the whole output.

use super::{Detector, DetectorSet};
use crate::api::{FilterAction, OutputFilter};

/// See the module header.
#[derive(Debug, Default)]
pub(crate) struct OutputFilters {
    pub(crate) redact: Option<DetectorSet>,
    pub(crate) block: Option<DetectorSet>,
}

impl OutputFilters {
    pub(crate) fn new(filters: &[OutputFilter]) -> Self {
        let of = |action: FilterAction| {
            let detectors: Vec<Detector> = filters.iter().filter(|f| f.action == action).map(|f| f.detector).collect();
            (!detectors.is_empty()).then(|| DetectorSet::new(&detectors))
        };
        OutputFilters { redact: of(FilterAction::Redact), block: of(FilterAction::Block) }
    }

    /// Whether no detector is on (the default).
    pub(crate) fn is_empty(&self) -> bool {
        self.redact.is_none() && self.block.is_none()
    }
}
