//! `oomtrace whatif`: the trace's tensor requests replayed through a model of PyTorch's
//! caching allocator under another `PYTORCH_CUDA_ALLOC_CONF` (docs/whatif.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use oomtrace_collector::units::fmt_bytes;
use oomtrace_collector::whatif::{self, AllocConf, ConfSource, Prediction};
use serde::Serialize;

use crate::output::Output;
use crate::Failure;

/// Predict what PyTorch's caching allocator would reserve under another setting, and whether
/// each recorded OOM would still happen, by replaying the trace's tensor requests.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace of a PyTorch program, traced with tensors (`oomtrace run`'s default).
    #[arg(value_name = "TRACE")]
    pub file: PathBuf,
    /// The allocator setting to try, as PYTORCH_CUDA_ALLOC_CONF takes it (for example
    /// expandable_segments:True or max_split_size_mb:128); without it, each process's own
    /// recorded setting is replayed, and then the usual remedies added to it, ranked by the
    /// peak reserve each would reach.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,
    /// Print the JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let conf = match &args.alloc_conf {
        Some(s) => Some(AllocConf::parse(s).map_err(|e| Failure::new(e.to_string()))?),
        None => None,
    };
    let given = conf.is_some();
    let prediction = whatif::predict(&args.file, &[conf])
        .map_err(|e| Failure::new(e.to_string()))?
        .pop()
        .expect("one prediction per setting");
    // Without a setting asked about: the remedies, each added to the run's own, ranked.
    let tried = if given {
        Vec::new()
    } else {
        try_remedies(&args.file, &prediction)?
    };
    let mut out = Output::stdout().named("the prediction");
    if args.json {
        let doc = Document {
            prediction: &prediction,
            tried: &tried,
        };
        let _ = serde_json::to_writer_pretty(&mut out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        for p in &prediction.processes {
            for w in &p.warnings {
                eprintln!("oomtrace: warning: process {}: {w}", p.pid);
            }
        }
        let mut s = text(&prediction, given);
        s += &tried_text(&tried);
        let _ = out.write_all(s.as_bytes());
    }
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}

/// The JSON document: the prediction, and (without `--alloc-conf`) the remedies tried.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    prediction: &'a Prediction,
    #[serde(skip_serializing_if = "<[Tried]>::is_empty")]
    tried: &'a [Tried],
}

/// One remedy added to the run's own setting, replayed (`tried` in JSON, best first).
#[derive(Serialize)]
struct Tried {
    /// The remedy, as PYTORCH_CUDA_ALLOC_CONF takes it (added to the run's own setting).
    remedy: String,
    /// The peak reserves of every device, added up: with the remedy, and with the run's own
    /// setting as the same model replays it.
    peak_reserved_bytes: u64,
    baseline_peak_reserved_bytes: u64,
    /// The run's out-of-memory errors the remedy would avoid, and the new ones it would cause.
    ooms_avoided: u64,
    ooms: u64,
    new_ooms: u64,
    prediction: Prediction,
}

/// Each remedy oomtrace suggests for fragmentation, added to the run's own setting (when every
/// process ran with the same one) and replayed in one pass, best first.
fn try_remedies(file: &std::path::Path, own: &Prediction) -> Result<Vec<Tried>, Failure> {
    let mut settings = own.processes.iter().map(|p| p.alloc_conf.as_str());
    let Some(first) = settings.next() else {
        return Ok(Vec::new());
    };
    if settings.any(|s| s != first) {
        return Ok(Vec::new());
    }
    let Ok(base) = AllocConf::parse(first) else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    let mut confs = Vec::new();
    for r in oomtrace_collector::report::every_remedy() {
        if let Ok(c) = base.with(&r.alloc_conf) {
            names.push(r.alloc_conf);
            confs.push(Some(c));
        }
    }
    if confs.is_empty() {
        return Ok(Vec::new());
    }
    let predictions = whatif::predict(file, &confs).map_err(|e| Failure::new(e.to_string()))?;
    let sum = |p: &Prediction, f: &dyn Fn(&whatif::DevicePrediction) -> u64| -> u64 {
        p.processes
            .iter()
            .flat_map(|p| &p.devices)
            .fold(0u64, |acc, d| acc.saturating_add(f(d)))
    };
    let baseline = sum(own, &|d| d.peak_reserved_bytes);
    let mut tried: Vec<Tried> = names
        .into_iter()
        .zip(predictions)
        .map(|(remedy, prediction)| Tried {
            remedy,
            peak_reserved_bytes: sum(&prediction, &|d| d.peak_reserved_bytes),
            baseline_peak_reserved_bytes: baseline,
            ooms_avoided: sum(&prediction, &|d| {
                d.ooms.iter().filter(|o| !o.would_still_happen).count() as u64
            }),
            ooms: sum(&prediction, &|d| d.ooms.len() as u64),
            new_ooms: sum(&prediction, &|d| d.new_oom_count),
            prediction,
        })
        .collect();
    // Fewest new out-of-memory errors, most avoided, then the lowest peak reserve.
    tried.sort_by(|a, b| {
        a.new_ooms
            .cmp(&b.new_ooms)
            .then(b.ooms_avoided.cmp(&a.ooms_avoided))
            .then(a.peak_reserved_bytes.cmp(&b.peak_reserved_bytes))
            .then(a.remedy.cmp(&b.remedy))
    });
    Ok(tried)
}

