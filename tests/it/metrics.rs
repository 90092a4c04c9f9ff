//! `oomtrace collect --metrics ADDR --metrics-textfile PATH`: a real Prometheus server (Debian's
//! `prometheus`) started on a loopback port scrapes the collector while a process runs (its
//! values arrive while it runs; it is then killed) and a two-rank job runs through it (one rank
//! leaks); the values Prometheus's HTTP API returns are those of `oomtrace report --json` on
//! the trace the collector wrote. Also: bad addresses, the
//! textfile's refusals, the Grafana dashboard in contrib/ naming only real metrics, and
//! `oomtrace top` watching a running collector through them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oomtrace_tests::*;
use serde_json::Value;

fn has_prometheus() -> bool {
    Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `GET path` on `addr` (HTTP/1.0: the whole body, then the close): (status, body).
fn http_get(addr: &str, path: &str) -> std::io::Result<(u32, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server, and the moment its queries are evaluated at (None: now).
struct Prom {
    addr: String,
    at: Option<f64>,
}

/// One PromQL instant query: each series's labels and value.
fn query(prom: &Prom, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let at = prom.at.map(|t| format!("&time={t:.3}")).unwrap_or_default();
    let path = format!("/api/v1/query?query={}{at}", url_encode(q));
    let (status, body) = http_get(&prom.addr, &path).unwrap_or_else(|e| panic!("query {q}: {e}"));
    assert_eq!(status, 200, "query {q}: {body}");
    let v: Value = serde_json::from_str(&body).expect("Prometheus answers JSON");
    assert_eq!(v["status"], "success", "{body}");
    v["data"]["result"]
        .as_array()
        .expect("a vector")
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let value = r["value"][1].as_str().unwrap().parse::<f64>().unwrap();
            (labels, value)
        })
        .collect()
}

/// The single value of `q`.
fn one(prom: &Prom, q: &str) -> f64 {
    let r = query(prom, q);
    assert_eq!(r.len(), 1, "{q}: {r:?}");
    r[0].1
}

/// Polls until `ready` holds (bounded: a deadline, then the failure says what was missing).
fn wait_for(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A free loopback port (bound, then released for the server that takes it).
/// The `host:port` of the collector's first stderr line, `oomtrace: metrics on http://ADDR/metrics`.
fn metrics_address(first: &str) -> String {
    first
        .trim()
        .strip_prefix("oomtrace: metrics on http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected first line: {first}"))
        .to_string()
}

/// Waits for the collector's socket, then starts `slow_loop` for `secs` seconds traced into it.
fn slow_loop_into(socket: &Path, secs: &str) -> Guard {
    slow_loop_with(socket, &[secs])
}

/// `slow_loop` with its arguments (`SECS [hold]`).
fn slow_loop_with(socket: &Path, args: &[&str]) -> Guard {
    wait_for("the collector's socket", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(socket).is_ok()
    });
    Guard(
        base_command(scenario("slow_loop"))
            .args(args)
            .env("LD_PRELOAD", shim())
            .env("OOMTRACE_SOCKET", socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start slow_loop"),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Every `key` (call-site identity) in the report's sections that names `function`.
fn keys_naming(v: &Value, function: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(k)) = m.get("key") {
                if k.split(" <- ").any(|f| f == function) {
                    out.push(k.clone());
                }
            }
            m.values().for_each(|x| keys_naming(x, function, out));
        }
        Value::Array(a) => a.iter().for_each(|x| keys_naming(x, function, out)),
        _ => {}
    }
}

