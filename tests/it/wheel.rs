//! `pip install oomtrace`: the wheel that `scripts/wheel.sh` builds (maturin, zig, manylinux
//! 2.28) is checked as a user gets it. It names the workspace's version and the manylinux_2_28
//! tag, auditwheel agrees with that tag, and no ELF in it, nor the demo program and simulated
//! CUDA that the binary carries (compiled by the same zig cc), needs a glibc symbol newer than
//! 2.28. Installed with `pip install --no-index` into a fresh venv, the installed `oomtrace`
//! finds the installed liboomtrace.so with nothing set, runs the demo, traces a Python program
//! down to its file:line, traces real PyTorch with `--torch` on the simulated GPU it carries
//! (`--simulate`: the torch venv's python, the fresh venv's `oomtrace`, no driver on the
//! library path), and `import oomtrace` in the fresh venv finds the library too.
//!
//! The wheel is built once, in release, into its own target directory beside this one
//! (`<target>/wheel`: another glibc and C compiler, and no fight over the outer build's lock).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use oomtrace_tests::*;
use serde_json::Value;

use crate::torch;

/// The first build compiles the workspace in release with zig (1.5 minutes on two cores);
/// later ones reuse `<target>/wheel`.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1200);
const VERSION: &str = env!("CARGO_PKG_VERSION");
const GLIBC_MAX: (u32, u32) = (2, 28);

/// `<target>/wheel`: cargo's target directory of this test binary (`<target>/<profile>/deps/`).
fn wheel_target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .nth(3)
        .expect("target directory")
        .join("wheel")
}

fn text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A command with nothing of this build's oomtrace in its environment: what the wheel's
/// binary uses must be what the wheel installed. The simulated CUDA is the machine's "GPU".
fn clean_command(program: impl AsRef<std::ffi::OsStr>, dir: &Path) -> Command {
    let mut c = Command::new(program);
    c.current_dir(dir)
        .env("LD_LIBRARY_PATH", SIM_LIB)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .stdin(std::process::Stdio::null());
    for k in [
        "LD_PRELOAD",
        "OOMTRACE_LIB",
        "OOMTRACE_SOCKET",
        "OOMTRACE_OUTPUT",
        "OOMTRACE_DISABLE",
        "OOMTRACE_COLLECTOR",
        "OOMTRACE_TORCH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
    ] {
        c.env_remove(k);
    }
    c
}

/// One file's newest glibc symbol version: as printed (`GLIBC_2.2.5`, `none`) and as
/// (major, minor).
struct GlibcNeeded {
    file: PathBuf,
    shown: String,
    newest: Option<(u32, u32)>,
}

/// The newest `GLIBC_x.y` each file needs, from `scripts/wheel.sh --glibc` (pyelftools).
fn glibc_needed(files: &[PathBuf]) -> Vec<GlibcNeeded> {
    let mut cmd = Command::new(repo().join("scripts/wheel.sh"));
    cmd.arg("--glibc").args(files);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let found: Vec<_> = stdout
        .lines()
        .map(|l| {
            let (path, version) = l.rsplit_once(' ').expect("FILE VERSION");
            let parsed = version.strip_prefix("GLIBC_").map(|v| {
                let mut parts = v.split('.').map(|p| p.parse::<u32>().expect("a number"));
                (parts.next().unwrap(), parts.next().unwrap_or(0))
            });
            GlibcNeeded {
                file: PathBuf::from(path),
                shown: version.to_string(),
                newest: parsed,
            }
        })
        .collect();
    assert_eq!(found.len(), files.len(), "{stdout}");
    found
}

fn assert_glibc_at_most_2_28(files: &[PathBuf]) {
    for GlibcNeeded {
        file,
        shown,
        newest,
    } in glibc_needed(files)
    {
        eprintln!("wheel: {} needs {shown}", file.display());
        assert!(
            newest.is_some_and(|v| v <= GLIBC_MAX),
            "{} needs {shown}: newer than GLIBC_2.28 (or none: not a dynamic glibc program)",
            file.display()
        );
    }
}

