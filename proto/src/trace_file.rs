//! The `.oomt` trace file: a header, then records that carry each connection's wire frames.
//!
//! ```text
//! header:  magic "OOMTRACE" (8) | version u16 | flags u16 | rest_len u32
//!          | created_unix_ns u64 | producer str | (rest_len covers everything after itself)
//! record:  len u32 (bytes after this field) | type u8 | payload
//!   1 ConnOpen   conn u32 | t_unix_ns u64 | wire_version u16
//!   2 Chunk      conn u32 | codec u8 | raw_len u32 | crc32 u32 (of raw) | data
//!                raw = whole wire frames (see wire.rs) of connection `conn`; codec:
//!                0 none (data = raw), 1 lz4 block of raw, 2 lz4 block of raw's word
//!                delta ([`delta_encode`]: from byte 64 on, each little-endian u64 at an
//!                offset that is a multiple of 8 minus the one 64 bytes before it, wrapping;
//!                a tail of fewer than 8 bytes as it is). The collector writes 2; 1 is read.
//!   3 ConnClose  conn u32 | t_unix_ns u64 | reason u8 (CloseReason) | message str
//!   4 End        t_unix_ns u64 | conns u32          (the writer finished cleanly)
//!   5 Incomplete t_unix_ns u64 | cause u8 (WriteFailure: 1 disk full, 2 file too large,
//!                3 other I/O error; unknown values read as 3) | unwritten_bytes u64 |
//!                unwritten_events u64 | message str
//!                [ | n u32 | (conn u32, made u64, ending u8) * n ]
//!                the writer could not write everything it received (a full disk) from
//!                `t_unix_ns` on: the records before this one are whole; `unwritten_bytes` of
//!                wire frames holding `unwritten_events` events came after them and were not
//!                written (nor were the ConnClose records of connections that ended since).
//!                Written in space reserved past the end of the file so that it fits on a
//!                full disk; rewritten in place with the final counts, then an End. (The
//!                shim's own writer encodes nothing after a failure: its unwritten_bytes
//!                covers only the write that failed; its unwritten_events covers all.)
//!                The bracketed tail (absent in older files: read as empty) gives, for each
//!                connection some of whose records were not written, what its `Made` frame
//!                said (see wire.rs), so that a reader still knows how many events each
//!                process made: at most [`MAX_MADE_ENTRIES`], to fit the reserved room.
//! ```
//!
//! The file is readable while it is written, and a writer that dies leaves a valid prefix
//! plus at most one partial record: the reader reports that as [`Tail::Truncated`], not an
//! error. A checksum mismatch, a bad length or a bad header is an error.
//!
//! The collector writes one file for many processes; the shim's fallback mode writes the same
//! format with a single connection 0 and uncompressed chunks.

use std::io::{self, Read, Write};

use crate::wire::{Reader, Writer};
use crate::Error;

pub const FILE_MAGIC: [u8; 8] = *b"OOMTRACE";
/// The version this build writes. 2: chunks may be [`CODEC_LZ4_DELTA`] (an older reader
/// says it cannot read the file rather than fail on its first chunk).
pub const FILE_VERSION: u16 = 2;
/// The oldest version this build reads (1: chunks plain or [`CODEC_LZ4`]).
pub const OLDEST_FILE_VERSION: u16 = 1;
/// Largest record a reader accepts.
pub const MAX_RECORD: u32 = 64 << 20;
/// Chunk buffers a reader keeps for reuse.
const MAX_SPARE: usize = 8;

pub mod record_type {
    pub const CONN_OPEN: u8 = 1;
    pub const CHUNK: u8 = 2;
    pub const CONN_CLOSE: u8 = 3;
    pub const END: u8 = 4;
    pub const INCOMPLETE: u8 = 5;
}

/// Entries of an `Incomplete` record's table of what each connection made (13 bytes each:
/// it must fit the room reserved for the record on a full disk).
pub const MAX_MADE_ENTRIES: usize = 2048;

/// What one connection's process made (its last `Made` frame), kept in an `Incomplete`
/// record for a connection whose last records could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnMade {
    pub conn: u32,
    /// Events and markers made, delivered or not.
    pub events: u64,
    /// 0, or the `GoodbyeReason` its process began its end of stream with.
    pub ending: u8,
}

