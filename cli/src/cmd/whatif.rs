//! `oomtrace whatif`: the trace's tensor requests replayed through a model of PyTorch's
//! caching allocator under another `PYTORCH_CUDA_ALLOC_CONF` (docs/whatif.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use oomtrace_collector::units::fmt_bytes;
use oomtrace_collector::whatif::{self, AllocConf, ConfSource, Prediction};

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
    /// recorded setting is replayed.
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
    let prediction = whatif::predict(&args.file, &[conf])
        .map_err(|e| Failure::new(e.to_string()))?
        .pop()
        .expect("one prediction per setting");
    let mut out = Output::stdout().named("the prediction");
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut out, &prediction)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        for p in &prediction.processes {
            for w in &p.warnings {
                eprintln!("oomtrace: warning: process {}: {w}", p.pid);
            }
        }
        let _ = out.write_all(text(&prediction, args.alloc_conf.is_some()).as_bytes());
    }
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}

/// How a setting reads in a sentence.
fn setting(s: &str) -> String {
    if s.trim().is_empty() {
        "PyTorch's default allocator settings".to_string()
    } else {
        format!("PYTORCH_CUDA_ALLOC_CONF={s}")
    }
}

/// `b` against `was`, as "+1.2 GiB, +35%".
fn change(b: u64, was: u64) -> String {
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