/// The tools venv's bin/ (`scripts/wheel.sh --tools`), or None where python3's venv or the
/// tools are missing (a `precondition`: under CI that fails the test).
fn tools_bin() -> Option<PathBuf> {
    let python_ok = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !precondition(python_ok, "python3 with venv and ensurepip (python3-venv)") {
        return None;
    }
    let tools = Command::new(repo().join("scripts/wheel.sh"))
        .arg("--tools")
        .output();
    let tools_ok = tools.as_ref().is_ok_and(|o| o.status.success());
    if !precondition(
        tools_ok,
        "the wheel's build tools (scripts/wheel.sh --tools: maturin, ziglang, cargo-zigbuild, \
         auditwheel and build from PyPI)",
    ) {
        return None;
    }
    Some(PathBuf::from(
        String::from_utf8_lossy(&tools.unwrap().stdout).trim(),
    ))
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_traces_from_there() {
    let Some(tools_bin) = tools_bin() else { return };
    let dir = scratch("wheel");

    // Build.
    let mut build = Command::new(repo().join("scripts/wheel.sh"));
    build
        .arg(dir.join("dist"))
        .env("WHEEL_TARGET_DIR", wheel_target_dir())
        .env_remove("CARGO_TARGET_DIR");
    let started = std::time::Instant::now();
    let out = output_within(build, BUILD_TIMEOUT);
    assert!(
        out.status.success(),
        "scripts/wheel.sh failed:\n{}",
        text(&out)
    );
    eprintln!("wheel: built in {:.0} s", started.elapsed().as_secs_f64());
    let wheel = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(
        wheel.file_name().unwrap().to_string_lossy(),
        format!("oomtrace-{VERSION}-py3-none-manylinux_2_28_x86_64.whl")
    );
    eprintln!(
        "wheel: {} ({} bytes)",
        wheel.display(),
        std::fs::metadata(&wheel).unwrap().len()
    );

    // What is in it, and auditwheel's view of it.
    let list = Command::new(tools_bin.join("python"))
        .args([
            "-c",
            "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
        ])
        .arg(&wheel)
        .output()
        .expect("list the wheel");
    let names = String::from_utf8_lossy(&list.stdout);
    for expected in [
        format!("oomtrace-{VERSION}.data/scripts/oomtrace"),
        format!("oomtrace-{VERSION}.data/scripts/liboomtrace.so"),
        "oomtrace/__init__.py".to_string(),
    ] {
        assert!(names.lines().any(|n| n == expected), "{expected}:\n{names}");
    }
    let mut show = Command::new(tools_bin.join("auditwheel"));
    show.arg("show").arg(&wheel);
    let out = output_within(show, TIMEOUT);
    let shown = text(&out).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("is consistent with the following platform tag: \"manylinux_2_28_x86_64\""),
        "{shown}"
    );

    // A fresh venv, the wheel installed with nothing from an index.
    let venv = venv_with(&wheel, &dir);
    let exe = venv.join("bin/oomtrace");
    let lib = venv.join("bin/liboomtrace.so");
    assert_glibc_at_most_2_28(&[exe.clone(), lib.clone()]);

    // The installed binary finds the installed library, with nothing set.
    let mut cmd = clean_command(&exe, &dir);
    cmd.arg("lib");
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        std::fs::canonicalize(&lib).unwrap()
    );

    demo(&exe, &dir);
    python_frames(&venv, &dir);
    import_oomtrace(&venv, &dir);
    torch_leak(&exe, &dir);
}

/// `oomtrace demo` from the venv finds its planted leak; the program and the simulated CUDA
/// it wrote into the cache need no glibc newer than 2.28 either.
fn demo(exe: &Path, dir: &Path) {
    demo_finds_its_leak(exe, dir);
    let cache = dir.join("cache/oomtrace");
    let demo_dir = std::fs::read_dir(&cache)
        .expect("the demo's cache")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().contains("-demo-"))
        .unwrap_or_else(|| panic!("no demo directory in {}", cache.display()));
    let elfs: Vec<PathBuf> = [
        "train_demo",
        "libcuda.so.1",
        "libcudart.so.12",
        "libnvidia-ml.so.1",
    ]
    .iter()
    .map(|n| demo_dir.join(n))
    .collect();
    assert_glibc_at_most_2_28(&elfs);
}

/// `oomtrace demo` (the installed `exe`, nothing set) confirms its planted leak at
/// `keep_history` and its OOM.
fn demo_finds_its_leak(exe: &Path, dir: &Path) {
    let trace = dir.join("demo.oomt");
    let mut cmd = clean_command(exe, dir);
    cmd.arg("demo").arg("--output").arg(&trace);
    let out = output_within(cmd, TIMEOUT);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.lines()
            .any(|l| l.contains("[confirmed leak]") && l.contains("keep_history")),
        "{said}"
    );
    let r = report(exe, dir, &trace);
    assert_eq!(r["findings"][0]["kind"], "oom", "{:#}", r["findings"]);
    let leaks = findings(&r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(leaks[0]["level"], "confirmed");
    assert_eq!(functions(leaks[0])[0], "keep_history");
}