/// Why a writer could not write everything (record `Incomplete`). Pinned values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFailure {
    /// ENOSPC or EDQUOT: the disk or the user's quota is full.
    DiskFull = 1,
    /// EFBIG: the file reached the largest size allowed (RLIMIT_FSIZE, the filesystem).
    FileTooLarge = 2,
    /// Any other I/O error (the message says which).
    Other = 3,
}

impl WriteFailure {
    pub fn from_u8(v: u8) -> WriteFailure {
        match v {
            1 => WriteFailure::DiskFull,
            2 => WriteFailure::FileTooLarge,
            _ => WriteFailure::Other,
        }
    }
    /// The cause of an I/O error.
    pub fn of(e: &io::Error) -> WriteFailure {
        match e.raw_os_error() {
            Some(libc_codes::ENOSPC | libc_codes::EDQUOT) => WriteFailure::DiskFull,
            Some(libc_codes::EFBIG) => WriteFailure::FileTooLarge,
            _ => WriteFailure::Other,
        }
    }
    /// The error in words without Rust's ` (os error N)` suffix: `No space left on device`.
    pub fn message(e: &io::Error) -> String {
        let s = e.to_string();
        match s.rfind(" (os error ") {
            Some(i) if s.ends_with(')') => s[..i].to_string(),
            _ => s,
        }
    }
    /// A stable name for JSON (`disk_full`, `file_too_large`, `io_error`).
    pub fn name(self) -> &'static str {
        match self {
            WriteFailure::DiskFull => "disk_full",
            WriteFailure::FileTooLarge => "file_too_large",
            WriteFailure::Other => "io_error",
        }
    }
    /// In a sentence's words.
    pub fn words(self) -> &'static str {
        match self {
            WriteFailure::DiskFull => "disk full",
            WriteFailure::FileTooLarge => "file too large",
            WriteFailure::Other => "write error",
        }
    }
}

/// Linux's values (this crate has no libc dependency; they are the same on every Linux ABI).
mod libc_codes {
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EDQUOT: i32 = 122;
}

pub const CODEC_NONE: u8 = 0;
pub const CODEC_LZ4: u8 = 1;
/// LZ4 of the frames' word delta ([`delta_encode`]). Events are 64 bytes, and an event less
/// the one before it is mostly zeros and repeats (the sequence number one more, the same
/// size and stream, the clock a little later): LZ4 finds that in long matches, where it found
/// short ones in the events themselves. On a cudaMalloc+cudaFree loop's frames, half the
/// writer's instructions and less than half the bytes of LZ4 alone
/// (bench/2026-12-06-collector.md).
pub const CODEC_LZ4_DELTA: u8 = 2;

/// The delta's stride: one event.
pub const DELTA_STRIDE: usize = crate::EVENT_SIZE;

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_le_bytes(w)
}

/// `raw` with each 8-byte little-endian word from byte [`DELTA_STRIDE`] on replaced by its
/// difference (wrapping) to the word `DELTA_STRIDE` bytes before it, into `out` (its contents
/// replaced). The first `DELTA_STRIDE` bytes and a tail of fewer than 8 stay as they are.
pub fn delta_encode(raw: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(raw);
    let body = raw.len() / 8 * 8;
    if body <= DELTA_STRIDE {
        return;
    }
    let now = raw[DELTA_STRIDE..body].chunks_exact(8);
    let before = raw[..body - DELTA_STRIDE].chunks_exact(8);
    for (o, (n, b)) in out[DELTA_STRIDE..body]
        .chunks_exact_mut(8)
        .zip(now.zip(before))
    {
        o.copy_from_slice(&word(n).wrapping_sub(word(b)).to_le_bytes());
    }
}

