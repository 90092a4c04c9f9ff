//! `oomtrace diff BEFORE AFTER`: what changed between two traces, call site by call site: the
//! verification loop after a fix (did the leak go away? did the peak grow?).
//!
//! Call sites are matched by their symbolized frames ([`site_key`]), never by addresses or
//! site ids, which differ from run to run; the sites of all processes of a trace are added up
//! per key and device. Findings (OOMs and detected ones) are matched by kind, device and site.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;

use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::sections::{self, site_key, site_name, SectionOptions, SiteOrder};
use oomtrace_collector::report::{self, Kind, ReportOptions};
use oomtrace_collector::units::fmt_bytes;
use serde::Serialize;

use crate::output::Output;
use crate::Failure;

/// The version of the `--json` document (fields are added, never renamed).
pub const DIFF_VERSION: u32 = 1;

/// The exit code of `--fail-on-regression` when AFTER regressed.
pub const REGRESSION_EXIT: u8 = 3;

/// A percentage threshold never counts a change smaller than this (a new 4 KiB buffer is not
/// a regression).
pub const MIN_REGRESSION_BYTES: u64 = 1 << 20;

/// Compare two traces: per call site and device, peak, live at exit and growth per step;
/// findings that appeared or disappeared.
#[derive(clap::Args)]
pub struct Args {
    /// The trace before the change.
    pub before: PathBuf,
    /// The trace after the change.
    pub after: PathBuf,
    /// Print the JSON document (version 1) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit 3 when AFTER regressed: a new leak or OOM finding, or a call site's or device's
    /// peak or live-at-exit bytes grew by more than --threshold.
    #[arg(long)]
    pub fail_on_regression: bool,
    /// How much a peak or live-at-exit may grow: a percentage (`10%`, of the BEFORE value, and
    /// at least 1 MiB) or bytes (`1048576`, `64KiB`, `2MiB`, `1GiB`).
    #[arg(long, default_value = "10%", value_name = "LIMIT")]
    pub threshold: Threshold,
    /// Call sites listed (the most changed first); regressions are looked for in all.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub top: usize,
}

/// How much growth is allowed before it counts as a regression.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Threshold {
    Percent(f64),
    Bytes(u64),
}

impl FromStr for Threshold {
    type Err = String;
    fn from_str(s: &str) -> Result<Threshold, String> {
        let bad = || format!("bad threshold {s:?} (expected e.g. 10%, 4096, 64KiB or 2MiB)");
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            return if v.is_finite() && v >= 0.0 {
                Ok(Threshold::Percent(v))
            } else {
                Err(bad())
            };
        }
        let units: [(&str, u64); 5] = [
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
            ("B", 1),
            ("", 1),
        ];
        for (suffix, scale) in units {
            if let Some(n) = t.strip_suffix(suffix) {
                let n: u64 = n.trim().parse().map_err(|_| bad())?;
                return n.checked_mul(scale).map(Threshold::Bytes).ok_or_else(bad);
            }
        }
        Err(bad())
    }
}

impl Threshold {
    /// Whether `after` grew from `before` by more than allowed.
    pub fn exceeded(self, before: u64, after: u64) -> bool {
        let grew = after.saturating_sub(before);
        match self {
            Threshold::Bytes(b) => grew > b,
            Threshold::Percent(p) => {
                grew >= MIN_REGRESSION_BYTES && grew as f64 > before as f64 * p / 100.0
            }
        }
    }
}

