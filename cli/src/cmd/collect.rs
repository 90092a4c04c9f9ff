//! `oomtrace collect`: a standalone collector for any number of traced processes.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use oomtrace_collector::console::Console;
use oomtrace_collector::metrics::{self, textfile, textfile::Textfile, Registry};
use oomtrace_collector::server::{Collector, Options};
use oomtrace_proto::host::collector_spawn::{ToRun, TraceSaid};
use oomtrace_proto::host::socket_dir;

use crate::simulated_gpu::DeviceMemory;
use crate::{render, signals, Failure};

/// Run a collector on a Unix socket; traced processes connect through OOMTRACE_SOCKET.
// Doc comments here are clap help text, where `<pid>` is a placeholder, not an HTML tag.
#[allow(rustdoc::invalid_html_tags)]
#[derive(clap::Args)]
pub struct Args {
    /// Unix socket to listen on (created; a stale socket nobody listens on is replaced,
    /// anything else there is refused).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Trace file to write [default: oomtrace.<pid>.oomt]
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Stop once every traced process has gone (after at least one came). A connection that
    /// sends no Hello within 5 s, whose frame is not whole 10 s after its first byte, or whose
    /// process has exited (1 s after its last byte), does not count.
    #[arg(long)]
    pub exit_when_idle: bool,
    /// Return once the socket is listening and keep collecting in the background.
    #[arg(long)]
    pub detach: bool,
    /// Print nothing (errors still go to stderr).
    #[arg(long)]
    pub quiet: bool,
    /// Print each finding (leak, OOM, fragmentation, threshold) on stderr as it happens
    /// [default: on unless --quiet or --detach].
    #[arg(long)]
    pub live: bool,
    /// If the output file exists, write NAME.1.oomt (NAME.2.oomt, ...) instead of replacing it.
    #[arg(long)]
    pub no_clobber: bool,
    /// Stop (finishing the trace) when this process is no longer our parent: `oomtrace run`
    /// passes its pid, so a SIGKILLed `run` never leaves its collector behind.
    #[arg(long, value_name = "PID", hide = true)]
    pub parent_pid: Option<u32>,
    /// Under `run`: once the trace is finished, build the run's report from what this
    /// collector saw and hand it to `run` on stdout (`crate::handoff`).
    #[arg(long, hide = true, requires = "parent_pid")]
    pub hand_report: bool,
    /// The handed report carries the JSON report too (`run --json`).
    #[arg(long, hide = true, requires = "hand_report")]
    pub hand_json: bool,
    /// The simulated GPU's SIZE as `run --simulate` was given it, for the handed report.
    #[arg(long, value_name = "SIZE", hide = true, requires = "hand_report",
          value_parser = DeviceMemory::parse)]
    pub simulated_device: Option<DeviceMemory>,
    /// Serve Prometheus metrics on http://ADDR/metrics (ADDR is host:port; port 0 picks a free
    /// port, printed on stderr). See docs/metrics.md.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Write the same metrics to PATH in node-exporter's textfile format, every 2 s and at the
    /// end, atomically (PATH must be a regular file or nothing).
    #[arg(long, value_name = "PATH")]
    pub metrics_textfile: Option<PathBuf>,
}

/// The collector's live lines and warnings, on our stderr.
struct Stderr;

