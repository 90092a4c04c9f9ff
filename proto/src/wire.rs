//! Length-framed records from the shim to the collector.
//!
//! A connection starts with a 16-byte stream header, then frames:
//!
//! ```text
//! stream header: magic "OOMTWIRE" (8) | version u16 | flags u16 | reserved u32
//! frame:         len u32 (bytes after this field) | type u8 | payload (len - 1 bytes)
//! ```
//!
//! Frame payloads (all integers little-endian; `str` = u16 length + UTF-8 bytes):
//!
//! ```text
//! 1 Hello      pid u32 | ppid u32 | start_unix_ns u64 | flags u32 | shim_version str
//!              | exe str | argc u16 | argv str * argc
//!              [ | start_mono_ns u64 | host str | nvars u16 | (name str, value str) * nvars ]
//!              (the bracketed tail: the monotonic clock at `start_unix_ns`, so that event
//!              times can be put on the wall clock; the host name; the launcher's variables,
//!              see `launch.rs`. Absent in traces written before it: read as 0 and empty)
//! 2 Events     count u32 | Event (64 bytes) * count
//! 3 StackDef   id u32 | n u16 | reserved u16 | frame u64 * n   (return addresses, innermost first)
//! 4 ModuleDef  id u32 | start u64 | end u64 | bias u64 | build_id_len u8 | build_id | path str
//!              [ | file_size u64 | file_mtime_ns i64 ]
//!              (the bracketed tail: the file's size and modification time when the shim
//!              first saw the module, recorded for a module without a build id, so that a
//!              reader can tell whether the file on disk is still the one that ran; size 0:
//!              not recorded. Absent in traces written before it: read as not recorded)
//! 5 ModuleGone id u32
//! 6 Marker     seq u64 | ts_ns u64 | tid u32 | stack u32 | label str
//! 7 Lost       events u64 | frees u64 | stacks u64 | n u8 | (device i16, count u64) * n
//!              (cumulative counts of events the shim could not deliver)
//! 8 Goodbye    reason u8 | last_seq u64
//! 9 CodeDef    id u32 | format u8 | first_line u32 | filename str | name str
//!              | table_len u32 | line_table (a Python code object, see `python.rs`)
//! 10 Launch    nvars u16 | (name str, value str) * nvars
//!              (launcher variables learnt after the Hello, e.g. the rank that
//!              `torch.distributed.init_process_group` was given; each replaces the Hello's
//!              variable of the same name)
//! 11 Made      events u64 | ending u8
//!              (every event and step marker the process made, delivered or not: what the
//!              Events and Marker frames hold plus what was lost, counted at the hook; the
//!              last one counts. The shim sends it just before its Goodbye; the collector
//!              writes one itself from the counter page (`counter_page.rs`) when a stream
//!              ends with a larger count, e.g. without its Goodbye. `ending`: 0, or the
//!              `GoodbyeReason` the process began its end of stream with)
//! 12 TorchMemory ts_ns u64 | device i16 | allocated u64 | max_allocated u64 | reserved u64
//!              (PyTorch's own statistics of one device, read by the Python step hook right
//!              after a step marker: `torch.cuda.memory_allocated()`,
//!              `max_memory_allocated()`, `memory_reserved()`; sent through
//!              `oomtrace_torch_memory`. Not an event: not counted in `Made`. Readers ignore
//!              bytes after `reserved`, room for fields added later)
//! 13 FrameName addr u64 | module str | function str
//!              (a native frame its producer already named: the C++ frames of a PyTorch
//!              memory snapshot, read by `oomtrace report` and friends, which carry names
//!              and no addresses. Readers name a stack's frame `addr` by it and never look
//!              for a module there. The shim never sends it)
//! ```
//!
//! Readers skip frame types they do not know. Frames larger than [`MAX_FRAME`] are garbage.

use crate::event::{Event, StackId, EVENT_SIZE};
use crate::python::CodeDef;
use crate::Error;

