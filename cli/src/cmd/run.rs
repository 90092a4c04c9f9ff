//! `oomtrace run -- CMD...`: a private collector, CMD with the shim preloaded, a summary at
//! the end, and CMD's own exit code.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{self, Report, ReportOptions, SimulatedDevice};
use oomtrace_proto::host::collector_spawn::{self, NotListening, ToRun, TraceSaid};
use oomtrace_proto::host::socket_dir;
use oomtrace_proto::host::torch_hooks::{self, TorchHook};

use crate::handoff::{json_of, RunReport, Wanted};
use crate::simulated_gpu::{self, DeviceMemory};
use crate::{locate, signals, style, Failure};

/// Run a command with the tracer preloaded; print findings and a summary on stderr.
// Doc comments here are clap help text, where `<pid>` is a placeholder, not an HTML tag.
#[allow(rustdoc::invalid_html_tags)]
#[derive(clap::Args)]
pub struct Args {
    /// How PyTorch's tensors are traced (through a sitecustomize on PYTHONPATH). By default,
    /// and with `--torch` (or `--torch=tracker`), oomtrace's trace tracker is attached to
    /// PyTorch's own caching allocator when it initialises CUDA; caching and
    /// torch.cuda.memory_allocated() and the other statistics keep working. `--torch=swap`:
    /// PyTorch allocates through oomtrace's pluggable allocator instead (its statistics then
    /// raise; for PyTorch builds the tracker cannot attach to).
    #[arg(
        long,
        value_enum,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "tracker",
        value_name = "HOW",
        conflicts_with = "segments"
    )]
    pub torch: Option<TorchMode>,
    /// Do not trace PyTorch's tensors: only the CUDA allocations its caching allocator makes
    /// (its segments), as for a program without PyTorch. `OOMTRACE_TORCH=segments` in the
    /// environment says the same.
    #[arg(long)]
    pub segments: bool,
    /// Do not mark a step after every PyTorch optimizer step (by default a sitecustomize on
    /// PYTHONPATH does, with or without --torch); steps then come from the program's own
    /// oomtrace_mark calls or are found automatically.
    #[arg(long)]
    pub no_step_hook: bool,
    /// Trace file to write [default: oomtrace.<pid>.oomt]
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Exit with 3 if a leak is confirmed at the end (when CMD itself succeeded).
    #[arg(long)]
    pub fail_on_leak: bool,
    /// Also write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Colour the text: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub color: Option<crate::style::ColorChoice>,
    /// Also write the HTML view (`oomtrace view`) of the trace to FILE.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics while CMD runs (as `collect
    /// --metrics`).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Write the metrics to PATH in node-exporter's textfile format (as `collect
    /// --metrics-textfile`).
    #[arg(long, value_name = "PATH")]
    pub metrics_textfile: Option<PathBuf>,
    /// Run CMD on the simulated GPU this binary carries, of SIZE device memory (1MiB to 1TiB,
    /// e.g. 16GiB, 80GiB), with no GPU: its driver and NVML stand-in on CMD's library path
    /// (CMD keeps its own CUDA runtime, e.g. PyTorch's). Kernels do not run, so values are
    /// meaningless; allocation sizes and lifetimes are those of a real GPU for programs whose
    /// shapes do not depend on data.
    #[arg(long, value_name = "SIZE", value_parser = parse_simulated_memory)]
    pub simulate: Option<DeviceMemory>,
    /// Build the report by reading the trace file back, as `oomtrace report` does, instead of
    /// taking the one the collector built from what it saw (the same bytes: for the tests
    /// that say so).
    #[arg(long, hide = true)]
    pub report_from_trace: bool,
    /// The command to trace and its arguments: after `--` (`oomtrace run -- python train.py
    /// --lr 1`), or from the first argument that is not an option of `run` (`oomtrace run
    /// python train.py --lr 1`). Options of `run` come before it; an unknown one is an error,
    /// never taken as the command.
    // No allow_hyphen_values: an unknown option before the command must be refused, not run.
    // trailing_var_arg alone takes everything after the command's first word as its own.
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// How `--torch` sees tensors (without `--torch` or `--segments`: the tracker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TorchMode {
    /// A trace tracker on PyTorch's caching allocator (the default).
    Tracker,
    /// PyTorch allocates through oomtrace's pluggable allocator.
    Swap,
}

