//! Unit tests of the trace file (`trace_file.rs`).

use super::*;

fn sample(compress: bool) -> Vec<u8> {
    let mut f = Vec::new();
    write_header(&mut f, 123, "test").unwrap();
    write_conn_open(&mut f, 1, 5, 1).unwrap();
    let mut frames = Vec::new();
    crate::wire::encode::goodbye(&mut frames, crate::wire::GoodbyeReason::Exit, 7);
    let big: Vec<u8> = frames
        .iter()
        .cycle()
        .take(frames.len() * 100)
        .copied()
        .collect();
    write_chunk(&mut f, 1, &big, compress).unwrap();
    write_conn_close(&mut f, 1, 6, CloseReason::Clean, "").unwrap();
    write_end(&mut f, 7, 1).unwrap();
    f
}

fn read_all(b: &[u8]) -> Result<(Vec<Record>, Tail), Error> {
    let mut r = TraceReader::new(b)?;
    let mut out = Vec::new();
    while let Some(rec) = r.next_record()? {
        out.push(rec);
    }
    Ok((out, r.tail()))
}

/// Chunks of falling and rising sizes, plain and compressed, each decompressed into the
/// buffer the previous one gave back: each comes out whole, nothing of an earlier one.
#[test]
fn recycled_buffers_hold_only_their_chunk() {
    let mut f = Vec::new();
    write_header(&mut f, 1, "test").unwrap();
    let sizes = [5000usize, 300, 70_000, 10, 4096, 4095, 100_000];
    let chunks: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((j / 7 + i) % 251) as u8).collect())
        .collect();
    for (i, c) in chunks.iter().enumerate() {
        write_chunk(&mut f, 1, c, i % 3 != 0).unwrap();
    }
    let mut r = TraceReader::new(&f[..]).unwrap();
    let mut got = Vec::new();
    while let Some(rec) = r.next_record().unwrap() {
        let Record::Chunk { frames, .. } = rec else {
            panic!("{rec:?}")
        };
        got.push(frames.clone());
        r.recycle(frames);
    }
    assert_eq!(got, chunks);
    assert_eq!(r.tail(), Tail::Complete);
}

#[test]
fn numbered_paths() {
    use std::path::Path;
    assert_eq!(
        numbered_path(Path::new("/t/oomtrace.12.oomt"), 1),
        Path::new("/t/oomtrace.12.1.oomt")
    );
    assert_eq!(numbered_path(Path::new("trace"), 2), Path::new("trace.2"));
}

#[test]
fn roundtrip_plain_and_compressed() {
    for compress in [false, true] {
        let (recs, tail) = read_all(&sample(compress)).unwrap();
        assert_eq!(tail, Tail::Complete);
        assert_eq!(recs.len(), 4);
        match &recs[1] {
            Record::Chunk { conn: 1, frames } => assert_eq!(frames.len(), 14 * 100),
            r => panic!("{r:?}"),
        }
    }
}

/// The word delta undoes itself for every length (under one stride, a tail of odd bytes,
/// whole strides), on bytes whose differences wrap.
#[test]
fn the_word_delta_round_trips_every_length() {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..700)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut delta = Vec::new();
    for len in 0..bytes.len() {
        let raw = &bytes[..len];
        delta_encode(raw, &mut delta);
        assert_eq!(delta.len(), len);
        assert_eq!(
            delta[..len.min(64)],
            raw[..len.min(64)],
            "the first stride stays"
        );
        if len >= 72 {
            assert_ne!(
                delta[64..72],
                raw[64..72],
                "the second stride is a difference"
            );
            assert_eq!(delta[len / 8 * 8..], raw[len / 8 * 8..], "the tail stays");
        }
        delta_decode(&mut delta);
        assert_eq!(delta, raw, "length {len}");
    }
}

