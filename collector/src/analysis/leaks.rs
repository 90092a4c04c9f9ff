//! What the other growth detectors may ask the leak detector ([`super::growth`]), and
//! nothing more: the read-only view that [`super::Analysis`] hands to
//! [`super::site_growth`] and [`super::device_growth`] at each epoch boundary, so that they
//! read its generations and findings without knowing its struct. This file names no detector.

use crate::model::SiteId;

/// Live bytes and allocations of one call site on one device that were born in a range of
/// epochs: what made a device grow over a trend window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrewAt {
    pub site: SiteId,
    pub bytes: u64,
    pub count: u64,
}

/// The leak detector, read only.
pub trait Leaks {
    /// The sites' allocations on `device` that were born in epochs `from..=upto` and are still
    /// live, largest first. O(sites): read once per epoch, and only while a device grows.
    fn born_between(&self, device: i16, from: u32, upto: u32) -> Vec<GrewAt>;

    /// The leaks reported on `device` now: how many, and the sum of their slopes (bytes per
    /// step), to tell whether they explain a device's growth.
    fn leaks_on(&self, device: i16) -> (u32, f64);

    /// Whether the site has a finding here (a leak, or growth that was one): the site-growth
    /// detector then stays silent about it (one finding per site).
    fn reported(&self, site: SiteId, device: i16) -> bool;

    /// Distinct birth epochs in `from..=upto` among the site's live allocations.
    fn generations(&self, site: SiteId, device: i16, from: u32, upto: u32) -> u32;
}
