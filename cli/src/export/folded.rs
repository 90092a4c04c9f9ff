//! Flamegraph folded stacks (`flamegraph.pl`, inferno, speedscope):
//! `process (pid N);cuda:0 live at end;outermost;...;innermost BYTES`, one line per distinct
//! stack, sorted.
//!
//! Weights, per process and device: the bytes each call site holds at the end of the trace
//! (what `report` calls live at exit); for a device where nothing is live at the end, the
//! bytes each site held at that device's peak (its first moment at peak), so a trace that
//! freed everything still shows what filled the GPU. The second frame says which
//! (`cuda:0 live at end` / `cuda:0 at peak`); pinned host memory is its own root
//! (`pinned host ...`). Frames are function names (`module+offset` when unknown), outermost
//! first; `;` inside a name becomes `:`. A site without a stack is `[no stack]`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use super::view::{self, ProcessView, Site, Symbolizer, Trace};
use super::{device_label, frame_name, short_name, write_failed};
use crate::progress::Progress;
use crate::Failure;

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
/// trace at `path`).
pub fn write(
    path: &Path,
    scan: &Trace,
    conns: &[u32],
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    // (conn, device) -> (at peak?, holdings)
    let mut weights: BTreeMap<(u32, i16), (bool, Holdings)> = BTreeMap::new();
    let mut need_peak: HashMap<(u32, i16), u64> = HashMap::new();
    for &conn in conns {
        let p = scan.by_conn(conn)?;
        for (d, s) in p.devices() {
            if s.live_bytes > 0 {
                weights.insert((conn, d), (false, holdings(p, d)));
            } else if s.peak_bytes > 0 {
                need_peak.insert((conn, d), s.peak_bytes);
            }
        }
    }
    if !need_peak.is_empty() {
        let wanted: HashSet<u32> = need_peak.keys().map(|k| k.0).collect();
        view::replay(
            path,
            &mut |done, total| progress.update(done, total),
            |p, _| {
                if !wanted.contains(&p.conn()) {
                    return;
                }
                for (d, s) in p.devices() {
                    let key = (p.conn(), d);
                    if need_peak.get(&key) == Some(&s.live_bytes) {
                        need_peak.remove(&key);
                        weights.insert(key, (true, holdings(p, d)));
                    }
                }
            },
        )?;
        progress.end_pass();
    }

    let mut sym = Symbolizer::new();
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for ((conn, d), (at_peak, held)) in &weights {
        let p = scan.by_conn(*conn)?;
        let root = clean(&format!("{} (pid {})", short_name(p), p.pid()));
        let dev = format!(
            "{} {}",
            device_label(*d),
            if *at_peak { "at peak" } else { "live at end" }
        );
        for &(site, bytes) in held {
            let mut stack = format!("{root};{dev}");
            let frames = if site.is_none() {
                Vec::new()
            } else {
                sym.site(p, site)
            };
            if frames.is_empty() {
                stack.push_str(";[no stack]");
            }
            for f in frames.iter().rev() {
                stack.push(';');
                stack.push_str(&clean(&frame_name(f)));
            }
            *lines.entry(stack).or_default() += bytes;
        }
    }
    for (stack, bytes) in &lines {
        writeln!(out, "{stack} {bytes}").map_err(write_failed)?;
    }
    out.flush().map_err(write_failed)
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
