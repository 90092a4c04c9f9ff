//! `oomtrace fit`: what makes the job fit, predicted from one trace: the batch scaled,
//! modules checkpointed, each with the allocator setting that serves it best (docs/fit.md).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use oomtrace_collector::fit::{DeviceFit, Fit, LeverFit, Options};
use oomtrace_collector::units::fmt_bytes;
use serde::Serialize;

use super::whatif::{change, setting};
use crate::output::Output;
use crate::simulated_gpu::DeviceMemory;
use crate::Failure;

/// Predict what makes the job fit: its peak reserve (max_memory_reserved) with the batch
/// halved, doubled and as large as fits, with the modules holding the most saved activations
/// checkpointed, and with the allocator setting that serves each best.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace of a PyTorch program, traced with tensors (`oomtrace run`'s default).
    #[arg(value_name = "TRACE")]
    pub file: PathBuf,
    /// The memory the job must fit in (1MiB to 1TiB, e.g. 24GiB); default: each device's own
    /// size as the trace recorded it.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<DeviceMemory>,
    /// The batch size the trace ran with: batches are then said in samples (the largest that
    /// fits, to one sample) instead of as multiples of the traced batch.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub batch: Option<u64>,
    /// A module call to checkpoint instead of the candidates: its class (`Block`), the call's
    /// FILE:LINE (`model.py:30`), or CLASS@FILE:LINE; may be given several times (each
    /// predicted on its own).
    #[arg(long, value_name = "MODULE")]
    pub checkpoint: Vec<String>,
    /// Print the JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_memory(text: &str) -> Result<DeviceMemory, String> {
    DeviceMemory::parse(text)
}

/// The JSON document.
#[derive(Serialize)]
struct Document<'a> {
    /// 1: fields are added, never renamed.
    version: u32,
    fit: &'a Fit,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let opts = Options {
        memory: args.memory.as_ref().map(|m| m.bytes),
        batch: args.batch,
        checkpoint: args.checkpoint.clone(),
        brief: false,
    };
    let fit = oomtrace_collector::report::fit::fit(&args.file, &opts)
        .map_err(|e| Failure::new(e.to_string()))?;
    let mut out = Output::stdout().named("the fit");
    if args.json {
        let doc = Document {
            version: 1,
            fit: &fit,
        };
        let _ = serde_json::to_writer_pretty(&mut out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        let _ = out.write_all(text(&fit).as_bytes());
    }
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}

/// One lever, one line (and a second for the setting that serves it better).
pub fn lever_line(l: &LeverFit, d: &DeviceFit) -> String {
    let at_least = if l.lower_bound { "at least " } else { "" };
    let fits = match (l.fits, d.capacity_bytes) {
        (Some(true), Some(c)) => format!("fits {}", fmt_bytes(c)),
        (Some(false), Some(c)) => format!("does not fit {}", fmt_bytes(c)),
        _ => String::new(),
    };
    let mut s = format!(
        "{}: max_memory_reserved() {at_least}{} ({}){}{fits}",
        l.name,
        fmt_bytes(l.peak_reserved_bytes),
        change(l.peak_reserved_bytes, d.replayed_peak_reserved_bytes),
        if fits.is_empty() { "" } else { ", " },
    );
    if let Some(b) = &l.best_setting {
        let what = match (b.batch, b.batch_factor) {
            (Some(n), _) => format!("a batch of {n} fits"),
            (None, Some(f)) => format!("x{f:.2} of the batch fits"),
            _ => format!(
                "{at_least}{}{}",
                fmt_bytes(b.peak_reserved_bytes),
                match b.fits {
                    Some(true) => ", fits",
                    Some(false) => ", does not fit",
                    None => "",
                }
            ),
        };
        s += &format!("; with {}: {what}", b.alloc_conf);
    }
    s
}

fn text(fit: &Fit) -> String {
    let mut s = String::new();
    for p in &fit.processes {
        for d in &p.devices {
            s += &format!(
                "process {}, cuda:{}, replayed with {}:\n",
                p.pid,
                d.device,
                setting(&p.alloc_conf)
            );
            s += &format!(
                "  the run: max_memory_reserved() {} (the replay: {})",
                fmt_bytes(d.recorded_peak_reserved_bytes),
                fmt_bytes(d.replayed_peak_reserved_bytes)
            );
            match (d.capacity_bytes, d.capacity_source) {
                (Some(c), Some("given")) => s += &format!("; to fit in {}", fmt_bytes(c)),
                (Some(c), _) => s += &format!("; the device has {}", fmt_bytes(c)),
                _ => s += "; the device's size is unknown (--memory gives one)",
            }
            if d.outside_bytes > 0 {
                s += &format!(", {} of it outside PyTorch", fmt_bytes(d.outside_bytes));
            }
            s += "\n";
            if let Some(cap) = d.program_cap_bytes {
                s += &format!(
                    "  under the memory cap the program set: {} \
                     (torch.cuda.set_per_process_memory_fraction)\n",
                    fmt_bytes(cap)
                );
            }
            let a = &d.at_peak;
            s += &format!(
                "  at the peak, {} of tensors: {} follow the batch (activations, temporaries, \
                 inputs), {} do not (parameters, gradients, optimizer state){}\n",
                fmt_bytes(a.tensor_bytes),
                fmt_bytes(a.follows_batch_bytes),
                fmt_bytes(a.fixed_bytes),
                if a.unknown_bytes > 0 {
                    format!(", {} of no known role", fmt_bytes(a.unknown_bytes))
                } else {
                    String::new()
                }
            );
            if !d.complete {
                s += "  the run ended in the step that ran out of memory: what the rest of that \
                      step needs is not in the trace, so peaks are at least these\n";
            }
            for l in &d.levers {
                s += &format!("  {}\n", lever_line(l, d));
            }
            for w in &d.withheld {
                s += &format!(
                    "  no {} prediction: {}\n",
                    w.lever.replace('_', " "),
                    w.reason
                );
            }
            if !d.checkpoint_candidates.is_empty() {
                s += "  saved activations at the peak by module call (--checkpoint to try one):\n";
                for c in &d.checkpoint_candidates {
                    s += &format!(
                        "    {:>10}  {} at {} ({} call{})\n",
                        fmt_bytes(c.saved_activation_bytes),
                        c.module,
                        c.call,
                        c.calls,
                        if c.calls == 1 { "" } else { "s" }
                    );
                }
            }
        }
    }
    if fit.processes.is_empty() {
        s += "no process made tensor requests on a device\n";
    }
    s
}
