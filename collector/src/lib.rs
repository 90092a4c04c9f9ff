//! oomtrace-collector: the out-of-process half of oomtrace.
//!
//! Layers, each importing only those before it (see README.md for the map):
//! - [`units`]: bytes, durations and rates in text. Imports nothing.
//! - [`snapshot`]: PyTorch's memory snapshots (pickles, read by a reader that runs no code)
//!   made into traces. Imports nothing of the crate.
//! - [`model`]: what is known about one process (live allocations, VMM handles and mappings,
//!   call sites, device totals; O(live + sites), never O(events)), trace-file replay
//!   ([`model::trace`]) and its event history for exporters ([`model::history`]). Tells what
//!   happens to an [`model::Observer`]; imports nothing else of the crate.
//! - [`analysis`]: the epoch clock, the detectors and their statistics, behind one
//!   [`analysis::Analysis`] that observes the model.
//! - [`whatif`]: a trace's tensor requests replayed through a model of PyTorch's caching
//!   allocator under another setting (imports model and units only).
//! - [`fit`]: the levers that make a job fit (the batch, checkpointing, a setting), each a
//!   replay of the trace changed as the lever would change it (imports model, analysis,
//!   whatif, units).
//! - [`report`]: findings completed from the stacks, symbolization, the `--json` contract,
//!   the live line (may import whatif and fit).
//! - The top: [`server`] (the collector process, `oomtrace collect`), [`inbox`] (a
//!   connection's undecoded bytes, bounded), [`trace_writer`] (its trace file), [`console`] (where its lines go: the library never prints), [`metrics`]
//!   (its Prometheus metrics, from snapshots the connections publish).
//!
//! Never links CUDA. Symbolization happens here (or in the CLI), never in the traced process.

pub mod analysis;
pub mod console;
pub mod fit;
pub mod inbox;
pub mod metrics;
pub mod model;
pub mod report;
pub mod server;
pub mod snapshot;
pub mod trace_writer;
pub mod units;
pub mod whatif;

pub use model::Error;
