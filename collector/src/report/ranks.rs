//! Ranks side by side: one row per rank of a distributed job, and what the rows say together
//! (one rank leaks, all do, one uses more than the others, one ran out of memory first).
//!
//! Built from a report's processes and findings, not from the model: a report merged from
//! many traces (`oomtrace report a.oomt b.oomt`, one per node) has no single model, and the
//! same rule must hold for ranks that shared one collector and for ranks traced apart.
//!
//! A rank is a process whose launcher gave it one (`RANK`, `SLURM_PROCID`, ...). Forked
//! helpers inherit the variable (DataLoader workers), so a rank may be several processes: its
//! row is the one that held the most GPU memory, and `processes` counts them all.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Finding, Kind, Level, ProcessReport};
use crate::analysis::Confidence;
use crate::units::fmt_bytes;

/// Missing ranks listed by number (the lowest); beyond them they are only counted
/// (`missing_count`), so that a world of a million ranks with two present costs nothing.
pub const MISSING_LISTED: usize = 64;

/// A rank peaks this much above the median rank's peak (and by at least
/// [`IMBALANCE_MIN_BYTES`]) before the report calls it imbalance: ranks of one data-parallel
/// job differ by a few percent (last batch, rank-0 extras), and a quarter is past that.
pub const IMBALANCE_RATIO: f64 = 1.25;
/// ... and by at least this much: 10 MiB more on a small model is not worth a line.
pub const IMBALANCE_MIN_BYTES: u64 = 64 << 20;

#[derive(Clone, Debug, Serialize)]
pub struct Ranks {
    /// The job's size as its launcher said (the largest any rank said); null when none said,
    /// or when what was said is implausible (see `implausible_world_size`).
    pub world_size: Option<u32>,
    /// The largest world size a rank said that is not believed (above
    /// `oomtrace_proto::launch::MAX_WORLD_SIZE`); absent when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implausible_world_size: Option<u64>,
    /// One row per rank seen, by rank.
    pub rows: Vec<RankRow>,
    /// Ranks below `world_size` that no trace holds (their node's trace is missing): the
    /// lowest [`MISSING_LISTED`] of them; `missing_count` counts them all.
    pub missing: Vec<u32>,
    /// How many ranks below `world_size` no trace holds (0 when the world size is unknown).
    pub missing_count: u64,
    /// What the rows say together, most important first; never empty.
    pub verdicts: Vec<RankVerdict>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub host: String,
    pub pid: u32,
    /// Processes with this rank (the row's numbers are the one that held the most).
    pub processes: u32,
    /// GPU memory (all devices of the process, pinned host memory excluded).
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    /// Findings of this rank's processes, live-at-exit lines excluded.
    pub findings: u32,
    /// Its fastest growth per step among its leak and growth findings; null when it has none.
    pub growth_bytes_per_step: Option<f64>,
    /// It ran out of memory.
    pub oom: bool,
    /// When it first ran out of memory (Unix time, s), if it did and the trace says when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_unix_s: Option<f64>,
    pub status: String,
}

/// What the ranks say together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankPattern {
    /// Exactly one rank's memory grows; the others stay flat.
    LeakOnOneRank,
    /// Several ranks grow, not all.
    LeakOnSomeRanks,
    /// Every rank grows: the code they share leaks.
    LeakOnAllRanks,
    /// Only one rank ran out of memory.
    OomOnOneRank,
    /// Several ranks ran out of memory; this one first.
    OomFirst,
    /// One rank (or a few) holds much more than the median rank, without growing.
    Imbalance,
    /// Nothing stands out.
    Balanced,
}

#[derive(Clone, Debug, Serialize)]
pub struct RankVerdict {
    pub pattern: RankPattern,
    /// The ranks it is about (for `leak_on_all_ranks` and `balanced`: all of them).
    pub ranks: Vec<u32>,
    pub message: String,
}

/// A finding that says "this rank's memory grows": a leak (a call site's or a reallocated
/// buffer's) or a device's growth, likely or confirmed. A suspicion is not enough to single
/// out a rank.
fn grows(f: &Finding) -> bool {
    matches!(f.kind, Kind::Leak | Kind::DeviceGrowth)
        && matches!(
            f.level,
            Level::Confidence(Confidence::Likely | Confidence::Confirmed)
        )
}