impl Console for Stderr {
    fn line(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
    fn warn(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    // Before anything is created: `run` may stop us the moment the socket listens (its
    // program can exit a millisecond after starting), and a SIGTERM's default action then
    // would leave the trace's temporary file behind. A stop asked for this early is seen by
    // the serving loop at once, which finishes (and removes the unused file) as usual.
    signals::install_stop_flag();
    let output = args
        .output
        .unwrap_or_else(|| PathBuf::from(format!("oomtrace.{}.oomt", std::process::id())));
    let mut opts = Options::new(args.socket, output);
    opts.console = Arc::new(Stderr);
    opts.exit_when_idle = args.exit_when_idle;
    opts.no_clobber = args.no_clobber;
    opts.live = args.live || (!args.quiet && !args.detach);
    // A trace that cannot all be written (a full disk) is said to each traced process on its
    // own stderr: detached, ours is /dev/null; standalone, ours may be far from theirs. Under
    // `run` (a parent pid) the summary says it instead.
    opts.tell_processes = args.detach || args.parent_pid.is_none();
    if !args.exit_when_idle {
        opts.idle_grace = Duration::from_secs(1);
    }
    if args.parent_pid.is_some() {
        // `run` reports from the trace: if its directory is removed during the run, a copy in
        // the temp dir is what there is to report from (and `run` says where it is).
        opts.save_vanished_in = Some(std::env::temp_dir());
    }
    let registry = (args.metrics.is_some() || args.metrics_textfile.is_some())
        .then(|| Arc::new(Registry::new()));
    opts.metrics = registry.clone();
    // Both checked before the socket exists: a refused address or path leaves nothing behind.
    let http = match &args.metrics {
        Some(addr) => Some(
            TcpListener::bind(addr.as_str())
                .map_err(|e| Failure::new(format!("cannot serve metrics on {addr}: {e}")))?,
        ),
        None => None,
    };
    if let (Some(path), Some(r)) = (&args.metrics_textfile, &registry) {
        textfile::write(path, &r.render()).map_err(Failure::new)?;
    }
    let console = opts.console.clone();
    let collector = Collector::bind(opts)?;
    // In a socket directory oomtrace made (the shim's or `run`'s), the owner file names this
    // collector too, so that the next start can tell when the directory was abandoned.
    let socket_dir = collector.options().socket.parent().map(Path::to_path_buf);
    if args.detach {
        daemonize(socket_dir.as_deref())?;
    } else if let Some(dir) = &socket_dir {
        let _ = socket_dir::add_owner(dir, std::process::id());
    }
    // Threads only after the fork of --detach.
    if let (Some(listener), Some(r)) = (http, &registry) {
        let addr = listener
            .local_addr()
            .map_err(|e| Failure::new(format!("cannot serve metrics: {e}")))?;
        metrics::http::spawn(listener, r.clone())
            .map_err(|e| Failure::new(format!("cannot serve metrics on {addr}: {e}")))?;
        // With port 0 this line is the only way to learn the port: said even with --quiet.
        let asked_any_port = args.metrics.as_deref().is_some_and(|a| a.ends_with(":0"));
        if !args.detach && (!args.quiet || asked_any_port) {
            eprintln!("oomtrace: metrics on http://{addr}/metrics");
        }
    }
    let textfile = match (&args.metrics_textfile, &registry) {
        (Some(path), Some(r)) => {
            Some(Textfile::start(path.clone(), r.clone(), console.clone()).map_err(Failure::new)?)
        }
        _ => None,
    };
    if let Some(parent) = args.parent_pid {
        watch_parent(parent);
    }
    if !args.quiet && !args.detach {
        let o = collector.options();
        eprintln!(
            "oomtrace: collecting on {} into {}{} (Ctrl-C to stop)",
            o.socket.display(),
            o.output.display(),
            if o.no_clobber {
                " (or the first free numbered name beside it, if it exists when the first \
                 process connects)"
            } else {
                ""
            }
        );
    }
    let socket = collector.options().socket.clone();
    let output_asked = collector.options().output.clone();
    let served = collector.serve_written(&signals::STOP)?;
    if let Some(t) = textfile {
        // The final values (every connection has published its end by now).
        if let Err(e) = t.finish() {
            console.warn(&format!("oomtrace: {e}"));
        }
    }
    if args.parent_pid.is_some() {
        tell_where(&served, &output_asked);
    }
    let trace = served.trace;
    if args.detach || args.parent_pid.is_some() {
        // Started by the shim or by `run`, each of which made a private directory for the
        // socket (oomtrace-XXXXXX, oomtrace-<pid>-XXXXXX, with an owner file): its owner file
        // and the directory go once the socket has (only those: anything else keeps it).
        socket_dir::remove(&socket);
    }
    // The file holds all this collector saw only when it was written whole, under its name.
    let whole = trace.incomplete.is_none() && served.vanished.is_none();
    if let (true, true, Some(output)) = (args.hand_report, whole, &served.path) {
        let wanted = crate::handoff::Wanted {
            json: args.hand_json,
            simulated: args
                .simulated_device
                .as_ref()
                .map(DeviceMemory::as_simulated_device),
        };
        let working = Working::start();
        let report = crate::handoff::RunReport::of_trace(&trace, output, &wanted);
        drop(working);
        tell_run(&report.message());
    }
    let Some(output) = served.path else {
        // A trace that vanished was said above (`Vanished::line`); otherwise nobody came.
        if !args.quiet && !args.detach && served.vanished.is_none() {
            eprintln!("oomtrace: no traced process connected; no trace written");
        }
        return Ok(ExitCode::SUCCESS);
    };
    if !args.quiet && !args.detach {
        let report = oomtrace_collector::report::build(
            &trace,
            &oomtrace_collector::report::ReportOptions {
                top: 3,
                path: output.display().to_string(),
                symbolize: true,
            },
        );
        eprint!("{}", render::summary(&report));
        // The summary is what this collector saw; the file may hold less (a full disk).
        if let Some(i) = &trace.incomplete {
            eprintln!(
                "oomtrace: warning: {} holds less: {}",
                output.display(),
                i.sentence(trace.header.created_unix_ns)
            );
            eprintln!(
                "oomtrace: the trace in {} is incomplete (see above); what it holds: \
                 oomtrace report {}",
                output.display(),
                output.display()
            );
        } else {
            // Where it went, as `run` says it: with --no-clobber or the default name the
            // user may not know.
            eprintln!(
                "oomtrace: trace written to {}; details: oomtrace report {}",
                output.display(),
                output.display()
            );
        }
    }
    let _ = signals::STOP.load(Ordering::Relaxed);
    Ok(ExitCode::SUCCESS)
}

/// Under `run` (`--parent-pid`): where the trace went, as [`ToRun::Trace`]; nothing if no
/// process connected.
fn tell_where(served: &oomtrace_collector::server::Served, output: &Path) {
    let said = match (&served.path, &served.vanished) {
        (Some(p), _) => TraceSaid::Written(p.clone()),
        (None, Some(v)) => TraceSaid::Lost(v.line()),
        (None, None) => match &served.trace.incomplete {
            // Processes came, but the file could not be put in place.
            Some(i) => TraceSaid::Lost(format!(
                "the trace {} could not be written: {} ({})",
                output.display(),
                i.cause.words(),
                i.message
            )),
            None => return,
        },
    };
    tell_run(&ToRun::Trace(said));
}

/// Writes one message on stdout, `run`'s pipe. False if `run` is no longer reading (it was
/// killed: the pipe is broken).
fn tell_run(message: &ToRun) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(&message.encode())
        .and_then(|()| out.flush())
        .is_ok()
}

/// Says [`ToRun::Working`] every second while the report is built (the trace file no longer
/// grows, and `run` kills a collector that shows no progress for 15 s), until dropped. When
/// `run` is gone there is nobody to build it for: the collector exits (the trace is finished
/// and its socket directory removed by then).
struct Working {
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Working {
    fn start() -> Working {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("oomtrace-working".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Duration::from_secs(1))
                {
                    if !tell_run(&ToRun::Working) {
                        // SAFETY: _exit ends the process at once, from any thread; nothing
                        // is left to flush or remove (the trace is finished and in place,
                        // the socket directory gone), and the report's build is abandoned.
                        unsafe { libc::_exit(0) };
                    }
                }
            });
        Working {
            stop: spawned.is_ok().then_some(stop),
        }
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        // Dropping the sender ends the thread's wait.
        self.stop.take();
    }
}

