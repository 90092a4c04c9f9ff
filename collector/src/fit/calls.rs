//! Module calls, read from a call site's Python frames: what activation checkpointing wraps.
//!
//! A forward pass's tensor is made under a chain of module calls, each a `Module._call_impl`
//! (or `_wrapped_call_impl`) frame of `torch/nn/modules/module.py` between the line that called
//! the module and the module's `forward`. A [`CallKey`] is one such call: the calling code and
//! line, and the `forward` called. Every tensor made under it has it in its chain, outermost
//! first. A call made in a loop (`for block in self.blocks: x = block(x)`) is one key with many
//! instances, which `fit` tells apart by order (see `plan::instances`).

use oomtrace_proto::python::PyFrame;
use rustc_hash::FxHashMap;

use crate::model::{is_library_file, is_oomtrace_python_file, Process, SiteId};

/// One module call: the code and line that called it, and the code of the `forward` it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey {
    pub caller_code: u32,
    pub caller_line: u32,
    pub callee_code: u32,
}

/// How a user names a call: the module's class and where it was called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallName {
    /// The module's class (`Block` of `Block.forward`).
    pub module: String,
    /// `file:line` of the call, the file as the trace recorded it.
    pub call_path: String,
    /// `file:line`, the file's name only: what text shows.
    pub call: String,
    /// The call is in the program's own code (not in an installed package's).
    pub user_code: bool,
}

fn is_module_call_frame(file: &str, name: &str) -> bool {
    file.replace('\\', "/")
        .ends_with("torch/nn/modules/module.py")
        && (name.ends_with("_call_impl") || name.ends_with("_wrapped_call_impl"))
}

/// The module calls each site's tensors were made under, outermost first, by site.
#[derive(Debug, Default)]
pub struct Calls {
    chains: FxHashMap<SiteId, Vec<CallKey>>,
}

impl Calls {
    /// The chain of `site` (empty: no module call, or no Python frames).
    pub fn chain(&mut self, p: &Process, site: SiteId) -> &[CallKey] {
        self.chains.entry(site).or_insert_with(|| chain_of(p, site))
    }

    /// Chains given as they are (tests, and callers that read frames themselves).
    pub fn from_chains(chains: impl IntoIterator<Item = (SiteId, Vec<CallKey>)>) -> Calls {
        Calls {
            chains: chains.into_iter().collect(),
        }
    }

    /// The chain of a site already read by [`Calls::chain`].
    pub fn known(&self, site: SiteId) -> &[CallKey] {
        self.chains.get(&site).map_or(&[], Vec::as_slice)
    }
}

fn chain_of(p: &Process, site: SiteId) -> Vec<CallKey> {
    let Some(frames) = p.sites.get(site.0 as usize) else {
        return Vec::new();
    };
    // Python frames, outermost first: (code, line, a module-call frame).
    let mut py: Vec<(u32, u32, bool)> = Vec::new();
    for f in frames.iter().rev() {
        let Some(frame) = PyFrame::decode(f.addr) else {
            continue;
        };
        let Some(code) = p.codes.get(&frame.code) else {
            continue;
        };
        if is_oomtrace_python_file(&code.filename) {
            continue;
        }
        let line = code.line_at(frame.offset).unwrap_or(code.first_line);
        py.push((
            frame.code,
            line,
            is_module_call_frame(&code.filename, &code.name),
        ));
    }
    let mut chain = Vec::new();
    let mut i = 1;
    while i < py.len() {
        if py[i].2 && !py[i - 1].2 {
            let caller = py[i - 1];
            let mut j = i;
            while j < py.len() && py[j].2 {
                j += 1;
            }
            if let Some(callee) = py.get(j) {
                chain.push(CallKey {
                    caller_code: caller.0,
                    caller_line: caller.1,
                    callee_code: callee.0,
                });
            }
            i = j;
        } else {
            i += 1;
        }
    }
    chain
}

/// How a user names `key`.
pub fn name(p: &Process, key: CallKey) -> CallName {
    let caller = p.codes.get(&key.caller_code);
    let callee = p.codes.get(&key.callee_code);
    let file = caller.map_or("?", |c| c.filename.as_str());
    let short = file.rsplit(['/', '\\']).next().unwrap_or(file);
    let module = callee.map_or("?".to_string(), |c| {
        let q = c.name.as_str();
        // `Block.forward` -> `Block`; a function called as a module keeps its name.
        match q.rsplit_once('.') {
            Some((class, _)) => class.rsplit('.').next().unwrap_or(class).to_string(),
            None => q.to_string(),
        }
    });
    CallName {
        module,
        call_path: format!("{file}:{}", key.caller_line),
        call: format!("{short}:{}", key.caller_line),
        user_code: caller.is_some_and(|c| !is_library_file(&c.filename)),
    }
}

/// Whether the user's words `asked` name `key`: its module's class (`Block`), the call's
/// `file:line` (the file's name, or a path ending in it), or `Class@file:line`.
pub fn matches(name: &CallName, asked: &str) -> bool {
    let asked = asked.trim();
    if let Some((module, call)) = asked.split_once('@') {
        return module == name.module && matches_call(name, call);
    }
    asked == name.module || matches_call(name, asked)
}

fn matches_call(name: &CallName, asked: &str) -> bool {
    asked == name.call
        || (asked.contains(':')
            && (name.call_path.ends_with(&format!("/{asked}")) || name.call_path == asked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_named_by_its_class_its_line_or_both() {
        let n = CallName {
            module: "Block".into(),
            call_path: "/home/u/proj/model.py:30".into(),
            call: "model.py:30".into(),
            user_code: true,
        };
        for yes in [
            "Block",
            "model.py:30",
            "proj/model.py:30",
            "Block@model.py:30",
            " Block ",
        ] {
            assert!(matches(&n, yes), "{yes}");
        }
        for no in [
            "Bloc",
            "model.py:3",
            "odel.py:30",
            "Attn@model.py:30",
            "Block@model.py:31",
            "30",
        ] {
            assert!(!matches(&n, no), "{no}");
        }
    }
}