pub const WIRE_MAGIC: [u8; 8] = *b"OOMTWIRE";
pub const WIRE_VERSION: u16 = 1;
pub const STREAM_HEADER_SIZE: usize = 16;
/// Largest frame a reader accepts. The shim never writes frames above 1 MiB.
pub const MAX_FRAME: u32 = 16 << 20;
/// Frame types. Pinned; never reuse a value.
pub mod frame_type {
    pub const HELLO: u8 = 1;
    pub const EVENTS: u8 = 2;
    pub const STACK_DEF: u8 = 3;
    pub const MODULE_DEF: u8 = 4;
    pub const MODULE_GONE: u8 = 5;
    pub const MARKER: u8 = 6;
    pub const LOST: u8 = 7;
    pub const GOODBYE: u8 = 8;
    pub const CODE_DEF: u8 = 9;
    pub const LAUNCH: u8 = 10;
    pub const MADE: u8 = 11;
    pub const TORCH_MEMORY: u8 = 12;
    pub const FRAME_NAME: u8 = 13;
}

/// Hello flags.
pub mod hello_flags {
    /// Native stacks are captured.
    pub const NATIVE_STACKS: u32 = 1 << 0;
    /// The stream never has step markers (a PyTorch snapshot read as a trace): readers take
    /// the epochs they find for its steps. The shim never sets it (a traced program's first
    /// marker may come late).
    pub const NO_STEP_MARKERS: u32 = 1 << 1;
}

/// Why a process said goodbye.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoodbyeReason {
    /// Normal `exit` (atexit handler).
    Exit = 1,
    /// `_exit`/`_Exit`: no atexit handlers ran, but the shim flushed.
    UnderscoreExit = 2,
    /// The shim stopped tracing (e.g. after an internal error) but the process lives on.
    Detach = 3,
}

impl GoodbyeReason {
    pub fn from_u8(v: u8) -> Option<GoodbyeReason> {
        Some(match v {
            1 => GoodbyeReason::Exit,
            2 => GoodbyeReason::UnderscoreExit,
            3 => GoodbyeReason::Detach,
            _ => return None,
        })
    }
}

pub fn stream_header() -> [u8; STREAM_HEADER_SIZE] {
    let mut h = [0u8; STREAM_HEADER_SIZE];
    h[..8].copy_from_slice(&WIRE_MAGIC);
    h[8..10].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    h
}

/// Checks a stream header and returns its version.
pub fn check_stream_header(h: &[u8]) -> Result<u16, Error> {
    if h.len() < STREAM_HEADER_SIZE {
        return Err(Error::Truncated);
    }
    if h[..8] != WIRE_MAGIC {
        return Err(Error::BadMagic);
    }
    let version = u16::from_le_bytes([h[8], h[9]]);
    if version != WIRE_VERSION {
        return Err(Error::UnsupportedVersion {
            found: version,
            oldest: WIRE_VERSION,
            supported: WIRE_VERSION,
        });
    }
    Ok(version)
}

/// Appends little-endian values to a buffer. Used to build frames in place.
pub struct Writer<'a> {
    pub buf: &'a mut Vec<u8>,
}

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i16(&mut self, v: i16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }
    /// A string of at most 65535 bytes; longer ones are cut at a char boundary.
    pub fn str(&mut self, s: &str) {
        let mut end = s.len().min(u16::MAX as usize);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..end]);
    }
}

/// Starts a frame of `ty` in `buf`; call [`end_frame`] with the returned offset when done.
pub fn begin_frame(buf: &mut Vec<u8>, ty: u8) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0, 0, 0, 0, ty]);
    at
}