/// Sets the stop flag once `parent` is no longer this process's parent (it died: we were
/// re-parented). Polled, because a SIGKILLed parent sends nothing; 50 ms is far below the
/// time anyone looks for the trace.
fn watch_parent(parent: u32) {
    let spawned = std::thread::Builder::new()
        .name("oomtrace-parent".into())
        .spawn(move || loop {
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } as u32 != parent {
                signals::STOP.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        });
    if spawned.is_err() {
        eprintln!("oomtrace: cannot watch the parent process; a killed `run` may leave this collector running");
    }
}

/// Forks: the parent exits at once (its caller learns the socket is ready), the child
/// carries on in a new session with stdio on /dev/null. Called while single-threaded. The
/// parent first adds the child to `socket_dir`'s owner file: the directory is never without a
/// live owner while the collector runs.
fn daemonize(socket_dir: Option<&Path>) -> Result<(), Failure> {
    // SAFETY: no other threads exist yet; the child only continues Rust code.
    match unsafe { libc::fork() } {
        -1 => Err(Failure::new(format!(
            "cannot detach: {}",
            std::io::Error::last_os_error()
        ))),
        0 => {
            // SAFETY: plain syscalls in the child.
            unsafe {
                libc::setsid();
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, 0);
                    libc::dup2(null, 1);
                    libc::dup2(null, 2);
                    if null > 2 {
                        libc::close(null);
                    }
                }
            }
            Ok(())
        }
        child => {
            if let Some(dir) = socket_dir {
                let _ = socket_dir::add_owner(dir, child as u32);
            }
            std::process::exit(0)
        }
    }
}
