//! A minimal pickle writer, protocol 4, for what pytorch.org/memory_viz reads
//! (the subset of protocol 4 its JavaScript unpickler reads).
//!
//! Only opcodes the viewer's JavaScript unpickler accepts: PROTO, EMPTY_DICT, EMPTY_LIST,
//! MARK, SETITEMS, APPENDS, TUPLE2, BININT1, BININT2, BININT, LONG1 (at most 8 bytes: every
//! integer is an `i64`), BINFLOAT, NEWTRUE, NEWFALSE, SHORT_BINUNICODE, BINUNICODE,
//! MEMOIZE, BINGET, LONG_BINGET, STOP. No FRAME (optional in protocol 4), no classes.
//!
//! Strings are memoized (written once, then fetched with BINGET, as CPython does); callers
//! memoize shared containers themselves with [`Pickler::memoize`] + [`Pickler::get`]. Never
//! share a container the viewer mutates (trace entries, blocks).
//!
//! Write errors are sticky: the first one is kept and returned by [`Pickler::finish`].

use std::collections::HashMap;
use std::io::{self, Write};

mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const EMPTY_DICT: u8 = b'}';
    pub const EMPTY_LIST: u8 = b']';
    pub const SETITEMS: u8 = b'u';
    pub const APPENDS: u8 = b'e';
    pub const TUPLE2: u8 = 0x86;
    pub const BINFLOAT: u8 = b'G';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// Items per MARK ... APPENDS/SETITEMS batch (CPython's batch size).
pub const BATCH: usize = 1000;

pub struct Pickler<W: Write> {
    out: W,
    error: Option<io::Error>,
    /// Next memo index (MEMOIZE assigns indices in order).
    memo: u32,
    strings: HashMap<String, u32>,
}

impl<W: Write> Pickler<W> {
    /// Starts a protocol-4 pickle.
    pub fn new(out: W) -> Pickler<W> {
        let mut p = Pickler {
            out,
            error: None,
            memo: 0,
            strings: HashMap::new(),
        };
        p.raw(&[op::PROTO, 4]);
        p
    }

