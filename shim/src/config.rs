//! Every `OOMTRACE_*` variable the shim reads: one table, parsed once at lazy init.
//!
//! A bad value never stops the host: it gets one warning line and the default.

use std::ffi::CStr;

use crate::log;

/// One environment variable: its name, default and the line docs/configuration.md shows for it.
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// The shim's variables. The test below checks that docs/configuration.md documents each of them.
pub const VARS: &[Var] = &[
    Var {
        name: "OOMTRACE_SOCKET",
        default: "",
        doc: "Unix socket of a running collector (`oomtrace run` sets it). Unset: the shim starts its own collector, which writes `oomtrace.<pid>.oomt` in the working directory.",
    },
    Var {
        name: "OOMTRACE_OUTPUT",
        default: "oomtrace.%p.oomt",
        doc: "Trace file written when the shim starts its own collector or writes directly; `%p` becomes the pid. Never replaced (a taken name becomes `NAME.1.oomt`, ...); a path that is a symlink, device, FIFO or directory is refused with one line and the program runs untraced.",
    },
    Var {
        name: "OOMTRACE_DISABLE",
        default: "0",
        doc: "`1`: forward every CUDA call untouched and record nothing.",
    },
    Var {
        name: "OOMTRACE_STACKS",
        default: "native",
        doc: "`native`: record the native call stack of every allocation (DWARF unwinding, works without frame pointers; in a Python program it stops at the first interpreter frame, and the Python frames follow); `python`: the Python frames only, no native unwinding (the cheapest setting that still names the Python line; allocations from threads that run no Python get no stack); `off`: no stacks.",
    },
    Var {
        name: "OOMTRACE_PYTHON",
        default: "1",
        doc: "`1`: when the program is CPython, add the allocating thread's Python frames to each stack, read without the GIL; `0`: native frames only.",
    },
    Var {
        name: "OOMTRACE_STACK_DEPTH",
        default: "64",
        doc: "Most frames kept per stack (1 to 128).",
    },
    Var {
        name: "OOMTRACE_BUFFER",
        default: "65536",
        doc: "Capacity of the in-process event queue, in events (1024 to 4194304), 80 bytes each. When it is full, the event's thread waits for room while the collector reads; events are counted lost only once the collector has stopped reading.",
    },
    Var {
        name: "OOMTRACE_COLLECTOR",
        default: "",
        doc: "The `oomtrace` binary the shim starts when no socket is set (default: next to liboomtrace.so, then `PATH`).",
    },
    Var {
        name: "OOMTRACE_TORCH_ENTRY",
        default: "methods",
        doc: "How PyTorch's tensors are seen in its caching allocator: `methods` (its own methods `allocate`, `raw_alloc`, `raw_delete` and its deleter, wrapped: PyTorch does no extra work), with its allocator trace tracker as the fallback when they cannot be wrapped; `tracker`: the trace tracker only (PyTorch builds a trace entry per event for it: about half as much again per tensor).",
    },
    Var {
        name: "OOMTRACE_LOG",
        default: "0",
        doc: "`1`: the shim says on stderr what it does (collector, fallback file, losses). Default: only warnings, at most one per kind.",
    },
];

#[derive(Clone, Debug)]
pub struct Config {
    pub socket: Option<String>,
    pub output: String,
    pub disabled: bool,
    /// Native frames (`OOMTRACE_STACKS=native`).
    pub stacks: bool,
    /// Python frames (`OOMTRACE_PYTHON`, or `OOMTRACE_STACKS=python`).
    pub python: bool,
    pub stack_depth: usize,
    pub buffer: usize,
    pub collector: Option<String>,
    pub verbose: bool,
}

/// Most frames a stack may have; bounds the per-thread scratch buffers.
pub const MAX_STACK_DEPTH: usize = 128;