/// Patches the length of the frame begun at `at`.
pub fn end_frame(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Reads little-endian values from a slice; every read is bounds-checked.
#[derive(Clone)]
pub struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Self {
        Reader { b }
    }
    pub fn remaining(&self) -> usize {
        self.b.len()
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.b.len() {
            return Err(Error::Malformed("field runs past the end of its frame"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, Error> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub fn i16(&mut self) -> Result<i16, Error> {
        Ok(self.u16()? as i16)
    }
    pub fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, Error> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A length-prefixed string; invalid UTF-8 is replaced, never rejected.
    pub fn str(&mut self) -> Result<String, Error> {
        let n = self.u16()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

/// `nvars u16 | (name str, value str) * nvars`.
fn read_vars(r: &mut Reader<'_>) -> Result<Vec<(String, String)>, Error> {
    let n = r.u16()?;
    let mut vars = Vec::with_capacity(usize::from(n).min(64));
    for _ in 0..n {
        let name = r.str()?;
        vars.push((name, r.str()?));
    }
    Ok(vars)
}

/// The process that opened a connection.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Hello {
    pub pid: u32,
    pub ppid: u32,
    pub start_unix_ns: u64,
    pub flags: u32,
    pub shim_version: String,
    pub exe: String,
    pub argv: Vec<String>,
    /// CLOCK_MONOTONIC (the events' clock) when `start_unix_ns` was read; 0 when unknown.
    pub start_mono_ns: u64,
    /// The host's name (`/proc/sys/kernel/hostname`); "" when unknown.
    pub host: String,
    /// The launcher's variables (`launch::LAUNCH_VARS`) that were set, as (name, value).
    pub launch: Vec<(String, String)>,
}

/// A module (executable or shared object) mapped into the traced process.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ModuleDef {
    pub id: u32,
    /// Lowest mapped address of the module's loadable segments.
    pub start: u64,
    /// One past the highest mapped address.
    pub end: u64,
    /// Load bias: runtime address minus the address stated in the ELF file.
    pub bias: u64,
    pub build_id: Vec<u8>,
    pub path: String,
    /// The file's size and modification time when the module was first seen; recorded only
    /// for a module without a build id (and only when its file could be read then).
    pub file: Option<FileStamp>,
}

/// What identifies a module's file when it has no build id: its size and modification time,
/// as `stat` gave them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileStamp {
    /// Bytes; never 0 (an empty file is no ELF object, and 0 means "not recorded" on the wire).
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i64,
}

impl FileStamp {
    /// The stamp of `meta`, or None for an empty file (which the wire cannot tell from none).
    pub fn of(meta: &std::fs::Metadata) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let mtime_ns = meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec());
        (meta.len() > 0).then_some(FileStamp {
            size: meta.len(),
            mtime_ns,
        })
    }
}

/// Cumulative loss counters of one process.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Lost {
    /// Every event that was not delivered (frees and allocations included).
    pub events: u64,
    /// Of which frees.
    pub frees: u64,
    /// Stack definitions that were not delivered (events that referred to them carry no stack).
    pub stacks: u64,
    /// Lost events by device (device -1 = unknown).
    pub by_device: Vec<(i16, u64)>,
}

/// PyTorch's caching-allocator statistics of one device, as the program itself read them
/// (`torch.cuda.memory_allocated(device)` and friends) right after a step marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TorchMemory {
    /// CLOCK_MONOTONIC, like the events' `ts_ns`.
    pub ts_ns: u64,
    /// The CUDA device ordinal PyTorch reported for.
    pub device: i16,
    /// Bytes of live tensors (`memory_allocated`).
    pub allocated: u64,
    /// The most bytes of live tensors since the program started or last reset PyTorch's
    /// peak statistics (`max_memory_allocated`).
    pub max_allocated: u64,
    /// Bytes of segments the caching allocator holds (`memory_reserved`).
    pub reserved: u64,
}

/// One decoded frame. Events stay undecoded until asked for, so that readers that only
/// forward bytes pay nothing.
#[derive(Clone, Debug)]
pub enum Frame<'a> {
    Hello(Hello),
    Events(EventBatch<'a>),
    StackDef {
        id: StackId,
        frames: Vec<u64>,
    },
    ModuleDef(ModuleDef),
    ModuleGone {
        id: u32,
    },
    Marker {
        seq: u64,
        ts_ns: u64,
        tid: u32,
        stack: StackId,
        label: String,
    },
    Lost(Lost),
    Goodbye {
        reason: u8,
        last_seq: u64,
    },
    CodeDef(CodeDef),
    /// Launcher variables learnt after the Hello (see `launch.rs`).
    Launch(Vec<(String, String)>),
    /// Events (and step markers) the process made, delivered or not; `ending`: 0, or the
    /// `GoodbyeReason` value it began its end of stream with.
    Made {
        events: u64,
        ending: u8,
    },
    /// PyTorch's own memory statistics of one device, read after a step marker.
    TorchMemory(TorchMemory),
    /// A native frame already named by its producer (a snapshot's C++ frame).
    FrameName {
        addr: u64,
        module: String,
        function: String,
    },
    /// A frame type this reader does not know; skipped.
    Unknown {
        ty: u8,
    },
}

/// A batch of encoded events; decode lazily with [`EventBatch::iter`].
#[derive(Clone, Copy, Debug)]
pub struct EventBatch<'a> {
    raw: &'a [u8],
}

impl<'a> EventBatch<'a> {
    pub fn len(&self) -> usize {
        self.raw.len() / EVENT_SIZE
    }
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
    pub fn iter(&self) -> impl Iterator<Item = Event> + 'a {
        // Cannot fail: the batch length was checked to be a multiple of EVENT_SIZE.
        self.raw
            .chunks_exact(EVENT_SIZE)
            .filter_map(|c| Event::decode(c).ok())
    }
}