fn report(exe: &Path, dir: &Path, trace: &Path) -> Value {
    let mut cmd = clean_command(exe, dir);
    cmd.arg("report").arg("--json").arg(trace);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

/// Python frames through the venv's `oomtrace run` and the venv's own python: `gil.py`
/// (ctypes on simcuda's libcudart), its allocation named at its file:line.
fn python_frames(venv: &Path, dir: &Path) {
    let script = repo().join("tests/scenarios/python/gil.py");
    let released = line_of(&script, "# RELEASED");
    let json = dir.join("gil.json");
    let mut cmd = clean_command(venv.join("bin/oomtrace"), dir);
    cmd.arg("run")
        .arg("--json")
        .arg(&json)
        .arg("-o")
        .arg(dir.join("gil.oomt"))
        .arg("--")
        .arg(venv.join("bin/python"))
        .arg(&script);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "gil ok\n");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let site = findings(&r, "live_at_exit")
        .into_iter()
        .find(|f| f["bytes"] == 2 * MIB)
        .unwrap_or_else(|| panic!("no 2 MiB site: {:#}", r["findings"]));
    let first_python = site["stack"]
        .as_array()
        .unwrap()
        .iter()
        .find(|fr| fr["python"] == true)
        .unwrap_or_else(|| panic!("no Python frame: {site:#}"));
    assert_eq!(first_python["function"], "alloc_released", "{site:#}");
    assert!(
        first_python["file"].as_str().unwrap().ends_with("/gil.py"),
        "{site:#}"
    );
    assert_eq!(first_python["line"], released, "{site:#}");
}

/// `import oomtrace` in the fresh venv (not activated: bin/ is not on PATH) is the installed
/// package, and it finds the installed library. A program that calls `oomtrace.install()`
/// itself, with no `oomtrace run` and nothing set, is traced through them: the library
/// starts the venv's `oomtrace` (beside it) as its collector, and its steps are the
/// program's own.
fn import_oomtrace(venv: &Path, dir: &Path) {
    let mut cmd = clean_command(venv.join("bin/python"), dir);
    cmd.args([
        "-c",
        "import oomtrace; print(oomtrace.__file__); print(oomtrace.library_path()); \
         print(callable(oomtrace.mark_step) and callable(oomtrace.install))",
    ]);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let venv = std::fs::canonicalize(venv).unwrap();
    let package = std::fs::canonicalize(lines[0]).unwrap();
    assert!(
        package.starts_with(&venv) && package.ends_with("site-packages/oomtrace/__init__.py"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::canonicalize(lines[1]).unwrap(),
        venv.join("bin/liboomtrace.so"),
        "{stdout}"
    );
    assert_eq!(lines[2], "True", "{stdout}");

    // tests/scenarios/python/train_leak.py on the stand-in torch, `oomtrace.install()` first.
    let scenarios = repo().join("tests/scenarios/python");
    let program = scenarios.join("train_leak.py");
    let trace = dir.join("install.oomt");
    let mut cmd = clean_command(venv.join("bin/python"), dir);
    cmd.arg(&program)
        .args(["40", "--install"])
        .env("PYTHONPATH", scenarios.join("site-packages"))
        .env("OOMTRACE_OUTPUT", &trace);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "trained 40\n");
    let r = report(&venv.join("bin/oomtrace"), dir, &trace);
    assert_eq!(processes(&r)[0]["steps"], 40, "{:#}", r["processes"]);
    let alloc_line = line_of(&program, "# ALLOC HERE");
    let named = findings(&r, "leak").iter().any(|f| {
        f["stack"].as_array().unwrap().iter().any(|fr| {
            fr["python"] == true
                && fr["file"]
                    .as_str()
                    .unwrap_or("")
                    .ends_with("/train_leak.py")
                && fr["line"] == alloc_line
        })
    });
    assert!(
        named,
        "no leak at train_leak.py:{alloc_line}: {:#}",
        r["findings"]
    );
}