/// `--simulate SIZE`: what simcuda models, with a floor that catches a forgotten unit
/// (`--simulate 16` is 16 bytes).
fn parse_simulated_memory(text: &str) -> Result<DeviceMemory, String> {
    DeviceMemory::parse(text)
}

/// Everything a traced run needs besides the command.
pub struct Session {
    pub lib: PathBuf,
    pub output: PathBuf,
    /// Extra environment for the command (the simulated device, the Python hooks).
    pub env: Vec<(OsString, OsString)>,
    /// Extra arguments for the collector (`--metrics ...`).
    pub collector_args: Vec<OsString>,
    /// The command runs with address-space randomisation off (on the simulated GPU, see
    /// `simulated_gpu::without_address_randomization`).
    pub without_address_randomization: bool,
}

pub struct Outcome {
    pub status: ExitStatus,
    /// False when no traced process ever connected (the program never touched CUDA): the
    /// collector then leaves no trace file, and there is no report. (A complete trace of no
    /// process says the same: its report has `no_process`.)
    pub trace_written: bool,
    /// Where the trace is: the output, made absolute when the run started (or, if its
    /// directory was removed during the run, the copy the collector saved).
    pub trace_path: PathBuf,
    /// Processes were traced but no trace could be kept: why (the collector said it too).
    pub trace_lost: Option<String>,
    /// Set if the collector died before it was told to stop.
    pub collector_died: Option<String>,
    /// The report the collector built from what it saw (`crate::handoff`), if it handed one
    /// over (it was asked to, and the trace is whole); otherwise [`Outcome::replay`].
    pub handed: Option<RunReport>,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let mut session = Session {
        lib: locate::shim_library()?,
        output: args
            .output
            .unwrap_or_else(|| PathBuf::from(format!("oomtrace.{}.oomt", std::process::id()))),
        env: Vec::new(),
        collector_args: Vec::new(),
        without_address_randomization: args.simulate.is_some(),
    };
    // The collector serves the metrics: the same code as `collect`.
    if let Some(addr) = &args.metrics {
        session.collector_args.push("--metrics".into());
        session.collector_args.push(addr.into());
    }
    if let Some(path) = &args.metrics_textfile {
        session.collector_args.push("--metrics-textfile".into());
        session.collector_args.push(path.into());
    }
    let segments = args.segments
        || (args.torch.is_none()
            && std::env::var(torch_hooks::VAR)
                .is_ok_and(|v| torch_hooks::names(&v, TorchHook::Segments)));
    let hooks = PythonHooks {
        tracker: !segments && args.torch != Some(TorchMode::Swap),
        swap: args.torch == Some(TorchMode::Swap),
        steps: !args.no_step_hook,
    };
    match python_env(&session.lib, hooks) {
        Ok(env) => session.env = env,
        // --torch was asked for and cannot be had: say so rather than trace at another level.
        Err(f) if args.torch.is_some() => return Err(f),
        // The default: the program is traced all the same, at the CUDA level, with steps
        // found automatically.
        Err(f) => eprintln!(
            "oomtrace: PyTorch's tensors will not be traced nor its optimizer steps marked \
             ({}): tracing CUDA allocations, steps found automatically",
            f.message
        ),
    }
    // Installed (or found in the cache) before anything starts; kept until the program is
    // done (a temporary copy is removed with it).
    let simulated = match &args.simulate {
        Some(memory) => {
            let installed = simulated_gpu::driver()?;
            session.env.extend(installed.environment(memory));
            eprintln!(
                "oomtrace: running on a simulated {} GPU (no GPU used)",
                memory.text
            );
            Some((installed, memory))
        }
        None => None,
    };
    let simulated_info = simulated
        .as_ref()
        .map(|(_, memory)| memory.as_simulated_device());
    let wanted = Wanted {
        json: args.json.is_some(),
        simulated: simulated_info.clone(),
    };
    if !args.report_from_trace {
        session.collector_args.extend(wanted.collector_args());
    }
    let mut outcome = trace_command(&args.command, &session)?;
    drop(simulated);
    if let Some(why) = &outcome.collector_died {
        eprintln!("oomtrace: the collector died ({why}); the trace stops where it did");
    }
    if let Some(why) = &outcome.trace_lost {
        // The collector said why on stderr; a script asking for JSON gets the same.
        if let Some(path) = &args.json {
            write_json(path, &json_of(&empty_report(why.clone(), &simulated_info)));
        }
        return Ok(exit_code_of(outcome.status));
    }
    // The collector's own report, or (it handed none over) the trace file read back.
    let report = outcome.trace_written.then(|| match outcome.handed.take() {
        Some(handed) => Ok(handed),
        None => outcome.replay().map(|r| RunReport::of(r, &wanted)),
    });
    let trace_written = outcome.trace_written
        && !report
            .as_ref()
            .is_some_and(|r| r.as_ref().is_ok_and(|r| r.no_process));
    if !trace_written {
        let program = args.command[0].to_string_lossy();
        // A program killed by a signal may have allocated a moment before: what it had queued
        // died with it, and "no CUDA activity" would tell the user it made none.
        let said = match outcome.status.signal() {
            Some(_) => format!(
                "`{program}` was {} before any CUDA activity reached the collector (what it \
                 queued just before is lost with it): no trace written",
                describe(outcome.status)
            ),
            None => format!("no CUDA activity seen in `{program}`: no trace written"),
        };
        eprintln!("oomtrace: {said}");
        if let Some(path) = &args.json {
            // Asked for a report: an empty one says the same to a script.
            write_json(path, &json_of(&empty_report(said, &simulated_info)));
        }
        return Ok(exit_code_of(outcome.status));
    }
    let trace_path = &outcome.trace_path;
    let report = report.unwrap_or_else(|| Err(Failure::new("no trace")));
    match &report {
        Ok(r) => {
            eprint!(
                "{}",
                style::paint(&r.summary, style::enabled(style::Stream::Stderr))
            );
            if let Some(memory) = &args.simulate {
                eprint!("{}", simulated_gpu::caveat(memory));
            }
            if r.complete {
                eprintln!(
                    "oomtrace: trace written to {}; details: oomtrace report {}",
                    trace_path.display(),
                    trace_path.display()
                );
            } else {
                for w in &r.warnings {
                    eprintln!("oomtrace: warning: {w}");
                }
                eprintln!(
                    "oomtrace: the trace in {} is incomplete (see above); what it holds: \
                     oomtrace report {}",
                    trace_path.display(),
                    trace_path.display()
                );
            }
            if let (Some(path), Some(json)) = (&args.json, &r.json) {
                write_json(path, json);
            }
        }
        Err(f) => eprintln!("oomtrace: no report: {}", f.message),
    }
    if let Some(path) = &args.html {
        // Like --json: a view that cannot be written is said, and the program's code stays.
        match crate::cmd::view::write_page(trace_path, path) {
            Ok(()) => eprintln!("oomtrace: view written to {}", path.display()),
            Err(f) => eprintln!("oomtrace: no view: {}", f.message),
        }
    }
    if args.fail_on_leak && outcome.status.success() {
        if let Ok(r) = &report {
            let confirmed = r.confirmed_leaks;
            if confirmed > 0 {
                eprintln!(
                    "oomtrace: {confirmed} confirmed leak{}; exiting with 3 (--fail-on-leak)",
                    if confirmed == 1 { "" } else { "s" }
                );
                return Ok(ExitCode::from(3));
            }
        }
    }
    Ok(exit_code_of(outcome.status))
}