/// Events one after another are mostly repeats of the one before: the delta is what makes
/// them compress, and a chunk of them is written as [`CODEC_LZ4_DELTA`], read back whole.
#[cfg(feature = "compress")]
#[test]
fn a_chunk_of_events_is_written_as_its_delta_and_read_back() {
    let events: Vec<crate::Event> = (0..500u64)
        .map(|i| crate::Event {
            seq: i + 1,
            ts_ns: 1_000_000 + i * 1_337,
            ptr: 0x7f00_0000_0000 + (i / 2 % 3) * 4096,
            size: 4096,
            aux: 0,
            extra: 0,
            stack: crate::StackId(7),
            tid: 4242,
            result: 0,
            device: 0,
            kind: if i % 2 == 0 { 1 } else { 2 },
            api: 1,
        })
        .collect();
    let mut frames = Vec::new();
    crate::wire::encode::events(&mut frames, &events);
    let mut record = Vec::new();
    append_chunk(&mut record, 3, &frames, true);
    // len u32 | type u8 | conn u32 | codec u8
    assert_eq!(record[9], CODEC_LZ4_DELTA);
    let data = &record[18..];
    let plain = lz4_flex::block::compress(&frames);
    assert!(
        data.len() * 2 < plain.len(),
        "the delta compresses to {} bytes, LZ4 alone to {}",
        data.len(),
        plain.len()
    );
    let mut f = Vec::new();
    write_header(&mut f, 1, "test").unwrap();
    f.extend_from_slice(&record);
    let (recs, _) = read_all(&f).unwrap();
    assert_eq!(recs, vec![Record::Chunk { conn: 3, frames }]);
}

/// Traces written before the delta (codec 1, LZ4 of the frames themselves) still read.
#[cfg(feature = "compress")]
#[test]
fn a_chunk_of_plain_lz4_still_reads() {
    let frames: Vec<u8> = (0..4000u32).map(|i| (i % 97) as u8).collect();
    let data = lz4_flex::block::compress(&frames);
    let mut f = Vec::new();
    write_header(&mut f, 1, "test").unwrap();
    let len = (1 + 4 + 1 + 4 + 4 + data.len()) as u32;
    f.extend_from_slice(&len.to_le_bytes());
    f.push(record_type::CHUNK);
    f.extend_from_slice(&9u32.to_le_bytes());
    f.push(CODEC_LZ4);
    f.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32fast::hash(&frames).to_le_bytes());
    f.extend_from_slice(&data);
    let (recs, tail) = read_all(&f).unwrap();
    assert_eq!(recs, vec![Record::Chunk { conn: 9, frames }]);
    assert_eq!(tail, Tail::Complete);
}

#[test]
fn an_incomplete_record_round_trips_and_its_cause_is_total() {
    let mut f = Vec::new();
    write_header(&mut f, 1, "test").unwrap();
    write_incomplete(
        &mut f,
        9,
        WriteFailure::DiskFull,
        4096,
        17,
        "No space left on device",
        &[ConnMade {
            conn: 3,
            events: 99,
            ending: 1,
        }],
    )
    .unwrap();
    write_end(&mut f, 10, 0).unwrap();
    let (recs, tail) = read_all(&f).unwrap();
    assert_eq!(tail, Tail::Complete);
    assert_eq!(
        recs[0],
        Record::Incomplete {
            t_unix_ns: 9,
            cause: WriteFailure::DiskFull,
            unwritten_bytes: 4096,
            unwritten_events: 17,
            message: "No space left on device".into(),
            made: vec![ConnMade {
                conn: 3,
                events: 99,
                ending: 1
            }],
        }
    );
    // As written before the table: read with none.
    let mut old = Vec::new();
    write_header(&mut old, 1, "test").unwrap();
    let mut p = Vec::new();
    let mut wr = Writer { buf: &mut p };
    wr.u64(9);
    wr.u8(1);
    wr.u64(0);
    wr.u64(17);
    wr.str("");
    write_record(&mut old, record_type::INCOMPLETE, &p).unwrap();
    let (recs, _) = read_all(&old).unwrap();
    assert!(
        matches!(&recs[0], Record::Incomplete { made, unwritten_events: 17, .. } if made.is_empty()),
        "{recs:?}"
    );
    for v in 0..=255u8 {
        let c = WriteFailure::from_u8(v);
        assert_eq!(c as u8 == v, (1..=3).contains(&v), "{v}");
    }
    let enospc = io::Error::from_raw_os_error(28);
    assert_eq!(WriteFailure::of(&enospc), WriteFailure::DiskFull);
    assert_eq!(WriteFailure::message(&enospc), "No space left on device");
    assert_eq!(
        WriteFailure::of(&io::Error::from_raw_os_error(122)),
        WriteFailure::DiskFull
    );
    assert_eq!(
        WriteFailure::of(&io::Error::from_raw_os_error(27)),
        WriteFailure::FileTooLarge
    );
    assert_eq!(
        WriteFailure::of(&io::Error::from_raw_os_error(5)),
        WriteFailure::Other
    );
}