#[test]
fn prometheus_scrapes_what_the_report_says() {
    if !precondition(
        has_prometheus(),
        "prometheus (Debian's package) on the PATH",
    ) {
        return;
    }
    let dir = scratch("metrics");
    let socket = dir.join("collector.sock");
    let trace = dir.join("job.oomt");
    let textfile = dir.join("oomtrace.prom");
    let mut collector = Guard(
        base_command(oomtrace_bin())
            .args(["collect", "--quiet", "--socket"])
            .arg(&socket)
            .arg("--output")
            .arg(&trace)
            .args(["--metrics", "127.0.0.1:0", "--metrics-textfile"])
            .arg(&textfile)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the collector"),
    );
    // Its first line names the port it took; the rest of its stderr is kept for a failure.
    let (tx, rx) = mpsc::channel();
    let stderr = collector.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the collector names its metrics address");
    let target = metrics_address(&first);
    wait_for("the collector's socket", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let (status, own) = http_get(&target, "/metrics").expect("the collector answers");
    assert_eq!(status, 200);
    assert!(own.contains("# TYPE oomtrace_collector_processes gauge"));

    let port = free_port();
    let mut prom = Prom {
        addr: format!("127.0.0.1:{port}"),
        at: None,
    };
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: oomtrace\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prometheus = Guard(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={}", prom.addr))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let prom_log = || std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    wait_for("prometheus to be ready", Duration::from_secs(60), || {
        http_get(&prom.addr, "/-/ready").is_ok_and(|(s, _)| s == 200)
    });

    // While a process runs, its values arrive (published every 500 ms, not only at its end).
    let mut slow = slow_loop_into(&socket, "60");
    let slow_pid = slow.0.id();
    wait_for(
        "the running process's allocations in Prometheus",
        Duration::from_secs(60),
        || {
            let sel = format!("{{pid=\"{slow_pid}\",rank=\"\"}}");
            query(&prom, &format!("oomtrace_process_running{sel} == 1")).len() == 1
                && query(&prom, &format!("oomtrace_allocations_total{sel} > 0")).len() == 1
                && query(&prom, "oomtrace_collector_processes == 1").len() == 1
        },
    );
    signal(&slow.0, libc::SIGKILL);
    let _ = slow.0.wait();

    // Two ranks of a data-parallel job; rank 1 keeps 4 MiB per step.
    let ranks: Vec<Guard> = (0..2)
        .map(|rank| {
            Guard(
                base_command(scenario("rank_job"))
                    .arg("leak=1")
                    .env("LD_PRELOAD", shim())
                    .env("OOMTRACE_SOCKET", &socket)
                    .env("SIMCUDA_MEMORY", "4GiB")
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start a rank"),
            )
        })
        .collect();
    let pids: Vec<u32> = ranks.iter().map(|r| r.0.id()).collect();
    for mut r in ranks {
        let status = wait_within(&mut r.0, TIMEOUT, "a rank");
        assert!(status.success(), "a rank failed: {status}");
    }
    // Both ended, as a scrape after their final snapshots says, and the leaking site named
    // (sites are named off the connections' threads, shortly after they are first exported).
    wait_for(
        "Prometheus to scrape both ranks' final values",
        Duration::from_secs(60),
        || {
            let r = query(&prom, "oomtrace_process_running == 0");
            pids.iter()
                .chain([&slow_pid])
                .all(|pid| r.iter().any(|(l, _)| l["pid"] == pid.to_string()))
                && !query(
                    &prom,
                    &format!("oomtrace_leak_rate_bytes_per_step{{pid=\"{}\"}}", pids[1]),
                )
                .is_empty()
        },
    );
    assert_eq!(one(&prom, "up{job=\"oomtrace\"}"), 1.0, "{}", prom_log());

    // From here on, queries are evaluated at this moment: once the collector has gone,
    // Prometheus's next (failed) scrape marks every series stale.
    prom.at = Some(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64(),
    );
    signal(&collector.0, libc::SIGTERM);
    let status = wait_within(&mut collector.0, TIMEOUT, "the collector");
    let said = reader.join().unwrap();
    assert!(status.success(), "collector: {status}\n{said}");

    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("report").arg("--json").arg(&trace);
    let out = output_within(cmd, TIMEOUT);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    let killed = processes(&report)
        .into_iter()
        .find(|p| p["pid"] == slow_pid)
        .expect("slow_loop in the report");
    assert_eq!(
        one(
            &prom,
            &format!("oomtrace_allocations_total{{pid=\"{slow_pid}\"}}")
        ),
        device(killed, 0)["allocations"].as_u64().unwrap() as f64,
        "the killed process's final count"
    );
    for (rank, pid) in pids.iter().enumerate() {
        let p = processes(&report)
            .into_iter()
            .find(|p| p["pid"] == *pid)
            .unwrap_or_else(|| panic!("pid {pid} in the report"));
        let sel = |device: &str| format!("{{pid=\"{pid}\",rank=\"{rank}\",device=\"{device}\"}}");
        let devices = p["devices"].as_array().unwrap();
        assert!(!devices.is_empty());
        for d in devices {
            let device = match d["device"].as_i64().unwrap() {
                -1 => "host".to_string(),
                n => n.to_string(),
            };
            for (metric, field) in [
                ("oomtrace_live_bytes", "live_at_exit_bytes"),
                ("oomtrace_peak_bytes", "peak_bytes"),
                ("oomtrace_allocations_total", "allocations"),
                ("oomtrace_frees_total", "frees"),
            ] {
                assert_eq!(
                    one(&prom, &format!("{metric}{}", sel(&device))),
                    d[field].as_u64().unwrap() as f64,
                    "{metric} of rank {rank}, device {device}"
                );
            }
            assert_eq!(
                one(&prom, &format!("oomtrace_reserved_bytes{}", sel(&device))),
                0.0
            );
        }
        // The weights (64 MiB) peaked beside 32 MiB of activations, plus rank 1's history.
        let peak = one(&prom, &format!("oomtrace_peak_bytes{}", sel("0")));
        let expect = if rank == 1 { 96 + 80 } else { 96 };
        assert_eq!(peak, (expect * MIB) as f64, "rank {rank}'s peak");
        assert_eq!(
            one(
                &prom,
                &format!("oomtrace_lost_events_total{{pid=\"{pid}\",rank=\"{rank}\"}}")
            ),
            p["lost_events"].as_u64().unwrap() as f64
        );
        let info = query(&prom, &format!("oomtrace_process_info{{pid=\"{pid}\"}}"));
        assert_eq!(info.len(), 1, "{info:?}");
        assert_eq!(info[0].0["rank"], rank.to_string());
        assert_eq!(info[0].0["local_rank"], rank.to_string());
        assert_eq!(info[0].0["world_size"], "2");
        assert_eq!(info[0].0["exe"], p["exe"].as_str().unwrap());
    }

    // The leak: rank 1's finding, at the level the report gives it, and its rate by site.
    let leaks = findings(&report, "leak");
    assert_eq!(leaks.len(), 1, "one leak: {leaks:?}");
    let leak = leaks[0];
    assert_eq!(leak["pid"], pids[1]);
    let level = leak["level"].as_str().unwrap();
    let n = one(
        &prom,
        &format!(
            "oomtrace_findings{{pid=\"{}\",rank=\"1\",kind=\"leak\",level=\"{level}\"}}",
            pids[1]
        ),
    );
    assert_eq!(n, 1.0);
    assert!(
        query(
            &prom,
            &format!("oomtrace_findings{{pid=\"{}\",kind=\"leak\"}}", pids[0])
        )
        .is_empty(),
        "rank 0 does not leak"
    );
    let rates = query(
        &prom,
        &format!(
            "oomtrace_leak_rate_bytes_per_step{{pid=\"{}\",rank=\"1\"}}",
            pids[1]
        ),
    );
    assert_eq!(rates.len(), 1, "{rates:?}");
    let (labels, rate) = &rates[0];
    let want = leak["growth_bytes_per_step"].as_f64().unwrap();
    assert!((rate - want).abs() <= want.abs() * 1e-9, "{rate} vs {want}");
    assert_eq!(labels["device"], "0");
    let site = &labels["site"];
    // The site's id is that of its key, the identity `oomtrace diff` matches sites by.
    let mut keys = Vec::new();
    keys_naming(&report["sections"], "keep_history", &mut keys);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 1, "one key for keep_history: {keys:?}");
    assert_eq!(*site, oomtrace_collector::metrics::site_id(&keys[0]));
    assert_eq!(site.len(), 12);
    let per_s = query(
        &prom,
        &format!("oomtrace_leak_rate_bytes_per_second{{site=\"{site}\"}}"),
    );
    match leak["growth_bytes_per_s"].as_f64() {
        Some(want) => {
            assert_eq!(per_s.len(), 1, "{per_s:?}");
            assert!((per_s[0].1 - want).abs() <= want.abs() * 1e-9);
        }
        None => assert!(per_s.is_empty(), "{per_s:?}"),
    }
    let info = query(&prom, &format!("oomtrace_site_info{{site=\"{site}\"}}"));
    assert_eq!(info.len(), 1, "{info:?}");
    assert!(
        info[0].0["location"].contains("keep_history"),
        "{:?}",
        info[0].0
    );
    // Health: the collector counted every event of the trace, and Prometheus's scrapes.
    let events: u64 = processes(&report)
        .iter()
        .map(|p| p["events"].as_u64().unwrap())
        .sum();
    assert_eq!(one(&prom, "oomtrace_collector_events_total"), events as f64);
    assert!(one(&prom, "oomtrace_collector_scrapes_total") >= 1.0);
    assert!(one(&prom, "oomtrace_collector_resident_memory_bytes") > 0.0);
    assert_eq!(
        one(&prom, "oomtrace_collector_trace_write_failures_total"),
        0.0
    );

    // The textfile holds the final values, and nothing else is left beside it.
    let text = std::fs::read_to_string(&textfile).unwrap();
    for (rank, pid) in pids.iter().enumerate() {
        let line = format!("oomtrace_process_running{{pid=\"{pid}\",rank=\"{rank}\"}} 0");
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(text
        .contains("\n# TYPE oomtrace_collector_processes gauge\noomtrace_collector_processes 0\n"));
    // The final file names the leaking site too (written once the sites are named).
    let rate_line = format!(
        "oomtrace_leak_rate_bytes_per_step{{pid=\"{}\",rank=\"1\",device=\"0\",site=\"{site}\"}} {want}",
        pids[1]
    );
    assert!(
        text.lines().any(|l| l == rate_line),
        "{rate_line} in\n{text}"
    );
    let leftovers: Vec<String> = names_in(&dir)
        .into_iter()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// `oomtrace run --metrics-textfile`: the same metrics from run's own collector, final values
/// once the command has ended.
#[test]
fn run_writes_the_textfile_too() {
    let dir = scratch("metrics-run");
    let textfile = dir.join("run.prom");
    let mut cmd = base_command(oomtrace_bin());
    cmd.current_dir(&dir)
        .args([
            "run",
            "--json",
            "r.json",
            "-o",
            "t.oomt",
            "--metrics-textfile",
        ])
        .arg(&textfile)
        .args(["--metrics", "127.0.0.1:0", "--"])
        .arg(scenario("rank_job"))
        .env("SIMCUDA_MEMORY", "4GiB");
    let out = output_within(cmd, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("oomtrace: metrics on http://127.0.0.1:"),
        "{err}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    let p = processes(&report)[0];
    let pid = p["pid"].as_u64().unwrap();
    let text = std::fs::read_to_string(&textfile).unwrap();
    for line in [
        format!("oomtrace_process_running{{pid=\"{pid}\",rank=\"\"}} 0"),
        format!(
            "oomtrace_peak_bytes{{pid=\"{pid}\",rank=\"\",device=\"0\"}} {}",
            device(p, 0)["peak_bytes"]
        ),
        format!(
            "oomtrace_allocations_total{{pid=\"{pid}\",rank=\"\",device=\"0\"}} {}",
            device(p, 0)["allocations"]
        ),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}

/// Real PyTorch under `run --torch`: `oomtrace_reserved_bytes` is the caching allocator's
/// reserve the report gives, and the leak's line is a Python line.
#[test]
fn torch_reserve_and_python_leak_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |dir: &Path| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.current_dir(dir)
            .args(["run", "--torch", "--json", "r.json", "-o", "t.oomt"])
            .args(["--metrics-textfile", "torch.prom", "--"])
            .arg(super::torch::python())
            .arg(root.join("scenarios/torch/leak_activations.py"))
            .env("STEPS", "40")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF");
        super::torch::torch_env(&mut cmd, dir);
        // As the PyTorch tier runs it (cuBLAS's kernel choice on simcuda needs it).
        super::torch::without_aslr(&mut cmd);
        output_within(cmd, Duration::from_secs(240))
    };
    let mut dir = scratch("metrics-torch");
    let mut out = run(&dir);
    if super::torch::pytorch_exit_abort(&out.status, &String::from_utf8_lossy(&out.stderr)) {
        // PyTorch's own abort at exit (pytorch#38228), traced or not: once more.
        dir = scratch("metrics-torch");
        out = run(&dir);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let textfile = dir.join("torch.prom");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    let p = processes(&report)[0];
    let pid = p["pid"].as_u64().unwrap();
    let reserved = device(p, 0)["torch_reserved_bytes"]
        .as_u64()
        .expect("the reserve under --torch");
    assert!(reserved > 0);
    let text = std::fs::read_to_string(&textfile).unwrap();
    let line =
        format!("oomtrace_reserved_bytes{{pid=\"{pid}\",rank=\"\",device=\"0\"}} {reserved}");
    assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    // The leak's site is named by its Python line.
    let rate = text
        .lines()
        .find(|l| l.starts_with("oomtrace_leak_rate_bytes_per_step{"))
        .unwrap_or_else(|| panic!("a leak rate in\n{text}\nstderr: {err}"));
    let site = rate
        .split("site=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let info = text
        .lines()
        .find(|l| l.starts_with(&format!("oomtrace_site_info{{site=\"{site}\"")))
        .unwrap_or_else(|| panic!("site_info of {site} in\n{text}"));
    assert!(info.contains("leak_activations.py:"), "{info}");
    // What it held at exit is among the top sites, and every site of every series has its
    // location.
    let live: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("oomtrace_site_live_bytes{"))
        .collect();
    assert!((1..=10).contains(&live.len()), "top sites: {live:?}");
    assert!(live.iter().any(|l| l.contains(&format!("site=\"{site}\""))));
    for l in text.lines().filter(|l| l.contains(",site=\"")) {
        let id = l
            .split(",site=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            text.contains(&format!("oomtrace_site_info{{site=\"{id}\",location=")),
            "{id} (in {l}) has no oomtrace_site_info"
        );
    }
}

#[test]
fn bad_metrics_arguments_are_one_line_and_leave_nothing() {
    let dir = scratch("metrics-bad");
    let socket = dir.join("c.sock");
    let collect = |extra: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.args(["collect", "--quiet", "--socket"])
            .arg(&socket)
            .arg("--output")
            .arg(dir.join("t.oomt"))
            .args(extra);
        output_within(cmd, TIMEOUT)
    };
    // A port someone else holds.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    for addr in [taken.as_str(), "not an address", "127.0.0.1:99999"] {
        let out = collect(&["--metrics", addr]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{addr}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("cannot serve metrics on"), "{err}");
        assert!(!err.contains("panicked"));
    }
    // A textfile path that is a FIFO or a symlink: refused, left as it was.
    let fifo = dir.join("fifo.prom");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let target = dir.join("target");
    std::fs::write(&target, "keep").unwrap();
    let link = dir.join("link.prom");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for p in [&fifo, &link] {
        let out = collect(&["--metrics-textfile", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not a regular file"), "{err}");
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    assert_eq!(names_in(&dir), ["fifo.prom", "link.prom", "target"]);
}

/// Every metric a panel of contrib/grafana/oomtrace.json queries is one the collector exports,
/// and docs/metrics.md names every one it exports.
#[test]
fn the_dashboard_and_the_docs_name_the_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("contrib/grafana/oomtrace.json")).unwrap(),
    )
    .expect("valid JSON");
    let docs = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    // The families the collector exports (an empty registry still names them all).
    let exported: Vec<String> = oomtrace_collector::metrics::Registry::new()
        .render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    for n in &exported {
        assert!(
            docs.contains(&format!("`{n}`")),
            "{n} is not in docs/metrics.md"
        );
    }
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push(e.clone());
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&dash, &mut exprs);
    assert!(exprs.len() >= 5, "{exprs:?}");
    for e in &exprs {
        let names: Vec<&str> = e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("oomtrace_"))
            .collect();
        assert!(!names.is_empty(), "{e} names no oomtrace metric");
        for n in names {
            assert!(
                exported.iter().any(|x| x == n),
                "{n} (in {e}) is not an exported metric"
            );
        }
    }
}

