//! Live output: one line on stderr per new finding, upgrade, downgrade or resolution, as the
//! detectors raise them (`oomtrace run`, `oomtrace collect`). Concise on purpose: the report
//! has the stacks and the evidence.

use crate::detect::{fmt_rate, Alert, Change};
use crate::report::fmt_bytes;
use crate::state::Process;
use crate::symbolize::{culprit, FrameInfo, StackSymbolizer};

/// "history_append (leak_history.c:12)", or the module and offset without symbols.
fn place(frames: &[FrameInfo]) -> Option<String> {
    let f = culprit(frames)?;
    let file = f.file.rsplit('/').next().unwrap_or("");
    Some(match (f.function.is_empty(), file.is_empty()) {
        (false, false) if f.line > 0 => format!("{} ({file}:{})", f.function, f.line),
        (false, _) => f.function.clone(),
        _ => format!(
            "{}+{}",
            f.module.rsplit('/').next().unwrap_or("?"),
            f.offset
        ),
    })
}

pub fn line(p: &Process, a: &Alert, sym: &mut StackSymbolizer) -> String {
    let f = &a.finding;
    let tag = match (a.change, f.kind) {
        (Change::Resolved, _) => "resolved".to_string(),
        (Change::Downgraded, _) => "downgraded: bounded growth".to_string(),
        (_, "leak") => format!("{} leak", f.level.name()),
        (_, kind) => format!("{kind} {}", f.level.name()),
    };
    let mut text = format!("oomtrace: [{tag}] pid {} ", p.pid());
    if f.device >= 0 {
        text.push_str(&format!("device {}, step {}: ", f.device, a.epoch));
    } else {
        text.push_str(&format!("pinned host, step {}: ", a.epoch));
    }
    match (f.kind, f.growth_bytes_per_step) {
        ("leak", Some(rate)) => text.push_str(&format!(
            "{}, {} held",
            fmt_rate(rate, f.growth_bytes_per_s),
            fmt_bytes(f.bytes)
        )),
        _ => text.push_str(&f.message),
    }
    if f.site.0 != 0 {
        if let Some(at) = place(&sym.site(p, f.site)) {
            text.push_str(" at ");
            text.push_str(&at);
        }
    }
    text
}
