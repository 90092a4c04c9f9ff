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
        Recorded::BuildId(id) => match blazesym::helper::read_elf_build_id(path) {
            Ok(Some(now)) if now.as_ref() == id.as_slice() => None,
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
        let id = blazesym::helper::read_elf_build_id(exe)
            .unwrap()
            .expect("rustc links with a build id")
            .into_owned();
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
