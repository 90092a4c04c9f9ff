//! Where CPython keeps what the frame walk reads, per interpreter version (x86-64, release
//! builds with the GIL). 3.9 to 3.12 publish nothing, so their offsets are written here, as
//! py-spy and austin do; they were checked with `offsetof` against each version's headers
//! (see the table in `shim/README.md`). 3.13 and later publish them in `_Py_DebugOffsets` at
//! the start of `_PyRuntime`, read at run time by `from_debug_offsets`.

use oomtrace_proto::python::LineTableFormat;

/// How frames are linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameModel {
    /// 3.9, 3.10: heap `PyFrameObject`s; one interpreter-loop call per frame.
    Object {
        /// `f_lasti` counts code units of 2 bytes (3.10), not bytes (3.9).
        lasti_in_units: bool,
    },
    /// 3.11+: `_PyInterpreterFrame`s in a per-thread arena; one interpreter-loop call runs
    /// many of them.
    Interpreter {
        /// Offset of `is_entry` (3.11): set on the outermost frame of a loop call.
        is_entry: Option<usize>,
        /// Offset of `owner`, and the value that marks the C-stack sentinel frame that 3.12+
        /// pushes at each loop entry (never a Python frame).
        owner: usize,
        owner_cstack: u8,
        /// `f_executable` is a `_PyStackRef` whose low bits are tags (3.14).
        tagged_code: bool,
        /// `instr_ptr` points at the executing instruction (3.13+); `prev_instr` (3.11, 3.12)
        /// points at the last one started. Both give the call's own instruction.
        offset_of_code: usize,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub version: (u8, u8),
    pub model: FrameModel,
    /// Thread state: the frame pointer, or the `_PyCFrame` pointer (3.11, 3.12) whose
    /// `current_frame` is at `cframe_current`.
    pub ts_frame: usize,
    pub cframe_current: Option<usize>,
    pub frame_back: usize,
    pub frame_code: usize,
    /// `f_lasti` (int) or `prev_instr` / `instr_ptr` (pointer).
    pub frame_lasti: usize,
    pub co_filename: usize,
    /// `co_qualname` where present (3.11+), else `co_name`.
    pub co_name: usize,
    pub co_firstlineno: usize,
    pub co_linetable: usize,
    pub table_format: LineTableFormat,
    pub str_length: usize,
    pub str_state: usize,
    pub str_ascii_size: usize,
    pub str_compact_size: usize,
    pub bytes_size: usize,
    pub bytes_data: usize,
}

/// The layout of a version without debug offsets, or None if unknown.
pub fn builtin(major: u8, minor: u8) -> Option<Layout> {
    if major != 3 {
        return None;
    }
    // Objects: ob_refcnt 0, ob_type 8, ob_size 16 (var objects).
    // Bytes: ob_shash 24, ob_sval 32. Strings: length 16, hash 24, state 32.
    let base = Layout {
        version: (major, minor),
        model: FrameModel::Object {
            lasti_in_units: false,
        },
        ts_frame: 24,
        cframe_current: None,
        frame_back: 24,
        frame_code: 32,
        frame_lasti: 104,
        co_filename: 104,
        co_name: 112,
        co_firstlineno: 40,
        co_linetable: 120,
        table_format: LineTableFormat::Lnotab,
        str_length: 16,
        str_state: 32,
        // 3.9-3.11 still carry `wstr` (and `wstr_length` in the compact header).
        str_ascii_size: 48,
        str_compact_size: 72,
        bytes_size: 16,
        bytes_data: 32,
    };
    Some(match minor {
        9 => base,
        10 => Layout {
            model: FrameModel::Object {
                lasti_in_units: true,
            },
            // 3.10 replaced f_stacktop with f_stackdepth (int) before f_trace.
            frame_lasti: 96,
            table_format: LineTableFormat::Linetable310,
            ..base
        },
        11 => Layout {
            model: FrameModel::Interpreter {
                is_entry: Some(68),
                owner: 69,
                owner_cstack: 3, // no such frames in 3.11; is_entry marks loop entries
                tagged_code: false,
                offset_of_code: 184, // co_code_adaptive
            },
            ts_frame: 56, // cframe
            cframe_current: Some(8),
            frame_back: 48,
            frame_code: 32,
            frame_lasti: 56,
            co_filename: 112,
            co_name: 128, // co_qualname
            co_firstlineno: 72,
            co_linetable: 136,
            table_format: LineTableFormat::Locations311,
            ..base
        },
        12 => Layout {
            model: FrameModel::Interpreter {
                is_entry: None,
                owner: 70,
                owner_cstack: 3,
                tagged_code: false,
                offset_of_code: 192,
            },
            ts_frame: 56,
            cframe_current: Some(0),
            frame_back: 8,
            frame_code: 0,
            frame_lasti: 56,
            co_filename: 112,
            co_name: 128,
            co_firstlineno: 68,
            co_linetable: 136,
            table_format: LineTableFormat::Locations311,
            // 3.12 dropped wstr.
            str_ascii_size: 40,
            str_compact_size: 56,
            ..base
        },
        _ => return None,
    })
}