/// Undoes [`delta_encode`] in place, a stride at a time: each word adds back the word a
/// stride before it, already restored and kept in `before` (eight independent sums, which
/// the compiler makes vector adds, rather than a load of what the previous stride stored).
pub fn delta_decode(buf: &mut [u8]) {
    let body = buf.len() / 8 * 8;
    if body <= DELTA_STRIDE {
        return;
    }
    let (first, rest) = buf[..body].split_at_mut(DELTA_STRIDE);
    let mut before = [0u64; DELTA_STRIDE / 8];
    for (b, w) in before.iter_mut().zip(first.chunks_exact(8)) {
        *b = word(w);
    }
    let mut strides = rest.chunks_exact_mut(DELTA_STRIDE);
    for stride in &mut strides {
        for (b, w) in before.iter_mut().zip(stride.chunks_exact_mut(8)) {
            *b = b.wrapping_add(word(w));
            w.copy_from_slice(&b.to_le_bytes());
        }
    }
    for (b, w) in before
        .iter()
        .zip(strides.into_remainder().chunks_exact_mut(8))
    {
        let v = b.wrapping_add(word(w));
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Why a connection ended, as the collector saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// EOF after the process said goodbye.
    Clean = 0,
    /// EOF without a goodbye: the process was killed, crashed or left through a path the shim
    /// does not see. Events it had not yet sent are lost.
    Abrupt = 1,
    /// The peer sent bytes that are not the oomtrace protocol; it was dropped.
    ProtocolError = 2,
    /// The collector stopped while the connection was open.
    CollectorShutdown = 3,
}

impl CloseReason {
    pub fn from_u8(v: u8) -> CloseReason {
        match v {
            0 => CloseReason::Clean,
            2 => CloseReason::ProtocolError,
            3 => CloseReason::CollectorShutdown,
            _ => CloseReason::Abrupt,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            CloseReason::Clean => "exited",
            CloseReason::Abrupt => "ended without goodbye (killed or crashed)",
            CloseReason::ProtocolError => "dropped (protocol error)",
            CloseReason::CollectorShutdown => "still running when the collector stopped",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub version: u16,
    pub created_unix_ns: u64,
    pub producer: String,
}

/// One record, with chunk data already decompressed and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    ConnOpen {
        conn: u32,
        t_unix_ns: u64,
        wire_version: u16,
    },
    /// Whole wire frames of one connection.
    Chunk {
        conn: u32,
        frames: Vec<u8>,
    },
    ConnClose {
        conn: u32,
        t_unix_ns: u64,
        reason: CloseReason,
        message: String,
    },
    End {
        t_unix_ns: u64,
        conns: u32,
    },
    Incomplete {
        t_unix_ns: u64,
        cause: WriteFailure,
        unwritten_bytes: u64,
        unwritten_events: u64,
        message: String,
        /// What each connection cut short made (see the format above).
        made: Vec<ConnMade>,
    },
    Unknown {
        ty: u8,
    },
}

/// How the file ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// Not at the end yet.
    Open,
    /// The last record is complete.
    Complete,
    /// The file ends inside a record starting at `offset`; `bytes` of it were present.
    Truncated { offset: u64, bytes: u64 },
}

/// `dir/stem.N.ext`: where a trace goes when `path` is taken and must not be overwritten
/// (processes sharing an output name each keep their own file).
pub fn numbered_path(path: &std::path::Path, n: u32) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{n}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{n}"),
    };
    path.with_file_name(name)
}

/// Creates a new trace file with mode 0600 (traces hold code paths and addresses) at `path`
/// or, if that exists, at the first free `numbered_path`: a trace is never overwritten.
/// Returns the file and the path used.
pub fn create_new(path: &std::path::Path) -> io::Result<(std::fs::File, std::path::PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut candidate = path.to_path_buf();
    for n in 1..10_000 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&candidate)
        {
            Ok(f) => return Ok((f, candidate)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                candidate = numbered_path(path, n)
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free file name",
    ))
}

pub fn write_header<W: Write>(w: &mut W, created_unix_ns: u64, producer: &str) -> io::Result<()> {
    let mut rest = Vec::new();
    let mut wr = Writer { buf: &mut rest };
    wr.u64(created_unix_ns);
    wr.str(producer);
    let mut head = Vec::with_capacity(16 + rest.len());
    head.extend_from_slice(&FILE_MAGIC);
    head.extend_from_slice(&FILE_VERSION.to_le_bytes());
    head.extend_from_slice(&0u16.to_le_bytes());
    head.extend_from_slice(&(rest.len() as u32).to_le_bytes());
    head.extend_from_slice(&rest);
    w.write_all(&head)
}

fn write_record<W: Write>(w: &mut W, ty: u8, payload: &[u8]) -> io::Result<()> {
    let len = (payload.len() + 1) as u32;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&[ty])?;
    w.write_all(payload)
}

pub fn write_conn_open<W: Write>(
    w: &mut W,
    conn: u32,
    t_unix_ns: u64,
    wire_version: u16,
) -> io::Result<()> {
    let mut p = Vec::with_capacity(14);
    let mut wr = Writer { buf: &mut p };
    wr.u32(conn);
    wr.u64(t_unix_ns);
    wr.u16(wire_version);
    write_record(w, record_type::CONN_OPEN, &p)
}

