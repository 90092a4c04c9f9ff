//! Python frames inside a stack, and the code objects they refer to.
//!
//! A `StackDef` is a list of u64 frames, innermost first. Native return addresses on x86-64
//! Linux are user-space addresses below 2^47; a frame with bit 63 set is a Python frame:
//!
//! ```text
//! bit 63      1 = Python frame
//! bit 62      group end: the outermost Python frame run by one native call of the
//!             interpreter loop (the collector splices each group in at one native
//!             `_PyEval_EvalFrameDefault` frame)
//! bits 32..61 code id (a `CodeDef` sent earlier on the same connection)
//! bits 0..31  byte offset of the executing instruction in the code object's bytecode
//! ```
//!
//! Python frames follow the native frames of the same stack, innermost first.
//! A `CodeDef` carries what the collector needs to turn an offset into a line: the code
//! object's file, name and first line, and its line table in the interpreter's own format.

const PY_FLAG: u64 = 1 << 63;
const GROUP_END: u64 = 1 << 62;
/// Code ids are 30 bits wide.
pub const MAX_CODE_ID: u32 = (1 << 30) - 1;

/// One Python frame of a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PyFrame {
    pub code: u32,
    pub offset: u32,
    pub group_end: bool,
}

impl PyFrame {
    pub fn encode(self) -> u64 {
        PY_FLAG
            | if self.group_end { GROUP_END } else { 0 }
            | ((self.code as u64 & MAX_CODE_ID as u64) << 32)
            | self.offset as u64
    }

    /// The Python frame in a stack entry, or None for a native return address.
    pub fn decode(frame: u64) -> Option<PyFrame> {
        if frame & PY_FLAG == 0 {
            return None;
        }
        Some(PyFrame {
            code: ((frame >> 32) as u32) & MAX_CODE_ID,
            offset: frame as u32,
            group_end: frame & GROUP_END != 0,
        })
    }
}

/// The format of a code object's line table, which changed with the interpreter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LineTableFormat {
    /// `co_lnotab` (3.9 and before): pairs of (bytecode delta, signed line delta).
    Lnotab = 1,
    /// `co_linetable` of 3.10 (PEP 626): pairs of (bytecode delta, signed line delta, -128 = none).
    Linetable310 = 2,
    /// `co_linetable` of 3.11+ (PEP 657 location table), in code units of 2 bytes.
    Locations311 = 3,
}

impl LineTableFormat {
    pub fn from_u8(v: u8) -> Option<LineTableFormat> {
        match v {
            1 => Some(LineTableFormat::Lnotab),
            2 => Some(LineTableFormat::Linetable310),
            3 => Some(LineTableFormat::Locations311),
            _ => None,
        }
    }
}

/// A code object, sent once per connection before the first stack that uses it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CodeDef {
    pub id: u32,
    /// `LineTableFormat` as u8 (unknown values: lines are not computed).
    pub format: u8,
    pub first_line: u32,
    pub filename: String,
    /// The qualified name where the interpreter has one (3.11+), else the name.
    pub name: String,
    pub line_table: Vec<u8>,
}

impl CodeDef {
    /// The source line of the instruction at byte `offset`, if the table says.
    pub fn line_at(&self, offset: u32) -> Option<u32> {
        let line = match LineTableFormat::from_u8(self.format)? {
            LineTableFormat::Lnotab => lnotab_line(&self.line_table, self.first_line, offset),
            LineTableFormat::Linetable310 => {
                linetable310_line(&self.line_table, self.first_line, offset)
            }
            LineTableFormat::Locations311 => {
                locations_line(&self.line_table, self.first_line, offset)
            }
        }?;
        u32::try_from(line).ok().filter(|&l| l > 0)
    }
}

/// CPython 3.9 `PyCode_Addr2Line` over `co_lnotab`.
fn lnotab_line(table: &[u8], first: u32, offset: u32) -> Option<i64> {
    let mut line = first as i64;
    let mut addr: u32 = 0;
    for pair in table.chunks_exact(2) {
        addr += pair[0] as u32;
        if addr > offset {
            break;
        }
        line += pair[1] as i8 as i64;
    }
    Some(line)
}

