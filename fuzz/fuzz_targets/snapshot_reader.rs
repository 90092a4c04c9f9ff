//! Any bytes as a PyTorch memory snapshot: the pickle reader returns values or an error, the
//! conversion a trace or a sentence, the trace reads back and its report is built, and
//! nothing panics or runs away (a pickle's memo and nesting cost what its bytes cost).
#![no_main]

use libfuzzer_sys::fuzz_target;
use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{build, ReportOptions};
use oomtrace_collector::snapshot;

fuzz_target!(|data: &[u8]| {
    let Ok(converted) = snapshot::convert(data, "fuzz.pickle") else {
        return;
    };
    // What the converter writes is always a trace this build reads.
    let trace = Trace::<Analysis>::read(converted.trace.as_slice())
        .expect("a converted snapshot is a readable trace");
    let report = build(
        &trace,
        &ReportOptions {
            top: 5,
            path: "fuzz.pickle".into(),
            symbolize: false,
        },
    );
    let _ = format!("{:?}", report.findings.len());
});