/// A report of no process, saying `why` (for `--json` when there is no trace to report from).
fn empty_report(why: String, simulated: &Option<SimulatedDevice>) -> Report {
    let mut empty = Trace::new(oomtrace_proto::trace_file::FileHeader {
        version: oomtrace_proto::trace_file::FILE_VERSION,
        created_unix_ns: 0,
        producer: "oomtrace run".into(),
    });
    empty.complete = true;
    empty.warnings.push(why);
    let mut r = report::build(
        &empty,
        &ReportOptions {
            top: super::DEFAULT_TOP,
            path: String::new(),
            symbolize: false,
        },
    );
    r.trace.simulated = simulated.clone();
    r
}

/// `--json FILE`: the report as the JSON contract (`handoff::json_of`). A report that cannot
/// be written is said in one line; `run` still leaves with the program's own exit code (the
/// program ran, and that code is what a caller checks).
fn write_json(path: &Path, json: &Result<String, String>) {
    let written = json
        .as_ref()
        .map_err(|e| Failure::new(e.clone()))
        .and_then(|text| crate::output::write_file(path, text.as_bytes()));
    if let Err(f) = written {
        eprintln!("oomtrace: {}", f.message);
    }
}

/// What the sitecustomize does when the program imports torch.
#[derive(Clone, Copy, Debug)]
struct PythonHooks {
    /// oomtrace's trace tracker on PyTorch's caching allocator (the default, `--torch`; not
    /// with `--segments`).
    tracker: bool,
    /// `--torch=swap`: PyTorch allocates through oomtrace's pluggable-allocator entry points.
    swap: bool,
    /// A step marker after every optimizer step (not with `--no-step-hook`).
    steps: bool,
}

