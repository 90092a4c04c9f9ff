//! Distributed jobs: ranks from the launcher's variables, and one report across ranks, from
//! one collector and from per-process trace files (`oomtrace report a.oomt b.oomt`, or a
//! directory). The job is `rank_job`, a simulated data-parallel rank, started once per rank.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use oomtrace_tests::*;
use serde_json::Value;

const WORLD: u32 = 4;

/// torchrun's variables for `rank` of a `WORLD`-rank job on two nodes.
fn torchrun_env(rank: u32) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", (rank % 2).to_string()),
        ("WORLD_SIZE", WORLD.to_string()),
        ("LOCAL_WORLD_SIZE", "2".into()),
        ("GROUP_RANK", (rank / 2).to_string()),
        // torchrun names the run (its rendezvous id): the traces of its ranks are one job.
        ("TORCHELASTIC_RUN_ID", "run-17".into()),
    ]
}

/// Slurm's variables for the same place.
fn slurm_env(rank: u32) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_LOCALID", (rank % 2).to_string()),
        ("SLURM_NTASKS", WORLD.to_string()),
        ("SLURM_NODEID", (rank / 2).to_string()),
        ("SLURM_JOB_ID", "4242".into()),
    ]
}

/// All ranks at once through one standalone collector; returns its trace.
fn job_through_one_collector(dir: &Path, args: &[&str]) -> PathBuf {
    let socket = dir.join("collector.sock");
    let trace = dir.join("job.oomt");
    let collector = start_collector(&socket, &trace);
    let ranks: Vec<_> = (0..WORLD)
        .map(|rank| {
            let mut c = base_command(scenario("rank_job"));
            c.args(args)
                .env("LD_PRELOAD", shim())
                .env("OOMTRACE_SOCKET", &socket)
                .env("SIMCUDA_MEMORY", "4GiB")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in torchrun_env(rank) {
                c.env(k, v);
            }
            c.spawn().expect("start a rank")
        })
        .collect();
    for mut r in ranks {
        let status = wait_within(&mut r, TIMEOUT, "a rank");
        assert!(status.success(), "a rank failed: {status}");
    }
    signal(&collector, libc::SIGTERM);
    let out = collector.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    trace
}