/// The rank table and verdicts, or `None` when fewer than two ranks are present (nothing to
/// compare).
pub fn build(processes: &[ProcessReport], findings: &[Finding]) -> Option<Ranks> {
    let gpu_peak = |p: &ProcessReport| -> u64 {
        p.devices
            .iter()
            .filter(|d| d.memory == "device")
            .map(|d| d.peak_bytes)
            .sum()
    };
    let gpu_live = |p: &ProcessReport| -> u64 {
        p.devices
            .iter()
            .filter(|d| d.memory == "device")
            .map(|d| d.live_at_exit_bytes)
            .sum()
    };
    // Processes by rank; a pid is unique only within a trace and a host, so findings are
    // matched to processes by (rank, pid).
    let mut by_rank: BTreeMap<u32, Vec<&ProcessReport>> = BTreeMap::new();
    for p in processes {
        if let Some(r) = p.rank {
            by_rank.entry(r).or_default().push(p);
        }
    }
    if by_rank.len() < 2 {
        return None;
    }
    let world_size = processes.iter().filter_map(|p| p.world_size).max();
    let mut rows = Vec::new();
    for (&rank, procs) in &by_rank {
        let main = procs
            .iter()
            .copied()
            .max_by_key(|p| (gpu_peak(p), p.events))
            .expect("a rank has a process");
        let mine = || {
            findings
                .iter()
                .filter(move |f| f.rank == Some(rank) && procs.iter().any(|p| p.pid == f.pid))
        };
        let ooms: Vec<&Finding> = mine().filter(|f| f.kind == Kind::Oom).collect();
        // On the wall clock: ranks on different hosts have unrelated monotonic clocks.
        let oom_unix_s = ooms
            .iter()
            .filter_map(|f| f.oom.as_ref()?.unix_s)
            .reduce(f64::min);
        rows.push(RankRow {
            rank,
            local_rank: main.local_rank,
            host: main.host.clone(),
            pid: main.pid,
            processes: procs.len() as u32,
            peak_bytes: gpu_peak(main),
            live_at_exit_bytes: gpu_live(main),
            findings: mine().filter(|f| f.kind != Kind::LiveAtExit).count() as u32,
            growth_bytes_per_step: mine()
                .filter(|f| grows(f))
                .filter_map(|f| f.growth_bytes_per_step)
                .reduce(f64::max),
            oom: !ooms.is_empty(),
            oom_unix_s,
            status: main.status.clone(),
        });
    }
    let (missing, missing_count) =
        world_size.map_or((Vec::new(), 0), |w| missing_ranks(w, &by_rank));
    let verdicts = verdicts(&rows);
    Some(Ranks {
        world_size,
        implausible_world_size: processes
            .iter()
            .filter_map(|p| p.implausible_world_size)
            .max(),
        rows,
        missing,
        missing_count,
        verdicts,
    })
}

/// The lowest [`MISSING_LISTED`] ranks below `world` that `present` lacks, and how many it
/// lacks in all: O(present + listed), never O(world).
fn missing_ranks<V>(world: u32, present: &BTreeMap<u32, V>) -> (Vec<u32>, u64) {
    let below = present.range(..world).count() as u64;
    let count = u64::from(world) - below;
    let mut listed = Vec::new();
    let mut next = 0u32;
    for &r in present
        .range(..world)
        .map(|(r, _)| r)
        .chain(std::iter::once(&world))
    {
        while next < r && listed.len() < MISSING_LISTED {
            listed.push(next);
            next += 1;
        }
        if listed.len() == MISSING_LISTED {
            break;
        }
        next = r.saturating_add(1);
    }
    (listed, count)
}

/// "the other rank stays" / "the other 3 ranks stay".
fn others(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("the other rank {one}")
    } else {
        format!("the other {n} ranks {many}")
    }
}

fn list(ranks: &[u32]) -> String {
    let names: Vec<String> = ranks.iter().map(u32::to_string).collect();
    names.join(", ")
}

