//! Runs simcuda's C test programs against the built libraries.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The value of a `key=value` line printed by the program.
    pub fn value(&self, key: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }

    pub fn u64(&self, key: &str) -> u64 {
        let v = self
            .value(key)
            .unwrap_or_else(|| panic!("no {key}= in output:\n{}", self.stdout));
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => v.parse().unwrap(),
        }
    }
}

pub fn bin(name: &str) -> PathBuf {
    Path::new(simcuda::TEST_BIN_DIR).join(name)
}

/// Runs a program with a clean simcuda environment: no inherited SIMCUDA_*
/// or LD_PRELOAD, libraries from `lib_dir`, plus `env`.
pub fn run_in(lib_dir: &str, program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(bin(program));
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SIMCUDA_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env_remove("LD_PRELOAD").env("LD_LIBRARY_PATH", lib_dir);
    cmd.envs(env.iter().copied());
    let Output {
        status,
        stdout,
        stderr,
    } = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    Run {
        code: status.code(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

pub fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_in(simcuda::LIB_DIR, program, args, env)
}

/// Runs a self-checking scenario and requires it to pass.
pub fn scenario(program: &str, name: &str, env: &[(&str, &str)]) -> Run {
    let r = run(program, &[name], env);
    assert!(
        r.code == Some(0) && r.stdout.lines().any(|l| l == "ok"),
        "{program} {name} with {env:?} failed (exit {:?})\nstdout:\n{}\nstderr:\n{}",
        r.code,
        r.stdout,
        r.stderr
    );
    r
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("simcuda-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

/// A test's directory, removed when it drops: also when the test fails (a failed assertion
/// unwinds through it), so no run leaves one behind.
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