/// Writes whole wire frames of `conn` as one chunk, compressed when the feature is on and it helps.
pub fn write_chunk<W: Write>(
    w: &mut W,
    conn: u32,
    frames: &[u8],
    compress: bool,
) -> io::Result<()> {
    let mut record = Vec::new();
    append_chunk(&mut record, conn, frames, compress);
    w.write_all(&record)
}

/// [`write_chunk`] onto the end of `out`: compressed in place, without a buffer of its own
/// (a collector writes one per read of every connection).
pub fn append_chunk(out: &mut Vec<u8>, conn: u32, frames: &[u8], compress: bool) {
    let crc = crc32fast::hash(frames);
    let start = out.len();
    // len u32 | type u8 | conn u32 | codec u8 | raw_len u32 | crc u32, then the data.
    out.extend_from_slice(&[0; 4]);
    out.push(record_type::CHUNK);
    out.extend_from_slice(&conn.to_le_bytes());
    let codec_at = out.len();
    out.push(CODEC_NONE);
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    if compress_onto(out, frames, compress) {
        out[codec_at] = CODEC_LZ4_DELTA;
    } else {
        out.extend_from_slice(frames);
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Appends `raw`'s word delta LZ4-compressed ([`CODEC_LZ4_DELTA`]) to `out` when asked and
/// when that is smaller; returns whether it did (`out` is unchanged otherwise). The delta and
/// the block go to per-thread scratch buffers that keep their size, then the block is
/// copied: growing `out` by the worst-case size for every chunk zeroed several times the
/// chunk's bytes each time (an eighth of the trace writer's instructions), the copy moves
/// only the compressed bytes.
#[cfg(feature = "compress")]
fn compress_onto(out: &mut Vec<u8>, raw: &[u8], compress: bool) -> bool {
    use std::cell::RefCell;
    #[derive(Default)]
    struct Scratch {
        delta: Vec<u8>,
        block: Vec<u8>,
    }
    thread_local! {
        static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    }
    if !compress || raw.len() < 256 {
        return false;
    }
    fn via(scratch: &mut Scratch, raw: &[u8], out: &mut Vec<u8>) -> bool {
        delta_encode(raw, &mut scratch.delta);
        let max = lz4_flex::block::get_maximum_output_size(raw.len());
        if scratch.block.len() < max {
            scratch.block.resize(max, 0);
        }
        match lz4_flex::block::compress_into(&scratch.delta, &mut scratch.block[..max]) {
            Ok(n) if n < raw.len() => {
                out.extend_from_slice(&scratch.block[..n]);
                true
            }
            _ => false,
        }
    }
    SCRATCH
        .try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => via(&mut scratch, raw, out),
            Err(_) => via(&mut Scratch::default(), raw, out),
        })
        .unwrap_or_else(|_| via(&mut Scratch::default(), raw, out))
}

#[cfg(not(feature = "compress"))]
fn compress_onto(_out: &mut Vec<u8>, _raw: &[u8], _compress: bool) -> bool {
    false
}

pub fn write_conn_close<W: Write>(
    w: &mut W,
    conn: u32,
    t_unix_ns: u64,
    reason: CloseReason,
    message: &str,
) -> io::Result<()> {
    let mut p = Vec::new();
    let mut wr = Writer { buf: &mut p };
    wr.u32(conn);
    wr.u64(t_unix_ns);
    wr.u8(reason as u8);
    wr.str(message);
    write_record(w, record_type::CONN_CLOSE, &p)
}

pub fn write_end<W: Write>(w: &mut W, t_unix_ns: u64, conns: u32) -> io::Result<()> {
    let mut p = Vec::new();
    let mut wr = Writer { buf: &mut p };
    wr.u64(t_unix_ns);
    wr.u32(conns);
    write_record(w, record_type::END, &p)
}

pub fn write_incomplete<W: Write>(
    w: &mut W,
    t_unix_ns: u64,
    cause: WriteFailure,
    unwritten_bytes: u64,
    unwritten_events: u64,
    message: &str,
    made: &[ConnMade],
) -> io::Result<()> {
    let mut p = Vec::new();
    let mut wr = Writer { buf: &mut p };
    wr.u64(t_unix_ns);
    wr.u8(cause as u8);
    wr.u64(unwritten_bytes);
    wr.u64(unwritten_events);
    wr.str(message);
    let made = &made[..made.len().min(MAX_MADE_ENTRIES)];
    wr.u32(made.len() as u32);
    for m in made {
        wr.u32(m.conn);
        wr.u64(m.events);
        wr.u8(m.ending);
    }
    write_record(w, record_type::INCOMPLETE, &p)
}