/// Outcome of looking for the next frame in a buffer.
#[derive(Debug)]
pub enum Next<'a> {
    /// A whole frame, and how many bytes it used.
    Frame(Frame<'a>, usize),
    /// The buffer ends inside a frame; read more bytes.
    Incomplete,
}

/// Decodes the next frame at the start of `buf`. Never panics; garbage is an `Err`.
pub fn next_frame(buf: &[u8]) -> Result<Next<'_>, Error> {
    if buf.len() < 5 {
        return Ok(Next::Incomplete);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len == 0 || len > MAX_FRAME {
        return Err(Error::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME as u64,
        });
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(Next::Incomplete);
    }
    let ty = buf[4];
    let payload = &buf[5..total];
    Ok(Next::Frame(decode_payload(ty, payload)?, total))
}

fn decode_payload(ty: u8, payload: &[u8]) -> Result<Frame<'_>, Error> {
    use frame_type::*;
    let mut r = Reader::new(payload);
    let frame = match ty {
        HELLO => {
            let pid = r.u32()?;
            let ppid = r.u32()?;
            let start_unix_ns = r.u64()?;
            let flags = r.u32()?;
            let shim_version = r.str()?;
            let exe = r.str()?;
            let argc = r.u16()?;
            let mut argv = Vec::with_capacity(argc.min(256) as usize);
            for _ in 0..argc {
                argv.push(r.str()?);
            }
            // The tail came later: a Hello that ends here has no host and no launcher.
            let (mut start_mono_ns, mut host, mut launch) = (0, String::new(), Vec::new());
            if r.remaining() > 0 {
                start_mono_ns = r.u64()?;
                host = r.str()?;
                launch = read_vars(&mut r)?;
            }
            Frame::Hello(Hello {
                pid,
                ppid,
                start_unix_ns,
                flags,
                shim_version,
                exe,
                argv,
                start_mono_ns,
                host,
                launch,
            })
        }
        EVENTS => {
            let count = r.u32()? as usize;
            let bytes = count
                .checked_mul(EVENT_SIZE)
                .ok_or(Error::Malformed("event count overflows"))?;
            if bytes != r.remaining() {
                return Err(Error::Malformed("event count does not match frame length"));
            }
            Frame::Events(EventBatch {
                raw: r.take(bytes)?,
            })
        }
        STACK_DEF => {
            let id = StackId(r.u32()?);
            let n = r.u16()? as usize;
            let _reserved = r.u16()?;
            if n * 8 != r.remaining() {
                return Err(Error::Malformed("stack depth does not match frame length"));
            }
            let mut frames = Vec::with_capacity(n);
            for _ in 0..n {
                frames.push(r.u64()?);
            }
            if id.is_none() {
                return Err(Error::Malformed("stack id 0 is reserved"));
            }
            Frame::StackDef { id, frames }
        }
        MODULE_DEF => {
            let id = r.u32()?;
            let start = r.u64()?;
            let end = r.u64()?;
            let bias = r.u64()?;
            let n = r.u8()? as usize;
            let build_id = r.take(n)?.to_vec();
            let path = r.str()?;
            // The tail came later: a ModuleDef that ends here recorded no file stamp.
            let mut file = None;
            if r.remaining() > 0 {
                let size = r.u64()?;
                let mtime_ns = r.u64()? as i64;
                file = (size > 0).then_some(FileStamp { size, mtime_ns });
            }
            Frame::ModuleDef(ModuleDef {
                id,
                start,
                end,
                bias,
                build_id,
                path,
                file,
            })
        }
        MODULE_GONE => Frame::ModuleGone { id: r.u32()? },
        MARKER => Frame::Marker {
            seq: r.u64()?,
            ts_ns: r.u64()?,
            tid: r.u32()?,
            stack: StackId(r.u32()?),
            label: r.str()?,
        },
        LOST => {
            let events = r.u64()?;
            let frees = r.u64()?;
            let stacks = r.u64()?;
            let n = r.u8()?;
            let mut by_device = Vec::with_capacity(n as usize);
            for _ in 0..n {
                by_device.push((r.i16()?, r.u64()?));
            }
            Frame::Lost(Lost {
                events,
                frees,
                stacks,
                by_device,
            })
        }
        GOODBYE => Frame::Goodbye {
            reason: r.u8()?,
            last_seq: r.u64()?,
        },
        CODE_DEF => {
            let id = r.u32()?;
            let format = r.u8()?;
            let first_line = r.u32()?;
            let filename = r.str()?;
            let name = r.str()?;
            let n = r.u32()? as usize;
            if n != r.remaining() {
                return Err(Error::Malformed(
                    "line table length does not match frame length",
                ));
            }
            let line_table = r.take(n)?.to_vec();
            Frame::CodeDef(CodeDef {
                id,
                format,
                first_line,
                filename,
                name,
                line_table,
            })
        }
        LAUNCH => Frame::Launch(read_vars(&mut r)?),
        MADE => Frame::Made {
            events: r.u64()?,
            ending: r.u8()?,
        },
        TORCH_MEMORY => Frame::TorchMemory(TorchMemory {
            ts_ns: r.u64()?,
            device: r.i16()?,
            allocated: r.u64()?,
            max_allocated: r.u64()?,
            reserved: r.u64()?,
        }),
        FRAME_NAME => Frame::FrameName {
            addr: r.u64()?,
            module: r.str()?,
            function: r.str()?,
        },
        other => Frame::Unknown { ty: other },
    };
    Ok(frame)
}

