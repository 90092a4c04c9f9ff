//! A cheap timestamp for the hot path, converted to nanoseconds in the drain thread.
//!
//! `clock_gettime(CLOCK_MONOTONIC)` costs ~19 ns on the project's KVM guests and `rdtsc` ~2 ns
//! (research/prototype-measurements.md §3). Hooks store raw ticks; the drain thread maps them to
//! CLOCK_MONOTONIC nanoseconds with a calibration it refreshes itself, off the hot path.

/// Raw ticks: TSC on x86-64, CLOCK_MONOTONIC nanoseconds elsewhere.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Maps ticks to monotonic nanoseconds: `ns = ns0 + (ticks - t0) * rate`, with the rate
/// measured between the origin and the latest calibration point.
pub struct Calibration {
    t0: u64,
    ns0: u64,
    t1: u64,
    ns1: u64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self::new()
    }
}

impl Calibration {
    pub fn new() -> Calibration {
        let t0 = ticks();
        let ns0 = monotonic_ns();
        Calibration {
            t0,
            ns0,
            t1: t0,
            ns1: ns0,
        }
    }

    /// Takes a new calibration point; cheap enough to call every drain round.
    pub fn refresh(&mut self) {
        self.t1 = ticks();
        self.ns1 = monotonic_ns();
    }

    pub fn to_ns(&self, t: u64) -> u64 {
        if cfg!(not(target_arch = "x86_64")) {
            return t;
        }
        let dt = self.t1.wrapping_sub(self.t0);
        let dns = self.ns1.saturating_sub(self.ns0);
        if dt == 0 || dns < 1_000_000 {
            // Less than 1 ms measured: assume ~1 tick per ns until we know better (only the
            // first events of a process are stamped this way).
            return self.ns0 + t.saturating_sub(self.t0);
        }
        let elapsed = t.wrapping_sub(self.t0) as i64;
        let ns = (elapsed as i128 * dns as i128) / dt as i128;
        (self.ns0 as i128 + ns).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibrated_ticks_track_the_monotonic_clock() {
        let mut c = Calibration::new();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let t = ticks();
        let now = monotonic_ns();
        c.refresh();
        let est = c.to_ns(t);
        let err = est.abs_diff(now);
        assert!(err < 2_000_000, "estimate off by {err} ns");
    }
}
