//! Any bytes as a `.oomt` file: the reader returns records or an error, the replay and the
//! report are built from whatever was read, and nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{build, ReportOptions};

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = Trace::<Analysis>::read(data) {
        let report = build(
            &trace,
            &ReportOptions {
                top: 5,
                path: "fuzz.oomt".into(),
                symbolize: false,
            },
        );
        // The report must always serialize.
        let _ = format!("{:?}", report.findings.len());
    }
});
