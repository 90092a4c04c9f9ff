//! A pickle reader that runs no code: Python's pickle format (protocols 0 to 5) read into
//! plain values, for the memory snapshots PyTorch writes (`torch.cuda.memory._dump_snapshot`).
//!
//! Python's own `pickle.load` calls whatever a file names (`os.system` is one GLOBAL and one
//! REDUCE away), so a snapshot from someone else must never go through it. Here a GLOBAL, a
//! REDUCE, a NEWOBJ or a BUILD makes an opaque [`Value::Object`]: nothing is looked up,
//! called or built. Persistent ids and out-of-band buffers (which need a host to resolve
//! them) are errors.
//!
//! Bounded by the file: containers live in arenas ([`Pickle`]) and values are `Copy` handles
//! into them, so a memo reference shares instead of copying (a "billion laughs" file of nested
//! references costs what its bytes cost), nesting is never recursed into (no depth can
//! overflow a stack, here or when the values are dropped), and a container that holds itself
//! is only a handle to itself. Every opcode adds at most one value, so the values are at most
//! the file's bytes; the caller bounds the file ([`super::MAX_SNAPSHOT_BYTES`]).
//!
//! Why not a crate: `serde-pickle`, the maintained one, resolves memo references by cloning
//! (the nested-reference file above grows exponentially) and recurses on nesting.

use std::fmt;

/// One value. Containers and strings are handles into their [`Pickle`]'s arenas.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer beyond 64 bits (its value is not kept).
    BigInt,
    Float(f64),
    Str(u32),
    /// Bytes (their content is not kept: nothing a snapshot needs is bytes).
    Bytes,
    List(u32),
    Tuple(u32),
    Dict(u32),
    /// A set or frozenset (its items, as a list).
    Set(u32),
    /// A class, an instance or a call's result: never looked up, never built.
    Object,
}

/// What was read: the top value and the arenas its handles point into.
#[derive(Debug, Default)]
pub struct Pickle {
    pub root: Option<Value>,
    strings: Vec<Box<str>>,
    /// Lists, tuples and sets.
    seqs: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
}

/// Why a file is not a pickle this reader takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    pub offset: usize,
    pub what: String,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.what, self.offset)
    }
}

impl Pickle {
    /// The items of a list, tuple or set; `None` for anything else.
    pub fn seq(&self, v: Value) -> Option<&[Value]> {
        match v {
            Value::List(i) | Value::Tuple(i) | Value::Set(i) => {
                self.seqs.get(i as usize).map(Vec::as_slice)
            }
            _ => None,
        }
    }