/// Sizes a record or a chunk claims are never allocated for before the bytes are there:
/// a cut record claiming 64 MiB is a truncated tail, a chunk claiming more than LZ4 can
/// make of its bytes is refused.
#[test]
fn claimed_sizes_are_not_believed() {
    let mut f = Vec::new();
    write_header(&mut f, 1, "test").unwrap();
    f.extend_from_slice(&MAX_RECORD.to_le_bytes());
    f.extend_from_slice(&[record_type::CHUNK, 0, 0]);
    let (recs, tail) = read_all(&f).unwrap();
    assert!(recs.is_empty());
    assert!(matches!(tail, Tail::Truncated { bytes: 7, .. }), "{tail:?}");
    assert_eq!(
        decompress_block(CODEC_LZ4, &[0; 16], 64 << 20, &mut Vec::new()),
        Err(if cfg!(feature = "compress") {
            Error::Malformed("lz4 chunk claims more than its bytes can hold")
        } else {
            Error::Malformed("lz4 chunk, but this reader was built without compression")
        })
    );
}

#[test]
fn every_truncation_is_tolerated() {
    let full = sample(true);
    let header_len = {
        let r = TraceReader::new(&full[..]).unwrap();
        r.offset() as usize
    };
    for cut in header_len..full.len() {
        let (recs, tail) = read_all(&full[..cut]).unwrap();
        assert!(recs.len() <= 4);
        assert!(
            matches!(tail, Tail::Truncated { .. } | Tail::Complete),
            "cut {cut}"
        );
    }
}

#[test]
fn bad_headers_are_clear_errors() {
    assert!(matches!(
        read_all(b"hello world, not a trace"),
        Err(Error::BadMagic)
    ));
    assert!(matches!(read_all(b""), Err(Error::BadMagic)));
    let mut v9 = sample(false);
    v9[8] = 9;
    let e = read_all(&v9).unwrap_err();
    assert!(matches!(e, Error::UnsupportedVersion { found: 9, .. }));
    assert_eq!(
        e.to_string(),
        "format version 9 is not supported (this oomtrace reads versions 1 to 2)"
    );
    // Version 0 is older than any writer; version 1 (the previous writer's) still reads.
    let mut v = sample(true);
    v[8] = 0;
    assert!(matches!(
        read_all(&v),
        Err(Error::UnsupportedVersion { found: 0, .. })
    ));
    let mut v1 = sample(false);
    v1[8] = 1;
    assert_eq!(read_all(&v1).unwrap().1, Tail::Complete);
}

#[test]
fn flipped_bytes_never_panic_and_are_caught_by_the_checksum() {
    let good = sample(false);
    let header_len = TraceReader::new(&good[..]).unwrap().offset() as usize;
    let mut errors = 0;
    for i in header_len..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x55;
        if read_all(&bad).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 0);
    // Every byte of the chunk payload is covered by the checksum.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 60] ^= 1;
    let _ = read_all(&bad);
}