/// The remedies tried, best first, one line each.
fn tried_text(tried: &[Tried]) -> String {
    if tried.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "settings to try, best first (each added to the run's own and replayed on this trace; \
         `--alloc-conf` for the details of one):\n",
    );
    let width = tried.iter().map(|t| t.remedy.len()).max().unwrap_or(0);
    for t in tried {
        let mut effect = format!(
            "max_memory_reserved() {} ({})",
            fmt_bytes(t.peak_reserved_bytes),
            change(t.peak_reserved_bytes, t.baseline_peak_reserved_bytes)
        );
        if t.ooms > 0 {
            effect += &format!(
                "; avoids {} of the run's {} out-of-memory error{}",
                t.ooms_avoided,
                t.ooms,
                if t.ooms == 1 { "" } else { "s" }
            );
        }
        if t.new_ooms > 0 {
            effect += &format!(
                "; {} new out-of-memory error{}",
                t.new_ooms,
                if t.new_ooms == 1 { "" } else { "s" }
            );
        }
        s += &format!("  {:<width$}  {effect}\n", t.remedy);
    }
    s
}

/// How a setting reads in a sentence.
pub(crate) fn setting(s: &str) -> String {
    if s.trim().is_empty() {
        "PyTorch's default allocator settings".to_string()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={s}")
    }
}

/// `b` against `was`, as "+1.2 GiB, +35%".
pub(crate) fn change(b: u64, was: u64) -> String {
    let (sign, d) = if b >= was {
        ('+', b - was)
    } else {
        ('-', was - b)
    };
    if was == 0 {
        return format!("{sign}{}", fmt_bytes(d));
    }
    format!(
        "{sign}{}, {sign}{:.0}%",
        fmt_bytes(d),
        d as f64 * 100.0 / was as f64
    )
}

/// The prediction in a PyTorch user's words.
fn text(pred: &Prediction, given: bool) -> String {
    let mut s = String::new();
    for p in &pred.processes {
        let conf = setting(&p.alloc_conf);
        match (given, p.alloc_conf_source) {
            (true, _) | (_, ConfSource::Given) => {
                s += &format!("process {}, with {conf}:\n", p.pid)
            }
            (false, ConfSource::Recorded) => {
                s += &format!(
                    "process {}, replayed with its own setting ({conf}), to check the model \
                     against what it really reserved:\n",
                    p.pid
                )
            }
        }
        for d in &p.devices {
            s += &format!("  cuda:{}\n", d.device);
            if let Some(cap) = d.program_cap_bytes {
                s += &format!(
                    "    under the memory cap the program set: {} \
                     (torch.cuda.set_per_process_memory_fraction, as its out-of-memory said)\n",
                    fmt_bytes(cap)
                );
            }
            s += &format!(
                "    torch.cuda.max_memory_reserved()  would be {} (the run reserved {}: {})\n",
                fmt_bytes(d.peak_reserved_bytes),
                fmt_bytes(d.recorded_peak_reserved_bytes),
                change(d.peak_reserved_bytes, d.recorded_peak_reserved_bytes)
            );
            s += &format!(
                "    torch.cuda.max_memory_allocated() would be {}\n",
                fmt_bytes(d.peak_allocated_bytes)
            );
            if d.peak_reserved_bytes > 0 && d.peak_allocated_bytes > 0 {
                s += &format!(
                    "    reserved / allocated at their peaks: {:.2}\n",
                    d.peak_reserved_bytes as f64 / d.peak_allocated_bytes as f64
                );
            }
            for o in &d.ooms {
                let verdict = if o.would_still_happen {
                    format!(
                        "would still happen ({} reserved, {} allocated",
                        fmt_bytes(o.reserved_bytes),
                        fmt_bytes(o.allocated_bytes)
                    ) + &o
                        .limit_bytes
                        .map(|l| format!(", {} available to PyTorch)", fmt_bytes(l)))
                        .unwrap_or_else(|| ")".to_string())
                } else {
                    format!(
                        "would not happen (it fits: {} reserved with it)",
                        fmt_bytes(o.reserved_bytes)
                    )
                };
                s += &format!(
                    "    CUDA out of memory at {:.2} s (tried to allocate {}): {verdict}\n",
                    o.at_s,
                    fmt_bytes(o.request_bytes)
                );
            }
            if let Some(first) = d.new_ooms.first() {
                s += &format!(
                    "    would run out of memory where the run did not: {} time{}, first at \
                     {:.2} s (tried to allocate {}, {} reserved)\n",
                    d.new_oom_count,
                    if d.new_oom_count == 1 { "" } else { "s" },
                    first.at_s,
                    fmt_bytes(first.request_bytes),
                    fmt_bytes(first.reserved_bytes)
                );
            }
            if let Some(p) = &d.past_64_bits {
                let (them, first) = if p.count == 1 {
                    ("it", "it")
                } else {
                    ("them", "the first")
                };
                s += &format!(
                    "    {} request{} would take the allocator past 2^64 - 1 bytes, which no \
                     device holds: counted as out of memory, the peaks leave {them} out \
                     ({first}: {} bytes at {:.2} s, {})\n",
                    p.count,
                    if p.count == 1 { "" } else { "s" },
                    p.request_bytes,
                    p.at_s,
                    if p.granted {
                        "which the run was granted: the trace's sizes are not a real device's"
                    } else {
                        "which the run was refused too"
                    }
                );
            }
            if d.device_total_bytes.is_none() {
                // The 64-bit bound's refusals above are the only ones it can make.
                s += if d.past_64_bits.is_some() {
                    "    (the trace never recorded the device's size: no other OOM can be \
                     predicted)\n"
                } else {
                    "    (the trace never recorded the device's size: no OOM can be predicted)\n"
                };
            }
        }
    }
    if pred.processes.is_empty() {
        s += "no process made tensor requests on a device\n";
    }
    s
}