/// Frame encoders. Each appends one whole frame to `buf`.
pub mod encode {
    use super::*;

    pub fn hello(buf: &mut Vec<u8>, h: &Hello) {
        let at = begin_frame(buf, frame_type::HELLO);
        let mut w = Writer { buf };
        w.u32(h.pid);
        w.u32(h.ppid);
        w.u64(h.start_unix_ns);
        w.u32(h.flags);
        w.str(&h.shim_version);
        w.str(&h.exe);
        let argc = h.argv.len().min(u16::MAX as usize);
        w.u16(argc as u16);
        for a in &h.argv[..argc] {
            w.str(a);
        }
        w.u64(h.start_mono_ns);
        w.str(&h.host);
        write_vars(&mut w, &h.launch);
        end_frame(buf, at);
    }

    /// Starts an Events frame; push events with [`push_event`] and close it with [`end_events`].
    pub fn begin_events(buf: &mut Vec<u8>) -> usize {
        let at = begin_frame(buf, frame_type::EVENTS);
        buf.extend_from_slice(&0u32.to_le_bytes());
        at
    }

    #[inline]
    pub fn push_event(buf: &mut Vec<u8>, e: &Event) {
        let mut raw = [0u8; EVENT_SIZE];
        e.encode(&mut raw);
        buf.extend_from_slice(&raw);
    }

    pub fn end_events(buf: &mut [u8], at: usize) {
        let count = ((buf.len() - at - 9) / EVENT_SIZE) as u32;
        buf[at + 5..at + 9].copy_from_slice(&count.to_le_bytes());
        end_frame(buf, at);
    }

    pub fn events(buf: &mut Vec<u8>, events: &[Event]) {
        let at = begin_events(buf);
        for e in events {
            push_event(buf, e);
        }
        end_events(buf, at);
    }

    pub fn stack_def(buf: &mut Vec<u8>, id: StackId, frames: &[u64]) {
        let n = frames.len().min(u16::MAX as usize);
        let at = begin_frame(buf, frame_type::STACK_DEF);
        let mut w = Writer { buf };
        w.u32(id.0);
        w.u16(n as u16);
        w.u16(0);
        for f in &frames[..n] {
            w.u64(*f);
        }
        end_frame(buf, at);
    }

    /// A code object; line tables beyond 1 MiB are sent empty (lines then unknown).
    pub fn code_def(buf: &mut Vec<u8>, c: &CodeDef) {
        let at = begin_frame(buf, frame_type::CODE_DEF);
        let mut w = Writer { buf };
        w.u32(c.id);
        w.u8(c.format);
        w.u32(c.first_line);
        w.str(&c.filename);
        w.str(&c.name);
        let table: &[u8] = if c.line_table.len() <= 1 << 20 {
            &c.line_table
        } else {
            &[]
        };
        w.u32(table.len() as u32);
        w.bytes(table);
        end_frame(buf, at);
    }