/// Streams records from a trace file without holding it in memory.
pub struct TraceReader<R: Read> {
    inner: R,
    offset: u64,
    tail: Tail,
    pub header: FileHeader,
    /// The current record's bytes, reused from record to record.
    body: Vec<u8>,
    /// Buffers given back ([`TraceReader::recycle`]) for the next chunks' frames.
    spare: Vec<Vec<u8>>,
}

/// Reads as many bytes as are there, up to `buf.len()`; returns how many.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<usize, Error> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::Io(e.to_string())),
        }
    }
    Ok(got)
}

impl<R: Read> TraceReader<R> {
    pub fn new(mut inner: R) -> Result<Self, Error> {
        let mut fixed = [0u8; 16];
        let got = read_full(&mut inner, &mut fixed)?;
        if got < 8 || fixed[..8] != FILE_MAGIC {
            if got >= 8 && fixed[..8] == crate::wire::WIRE_MAGIC {
                return Err(Error::Malformed(
                    "this is a raw oomtrace socket stream, not a trace file",
                ));
            }
            return Err(Error::BadMagic);
        }
        if got < 16 {
            return Err(Error::Truncated);
        }
        let version = u16::from_le_bytes([fixed[8], fixed[9]]);
        if !(OLDEST_FILE_VERSION..=FILE_VERSION).contains(&version) {
            return Err(Error::UnsupportedVersion {
                found: version,
                oldest: OLDEST_FILE_VERSION,
                supported: FILE_VERSION,
            });
        }
        let rest_len = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
        if rest_len > 1 << 20 {
            return Err(Error::Malformed("file header is too long"));
        }
        let mut rest = vec![0u8; rest_len as usize];
        if read_full(&mut inner, &mut rest)? < rest.len() {
            return Err(Error::Truncated);
        }
        let mut r = Reader::new(&rest);
        let created_unix_ns = r.u64()?;
        let producer = r.str()?;
        Ok(TraceReader {
            inner,
            offset: 16 + rest_len as u64,
            tail: Tail::Open,
            header: FileHeader {
                version,
                created_unix_ns,
                producer,
            },
            body: Vec::new(),
            spare: Vec::new(),
        })
    }

    /// Gives back a chunk's `frames` once read, for a later chunk to decompress into: a
    /// reader of a long trace then allocates (and faults in) no new buffer per chunk.
    pub fn recycle(&mut self, frames: Vec<u8>) {
        if self.spare.len() < MAX_SPARE {
            self.spare.push(frames);
        }
    }