/// CPython 3.10 `_PyCode_CheckLineNumber` over `co_linetable`: entries (start delta, line
/// delta) where each entry covers [start, start + delta) and a line delta of -128 means none.
fn linetable310_line(table: &[u8], first: u32, offset: u32) -> Option<i64> {
    let mut line = first as i64;
    let mut start: u32 = 0;
    for pair in table.chunks_exact(2) {
        let end = start + pair[0] as u32;
        let ldelta = pair[1] as i8;
        if ldelta != -128 {
            line += ldelta as i64;
        }
        if start <= offset && offset < end {
            return if ldelta == -128 { None } else { Some(line) };
        }
        start = end;
    }
    None
}

/// CPython 3.11+ location table (Objects/locations.md): a sequence of entries, each starting
/// with a byte `1 code:4 length-1:3` (length in code units of 2 bytes).
fn locations_line(table: &[u8], first: u32, offset: u32) -> Option<i64> {
    let target = offset / 2;
    let mut line = first as i64;
    let mut unit: u32 = 0;
    let mut i = 0;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            return None; // lost sync: not a table we understand
        }
        i += 1;
        let code = (head >> 3) & 15;
        let len = (head & 7) as u32 + 1;
        let (delta, has_line) = match code {
            15 => (0, false),
            14 => {
                let d = svarint(table, &mut i)?;
                varint(table, &mut i)?; // end line delta
                varint(table, &mut i)?; // column + 1
                varint(table, &mut i)?; // end column + 1
                (d, true)
            }
            13 => (svarint(table, &mut i)?, true),
            10..=12 => {
                i += 2; // start and end column bytes
                ((code - 10) as i64, true)
            }
            _ => {
                i += 1; // short form: one column byte
                (0, true)
            }
        };
        line += delta;
        if unit <= target && target < unit + len {
            return has_line.then_some(line);
        }
        unit += len;
    }
    None
}

fn varint(t: &[u8], i: &mut usize) -> Option<i64> {
    let mut b = *t.get(*i)?;
    *i += 1;
    let mut val = (b & 63) as i64;
    let mut shift = 0;
    while b & 64 != 0 {
        b = *t.get(*i)?;
        *i += 1;
        shift += 6;
        if shift > 56 {
            return None;
        }
        val |= ((b & 63) as i64) << shift;
    }
    Some(val)
}

fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
    let u = varint(t, i)?;
    Some(if u & 1 != 0 { -(u >> 1) } else { u >> 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_tag_round_trips_and_never_collides_with_addresses() {
        let f = PyFrame {
            code: 12345,
            offset: 678,
            group_end: true,
        };
        assert_eq!(PyFrame::decode(f.encode()), Some(f));
        assert_eq!(PyFrame::decode(0x7fff_ffff_ffff), None);
    }

    #[test]
    fn locations_table_short_one_line_and_long_forms() {
        // first line 10; 2 units short form (line 10); 1 unit one-line form +2 (line 12);
        // 3 units no-location; 1 unit long form -1 (line 11).
        let t = [
            0x80 | 1, // code 0 (short form), 2 units
            0x05,
            0x80 | (12 << 3),
            1,
            4,
            0x80 | (15 << 3) | 2,
            0x80 | (14 << 3),
            0x03, // svarint -1
            0,
            1,
            1,
        ];
        let c = CodeDef {
            format: LineTableFormat::Locations311 as u8,
            first_line: 10,
            line_table: t.to_vec(),
            ..Default::default()
        };
        assert_eq!(c.line_at(0), Some(10));
        assert_eq!(c.line_at(2), Some(10));
        assert_eq!(c.line_at(4), Some(12));
        assert_eq!(c.line_at(6), None);
        assert_eq!(c.line_at(12), Some(11));
        assert_eq!(c.line_at(14), None);
    }

    #[test]
    fn lnotab_and_linetable310() {
        let lnotab = CodeDef {
            format: LineTableFormat::Lnotab as u8,
            first_line: 1,
            line_table: vec![4, 1, 6, 2],
            ..Default::default()
        };
        assert_eq!(lnotab.line_at(0), Some(1));
        assert_eq!(lnotab.line_at(4), Some(2));
        assert_eq!(lnotab.line_at(12), Some(4));
        let lt = CodeDef {
            format: LineTableFormat::Linetable310 as u8,
            first_line: 5,
            line_table: vec![4, 1, 2, 0x80, 6, 2],
            ..Default::default()
        };
        assert_eq!(lt.line_at(0), Some(6));
        assert_eq!(lt.line_at(4), None);
        assert_eq!(lt.line_at(8), Some(8));
        assert_eq!(lt.line_at(12), None);
    }
}
