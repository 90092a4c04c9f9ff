//! Unit tests of the wire format (`wire.rs`).

use super::*;
use crate::event::{Api, EventKind};

fn sample() -> Vec<u8> {
    let mut b = Vec::new();
    encode::hello(
        &mut b,
        &Hello {
            pid: 42,
            ppid: 1,
            start_unix_ns: 7,
            flags: hello_flags::NATIVE_STACKS,
            shim_version: "0.1.0".into(),
            exe: "/bin/app".into(),
            argv: vec!["app".into(), "--x".into()],
            start_mono_ns: 3,
            host: "node7".into(),
            launch: vec![
                ("RANK".into(), "3".into()),
                ("WORLD_SIZE".into(), "4".into()),
            ],
        },
    );
    let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
    e.ptr = 0x1000;
    e.size = 4096;
    encode::events(&mut b, &[e, e]);
    encode::stack_def(&mut b, StackId(3), &[1, 2, 3]);
    encode::module_def(
        &mut b,
        &ModuleDef {
            id: 1,
            start: 0x400000,
            end: 0x500000,
            bias: 0,
            build_id: vec![1, 2, 3, 4],
            path: "/bin/app".into(),
            file: None,
        },
    );
    encode::marker(&mut b, 9, 10, 11, StackId(3), "step");
    encode::lost(
        &mut b,
        &Lost {
            events: 5,
            frees: 1,
            stacks: 0,
            by_device: vec![(0, 4), (-1, 1)],
        },
    );
    encode::made(&mut b, 77, GoodbyeReason::Exit as u8);
    encode::goodbye(&mut b, GoodbyeReason::Exit, 99);
    encode::torch_memory(
        &mut b,
        &TorchMemory {
            ts_ns: 12,
            device: 1,
            allocated: 100,
            max_allocated: 300,
            reserved: 400,
        },
    );
    b
}

#[test]
fn frames_roundtrip() {
    let b = sample();
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 9);
    match &all[0] {
        Frame::Hello(h) => {
            assert_eq!(h.pid, 42);
            assert_eq!(h.argv, vec!["app", "--x"]);
            assert_eq!((h.start_mono_ns, h.host.as_str()), (3, "node7"));
            assert_eq!(h.launch.len(), 2);
            assert_eq!(h.launch[0], ("RANK".into(), "3".into()));
        }
        f => panic!("{f:?}"),
    }
    match &all[1] {
        Frame::Events(batch) => {
            assert_eq!(batch.len(), 2);
            assert!(batch.iter().all(|e| e.size == 4096));
        }
        f => panic!("{f:?}"),
    }
    match &all[5] {
        Frame::Lost(l) => assert_eq!(l.by_device, vec![(0, 4), (-1, 1)]),
        f => panic!("{f:?}"),
    }
    assert!(
        matches!(
            all[6],
            Frame::Made {
                events: 77,
                ending: 1
            }
        ),
        "{:?}",
        all[6]
    );
    assert!(
        matches!(
            all[8],
            Frame::TorchMemory(TorchMemory {
                device: 1,
                allocated: 100,
                max_allocated: 300,
                reserved: 400,
                ..
            })
        ),
        "{:?}",
        all[8]
    );
}

#[test]
fn a_launch_frame_roundtrips() {
    let vars = vec![
        ("RANK".to_string(), "1".to_string()),
        ("WORLD_SIZE".to_string(), "2".to_string()),
    ];
    let mut b = Vec::new();
    encode::launch(&mut b, &vars);
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 1);
    assert!(
        matches!(&all[0], Frame::Launch(v) if *v == vars),
        "{:?}",
        all[0]
    );
    // Cut anywhere inside, it is an error, never a panic or a shorter list.
    for cut in 5..b.len() {
        let mut short = b[..cut].to_vec();
        end_frame(&mut short, 0);
        assert!(frames(&short).any(|f| f.is_err()), "cut at {cut}");
    }
}

#[test]
fn a_torch_memory_frame_roundtrips_and_a_cut_one_is_an_error() {
    let m = TorchMemory {
        ts_ns: 123_456_789,
        device: 3,
        allocated: 966_367_641,
        max_allocated: (3 << 30) + 7,
        reserved: u64::MAX - 1,
    };
    let mut b = Vec::new();
    encode::torch_memory(&mut b, &m);
    assert_eq!(b.len(), 5 + 8 + 2 + 3 * 8);
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert_eq!(all.len(), 1);
    assert!(
        matches!(&all[0], Frame::TorchMemory(got) if *got == m),
        "{:?}",
        all[0]
    );
    // Cut anywhere inside, it is an error, never a panic or a reading made of zeros.
    for cut in 5..b.len() {
        let mut short = b[..cut].to_vec();
        end_frame(&mut short, 0);
        assert!(frames(&short).any(|f| f.is_err()), "cut at {cut}");
    }
    // Bytes after `reserved` (fields a later shim adds) are ignored.
    let mut longer = b.clone();
    longer.extend_from_slice(&[9, 9, 9, 9]);
    end_frame(&mut longer, 0);
    assert!(
        matches!(frames(&longer).next(), Some(Ok(Frame::TorchMemory(got))) if got == m),
        "a longer frame"
    );
    // The tag is pinned.
    assert_eq!(frame_type::TORCH_MEMORY, 12);
    assert_eq!(b[4], 12);
}

