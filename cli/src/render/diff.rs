//! `oomtrace diff`'s text.

use super::*;

/// A change in bytes with its sign: `+1.00 MiB`, `-4.00 KiB`.
pub(super) fn signed_bytes(d: i64) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(d.unsigned_abs()))
}

/// `oomtrace diff`'s text.
pub fn diff(d: &Diff) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace diff: {} -> {}", d.before, d.after);
    for (side, work) in [("BEFORE", &d.before_work), ("AFTER", &d.after_work)] {
        if let Some(sim) = &work.simulated {
            let _ = writeln!(out, "  ({side} {})", simulated_words(sim));
        }
    }
    let _ = writeln!(out, "\nDevices");
    for v in &d.devices {
        let _ = writeln!(
            out,
            "  {}: peak {} -> {} ({}), live at exit {} -> {} ({}){}",
            device_name(v.device),
            fmt_bytes(v.before_peak_bytes),
            fmt_bytes(v.after_peak_bytes),
            signed_bytes(diff_delta(v.before_peak_bytes, v.after_peak_bytes)),
            fmt_bytes(v.before_live_at_exit_bytes),
            fmt_bytes(v.after_live_at_exit_bytes),
            signed_bytes(diff_delta(
                v.before_live_at_exit_bytes,
                v.after_live_at_exit_bytes
            )),
            if v.regression { "  REGRESSION" } else { "" }
        );
    }
    if let Some(why) = &d.not_compared {
        let _ = writeln!(out, "  {why}");
    }
    let _ = writeln!(
        out,
        "\nFindings: {} appeared, {} disappeared",
        d.findings.appeared.len(),
        d.findings.disappeared.len()
    );
    for f in &d.findings.appeared {
        let _ = writeln!(out, "  + {} {}", f.kind, f.place());
    }
    for f in &d.findings.disappeared {
        let _ = writeln!(out, "  - {} {}", f.kind, f.place());
    }
    for f in &d.findings.unmatched {
        let _ = writeln!(
            out,
            "  ? {} {}: in one trace only, in an unmatched module",
            f.kind,
            f.place()
        );
    }
    let _ = writeln!(
        out,
        "\nCall sites ({} compared, most changed first)",
        d.sites_compared
    );
    for m in &d.unmatched_modules {
        let _ = writeln!(
            out,
            "  {m} is not the same build in both traces and could not be symbolized in one: \
             its call sites are unmatched, neither gone nor new"
        );
    }
    for s in &d.sites {
        let side = |x: &Option<SideSite>| {
            x.as_ref().map_or("-".to_string(), |x| {
                format!(
                    "peak {} end {}",
                    fmt_bytes(x.peak_bytes),
                    fmt_bytes(x.live_at_exit_bytes)
                )
            })
        };
        let _ = writeln!(
            out,
            "  {:<7} {} ({}): {} -> {}; peak {}, end {}, growth {}{}",
            s.status,
            row_label(&s.name, s.held, s.tells_apart.as_deref()),
            device_name(s.device),
            side(&s.before),
            side(&s.after),
            signed_bytes(s.peak_delta_bytes),
            signed_bytes(s.live_at_exit_delta_bytes),
            fmt_rate(s.growth_per_step_delta, None),
            if s.regression { "  REGRESSION" } else { "" }
        );
    }
    if !d.improvements.is_empty() {
        let _ = writeln!(out, "\nImprovements ({})", d.improvements.len());
        for i in &d.improvements {
            let _ = writeln!(out, "  {i}");
        }
    }
    if d.regression {
        let _ = writeln!(out, "\nRegressions ({})", d.regressions.len());
        for r in &d.regressions {
            let _ = writeln!(out, "  {r}");
        }
    } else {
        let _ = writeln!(out, "\nNo regression.");
    }
    out
}