/// Environment for the program: the sitecustomize first on PYTHONPATH, then the package, and
/// `OOMTRACE_TORCH` saying which hooks it installs. Nothing when no hook is wanted.
fn python_env(lib: &Path, hooks: PythonHooks) -> Result<Vec<(OsString, OsString)>, Failure> {
    let wanted: Vec<TorchHook> = [
        (hooks.tracker, TorchHook::Tracker),
        (hooks.swap, TorchHook::Swap),
        (hooks.steps, TorchHook::Steps),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|&(_, hook)| hook)
    .collect();
    if wanted.is_empty() {
        // Said explicitly, so that the shim (which puts the step hook on PYTHONPATH in a
        // Python program under plain LD_PRELOAD) leaves it off too.
        return Ok(vec![(torch_hooks::VAR.into(), OsString::new())]);
    }
    let dir = oomtrace_proto::host::cache::python_files()
        .map_err(|e| Failure::new(format!("cannot write {e}")))?;
    locate::mark_used(&dir);
    let joined = oomtrace_proto::host::cache::python_path(&dir, std::env::var_os("PYTHONPATH"))
        .map_err(Failure::new)?;
    Ok(vec![
        ("PYTHONPATH".into(), joined),
        ("OOMTRACE_LIB".into(), lib.as_os_str().to_owned()),
        (torch_hooks::VAR.into(), torch_hooks::value(&wanted).into()),
    ])
}

/// The command's exit code as a shell would report it (128 + signal when killed).
pub fn exit_code_of(status: ExitStatus) -> ExitCode {
    if let Some(code) = status.code() {
        return ExitCode::from(code as u8);
    }
    ExitCode::from(128u8.wrapping_add(status.signal().unwrap_or(0) as u8))
}

fn spawn_collector(socket: &Path, output: &Path, extra: &[OsString]) -> Result<Child, Failure> {
    let exe =
        std::env::current_exe().map_err(|e| Failure::new(format!("cannot locate myself: {e}")))?;
    let mode = collector_spawn::Mode::Owned {
        parent_pid: std::process::id(),
    };
    let mut child = collector_spawn::command(&exe, socket, output, mode)
        .args(extra)
        // Where the trace went, said when it is done (`TraceSaid`).
        .stdout(Stdio::piped())
        // Its own process group: a Ctrl-C meant for the program must not kill the collector
        // before it has written the trace.
        .process_group(0)
        .spawn()
        .map_err(|e| Failure::new(format!("cannot start the collector: {e}")))?;
    match collector_spawn::wait_listening(&mut child, socket, Duration::from_secs(10)) {
        Ok(()) => Ok(child),
        // Exit 2 is `collect` refusing its arguments (an output it cannot write, a socket it
        // may not replace): it has said why on our stderr, in one line.
        Err(NotListening::Exited(status)) if status.code() == Some(2) => {
            Err(Failure::already_said(2))
        }
        Err(NotListening::Exited(status)) => Err(Failure::new(format!(
            "the collector exited at start ({status})"
        ))),
        Err(NotListening::TimedOut) => {
            let _ = child.kill();
            Err(Failure::new(
                "the collector did not start listening within 10 s",
            ))
        }
    }
}

/// What `run`'s collector says on its stdout pipe ([`ToRun`]), read as it comes by a thread of
/// ours: a report can be larger than the pipe holds, and each message is a sign of life while
/// the collector builds it.
struct CollectorSays {
    /// When we last heard from it: milliseconds after `started`, 0 for never.
    heard: Arc<AtomicU64>,
    started: Instant,
    /// Everything it wrote, sent once its end of the pipe closes (it exited).
    said: mpsc::Receiver<Vec<u8>>,
}

