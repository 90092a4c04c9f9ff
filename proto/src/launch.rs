//! Where a process sits in a distributed job: its rank, as the launcher that started it said.
//!
//! The shim records the launcher's variables ([`LAUNCH_VARS`], read from the process's initial
//! environment) and the host name in its `Hello`; the collector reads them back into a
//! [`Launch`] with [`Launch::from_vars`]. The raw variables travel, not the interpretation, so
//! that a later collector can read more of them without a new shim. A process whose launcher
//! passed its rank another way (`torch.multiprocessing.spawn`: as an argument) says it later,
//! through `oomtrace_set_rank`, as `RANK`/`LOCAL_RANK`/`WORLD_SIZE` in a `Launch` frame.
//!
//! Launchers, in the order their variables win (a `torchrun` inside a Slurm step sets both,
//! and its workers' `RANK` is the one PyTorch uses):
//!
//! | launcher                 | rank            | local rank                  | world size            | node              |
//! |--------------------------|-----------------|-----------------------------|-----------------------|-------------------|
//! | torchrun, torch.distributed.launch, accelerate, DeepSpeed | `RANK` | `LOCAL_RANK` | `WORLD_SIZE` | `GROUP_RANK` / `NODE_RANK` |
//! | Slurm (`srun`)           | `SLURM_PROCID`  | `SLURM_LOCALID`             | `SLURM_NTASKS`        | `SLURM_NODEID`    |
//! | Open MPI (`mpirun`)      | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_SIZE` | -      |
//! | MPICH / Hydra, PMIx      | `PMI_RANK`, `PMIX_RANK` | `MPI_LOCALRANKID`   | `PMI_SIZE`            | -                 |

/// Environment variables the shim records, in no particular order. Append only: a collector
/// reads the ones it knows and keeps the rest.
pub const LAUNCH_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "SLURM_NODEID",
    "SLURM_JOB_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALRANKID",
    "CUDA_VISIBLE_DEVICES",
    // Not a launcher's: PyTorch's allocator setting, which `oomtrace whatif` replays when
    // no other is asked for.
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    // Not a launcher's: the simulated GPU's size (`oomtrace run --simulate` sets it), so that
    // a trace says it was simulated whoever reads it later.
    "SIMCUDA_MEMORY",
];

/// Longest value the shim records for one variable (bytes); longer ones are cut.
pub const MAX_VALUE: usize = 256;

/// The largest world size believed: 2^20 ranks. The largest jobs run today have some 10^5
/// GPUs (one rank each), so a world eight times that is still plausible; anything above is a
/// garbled or hostile variable (`WORLD_SIZE=4000000000`, `oomtrace_set_rank(r, 0, INT_MAX)`).
/// Readers size what they build by it (the missing ranks of a job are counted, not listed),
/// so it is never a number a process can make expensive.
pub const MAX_WORLD_SIZE: u32 = 1 << 20;

/// One launcher's variable names, each list best first.
struct Source {
    launcher: Launcher,
    rank: &'static [&'static str],
    local_rank: &'static [&'static str],
    world_size: &'static [&'static str],
    node: &'static [&'static str],
}

/// The launchers, in the order their variables win (the module doc's table).
const SOURCES: &[Source] = &[
    Source {
        launcher: Launcher::Torchrun,
        rank: &["RANK"],
        local_rank: &["LOCAL_RANK"],
        world_size: &["WORLD_SIZE"],
        node: &["GROUP_RANK", "NODE_RANK"],
    },
    Source {
        launcher: Launcher::Slurm,
        rank: &["SLURM_PROCID"],
        local_rank: &["SLURM_LOCALID"],
        world_size: &["SLURM_NTASKS"],
        node: &["SLURM_NODEID"],
    },
    Source {
        launcher: Launcher::OpenMpi,
        rank: &["OMPI_COMM_WORLD_RANK"],
        local_rank: &["OMPI_COMM_WORLD_LOCAL_RANK"],
        world_size: &["OMPI_COMM_WORLD_SIZE"],
        node: &[],
    },
    Source {
        launcher: Launcher::Pmi,
        rank: &["PMI_RANK", "PMIX_RANK"],
        local_rank: &["MPI_LOCALRANKID"],
        world_size: &["PMI_SIZE"],
        node: &[],
    },
];

/// Which launcher's variables gave the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// `RANK`/`LOCAL_RANK`/`WORLD_SIZE`: torchrun and everything that mimics it.
    Torchrun,
    Slurm,
    OpenMpi,
    Pmi,
}

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "slurm",
            Launcher::OpenMpi => "openmpi",
            Launcher::Pmi => "pmi",
        }
    }
}

/// A process's place in its job. Every field is `None` for a process no launcher started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Launch {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The node's index within the job, when the launcher says it.
    pub node_rank: Option<u32>,
    /// Whose variables these are.
    pub launcher: Option<Launcher>,
    /// The job, when the launcher names it (Slurm's job id, torchrun's run id).
    pub job: Option<String>,
    /// A world size the launcher said that is above [`MAX_WORLD_SIZE`] (or not a number a
    /// `u32` holds: `u64::MAX`): not believed, so `world_size` is unknown (`None`). Kept so
    /// that a report can say why.
    pub implausible_world_size: Option<u64>,
}