/// `oomtrace run --torch --simulate 16GiB` from the venv on real PyTorch (the pinned torch
/// venv's python), with no driver on the library path: the simulated GPU the wheel's binary
/// carries; the activation leak of `leak_activations.py` named at its line, live and in the
/// report. The driver it wrote into the cache needs no glibc newer than 2.28 either.
fn torch_leak(exe: &Path, dir: &Path) {
    let script = repo().join("tests/scenarios/torch/leak_activations.py");
    let (file, line) = ("leak_activations.py", 10);
    for attempt in 0..2 {
        let json = dir.join(format!("torch-{attempt}.json"));
        let mut cmd = clean_command(exe, dir);
        cmd.arg("run")
            .arg("--torch")
            .args(["--simulate", "16GiB"])
            .arg("--json")
            .arg(&json)
            .arg("-o")
            .arg(dir.join(format!("torch-{attempt}.oomt")))
            .arg("--")
            .arg(torch::python())
            .arg(&script)
            .env("STEPS", "40");
        torch::torch_env(&mut cmd, dir);
        // What `--simulate` sets up itself.
        cmd.env_remove("LD_LIBRARY_PATH")
            .env_remove("CUDA_MODULE_LOADING");
        let out = output_within(cmd, torch::TORCH_TIMEOUT);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if attempt == 0 && torch::pytorch_exit_abort(&out.status, &stderr) {
            eprintln!("{file}: PyTorch aborted at exit (pytorch#38228); once more");
            continue;
        }
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("done 40"),
            "{}",
            text(&out)
        );
        assert!(
            stderr.contains(&format!("({file}:{line})")),
            "no live line naming {file}:{line}:\n{stderr}"
        );
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let leak = findings(&r, "leak")
            .into_iter()
            .find(|f| {
                f["stack"].as_array().unwrap().iter().any(|fr| {
                    fr["python"] == true
                        && fr["file"].as_str().unwrap_or("").ends_with(file)
                        && fr["line"] == line
                })
            })
            .unwrap_or_else(|| panic!("no leak at {file}:{line}: {:#}", r["findings"]));
        assert_eq!(leak["level"], "confirmed", "{leak:#}");
        assert_eq!(leak["api"], "oomtrace_torch_alloc", "{leak:#}");
        assert_eq!(
            r["trace"]["simulated"]["device_memory_bytes"].as_u64(),
            Some(16 << 30),
            "{:#}",
            r["trace"]
        );
        let cache = dir.join("cache/oomtrace");
        let driver_dir = std::fs::read_dir(&cache)
            .expect("the cache")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .contains("-simcuda-")
            })
            .unwrap_or_else(|| panic!("no simulated driver in {}", cache.display()));
        assert_glibc_at_most_2_28(&[
            driver_dir.join("libcuda.so.1"),
            driver_dir.join("libnvidia-ml.so.1"),
        ]);
        return;
    }
    unreachable!()
}

/// What a wheel holds, read by the tools venv's python: its names, the RECORD lines whose hash
/// does not match their entry, the binary's DWARF sections (`.debug_gdb_scripts`, rustc's
/// pointer to its pretty-printers, is no debug info), and whether its one liboomtrace.so is
/// byte for byte `built` (the file cargo made in this build).
const INSPECT_WHEEL: &str = r#"
import base64, hashlib, io, json, sys, zipfile
from elftools.elf.elffile import ELFFile

def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
record = [n for n in names if n.endswith(".dist-info/RECORD")][0]
hashes = dict(l.split(",")[:2] for l in wheel.read(record).decode().splitlines() if l)
binary = [n for n in names if n.endswith(".data/scripts/oomtrace")][0]
elf = ELFFile(io.BytesIO(wheel.read(binary)))
libraries = [n for n in names if n.endswith("/liboomtrace.so")]
built = open(sys.argv[2], "rb").read()
print(json.dumps({
    "names": names,
    "record_mismatches": [n for n in names if n != record and hashes.get(n) != digest(wheel.read(n))],
    "binary_dwarf_sections": [s.name for s in elf.iter_sections()
                              if s.name.startswith(".debug_") and s.name != ".debug_gdb_scripts"],
    "library_is_the_build's": [wheel.read(n) == built for n in libraries],
}))
"#;

