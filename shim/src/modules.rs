//! The modules (executable and shared objects) mapped into this process, from
//! `dl_iterate_phdr`, with what the unwinder and the collector need of each.
//!
//! Unwind tables are copied out of memory (`.eh_frame_hdr` via PT_GNU_EH_FRAME, and the
//! `.eh_frame` it points to), and only for modules that actually appear in a stack: an
//! unwinder that kept pointers into a module that the program later `dlclose`s would read
//! unmapped memory, and copying every module of a PyTorch process would cost tens of MB.

use std::ffi::{c_int, c_void, CStr};

use oomtrace_proto::wire::{FileStamp, ModuleDef};

/// One loaded object.
#[derive(Clone, Debug)]
pub struct LoadedModule {
    pub path: String,
    /// Load bias (`dlpi_addr`): runtime address = address in the file + bias.
    pub bias: u64,
    /// Lowest and one-past-highest address of its PT_LOAD segments.
    pub start: u64,
    pub end: u64,
    /// Executable PT_LOAD ranges (runtime addresses).
    pub text: Vec<(u64, u64)>,
    /// Runtime address and size of `.eh_frame_hdr`, if the object has one.
    pub eh_frame_hdr: Option<(u64, u64)>,
    /// PT_LOAD ranges, to bound reads of unwind data.
    pub segments: Vec<(u64, u64)>,
    pub build_id: Vec<u8>,
    /// Size and modification time of its file when it was first seen, for a module without a
    /// build id: what a reader checks the file on its disk against before symbolizing.
    pub file: Option<FileStamp>,
}

impl LoadedModule {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    pub fn def(&self, id: u32) -> ModuleDef {
        ModuleDef {
            id,
            start: self.start,
            end: self.end,
            bias: self.bias,
            build_id: self.build_id.clone(),
            path: self.path.clone(),
            file: self.file,
        }
    }

    fn segment_end(&self, addr: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(s, e)| *s <= addr && addr < *e)
            .map(|(_, e)| *e)
    }
}

/// The loader's counters of objects added and removed: they change on every dlopen/dlclose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LoadCounts {
    pub adds: u64,
    pub subs: u64,
}

struct Collect {
    modules: Vec<LoadedModule>,
    counts: LoadCounts,
    exe: String,
}

unsafe extern "C" fn collect_cb(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info of `size` bytes and our `data`.
    let c = unsafe { &mut *(data as *mut Collect) };
    // SAFETY: as above: `info` is valid for the duration of the callback.
    let info = unsafe { &*info };
    if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
        c.counts = LoadCounts {
            adds: info.dlpi_adds,
            subs: info.dlpi_subs,
        };
    }
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null `dlpi_name` is the loader's NUL-terminated object name.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let path = if name.is_empty() { c.exe.clone() } else { name };
    let bias = info.dlpi_addr;
    let mut m = LoadedModule {
        path,
        bias,
        start: u64::MAX,
        end: 0,
        text: Vec::new(),
        eh_frame_hdr: None,
        segments: Vec::new(),
        build_id: Vec::new(),
        file: None,
    };
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    for ph in phdrs {
        let addr = bias.wrapping_add(ph.p_vaddr);
        match ph.p_type {
            libc::PT_LOAD => {
                m.start = m.start.min(addr);
                m.end = m.end.max(addr + ph.p_memsz);
                m.segments.push((addr, addr + ph.p_memsz));
                if ph.p_flags & libc::PF_X != 0 {
                    m.text.push((addr, addr + ph.p_memsz));
                }
            }
            libc::PT_GNU_EH_FRAME => m.eh_frame_hdr = Some((addr, ph.p_memsz)),
            _ => {}
        }
    }
    // Notes are read only where a loaded segment maps them (a PT_NOTE outside every PT_LOAD
    // is not in memory).
    for ph in phdrs.iter().filter(|ph| ph.p_type == libc::PT_NOTE) {
        let addr = bias.wrapping_add(ph.p_vaddr);
        let end = addr.saturating_add(ph.p_memsz);
        if m.build_id.is_empty() && m.segment_end(addr).is_some_and(|e| end <= e) {
            // SAFETY: inside a mapped PT_LOAD segment (checked above).
            let notes =
                unsafe { std::slice::from_raw_parts(addr as *const u8, ph.p_memsz as usize) };
            m.build_id = find_build_id(notes).unwrap_or_default();
        }
    }
    if m.end > m.start {
        c.modules.push(m);
    }
    0
}

