//! `fit` with the stacks read: a call site whose native frames allocate a library's workspace
//! (cuBLAS's, through PyTorch's allocator) keeps its size whatever the batch. What `oomtrace
//! fit` and the report's lever lines call.

use std::path::Path;

use super::roles::allocates_library_workspace;
use super::symbolize::StackSymbolizer;
use crate::fit::{self, Fit, Options};

/// Fits the trace at `path` (see [`fit::fit_trace`]).
pub fn fit(path: &Path, opts: &Options) -> Result<Fit, fit::Error> {
    fit_with(path, opts, &mut StackSymbolizer::new())
}

/// [`fit()`], reading stacks with `sym` (a report's, which has read most of them already).
pub fn fit_with(path: &Path, opts: &Options, sym: &mut StackSymbolizer) -> Result<Fit, fit::Error> {
    let trace = fit::load(path)?;
    fit::fit_trace(path, &trace, opts, &mut |p, site| {
        allocates_library_workspace(&sym.site(p, site))
    })
}
