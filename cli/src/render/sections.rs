//! The heaptrack_print-like sections of one process and device (`oomtrace report`).

use super::*;

/// A size bucket's range, e.g. `[1.0 MiB, 2.0 MiB)`.
pub(super) fn bucket_text(min: u64, max: u64) -> String {
    if min == 0 {
        "0 B".into()
    } else {
        format!("[{}, {})", fmt_bytes(min), fmt_bytes(max.saturating_add(1)))
    }
}

pub(super) fn site_row_text(out: &mut String, r: &SiteRow) {
    let _ = writeln!(
        out,
        "    peak {:>10}  end {:>10}  {:>7} {}  {:>7} temporary  {:>16}  {}{}",
        fmt_bytes(r.peak_bytes),
        fmt_bytes(r.live_at_exit_bytes),
        r.allocations,
        if r.allocations == 1 {
            "alloc "
        } else {
            "allocs"
        },
        r.temporary,
        fmt_rate(r.growth_per_step, None),
        r.name,
        outside(r.held)
    );
}

/// The mark of a listed call site whose memory is outside PyTorch's allocator.
pub(super) fn outside(held: Option<Held>) -> &'static str {
    if held == Some(Held::OutsideTorch) {
        "  (outside PyTorch's allocator)"
    } else {
        ""
    }
}

/// The heaptrack_print-like sections of one process and device (`oomtrace report`); where
/// PyTorch's tensors are traced, of its tensors (and the memory outside its allocator).
pub(super) fn sections_text(out: &mut String, s: &DeviceSections) {
    let t = &s.totals;
    let tensors = s.lists_of == ListsOf::Tensors;
    let (noun, of) = if tensors {
        ("tensor", " (tensors; --segments lists PyTorch's segments)")
    } else {
        ("allocation", "")
    };
    // A count in a column: the noun keeps its width ("1 allocation ", "2 allocations").
    let column = |n: u64| {
        if n == 1 {
            format!("{noun} ")
        } else {
            format!("{noun}s")
        }
    };
    let _ = writeln!(
        out,
        "\nSections: pid {}, {}{of}",
        s.pid,
        device_name(s.device)
    );
    let _ = writeln!(
        out,
        "  totals: {}, {} ({} temporary), {} allocated in total, peak {} at \
         {}, {} in {} live at exit, {}",
        fmt_count(t.allocations, noun),
        fmt_count(t.frees, "free"),
        t.temporary,
        fmt_bytes(t.bytes_allocated),
        fmt_bytes(t.peak_bytes),
        fmt_duration(t.peak_time_s),
        fmt_bytes(t.live_at_exit_bytes),
        t.live_at_exit_count,
        fmt_count(t.steps, "step")
    );
    if let Some(o) = s.outside_torch.as_ref().filter(|o| o.allocations > 0) {
        let _ = writeln!(
            out,
            "  outside PyTorch's allocator: {}, {} allocated in total, {} in {} live \
             at exit",
            fmt_count(o.allocations, "allocation"),
            fmt_bytes(o.bytes_allocated),
            fmt_bytes(o.live_at_exit_bytes),
            o.live_at_exit_count
        );
    }
    if !s.peak_consumers.is_empty() {
        let _ = writeln!(
            out,
            "  peak consumers (held at the {}peak):",
            if tensors { "tensors' " } else { "" }
        );
        for c in &s.peak_consumers {
            let _ = writeln!(
                out,
                "    {:>10} in {:>5}  {}{}",
                fmt_bytes(c.bytes),
                c.count,
                c.name,
                outside(c.held)
            );
        }
    }
    if !s.most_allocations.is_empty() {
        let _ = writeln!(out, "  most allocations:");
        for r in &s.most_allocations {
            let _ = writeln!(
                out,
                "    {:>7} {:<12} {:>10} in total  {}{}",
                r.allocations,
                if r.allocations == 1 {
                    "allocation,"
                } else {
                    "allocations,"
                },
                fmt_bytes(r.bytes_allocated),
                r.name,
                outside(r.held)
            );
        }
    }
    if !s.most_temporary.is_empty() {
        let _ = writeln!(out, "  most temporary allocations (freed in their step):");
        for r in &s.most_temporary {
            let _ = writeln!(
                out,
                "    {:>7} of {:>7} allocation{}  {}{}",
                r.temporary,
                r.allocations,
                if r.allocations == 1 { " " } else { "s" },
                r.name,
                outside(r.held)
            );
        }
    }
    if !s.size_histogram.is_empty() {
        let _ = writeln!(
            out,
            "  {} sizes:",
            if tensors { "tensor" } else { "allocation" }
        );
        for b in &s.size_histogram {
            let _ = writeln!(
                out,
                "    {:>22}  {:>7} {}  {:>10}",
                bucket_text(b.min_bytes, b.max_bytes),
                b.count,
                column(b.count),
                fmt_bytes(b.bytes)
            );
        }
    }
    if !s.sites.is_empty() {
        let _ = writeln!(out, "  call sites (by {}):", s.sort);
        for r in &s.sites {
            site_row_text(out, r);
        }
    }
}