/// NT_GNU_BUILD_ID from a PT_NOTE segment.
fn find_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    let align4 = |n: usize| (n + 3) & !3;
    while notes.len() >= 12 {
        let namesz = u32::from_ne_bytes(notes[0..4].try_into().ok()?) as usize;
        let descsz = u32::from_ne_bytes(notes[4..8].try_into().ok()?) as usize;
        let ty = u32::from_ne_bytes(notes[8..12].try_into().ok()?);
        let name_end = 12 + align4(namesz);
        let desc_end = name_end.checked_add(align4(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if ty == 3 && namesz == 4 && &notes[12..16] == b"GNU\0" {
            return Some(notes[name_end..name_end + descsz].to_vec());
        }
        notes = &notes[desc_end..];
    }
    None
}

fn exe_path() -> String {
    std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every loaded object, in load order, with the loader's counters.
pub fn enumerate() -> (Vec<LoadedModule>, LoadCounts) {
    let mut c = Collect {
        modules: Vec::new(),
        counts: LoadCounts::default(),
        exe: exe_path(),
    };
    // SAFETY: the callback only reads what the loader passes and writes to `c`.
    unsafe { libc::dl_iterate_phdr(Some(collect_cb), &mut c as *mut Collect as *mut c_void) };
    // Outside the callback: the loader's lock is not held across file system calls.
    for m in c.modules.iter_mut().filter(|m| m.build_id.is_empty()) {
        m.file = file_stamp(&m.path);
    }
    (c.modules, c.counts)
}

/// The size and modification time of the file at `path` (None if it cannot be read: the
/// vdso, a deleted file). Leaves `errno` as it found it: this runs inside a hook, and the
/// program may read `errno` after its CUDA call.
fn file_stamp(path: &str) -> Option<FileStamp> {
    // SAFETY: errno is thread-local; reading it has no preconditions.
    let saved = unsafe { *libc::__errno_location() };
    let stamp = std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .and_then(|m| FileStamp::of(&m));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
    stamp
}

unsafe extern "C" fn counts_cb(
    info: *mut libc::dl_phdr_info,
    size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: as in collect_cb.
    let out = unsafe { &mut *(data as *mut LoadCounts) };
    if size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8 {
        // SAFETY: as in collect_cb.
        let info = unsafe { &*info };
        *out = LoadCounts {
            adds: info.dlpi_adds,
            subs: info.dlpi_subs,
        };
    }
    1 // stop after the first object: the counters are the same in every entry
}

/// The loader's counters alone; cheap enough for the cache-miss path.
pub fn load_counts() -> LoadCounts {
    let mut out = LoadCounts::default();
    // SAFETY: see counts_cb.
    unsafe { libc::dl_iterate_phdr(Some(counts_cb), &mut out as *mut LoadCounts as *mut c_void) };
    out
}

/// Paths of every loaded object.
pub fn loaded_paths() -> Vec<String> {
    enumerate().0.into_iter().map(|m| m.path).collect()
}

/// Unwind tables copied out of a loaded module.
pub struct UnwindTables {
    pub eh_frame_hdr: Vec<u8>,
    pub eh_frame_hdr_avma: u64,
    pub eh_frame: Vec<u8>,
    pub eh_frame_avma: u64,
}

/// Reads a DWARF pointer encoding used by `.eh_frame_hdr` (only the forms linkers emit there).
fn read_encoded(enc: u8, at: u64, data_base: u64) -> Option<(u64, u64)> {
    if enc == 0xff {
        return None; // DW_EH_PE_omit
    }
    // SAFETY: callers only pass addresses inside the mapped eh_frame_hdr segment.
    let (val, size): (i64, u64) = unsafe {
        match enc & 0x0f {
            0x00 => ((at as *const u64).read_unaligned() as i64, 8), // absptr
            0x03 => ((at as *const u32).read_unaligned() as i64, 4), // udata4
            0x0b => ((at as *const i32).read_unaligned() as i64, 4), // sdata4
            0x04 | 0x0c => ((at as *const i64).read_unaligned(), 8), // udata8 / sdata8
            _ => return None,
        }
    };
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => at,        // pcrel
        0x30 => data_base, // datarel: relative to .eh_frame_hdr
        _ => return None,
    };
    Some(((base as i64).wrapping_add(val) as u64, size))
}

/// Copies `.eh_frame_hdr` and `.eh_frame` of `m`, or None if it has none (then the unwinder
/// falls back to frame pointers inside it).
pub fn unwind_tables(m: &LoadedModule) -> Option<UnwindTables> {
    let (hdr, hdr_len) = m.eh_frame_hdr?;
    if hdr_len < 8 || m.segment_end(hdr)? < hdr + hdr_len {
        return None;
    }
    // SAFETY: [hdr, hdr+hdr_len) lies inside a mapped PT_LOAD segment (checked above).
    let hdr_bytes = unsafe { std::slice::from_raw_parts(hdr as *const u8, hdr_len as usize) };
    if hdr_bytes[0] != 1 {
        return None;
    }
    let (eh_frame, _) = read_encoded(hdr_bytes[1], hdr + 4, hdr)?;
    let seg_end = m.segment_end(eh_frame)?;
    // Walk CIE/FDE records to the zero terminator (or the end of the segment).
    let mut at = eh_frame;
    while at + 4 <= seg_end {
        // SAFETY: at + 4 <= seg_end, inside the mapped segment.
        let len = unsafe { (at as *const u32).read_unaligned() } as u64;
        if len == 0 {
            at += 4;
            break;
        }
        let rec = if len == 0xffff_ffff {
            if at + 12 > seg_end {
                break;
            }
            // SAFETY: `at + 12 <= seg_end` was checked: the 8 bytes lie in the mapped segment.
            12 + unsafe { ((at + 4) as *const u64).read_unaligned() }
        } else {
            4 + len
        };
        if at.checked_add(rec)? > seg_end {
            at = seg_end;
            break;
        }
        at += rec;
    }
    let eh_len = at - eh_frame;
    // SAFETY: [eh_frame, at) lies inside the segment.
    let eh_bytes = unsafe { std::slice::from_raw_parts(eh_frame as *const u8, eh_len as usize) };
    Some(UnwindTables {
        eh_frame_hdr: hdr_bytes.to_vec(),
        eh_frame_hdr_avma: hdr,
        eh_frame: eh_bytes.to_vec(),
        eh_frame_avma: eh_frame,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_modules_with_unwind_tables() {
        let (mods, counts) = enumerate();
        assert!(counts.adds >= mods.len() as u64);
        let here = this_process_has_modules_with_unwind_tables as *const () as u64;
        let me = mods.iter().find(|m| m.contains(here)).expect("own module");
        let t = unwind_tables(me).expect("test binary has .eh_frame_hdr");
        assert!(t.eh_frame.len() > 1000);
        assert!(!me.build_id.is_empty(), "rustc links with a build id");
        let libc = mods
            .iter()
            .find(|m| m.path.contains("libc.so"))
            .expect("libc");
        assert!(unwind_tables(libc).is_some());
    }

    #[test]
    fn a_file_stamp_is_the_files_size_and_mtime_and_leaves_errno_alone() {
        let exe = exe_path();
        let meta = std::fs::metadata(&exe).unwrap();
        let stamp = file_stamp(&exe).expect("the test binary is a file");
        assert_eq!(Some(stamp), FileStamp::of(&meta));
        assert_eq!(stamp.size, meta.len());
        // SAFETY: errno is thread-local.
        unsafe { *libc::__errno_location() = 1234 };
        assert_eq!(file_stamp("/nonexistent/oomtrace/libgone.so"), None);
        assert_eq!(file_stamp("linux-vdso.so.1"), None);
        // SAFETY: as above.
        assert_eq!(unsafe { *libc::__errno_location() }, 1234);
    }
}