fn verdicts(rows: &[RankRow]) -> Vec<RankVerdict> {
    let all: Vec<u32> = rows.iter().map(|r| r.rank).collect();
    let mut out = Vec::new();

    // Out of memory: who went first is what a user of a hung or crashed job asks.
    let mut ooms: Vec<&RankRow> = rows.iter().filter(|r| r.oom).collect();
    if ooms.len() == 1 && rows.len() > 1 {
        let r = ooms[0];
        out.push(RankVerdict {
            pattern: RankPattern::OomOnOneRank,
            ranks: vec![r.rank],
            message: format!(
                "only rank {} ran out of memory (peak {}); {} not: look at what differs on \
                 rank {} (its data, its share of the model, rank-only work)",
                r.rank,
                fmt_bytes(r.peak_bytes),
                others(rows.len() - 1, "did", "did"),
                r.rank
            ),
        });
    } else if ooms.len() > 1 {
        ooms.sort_by(|a, b| {
            let t = |r: &RankRow| r.oom_unix_s.unwrap_or(f64::INFINITY);
            t(a).total_cmp(&t(b)).then(a.rank.cmp(&b.rank))
        });
        let first = ooms[0];
        let later = match (first.oom_unix_s, ooms[1].oom_unix_s) {
            (Some(a), Some(b)) => format!(", {:.2} s before rank {}", b - a, ooms[1].rank),
            _ => String::new(),
        };
        out.push(RankVerdict {
            pattern: RankPattern::OomFirst,
            ranks: ooms.iter().map(|r| r.rank).collect(),
            message: format!(
                "{} of {} ranks ran out of memory; rank {} first{later}: start from its \
                 report (the others may have failed waiting for it)",
                ooms.len(),
                rows.len(),
                first.rank
            ),
        });
    }

    // Growth.
    let growing: Vec<&RankRow> = rows
        .iter()
        .filter(|r| r.growth_bytes_per_step.is_some())
        .collect();
    let ranks_of = |v: &[&RankRow]| v.iter().map(|r| r.rank).collect::<Vec<u32>>();
    let rate = |r: &RankRow| {
        r.growth_bytes_per_step
            .map_or_else(String::new, |g| format!("+{}/step", fmt_bytes(g as u64)))
    };
    if growing.len() == rows.len() {
        out.push(RankVerdict {
            pattern: RankPattern::LeakOnAllRanks,
            ranks: all.clone(),
            message: format!(
                "every rank's memory grows ({}): the code all ranks run leaks (the training \
                 step), not one rank's extras",
                growing
                    .iter()
                    .map(|r| rate(r))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    } else if growing.len() == 1 {
        let r = growing[0];
        out.push(RankVerdict {
            pattern: RankPattern::LeakOnOneRank,
            ranks: vec![r.rank],
            message: format!(
                "only rank {} grows ({}); {} flat: look at code that runs on rank {} alone \
                 (logging, evaluation or checkpointing on one rank, data that reaches it alone)",
                r.rank,
                rate(r),
                others(rows.len() - 1, "stays", "stay"),
                r.rank
            ),
        });
    } else if !growing.is_empty() {
        out.push(RankVerdict {
            pattern: RankPattern::LeakOnSomeRanks,
            ranks: ranks_of(&growing),
            message: format!(
                "ranks {} grow, the other {} stay flat: look at what those ranks do that the \
                 others do not",
                list(&ranks_of(&growing)),
                rows.len() - growing.len()
            ),
        });
    }

    // Imbalance: peaks far above the median, on ranks that do not grow (growth explains
    // itself above).
    let mut peaks: Vec<u64> = rows.iter().map(|r| r.peak_bytes).collect();
    peaks.sort_unstable();
    let median = peaks[(peaks.len() - 1) / 2];
    let heavy: Vec<&RankRow> = rows
        .iter()
        .filter(|r| r.growth_bytes_per_step.is_none())
        .filter(|r| {
            r.peak_bytes as f64 > median as f64 * IMBALANCE_RATIO
                && r.peak_bytes.saturating_sub(median) >= IMBALANCE_MIN_BYTES
        })
        .collect();
    if !heavy.is_empty() {
        let worst = heavy
            .iter()
            .max_by_key(|r| r.peak_bytes)
            .expect("not empty");
        out.push(RankVerdict {
            pattern: RankPattern::Imbalance,
            ranks: ranks_of(&heavy),
            message: format!(
                "imbalance: rank{} {} peak{} at up to {} ({:.0}% above the median rank's {}) \
                 without growing: uneven work per rank (sharding, batch sizes, rank-0 extras)",
                if heavy.len() > 1 { "s" } else { "" },
                list(&ranks_of(&heavy)),
                if heavy.len() > 1 { "" } else { "s" },
                fmt_bytes(worst.peak_bytes),
                (worst.peak_bytes as f64 / median.max(1) as f64 - 1.0) * 100.0,
                fmt_bytes(median)
            ),
        });
    }
    if out.is_empty() {
        let max = peaks.last().copied().unwrap_or(0);
        out.push(RankVerdict {
            pattern: RankPattern::Balanced,
            ranks: all,
            message: format!(
                "{} ranks, none grows, peaks within {:.0}% of the median ({})",
                rows.len(),
                (max as f64 / median.max(1) as f64 - 1.0) * 100.0,
                fmt_bytes(median)
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(rank: u32, peak_mib: u64, growth: Option<f64>, oom: Option<f64>) -> RankRow {
        RankRow {
            rank,
            local_rank: Some(rank % 2),
            host: format!("node{}", rank / 2),
            pid: 100 + rank,
            processes: 1,
            peak_bytes: peak_mib << 20,
            live_at_exit_bytes: 0,
            findings: 0,
            growth_bytes_per_step: growth,
            oom: oom.is_some(),
            oom_unix_s: oom,
            status: "exited".into(),
        }
    }

    fn patterns(rows: &[RankRow]) -> Vec<(RankPattern, Vec<u32>)> {
        verdicts(rows)
            .into_iter()
            .map(|v| (v.pattern, v.ranks))
            .collect()
    }

    #[test]
    fn missing_ranks_are_counted_and_the_first_listed() {
        let present: BTreeMap<u32, ()> = [(0, ()), (2, ()), (5, ())].into_iter().collect();
        assert_eq!(missing_ranks(6, &present), (vec![1, 3, 4], 3));
        assert_eq!(missing_ranks(3, &present), (vec![1], 1));
        let (listed, count) = missing_ranks(1 << 20, &present);
        assert_eq!(count, (1 << 20) - 3);
        assert_eq!(listed.len(), MISSING_LISTED);
        assert_eq!(&listed[..4], &[1, 3, 4, 6]);
        let two: BTreeMap<u32, ()> = [(0, ()), (1, ())].into_iter().collect();
        assert_eq!(missing_ranks(2, &two), (vec![], 0));
    }

    #[test]
    fn one_rank_growing_is_named() {
        let rows = [
            row(0, 500, None, None),
            row(1, 900, Some(4e6), None),
            row(2, 500, None, None),
            row(3, 500, None, None),
        ];
        // Rank 1 is far above the median too, but its growth says why: no imbalance line.
        assert_eq!(patterns(&rows), [(RankPattern::LeakOnOneRank, vec![1])]);
    }

    #[test]
    fn all_some_and_none_growing() {
        let all = [row(0, 500, Some(1e6), None), row(1, 500, Some(1e6), None)];
        assert_eq!(patterns(&all), [(RankPattern::LeakOnAllRanks, vec![0, 1])]);
        let some = [
            row(0, 500, Some(1e6), None),
            row(1, 500, Some(1e6), None),
            row(2, 500, None, None),
        ];
        assert_eq!(
            patterns(&some),
            [(RankPattern::LeakOnSomeRanks, vec![0, 1])]
        );
        let none = [row(0, 500, None, None), row(1, 520, None, None)];
        assert_eq!(patterns(&none), [(RankPattern::Balanced, vec![0, 1])]);
    }

    #[test]
    fn imbalance_needs_both_ratio_and_bytes() {
        let heavy = [
            row(0, 1000, None, None),
            row(1, 500, None, None),
            row(2, 500, None, None),
        ];
        assert_eq!(patterns(&heavy), [(RankPattern::Imbalance, vec![0])]);
        // 50% more, but only 30 MiB: balanced.
        let small = [row(0, 90, None, None), row(1, 60, None, None)];
        assert_eq!(patterns(&small)[0].0, RankPattern::Balanced);
    }

    #[test]
    fn the_first_oom_is_named() {
        let rows = [
            row(0, 500, None, Some(1000.5)),
            row(1, 500, None, Some(1000.1)),
            row(2, 500, None, None),
        ];
        let v = verdicts(&rows);
        assert_eq!(v[0].pattern, RankPattern::OomFirst);
        assert_eq!(v[0].ranks, [1, 0]);
        assert!(
            v[0].message.contains("rank 1 first, 0.40 s before rank 0"),
            "{}",
            v[0].message
        );
        let one = [row(0, 500, None, None), row(1, 700, None, Some(5.0))];
        assert_eq!(patterns(&one)[0], (RankPattern::OomOnOneRank, vec![1]));
    }
}