impl CollectorSays {
    fn listen(stdout: Option<ChildStdout>) -> CollectorSays {
        let heard = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let (tx, said) = mpsc::channel();
        if let Some(mut stdout) = stdout {
            let heard = heard.clone();
            // Without the thread, nothing is heard and `run` reads the trace back itself.
            let _ = std::thread::Builder::new()
                .name("oomtrace-collector-says".into())
                .spawn(move || {
                    let mut bytes = Vec::new();
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        match stdout.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                bytes.extend_from_slice(&buf[..n]);
                                let ms = started.elapsed().as_millis() as u64;
                                heard.store(ms.max(1), Ordering::Relaxed);
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                    let _ = tx.send(bytes);
                });
        }
        CollectorSays {
            heard,
            started,
            said,
        }
    }

    /// When it last said something, if ever.
    fn last_heard(&self) -> Option<Instant> {
        match self.heard.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(self.started + Duration::from_millis(ms)),
        }
    }

    /// Every whole message it said, once it has exited (its end of the pipe is then closed;
    /// at most 2 s for the last bytes to be read).
    fn messages(self) -> Vec<ToRun> {
        self.said
            .recv_timeout(Duration::from_secs(2))
            .map(|bytes| ToRun::decode_all(&bytes))
            .unwrap_or_default()
    }
}

/// What the collector said when it was done.
#[derive(Default)]
struct CollectorDone {
    /// Why it stopped before it was asked to, if it did.
    died: Option<String>,
    trace: Option<TraceSaid>,
    report: Option<RunReport>,
}

/// Stops the collector (see `stop_collector_only`) and reads what it said.
fn stop_collector(mut child: Child, output: &Path) -> CollectorDone {
    let says = CollectorSays::listen(child.stdout.take());
    let died = stop_collector_only(child, output, &says, NO_PROGRESS);
    let mut done = CollectorDone {
        died,
        ..CollectorDone::default()
    };
    for message in says.messages() {
        match message {
            ToRun::Trace(t) => done.trace = Some(t),
            ToRun::Report(body) => done.report = RunReport::from_message(&body),
            ToRun::Working => {}
        }
    }
    done
}

/// How long a stopping collector may show no progress before it is killed.
const NO_PROGRESS: Duration = Duration::from_secs(15);

/// Stops the collector (SIGTERM: it reads what the exited program left in its socket,
/// finishes the trace, then builds the report) and waits for it. A collector still working
/// through a big backlog is given as long as the trace keeps growing, or it keeps saying it is
/// working on the report; one that does neither for `no_progress` is killed.
fn stop_collector_only(
    mut child: Child,
    output: &Path,
    says: &CollectorSays,
    no_progress: Duration,
) -> Option<String> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(describe(status));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let size = || std::fs::metadata(output).map_or(0, |m| m.len());
    let mut last_size = size();
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < no_progress {
        if let Ok(Some(_)) = child.try_wait() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
        let now = size();
        if now != last_size {
            last_size = now;
            last_progress = Instant::now();
        }
        if let Some(heard) = says.last_heard() {
            last_progress = last_progress.max(heard);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    Some(format!(
        "it made no progress for {} s after the program ended and was killed",
        no_progress.as_secs()
    ))
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(code), _) => format!("exited with {code}"),
        _ => status.to_string(),
    }
}

/// The private directory of `run`'s collector socket: removed on every way out of
/// `trace_command`, success or failure. Only what `run` and its collector put there is
/// removed (the socket, then the directory if it is empty).
struct SocketDir {
    socket: PathBuf,
}

impl SocketDir {
    fn new() -> Result<SocketDir, Failure> {
        let base = std::env::temp_dir();
        // What killed chains left (every process that used it is gone).
        socket_dir::clean_abandoned(&base);
        let prefix = format!("oomtrace-{}-", std::process::id());
        let dir = socket_dir::create(&base, &prefix).map_err(|e| {
            let at = base.join(format!("{prefix}XXXXXX"));
            Failure::new(format!("cannot create {}: {e}", at.display()))
        })?;
        let socket = dir.join(socket_dir::SOCKET);
        Ok(SocketDir { socket })
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        socket_dir::remove(&self.socket);
    }
}

