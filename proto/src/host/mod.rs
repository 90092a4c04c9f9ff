//! Host helpers: what the shim, the collector and the CLI must do alike on this machine,
//! apart from the bytes they exchange (the wire format is the rest of the crate). Here so
//! that each is written once; none of it crosses the socket or lands in a trace.
//!
//! - [`cache`]: where the files oomtrace carries are kept, and its Python files.
//! - [`collector_spawn`]: the one way to start an `oomtrace collect` (shim and `run`).
//! - [`file_kind`]: what a refused path is, in the words every part uses.
//! - [`peer`]: who is on the other end of a Unix socket (`SO_PEERCRED`).
//! - [`private_dir`]: the one way to make a private (0700 from creation) directory.
//! - [`socket_dir`]: the collector socket's private directory, its owners, and removing what
//!   a killed chain left.
//! - [`torch_hooks`]: the tokens of `OOMTRACE_TORCH`, which PyTorch hooks the sitecustomize
//!   installs (shared with the Python side).

pub mod cache;
pub mod collector_spawn;
pub mod file_kind;
pub mod peer;
pub mod private_dir;
pub mod socket_dir;
pub mod torch_hooks;
