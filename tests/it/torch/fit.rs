//! `oomtrace fit` against real PyTorch: each `tests/scenarios/torch/fit_*.py` script (an MLP, a
//! transformer with attention, a conv net with batch norm, AdamW with gradient accumulation)
//! is traced once at its batch; `oomtrace fit` predicts from that trace the peak reserve with
//! the batch halved and doubled and with a named module checkpointed, and the largest batch
//! that fits a smaller device; the script then runs untraced with each lever for real
//! (`BATCH`, `CKPT`), and PyTorch's own `max_memory_reserved()` is the ground truth. The table
//! of figures is in docs/fit.md.

use super::whatif::{peaks_of, run_to_end, Peaks};
use super::*;

/// The capacity the largest batch is found for: a simulated device of this size.
const SMALL_DEVICE: &str = "1GiB";
const SMALL_DEVICE_BYTES: u64 = 1 << 30;

/// One script and what is checked on it.
struct Case {
    script: &'static str,
    batch: u64,
    /// The module the script checkpoints (`CKPT`) and how `fit --checkpoint` names it.
    ckpt_env: &'static str,
    ckpt_arg: String,
    /// How far each prediction may be from PyTorch's own peak reserve: batch x0.5, x2, the
    /// module checkpointed. 10 % (the bound) unless docs/fit.md names the gap.
    tolerance: [f64; 3],
    /// The largest batch: checked within one step of the real one (a real run one step
    /// below it fits, one above does not), or only that the predicted batch fits (the
    /// prediction is on the safe side).
    largest: Largest,
}

#[derive(Clone, Copy, PartialEq)]
enum Largest {
    WithinOneStep(u64),
    Fits,
}

/// A real run of the script, untraced, with `batch`, `ckpt` and the device of `memory`.
fn real(case: &Case, batch: u64, ckpt: &str, memory: Option<&str>) -> Peaks {
    let what = format!("{} with BATCH={batch} CKPT={ckpt:?}", case.script);
    let dir = scratch("torch-fit-real");
    let stdout = run_to_end(&what, || {
        let mut cmd = base_command(python());
        cmd.arg(script(case.script)).current_dir(&dir);
        torch_env(&mut cmd, &dir);
        cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .env("BATCH", batch.to_string())
            .env("CKPT", ckpt);
        if let Some(m) = memory {
            cmd.env("SIMCUDA_MEMORY", m);
        }
        without_aslr(&mut cmd);
        cmd
    });
    peaks_of(&stdout, &what)
}

fn fit_json(trace: &Path, args: &[&str]) -> Value {
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("fit").arg(trace).args(args).arg("--json");
    let out = output_within(cmd, TORCH_TIMEOUT);
    assert!(
        out.status.success(),
        "fit {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("fit --json is JSON");
    assert_eq!(v["version"], 1);
    v
}

/// The one device of the one process.
fn device(fit: &Value) -> &Value {
    let p = &fit["fit"]["processes"];
    assert_eq!(p.as_array().map(Vec::len), Some(1), "{fit}");
    &p[0]["devices"][0]
}

fn lever<'a>(d: &'a Value, kind: &str, factor: f64) -> &'a Value {
    d["levers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == kind && (l["batch_factor"].as_f64().unwrap() - factor).abs() < 1e-9)
        .unwrap_or_else(|| panic!("no {kind} x{factor} lever in {d}"))
}