impl Launch {
    /// Reads the launcher variables (name, value) a shim recorded. Unknown names and values
    /// that are not numbers are ignored: a process with a garbled `RANK` has no rank, never
    /// a wrong one. A world size above [`MAX_WORLD_SIZE`] is unknown (and kept in
    /// `implausible_world_size`); so is a rank at or above it, whatever the world size.
    pub fn from_vars(vars: &[(String, String)]) -> Launch {
        let raw = |name: &str| -> Option<&str> {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.trim())
        };
        let get = |name: &str| -> Option<u32> {
            raw(name)
                .and_then(|v| v.parse().ok())
                .filter(|&n| n < MAX_WORLD_SIZE)
        };
        // A world size: a number up to the bound, or one said that is beyond it (all digits,
        // too large even for a u64 included).
        let size = |name: &str| -> Option<Result<u32, u64>> {
            let v = raw(name)?;
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n = v.parse::<u64>().unwrap_or(u64::MAX);
            Some(if n <= u64::from(MAX_WORLD_SIZE) {
                Ok(n as u32)
            } else {
                Err(n)
            })
        };
        let text = |name: &str| -> Option<String> {
            vars.iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        let first = |names: &[&str]| names.iter().find_map(|n| get(n));
        for src in SOURCES {
            let Some(r) = first(src.rank) else { continue };
            let said = src.world_size.iter().find_map(|n| size(n));
            let (world_size, implausible_world_size) = match said {
                Some(Ok(w)) => (Some(w), None),
                Some(Err(n)) => (None, Some(n)),
                None => (None, None),
            };
            // A rank outside its world is a garbled environment: believe neither.
            if world_size.is_some_and(|w| r >= w) {
                continue;
            }
            return Launch {
                rank: Some(r),
                local_rank: first(src.local_rank),
                world_size,
                node_rank: first(src.node),
                launcher: Some(src.launcher),
                job: text("SLURM_JOB_ID").or_else(|| text("TORCHELASTIC_RUN_ID")),
                implausible_world_size,
            };
        }
        Launch::default()
    }

    /// "rank 3/8" or "rank 3", or "" without a rank.
    pub fn label(&self) -> String {
        match (self.rank, self.world_size) {
            (Some(r), Some(w)) => format!("rank {r}/{w}"),
            (Some(r), None) => format!("rank {r}"),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn torchrun_wins_over_slurm() {
        let l = Launch::from_vars(&vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "4242"),
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("GROUP_RANK", "2"),
        ]));
        assert_eq!(l.rank, Some(5));
        assert_eq!(l.local_rank, Some(1));
        assert_eq!(l.world_size, Some(8));
        assert_eq!(l.node_rank, Some(2));
        assert_eq!(l.launcher, Some(Launcher::Torchrun));
        assert_eq!(l.job.as_deref(), Some("4242"));
        assert_eq!(l.label(), "rank 5/8");
    }

    #[test]
    fn each_launcher_is_read() {
        let slurm = Launch::from_vars(&vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_NODEID", "1"),
        ]));
        assert_eq!(
            (
                slurm.rank,
                slurm.local_rank,
                slurm.world_size,
                slurm.node_rank
            ),
            (Some(3), Some(1), Some(4), Some(1))
        );
        assert_eq!(slurm.launcher, Some(Launcher::Slurm));
        let mpi = Launch::from_vars(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
        ]));
        assert_eq!((mpi.rank, mpi.world_size), (Some(2), Some(16)));
        let pmi = Launch::from_vars(&vars(&[("PMIX_RANK", "7")]));
        assert_eq!((pmi.rank, pmi.launcher), (Some(7), Some(Launcher::Pmi)));
        assert_eq!(pmi.label(), "rank 7");
    }

    #[test]
    fn the_shim_records_every_variable_the_collector_reads() {
        for src in SOURCES {
            for name in [src.rank, src.local_rank, src.world_size, src.node].concat() {
                assert!(
                    LAUNCH_VARS.contains(&name),
                    "{name} is read but not recorded"
                );
            }
        }
        for name in ["SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"] {
            assert!(LAUNCH_VARS.contains(&name));
        }
    }

    #[test]
    fn garbage_gives_no_rank() {
        for bad in [
            vars(&[("RANK", "x")]),
            vars(&[("RANK", "-1")]),
            vars(&[("RANK", "8"), ("WORLD_SIZE", "8")]),
            vars(&[("LOCAL_RANK", "0")]),
            vars(&[]),
        ] {
            assert_eq!(Launch::from_vars(&bad), Launch::default(), "{bad:?}");
        }
        assert_eq!(Launch::default().label(), "");
    }

    #[test]
    fn implausible_numbers_are_unknown() {
        // A world of four billion: the rank stands, the world size is unknown and kept.
        let l = Launch::from_vars(&vars(&[("RANK", "1"), ("WORLD_SIZE", "4000000000")]));
        assert_eq!((l.rank, l.world_size), (Some(1), None));
        assert_eq!(l.implausible_world_size, Some(4_000_000_000));
        assert_eq!(l.label(), "rank 1");
        // INT_MAX from oomtrace_set_rank, and a number no u64 holds.
        let l = Launch::from_vars(&vars(&[("RANK", "0"), ("WORLD_SIZE", "2147483647")]));
        assert_eq!(l.implausible_world_size, Some(2_147_483_647));
        let l = Launch::from_vars(&vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "99999999999999999999999"),
        ]));
        assert_eq!(
            (l.world_size, l.implausible_world_size),
            (None, Some(u64::MAX))
        );
        // The bound itself is believed; a rank at or above it is not.
        let l = Launch::from_vars(&vars(&[("RANK", "5"), ("WORLD_SIZE", "1048576")]));
        assert_eq!(l.world_size, Some(MAX_WORLD_SIZE));
        let l = Launch::from_vars(&vars(&[("RANK", "1048576")]));
        assert_eq!(l, Launch::default());
    }
}