/// Runs `command` under a private collector and builds the report.
pub fn trace_command(command: &[OsString], session: &Session) -> Result<Outcome, Failure> {
    let Some((program, rest)) = command.split_first() else {
        return Err(Failure::new(
            "no command to trace (usage: oomtrace run [OPTIONS] [--] CMD [ARGS]...; see \
             `oomtrace run --help`)",
        ));
    };
    // Absolute from the start: the program may change or remove its working directory, and
    // the collector (started here, in ours) and this process must name one file whatever
    // happens to it; the name printed at the end then leads to the file from anywhere. The
    // directory meant is the one the run was started in.
    let output = std::path::absolute(&session.output).unwrap_or_else(|_| session.output.clone());
    let dir = SocketDir::new()?;
    let socket = dir.socket.clone();
    let collector = spawn_collector(&socket, &output, &session.collector_args)?;
    let mut preload: OsString = session.lib.clone().into_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut cmd = Command::new(program);
    cmd.args(rest)
        .env("LD_PRELOAD", &preload)
        .env("OOMTRACE_SOCKET", &socket)
        // Where the run's trace is: the Python API (`oomtrace.trace()`) reads its blocks
        // from it while the program runs.
        .env(oomtrace_proto::host::torch_hooks::TRACE_VAR, &output);
    for (k, v) in &session.env {
        cmd.env(k, v);
    }
    if session.without_address_randomization {
        simulated_gpu::without_address_randomization(&mut cmd);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // Nothing ran, so nothing connected: the collector leaves no trace file.
            let _ = stop_collector(collector, &output);
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(
                Failure::new(format!("cannot run `{}`: {e}", program.to_string_lossy()))
                    .with_code(code),
            );
        }
    };
    signals::supervise(child.id() as i32);
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::new(format!("cannot wait for the command: {e}"))),
        }
    };
    let done = stop_collector(collector, &output);
    drop(dir);
    let (output, trace_lost) = match done.trace {
        // Its directory was removed during the run: the collector saved a copy elsewhere.
        Some(TraceSaid::Written(p)) => (p, None),
        Some(TraceSaid::Lost(why)) => (output, Some(why)),
        None => (output, None),
    };
    // The collector creates the trace only once a traced process connects (on its first
    // CUDA call): no file means the program never used CUDA.
    let trace_written = std::fs::symlink_metadata(&output).is_ok_and(|m| m.is_file());
    Ok(Outcome {
        status,
        trace_written,
        trace_path: output,
        trace_lost,
        collector_died: done.died,
        handed: done.report,
    })
}

impl Outcome {
    /// The report of the trace file, read back.
    pub fn replay(&self) -> Result<Report, Failure> {
        let trace = crate::handoff::read_trace(&self.trace_path)?;
        Ok(crate::handoff::build_report(&trace, &self.trace_path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in collector: ignores SIGTERM (as a collector finishing its trace does), runs
    /// `script` with stdout on the pipe `run` reads. Returned once SIGTERM is ignored (a real
    /// collector is stopped only once it listens, its stop flag long installed).
    fn collector(script: &str) -> Child {
        use std::io::BufRead;
        let mut child = Command::new("sh")
            .args(["-c", &format!("trap '' TERM; echo ready >&2; {script}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "ready\n");
        child
    }

    fn stop(child: Child, no_progress: Duration) -> (Option<String>, Vec<ToRun>) {
        let mut child = child;
        let says = CollectorSays::listen(child.stdout.take());
        let died = stop_collector_only(child, Path::new("/nonexistent"), &says, no_progress);
        (died, says.messages())
    }

    #[test]
    fn a_collector_saying_it_works_on_the_report_is_waited_for() {
        // Says it works every 0.2 s for 1.6 s, longer than the 1 s without progress allowed,
        // then hands a report over.
        let c = collector(
            "for i in 1 2 3 4 5 6 7 8; do printf 'working\\t\\000'; sleep 0.2; done; \
             printf 'report\\t{}\\000'",
        );
        let (died, said) = stop(c, Duration::from_secs(1));
        assert_eq!(died, None);
        assert_eq!(said.last(), Some(&ToRun::Report("{}".into())));
        assert!(said.iter().filter(|m| **m == ToRun::Working).count() >= 4);
    }

    #[test]
    fn a_silent_collector_that_does_not_stop_is_killed() {
        let started = Instant::now();
        let (died, said) = stop(collector("sleep 30"), Duration::from_secs(1));
        assert!(
            died.as_ref()
                .is_some_and(|w| w.contains("no progress for 1 s")),
            "{died:?}"
        );
        assert!(said.is_empty());
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_report_cut_short_is_no_report() {
        // Killed while writing: the last message has no NUL.
        let c = collector("printf 'written\\t/t.oomt\\000report\\t{\"summ'");
        let (_, said) = stop(c, Duration::from_secs(1));
        assert_eq!(said, [ToRun::Trace(TraceSaid::Written("/t.oomt".into()))]);
    }
}