fn check(case: Case) {
    let dir = scratch("torch-fit");
    let batch = case.batch.to_string();
    // The trace, under `oomtrace run` (the tracker, the default), at the script's batch.
    let what = format!("{} traced", case.script);
    run_to_end(&what, || {
        command(
            case.script,
            Mode::Run,
            &dir,
            &[("BATCH", &batch), ("STEPS", "3")],
        )
    });
    let trace = dir.join("trace.oomt");
    let fit = fit_json(&trace, &["--batch", &batch, "--checkpoint", &case.ckpt_arg]);
    let d = device(&fit);
    assert_eq!(d["complete"], true, "{d}");
    // A module the trace has no call of: one line naming it, exit 2.
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("fit")
        .arg(&trace)
        .args(["--checkpoint", "NoSuchModule"]);
    crate::cli::assert_one_line_error(&output_within(cmd, TORCH_TIMEOUT), "NoSuchModule");
    let predicted = |l: &Value| l["peak_reserved_bytes"].as_u64().unwrap();
    let base = real(&case, case.batch, "", None);
    // The replay of the run itself is the model's check.
    let replayed = d["replayed_peak_reserved_bytes"].as_u64().unwrap();
    assert!(
        within(replayed, base.reserved, 0.02),
        "{}: the replay {replayed} against the run's {}",
        case.script,
        base.reserved
    );
    let checks = [
        ("batch x0.5", lever(d, "batch", 0.5), case.batch / 2, ""),
        ("batch x2", lever(d, "batch", 2.0), case.batch * 2, ""),
        (
            "checkpointed",
            lever(d, "checkpoint", 1.0),
            case.batch,
            case.ckpt_env,
        ),
    ];
    let mut misses = Vec::new();
    for ((name, l, batch, ckpt), tolerance) in checks.into_iter().zip(case.tolerance) {
        let got = real(&case, batch, ckpt, None);
        assert!(!got.oom, "{}: {name} ran out of memory", case.script);
        let p = predicted(l);
        let off = (p as f64 - got.reserved as f64) / got.reserved as f64;
        eprintln!(
            "{} {name}: predicted {p}, PyTorch {} ({:+.1} %)",
            case.script,
            got.reserved,
            100.0 * off
        );
        if off.abs() > tolerance {
            misses.push(format!(
                "{name}: {:+.1} % (bound {:.0} %)",
                100.0 * off,
                100.0 * tolerance
            ));
        }
    }
    assert!(misses.is_empty(), "{}: {}", case.script, misses.join("; "));
    // The largest batch for a smaller device.
    let small = fit_json(&trace, &["--batch", &batch, "--memory", SMALL_DEVICE]);
    let d = device(&small);
    assert_eq!(d["capacity_bytes"], SMALL_DEVICE_BYTES);
    let largest = d["levers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["kind"] == "largest_batch")
        .unwrap_or_else(|| panic!("no largest batch in {d}"));
    assert_eq!(largest["fits"], true);
    let b = largest["batch"].as_u64().unwrap();
    match case.largest {
        Largest::WithinOneStep(step) => {
            let below = real(&case, b.saturating_sub(step).max(1), "", Some(SMALL_DEVICE));
            assert!(
                !below.oom,
                "{}: batch {} (one step below {b}) ran out of memory",
                case.script,
                b - step
            );
            let above = real(&case, b + step + 1, "", Some(SMALL_DEVICE));
            assert!(
                above.oom,
                "{}: batch {} (more than one step above {b}) fitted",
                case.script,
                b + step + 1
            );
        }
        Largest::Fits => {
            let at = real(&case, b, "", Some(SMALL_DEVICE));
            assert!(
                !at.oom,
                "{}: the predicted largest batch {b} ran out of memory",
                case.script
            );
        }
    }
}

fn within(got: u64, want: u64, tolerance: f64) -> bool {
    (got as f64 - want as f64).abs() <= tolerance * want as f64
}

#[test]
fn an_mlp() {
    check(Case {
        script: "fit_mlp.py",
        batch: 8192,
        ckpt_env: "encoder",
        ckpt_arg: "Encoder".into(),
        tolerance: [0.10; 3],
        largest: Largest::Fits,
    });
}

#[test]
fn a_transformer_with_attention() {
    check(Case {
        script: "fit_transformer.py",
        batch: 16,
        ckpt_env: "block",
        ckpt_arg: "Block".into(),
        tolerance: [0.10; 3],
        largest: Largest::WithinOneStep(2),
    });
}

#[test]
fn a_conv_net_with_batch_norm() {
    let line = torch_script_line("fit_convnet.py", "\"stage2\" in CKPT");
    check(Case {
        script: "fit_convnet.py",
        batch: 64,
        ckpt_env: "stage2",
        ckpt_arg: format!("fit_convnet.py:{line}"),
        // Half the batch: 12 % under PyTorch's own (docs/fit.md).
        tolerance: [0.15, 0.10, 0.10],
        largest: Largest::WithinOneStep(8),
    });
}

#[test]
fn adamw_with_gradient_accumulation() {
    check(Case {
        script: "fit_accumulate.py",
        batch: 2048,
        ckpt_env: "ff",
        ckpt_arg: "FeedForward".into(),
        tolerance: [0.10; 3],
        largest: Largest::Fits,
    });
}

/// A transformer whose batch does not fit a 1 GiB device runs out of memory in its first
/// forward pass: the report's out-of-memory finding ends with the levers that would make it
/// fit, checkpointing its blocks first; and with its blocks checkpointed, the same batch fits
/// for real.
#[test]
fn an_out_of_memory_ends_with_the_levers_that_make_it_fit() {
    let dir = scratch("torch-fit-oom");
    run_to_end("fit_transformer.py traced at batch 120 on 1 GiB", || {
        command(
            "fit_transformer.py",
            Mode::Run,
            &dir,
            &[
                ("BATCH", "120"),
                ("STEPS", "3"),
                ("SIMCUDA_MEMORY", SMALL_DEVICE),
            ],
        )
    });
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    let oom = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "oom")
        .unwrap_or_else(|| panic!("no OOM finding: {report}"));
    let levers = oom["levers"].as_array().expect("the OOM has levers");
    assert!((1..=2).contains(&levers.len()), "{levers:?}");
    assert_eq!(levers[0]["kind"], "checkpoint", "{levers:?}");
    assert!(
        levers[0]["name"].as_str().unwrap().contains("Block"),
        "{levers:?}"
    );
    assert_eq!(levers[0]["fits"], true);
    // The run ended in the step that ran out of memory: a bound, and said to be one.
    assert_eq!(levers[0]["lower_bound"], true);
    assert!(report["fit"]["processes"][0]["devices"][0]["complete"] == false);
    // The anatomy section's device has them too.
    let device = &report["processes"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["anatomy"].is_object())
        .unwrap_or_else(|| panic!("no device with an anatomy: {report}"));
    assert!(!device["levers"].as_array().unwrap().is_empty(), "{device}");
    let case = Case {
        script: "fit_transformer.py",
        batch: 120,
        ckpt_env: "block",
        ckpt_arg: "Block".into(),
        tolerance: [0.0; 3],
        largest: Largest::Fits,
    };
    assert!(
        real(&case, 120, "", Some(SMALL_DEVICE)).oom,
        "batch 120 fits 1 GiB after all"
    );
    assert!(
        !real(&case, 120, "block", Some(SMALL_DEVICE)).oom,
        "checkpointing the blocks did not make batch 120 fit"
    );
    // The text says it in one line at the end of the finding.
    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("report").arg(dir.join("trace.oomt"));
    let out = output_within(cmd, TORCH_TIMEOUT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l
            .trim_start()
            .starts_with("to make it fit: checkpoint Block at fit_transformer.py:")),
        "{text}"
    );
}
