//! The snapshot writer: a finished allocator [`Model`] as the dict
//! `torch.cuda.memory._snapshot()` returns, pickled (protocol 4, [`crate::export::pickle`]):
//! `{"segments": [...], "device_traces": [[...], ...], "allocator_settings": {...},
//! "external_annotations": [], "host_segments": [], "host_traces": []}` (the keys of PyTorch
//! 2.15's snapshots) and, when the ring left entries out,
//! `"oomtrace": {...}`. It reads the model and symbolizes call sites; it decides nothing about
//! what the snapshot holds.
//!
//! Frames are written once per site and once per distinct frame dict (pickle memo
//! references after that): entries of one site share a frame list, as most entries do.
//! `time_us` is [`Clock`]'s: the process's start (Unix time) plus the monotonic time since its
//! first event.

use std::collections::HashMap;
use std::io::Write;

use super::model::{Action, Entry, Model, OutSeg};
use crate::export::pickle::{Pickler, BATCH};
use crate::export::view::{Frame, ProcessView, Site, Symbolizer};
use crate::export::{frame_file, frame_name, write_failed};
use crate::Failure;

/// `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]`: the trace does not record it.
pub const UNKNOWN_CONF: &str = "(unknown: not recorded in the oomtrace trace)";

/// Writes `model`'s snapshot of `process` to `out`.
pub fn write(
    model: &Model,
    process: ProcessView<'_>,
    clock: Clock,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let mut w = SnapshotWriter {
        p: Pickler::new(out),
        sym: Symbolizer::new(),
        process,
        frame_lists: HashMap::new(),
        frame_dicts: HashMap::new(),
        clock,
    };
    w.snapshot(model);
    w.p.finish().map(drop).map_err(write_failed)
}

/// Entry times: the process's start time (Unix) plus the monotonic time since `anchor_ns`, its
/// first event; the monotonic time alone when the start is unknown.
#[derive(Clone, Copy)]
pub struct Clock {
    pub anchor_ns: u64,
    pub start_unix_ns: u64,
}

impl Clock {
    fn time_us(&self, ts_ns: u64) -> i64 {
        let ns = if self.start_unix_ns == 0 {
            ts_ns
        } else {
            self.start_unix_ns
                .saturating_add(ts_ns.saturating_sub(self.anchor_ns))
        };
        (ns / 1000) as i64
    }
}

struct SnapshotWriter<'a, W: Write> {
    p: Pickler<W>,
    sym: Symbolizer,
    process: ProcessView<'a>,
    /// Memo index of each site's frame list (shared by every entry of that site).
    frame_lists: HashMap<Site, u32>,
    /// Memo index of each distinct frame dict.
    frame_dicts: HashMap<(String, String, u32), u32>,
    clock: Clock,
}

