//! Addresses to function, file and line, from the modules' files on disk (DWARF when present,
//! ELF symbols otherwise). Runs only here, never in the traced process: the first symbolization
//! in a process costs tens of milliseconds and megabytes (prototype-measurements.md §3).

use std::collections::HashMap;
use std::path::Path;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};

use crate::state::{Process, RawFrame, SiteId};

/// One symbolized frame. Empty strings and 0 mean unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameInfo {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// File name of the module (executable or shared object).
    pub module: String,
    /// Absolute return address in the traced process, hex.
    pub address: String,
    /// Address within the module's file, hex (what `addr2line -e MODULE` takes).
    pub offset: String,
}

fn code_location(ci: Option<&CodeInfo<'_>>) -> (String, u32) {
    match ci {
        Some(ci) => {
            let file = match &ci.dir {
                Some(dir) => dir.join(&*ci.file).to_string_lossy().into_owned(),
                None => ci.file.to_string_lossy().into_owned(),
            };
            (file, ci.line.unwrap_or(0))
        }
        None => (String::new(), 0),
    }
}

/// Symbolizes stacks of one or more processes, caching per module file.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    cache: HashMap<(String, u64), Vec<FrameInfo>>,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    pub fn new() -> StackSymbolizer {
        StackSymbolizer {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
            cache: HashMap::new(),
        }
    }

    /// Frames of `site` in `p`, innermost first; inlined calls become frames of their own.
    pub fn site(&mut self, p: &Process, site: SiteId) -> Vec<FrameInfo> {
        let Some(frames) = p.sites.get(site.0 as usize) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(frames.len());
        for f in frames {
            out.extend(self.frame(p, f));
        }
        out
    }

    fn frame(&mut self, p: &Process, f: &RawFrame) -> Vec<FrameInfo> {
        let address = format!("{:#x}", f.addr);
        let Some(m) = f.module.and_then(|i| p.modules.get(i)) else {
            return vec![FrameInfo {
                address,
                ..Default::default()
            }];
        };
        let path = m.def.path.clone();
        let module = Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.clone());
        // The call instruction precedes the return address.
        let virt = f.addr.wrapping_sub(m.def.bias).wrapping_sub(1);
        let key = (path.clone(), virt);
        if let Some(hit) = self.cache.get(&key) {
            return hit
                .iter()
                .map(|fi| FrameInfo {
                    address: address.clone(),
                    ..fi.clone()
                })
                .collect();
        }
        let base = FrameInfo {
            function: String::new(),
            file: String::new(),
            line: 0,
            module,
            address,
            offset: format!("{virt:#x}"),
        };
        let mut result = vec![base.clone()];
        if Path::new(&path).is_file() {
            let src = Source::Elf(Elf::new(&path));
            if let Ok(Symbolized::Sym(sym)) = self
                .symbolizer
                .symbolize_single(&src, Input::VirtOffset(virt))
            {
                // Innermost first: the instruction's own location belongs to the innermost
                // inlined function; each inlined call site belongs to its caller.
                result.clear();
                let mut callee_loc = code_location(sym.code_info.as_deref());
                for inl in sym.inlined.iter().rev() {
                    result.push(FrameInfo {
                        function: inl.name.to_string(),
                        file: callee_loc.0.clone(),
                        line: callee_loc.1,
                        ..base.clone()
                    });
                    callee_loc = code_location(inl.code_info.as_ref());
                }
                result.push(FrameInfo {
                    function: sym.name.to_string(),
                    file: callee_loc.0,
                    line: callee_loc.1,
                    ..base.clone()
                });
            }
        }
        self.cache.insert(key, result.clone());
        result
    }
}