    /// The string `v` is, if it is one.
    pub fn str(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(i) => self.strings.get(i as usize).map(|s| &**s),
            _ => None,
        }
    }

    /// The value under string key `key` of dict `v` (the last one, as Python keeps).
    pub fn get(&self, v: Value, key: &str) -> Option<Value> {
        let Value::Dict(i) = v else {
            return None;
        };
        self.dicts
            .get(i as usize)?
            .iter()
            .rev()
            .find(|(k, _)| self.str(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    /// Whether `v` is a dict.
    pub fn is_dict(&self, v: Value) -> bool {
        matches!(v, Value::Dict(_))
    }
}

/// Reads one pickle (up to its STOP opcode) from `bytes`.
pub fn read(bytes: &[u8]) -> Result<Pickle, PickleError> {
    Reader {
        bytes,
        at: 0,
        out: Pickle::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
    }
    .run()
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    out: Pickle,
    stack: Vec<Value>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    /// Memo slots by index (pickle numbers them densely from 0); `None`: never set.
    memo: Vec<Option<Value>>,
}

/// Memo indices a file may use: more than any file within the size bound can set.
const MAX_MEMO_INDEX: usize = 1 << 31;

impl Reader<'_> {
    fn fail<T>(&self, what: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError {
            offset: self.at,
            what: what.into(),
        })
    }

    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => self.fail("the file ends inside a value"),
        }
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    /// A length field: bounded by what is left of the file.
    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let v = self.le(n)?;
        if v > (self.bytes.len() - self.at) as u64 {
            return self.fail(format!(
                "a length of {v} bytes runs past the end of the file"
            ));
        }
        Ok(v as usize)
    }

    /// A text line (protocol 0), without its newline.
    fn line(&mut self) -> Result<&str, PickleError> {
        let rest = &self.bytes[self.at..];
        let Some(n) = rest.iter().position(|&b| b == b'\n') else {
            return self.fail("the file ends inside a text line");
        };
        self.at += n + 1;
        std::str::from_utf8(&rest[..n]).or_else(|_| self.fail("a text line is not UTF-8"))
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(v) if self.marks.last().is_none_or(|&m| self.stack.len() >= m) => Ok(v),
            Some(v) => {
                self.stack.push(v);
                self.fail("an opcode takes a value from below its mark")
            }
            None => self.fail("an opcode takes a value from an empty stack"),
        }
    }

    fn top(&mut self) -> Result<Value, PickleError> {
        match self.stack.last() {
            Some(&v) => Ok(v),
            None => self.fail("an opcode needs a value on an empty stack"),
        }
    }

    /// The values pushed since the last MARK (the mark removed).
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let Some(m) = self.marks.pop() else {
            return self.fail("an opcode needs a MARK and there is none");
        };
        Ok(self.stack.split_off(m))
    }

    fn string(&mut self, s: &str) -> Value {
        self.out.strings.push(s.into());
        Value::Str((self.out.strings.len() - 1) as u32)
    }

    fn utf8(&mut self, n: usize) -> Result<Value, PickleError> {
        let at = self.at;
        let b = self.take(n)?;
        match std::str::from_utf8(b) {
            Ok(s) => {
                let s: Box<str> = s.into();
                self.out.strings.push(s);
                Ok(Value::Str((self.out.strings.len() - 1) as u32))
            }
            Err(_) => Err(PickleError {
                offset: at,
                what: "a string is not UTF-8".into(),
            }),
        }
    }

    fn seq(&mut self, items: Vec<Value>, make: fn(u32) -> Value) -> Value {
        self.out.seqs.push(items);
        make((self.out.seqs.len() - 1) as u32)
    }

    fn extend(&mut self, target: Value, items: Vec<Value>) -> Result<(), PickleError> {
        match target {
            Value::List(i) | Value::Set(i) => {
                self.out.seqs[i as usize].extend(items);
                Ok(())
            }
            // Appending to an object calls its `append`/`extend`: nothing is called here.
            Value::Object => Ok(()),
            _ => self.fail("APPEND to something that is not a list"),
        }
    }

    fn set_items(&mut self, target: Value, items: Vec<Value>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return self.fail("SETITEMS with a key and no value");
        }
        match target {
            Value::Dict(i) => {
                let d = &mut self.out.dicts[i as usize];
                d.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            Value::Object => Ok(()),
            _ => self.fail("SETITEM on something that is not a dict"),
        }
    }

    fn memo_put(&mut self, index: usize) -> Result<(), PickleError> {
        if index >= MAX_MEMO_INDEX || index > self.bytes.len() {
            return self.fail(format!("memo index {index} is out of range"));
        }
        let v = self.top()?;
        if self.memo.len() <= index {
            self.memo.resize(index + 1, None);
        }
        self.memo[index] = Some(v);
        Ok(())
    }

    fn memo_get(&mut self, index: usize) -> Result<(), PickleError> {
        match self.memo.get(index).copied().flatten() {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => self.fail(format!("memo index {index} was never set")),
        }
    }

    fn run(mut self) -> Result<Pickle, PickleError> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    let proto = self.u8()?;
                    if proto > 5 {
                        return self.fail(format!("pickle protocol {proto} is newer than 5"));
                    }
                }
                0x95 => {
                    self.le(8)?;
                }
                b'.' => {
                    let root = self.pop()?;
                    self.out.root = Some(root);
                    return Ok(self.out);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?;
                    self.stack.push(v);
                }
                b'N' => self.stack.push(Value::None),
                0x88 => self.stack.push(Value::Bool(true)),
                0x89 => self.stack.push(Value::Bool(false)),
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.stack.push(Value::Int(v as i64));
                }
                b'K' => {
                    let v = self.le(1)?;
                    self.stack.push(Value::Int(v as i64));
                }
                b'M' => {
                    let v = self.le(2)?;
                    self.stack.push(Value::Int(v as i64));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        self.len(1)?
                    } else {
                        self.len(4)?
                    };
                    let b = self.take(n)?;
                    let v = if n == 0 {
                        Value::Int(0)
                    } else if n <= 8 {
                        // Two's complement, little-endian, sign-extended.
                        let mut raw = [if b[n - 1] & 0x80 != 0 { 0xff } else { 0 }; 8];
                        raw[..n].copy_from_slice(b);
                        Value::Int(i64::from_le_bytes(raw))
                    } else {
                        Value::BigInt
                    };
                    self.stack.push(v);
                }
                b'I' | b'L' => {
                    let line = self.line()?.trim_end_matches('L').to_owned();
                    let v = match line.as_str() {
                        "01" if op == b'I' => Value::Bool(true),
                        "00" if op == b'I' => Value::Bool(false),
                        s => s.parse().map(Value::Int).unwrap_or(Value::BigInt),
                    };
                    self.stack.push(v);
                }
                b'G' => {
                    let b = self.take(8)?;
                    let v = f64::from_be_bytes(b.try_into().unwrap_or([0; 8]));
                    self.stack.push(Value::Float(v));
                }
                b'F' => {
                    let v = self.line()?.parse().unwrap_or(f64::NAN);
                    self.stack.push(Value::Float(v));
                }
                0x8c => {
                    let n = self.len(1)?;
                    let v = self.utf8(n)?;
                    self.stack.push(v);
                }
                b'X' => {
                    let n = self.len(4)?;
                    let v = self.utf8(n)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = self.len(8)?;
                    let v = self.utf8(n)?;
                    self.stack.push(v);
                }
                b'V' => {
                    // raw-unicode-escape: ASCII and \uXXXX escapes; kept as written.
                    let s = self.line()?.to_owned();
                    let v = self.string(&s);
                    self.stack.push(v);
                }
                b'S' => {
                    let s = self
                        .line()?
                        .trim_matches(|c| c == '\'' || c == '"')
                        .to_owned();
                    let v = self.string(&s);
                    self.stack.push(v);
                }
                b'C' | b'U' => {
                    let n = self.len(1)?;
                    self.take(n)?;
                    self.stack.push(Value::Bytes);
                }
                b'B' | b'T' => {
                    let n = self.len(4)?;
                    self.take(n)?;
                    self.stack.push(Value::Bytes);
                }
                0x8e | 0x96 => {
                    let n = self.len(8)?;
                    self.take(n)?;
                    self.stack.push(Value::Bytes);
                }
                b']' => {
                    let v = self.seq(Vec::new(), Value::List);
                    self.stack.push(v);
                }
                b')' => {
                    let v = self.seq(Vec::new(), Value::Tuple);
                    self.stack.push(v);
                }
                0x8f => {
                    let v = self.seq(Vec::new(), Value::Set);
                    self.stack.push(v);
                }
                b'}' => {
                    self.out.dicts.push(Vec::new());
                    self.stack
                        .push(Value::Dict((self.out.dicts.len() - 1) as u32));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    let v = self.seq(items, Value::List);
                    self.stack.push(v);
                }
                b't' => {
                    let items = self.pop_mark()?;
                    let v = self.seq(items, Value::Tuple);
                    self.stack.push(v);
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    let v = self.seq(items, Value::Set);
                    self.stack.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    let v = self.seq(items, Value::Tuple);
                    self.stack.push(v);
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.out.dicts.push(Vec::new());
                    let d = Value::Dict((self.out.dicts.len() - 1) as u32);
                    self.set_items(d, items)?;
                    self.stack.push(d);
                }
                b'a' => {
                    let v = self.pop()?;
                    let target = self.top()?;
                    self.extend(target, vec![v])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    self.extend(target, items)?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let target = self.top()?;
                    self.set_items(target, vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    self.set_items(target, items)?;
                }
                0x94 => {
                    let index = self.memo.len();
                    self.memo_put(index)?;
                }
                b'q' => {
                    let i = self.le(1)? as usize;
                    self.memo_put(i)?;
                }
                b'r' => {
                    let i = self.le(4)? as usize;
                    self.memo_put(i)?;
                }
                b'p' => {
                    let i = self.line()?.parse().unwrap_or(usize::MAX);
                    self.memo_put(i)?;
                }
                b'h' => {
                    let i = self.le(1)? as usize;
                    self.memo_get(i)?;
                }
                b'j' => {
                    let i = self.le(4)? as usize;
                    self.memo_get(i)?;
                }
                b'g' => {
                    let i = self.line()?.parse().unwrap_or(usize::MAX);
                    self.memo_get(i)?;
                }
                // GLOBAL: a class or function by name. Never looked up.
                b'c' => {
                    self.line()?;
                    self.line()?;
                    self.stack.push(Value::Object);
                }
                0x93 => {
                    self.pop()?;
                    self.pop()?;
                    self.stack.push(Value::Object);
                }
                0x82 => {
                    self.take(1)?;
                    self.stack.push(Value::Object);
                }
                0x83 => {
                    self.take(2)?;
                    self.stack.push(Value::Object);
                }
                0x84 => {
                    self.take(4)?;
                    self.stack.push(Value::Object);
                }
                // REDUCE and NEWOBJ: a call. Never made: its result is opaque.
                b'R' | 0x81 => {
                    self.pop()?;
                    self.pop()?;
                    self.stack.push(Value::Object);
                }
                0x92 => {
                    self.pop()?;
                    self.pop()?;
                    self.pop()?;
                    self.stack.push(Value::Object);
                }
                // BUILD: sets an object's state. The object stays opaque.
                b'b' => {
                    self.pop()?;
                    self.top()?;
                }
                b'i' => {
                    self.line()?;
                    self.line()?;
                    self.pop_mark()?;
                    self.stack.push(Value::Object);
                }
                b'o' => {
                    self.pop_mark()?;
                    self.stack.push(Value::Object);
                }
                b'P' | b'Q' => {
                    return self.fail(
                        "the pickle refers to persistent objects (a torch.save file?), which \
                         only the program that wrote it can resolve",
                    )
                }
                0x97 | 0x98 => return self.fail("the pickle refers to out-of-band buffers"),
                other => return self.fail(format!("unknown pickle opcode {other:#04x}")),
            }
        }
    }
}

#[cfg(test)]
mod tests;
