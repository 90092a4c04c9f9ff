//! `oomtrace top ADDR`: a terminal view of a running collector, redrawn every second: its
//! processes and devices (live, peak, PyTorch's reserve), the lines holding the most memory
//! now, the leaks with their rates, and the findings. It reads what the collector already
//! serves for Prometheus (`collect --metrics ADDR`, `run --metrics ADDR`; docs/metrics.md), so
//! watching a job costs it one render a second and nothing on its hot path; a metrics textfile
//! (`--metrics-textfile PATH`) can be watched the same way.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use oomtrace_collector::units::fmt_bytes;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph};

use crate::Failure;

/// Watch a running collector: its processes, devices, top lines and findings, refreshed.
#[derive(clap::Args)]
pub struct Args {
    /// The collector's metrics address (`host:port`, as given to `collect --metrics` or `run
    /// --metrics`), or a metrics textfile (`--metrics-textfile PATH`).
    #[arg(value_name = "ADDR|FILE")]
    pub source: String,
    /// Seconds between refreshes (0.2 to 60).
    #[arg(long, default_value_t = 1.0, value_name = "SECONDS", value_parser = parse_interval)]
    pub interval: f64,
    /// Print one view as plain text and exit (also what happens when standard output is not a
    /// terminal).
    #[arg(long)]
    pub once: bool,
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if (0.2..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("{text} is not a number of seconds from 0.2 to 60")),
    }
}

/// How long a scrape may take, in all.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of each list.
const TOP: usize = 10;

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    // The first read says whether there is anything to watch: one line and exit 2 if not.
    let first = read(&args.source)?;
    if args.once || !std::io::stdout().is_terminal() {
        let view = View::parse(&first);
        let mut out = std::io::stdout().lock();
        for line in view.lines(&args.source, None) {
            writeln!(out, "{line}")
                .map_err(|e| Failure::new(format!("cannot write to standard output: {e}")))?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    live(&args, first)
}

/// Redraws until `q`, Esc or Ctrl-C. A read that fails keeps the last view and says why in
/// its title (a collector that restarts is watched again once it answers).
fn live(args: &Args, first: String) -> Result<ExitCode, Failure> {
    // Raw mode and the alternate screen; undone below, and by ratatui's panic hook on a bug.
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            return Err(Failure::new(format!("cannot use the terminal: {e}")));
        }
    };
    let mut text = first;
    let mut error: Option<String> = None;
    let every = Duration::from_secs_f64(args.interval);
    let result = loop {
        let view = View::parse(&text);
        let lines: Vec<Line> = view
            .lines(&args.source, error.as_deref())
            .into_iter()
            .map(Line::from)
            .collect();
        let drawn = terminal.draw(|frame| {
            let block = Block::bordered().title(" oomtrace top  (q quits) ");
            frame.render_widget(Paragraph::new(lines).block(block), frame.area());
        });
        if let Err(e) = drawn {
            break Err(Failure::new(format!("cannot draw on the terminal: {e}")));
        }
        let until = Instant::now() + every;
        let mut quit = false;
        let mut keyboard: Option<String> = None;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match event::poll(left) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    keyboard = Some(e.to_string());
                    break;
                }
            }
            if let Ok(Event::Key(k)) = event::read() {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                if k.kind == KeyEventKind::Press
                    && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                {
                    quit = true;
                    break;
                }
            }
        }
        if let Some(e) = keyboard {
            break Err(Failure::new(format!("cannot read the keyboard: {e}")));
        }
        if quit {
            break Ok(ExitCode::SUCCESS);
        }
        match read(&args.source) {
            Ok(t) => {
                text = t;
                error = None;
            }
            Err(f) => error = Some(f.message),
        }
    };
    ratatui::restore();
    result
}

/// The metrics text of `source`: a file, or a scrape of `http://source/metrics`.
fn read(source: &str) -> Result<String, Failure> {
    let path = Path::new(source);
    if path.is_file() || source.contains('/') {
        return std::fs::read_to_string(path)
            .map_err(|e| Failure::new(format!("cannot read the metrics file {source}: {e}")));
    }
    scrape(source).map_err(|e| {
        Failure::new(format!(
            "cannot read a collector's metrics at {source}: {e} (start one with `oomtrace \
             collect --metrics {source}` or `oomtrace run --metrics {source} -- CMD`)"
        ))
    })
}

