//! `oomtrace view`: one self-contained HTML page of a trace (no network: its script, style
//! and data are inline).
//!
//! - [`model`]: the trace aggregated into bounded data (memory over time by call site, and
//!   with PyTorch's tensors, tensors by call site under PyTorch's reserve; findings, the OOM,
//!   flame graphs of Python and of native frames, the site table).
//! - [`label`]: how call sites and frames are named (`file:line function` of the culprit).
//! - [`html`]: the page: `page.html`, `view.css` and `view.js` (hand-written SVG, no chart
//!   library) with the data as JSON.

pub mod html;
pub mod label;
pub mod model;
