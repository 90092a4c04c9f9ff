//! Compiles the scenario programs (`scenarios/*.c`) against the simulated CUDA from the
//! `simcuda` crate into `$OUT_DIR/bin`. Scenarios are built without frame pointers: the
//! stacks the tests check must come from DWARF unwinding.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Target {
    out: &'static str,
    sources: &'static [&'static str],
    /// Extra compiler/linker flags.
    flags: &'static [&'static str],
}

const CUDART: &[&str] = &["-l:libcudart.so.12", "-ldl", "-lpthread"];

const TARGETS: &[Target] = &[
    Target {
        out: "runtime_basic",
        sources: &["runtime_basic.c"],
        flags: CUDART,
    },
    Target {
        out: "many_sites",
        sources: &["many_sites.c"],
        flags: CUDART,
    },
    Target {
        out: "vmm_growth",
        sources: &["vmm_growth.c"],
        flags: CUDART,
    },
    Target {
        out: "async_pool",
        sources: &["async_pool.c"],
        flags: CUDART,
    },
    Target {
        out: "pinned_host",
        sources: &["pinned_host.c"],
        flags: CUDART,
    },
    Target {
        out: "threads",
        sources: &["threads.c"],
        flags: CUDART,
    },
    Target {
        out: "fork_child",
        sources: &["fork_child.c"],
        flags: CUDART,
    },
    Target {
        out: "exit_timing",
        sources: &["exit_timing.c"],
        flags: CUDART,
    },
    Target {
        out: "fd_limit",
        sources: &["fd_limit.c"],
        flags: CUDART,
    },
    Target {
        out: "dlopen_shim",
        sources: &["dlopen_shim.c"],
        flags: CUDART,
    },
    Target {
        out: "peak_rss",
        sources: &["peak_rss.c"],
        flags: &[],
    },
    Target {
        out: "secure_dlopen",
        sources: &["secure_dlopen.c"],
        flags: &["-ldl"],
    },
    Target {
        out: "slow_loop",
        sources: &["slow_loop.c"],
        flags: CUDART,
    },
    Target {
        out: "oom",
        sources: &["oom.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_then_eval",
        sources: &["leak_then_eval.c"],
        flags: CUDART,
    },
    Target {
        out: "keep_buffers",
        sources: &["keep_buffers.c"],
        flags: CUDART,
    },
    Target {
        out: "rank_job",
        sources: &["rank_job.c"],
        flags: CUDART,
    },
    Target {
        out: "soak",
        sources: &["soak.c"],
        flags: &["-O2", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "two_sites",
        sources: &["two_sites.c"],
        flags: &["-O2", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "bench_pairs",
        sources: &["bench_pairs.c"],
        flags: &["-O2", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "driver_resolve",
        sources: &["driver_resolve.c"],
        flags: &["-l:libcuda.so.1", "-ldl"],
    },
    Target {
        out: "libext_static.so",
        sources: &["ext_static.c"],
        flags: &["-shared", "-fPIC", "-ldl"],
    },
    Target {
        out: "static_ext_main",
        sources: &["static_ext_main.c"],
        flags: &["-ldl"],
    },
    Target {
        out: "libext_static_rt.so",
        sources: &["ext_static_rt.c"],
        flags: &["-shared", "-fPIC", "-ldl"],
    },
    Target {
        out: "static_rt_main",
        sources: &["static_rt_main.c"],
        flags: &["-ldl"],
    },
    Target {
        out: "libext_dyn.so",
        sources: &["ext_dyn.c"],
        flags: &["-shared", "-fPIC", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "dyn_ext_main",
        sources: &["dyn_ext_main.c"],
        flags: &["-ldl"],
    },
    Target {
        out: "pitch_managed",
        sources: &["pitch_managed.c"],
        flags: CUDART,
    },
    Target {
        out: "libext_rt13.so",
        sources: &["ext_rt13.c"],
        flags: &[
            "-shared",
            "-fPIC",
            "-L$BIN",
            "-l:libcudart.so.13",
            "-Wl,-rpath,$ORIGIN",
            "-ldl",
        ],
    },
    Target {
        out: "two_runtimes",
        sources: &["two_runtimes.c"],
        flags: CUDART,
    },
    Target {
        out: "multi_device",
        sources: &["multi_device.c"],
        flags: CUDART,
    },
    Target {
        out: "libwrap_puts.so",
        sources: &["libwrap_puts.c"],
        flags: &["-shared", "-fPIC", "-ldl"],
    },
    Target {
        out: "libplugin_dep.so",
        sources: &["plugin_dep.c"],
        flags: &["-shared", "-fPIC"],
    },
    Target {
        out: "libplugin_local.so",
        sources: &["plugin_local.c"],
        // --no-as-needed: the dependency is only reached through dlsym, never by a symbol reference.
        flags: &[
            "-shared",
            "-fPIC",
            "-L$BIN",
            "-Wl,--no-as-needed",
            "-lplugin_dep",
            "-Wl,-rpath,$ORIGIN",
            "-ldl",
        ],
    },
    Target {
        out: "pluggable_first",
        sources: &["pluggable_first.c"],
        // Neither libcuda nor libcudart: the entry points must load the driver themselves.
        flags: &["-ldl"],
    },
    Target {
        out: "pluggable_init",
        sources: &["pluggable_init.c"],
        // The driver is dlopened by the program, never linked: nothing initialises it first.
        flags: &["-ldl"],
    },
    Target {
        out: "dlsym_caller",
        sources: &["dlsym_caller.c"],
        flags: &["-L$BIN", "-lwrap_puts", "-Wl,-rpath,$ORIGIN", "-ldl"],
    },
    // The leak-detector corpus (scenarios/corpus/README.md): one binary per file stem.
    Target {
        out: "libcorpus_ext.so",
        sources: &["corpus/corpus_ext.c"],
        flags: &["-shared", "-fPIC", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "leak_history",
        sources: &["corpus/leak_history.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_slow_sawtooth",
        sources: &["corpus/leak_slow_sawtooth.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_periodic",
        sources: &["corpus/leak_periodic.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_late",
        sources: &["corpus/leak_late.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_ext",
        sources: &["corpus/leak_ext.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_vmm",
        sources: &["corpus/leak_vmm.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_total_loss",
        sources: &["corpus/leak_total_loss.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_async",
        sources: &["corpus/leak_async.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_static",
        sources: &["corpus/clean_static.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_dynamic",
        sources: &["corpus/clean_dynamic.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_grad_accum",
        sources: &["corpus/clean_grad_accum.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_eval",
        sources: &["corpus/clean_eval.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_lru",
        sources: &["corpus/clean_lru.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_oneoff",
        sources: &["corpus/clean_oneoff.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_warmup",
        sources: &["corpus/clean_warmup.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_empty_cache",
        sources: &["corpus/clean_empty_cache.c"],
        flags: CUDART,
    },
    Target {
        out: "bounded_cache",
        sources: &["corpus/bounded_cache.c"],
        flags: CUDART,
    },
    Target {
        out: "frag_retry",
        sources: &["corpus/frag_retry.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_realloc",
        sources: &["corpus/leak_realloc.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_realloc",
        sources: &["corpus/clean_realloc.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_pool",
        sources: &["corpus/leak_pool.c"],
        flags: CUDART,
    },
    Target {
        out: "clean_pool",
        sources: &["corpus/clean_pool.c"],
        flags: CUDART,
    },
    // One extension call per step, with the dynamic runtime and with the static one.
    Target {
        out: "libcorpus_ext_step.so",
        sources: &["corpus/ext_step.c"],
        flags: &["-shared", "-fPIC", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "libcorpus_ext_step_static.so",
        sources: &["corpus/ext_step.c"],
        flags: &["-DEXT_STATIC_RUNTIME", "-shared", "-fPIC", "-ldl"],
    },
    Target {
        out: "leak_ext_step",
        sources: &["corpus/ext_step_main.c"],
        flags: &[
            "-DEXT_LIB=\"libcorpus_ext_step.so\"",
            "-DEXT_LEAKY=1",
            "-l:libcudart.so.12",
            "-ldl",
        ],
    },
    Target {
        out: "clean_ext_step",
        sources: &["corpus/ext_step_main.c"],
        flags: &[
            "-DEXT_LIB=\"libcorpus_ext_step.so\"",
            "-DEXT_LEAKY=0",
            "-l:libcudart.so.12",
            "-ldl",
        ],
    },
    Target {
        out: "leak_ext_static",
        sources: &["corpus/ext_step_main.c"],
        flags: &[
            "-DEXT_LIB=\"libcorpus_ext_step_static.so\"",
            "-DEXT_LEAKY=1",
            "-l:libcudart.so.12",
            "-ldl",
        ],
    },
    Target {
        out: "clean_ext_static",
        sources: &["corpus/ext_step_main.c"],
        flags: &[
            "-DEXT_LIB=\"libcorpus_ext_step_static.so\"",
            "-DEXT_LEAKY=0",
            "-l:libcudart.so.12",
            "-ldl",
        ],
    },
    // Epoch-clock classes (scenarios/corpus/README.md): one source, a leaky and a clean build.
    Target {
        out: "leak_irregular",
        sources: &["corpus/irregular.c"],
        flags: &["-DLEAK", "-l:libcudart.so.12", "-ldl", "-lpthread"],
    },
    Target {
        out: "clean_irregular",
        sources: &["corpus/irregular.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_one_per_step",
        sources: &["corpus/one_per_step.c"],
        flags: &["-DLEAK", "-l:libcudart.so.12", "-ldl", "-lpthread"],
    },
    Target {
        out: "leak_one_per_step_pinned",
        sources: &["corpus/one_per_step.c"],
        flags: &[
            "-DLEAK",
            "-DPINNED",
            "-l:libcudart.so.12",
            "-ldl",
            "-lpthread",
        ],
    },
    Target {
        out: "clean_one_per_step",
        sources: &["corpus/one_per_step.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_sparse",
        sources: &["corpus/sparse.c"],
        flags: &["-DLEAK", "-l:libcudart.so.12", "-ldl", "-lpthread"],
    },
    Target {
        out: "clean_sparse",
        sources: &["corpus/sparse.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_threads",
        sources: &["corpus/threads.c"],
        flags: &["-DLEAK", "-l:libcudart.so.12", "-ldl", "-lpthread"],
    },
    Target {
        out: "clean_threads",
        sources: &["corpus/threads.c"],
        flags: CUDART,
    },
    Target {
        out: "leak_phase",
        sources: &["corpus/phase.c"],
        flags: &["-DLEAK", "-l:libcudart.so.12", "-ldl", "-lpthread"],
    },
    Target {
        out: "clean_phase",
        sources: &["corpus/phase.c"],
        flags: CUDART,
    },
    // The fault-injection suite (tests/it/faults.rs).
    Target {
        out: "fault_many_threads",
        sources: &["faults/many_threads.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_fork_busy",
        sources: &["faults/fork_busy.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_exit_thread",
        sources: &["faults/exit_thread.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_tls_dtor_free",
        sources: &["faults/tls_dtor_free.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_small_stack",
        sources: &["faults/small_stack.c"],
        flags: CUDART,
    },
    Target {
        out: "libfault_plugin.so",
        sources: &["faults/plugin.c"],
        flags: &["-shared", "-fPIC", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "libfault_second.so",
        sources: &["faults/plugin.c"],
        flags: &[
            "-DPREFIX=second",
            "-shared",
            "-fPIC",
            "-l:libcudart.so.12",
            "-ldl",
        ],
    },
    Target {
        out: "libfault_deep.so",
        sources: &["faults/deep.c"],
        flags: &["-shared", "-fPIC", "-l:libcudart.so.12", "-ldl"],
    },
    Target {
        out: "fault_dlclose_main",
        sources: &["faults/dlclose_main.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_deepbind_main",
        sources: &["faults/deepbind_main.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_deepbind_nolink",
        sources: &["faults/deepbind_main.c"],
        flags: &["-DNO_CUDART", "-ldl"],
    },
    Target {
        out: "fault_exec_self",
        sources: &["faults/exec_self.c"],
        flags: CUDART,
    },
    // Nothing left behind, nothing misleading (tests/it/leftovers.rs).
    Target {
        out: "fault_fd_limit",
        sources: &["faults/fd_limit.c"],
        flags: CUDART,
    },
    Target {
        out: "fault_cwd_gone",
        sources: &["faults/cwd_gone.c"],
        flags: CUDART,
    },
    // The shim's own descriptor (tests/it/descriptors.rs).
    Target {
        out: "fault_close_all",
        sources: &["faults/close_all.c"],
        flags: CUDART,
    },
    // Every lost event counted (tests/it/loss_accounting.rs).
    Target {
        out: "fault_loss_burst",
        sources: &["faults/loss_burst.c"],
        flags: CUDART,
    },
    // Lossless delivery at default settings (tests/it/lossless.rs).
    Target {
        out: "lossless_threads200",
        sources: &["lossless/threads200.c"],
        flags: CUDART,
    },
    Target {
        out: "lossless_cross_free",
        sources: &["lossless/cross_free.c"],
        flags: CUDART,
    },
    Target {
        out: "lossless_many_live",
        sources: &["lossless/many_live.c"],
        flags: CUDART,
    },
    Target {
        out: "lossless_stall_pairs",
        sources: &["lossless/stall_pairs.c"],
        flags: CUDART,
    },
];

/// A second copy of the simulated runtime with another soname and version node, as a wheel
/// built for another CUDA release would bring (`libcudart.so.13`).
fn build_runtime_13(cc: &Path, bin: &Path, include_dir: &str) {
    let src = Path::new("../simcuda/src");
    println!(
        "cargo:rerun-if-changed={}",
        src.join("libcudart.c").display()
    );
    let map = bin.join("libcudart13.map");
    let text = std::fs::read_to_string(src.join("libcudart.map")).expect("libcudart.map");
    std::fs::write(&map, text.replace("libcudart.so.12", "libcudart.so.13")).expect("write map");
    let status = Command::new(cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-g",
            "-fvisibility=hidden",
            "-Wl,-soname,libcudart.so.13",
        ])
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg(format!("-I{include_dir}"))
        .arg("-o")
        .arg(bin.join("libcudart.so.13"))
        .arg(src.join("libcudart.c"))
        .args(["-ldl", "-lpthread"])
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "building libcudart.so.13 failed");
}

fn main() {
    let lib_dir = std::env::var("DEP_SIMCUDA_LIB_DIR").expect("simcuda exports lib_dir");
    let include_dir =
        std::env::var("DEP_SIMCUDA_INCLUDE_DIR").expect("simcuda exports include_dir");
    let bin = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bin");
    std::fs::create_dir_all(&bin).expect("create bin dir");
    let src = Path::new("scenarios");
    println!("cargo:rerun-if-changed=scenarios");
    println!("cargo:rerun-if-changed=build.rs");
    let cc = cc::Build::new().get_compiler();
    build_runtime_13(cc.path(), &bin, &include_dir);
    for t in TARGETS {
        let mut cmd = Command::new(cc.path());
        cmd.args(["-g", "-O1", "-fomit-frame-pointer", "-Wall", "-std=gnu11"])
            .arg(format!("-I{include_dir}"))
            .arg(format!("-I{}", src.display()))
            .arg(format!("-L{lib_dir}"))
            .arg("-o")
            .arg(bin.join(t.out));
        for s in t.sources {
            cmd.arg(src.join(s));
        }
        for f in t.flags {
            cmd.arg(f.replace("$BIN", &bin.display().to_string()));
        }
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cc.path().display()));
        assert!(
            status.success(),
            "building scenario {} failed: {cmd:?}",
            t.out
        );
    }
    println!("cargo:rustc-env=OOMTRACE_SCENARIO_BIN={}", bin.display());
    println!("cargo:rustc-env=OOMTRACE_SIM_LIB={lib_dir}");
    // For tests that compile a program themselves (to rebuild it between a run and a report).
    println!("cargo:rustc-env=OOMTRACE_SIM_INCLUDE={include_dir}");
}