/// One `GET /metrics` over HTTP/1.0 (the collector's server answers nothing else).
fn scrape(addr: &str) -> Result<String, String> {
    let target = addr
        .to_socket_addrs()
        .map_err(|e| format!("not an address ({e})"))?
        .next()
        .ok_or("not an address")?;
    let mut stream =
        TcpStream::connect_timeout(&target, SCRAPE_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(SCRAPE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(SCRAPE_TIMEOUT)))
        .and_then(|()| write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n"))
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    stream
        .take(64 << 20)
        .read_to_end(&mut body)
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&body);
    let (head, rest) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200") {
        return Err(format!("it answered {status:?}"));
    }
    if !rest.contains("oomtrace_collector_") {
        return Err("what answers there is not an oomtrace collector".into());
    }
    Ok(rest.to_string())
}

/// One sample of the exposition: its name, labels and value.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses `name{label="value",...} number` lines (comments and others skipped).
fn samples(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, labels_of(rest.strip_suffix('}').unwrap_or(rest))),
            None => (head, BTreeMap::new()),
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// `a="x",b="y"` with Prometheus's escapes (`\\`, `\"`, `\n`).
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if name.is_empty() || chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(name.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

/// A site of a process on a device: (pid, device, site id).
type SiteOf = (u64, String, String);

/// What the view shows, from one read of the metrics.
#[derive(Default)]
struct View {
    /// By pid: its process line.
    processes: BTreeMap<u64, Process>,
    /// (pid, device, site) -> live bytes.
    sites: Vec<(u64, String, String, f64)>,
    /// (pid, device, site) -> (bytes per step, bytes per second).
    leaks: BTreeMap<SiteOf, (Option<f64>, Option<f64>)>,
    locations: BTreeMap<String, String>,
    collector_events: f64,
}

#[derive(Default)]
struct Process {
    rank: String,
    exe: String,
    running: bool,
    events: f64,
    lost: f64,
    /// By device: live, peak, reserved bytes.
    devices: BTreeMap<String, (f64, f64, f64)>,
    /// (kind, level) -> how many.
    findings: BTreeMap<(String, String), f64>,
}

impl View {
    fn parse(text: &str) -> View {
        let mut v = View::default();
        for s in samples(text) {
            let label = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
            let pid = label("pid").parse::<u64>().ok();
            let device = label("device");
            match (s.name.as_str(), pid) {
                ("oomtrace_collector_events_total", _) => v.collector_events = s.value,
                ("oomtrace_site_info", _) => {
                    v.locations.insert(label("site"), label("location"));
                }
                ("oomtrace_site_live_bytes", Some(pid)) => {
                    v.sites.push((pid, device, label("site"), s.value))
                }
                ("oomtrace_leak_rate_bytes_per_step", Some(pid)) => {
                    v.leaks.entry((pid, device, label("site"))).or_default().0 = Some(s.value);
                }
                ("oomtrace_leak_rate_bytes_per_second", Some(pid)) => {
                    v.leaks.entry((pid, device, label("site"))).or_default().1 = Some(s.value);
                }
                (name, Some(pid)) => {
                    let p = v.processes.entry(pid).or_default();
                    match name {
                        "oomtrace_process_info" => {
                            p.rank = label("rank");
                            p.exe = label("exe");
                        }
                        "oomtrace_process_running" => p.running = s.value > 0.0,
                        "oomtrace_events_total" => p.events = s.value,
                        "oomtrace_lost_events_total" => p.lost = s.value,
                        "oomtrace_live_bytes" => p.devices.entry(device).or_default().0 = s.value,
                        "oomtrace_peak_bytes" => p.devices.entry(device).or_default().1 = s.value,
                        "oomtrace_reserved_bytes" => {
                            p.devices.entry(device).or_default().2 = s.value
                        }
                        "oomtrace_findings" if s.value > 0.0 => {
                            p.findings.insert((label("kind"), label("level")), s.value);
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        v.sites
            .sort_by(|a, b| b.3.total_cmp(&a.3).then_with(|| a.0.cmp(&b.0)));
        v
    }

    fn location(&self, site: &str) -> String {
        self.locations
            .get(site)
            .cloned()
            .unwrap_or_else(|| format!("site {site}"))
    }

    /// The view as lines of text: what `--once` prints and the terminal shows.
    fn lines(&self, source: &str, error: Option<&str>) -> Vec<String> {
        let b = |x: f64| fmt_bytes(x.max(0.0) as u64);
        let running = self.processes.values().filter(|p| p.running).count();
        let mut out = vec![format!(
            "oomtrace top: {source}: {} process{} ({running} running), {} events",
            self.processes.len(),
            if self.processes.len() == 1 { "" } else { "es" },
            self.collector_events as u64
        )];
        if let Some(e) = error {
            out.push(format!(
                "  (the last read failed, showing the one before: {e})"
            ));
        }
        out.push(String::new());
        out.push(format!(
            "{:<8} {:<5} {:<7} {:>12} {:>12} {:>12}  {}",
            "pid", "rank", "device", "live", "peak", "reserved", "findings"
        ));
        for (pid, p) in &self.processes {
            let findings: Vec<String> = p
                .findings
                .iter()
                .map(|((kind, level), n)| format!("{kind} {level} {n}"))
                .collect();
            let state = if p.running { "" } else { " (ended)" };
            let rank = if p.rank.is_empty() { "-" } else { &p.rank };
            if p.devices.is_empty() {
                out.push(format!("{pid:<8} {rank:<5} {:<7}{state}", "-"));
            }
            for (i, (d, (live, peak, reserved))) in p.devices.iter().enumerate() {
                let reserved = if *reserved > 0.0 {
                    b(*reserved)
                } else {
                    "-".into()
                };
                out.push(format!(
                    "{:<8} {:<5} {:<7} {:>12} {:>12} {:>12}  {}{}",
                    if i == 0 {
                        pid.to_string()
                    } else {
                        String::new()
                    },
                    if i == 0 { rank } else { "" },
                    d,
                    b(*live),
                    b(*peak),
                    reserved,
                    if i == 0 {
                        findings.join(", ")
                    } else {
                        String::new()
                    },
                    if i == 0 { state } else { "" }
                ));
            }
            if p.lost > 0.0 {
                out.push(format!("{:<8} {} events lost", "", p.lost as u64));
            }
        }
        out.push(String::new());
        out.push("Holding the most now".into());
        if self.sites.is_empty() {
            out.push("  (nothing held)".into());
        }
        for (pid, d, site, live) in self.sites.iter().take(TOP) {
            out.push(format!(
                "  {:>12}  pid {pid} device {d}  {}",
                b(*live),
                self.location(site)
            ));
        }
        if !self.leaks.is_empty() {
            out.push(String::new());
            out.push("Leaks".into());
            for ((pid, d, site), (per_step, per_s)) in self.leaks.iter().take(TOP) {
                let rate = match (per_step, per_s) {
                    (Some(s), Some(t)) => format!("+{}/step, +{}/s", b(*s), b(*t)),
                    (Some(s), None) => format!("+{}/step", b(*s)),
                    (None, Some(t)) => format!("+{}/s", b(*t)),
                    (None, None) => String::new(),
                };
                out.push(format!(
                    "  {rate:>24}  pid {pid} device {d}  {}",
                    self.location(site)
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\n\
        oomtrace_collector_events_total 1234\n\
        oomtrace_process_info{pid=\"7\",rank=\"\",local_rank=\"\",world_size=\"\",exe=\"/bin/a b\"} 1\n\
        oomtrace_process_running{pid=\"7\",rank=\"\"} 1\n\
        oomtrace_live_bytes{pid=\"7\",rank=\"\",device=\"0\"} 1048576\n\
        oomtrace_peak_bytes{pid=\"7\",rank=\"\",device=\"0\"} 2097152\n\
        oomtrace_findings{pid=\"7\",rank=\"\",kind=\"leak\",level=\"confirmed\"} 1\n\
        oomtrace_site_live_bytes{pid=\"7\",rank=\"\",device=\"0\",site=\"abc\"} 1048576\n\
        oomtrace_leak_rate_bytes_per_step{pid=\"7\",rank=\"\",device=\"0\",site=\"abc\"} 4096\n\
        oomtrace_site_info{site=\"abc\",location=\"train.py:24 step \\\"x\\\"\"} 1\n";

    #[test]
    fn the_view_names_processes_devices_lines_and_leaks() {
        let v = View::parse(TEXT);
        let text = v.lines("127.0.0.1:9464", None).join("\n");
        assert!(
            text.contains("1 process (1 running), 1234 events"),
            "{text}"
        );
        assert!(text.contains("1.00 MiB"), "{text}");
        assert!(text.contains("leak confirmed 1"), "{text}");
        assert!(text.contains("train.py:24 step \"x\""), "{text}");
        assert!(text.contains("+4.00 KiB/step"), "{text}");
    }

    #[test]
    fn intervals_out_of_range_are_refused() {
        assert!(parse_interval("0.1").is_err());
        assert!(parse_interval("banana").is_err());
        assert_eq!(parse_interval("2"), Ok(2.0));
    }
}
