//! `OOMTRACE_TORCH`: which of oomtrace's PyTorch hooks the sitecustomize installs, as a
//! comma-separated list of tokens. Written by `oomtrace run` (cli/src/cmd/run.rs) and by the
//! shim in a Python program under plain `LD_PRELOAD` (shim/src/python_env.rs), read by the
//! sitecustomize (python/boot/sitecustomize.py, whose `_TOKENS` is [`python_table`]'s line:
//! a test checks they agree). One token per hook, the same word as the CLI's and the Python
//! API's (`--torch=swap`, `install(allocator="swap")`); a spelling the variable once had
//! stays accepted as an alias forever, since users set it by hand.

/// The variable's name.
pub const VAR: &str = "OOMTRACE_TORCH";

/// The variable `run` gives its program with the absolute path of the run's trace: the Python
/// package's API (`oomtrace.trace()`) reads a block's report from it while the program runs.
pub const TRACE_VAR: &str = "OOMTRACE_TRACE";

/// One hook of the sitecustomize's, or the user's opt-out of tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchHook {
    /// oomtrace's trace tracker on PyTorch's caching allocator (`--torch`, the default).
    Tracker,
    /// PyTorch allocates through oomtrace's pluggable allocator (`--torch=swap`).
    Swap,
    /// A step marker after every optimizer step (not with `--no-step-hook`).
    Steps,
    /// No tensors: the user's opt-out (`--segments`), the step hook alone.
    Segments,
}

impl TorchHook {
    /// Every hook, in the order `oomtrace run` lists them.
    pub const ALL: [TorchHook; 4] = [
        TorchHook::Tracker,
        TorchHook::Swap,
        TorchHook::Steps,
        TorchHook::Segments,
    ];

    /// The token written for it.
    pub const fn token(self) -> &'static str {
        match self {
            TorchHook::Tracker => "tracker",
            TorchHook::Swap => "swap",
            TorchHook::Steps => "steps",
            TorchHook::Segments => "segments",
        }
    }

    /// Other tokens read as it: what the variable said before (`allocator`, until the swap
    /// had one name everywhere). Add here, never remove.
    pub const fn aliases(self) -> &'static [&'static str] {
        match self {
            TorchHook::Swap => &["allocator"],
            _ => &[],
        }
    }

    /// The hook a token (exactly, as written) names, its token or an alias.
    pub fn parse(token: &str) -> Option<TorchHook> {
        TorchHook::ALL
            .into_iter()
            .find(|h| h.token() == token || h.aliases().contains(&token))
    }
}

/// The variable's value for these hooks: their tokens, comma-separated.
pub fn value(hooks: &[TorchHook]) -> String {
    hooks
        .iter()
        .map(|h| h.token())
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a value of the variable names `hook` (its parts trimmed, as the sitecustomize reads
/// them).
pub fn names(value: &str, hook: TorchHook) -> bool {
    value
        .split(',')
        .any(|part| TorchHook::parse(part.trim()) == Some(hook))
}

/// The sitecustomize's `_TOKENS` line: every token and alias to its hook's token.
pub fn python_table() -> String {
    let pairs: Vec<String> = TorchHook::ALL
        .into_iter()
        .flat_map(|h| {
            std::iter::once(h.token())
                .chain(h.aliases().iter().copied())
                .map(move |t| format!("\"{t}\": \"{}\"", h.token()))
        })
        .collect();
    format!("_TOKENS = {{{}}}", pairs.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_and_alias_reads_back_and_allocator_stays_the_swap() {
        for h in TorchHook::ALL {
            assert_eq!(TorchHook::parse(h.token()), Some(h));
            for a in h.aliases() {
                assert_eq!(TorchHook::parse(a), Some(h));
            }
        }
        assert_eq!(TorchHook::parse("allocator"), Some(TorchHook::Swap));
        assert_eq!(TorchHook::parse("Tracker"), None);
        assert!(names("tracker, segments", TorchHook::Segments));
        assert!(names("allocator,steps", TorchHook::Swap));
        assert!(!names("", TorchHook::Steps));
        assert_eq!(value(&[TorchHook::Swap, TorchHook::Steps]), "swap,steps");
    }

    #[test]
    fn the_sitecustomize_has_the_same_table() {
        let boot = std::str::from_utf8(crate::host::cache::PY_BOOT).unwrap();
        let line = boot
            .lines()
            .find(|l| l.starts_with("_TOKENS = "))
            .expect("python/boot/sitecustomize.py defines _TOKENS");
        assert_eq!(
            line,
            python_table(),
            "python/boot/sitecustomize.py's _TOKENS must be proto's table (host::torch_hooks)"
        );
        assert!(boot.contains(&format!("os.environ.get(\"{VAR}\"")));
    }

    /// What the sitecustomize reads from each value, run by the Python there is (skipped
    /// without one): the old `allocator` still asks for the swap.
    #[test]
    fn the_sitecustomize_reads_every_token_and_the_old_allocator() {
        let dir = std::env::temp_dir().join(format!("oomtrace-torch-hooks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let boot = dir.join("boot.py");
        std::fs::write(&boot, crate::host::cache::PY_BOOT).unwrap();
        let read = |value: Option<&str>| -> Option<String> {
            let mut cmd = std::process::Command::new("python3");
            cmd.arg("-c")
                .arg(
                    "import sys; ns = {'__file__': sys.argv[1]}; \
                      exec(open(sys.argv[1]).read(), ns); print(ns['_wanted']())",
                )
                .arg(&boot)
                .env_remove(VAR)
                .env_remove("PYTHONPATH");
            if let Some(v) = value {
                cmd.env(VAR, v);
            }
            let out = cmd.output().ok()?;
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        };
        let cases = [
            (None, "(True, False, True)"),
            (Some("tracker,steps"), "(True, False, True)"),
            (Some("swap,steps"), "(False, True, True)"),
            (Some("allocator,steps"), "(False, True, True)"),
            (Some("allocator"), "(False, True, False)"),
            (Some("segments"), "(False, False, True)"),
            (Some(""), "(False, False, False)"),
        ];
        for (value, wanted) in cases {
            match read(value) {
                Some(got) => assert_eq!(got, wanted, "OOMTRACE_TORCH={value:?}"),
                None => break, // no python3 here
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
