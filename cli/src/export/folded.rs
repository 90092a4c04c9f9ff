//! Flamegraph folded stacks (`flamegraph.pl`, inferno, speedscope):
//! `cuda:0 live at end;process (pid N);outermost;...;innermost BYTES`, one line per distinct
//! stack, sorted.
//!
//! Each kind of memory is its own root, so a flame graph never sums device memory and pinned
//! host memory into one bar: `cuda:N ...` per GPU, `pinned host ...` for pinned host memory.
//! The root also says which moment the weights are from; the process is the second frame.
//!
//! Weights, per process and device: the bytes each call site holds at one moment, chosen by
//! `--at` ([`Moment`]):
//! - `end`: at the end of the trace (what `report` calls live at exit): `... live at end`.
//! - `peak`: at the device's peak of tracked live bytes (its first moment at peak):
//!   `... at peak`.
//! - `oom`: just before the process's first out-of-memory failure, on the failing device
//!   (the failed request is not in it): `... at OOM`. Processes without one are left out.
//! - no `--at`: `end` for a device where something is live at the end, else `peak`, so a
//!   trace that freed everything still shows what filled the GPU.
//!
//! Frames, outermost first: `function (file:line)` when the file and line are known (native
//! and Python frames alike; the file without its directory, as `report` shows it), else the
//! function, else `module+offset`. Process start-up frames (`_start`, `__libc_start_main*`,
//! `__libc_start_call_main`) are dropped: every stack has them. `;` inside a name becomes `:`.
//! A site without a stack is `[no stack]`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use oomtrace_proto::EventKind;

use super::view::{self, Frame, ProcessView, Seen, Site, Symbolizer, Trace, OUT_OF_MEMORY};
use super::{device_label, frame_name, short_name, write_failed};
use crate::progress::Progress;
use crate::Failure;

/// The moment whose holdings weigh the stacks (`export --at`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Moment {
    /// Each device's peak of tracked live bytes.
    Peak,
    /// Just before the process's first out-of-memory failure.
    Oom,
    /// The end of the trace.
    End,
}

impl Moment {
    /// How the root frame names it.
    fn label(self) -> &'static str {
        match self {
            Moment::Peak => "at peak",
            Moment::Oom => "at OOM",
            Moment::End => "live at end",
        }
    }
}

/// (site, bytes) held on one device.
type Holdings = Vec<(Site, u64)>;

fn holdings(p: ProcessView<'_>, device: i16) -> Holdings {
    let mut v: Holdings = p
        .live_by_site(device)
        .filter(|&(_, bytes)| bytes > 0)
        .collect();
    v.sort_unstable();
    v
}