    /// How the file ended; meaningful once `next_record` returned `Ok(None)`.
    pub fn tail(&self) -> Tail {
        self.tail
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next record; `Ok(None)` at the end of the file, whole or truncated (see [`tail`]).
    ///
    /// [`tail`]: TraceReader::tail
    pub fn next_record(&mut self) -> Result<Option<Record>, Error> {
        if self.tail != Tail::Open {
            return Ok(None);
        }
        let start = self.offset;
        let mut len_buf = [0u8; 4];
        let got = read_full(&mut self.inner, &mut len_buf)?;
        if got == 0 {
            self.tail = Tail::Complete;
            return Ok(None);
        }
        if got < 4 {
            self.tail = Tail::Truncated {
                offset: start,
                bytes: got as u64,
            };
            return Ok(None);
        }
        let len = u32::from_le_bytes(len_buf);
        if len == 0 || len > MAX_RECORD {
            return Err(Error::Corrupt {
                offset: start,
                what: format!("record length {len} is out of range"),
            });
        }
        // Grown as the bytes arrive, never sized by the claim: a cut file claiming a 64 MiB
        // record costs what it holds.
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        body.reserve((len as usize).min(1 << 20));
        let got = (&mut self.inner)
            .take(u64::from(len))
            .read_to_end(&mut body);
        let rec = got
            .map_err(|e| Error::Io(e.to_string()))
            .and_then(|got| self.record(start, len, got, &body));
        self.body = body;
        rec
    }

    /// The record whose `got` of `len` bytes (after its length) are `body`, read at `start`.
    fn record(
        &mut self,
        start: u64,
        len: u32,
        got: usize,
        body: &[u8],
    ) -> Result<Option<Record>, Error> {
        if got < len as usize {
            self.tail = Tail::Truncated {
                offset: start,
                bytes: 4 + got as u64,
            };
            return Ok(None);
        }
        self.offset += 4 + len as u64;
        let corrupt = |what: String| Error::Corrupt {
            offset: start,
            what,
        };
        let ty = body[0];
        let mut r = Reader::new(&body[1..]);
        let rec = (|| -> Result<Record, Error> {
            Ok(match ty {
                record_type::CONN_OPEN => Record::ConnOpen {
                    conn: r.u32()?,
                    t_unix_ns: r.u64()?,
                    wire_version: r.u16()?,
                },
                record_type::CHUNK => {
                    let conn = r.u32()?;
                    let codec = r.u8()?;
                    let raw_len = r.u32()?;
                    let crc = r.u32()?;
                    let data = r.take(r.remaining())?;
                    let mut frames = self.spare.pop().unwrap_or_default();
                    decompress_block(codec, data, raw_len, &mut frames)?;
                    if crc32fast::hash(&frames) != crc {
                        return Err(Error::Malformed("chunk checksum mismatch"));
                    }
                    Record::Chunk { conn, frames }
                }
                record_type::CONN_CLOSE => Record::ConnClose {
                    conn: r.u32()?,
                    t_unix_ns: r.u64()?,
                    reason: CloseReason::from_u8(r.u8()?),
                    message: r.str()?,
                },
                record_type::END => Record::End {
                    t_unix_ns: r.u64()?,
                    conns: r.u32()?,
                },
                record_type::INCOMPLETE => Record::Incomplete {
                    t_unix_ns: r.u64()?,
                    cause: WriteFailure::from_u8(r.u8()?),
                    unwritten_bytes: r.u64()?,
                    unwritten_events: r.u64()?,
                    message: r.str()?,
                    made: {
                        let mut made = Vec::new();
                        if r.remaining() > 0 {
                            let n = r.u32()? as usize;
                            for _ in 0..n.min(MAX_MADE_ENTRIES) {
                                made.push(ConnMade {
                                    conn: r.u32()?,
                                    events: r.u64()?,
                                    ending: r.u8()?,
                                });
                            }
                        }
                        made
                    },
                },
                other => Record::Unknown { ty: other },
            })
        })()
        .map_err(|e| match e {
            Error::Corrupt { .. } => e,
            other => corrupt(other.to_string()),
        })?;
        Ok(Some(rec))
    }
}

/// Decompresses a chunk's `data` into `out` (its previous contents replaced).
fn decompress_block(codec: u8, data: &[u8], raw_len: u32, out: &mut Vec<u8>) -> Result<(), Error> {
    if raw_len > MAX_RECORD {
        return Err(Error::Malformed("chunk claims more than 64 MiB"));
    }
    match codec {
        CODEC_NONE => {
            if data.len() != raw_len as usize {
                return Err(Error::Malformed("uncompressed chunk length mismatch"));
            }
            out.clear();
            out.extend_from_slice(data);
            Ok(())
        }
        // LZ4 expands a byte to at most 255: a chunk claiming more than its bytes can hold
        // is garbage, refused before anything is allocated for the claim.
        #[cfg(feature = "compress")]
        CODEC_LZ4 | CODEC_LZ4_DELTA if u64::from(raw_len) > data.len() as u64 * 255 + 16 => Err(
            Error::Malformed("lz4 chunk claims more than its bytes can hold"),
        ),
        #[cfg(feature = "compress")]
        CODEC_LZ4 | CODEC_LZ4_DELTA => {
            // A recycled buffer is only zeroed where it grows (decompression overwrites); a
            // new one comes zeroed from the allocator (fresh pages, no memset).
            if out.capacity() < raw_len as usize {
                *out = vec![0; raw_len as usize];
            } else {
                out.resize(raw_len as usize, 0);
            }
            match lz4_flex::block::decompress_into(data, out) {
                Ok(n) => {
                    out.truncate(n);
                    if codec == CODEC_LZ4_DELTA {
                        delta_decode(out);
                    }
                    Ok(())
                }
                Err(_) => Err(Error::Malformed("lz4 chunk does not decompress")),
            }
        }
        #[cfg(not(feature = "compress"))]
        CODEC_LZ4 | CODEC_LZ4_DELTA => Err(Error::Malformed(
            "lz4 chunk, but this reader was built without compression",
        )),
        _ => Err(Error::Malformed("unknown chunk codec")),
    }
}

#[cfg(test)]
mod tests;