/// `oomtrace top ADDR`: a running collector's processes, devices, the lines holding the most
/// and the findings, from its metrics endpoint. `--once` (and a pipe) prints one view; on a
/// terminal it redraws until `q`. A collector that is not there is one line and exit 2.
#[test]
fn top_watches_a_running_collector() {
    let dir = scratch("metrics-top");
    let socket = dir.join("collector.sock");
    let mut collector = Guard(
        base_command(oomtrace_bin())
            .args(["collect", "--quiet", "--socket"])
            .arg(&socket)
            .arg("--output")
            .arg(dir.join("job.oomt"))
            .args(["--metrics", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the collector"),
    );
    let mut first = String::new();
    BufReader::new(collector.0.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = metrics_address(&first);
    // Holding 1 MiB throughout: its line is in "Holding the most now" at any moment.
    let slow = slow_loop_with(&socket, &["30", "hold"]);
    let pid = slow.0.id().to_string();
    let top = |args: &[&str]| {
        let mut cmd = base_command(oomtrace_bin());
        cmd.arg("top").args(args);
        output_within(cmd, TIMEOUT)
    };
    // Polled as `wait_for` does, but a failure shows the last view (which showed why this
    // test failed half the time before the program held memory throughout: nothing held).
    let start = Instant::now();
    let view = loop {
        let out = top(&[&addr, "--once"]);
        let view = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success()
            && view.lines().any(|l| l.starts_with(&pid))
            && view.contains("main")
        {
            break view;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "waited 30 s for process {pid} and its line in top's view; the last ({}): {view}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        view.starts_with(&format!("oomtrace top: {addr}: ")),
        "{view}"
    );
    let row = view.lines().find(|l| l.starts_with(&pid)).unwrap();
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(words[2], "0", "device 0: {row}");
    assert!(view.contains("Holding the most now"), "{view}");
    assert!(
        view.lines()
            .any(|l| l.contains(&format!("pid {pid} device 0")) && l.contains("slow_loop.c:")),
        "the line holding memory: {view}"
    );
    // On a terminal (script(1) gives it one): it draws, and `q` ends it.
    let mut shown = Command::new("script")
        .args(["-qfec"])
        // A pseudo-terminal with a size (script's has none when its input is a pipe).
        .arg(format!(
            "stty cols 160 rows 50; {} top {addr} --interval 0.2",
            oomtrace_bin().display()
        ))
        .arg("/dev/null")
        .env("TERM", "xterm")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script(1)");
    std::thread::sleep(Duration::from_millis(1500));
    shown.stdin.as_mut().unwrap().write_all(b"q").unwrap();
    let status = wait_within(&mut shown, TIMEOUT, "oomtrace top on a terminal");
    let mut screen = String::new();
    shown
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut screen)
        .unwrap();
    assert!(status.success(), "{screen}");
    // Drawn in place: words between cursor moves.
    assert!(
        screen.contains("\x1b[?1049h") && screen.contains("Holding") && screen.contains(&pid),
        "{screen}"
    );
    drop(slow);
    // Nothing there: one line, exit 2.
    drop(collector);
    let gone = top(&[&addr, "--once"]);
    let err = String::from_utf8_lossy(&gone.stderr);
    assert_eq!(gone.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot read a collector's metrics at"),
        "{err}"
    );
}