/// A command that builds the package as a user's `pip` or `python -m build` would, with the
/// pinned tools (maturin from the tools venv: `--no-build-isolation`, nothing from an index)
/// and cargo building into `target` (CARGO_TARGET_DIR, which the backend and maturin honour:
/// a second build reuses the first's dependencies).
fn package_build(program: PathBuf, tools_bin: &Path, target: &Path) -> Command {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![tools_bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    let mut c = Command::new(program);
    c.current_dir(repo())
        .env("PATH", std::env::join_paths(dirs).expect("PATH"))
        .env("CARGO_TARGET_DIR", target)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env_remove("MATURIN_PEP517_ARGS")
        .stdin(std::process::Stdio::null());
    c
}

/// The one file in `dir` whose name ends with `suffix`.
fn only_file(dir: &Path, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the build's output directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    assert_eq!(found.len(), 1, "{suffix} in {}: {found:?}", dir.display());
    found.into_iter().next().unwrap()
}

/// The wheel holds the binary without debug info, the Python package, and exactly one
/// liboomtrace.so: the one cargo built for it (`built`), not one left from another build; its
/// RECORD matches every entry (the backend rewrote it when it added the library).
fn assert_wheel_carries_the_library(tools_bin: &Path, wheel: &Path, built: &Path) {
    let out = Command::new(tools_bin.join("python"))
        .args(["-c", INSPECT_WHEEL])
        .arg(wheel)
        .arg(built)
        .output()
        .expect("inspect the wheel");
    assert!(out.status.success(), "{}", text(&out));
    let facts: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = facts["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for expected in [
        format!("oomtrace-{VERSION}.data/scripts/oomtrace"),
        format!("oomtrace-{VERSION}.data/scripts/liboomtrace.so"),
        "oomtrace/__init__.py".to_string(),
    ] {
        assert!(names.contains(&expected.as_str()), "{expected}: {names:?}");
    }
    assert_eq!(
        facts["library_is_the_build's"],
        serde_json::json!([true]),
        "{facts:#}"
    );
    assert_eq!(
        facts["record_mismatches"],
        serde_json::json!([]),
        "{facts:#}"
    );
    assert_eq!(
        facts["binary_dwarf_sections"],
        serde_json::json!([]),
        "{facts:#}"
    );
}

/// A fresh venv in `dir/venv` with `wheel` installed, nothing from an index.
fn venv_with(wheel: &Path, dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let out = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .expect("python3 -m venv");
    assert!(out.status.success(), "{}", text(&out));
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args([
        "install",
        "--quiet",
        "--no-index",
        "--disable-pip-version-check",
    ])
    .arg(wheel);
    let out = output_within(pip, BUILD_TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    venv
}

/// Installed into a fresh venv with nothing from an index: `oomtrace lib` names the venv's
/// library, `oomtrace demo` finds its leak, and `import oomtrace` finds the library too.
fn installed_package_works(wheel: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let venv = venv_with(wheel, dir);
    let lib = std::fs::canonicalize(venv.join("bin/liboomtrace.so")).expect("the library");

    let exe = venv.join("bin/oomtrace");
    let mut cmd = clean_command(&exe, dir);
    cmd.arg("lib");
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        lib
    );
    demo_finds_its_leak(&exe, dir);

    let mut cmd = clean_command(venv.join("bin/python"), dir);
    cmd.args(["-c", "import oomtrace; print(oomtrace.library_path())"]);
    let out = output_within(cmd, TIMEOUT);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::canonicalize(String::from_utf8_lossy(&out.stdout).trim()).unwrap(),
        lib
    );
}

