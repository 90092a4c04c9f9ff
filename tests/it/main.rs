//! The integration suite: one binary, each module a family of scenarios run through the real
//! shim, collector and CLI on the simulated CUDA.

/// Every way an allocation reaches the driver: runtime, static runtime via cuGetProcAddress,
/// VMM, stream-ordered pools, pinned host, direct driver calls, OOM; and dlsym semantics.
mod paths;

/// Threads, fork, exit paths, a collector that dies, exit codes, the three ways in.
mod lifecycle;

/// `run` prints its collector's report of the run, and it is the trace's, byte for byte.
mod run_handoff;

/// Reports from good, truncated and corrupt traces; bad input; README agreement.
mod cli;

/// The labeled leak-detection corpus: every leak found at its site within budget, with and
/// without step markers; no clean look-alike reported as a leak.
mod corpus;

/// Fault injection: 16 threads, fork under load, exit from a thread, frees in thread-exit
/// destructors, dlclose, RTLD_DEEPBIND, exec, a killed program, a stopped collector.
mod faults;

/// Never hang, never drown: `collect` stops within about 2 s of SIGTERM whatever its clients
/// do, `--exit-when-idle` is not held by clients that never send a whole frame, partial 16 MiB
/// frames cost a bounded buffer, and the metrics endpoint answers every scrape among silent,
/// trickling and rapid clients.
mod hangs;

/// The shim writes to and closes only its own descriptors: a program that closes every
/// descriptor above 2 and opens its own file, socketpair or pipe keeps its data and exit code,
/// under `LD_PRELOAD`, `run`, `collect` and with the shim's own trace file.
mod descriptors;

/// Lossless at default settings: 200 threads, cross-thread frees and 10^7 live allocations
/// lose nothing while the collector reads; a stopped collector costs a bounded wait, and the
/// losses are counted.
mod lossless;

/// Every lost event counted, whatever the path: 64 and 128 processes into one starved
/// collector (received + lost = made, exactly; nobody that exited called killed), a killed
/// collector, a full disk said in one line with one number.
mod loss_accounting;

/// `oomtrace export`: memory-viz pickles the viewer accepts, Chrome traces, folded stacks,
/// JSON lines; bad input.
mod export;

/// `oomtrace view` and `run --html`: the page in headless Chromium (no script errors, the
/// leaking function on the rendered page, a screenshot), and its bounded size.
mod view;

/// Distributed jobs: ranks from launcher variables, one rank leaking vs all, imbalance, the
/// first OOM; one report from one collector and from per-rank trace files.
mod ranks;

/// Private files and sockets; peers of another user refused.
mod security;

/// Python: frames with the GIL held and released, `--torch`, steps from the optimizer with and
/// without it, `import oomtrace`, the pluggable allocator ABI (also before any driver is
/// loaded), every Python frame in text reports, leaks freed at exit.
mod python;

/// Device growth on the labeled corpus: found with every leak, silent on clean look-alikes.
mod device_growth;

/// Nothing left behind (a killed `run`, failed runs, programs without CUDA, old caches,
/// scratch directories) and every mistake named (missing arguments, sizes, CUDA errors).
mod hygiene;

/// Nothing left behind, nothing misleading: a collector that never comes up or exits at
/// once (a bounded wait, the shim writes the trace), a killed collector or chain (the next
/// start cleans up), a descriptor limit of 3, the demo with TMPDIR on another filesystem, a run
/// whose working directory is removed.
mod leftovers;

/// Output that misbehaves: device nodes, symlinks, FIFOs, a full or closed standard output,
/// a failed export that keeps the old file; incomplete traces that say why; progress on a
/// terminal only.
mod output;

/// Destroy nothing, lose nothing silently: socket and output rules, OOMTRACE_OUTPUT that is a
/// device, a FIFO given to report, and a real full disk under LD_PRELOAD, run and the shim's
/// own file (also in the collector's health metrics).
mod durability;

/// `oomtrace run --simulate SIZE`: a CUDA program with no driver of its own runs on the
/// simulated GPU the binary carries, of that size (its allocations, an OOM where that size
/// runs out, its own exit code); the summary and the report say so; bad sizes.
mod simulate;

/// Which frame names a call site: the extension's own code past a static CUDA runtime.
mod attribution;

/// Symbols that match the trace, or a warning: a program rebuilt between its run and its
/// report (with a build id, and without one: size and time) is never named from the new file
/// by `report`, `diff`, `export` or `view`; they say which module changed and show its frames
/// as module and offset.
mod stale_symbols;

/// Real PyTorch (the pinned CUDA wheel, from `scripts/torch-env.sh`, or the release
/// `TORCH_TIER_VERSION` names) on simcuda: leaky and clean training loops, an OOM at a known
/// line and expandable segments, each under the default `run`, plain `LD_PRELOAD`,
/// `--segments`, `--torch=swap` and the user's own pluggable allocator; what must hold on
/// every release (`torch::every_version`); the report's words (`torch::words`); `oomtrace
/// whatif`'s predictions against PyTorch's own peaks under each allocator setting
/// (`torch::whatif`); `run --simulate` from the venv with no driver set (`torch::simulate`).
mod torch;

/// `oomtrace report`'s sections (peak consumers, most allocations, temporaries, sizes,
/// totals, `--sort`) and `oomtrace diff` of two runs of a corpus program, both ways.
mod report_diff;

/// The final report's levels and words agree with the evidence: memory all freed while the
/// steps go on is growth, not a leak; a leak freed at exit is said so, never "all of it was
/// freed" beside `confirmed`.
mod words;

/// Prometheus metrics (`collect --metrics`, `--metrics-textfile`): a real Prometheus server
/// scrapes a running process and a two-rank job, and its values are the report's; real
/// PyTorch's reserve and Python leak lines; bad addresses and textfile targets; the Grafana
/// dashboard and the docs name exactly the exported metrics; `oomtrace top` over them.
mod metrics;

/// `pip install oomtrace`: the manylinux_2_28 wheel of `scripts/wheel.sh` (maturin + zig),
/// its glibc bound, installed into a fresh venv: the demo, Python frames, `import oomtrace` and
/// real PyTorch with `--torch`, all from the installed files.
mod wheel;

/// Bounded work on any input: implausible world sizes, ranks and device counts; crafted
/// traces cost what they hold in `report`, `view`, `export` and `diff`; the Chrome export
/// coalesced; `report DIR` in parallel, naming each member it cannot read.
mod bounds;

/// `oomtrace fit`: bad input in one line (its predictions against real PyTorch are
/// `torch::fit`).
mod fit;

/// `oomtrace whatif`: bad input in one line; a real PyTorch program's own allocator setting,
/// recorded at start, is what the replay uses without `--alloc-conf`, and it reproduces the
/// recorded reserve.
mod whatif;

/// Instructions per cudaMalloc+cudaFree pair (callgrind, a release build) held within 10 % of
/// the committed table bench/instructions.tsv: the program's thread, the drain thread, the
/// collector and `run`'s replay.
mod instructions;
