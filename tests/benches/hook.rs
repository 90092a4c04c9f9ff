//! Hook cost per cudaMalloc+cudaFree pair, issued 30 frames deep in code built without frame
//! pointers (`scenarios/bench_pairs.c`), against the simulated driver, with the collector in
//! this process (a separate process from the program, as in real use; `scripts/bench.sh` times
//! the same modes through `oomtrace run` and its own collector process). Modes:
//!
//!   baseline   no preload
//!   forward    preloaded, OOMTRACE_DISABLE=1 (interposition alone)
//!   events     preloaded, events to a live collector, OOMTRACE_STACKS=off
//!   stacks     preloaded, events + native stacks (the default)
//!
//! Method, for a shared machine where one run's figure swings by 2x: every round runs each
//! mode once, the order rotated by one per round, so that machine noise hits every mode alike.
//! Each run of bench_pairs times its own rounds in wall time and in the calling thread's CPU
//! time (what the program itself spent, whatever else held the core) and reports its median and
//! fastest round. Per mode: the median over rounds of the runs' medians, the fastest round of
//! all, and the overhead = median over rounds of (mode - baseline) in the same round, for wall
//! and CPU time alike. A benchmark, not a test: nothing is asserted on the figures.
//!
//!   cargo bench -p oomtrace-tests --bench hook            (PAIRS=1000000 ROUNDS=5 by default)

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use oomtrace_collector::server::{Collector, Options};
use oomtrace_tests::{scenario, scratch, shim, SIM_LIB};

const MODES: [(&str, &[(&str, &str)]); 4] = [
    ("baseline", &[]),
    ("forward", &[("OOMTRACE_DISABLE", "1")]),
    ("events", &[("OOMTRACE_STACKS", "off")]),
    ("stacks", &[]),
];

/// The keys bench_pairs prints, per pair: median round (wall, thread CPU), fastest round.
const KEYS: [&str; 4] = [
    "ns_per_pair",
    "cpu_ns_per_pair",
    "fastest_ns_per_pair",
    "fastest_cpu_ns_per_pair",
];

/// One run of bench_pairs in `mode`: its figures in the order of [`KEYS`].
fn run_once(mode: usize, pairs: u64, socket: &PathBuf) -> [f64; 4] {
    let (name, env) = MODES[mode];
    let mut cmd = Command::new(scenario("bench_pairs"));
    cmd.arg(pairs.to_string()).env("LD_LIBRARY_PATH", SIM_LIB);
    if name != "baseline" {
        cmd.env("LD_PRELOAD", shim()).env("OOMTRACE_SOCKET", socket);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run bench_pairs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    KEYS.map(|key| {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(key)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{name}: no {key} in {text:?}"))
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let pairs: u64 = std::env::var("PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let dir = scratch("bench");
    let socket = dir.join("bench.sock");
    let trace = dir.join("bench.oomt");
    let collector =
        Collector::bind(Options::new(socket.clone(), trace.clone())).expect("collector");
    static STOP: AtomicBool = AtomicBool::new(false);
    let server = std::thread::spawn(move || collector.serve(&STOP));

    // samples[mode][round]: that run's figures, in the order of KEYS.
    let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        // Rotate the order so no mode always runs first or right after another.
        for k in 0..MODES.len() {
            let m = (k + round) % MODES.len();
            samples[m].push(run_once(m, pairs, &socket));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
    let collected = server.join().expect("collector thread").expect("collector");
    let (mut events, mut lost) = (0u64, 0u64);
    for p in &collected.processes {
        events += p.events;
        lost += p.lost.events;
    }

    println!("hook cost per cudaMalloc+cudaFree pair, {pairs} pairs x {rounds} rounds, 30-frame chain, -fomit-frame-pointer");
    println!();
    println!("| mode | median ns/pair | fastest | overhead (median of per-round deltas) | median CPU ns/pair | fastest CPU | CPU overhead | target |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let column = |m: usize, k: usize| samples[m].iter().map(|s| s[k]).collect::<Vec<f64>>();
    let fastest = |m: usize, k: usize| column(m, k).into_iter().fold(f64::INFINITY, f64::min);
    let overhead = |m: usize, k: usize| {
        if m == 0 {
            return "-".to_string();
        }
        let deltas = samples[m].iter().zip(&samples[0]).map(|(a, b)| a[k] - b[k]);
        format!("{:+.1} ns", median(deltas.collect()))
    };
    for (m, (name, _)) in MODES.iter().enumerate() {
        let target = match *name {
            "stacks" => "<= 1000 ns (docs/targets.md), <= 300 ns (issue 24)",
            _ => "",
        };
        println!(
            "| {name} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {target} |",
            median(column(m, 0)),
            fastest(m, 2),
            overhead(m, 0),
            median(column(m, 1)),
            fastest(m, 3),
            overhead(m, 1),
        );
    }
    println!();
    println!(
        "collector received {events} events from {} processes; {lost} lost",
        collected.processes.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