    pub fn module_def(buf: &mut Vec<u8>, m: &ModuleDef) {
        let at = begin_frame(buf, frame_type::MODULE_DEF);
        let mut w = Writer { buf };
        w.u32(m.id);
        w.u64(m.start);
        w.u64(m.end);
        w.u64(m.bias);
        let n = m.build_id.len().min(255);
        w.u8(n as u8);
        w.bytes(&m.build_id[..n]);
        w.str(&m.path);
        let stamp = m.file.unwrap_or(FileStamp {
            size: 0,
            mtime_ns: 0,
        });
        w.u64(stamp.size);
        w.u64(stamp.mtime_ns as u64);
        end_frame(buf, at);
    }

    pub fn module_gone(buf: &mut Vec<u8>, id: u32) {
        let at = begin_frame(buf, frame_type::MODULE_GONE);
        Writer { buf }.u32(id);
        end_frame(buf, at);
    }

    pub fn marker(buf: &mut Vec<u8>, seq: u64, ts_ns: u64, tid: u32, stack: StackId, label: &str) {
        let at = begin_frame(buf, frame_type::MARKER);
        let mut w = Writer { buf };
        w.u64(seq);
        w.u64(ts_ns);
        w.u32(tid);
        w.u32(stack.0);
        w.str(label);
        end_frame(buf, at);
    }

    pub fn lost(buf: &mut Vec<u8>, l: &Lost) {
        let at = begin_frame(buf, frame_type::LOST);
        let mut w = Writer { buf };
        w.u64(l.events);
        w.u64(l.frees);
        w.u64(l.stacks);
        let n = l.by_device.len().min(255);
        w.u8(n as u8);
        for (d, c) in &l.by_device[..n] {
            w.i16(*d);
            w.u64(*c);
        }
        end_frame(buf, at);
    }

    /// Launcher variables learnt after the Hello.
    pub fn launch(buf: &mut Vec<u8>, vars: &[(String, String)]) {
        let at = begin_frame(buf, frame_type::LAUNCH);
        write_vars(&mut Writer { buf }, vars);
        end_frame(buf, at);
    }

    /// `nvars u16 | (name str, value str) * nvars` (at most 65535 of them).
    fn write_vars(w: &mut Writer<'_>, vars: &[(String, String)]) {
        let n = vars.len().min(u16::MAX as usize);
        w.u16(n as u16);
        for (name, value) in &vars[..n] {
            w.str(name);
            w.str(value);
        }
    }

    /// What the process made (see the `Made` frame); `ending`: 0 or a `GoodbyeReason`.
    pub fn made(buf: &mut Vec<u8>, events: u64, ending: u8) {
        let at = begin_frame(buf, frame_type::MADE);
        let mut w = Writer { buf };
        w.u64(events);
        w.u8(ending);
        end_frame(buf, at);
    }

    /// PyTorch's own memory statistics of one device (see the `TorchMemory` frame).
    pub fn torch_memory(buf: &mut Vec<u8>, m: &TorchMemory) {
        let at = begin_frame(buf, frame_type::TORCH_MEMORY);
        let mut w = Writer { buf };
        w.u64(m.ts_ns);
        w.i16(m.device);
        w.u64(m.allocated);
        w.u64(m.max_allocated);
        w.u64(m.reserved);
        end_frame(buf, at);
    }

    /// A native frame named by its producer (see the `FrameName` frame).
    pub fn frame_name(buf: &mut Vec<u8>, addr: u64, module: &str, function: &str) {
        let at = begin_frame(buf, frame_type::FRAME_NAME);
        let mut w = Writer { buf };
        w.u64(addr);
        w.str(module);
        w.str(function);
        end_frame(buf, at);
    }

    pub fn goodbye(buf: &mut Vec<u8>, reason: GoodbyeReason, last_seq: u64) {
        let at = begin_frame(buf, frame_type::GOODBYE);
        let mut w = Writer { buf };
        w.u8(reason as u8);
        w.u64(last_seq);
        end_frame(buf, at);
    }
}

/// Splits a buffer of whole frames into frames; stops with `Err` at the first garbage.
pub fn frames(buf: &[u8]) -> impl Iterator<Item = Result<Frame<'_>, Error>> {
    let mut rest = buf;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || rest.is_empty() {
            return None;
        }
        match next_frame(rest) {
            Ok(Next::Frame(f, used)) => {
                rest = &rest[used..];
                Some(Ok(f))
            }
            Ok(Next::Incomplete) => {
                failed = true;
                Some(Err(Error::Truncated))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

#[cfg(test)]
mod tests;
