//! The rank table of a distributed job and what it says.

use super::*;

/// The rank table and what it says (`report::ranks`).
pub(super) fn ranks_text(out: &mut String, ranks: &Ranks) {
    let of = match (ranks.world_size, ranks.implausible_world_size) {
        (Some(w), _) => format!(" of {w}"),
        (None, Some(said)) => format!(
            "; world size unknown: {} is implausible (above {})",
            if said == u64::MAX {
                "a number beyond 2^64".to_string()
            } else {
                said.to_string()
            },
            oomtrace_proto::launch::MAX_WORLD_SIZE
        ),
        (None, None) => String::new(),
    };
    let _ = writeln!(out, "\nRanks ({}{of})", ranks.rows.len());
    for v in &ranks.verdicts {
        let _ = writeln!(out, "  {}", v.message);
    }
    if !ranks.missing.is_empty() {
        let missing: Vec<String> = ranks.missing.iter().map(u32::to_string).collect();
        let more = ranks
            .missing_count
            .saturating_sub(ranks.missing.len() as u64);
        let (s, more) = if more > 0 {
            ("s", format!(" and {more} more"))
        } else if ranks.missing_count > 1 {
            ("s", String::new())
        } else {
            ("", String::new())
        };
        let _ = writeln!(
            out,
            "  no trace holds {} rank{s}: {}{more}",
            ranks.missing_count,
            missing.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "  {:>5}  {:<16} {:>8}  {:>10}  {:>10}  {:>12}  findings",
        "rank", "host", "pid", "peak", "at exit", "growth/step"
    );
    for row in &ranks.rows {
        let growth = row
            .growth_bytes_per_step
            .map_or_else(|| "-".to_string(), |g| format!("+{}", fmt_bytes(g as u64)));
        let oom = if row.oom { ", OOM" } else { "" };
        let _ = writeln!(
            out,
            "  {:>5}  {:<16} {:>8}  {:>10}  {:>10}  {:>12}  {}{oom}",
            row.rank,
            if row.host.is_empty() { "?" } else { &row.host },
            row.pid,
            fmt_bytes(row.peak_bytes),
            fmt_bytes(row.live_at_exit_bytes),
            growth,
            row.findings
        );
    }
}
