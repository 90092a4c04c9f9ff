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
];

/// Longest value the shim records for one variable (bytes); longer ones are cut.
pub const MAX_VALUE: usize = 256;

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
}

impl Launch {
    /// Reads the launcher variables (name, value) a shim recorded. Unknown names and values
    /// that are not numbers are ignored: a process with a garbled `RANK` has no rank, never
    /// a wrong one.
    pub fn from_vars(vars: &[(String, String)]) -> Launch {
        let get = |name: &str| -> Option<u32> {
            vars.iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| v.trim().parse().ok())
        };
        let text = |name: &str| -> Option<String> {
            vars.iter()
                .find(|(k, v)| k == name && !v.is_empty())
                .map(|(_, v)| v.clone())
        };
        let first = |names: &[&str]| names.iter().find_map(|n| get(n));
        for src in SOURCES {
            let Some(r) = first(src.rank) else { continue };
            let world_size = first(src.world_size);
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
}