/// Each rank under its own `oomtrace run`, each writing `rank<N>.oomt` into `dir`.
fn job_in_files(dir: &Path, args: &[&str], env: fn(u32) -> Vec<(&'static str, String)>) {
    let runs: Vec<_> = (0..WORLD)
        .map(|rank| {
            let mut c = base_command(oomtrace_bin());
            c.current_dir(dir)
                .args(["run", "-o"])
                .arg(format!("rank{rank}.oomt"))
                .arg("--")
                .arg(scenario("rank_job"))
                .args(args)
                .env("SIMCUDA_MEMORY", "4GiB")
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (k, v) in env(rank) {
                c.env(k, v);
            }
            c.spawn().expect("start a rank")
        })
        .collect();
    for mut r in runs {
        let status = wait_within(&mut r, TIMEOUT, "a rank under oomtrace run");
        assert!(status.success(), "a rank failed: {status}");
    }
}

/// (pattern, ranks) of each verdict.
fn verdicts(r: &Value) -> Vec<(String, Vec<u64>)> {
    r["ranks"]["verdicts"]
        .as_array()
        .unwrap_or_else(|| panic!("no rank verdicts in {}", r["ranks"]))
        .iter()
        .map(|v| {
            (
                v["pattern"].as_str().unwrap().to_string(),
                v["ranks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_u64().unwrap())
                    .collect(),
            )
        })
        .collect()
}

/// Checks a report of the job with `leak=2`: every rank in the table, rank 2 alone grows,
/// its leak finding carries its rank, and the text says it.
fn assert_rank_two_leaks(r: &Value, text: &str) {
    let rows = r["ranks"]["rows"].as_array().expect("rank rows");
    let ranks: Vec<u64> = rows
        .iter()
        .map(|row| row["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
    assert_eq!(r["ranks"]["world_size"], WORLD);
    assert_eq!(r["ranks"]["missing"].as_array().unwrap().len(), 0);
    for row in rows {
        // 64 MiB of weights + 32 MiB of activations, plus the leak's 80 MiB on rank 2.
        let extra = if row["rank"] == 2 { 80 << 20 } else { 0 };
        assert_eq!(
            row["peak_bytes"].as_u64().unwrap(),
            (96 << 20) + extra,
            "{row}"
        );
        assert_eq!(row["live_at_exit_bytes"], 0, "{row}");
        assert_eq!(row["local_rank"], row["rank"].as_u64().unwrap() % 2);
    }
    let growth = rows[2]["growth_bytes_per_step"]
        .as_f64()
        .expect("rank 2 grows");
    assert!((growth - 4.0 * 1048576.0).abs() < 1.0, "{growth}");
    for i in [0, 1, 3] {
        assert!(rows[i]["growth_bytes_per_step"].is_null(), "{}", rows[i]);
    }
    assert_eq!(verdicts(r), [("leak_on_one_rank".to_string(), vec![2])]);
    let leaks = findings(r, "leak");
    assert_eq!(leaks.len(), 1, "{leaks:?}");
    assert_eq!(leaks[0]["rank"], 2);
    assert!(functions(leaks[0]).contains(&"keep_history".to_string()));
    for p in processes(r) {
        assert_eq!(p["world_size"], WORLD, "{p}");
        assert!(p["rank"].as_u64().is_some(), "{p}");
        assert!(!p["host"].as_str().unwrap().is_empty(), "{p}");
    }
    assert!(text.contains("Ranks (4 of 4)"), "{text}");
    assert!(
        text.contains("only rank 2 grows (+4.00 MiB/step); the other 3 ranks stay flat"),
        "{text}"
    );
    assert!(text.contains("(rank 2)"), "{text}");
}

#[test]
fn one_collector_names_the_one_leaking_rank() {
    let dir = scratch("ranks_one_collector");
    let trace = job_through_one_collector(&dir, &["leak=2"]);
    let r = report_json_of(&[&trace]);
    assert_eq!(processes(&r).len(), WORLD as usize);
    assert!(r.get("traces").is_none(), "one trace: no list of traces");
    assert_rank_two_leaks(&r, &report_text_of(&[&trace]));
    // The other views of the trace name ranks too: Perfetto's process names, the HTML view.
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(["export", "--format", "chrome", "-o", "-"])
        .arg(&trace);
    let chrome = String::from_utf8(output_within(cmd, TIMEOUT).stdout).unwrap();
    for rank in 0..WORLD {
        assert!(
            chrome.contains(&format!(", rank {rank})")),
            "{chrome:.2000}"
        );
    }
    let page = dir.join("view.html");
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("view").arg(&trace).arg("-o").arg(&page);
    assert!(output_within(cmd, TIMEOUT).status.success());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("\"rank\":2,\"world_size\":4"),
        "the view's data has the ranks"
    );
}

#[test]
fn per_process_traces_merge_into_one_report() {
    let dir = scratch("ranks_files");
    job_in_files(&dir, &["leak=2"], slurm_env);
    let files = traces_in(&dir);
    assert_eq!(files.len(), WORLD as usize, "{files:?}");
    // A directory and the list of its files give the same report.
    let by_dir = report_json_of(&[&dir]);
    let listed: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let by_list = report_json_of(&listed);
    for r in [&by_dir, &by_list] {
        assert_eq!(r["traces"].as_array().unwrap().len(), WORLD as usize);
        assert_eq!(r["trace"]["complete"], true);
        assert_rank_two_leaks(r, &report_text_of(&[&dir]));
        // Each process says which file it came from; Slurm gave the ranks.
        for p in processes(r) {
            let from = p["trace"].as_str().expect("trace of a merged process");
            let rank = p["rank"].as_u64().unwrap();
            assert!(from.ends_with(&format!("rank{rank}.oomt")), "{from}");
        }
    }
    assert_eq!(by_dir["ranks"]["rows"], by_list["ranks"]["rows"]);
}

#[test]
fn imbalance_and_the_first_rank_to_run_out_are_told_apart() {
    let dir = scratch("ranks_imbalance");
    let trace = job_through_one_collector(&dir, &["heavy=1", "oom=3", "oom_late=0"]);
    let r = report_json_of(&[&trace]);
    assert_eq!(
        verdicts(&r),
        [
            ("oom_first".to_string(), vec![3, 0]),
            ("imbalance".to_string(), vec![1]),
        ]
    );
    let rows = r["ranks"]["rows"].as_array().unwrap();
    assert_eq!(rows[1]["peak_bytes"].as_u64().unwrap(), 192 << 20);
    let (t0, t3) = (
        rows[0]["oom_unix_s"].as_f64().unwrap(),
        rows[3]["oom_unix_s"].as_f64().unwrap(),
    );
    assert!(t3 < t0, "rank 3 failed first: {t3} vs {t0}");
    let text = report_text_of(&[&trace]);
    assert!(
        text.contains("2 of 4 ranks ran out of memory; rank 3 first"),
        "{text}"
    );
    assert!(
        text.contains("imbalance: rank 1 peaks at up to 192.00 MiB"),
        "{text}"
    );
}

#[test]
fn every_rank_leaking_is_the_shared_code() {
    let dir = scratch("ranks_all");
    job_in_files(&dir, &["leak=all"], torchrun_env);
    let r = report_json_of(&[&dir]);
    assert_eq!(
        verdicts(&r),
        [("leak_on_all_ranks".to_string(), vec![0, 1, 2, 3])]
    );
}

#[test]
fn a_process_without_a_launcher_has_no_rank() {
    let t = run_traced("rank_job", &["leak=0"], &[]);
    let p = processes(&t.report)[0];
    assert!(p["rank"].is_null() && p["world_size"].is_null(), "{p}");
    assert!(
        t.report.get("ranks").is_none(),
        "one process: no rank table"
    );
    // A garbled launcher variable gives no rank rather than a wrong one.
    let t = run_traced("rank_job", &[], &[("RANK", "3"), ("WORLD_SIZE", "2")]);
    assert!(processes(&t.report)[0]["rank"].is_null());
}

#[test]
fn merging_bad_input_is_one_line() {
    let dir = scratch("ranks_bad");
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let t = run_traced("rank_job", &[], &[]);
    for (args, says) in [
        (vec![empty.clone()], "holds no trace files"),
        (
            vec![t.trace.clone(), dir.join("missing.oomt")],
            "missing.oomt",
        ),
    ] {
        let mut cmd = base_command(oomtrace_bin());
        cmd.arg("report").args(&args);
        let out = output_within(cmd, TIMEOUT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        assert!(out.stdout.is_empty());
    }
}
