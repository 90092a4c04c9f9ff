//! Golden files: `fixtures/v2-writer.oomt` is the trace today's writer makes of the encoders
//! below (version 2: its chunk the LZ4 of the frames' word delta), `fixtures/v1-writer.oomt`
//! the same trace as the last version-1 writer made it (its chunk plain), `fixtures/v1-basic.oomt`
//! as the first version-1 writer made it (before the Hello's tail: host and launcher
//! variables), and `fixtures/v1-basic.json` the report read back from all three. Only today's
//! file is ever rewritten. If the writer's bytes change, or the reader or report interpret
//! older bytes differently, these fail: bump the format version instead of silently changing
//! what old traces mean.
//!
//! Regenerate after an intended change (the frozen file stays):
//! `UPDATE_GOLDEN=1 cargo test -p oomtrace-collector --test golden`.

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{build, ReportOptions};
use oomtrace_proto::trace_file as tf;
use oomtrace_proto::wire::{encode, GoodbyeReason, Hello, Lost, ModuleDef};
use oomtrace_proto::{Api, Event, EventKind, StackId};

const MIB: u64 = 1 << 20;

fn ev(kind: EventKind, api: Api, seq: u64, ptr: u64, size: u64, stack: u32) -> Event {
    let mut e = Event::new(kind, api);
    e.seq = seq;
    e.ts_ns = 1_000_000_000 + seq * 1_000_000;
    e.ptr = ptr;
    e.size = size;
    e.stack = StackId(stack);
    e.tid = 4242;
    e.device = 0;
    e
}

/// One process: a leak site, a freed temporary, a VMM page, pinned host memory, an OOM.
fn fixture() -> Vec<u8> {
    let mut f = Vec::new();
    tf::write_header(&mut f, 1_700_000_000_000_000_000, "golden").unwrap();
    tf::write_conn_open(&mut f, 1, 1_700_000_000_000_000_001, 1).unwrap();
    let mut w = Vec::new();
    encode::hello(
        &mut w,
        &Hello {
            pid: 1234,
            ppid: 1,
            start_unix_ns: 1_700_000_000_000_000_000,
            flags: 1,
            shim_version: "0.1.0".into(),
            exe: "/app/train".into(),
            argv: vec!["/app/train".into(), "--epochs".into(), "2".into()],
            ..Default::default()
        },
    );
    encode::module_def(
        &mut w,
        &ModuleDef {
            id: 1,
            start: 0x40_0000,
            end: 0x50_0000,
            bias: 0,
            build_id: vec![0xab; 20],
            path: "/app/train".into(),
            file: None,
        },
    );
    encode::stack_def(&mut w, StackId(1), &[0x40_1234, 0x40_2000]);
    encode::stack_def(&mut w, StackId(2), &[0x40_3000, 0x40_2000]);
    let mut info = ev(
        EventKind::MemInfo,
        Api::cuMemGetInfo_v2,
        1,
        15 << 30,
        16 << 30,
        0,
    );
    info.ptr = 15 * 1024 * MIB;
    let mut vmm_map = ev(
        EventKind::Map,
        Api::cuMemMap,
        6,
        0x7000_0000_0000,
        2 * MIB,
        0,
    );
    vmm_map.aux = 0x51;
    let mut host = ev(
        EventKind::Alloc,
        Api::cudaMallocHost,
        7,
        0x7f00_0000_0000,
        4 * MIB,
        2,
    );
    host.device = -1;
    let mut oom = ev(EventKind::AllocFailed, Api::cudaMalloc, 9, 0, 64 << 30, 2);
    oom.result = 2;
    let mut after = ev(EventKind::MemInfo, Api::cuMemGetInfo_v2, 10, 0, 16 << 30, 0);
    after.ptr = 14 * 1024 * MIB;
    encode::events(
        &mut w,
        &[
            info,
            ev(
                EventKind::Alloc,
                Api::cudaMalloc,
                2,
                0x6000_0000_0000,
                8 * MIB,
                1,
            ),
            ev(
                EventKind::Alloc,
                Api::cudaMalloc,
                3,
                0x6000_0080_0000,
                8 * MIB,
                1,
            ),
            ev(
                EventKind::Alloc,
                Api::cudaMalloc,
                4,
                0x6000_0100_0000,
                MIB,
                2,
            ),
            ev(EventKind::PhysCreate, Api::cuMemCreate, 5, 0x51, 2 * MIB, 2),
            vmm_map,
            host,
            ev(EventKind::Free, Api::cudaFree, 8, 0x6000_0100_0000, 0, 0),
            oom,
            after,
        ],
    );
    encode::marker(&mut w, 11, 1_011_000_000, 4242, StackId(1), "step");
    encode::lost(
        &mut w,
        &Lost {
            events: 3,
            frees: 1,
            stacks: 0,
            by_device: vec![(0, 2), (-1, 1)],
        },
    );
    encode::goodbye(&mut w, GoodbyeReason::Exit, 11);
    if update() {
        // The same frames seed the socket-decoder fuzz target (fuzz/).
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
        std::fs::write(seeds.join("wire_decoder/v1-basic.frames"), &w).unwrap();
    }
    tf::write_chunk(&mut f, 1, &w, true).unwrap();
    tf::write_conn_close(
        &mut f,
        1,
        1_700_000_000_000_000_002,
        tf::CloseReason::Clean,
        "",
    )
    .unwrap();
    tf::write_end(&mut f, 1_700_000_000_000_000_003, 1).unwrap();
    f
}