/// Writes the folded stacks of the processes on connections `conns` (of `scan`, the replayed
/// trace at `path`), weighted at `at` (`None`: the end, or the peak where nothing is live at
/// the end).
pub fn write(
    path: &Path,
    scan: &Trace,
    conns: &[u32],
    at: Option<Moment>,
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    // (conn, device) -> (moment, holdings)
    let mut weights: BTreeMap<(u32, i16), (Moment, Holdings)> = BTreeMap::new();
    let mut need_peak: HashMap<(u32, i16), u64> = HashMap::new();
    let mut need_oom: HashSet<u32> = HashSet::new();
    for &conn in conns {
        let p = scan.by_conn(conn)?;
        match at {
            Some(Moment::Oom) => {
                need_oom.insert(conn);
            }
            Some(Moment::End) => {
                for (d, _) in p.devices().filter(|(_, s)| s.live_bytes > 0) {
                    weights.insert((conn, d), (Moment::End, holdings(p, d)));
                }
            }
            Some(Moment::Peak) => {
                for (d, s) in p.devices().filter(|(_, s)| s.peak_bytes > 0) {
                    need_peak.insert((conn, d), s.peak_bytes);
                }
            }
            None => {
                for (d, s) in p.devices() {
                    if s.live_bytes > 0 {
                        weights.insert((conn, d), (Moment::End, holdings(p, d)));
                    } else if s.peak_bytes > 0 {
                        need_peak.insert((conn, d), s.peak_bytes);
                    }
                }
            }
        }
    }
    if !need_peak.is_empty() || !need_oom.is_empty() {
        let wanted: HashSet<u32> = need_peak
            .keys()
            .map(|k| k.0)
            .chain(need_oom.clone())
            .collect();
        view::replay(
            path,
            &mut |done, total| progress.update(done, total),
            |p, seen| {
                if !wanted.contains(&p.conn()) {
                    return;
                }
                // `p` is the state before `seen`: before the failure, at the peak once an
                // event brought the device there.
                if let Seen::Event { event: ev, .. } = seen {
                    let oom = ev.kind() == Some(EventKind::AllocFailed)
                        && ev.result == OUT_OF_MEMORY
                        && ev.device >= 0;
                    if oom && need_oom.remove(&p.conn()) {
                        let key = (p.conn(), ev.device);
                        weights.insert(key, (Moment::Oom, holdings(p, ev.device)));
                    }
                }
                if need_peak.is_empty() {
                    return;
                }
                for (d, s) in p.devices() {
                    let key = (p.conn(), d);
                    if need_peak.get(&key) == Some(&s.live_bytes) {
                        need_peak.remove(&key);
                        weights.insert(key, (Moment::Peak, holdings(p, d)));
                    }
                }
            },
        )?;
        progress.end_pass();
        // A peak the last event reached shows only in the final state.
        for (conn, d) in need_peak.into_keys() {
            let p = scan.by_conn(conn)?;
            weights.insert((conn, d), (Moment::Peak, holdings(p, d)));
        }
        if at == Some(Moment::Oom) && weights.is_empty() {
            return Err(Failure::new(format!(
                "--at oom: no out-of-memory failure on a GPU in {}",
                path.display()
            )));
        }
    }

    let mut sym = Symbolizer::new();
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for ((conn, d), (moment, held)) in &weights {
        let p = scan.by_conn(*conn)?;
        let root = format!("{} {}", device_label(*d), moment.label());
        let process = clean(&format!("{} (pid {})", short_name(p), p.pid()));
        for &(site, bytes) in held {
            let mut stack = format!("{root};{process}");
            let frames = if site.is_none() {
                Vec::new()
            } else {
                sym.site(p, site)
            };
            if frames.is_empty() {
                stack.push_str(";[no stack]");
            }
            // A backward-pass site under its name (its forward line), as reports name it:
            // the autograd thread's own frames say nothing of the line that made it.
            if let Some(b) = sym.backward(p, &frames) {
                stack.push(';');
                stack.push_str(&clean(&b.name));
            }
            for f in frames.iter().rev().filter(|f| !start_up(f)) {
                stack.push(';');
                stack.push_str(&clean(&folded_frame(f)));
            }
            *lines.entry(stack).or_default() += bytes;
        }
    }
    for (stack, bytes) in &lines {
        writeln!(out, "{stack} {bytes}").map_err(write_failed)?;
    }
    out.flush().map_err(write_failed)
}

/// A frame as the folded text names it: `function (file:line)` when both are known.
fn folded_frame(f: &Frame) -> String {
    let name = frame_name(f);
    if f.function.is_empty() || f.file.is_empty() || f.line == 0 {
        return name;
    }
    let file = Path::new(&f.file)
        .file_name()
        .map_or_else(|| f.file.clone(), |n| n.to_string_lossy().into_owned());
    format!("{name} ({file}:{})", f.line)
}

/// The C library's process start-up, below `main` in every native stack.
fn start_up(f: &Frame) -> bool {
    !f.python
        && (f.function == "_start"
            || f.function == "__libc_start_call_main"
            || f.function.starts_with("__libc_start_main"))
}

/// A frame as folded text allows it: no `;`, no line breaks.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' | '\t' => ' ',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: function.into(),
            file: file.into(),
            line,
            ..Frame::default()
        }
    }

    #[test]
    fn frames_carry_their_line_and_start_up_frames_are_known() {
        assert_eq!(
            folded_frame(&frame("keep", "/src/a.c", 12)),
            "keep (a.c:12)"
        );
        assert_eq!(folded_frame(&frame("keep", "", 0)), "keep");
        let mut py = frame("Model.forward", "/src/train.py", 40);
        py.python = true;
        assert_eq!(folded_frame(&py), "Model.forward (train.py:40)");
        for f in [
            "_start",
            "__libc_start_main",
            "__libc_start_main_impl",
            "__libc_start_call_main",
        ] {
            assert!(start_up(&frame(f, "", 0)), "{f}");
        }
        assert!(!start_up(&frame("main", "", 0)));
        assert!(!start_up(&py));
    }
}
