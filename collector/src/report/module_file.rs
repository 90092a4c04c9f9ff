//! Whether the file a module was loaded from is, on this machine and now, still the file the
//! traced process ran: the check made before any address is looked up in it.
//!
//! A trace holds addresses, not names; names come from the module's file when the trace is
//! read. After a rebuild, the same path holds other code, and the same offset falls in
//! another function: a report would name a function that never allocated. So a module's file
//! is used only when it matches what the shim recorded when the module was first seen: its
//! GNU build id, or, for a module linked without one, its size and modification time. A
//! module that does not match keeps its frames as `module+0xoffset` (what `addr2line -e` of
//! the old build takes), and is listed as a [`StaleModule`], one per module, so that every
//! command can say which module changed instead of naming the wrong function.
//!
//! A module of an old trace that recorded neither (a module without a build id, written
//! before the file stamp) cannot be checked; its file is used as before.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use oomtrace_proto::wire::{FileStamp, ModuleDef};

use crate::model::Stacks;

/// Why a module's file cannot give its frames their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Its build id is not the one the process had loaded (or it has none now).
    BuildIdChanged,
    /// It has no build id, and its size or modification time is not what was recorded.
    FileChanged,
    /// There is no file at its path.
    Missing,
    /// The file is there but could not be read (permissions, not an ELF object).
    Unreadable,
}

/// A module whose file no longer matches the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StaleModule {
    /// The module's path, as the traced process had it.
    pub path: String,
    pub reason: Change,
    /// What the trace recorded of its file: `build id <hex>`, `<size> bytes, modified
    /// <seconds since 1970>`, or "" when nothing was recorded.
    pub traced: String,
    /// What its file is now, in the same words ("" when missing or unreadable).
    pub now: String,
}

impl StaleModule {
    /// The module's file name, as frames name it.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// One line for a person: which module, what changed, what its frames show instead.
    pub fn warning(&self) -> String {
        let what = match self.reason {
            Change::BuildIdChanged | Change::FileChanged => format!(
                "its file changed since the trace was taken ({} then, {} now)",
                self.traced, self.now
            ),
            Change::Missing => "its file is not on this machine".to_string(),
            Change::Unreadable => format!("its file cannot be read ({})", self.now),
        };
        format!(
            "module {}: {what}; its frames show as `{} +0xOFFSET`, not by name",
            self.path,
            self.name()
        )
    }
}

/// What the shim recorded to identify a module's file.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Recorded {
    BuildId(Vec<u8>),
    Stamp(FileStamp),
    Nothing,
}

impl Recorded {
    fn of(def: &ModuleDef) -> Recorded {
        match (&def.build_id, def.file) {
            (id, _) if !id.is_empty() => Recorded::BuildId(id.clone()),
            (_, Some(stamp)) => Recorded::Stamp(stamp),
            _ => Recorded::Nothing,
        }
    }