fn fixture_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn update() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

/// The trace today's writer makes (rewritten first when updating, so both tests see it).
fn golden_trace() -> std::path::PathBuf {
    let path = fixture_path("v2-writer.oomt");
    if update() {
        std::fs::write(&path, fixture()).unwrap();
        let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/trace_reader/v2-writer.oomt");
        std::fs::copy(&path, seed).unwrap();
    }
    path
}

/// The same trace as older writers made it, never rewritten: traces already on users' disks
/// look like these. The first version-1 writer's (its Hello ends after the arguments: no
/// host, no launcher variables), then the last one's (its chunk plain).
fn frozen_traces() -> [std::path::PathBuf; 2] {
    [
        fixture_path("v1-basic.oomt"),
        fixture_path("v1-writer.oomt"),
    ]
}

#[test]
fn writer_bytes_are_stable() {
    let path = golden_trace();
    let made = fixture();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        made,
        "the v2 writer changed its bytes"
    );
    // header | ConnOpen | the Chunk (len u32 | type u8 | conn u32 | codec u8): the delta's.
    let mut r = tf::TraceReader::new(&made[..]).unwrap();
    assert_eq!(r.header.version, 2);
    assert!(matches!(
        r.next_record().unwrap(),
        Some(tf::Record::ConnOpen { .. })
    ));
    let chunk_at = r.offset() as usize;
    assert_eq!(made[chunk_at + 4], tf::record_type::CHUNK);
    assert_eq!(made[chunk_at + 9], tf::CODEC_LZ4_DELTA);
}

#[test]
fn traces_of_every_version_read_to_the_same_report() {
    let path = fixture_path("v1-basic.json");
    // The frozen files first: updating must not let today's writer redefine the old report.
    let [first, last_v1] = frozen_traces();
    for (i, file) in [first, last_v1, golden_trace()].into_iter().enumerate() {
        let trace = Trace::load(&file).unwrap();
        let report = build(
            &trace,
            &ReportOptions {
                top: 10,
                path: "v1-basic.oomt".into(),
                symbolize: false,
            },
        );
        let got = serde_json::to_string_pretty(&report).unwrap() + "\n";
        if update() && i == 0 {
            std::fs::write(&path, &got).unwrap();
        }
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            got,
            "the report of {} changed",
            file.display()
        );
    }
}