/// One call site (all processes of a trace added up) on one device.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SideSite {
    pub peak_bytes: u64,
    pub live_at_exit_bytes: u64,
    pub growth_per_step: f64,
    pub allocations: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SiteDiff {
    /// The site's identity across traces (its frames, innermost first).
    pub key: String,
    /// Its culprit frame, for reading.
    pub name: String,
    pub device: i16,
    /// new | gone | changed | same
    pub status: &'static str,
    pub before: Option<SideSite>,
    pub after: Option<SideSite>,
    pub peak_delta_bytes: i64,
    pub live_at_exit_delta_bytes: i64,
    pub growth_per_step_delta: f64,
    /// Its peak or live-at-exit grew beyond the threshold.
    pub regression: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceDiff {
    pub device: i16,
    pub before_peak_bytes: u64,
    pub after_peak_bytes: u64,
    pub before_live_at_exit_bytes: u64,
    pub after_live_at_exit_bytes: u64,
    pub regression: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FindingKey {
    pub kind: &'static str,
    pub device: i16,
    pub key: String,
    pub name: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct FindingsDiff {
    pub appeared: Vec<FindingKey>,
    pub disappeared: Vec<FindingKey>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Diff {
    pub version: u32,
    pub before: String,
    pub after: String,
    pub threshold: Threshold,
    pub devices: Vec<DeviceDiff>,
    /// The most changed call sites first, at most `--top`.
    pub sites: Vec<SiteDiff>,
    /// Call sites in both traces, in neither list because of `--top`: all are in the counts.
    pub sites_compared: usize,
    pub findings: FindingsDiff,
    /// Each reason AFTER counts as a regression, one sentence each.
    pub regressions: Vec<String>,
    pub regression: bool,
}

/// What one trace says, keyed for matching.
struct Side {
    sites: BTreeMap<(String, i16), (String, SideSite)>,
    devices: BTreeMap<i16, (u64, u64)>,
    findings: BTreeSet<FindingKey>,
}

fn load(path: &Path) -> Result<Side, Failure> {
    // Each error names the file, once: with two inputs, which one is wrong matters. The
    // reader's own errors name it already; only a bare format error does not.
    let trace = Trace::<Analysis>::load(path).map_err(|e| match e {
        oomtrace_collector::model::Error::Format(_) => {
            Failure::new(format!("{}: {e}", path.display()))
        }
        e => Failure::new(e.to_string()),
    })?;
    for w in report::analysis_failures(&trace) {
        eprintln!("{w}");
    }
    let mut side = Side {
        sites: BTreeMap::new(),
        devices: BTreeMap::new(),
        findings: BTreeSet::new(),
    };
    for s in sections::build(
        &trace,
        &SectionOptions {
            top: usize::MAX,
            order: SiteOrder::Peak,
            symbolize: true,
        },
    ) {
        let d = side.devices.entry(s.device).or_default();
        d.0 = d.0.saturating_add(s.totals.peak_bytes);
        d.1 = d.1.saturating_add(s.totals.live_at_exit_bytes);
        for r in s.sites {
            let e = side
                .sites
                .entry((r.key, s.device))
                .or_insert_with(|| (site_name(&r.stack), SideSite::default()));
            e.1.peak_bytes = e.1.peak_bytes.saturating_add(r.peak_bytes);
            e.1.live_at_exit_bytes = e.1.live_at_exit_bytes.saturating_add(r.live_at_exit_bytes);
            e.1.growth_per_step += r.growth_per_step;
            e.1.allocations = e.1.allocations.saturating_add(r.allocations);
        }
    }
    let report = report::build(
        &trace,
        &ReportOptions {
            top: 0,
            path: path.display().to_string(),
            symbolize: true,
        },
    );
    for f in report
        .findings
        .iter()
        .filter(|f| f.kind != Kind::LiveAtExit)
    {
        side.findings.insert(FindingKey {
            kind: f.kind.name(),
            device: f.device,
            key: site_key(&f.stack),
            name: site_name(&f.stack),
        });
    }
    Ok(side)
}

fn delta(before: u64, after: u64) -> i64 {
    (after as i128 - before as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

fn compare(before: &Side, after: &Side, args: &Args) -> Diff {
    let mut regressions = Vec::new();
    let mut sites = Vec::new();
    let keys: BTreeSet<&(String, i16)> = before.sites.keys().chain(after.sites.keys()).collect();
    for k in keys {
        let b = before.sites.get(k);
        let a = after.sites.get(k);
        let name = a.or(b).map(|(n, _)| n.clone()).unwrap_or_default();
        let (bs, as_) = (
            b.map(|(_, s)| s.clone()).unwrap_or_default(),
            a.map(|(_, s)| s.clone()).unwrap_or_default(),
        );
        let regression = args.threshold.exceeded(bs.peak_bytes, as_.peak_bytes)
            || args
                .threshold
                .exceeded(bs.live_at_exit_bytes, as_.live_at_exit_bytes);
        if regression {
            regressions.push(format!(
                "{name} on {}: peak {} -> {}, live at exit {} -> {}",
                device_name(k.1),
                fmt_bytes(bs.peak_bytes),
                fmt_bytes(as_.peak_bytes),
                fmt_bytes(bs.live_at_exit_bytes),
                fmt_bytes(as_.live_at_exit_bytes)
            ));
        }
        let status = match (b, a) {
            (None, _) => "new",
            (_, None) => "gone",
            _ if bs.peak_bytes == as_.peak_bytes
                && bs.live_at_exit_bytes == as_.live_at_exit_bytes
                && bs.allocations == as_.allocations =>
            {
                "same"
            }
            _ => "changed",
        };
        sites.push(SiteDiff {
            key: k.0.clone(),
            name,
            device: k.1,
            status,
            peak_delta_bytes: delta(bs.peak_bytes, as_.peak_bytes),
            live_at_exit_delta_bytes: delta(bs.live_at_exit_bytes, as_.live_at_exit_bytes),
            growth_per_step_delta: as_.growth_per_step - bs.growth_per_step,
            before: b.map(|_| bs),
            after: a.map(|_| as_),
            regression,
        });
    }
    let sites_compared = sites.len();
    let change = |s: &SiteDiff| {
        s.peak_delta_bytes.unsigned_abs() as u128
            + s.live_at_exit_delta_bytes.unsigned_abs() as u128
    };
    sites.sort_by(|x, y| {
        y.regression
            .cmp(&x.regression)
            .then(change(y).cmp(&change(x)))
            .then(x.key.cmp(&y.key))
    });
    sites.truncate(args.top);
    let mut devices = Vec::new();
    let dev_keys: BTreeSet<i16> = before
        .devices
        .keys()
        .chain(after.devices.keys())
        .copied()
        .collect();
    for d in dev_keys {
        let b = before.devices.get(&d).copied().unwrap_or_default();
        let a = after.devices.get(&d).copied().unwrap_or_default();
        let regression = args.threshold.exceeded(b.0, a.0) || args.threshold.exceeded(b.1, a.1);
        if regression {
            regressions.push(format!(
                "{}: peak {} -> {}, live at exit {} -> {}",
                device_name(d),
                fmt_bytes(b.0),
                fmt_bytes(a.0),
                fmt_bytes(b.1),
                fmt_bytes(a.1)
            ));
        }
        devices.push(DeviceDiff {
            device: d,
            before_peak_bytes: b.0,
            after_peak_bytes: a.0,
            before_live_at_exit_bytes: b.1,
            after_live_at_exit_bytes: a.1,
            regression,
        });
    }
    let appeared: Vec<FindingKey> = after
        .findings
        .difference(&before.findings)
        .cloned()
        .collect();
    let disappeared: Vec<FindingKey> = before
        .findings
        .difference(&after.findings)
        .cloned()
        .collect();
    for f in appeared
        .iter()
        .filter(|f| f.kind == Kind::Leak.name() || f.kind == Kind::Oom.name())
    {
        regressions.push(format!(
            "new {} finding at {} on {}",
            f.kind,
            f.name,
            device_name(f.device)
        ));
    }
    Diff {
        version: DIFF_VERSION,
        before: args.before.display().to_string(),
        after: args.after.display().to_string(),
        threshold: args.threshold,
        devices,
        sites,
        sites_compared,
        findings: FindingsDiff {
            appeared,
            disappeared,
        },
        regression: !regressions.is_empty(),
        regressions,
    }
}

fn device_name(d: i16) -> String {
    if d < 0 {
        "host (pinned)".into()
    } else {
        format!("device {d}")
    }
}

fn signed_bytes(d: i64) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", fmt_bytes(d.unsigned_abs()))
}

fn text(d: &Diff) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "oomtrace diff: {} -> {}", d.before, d.after);
    let _ = writeln!(out, "\nDevices");
    for v in &d.devices {
        let _ = writeln!(
            out,
            "  {}: peak {} -> {} ({}), live at exit {} -> {} ({}){}",
            device_name(v.device),
            fmt_bytes(v.before_peak_bytes),
            fmt_bytes(v.after_peak_bytes),
            signed_bytes(delta(v.before_peak_bytes, v.after_peak_bytes)),
            fmt_bytes(v.before_live_at_exit_bytes),
            fmt_bytes(v.after_live_at_exit_bytes),
            signed_bytes(delta(
                v.before_live_at_exit_bytes,
                v.after_live_at_exit_bytes
            )),
            if v.regression { "  REGRESSION" } else { "" }
        );
    }
    let _ = writeln!(
        out,
        "\nFindings: {} appeared, {} disappeared",
        d.findings.appeared.len(),
        d.findings.disappeared.len()
    );
    for f in &d.findings.appeared {
        let _ = writeln!(
            out,
            "  + {} at {} ({})",
            f.kind,
            f.name,
            device_name(f.device)
        );
    }
    for f in &d.findings.disappeared {
        let _ = writeln!(
            out,
            "  - {} at {} ({})",
            f.kind,
            f.name,
            device_name(f.device)
        );
    }
    let _ = writeln!(
        out,
        "\nCall sites ({} compared, most changed first)",
        d.sites_compared
    );
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
            "  {:<7} {} ({}): {} -> {}; peak {}, end {}, growth {:+.0} B/step{}",
            s.status,
            s.name,
            device_name(s.device),
            side(&s.before),
            side(&s.after),
            signed_bytes(s.peak_delta_bytes),
            signed_bytes(s.live_at_exit_delta_bytes),
            s.growth_per_step_delta,
            if s.regression { "  REGRESSION" } else { "" }
        );
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

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let before = load(&args.before)?;
    let after = load(&args.after)?;
    let diff = compare(&before, &after, &args);
    let mut out = Output::stdout().named("the diff");
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut out, &diff)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        let _ = out.write_all(text(&diff).as_bytes());
    }
    out.finish()?;
    if args.fail_on_regression && diff.regression {
        return Ok(ExitCode::from(REGRESSION_EXIT));
    }
    Ok(ExitCode::SUCCESS)
}