    fn raw(&mut self, b: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(b) {
                self.error = Some(e);
            }
        }
    }

    /// Ends the pickle (STOP) and returns the writer, or the first write error.
    pub fn finish(mut self) -> io::Result<W> {
        self.raw(&[op::STOP]);
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }

    pub fn int(&mut self, v: i64) {
        if (0..=0xff).contains(&v) {
            self.raw(&[op::BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.raw(&[op::BININT2, b[0], b[1]]);
        } else if i32::try_from(v).is_ok() {
            let b = (v as i32).to_le_bytes();
            self.raw(&[op::BININT, b[0], b[1], b[2], b[3]]);
        } else {
            // LONG1: minimal little-endian two's complement, at most 8 bytes.
            let b = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = b[n - 1];
                let next_sign = b[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.raw(&[op::LONG1, n as u8]);
            self.raw(&b[..n]);
        }
    }

    /// An unsigned value as an int64 (saturating: the viewer reads no wider integers).
    pub fn uint(&mut self, v: u64) {
        self.int(i64::try_from(v).unwrap_or(i64::MAX));
    }

    /// A float (BINFLOAT: 8 bytes, big-endian IEEE 754).
    pub fn float(&mut self, v: f64) {
        self.raw(&[op::BINFLOAT]);
        self.raw(&v.to_be_bytes());
    }

    pub fn bool(&mut self, v: bool) {
        self.raw(&[if v { op::NEWTRUE } else { op::NEWFALSE }]);
    }

    /// A string, written once and fetched from the memo afterwards.
    pub fn str(&mut self, s: &str) {
        if let Some(&i) = self.strings.get(s) {
            self.get(i);
            return;
        }
        let n = s.len();
        if n < 256 {
            self.raw(&[op::SHORT_BINUNICODE, n as u8]);
        } else {
            let len = u32::try_from(n).unwrap_or(u32::MAX);
            self.raw(&[op::BINUNICODE]);
            self.raw(&len.to_le_bytes());
        }
        let n = n.min(u32::MAX as usize);
        self.raw(&s.as_bytes()[..n]);
        let i = self.memoize();
        self.strings.insert(s.to_owned(), i);
    }

    pub fn empty_dict(&mut self) {
        self.raw(&[op::EMPTY_DICT]);
    }

    pub fn empty_list(&mut self) {
        self.raw(&[op::EMPTY_LIST]);
    }

    pub fn mark(&mut self) {
        self.raw(&[op::MARK]);
    }

    /// Pops key/value pairs down to the MARK into the dict below it.
    pub fn setitems(&mut self) {
        self.raw(&[op::SETITEMS]);
    }

    /// Pops items down to the MARK onto the list below it.
    pub fn appends(&mut self) {
        self.raw(&[op::APPENDS]);
    }

    /// The two values on top of the stack become a tuple.
    pub fn tuple2(&mut self) {
        self.raw(&[op::TUPLE2]);
    }

    /// Stores the object on top of the stack in the memo; returns its index.
    pub fn memoize(&mut self) -> u32 {
        self.raw(&[op::MEMOIZE]);
        self.memo += 1;
        self.memo - 1
    }

    /// Pushes the memoized object `i` again (a shared reference, not a copy).
    pub fn get(&mut self, i: u32) {
        if i < 256 {
            self.raw(&[op::BINGET, i as u8]);
        } else {
            self.raw(&[op::LONG_BINGET]);
            self.raw(&i.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn python_repr(bytes: &[u8]) -> Option<String> {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import pickle,sys,pickletools\n\
                 b=sys.stdin.buffer.read()\n\
                 ops={o.name for o,_,_ in pickletools.genops(b)}\n\
                 print(sorted(ops))\n\
                 v=pickle.loads(b)\n\
                 print(repr(v))\n\
                 print(v['shared'][0] is v['shared'][1])",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        child.stdin.take()?.write_all(bytes).ok()?;
        let out = child.wait_with_output().ok()?;
        assert!(out.status.success(), "python3 could not load the pickle");
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn round_trips_through_python() {
        let mut p = Pickler::new(Vec::new());
        fn list(p: &mut Pickler<Vec<u8>>, items: &mut dyn FnMut(&mut Pickler<Vec<u8>>)) {
            p.empty_list();
            p.mark();
            items(p);
            p.appends();
        }
        p.empty_dict();
        p.mark();
        p.str("ints");
        list(&mut p, &mut |p| {
            for v in [
                0,
                255,
                256,
                65535,
                65536,
                -1,
                -129,
                i32::MAX as i64 + 1,
                i32::MIN as i64 - 1,
                0x7f00_dead_beef,
                i64::MAX,
                i64::MIN,
            ] {
                p.int(v);
            }
        });
        p.str("strs");
        let long = "x".repeat(300);
        list(&mut p, &mut |p| {
            for v in ["ümlaut", &long, "ümlaut"] {
                p.str(v);
            }
        });
        p.str("misc");
        list(&mut p, &mut |p| {
            p.bool(true);
            p.bool(false);
            p.int(0);
            p.int(0);
            p.tuple2();
            p.float(0.0);
            p.float(-2.5);
        });
        p.str("shared");
        list(&mut p, &mut |p| {
            p.empty_dict();
            let i = p.memoize();
            p.mark();
            p.str("name");
            p.str("f");
            p.str("line");
            p.int(3);
            p.setitems();
            p.get(i);
        });
        p.str("big");
        p.uint(u64::MAX);
        p.setitems();
        let bytes = p.finish().unwrap();
        assert_eq!(&bytes[..2], &[0x80, 4]);
        let Some(text) = python_repr(&bytes) else {
            // Under CI (which installs python3) a skip would be a test that checked nothing.
            assert!(
                std::env::var_os("CI").is_none_or(|v| v.is_empty()),
                "this test needs python3 to read the pickle back, and CI must run it"
            );
            eprintln!("skipped: needs python3 to read the pickle back");
            return;
        };
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "['APPENDS', 'BINFLOAT', 'BINGET', 'BININT', 'BININT1', 'BININT2', 'BINUNICODE', \
             'EMPTY_DICT', \
             'EMPTY_LIST', 'LONG1', 'MARK', 'MEMOIZE', 'NEWFALSE', 'NEWTRUE', 'PROTO', \
             'SETITEMS', 'SHORT_BINUNICODE', 'STOP', 'TUPLE2']"
        );
        assert_eq!(
            lines[1],
            format!(
                "{{'ints': [0, 255, 256, 65535, 65536, -1, -129, 2147483648, -2147483649, \
                 139641712656111, 9223372036854775807, -9223372036854775808], \
                 'strs': ['ümlaut', '{long}', 'ümlaut'], 'misc': [True, False, (0, 0), 0.0, -2.5], \
                 'shared': [{{'name': 'f', 'line': 3}}, {{'name': 'f', 'line': 3}}], \
                 'big': 9223372036854775807}}"
            )
        );
        assert_eq!(lines[2], "True", "a memoized dict is one object");
    }
}
