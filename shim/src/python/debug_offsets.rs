//! 3.13+: the interpreter publishes its own offsets in `_Py_DebugOffsets`, the first field
//! of `_PyRuntime` (cookie "xdebugpy", then PY_VERSION_HEX as u64, then u64 offsets). The
//! struct grew fields in the middle between 3.13 and 3.14, so where each offset sits in it
//! is per minor version (positions checked on 3.13.0, 3.13.5 and 3.14.10; see
//! shim/README.md). The values themselves are always read from the running interpreter.

use std::ffi::c_void;

use oomtrace_proto::python::LineTableFormat;

use super::layout::{FrameModel, Layout};

/// Byte positions, inside `_Py_DebugOffsets`, of the offsets the walk needs.
struct Positions {
    current_frame: usize,
    frame_previous: usize,
    frame_executable: usize,
    frame_instr_ptr: usize,
    frame_owner: usize,
    co_filename: usize,
    co_qualname: usize,
    co_linetable: usize,
    co_firstlineno: usize,
    co_code_adaptive: usize,
    str_ascii_size: usize,
    /// Value of `owner` that marks the sentinel frame at each interpreter-loop entry.
    owner_entry: u8,
    tagged_code: bool,
}

fn positions(minor: u8) -> Option<Positions> {
    Some(match minor {
        13 => Positions {
            current_frame: 184,
            frame_previous: 232,
            frame_executable: 240,
            frame_instr_ptr: 248,
            frame_owner: 264,
            co_filename: 280,
            co_qualname: 296,
            co_linetable: 304,
            co_firstlineno: 312,
            co_code_adaptive: 344,
            str_ascii_size: 560,
            owner_entry: 3, // FRAME_OWNED_BY_CSTACK
            tagged_code: false,
        },
        14 => Positions {
            current_frame: 208,
            frame_previous: 256,
            frame_executable: 264,
            frame_instr_ptr: 272,
            frame_owner: 288,
            co_filename: 320,
            co_qualname: 336,
            co_linetable: 344,
            co_firstlineno: 352,
            co_code_adaptive: 384,
            str_ascii_size: 640,
            owner_entry: 3, // FRAME_OWNED_BY_INTERPRETER
            tagged_code: true,
        },
        _ => return None,
    })
}

/// The layout of the running 3.13+ interpreter, or None if its debug offsets are missing
/// or of a version we have not checked.
pub fn read(runtime: *mut c_void, major: u8, minor: u8) -> Option<Layout> {
    if runtime.is_null() || major != 3 {
        return None;
    }
    let pos = positions(minor)?;
    let base = runtime as *const u8;
    // SAFETY: `_PyRuntime` is a static of at least this size in every 3.13+ interpreter
    // (the debug offsets alone are 584 bytes in 3.13, 760 in 3.14).
    let word = |at: usize| -> usize {
        // SAFETY: see above; callers read offsets within the debug offsets.
        (unsafe { (base.add(at) as *const u64).read_unaligned() }) as usize
    };
    // SAFETY: the first 8 bytes of `_PyRuntime` (the cookie).
    let cookie = unsafe { std::slice::from_raw_parts(base, 8) };
    if cookie != b"xdebugpy" {
        return None;
    }
    let version = word(8) as u64;
    if (version >> 24, (version >> 16) & 0xff) != (3, minor as u64) {
        return None;
    }
    let ascii = word(pos.str_ascii_size);
    // Sanity: offsets are small; a wrong position would give nonsense.
    let all = [
        word(pos.current_frame),
        word(pos.frame_previous),
        word(pos.frame_executable),
        word(pos.frame_instr_ptr),
        word(pos.frame_owner),
        word(pos.co_filename),
        word(pos.co_qualname),
        word(pos.co_linetable),
        word(pos.co_firstlineno),
        word(pos.co_code_adaptive),
        ascii,
    ];
    if all.iter().any(|&o| o >= 4096) {
        return None;
    }
    Some(Layout {
        version: (major, minor),
        model: FrameModel::Interpreter {
            is_entry: None,
            owner: word(pos.frame_owner),
            owner_cstack: pos.owner_entry,
            tagged_code: pos.tagged_code,
            offset_of_code: word(pos.co_code_adaptive),
        },
        ts_frame: word(pos.current_frame),
        cframe_current: None,
        frame_back: word(pos.frame_previous),
        frame_code: word(pos.frame_executable),
        frame_lasti: word(pos.frame_instr_ptr),
        co_filename: word(pos.co_filename),
        co_name: word(pos.co_qualname),
        co_firstlineno: word(pos.co_firstlineno),
        co_linetable: word(pos.co_linetable),
        table_format: LineTableFormat::Locations311,
        str_length: 16,
        str_state: 32,
        str_ascii_size: ascii,
        // PyCompactUnicodeObject adds utf8_length and utf8 to the ASCII header.
        str_compact_size: ascii + 16,
        bytes_size: 16,
        bytes_data: 32,
    })
}