    fn matches(&self, def: &ModuleDef) -> bool {
        match self {
            Recorded::BuildId(id) => *id == def.build_id,
            Recorded::Stamp(s) => def.build_id.is_empty() && def.file == Some(*s),
            Recorded::Nothing => def.build_id.is_empty() && def.file.is_none(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Recorded::BuildId(id) => format!("build id {}", hex(id)),
            Recorded::Stamp(s) => stamp_text(s),
            Recorded::Nothing => String::new(),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn stamp_text(s: &FileStamp) -> String {
    let secs = s.mtime_ns.div_euclid(1_000_000_000);
    let nanos = s.mtime_ns.rem_euclid(1_000_000_000);
    format!("{} bytes, modified {secs}.{nanos:09}", s.size)
}

/// Checks `def`'s file against what the trace recorded of it; None when it matches (or when
/// there is nothing to check it against).
pub fn check(def: &ModuleDef) -> Option<StaleModule> {
    // No file ever backed a path without a directory (the vdso, an anonymous mapping): there
    // was never anything to symbolize from, and nothing changed.
    if !def.path.contains('/') {
        return None;
    }
    let recorded = Recorded::of(def);
    let stale = |reason, now: String| StaleModule {
        path: def.path.clone(),
        reason,
        traced: recorded.describe(),
        now,
    };
    let path = Path::new(&def.path);
    let meta = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => m,
        Ok(_) => return Some(stale(Change::Unreadable, "not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(stale(Change::Missing, String::new()))
        }
        Err(e) => return Some(stale(Change::Unreadable, e.to_string())),
    };
    match &recorded {
        Recorded::BuildId(id) => match read_build_id(path) {
            Ok(Some(now)) if now == *id => None,
            Ok(Some(now)) => Some(stale(
                Change::BuildIdChanged,
                format!("build id {}", hex(&now)),
            )),
            Ok(None) => Some(stale(Change::BuildIdChanged, "no build id".into())),
            Err(e) => Some(stale(Change::Unreadable, e.to_string())),
        },
        Recorded::Stamp(s) => match FileStamp::of(&meta) {
            Some(now) if now == *s => None,
            now => Some(stale(
                Change::FileChanged,
                now.map_or_else(|| "an empty file".into(), |n| stamp_text(&n)),
            )),
        },
        Recorded::Nothing => None,
    }
}

/// The GNU build id of the ELF file at `path`, read as the loader and the shim see it: the
/// `NT_GNU_BUILD_ID` note with the name "GNU" in a `PT_NOTE` segment. Only the headers and
/// the notes are read (a library of 1 GB costs a few reads). Ok(None): an ELF file without
/// one; an error: not an ELF file, or cut short.
///
/// Why not a generic helper: real PyTorch's `libc10_cuda.so` carries SystemTap probe notes
/// (owner "stapsdt", also of type 3) before its build id; taking the first note of type 3
/// read a probe's bytes as the build id, so every unchanged library looked rebuilt (found on
/// a real GPU: a leak's frames in libc10_cuda.so went unnamed).
fn read_build_id(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::os::unix::fs::FileExt;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let file = std::fs::File::open(path)?;
    let mut ident = [0u8; 64];
    file.read_exact_at(&mut ident, 0)
        .map_err(|_| bad("not an ELF file (too short)"))?;
    if ident[..4] != *b"\x7fELF" {
        return Err(bad("not an ELF file"));
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(bad("an ELF file of unknown class")),
    };
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Err(bad("an ELF file of unknown byte order")),
    };
    let u16_at = |b: &[u8], at: usize| {
        let v = [b[at], b[at + 1]];
        u64::from(if little {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        })
    };
    let u32_at = |b: &[u8], at: usize| {
        let v = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        u64::from(if little {
            u32::from_le_bytes(v)
        } else {
            u32::from_be_bytes(v)
        })
    };
    let u64_at = |b: &[u8], at: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[at..at + 8]);
        if little {
            u64::from_le_bytes(v)
        } else {
            u64::from_be_bytes(v)
        }
    };
    let (phoff, phentsize, phnum) = if wide {
        (
            u64_at(&ident, 0x20),
            u16_at(&ident, 0x36),
            u16_at(&ident, 0x38),
        )
    } else {
        (
            u32_at(&ident, 0x1c),
            u16_at(&ident, 0x2a),
            u16_at(&ident, 0x2c),
        )
    };
    let min_entry = if wide { 56 } else { 32 };
    if phentsize < min_entry || phnum > 4096 {
        return Err(bad("an ELF file with implausible program headers"));
    }
    let mut headers = vec![0u8; (phentsize * phnum) as usize];
    file.read_exact_at(&mut headers, phoff)
        .map_err(|_| bad("an ELF file cut short in its program headers"))?;
    for h in headers.chunks_exact(phentsize as usize) {
        const PT_NOTE: u64 = 4;
        if u32_at(h, 0) != PT_NOTE {
            continue;
        }
        let (offset, size, align) = if wide {
            (u64_at(h, 8), u64_at(h, 32), u64_at(h, 48))
        } else {
            (u32_at(h, 4), u32_at(h, 16), u32_at(h, 28))
        };
        // Notes are small; a segment claiming more is not read whole.
        let mut notes = vec![0u8; size.min(1 << 20) as usize];
        if file.read_exact_at(&mut notes, offset).is_err() {
            continue;
        }
        let align = if align == 8 { 8 } else { 4 };
        let pad = |n: u64| n.div_ceil(align) * align;
        let mut at = 0u64;
        while at + 12 <= notes.len() as u64 {
            let i = at as usize;
            let (namesz, descsz, kind) = (
                u32_at(&notes, i),
                u32_at(&notes, i + 4),
                u32_at(&notes, i + 8),
            );
            let name_at = at + 12;
            let desc_at = name_at + pad(namesz);
            let end = desc_at + pad(descsz);
            if desc_at + descsz > notes.len() as u64 {
                break;
            }
            const NT_GNU_BUILD_ID: u64 = 3;
            let name = &notes[name_at as usize..(name_at + namesz) as usize];
            if kind == NT_GNU_BUILD_ID && name == b"GNU\0" && descsz > 0 {
                return Ok(Some(
                    notes[desc_at as usize..(desc_at + descsz) as usize].to_vec(),
                ));
            }
            at = end;
        }
    }
    Ok(None)
}

/// The checks made so far, once per module file (a trace of many processes loads the same
/// libraries in each), and the modules found stale, in the order they were met.
#[derive(Default)]
pub struct ModuleFiles {
    /// By path: each identity recorded for it, and the check's outcome.
    checked: HashMap<String, Vec<(Recorded, Option<usize>)>>,
    stale: Vec<StaleModule>,
}

impl ModuleFiles {
    /// Whether `def`'s file no longer matches the trace (checked on first sight, then
    /// remembered).
    pub fn stale(&mut self, def: &ModuleDef) -> Option<&StaleModule> {
        let seen = self
            .checked
            .get(&def.path)
            .and_then(|v| v.iter().find(|(r, _)| r.matches(def)));
        let index = match seen {
            Some(&(_, index)) => index,
            None => {
                let index = check(def).map(|m| {
                    self.stale.push(m);
                    self.stale.len() - 1
                });
                self.checked
                    .entry(def.path.clone())
                    .or_default()
                    .push((Recorded::of(def), index));
                index
            }
        };
        index.map(|i| &self.stale[i])
    }