fn getenv(name: &str) -> Option<String> {
    let mut buf = [0u8; 64];
    let n = name.len().min(63);
    buf[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: buf is NUL-terminated; getenv returns NULL or a C string that we copy at once.
    let p = unsafe { libc::getenv(buf.as_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null getenv result is a NUL-terminated string in the environment; it is
    // copied at once, before anything could change the environment.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    if s.is_empty() {
        None
    } else {
        Some(s)
    }
}

fn flag(name: &str, default: bool) -> bool {
    match getenv(name).as_deref() {
        None => default,
        Some("1" | "true" | "yes" | "on") => true,
        Some("0" | "false" | "no" | "off") => false,
        Some(other) => {
            log::warn(&format!("ignoring {name}={other:?} (expected 0 or 1)"));
            default
        }
    }
}

fn number(name: &str, default: usize, min: usize, max: usize) -> usize {
    match getenv(name) {
        None => default,
        Some(s) => match s.trim().parse::<usize>() {
            Ok(v) if (min..=max).contains(&v) => v,
            _ => {
                log::warn(&format!(
                    "ignoring {name}={s:?} (expected a number from {min} to {max}); using {default}"
                ));
                default
            }
        },
    }
}

/// `OOMTRACE_TORCH_ENTRY=tracker`: PyTorch's trace tracker, not its allocator's methods. Read
/// when the Python side attaches (once), not at lazy init: it concerns PyTorch only.
pub fn torch_entry_is_tracker() -> bool {
    match getenv("OOMTRACE_TORCH_ENTRY").as_deref() {
        None | Some("methods") => false,
        Some("tracker") => true,
        Some(other) => {
            log::warn(&format!(
                "ignoring OOMTRACE_TORCH_ENTRY={other:?} (expected methods or tracker)"
            ));
            false
        }
    }
}

impl Config {
    pub fn from_env() -> Config {
        // (native frames, Python frames allowed)
        let (stacks, python_allowed) = match getenv("OOMTRACE_STACKS").as_deref() {
            None | Some("native") | Some("1") | Some("on") => (true, true),
            Some("python") => (false, true),
            Some("off") | Some("0") | Some("none") => (false, false),
            Some(other) => {
                log::warn(&format!(
                    "ignoring OOMTRACE_STACKS={other:?} (expected native, python or off)"
                ));
                (true, true)
            }
        };
        Config {
            socket: getenv("OOMTRACE_SOCKET"),
            output: getenv("OOMTRACE_OUTPUT").unwrap_or_else(|| "oomtrace.%p.oomt".into()),
            disabled: flag("OOMTRACE_DISABLE", false),
            stacks,
            python: python_allowed && flag("OOMTRACE_PYTHON", true),
            stack_depth: number("OOMTRACE_STACK_DEPTH", 64, 1, MAX_STACK_DEPTH),
            buffer: number("OOMTRACE_BUFFER", 65536, 1024, 1 << 22),
            collector: getenv("OOMTRACE_COLLECTOR"),
            verbose: flag("OOMTRACE_LOG", false),
        }
    }

    /// The output path with `%p` replaced by `pid`.
    pub fn output_for(&self, pid: u32) -> String {
        self.output.replace("%p", &pid.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_var_is_documented_and_prefixed() {
        for v in VARS {
            assert!(v.name.starts_with("OOMTRACE_"), "{}", v.name);
            assert!(!v.doc.is_empty());
        }
    }

    /// docs/configuration.md documents every variable, it and the README mention no other, and
    /// CI runs the README's test command. (That simcuda defines every hooked function is checked
    /// in `hooks`.)
    #[test]
    fn docs_and_ci_agree_with_the_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let configuration = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
        // OOMTRACE_LIB is the CLI's own (cli/src/locate.rs); OOMTRACE_TORCH is what `run`
        // tells its Python sitecustomize, OOMTRACE_TRACE where its trace is for the Python
        // API (oomtrace_proto::host::torch_hooks).
        let known: Vec<&str> = VARS
            .iter()
            .map(|v| v.name)
            .chain([
                "OOMTRACE_LIB",
                oomtrace_proto::host::torch_hooks::VAR,
                oomtrace_proto::host::torch_hooks::TRACE_VAR,
            ])
            .collect();
        for name in &known {
            assert!(
                configuration.contains(name),
                "docs/configuration.md lacks {name}"
            );
        }
        for (doc, text) in [
            ("README", &readme),
            ("docs/configuration.md", &configuration),
        ] {
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("OOMTRACE_") {
                    assert!(known.contains(&word), "{doc} mentions unknown {word}");
                }
            }
        }
        let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
        assert!(
            readme.contains("cargo test --workspace"),
            "README test command"
        );
        assert!(
            ci.contains("cargo test --workspace"),
            ".ci/run runs the README test command"
        );
    }

    #[test]
    fn output_placeholder() {
        let mut c = Config::from_env();
        c.output = "trace.%p.oomt".into();
        assert_eq!(c.output_for(42), "trace.42.oomt");
    }
}
