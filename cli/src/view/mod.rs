//! `oomtrace view`: one self-contained HTML page of a trace (no network: its script, style
//! and data are inline).
//!
//! - [`model`]: the trace aggregated into bounded data (memory over time by call site,
//!   findings, the OOM, flame graphs, the site table).
//! - [`html`]: the page: `page.html`, `view.css` and `view.js` (hand-written SVG, no chart
//!   library) with the data as JSON.

pub mod html;
pub mod label;
pub mod model;
