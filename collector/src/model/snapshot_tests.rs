use super::trace::Trace;
use crate::snapshot::convert;

/// A value to write as a pickle (what a snapshot holds: dicts, lists, ints, strings).
enum P {
    Int(i64),
    Str(&'static str),
    List(Vec<P>),
    Dict(Vec<(&'static str, P)>),
}

/// Protocol 2, as Python's pickle writes these types (without the memo).
fn write(v: &P, out: &mut Vec<u8>) {
    match v {
        P::Int(i) => {
            out.push(0x8a);
            out.push(8);
            out.extend_from_slice(&i.to_le_bytes());
        }
        P::Str(s) => {
            out.push(b'X');
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        P::List(items) => {
            out.extend_from_slice(b"](");
            for i in items {
                write(i, out);
            }
            out.push(b'e');
        }
        P::Dict(items) => {
            out.extend_from_slice(b"}(");
            for (k, v) in items {
                write(&P::Str(k), out);
                write(v, out);
            }
            out.push(b'u');
        }
    }
}

fn pickle_of(v: &P) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    write(v, &mut out);
    out.push(b'.');
    out
}

fn frames(file: &'static str, line: i64) -> P {
    P::List(vec![
        P::Dict(vec![
            ("name", P::Str("torch::unwind::unwind()")),
            ("filename", P::Str("/venv/torch/lib/libtorch_cpu.so")),
            ("line", P::Int(1234)),
        ]),
        P::Dict(vec![
            ("name", P::Str("at::native::empty_cuda")),
            ("filename", P::Str("/venv/torch/lib/libtorch_cuda.so")),
            ("line", P::Int(99)),
        ]),
        P::Dict(vec![
            ("name", P::Str("<module>")),
            ("filename", P::Str(file)),
            ("line", P::Int(line)),
        ]),
    ])
}

fn entry(action: &'static str, addr: i64, size: i64, time_us: i64) -> P {
    P::Dict(vec![
        ("action", P::Str(action)),
        ("addr", P::Int(addr)),
        ("size", P::Int(size)),
        ("stream", P::Int(0)),
        ("time_us", P::Int(time_us)),
        ("frames", frames("/home/user/project/train.py", 7)),
    ])
}

const SEG: i64 = 0x7f00_0000_0000;
const MIB: i64 = 1 << 20;

/// A large segment of device 0 at `address`, `total_size` bytes, holding `blocks`.
fn segment(address: i64, total_size: i64, blocks: Vec<P>) -> P {
    P::Dict(vec![
        ("device", P::Int(0)),
        ("address", P::Int(address)),
        ("total_size", P::Int(total_size)),
        ("stream", P::Int(0)),
        ("segment_type", P::Str("large")),
        ("blocks", P::List(blocks)),
    ])
}

/// A snapshot whose history begins late: the segment and a 1 MiB block were live before its
/// first entry (the block is freed in it), then a 2 MiB block is made and stays.
fn late_snapshot() -> P {
    P::Dict(vec![
        (
            "segments",
            P::List(vec![segment(
                SEG,
                20 * MIB,
                vec![
                    P::Dict(vec![
                        ("address", P::Int(SEG)),
                        ("size", P::Int(2 * MIB)),
                        ("state", P::Str("active_allocated")),
                        ("frames", frames("/home/user/project/train.py", 9)),
                    ]),
                    P::Dict(vec![
                        ("address", P::Int(SEG + 2 * MIB)),
                        ("size", P::Int(18 * MIB)),
                        ("state", P::Str("inactive")),
                        ("frames", P::List(vec![])),
                    ]),
                ],
            )]),
        ),
        (
            "device_traces",
            P::List(vec![P::List(vec![
                entry("free_requested", SEG, MIB, 10),
                entry("free_completed", SEG, MIB, 11),
                entry("alloc", SEG, 2 * MIB, 12),
            ])]),
        ),
    ])
}

#[test]
fn a_history_that_begins_late_starts_from_the_state_walked_back() {
    let c = convert(&pickle_of(&late_snapshot()), "late.pickle").unwrap();
    assert!(
        c.limits.contains("3 trace entries on 1 device"),
        "{}",
        c.limits
    );
    assert!(
        c.limits
            .contains("1 tensor (1.00 MiB) and 1 segment live before it"),
        "{}",
        c.limits
    );
    let t: Trace<()> = Trace::read(c.trace.as_slice()).unwrap();
    assert!(t.complete);
    let p = &t.processes[0];
    let d = &p.devices[&0];
    // The segment, made before the history; the 1 MiB tensor freed, the 2 MiB one live.
    assert_eq!(d.torch_reserved_bytes, Some(20 << 20));
    assert_eq!(p.tensors.len(), 1);
    assert_eq!(p.tensors[&(SEG as u64)].size, 2 << 20);
    // C++ frames are named as the snapshot named them, less the recorder's own.
    let names: Vec<&str> = p.named_frames.values().map(|(_, f)| f.as_str()).collect();
    assert_eq!(names, ["at::native::empty_cuda"]);
    assert_eq!(p.codes.len(), 1, "one Python line: {:?}", p.codes);
}

#[test]
fn a_pickle_that_is_no_snapshot_is_one_sentence() {
    let e = convert(&pickle_of(&P::List(vec![P::Int(1)])), "x").unwrap_err();
    assert!(e.contains("not a PyTorch memory snapshot"), "{e}");
    let e = convert(b"\x80\x04", "x").unwrap_err();
    assert!(e.starts_with("not a readable pickle"), "{e}");
    // A device no process can have.
    let bad = P::Dict(vec![(
        "segments",
        P::List(vec![P::Dict(vec![("device", P::Int(40_000))])]),
    )]);
    let e = convert(&pickle_of(&bad), "x").unwrap_err();
    assert!(e.contains("device 40000"), "{e}");
}

#[test]
fn an_out_of_memory_entry_gives_the_device_the_size_pytorch_could_have() {
    let snap = P::Dict(vec![
        ("segments", P::List(vec![])),
        (
            "device_traces",
            P::List(vec![P::List(vec![
                entry("segment_alloc", SEG, 20 * MIB, 1),
                entry("alloc", SEG, 20 * MIB, 2),
                P::Dict(vec![
                    ("action", P::Str("oom")),
                    ("device_free", P::Int(100 * MIB)),
                    ("size", P::Int(200 * MIB)),
                    ("stream", P::Int(0)),
                    ("time_us", P::Int(3)),
                    ("frames", frames("/home/user/project/train.py", 12)),
                ]),
            ])]),
        ),
    ]);
    // Its history is whole: the segment freed later is not in the final state.
    let c = convert(&pickle_of(&snap), "oom.pickle").unwrap();
    assert!(!c.limits.contains("begins after"), "{}", c.limits);
    let t: Trace<()> = Trace::read(c.trace.as_slice()).unwrap();
    let d = &t.processes[0].devices[&0];
    assert_eq!(d.capacity, Some(120 << 20));
    assert_eq!(d.last_free, Some(100 << 20));
}

/// Sizes a hostile snapshot gives its blocks (a negative size reads as a huge one): their sum
/// in the limits line is saturated, never an overflow (found by the snapshot_reader fuzz
/// target).
#[test]
fn blocks_live_before_the_history_whose_sizes_overflow_are_one_line() {
    let block = |address: i64| {
        P::Dict(vec![
            ("address", P::Int(address)),
            ("size", P::Int(-262_139)),
            ("state", P::Str("active_allocated")),
            ("frames", frames("/home/user/project/train.py", 9)),
        ])
    };
    let snapshot = P::Dict(vec![
        (
            "segments",
            P::List(vec![segment(
                SEG,
                20 * MIB,
                vec![block(SEG), block(SEG + MIB)],
            )]),
        ),
        (
            "device_traces",
            P::List(vec![P::List(vec![entry("alloc", SEG + 4 * MIB, MIB, 12)])]),
        ),
    ]);
    // Whatever it makes of such a file, it says so without panicking.
    match convert(&pickle_of(&snapshot), "hostile.pickle") {
        Ok(c) => assert!(c.limits.contains("live before it"), "{}", c.limits),
        Err(e) => assert!(!e.is_empty()),
    }
}

/// Segments whose sizes add up past 64 bits, in the history and before it: each device's
/// reserve saturates (found by the snapshot_reader fuzz target).
#[test]
fn segments_whose_sizes_overflow_saturate_the_reserve() {
    let snapshot = P::Dict(vec![
        (
            "segments",
            P::List(vec![
                segment(SEG, -MIB, vec![]),
                segment(SEG + MIB, -MIB, vec![]),
            ]),
        ),
        (
            "device_traces",
            P::List(vec![P::List(vec![
                entry("segment_alloc", SEG + 4 * MIB, -MIB, 10),
                entry("segment_alloc", SEG + 8 * MIB, -MIB, 11),
                entry("oom", 0, MIB, 12),
            ])]),
        ),
    ]);
    match convert(&pickle_of(&snapshot), "hostile.pickle") {
        Ok(c) => assert!(!c.limits.is_empty()),
        Err(e) => assert!(!e.is_empty()),
    }
}
