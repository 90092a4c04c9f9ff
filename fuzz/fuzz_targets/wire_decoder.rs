//! Any bytes as what a traced process sends on the collector's socket (after the stream
//! header): frames decode or fail with an error, and applying the decoded frames to a
//! process's state, detectors included, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_proto::trace_file::FileHeader;
use oomtrace_proto::wire::{self, Next};

fuzz_target!(|data: &[u8]| {
    // The decoder alone, frame by frame, as the collector's connection loop drives it.
    let mut used = 0;
    while let Ok(Next::Frame(_, len)) = wire::next_frame(&data[used..]) {
        used += len;
    }
    // And through the state, as the collector applies a chunk.
    let mut trace = Trace::<Analysis>::new(FileHeader {
        version: 1,
        created_unix_ns: 0,
        producer: "fuzz".into(),
    });
    let _ = trace.apply_chunk(1, data);
    let _ = wire::check_stream_header(data);
});
