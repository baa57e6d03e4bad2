//! What stream to generate: [`LoadSpec`] and its ranges.

use snapshot_receiver::Limits;

/// What stream to generate. Rates are fractions in `[0, 1)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSpec {
    /// Known objects, created before the run at version 0.
    pub objects: usize,
    /// Events per known object when `deliveries` is `None` (versions 1..=n).
    pub versions: u64,
    /// Exact number of deliveries; when set, events pick a uniformly random
    /// object each, so objects get about `deliveries / objects` versions.
    pub deliveries: Option<usize>,
    /// Fraction of deliveries that are redeliveries of an earlier event.
    pub duplicate_rate: f64,
    /// How far (in positions) a delivery may move from its natural place; a
    /// redelivery or variant lands up to `reorder_window + 64` positions after
    /// its original before that.
    pub reorder_window: usize,
    /// Fraction of events on known objects that also get a conflicting variant
    /// (same `event_id`, different state).
    pub variant_rate: f64,
    /// Fraction of those variants that name another known object than
    /// their event's own content does, at a version no other event carries
    /// (the variant of object A's version-`v` event names object B). Both
    /// objects end paused: whichever of the two records comes second pauses
    /// the object the first named too. 0 by default, so the streams of the
    /// other settings (and their figures) stay as they were.
    pub cross_variant_rate: f64,
    /// Fraction of known objects that get an equal-version conflict: a second
    /// event at their highest version with a different state.
    pub conflict_rate: f64,
    /// Fraction of events that name an object the receiver does not know.
    pub unknown_rate: f64,
    /// Target body size in bytes (the state is padded to reach it).
    pub payload_bytes: usize,
    /// Seed of the generator: the same spec and seed give the same bytes.
    pub seed: u64,
}

impl Default for LoadSpec {
    fn default() -> Self {
        Self {
            objects: 10_000,
            versions: 20,
            deliveries: None,
            duplicate_rate: 0.3,
            reorder_window: 64,
            variant_rate: 0.001,
            cross_variant_rate: 0.0,
            conflict_rate: 0.001,
            unknown_rate: 0.001,
            payload_bytes: 250,
            seed: 1,
        }
    }
}

/// A [`LoadSpec`] value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid load spec: {0}")]
pub struct SpecError(pub String);

impl LoadSpec {
    /// Checks the ranges: at least one object, rates in `[0, 1)`, at least one
    /// version or delivery.
    ///
    /// # Errors
    /// A [`SpecError`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.objects == 0 {
            return Err(SpecError("objects must be at least 1".into()));
        }
        if self.objects > u32::MAX as usize / 2 {
            return Err(SpecError("too many objects".into()));
        }
        if self.payload_bytes > Limits::default().max_body_bytes {
            return Err(SpecError(format!(
                "payload must be at most {} bytes (the receiver's default body limit), got {}",
                Limits::default().max_body_bytes,
                self.payload_bytes
            )));
        }
        for (name, rate) in [
            ("duplicate rate", self.duplicate_rate),
            ("variant rate", self.variant_rate),
            ("cross-object variant rate", self.cross_variant_rate),
            ("conflict rate", self.conflict_rate),
            ("unknown rate", self.unknown_rate),
        ] {
            if !(0.0..1.0).contains(&rate) {
                return Err(SpecError(format!("{name} must be in [0, 1), got {rate}")));
            }
        }
        match self.deliveries {
            Some(0) => Err(SpecError("deliveries must be at least 1".into())),
            Some(d) if d > u32::MAX as usize => Err(SpecError("too many deliveries".into())),
            None if self.versions == 0 => Err(SpecError("versions must be at least 1".into())),
            None if (self.objects as u128) * (self.versions as u128) > u32::MAX as u128 / 2 => {
                Err(SpecError("objects x versions is too large".into()))
            }
            _ => Ok(()),
        }
    }
}