#[test]
fn a_hello_without_its_tail_has_no_host_and_no_launcher() {
    // As written before the host and launcher variables were added.
    let mut b = Vec::new();
    let at = begin_frame(&mut b, frame_type::HELLO);
    let mut w = Writer { buf: &mut b };
    w.u32(9);
    w.u32(1);
    w.u64(5);
    w.u32(0);
    w.str("0.1.0");
    w.str("/bin/old");
    w.u16(1);
    w.str("old");
    end_frame(&mut b, at);
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    match &all[0] {
        Frame::Hello(h) => {
            assert_eq!((h.pid, h.exe.as_str()), (9, "/bin/old"));
            assert_eq!((h.start_mono_ns, h.host.as_str()), (0, ""));
            assert!(h.launch.is_empty());
        }
        f => panic!("{f:?}"),
    }
}

#[test]
fn a_module_def_keeps_its_file_stamp_and_reads_without_it() {
    let stamped = ModuleDef {
        id: 2,
        start: 0x7f00_0000_0000,
        end: 0x7f00_0001_0000,
        bias: 0x7f00_0000_0000,
        build_id: Vec::new(),
        path: "/opt/app/libnoid.so".into(),
        file: Some(FileStamp {
            size: 16_384,
            mtime_ns: -5, // before the epoch: the sign survives
        }),
    };
    let mut b = Vec::new();
    encode::module_def(&mut b, &stamped);
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert!(
        matches!(&all[0], Frame::ModuleDef(m) if *m == stamped),
        "{:?}",
        all[0]
    );
    // As written before the tail was added: ends after the path, and reads as no stamp.
    let mut old = Vec::new();
    let at = begin_frame(&mut old, frame_type::MODULE_DEF);
    let mut w = Writer { buf: &mut old };
    w.u32(3);
    w.u64(0x40_0000);
    w.u64(0x50_0000);
    w.u64(0);
    w.u8(2);
    w.bytes(&[0xab, 0xcd]);
    w.str("/bin/old");
    end_frame(&mut old, at);
    match frames(&old).next() {
        Some(Ok(Frame::ModuleDef(m))) => {
            assert_eq!(
                (m.path.as_str(), m.build_id.as_slice()),
                ("/bin/old", &[0xab, 0xcd][..])
            );
            assert_eq!(m.file, None);
        }
        f => panic!("{f:?}"),
    }
    // A tail cut short is an error, never a stamp made of what is there.
    for cut in 1..16 {
        let mut short = b[..b.len() - cut].to_vec();
        end_frame(&mut short, 0);
        assert!(frames(&short).any(|f| f.is_err()), "cut {cut}");
    }
}

#[test]
fn every_prefix_is_incomplete_or_whole_never_a_panic() {
    let b = sample();
    for cut in 0..b.len() {
        // A prefix yields whole frames and then at most one Truncated error.
        let results: Vec<_> = frames(&b[..cut]).collect();
        let errs = results.iter().filter(|r| r.is_err()).count();
        assert!(errs <= 1);
    }
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    // Lengths out of range.
    assert!(next_frame(&[0, 0, 0, 0, 1]).is_err());
    assert!(next_frame(&[0xff, 0xff, 0xff, 0xff, 1]).is_err());
    // An Events frame whose count disagrees with its length.
    let mut b = Vec::new();
    let at = begin_frame(&mut b, frame_type::EVENTS);
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&[0u8; 64]);
    end_frame(&mut b, at);
    assert!(next_frame(&b).is_err());
    // Flipping every byte of a valid stream never panics.
    let good = sample();
    for i in 0..good.len() {
        for bit in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[i] ^= bit;
            for r in frames(&bad) {
                let _ = r;
            }
        }
    }
}

#[test]
fn unknown_frame_types_are_skipped() {
    let mut b = Vec::new();
    let at = begin_frame(&mut b, 200);
    b.extend_from_slice(b"future");
    end_frame(&mut b, at);
    encode::goodbye(&mut b, GoodbyeReason::Exit, 1);
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert!(matches!(all[0], Frame::Unknown { ty: 200 }));
    assert!(matches!(all[1], Frame::Goodbye { .. }));
}

#[test]
fn stream_header_checks() {
    let h = stream_header();
    assert_eq!(check_stream_header(&h).unwrap(), WIRE_VERSION);
    let mut bad = h;
    bad[0] = b'X';
    assert!(matches!(check_stream_header(&bad), Err(Error::BadMagic)));
    let mut v2 = h;
    v2[8] = 9;
    assert!(matches!(
        check_stream_header(&v2),
        Err(Error::UnsupportedVersion { found: 9, .. })
    ));
}

#[test]
fn a_frame_name_roundtrips_and_a_cut_one_is_an_error() {
    let mut b = Vec::new();
    encode::frame_name(
        &mut b,
        0x10_0000_0040,
        "/venv/torch/lib/libtorch_cpu.so",
        "torch::autograd::generated::AddmmBackward0::apply(std::vector<at::Tensor>&&)",
    );
    let all: Vec<_> = frames(&b).collect::<Result<_, _>>().unwrap();
    assert!(
        matches!(&all[..], [Frame::FrameName { addr: 0x10_0000_0040, module, function }]
            if module.ends_with("libtorch_cpu.so") && function.starts_with("torch::autograd")),
        "{all:?}"
    );
    for cut in 5..b.len() {
        let mut short = b[..cut].to_vec();
        end_frame(&mut short, 0);
        assert!(frames(&short).any(|f| f.is_err()), "cut at {cut}");
    }
    // The tag is pinned.
    assert_eq!(frame_type::FRAME_NAME, 13);
    assert_eq!(b[4], 13);
}