/// The ways Python users install from source: `pip wheel python/` (what `pip install ./python`
/// builds and installs) and `python -m build --sdist python/` then a wheel built by pip from
/// that sdist unpacked outside the repository (what `pip install SDIST` does) each give a
/// package with the stripped `oomtrace` and the liboomtrace.so the same build compiled, no
/// script needed, and it works installed.
#[test]
fn pip_and_build_make_packages_that_carry_the_library() {
    let Some(tools_bin) = tools_bin() else { return };
    let dir = scratch("pip-wheel");
    let target = wheel_target_dir().join("pip");
    let built = target.join("release/liboomtrace.so");

    // pip wheel python/
    let dist = dir.join("pip-dist");
    let mut pip = package_build(tools_bin.join("pip"), &tools_bin, &target);
    pip.args(["wheel", "--no-build-isolation", "--no-deps", "--wheel-dir"])
        .arg(&dist)
        .arg(repo().join("python"));
    let started = std::time::Instant::now();
    let out = output_within(pip, BUILD_TIMEOUT);
    assert!(out.status.success(), "pip wheel failed:\n{}", text(&out));
    eprintln!(
        "pip wheel: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let wheel = only_file(&dist, ".whl");
    assert_wheel_carries_the_library(&tools_bin, &wheel, &built);
    installed_package_works(&wheel, &dir.join("pip"));

    // python -m build --sdist python/: the sdist holds the shim's sources and the backend. A
    // wheel is built from it unpacked outside the repository, as `pip install SDIST` does, but
    // in a fixed directory (`sync_sdist`) so that cargo reuses the last run's build.
    let dist = dir.join("build-dist");
    let mut build = package_build(tools_bin.join("python"), &tools_bin, &target);
    build
        .args(["-m", "build", "--sdist", "--no-isolation", "--outdir"])
        .arg(&dist)
        .arg(repo().join("python"));
    let out = output_within(build, BUILD_TIMEOUT);
    assert!(
        out.status.success(),
        "python -m build failed:\n{}",
        text(&out)
    );
    let sdist = only_file(&dist, ".tar.gz");
    let list = Command::new(tools_bin.join("python"))
        .args([
            "-c",
            "import sys, tarfile; print('\\n'.join(tarfile.open(sys.argv[1]).getnames()))",
        ])
        .arg(&sdist)
        .output()
        .expect("list the sdist");
    let names = String::from_utf8_lossy(&list.stdout);
    for expected in [
        "shim/Cargo.toml",
        "shim/src/lib.rs",
        "build_backend/oomtrace_backend.py",
        "boot/sitecustomize.py",
        "oomtrace/__init__.py",
        "pyproject.toml",
    ] {
        let name = format!("oomtrace-{VERSION}/{expected}");
        assert!(names.lines().any(|n| n == name), "{name}:\n{names}");
    }
    assert!(
        !names.lines().any(|n| n.ends_with(".so")),
        "no built library in the sdist:\n{names}"
    );
    let unpacked = sync_sdist(&tools_bin, &sdist, &wheel_target_dir().join("sdist"));
    // Its own target directory: cargo gives the sdist's crates the same unit names as the
    // repository's (the same packages at another path), and in one directory the two builds
    // would rebuild each other's every time.
    let sdist_target = wheel_target_dir().join("pip-sdist");
    let mut pip = package_build(tools_bin.join("pip"), &tools_bin, &sdist_target);
    pip.args(["wheel", "--no-build-isolation", "--no-deps", "--wheel-dir"])
        .arg(&dist)
        .arg(&unpacked)
        .current_dir(&unpacked);
    let started = std::time::Instant::now();
    let out = output_within(pip, BUILD_TIMEOUT);
    assert!(
        out.status.success(),
        "pip wheel SDIST failed:\n{}",
        text(&out)
    );
    eprintln!(
        "pip wheel of the sdist: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let wheel = only_file(&dist, ".whl");
    assert_wheel_carries_the_library(
        &tools_bin,
        &wheel,
        &sdist_target.join("release/liboomtrace.so"),
    );
    installed_package_works(&wheel, &dir.join("sdist"));
}

/// Unpacks `sdist` into `dest` (its top directory, returned) the way cargo can build again
/// without starting over: a file whose content is unchanged since the last run is left as it
/// is (its old mtime says "built already"), a changed or new one is written (now: "rebuild"),
/// one no longer in the sdist is removed. maturin's sdists give every file one fixed date, so
/// unpacking them as they are would hide changes from cargo.
fn sync_sdist(tools_bin: &Path, sdist: &Path, dest: &Path) -> PathBuf {
    const SYNC: &str = r#"
import os, sys, tarfile
sdist, dest = sys.argv[1], sys.argv[2]
with tarfile.open(sdist) as tar:
    members = [m for m in tar.getmembers() if m.isfile()]
    top = members[0].name.split("/")[0]
    root = os.path.join(dest, top)
    wanted = set()
    for m in members:
        relative = m.name[len(top) + 1:]
        assert m.name.startswith(top + "/") and ".." not in relative.split("/"), m.name
        wanted.add(relative)
        path = os.path.join(root, relative)
        data = tar.extractfile(m).read()
        try:
            with open(path, "rb") as f:
                if f.read() == data:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
for directory, _, files in os.walk(root):
    for name in files:
        path = os.path.join(directory, name)
        if os.path.relpath(path, root) not in wanted:
            os.remove(path)
print(root)
"#;
    let out = Command::new(tools_bin.join("python"))
        .args(["-c", SYNC])
        .arg(sdist)
        .arg(dest)
        .output()
        .expect("unpack the sdist");
    assert!(out.status.success(), "{}", text(&out));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
