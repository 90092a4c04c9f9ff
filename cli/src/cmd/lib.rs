//! `oomtrace lib`: where liboomtrace.so is, for `LD_PRELOAD` without `oomtrace run`; with
//! `--simulate SIZE`, the whole environment of such a run on the simulated GPU.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use crate::simulated_gpu::{self, DeviceMemory};
use crate::{locate, Failure};

/// Print the path of liboomtrace.so, for `LD_PRELOAD=$(oomtrace lib) python train.py`.
///
/// The library next to this binary, or (for the self-contained binary) the copy it carries,
/// written once to the cache directory. `OOMTRACE_LIB` overrides both.
#[derive(clap::Args)]
pub struct Args {
    /// Print instead, in one line, the environment of a plain LD_PRELOAD run on the simulated
    /// GPU this binary carries, of SIZE device memory (1MiB to 1TiB): LD_PRELOAD, the driver's
    /// directory first on LD_LIBRARY_PATH, SIMCUDA_MEMORY, CUDA_MODULE_LOADING. Use it as
    /// `env $(oomtrace lib --simulate 16GiB) python train.py` (a path with spaces is quoted:
    /// `eval "env $(oomtrace lib --simulate 16GiB) python train.py"`).
    #[arg(long, value_name = "SIZE", value_parser = DeviceMemory::parse)]
    pub simulate: Option<DeviceMemory>,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let lib = locate::shim_library()?;
    let line = match &args.simulate {
        None => lib.into_os_string(),
        Some(memory) => {
            let installed = simulated_gpu::driver()?;
            let mut preload = lib.into_os_string();
            if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
                preload.push(":");
                preload.push(existing);
            }
            let mut env = vec![(OsString::from("LD_PRELOAD"), preload)];
            env.extend(installed.environment(memory));
            assignments(&env)
        }
    };
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(format!("cannot write to standard output: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// `NAME=VALUE` pairs separated by spaces; a value the shell would split or expand is
/// single-quoted.
fn assignments(env: &[(OsString, OsString)]) -> OsString {
    let mut line = OsString::new();
    for (i, (name, value)) in env.iter().enumerate() {
        if i > 0 {
            line.push(" ");
        }
        line.push(name);
        line.push("=");
        line.push(quoted(value));
    }
    line
}

fn quoted(value: &OsStr) -> OsString {
    let plain = value
        .as_bytes()
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-:+,=@%".contains(b));
    if plain {
        return value.to_owned();
    }
    let mut q = OsString::from("'");
    for (i, part) in value.as_bytes().split(|&b| b == b'\'').enumerate() {
        if i > 0 {
            q.push("'\\''");
        }
        q.push(OsStr::from_bytes(part));
    }
    q.push("'");
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_the_shell_would_split_are_quoted() {
        let env = [
            (OsString::from("A"), OsString::from("/cache/sim:/usr/lib")),
            (OsString::from("B"), OsString::from("/home/my dir/x")),
            (OsString::from("C"), OsString::from("it's")),
        ];
        assert_eq!(
            assignments(&env),
            OsString::from("A=/cache/sim:/usr/lib B='/home/my dir/x' C='it'\\''s'")
        );
    }
}