    /// Every module found stale so far, each once, in the order met.
    pub fn found(&self) -> &[StaleModule] {
        &self.stale
    }
}

/// The modules of `processes` whose files no longer match the trace, each once: those that
/// any call site has a frame in (the only ones a report, view, export or diff reads).
pub fn stale_modules<'a>(processes: impl IntoIterator<Item = Stacks<'a>>) -> Vec<StaleModule> {
    let mut files = ModuleFiles::default();
    for p in processes {
        let mut used = vec![false; p.modules.len()];
        for i in p.sites.iter().flatten().filter_map(|f| f.module) {
            if let Some(u) = used.get_mut(i) {
                *u = true;
            }
        }
        for (m, _) in p.modules.iter().zip(&used).filter(|(_, &u)| u) {
            files.stale(&m.def);
        }
    }
    files.stale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(path: &str, build_id: Vec<u8>, file: Option<FileStamp>) -> ModuleDef {
        ModuleDef {
            id: 1,
            start: 0x1000,
            end: 0x2000,
            bias: 0,
            build_id,
            path: path.into(),
            file,
        }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "oomtrace-module-file-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// This test binary has a build id (rustc links one): its own id matches, another does
    /// not, and the line names the module and both ids.
    #[test]
    fn a_build_id_matches_only_itself() {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let id = read_build_id(Path::new(exe))
            .unwrap()
            .expect("rustc links with a build id");
        // The same id the loader sees (blazesym reads it from the section).
        assert_eq!(
            blazesym::helper::read_elf_build_id(exe)
                .unwrap()
                .unwrap()
                .as_ref(),
            id.as_slice()
        );
        assert_eq!(check(&def(exe, id.clone(), None)), None);
        let mut other = id.clone();
        other[0] ^= 0xff;
        let stale = check(&def(exe, other.clone(), None)).expect("another build");
        assert_eq!(stale.reason, Change::BuildIdChanged);
        assert_eq!(stale.traced, format!("build id {}", hex(&other)));
        assert_eq!(stale.now, format!("build id {}", hex(&id)));
        let line = stale.warning();
        assert!(line.contains(exe) && line.contains(&hex(&id)), "{line}");
        assert!(!line.contains('\n'));
    }

    /// A probe note of the same type before the build id (as real PyTorch's libc10_cuda.so
    /// has) is not taken for it.
    #[test]
    fn the_build_id_is_the_gnu_note_not_the_first_note_of_its_type() {
        fn note(out: &mut Vec<u8>, name: &[u8], kind: u32, desc: &[u8]) {
            out.extend((name.len() as u32).to_le_bytes());
            out.extend((desc.len() as u32).to_le_bytes());
            out.extend(kind.to_le_bytes());
            out.extend(name);
            out.resize(out.len().div_ceil(4) * 4, 0);
            out.extend(desc);
            out.resize(out.len().div_ceil(4) * 4, 0);
        }
        let mut notes = Vec::new();
        note(&mut notes, b"stapsdt\0", 3, b"pytorch\0free\0-8@%rdi\0");
        let id: Vec<u8> = (1..=20).collect();
        note(&mut notes, b"GNU\0", 3, &id);
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2; // 64-bit
        elf[5] = 1; // little-endian
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let mut ph = vec![0u8; 56];
        ph[0..4].copy_from_slice(&4u32.to_le_bytes()); // PT_NOTE
        ph[8..16].copy_from_slice(&120u64.to_le_bytes()); // p_offset
        ph[32..40].copy_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
        ph[48..56].copy_from_slice(&4u64.to_le_bytes()); // p_align
        elf.extend(ph);
        elf.extend(&notes);
        let dir = scratch("notes");
        let lib = dir.join("libprobes.so");
        std::fs::write(&lib, &elf).unwrap();
        assert_eq!(read_build_id(&lib).unwrap(), Some(id.clone()));
        let path = lib.to_str().unwrap();
        assert_eq!(check(&def(path, id, None)), None);
        // Cut short, or not an ELF file at all: an error, never a build id.
        std::fs::write(&lib, &elf[..100]).unwrap();
        assert!(read_build_id(&lib).is_err());
        std::fs::write(&lib, b"#!/bin/sh").unwrap();
        assert!(read_build_id(&lib).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Without a build id, the size and modification time decide; a file that is gone or is
    /// not a file says so; nothing recorded (an old trace) and the vdso are not checked.
    #[test]
    fn a_file_stamp_matches_only_the_same_size_and_time() {
        let dir = scratch("stamp");
        let lib = dir.join("libnoid.so");
        std::fs::write(&lib, b"\x7fELF not really").unwrap();
        let path = lib.to_str().unwrap();
        let stamp = FileStamp::of(&std::fs::metadata(&lib).unwrap()).unwrap();
        assert_eq!(check(&def(path, Vec::new(), Some(stamp))), None);
        let older = FileStamp {
            mtime_ns: stamp.mtime_ns - 1,
            ..stamp
        };
        let stale = check(&def(path, Vec::new(), Some(older))).expect("another time");
        assert_eq!(stale.reason, Change::FileChanged);
        assert_eq!(stale.traced, stamp_text(&older));
        assert_eq!(stale.now, stamp_text(&stamp));
        assert_eq!(check(&def(path, Vec::new(), None)), None);
        assert_eq!(check(&def("linux-vdso.so.1", vec![1; 20], None)), None);
        let gone = dir.join("libgone.so");
        let stale = check(&def(gone.to_str().unwrap(), vec![1; 20], None)).unwrap();
        assert_eq!(stale.reason, Change::Missing);
        assert_eq!(
            check(&def(dir.to_str().unwrap(), Vec::new(), Some(stamp)))
                .unwrap()
                .reason,
            Change::Unreadable
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Each (path, identity) is checked once and listed once, however many processes load it.
    #[test]
    fn each_module_file_is_listed_once() {
        let dir = scratch("once");
        let gone = dir.join("libgone.so");
        let gone = gone.to_str().unwrap();
        let mut files = ModuleFiles::default();
        for _ in 0..3 {
            assert!(files.stale(&def(gone, vec![1; 20], None)).is_some());
            assert!(files.stale(&def(gone, vec![2; 20], None)).is_some());
        }
        assert_eq!(files.found().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
