//! Hook cost per cudaMalloc+cudaFree pair, issued 30 frames deep in code built without frame
//! pointers (`scenarios/bench_pairs.c`), against the simulated driver. One run measures, in
//! interleaved rounds so that machine noise hits every mode alike:
//!
//!   baseline   no preload
//!   forward    preloaded, OOMTRACE_DISABLE=1 (interposition alone)
//!   events     preloaded, events to a live collector, OOMTRACE_STACKS=off
//!   stacks     preloaded, events + native stacks (the default)
//!
//! Overhead = median over rounds of (mode - baseline) in the same round. The collector runs in
//! this process (a separate process from the program, as in real use).
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

fn run_once(mode: usize, pairs: u64, socket: &PathBuf) -> f64 {
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
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}: unexpected output {text:?}"))
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

    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
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
    println!(
        "| mode | median ns/pair | overhead vs baseline (median of per-round deltas) | target |"
    );
    println!("|---|---:|---:|---|");
    for (m, (name, _)) in MODES.iter().enumerate() {
        let med = median(samples[m].clone());
        let deltas: Vec<f64> = samples[m]
            .iter()
            .zip(&samples[0])
            .map(|(a, b)| a - b)
            .collect();
        let over = if m == 0 {
            "-".to_string()
        } else {
            format!("{:+.1} ns", median(deltas))
        };
        let target = match *name {
            "stacks" => "<= 1000 ns (docs/targets.md)",
            _ => "",
        };
        println!("| {name} | {med:.1} | {over} | {target} |");
    }
    println!();
    println!(
        "collector received {events} events from {} processes; {lost} lost",
        collected.processes.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