impl<W: Write> SnapshotWriter<'_, W> {
    fn snapshot(&mut self, model: &Model) {
        let n_dev = model.device_count();
        self.p.empty_dict();
        self.p.mark();
        self.p.str("segments");
        self.p.empty_list();
        let mut in_batch = 0;
        model.each_segment(|seg| {
            if in_batch == 0 {
                self.p.mark();
            }
            self.segment(&seg);
            in_batch += 1;
            if in_batch == BATCH {
                self.p.appends();
                in_batch = 0;
            }
        });
        if in_batch > 0 {
            self.p.appends();
        }
        self.p.str("device_traces");
        self.p.empty_list();
        self.p.mark();
        for d in 0..n_dev {
            self.trace(model.entries(d as i16));
        }
        self.p.appends();
        self.allocator_settings(model.mapped());
        // PyTorch 2.15's other top-level keys, empty: annotations come from PyTorch's
        // profiler ranges, and pinned host memory is not device memory (left out above).
        for key in ["external_annotations", "host_segments", "host_traces"] {
            self.p.str(key);
            self.p.empty_list();
        }
        let dropped: Vec<u64> = (0..n_dev).map(|d| model.dropped(d as i16)).collect();
        if dropped.iter().any(|&n| n > 0) {
            // Not a key of PyTorch's snapshots: the viewer ignores it; a reader of the pickle
            // learns that the history is cut.
            self.p.str("oomtrace");
            self.p.empty_dict();
            self.p.mark();
            self.p.str("max_entries");
            self.p.uint(model.max_entries() as u64);
            self.p.str("dropped_entries");
            self.p.empty_list();
            self.p.mark();
            for n in dropped {
                self.p.uint(n);
            }
            self.p.appends();
            self.p.str("note");
            self.p.str(
                "device_traces holds the most recent max_entries entries of each device; \
                 older ones were left out (oomtrace export --max-entries 0 keeps all)",
            );
            self.p.setitems();
        }
        self.p.setitems();
    }

    /// `allocator_settings` as PyTorch 2.15 writes it (the viewer's Allocator Settings tab).
    /// A trace does not record the caching allocator's configuration: the values are
    /// PyTorch's defaults, except `expandable_segments`, true when the process mapped memory
    /// through the VMM API; `PYTORCH_CUDA_ALLOC_CONF` says that it is unknown.
    fn allocator_settings(&mut self, mapped: bool) {
        self.p.str("allocator_settings");
        self.p.empty_dict();
        self.p.mark();
        self.p.str("PYTORCH_CUDA_ALLOC_CONF");
        self.p.str(UNKNOWN_CONF);
        for (key, value) in [
            ("max_split_size", -1),
            ("pinned_num_register_threads", 1),
            ("max_round_threshold", -1),
            ("max_cached_size", -1),
        ] {
            self.p.str(key);
            self.p.int(value);
        }
        self.p.str("garbage_collection_threshold");
        self.p.float(0.0);
        for (key, value) in [
            ("expandable_segments", mapped),
            ("release_lock_on_cudamalloc", false),
            ("pinned_use_cuda_host_register", false),
            ("graph_capture_record_stream_reuse", false),
        ] {
            self.p.str(key);
            self.p.bool(value);
        }
        // Divisions per power-of-two size class ("1", "2", ... "32768" MiB): 0, no rounding.
        self.p.str("roundup_power2_divisions");
        self.p.empty_dict();
        self.p.mark();
        for shift in 0..16 {
            self.p.str(&(1u32 << shift).to_string());
            self.p.int(0);
        }
        self.p.setitems();
        self.p.setitems();
    }

    fn segment(&mut self, s: &OutSeg) {
        let allocated: u64 = s
            .blocks
            .iter()
            .filter(|b| b.state != "inactive")
            .map(|b| b.size)
            .sum();
        self.p.empty_dict();
        self.p.mark();
        self.p.str("device");
        self.p.int(i64::from(s.device));
        self.p.str("address");
        self.p.uint(s.addr);
        self.p.str("total_size");
        self.p.uint(s.size);
        for key in ["allocated_size", "active_size", "requested_size"] {
            self.p.str(key);
            self.p.uint(allocated);
        }
        self.p.str("stream");
        self.p.int(s.stream);
        self.p.str("segment_type");
        self.p
            .str(if s.size <= 1 << 20 { "small" } else { "large" });
        self.p.str("segment_pool_id");
        self.p.int(0);
        self.p.int(0);
        self.p.tuple2();
        self.p.str("is_expandable");
        self.p.bool(s.expandable);
        self.p.str("frames");
        self.frames(s.site);
        self.p.str("blocks");
        self.p.empty_list();
        self.p.mark();
        for b in &s.blocks {
            self.p.empty_dict();
            self.p.mark();
            self.p.str("address");
            self.p.uint(b.addr);
            self.p.str("size");
            self.p.uint(b.size);
            self.p.str("requested_size");
            self.p.uint(b.size);
            self.p.str("state");
            self.p.str(b.state);
            self.p.str("frames");
            self.frames(b.site);
            self.p.setitems();
        }
        self.p.appends();
        self.p.setitems();
    }

    fn trace<'m>(&mut self, entries: impl Iterator<Item = &'m Entry>) {
        self.p.empty_list();
        let mut in_batch = 0;
        for e in entries {
            if in_batch == 0 {
                self.p.mark();
            }
            self.entry(e);
            in_batch += 1;
            if in_batch == BATCH {
                self.p.appends();
                in_batch = 0;
            }
        }
        if in_batch > 0 {
            self.p.appends();
        }
    }

    fn entry(&mut self, e: &Entry) {
        self.p.empty_dict();
        self.p.mark();
        self.p.str("action");
        self.p.str(e.action.name());
        self.p.str("addr");
        self.p.uint(e.addr);
        self.p.str("size");
        self.p.uint(e.size);
        self.p.str("stream");
        self.p.int(e.stream);
        self.p.str("time_us");
        self.p.int(self.clock.time_us(e.ts_ns));
        if e.action == Action::Oom {
            self.p.str("device_free");
            self.p.uint(e.device_free);
        }
        self.p.str("frames");
        self.frames(e.site);
        self.p.setitems();
    }

    fn frames(&mut self, site: Site) {
        if let Some(&i) = self.frame_lists.get(&site) {
            self.p.get(i);
            return;
        }
        let mut frames = if site.is_none() {
            Vec::new()
        } else {
            self.sym.site(self.process, site)
        };
        // A backward-pass site ends (outermost) with the forward line whose op made its
        // autograd node, in PyTorch's own frame format: `train.py:25 backward of addmm`.
        if let Some(b) = self.sym.backward(self.process, &frames) {
            let (file, line) = b.line.unwrap_or_default();
            frames.push(Frame {
                function: if file.is_empty() { b.name } else { b.what },
                file,
                line,
                ..Frame::default()
            });
        }
        self.p.empty_list();
        let i = self.p.memoize();
        self.frame_lists.insert(site, i);
        if frames.is_empty() {
            return;
        }
        self.p.mark();
        for f in &frames {
            let key = (frame_file(f), frame_name(f), f.line);
            if let Some(&i) = self.frame_dicts.get(&key) {
                self.p.get(i);
                continue;
            }
            self.p.empty_dict();
            let i = self.p.memoize();
            self.p.mark();
            self.p.str("filename");
            self.p.str(&key.0);
            self.p.str("line");
            self.p.int(i64::from(key.2));
            self.p.str("name");
            self.p.str(&key.1);
            self.p.setitems();
            self.frame_dicts.insert(key, i);
        }
        self.p.appends();
    }
}
