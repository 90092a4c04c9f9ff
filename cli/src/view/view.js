// oomtrace view: draws the data in <script id="data"> (see cli/src/view/model.rs) as
// hand-written SVG and HTML. No libraries, no network.
(function () {
  "use strict";

  var COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
    "#b07aa1", "#ff9da7", "#9c755f", "#8cd17d"];
  var OTHER = "#bab0ac";

  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }

  function bytes(b) {
    if (b == null) return "?";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    var i = 0;
    var v = Number(b);
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
  }

  function secs(t) {
    if (t == null) return "?";
    t = Number(t);
    if (t !== 0 && t < 1) return (t * 1000).toFixed(t < 0.01 ? 3 : 1) + " ms";
    return t.toFixed(t < 10 ? 3 : 1) + " s";
  }

  function el(tag, cls, html) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (html != null) e.innerHTML = html;
    return e;
  }

  // A report frame (object) or a view frame ([name, where, python]) as [name, where, python].
  function frameOf(f) {
    if (Array.isArray(f)) return f;
    var at = f.file || f.module || "";
    if (f.line) at += ":" + f.line;
    return [f.function || f.address || "??", at, !!f.python];
  }

  function stackHtml(frames) {
    return "<ol class=\"stack\">" + (frames || []).map(function (f) {
      f = frameOf(f);
      return "<li" + (f[2] ? " class=\"py\"" : "") + ">" + esc(f[0]) +
        (f[1] ? "<span class=\"at\">" + esc(f[1]) + "</span>" : "") + "</li>";
    }).join("") + "</ol>";
  }

  // A finding's name: the page's label of its culprit (`file:line function`, see
  // cli/src/view/label.rs), else its first named frame.
  function culpritName(f) {
    if (f.culprit_label) return f.culprit_label;
    if (f.culprit && f.culprit.function) return f.culprit.function;
    var s = (f.stack || []).map(frameOf).filter(function (x) { return x[0] && x[0] !== "??"; });
    return s.length ? s[0][0] : "";
  }

  // The moments a finding marks on the time axis: [seconds, label, css color, dashed].
  // (A detector's seconds count from its first step, `t0` on the page's axis.)
  function findingMarks(f, t0) {
    var out = [];
    var what = culpritName(f);
    if (f.oom && f.oom.time_s != null) {
      out.push([f.oom.time_s, "OOM: " + bytes(f.oom.requested_bytes) + " requested", "#c00", false]);
    }
    var ev = f.evidence || {};
    var c = f.kind === "leak" ? "#d36b00" : (f.kind === "fragmentation" ? "#7b1fa2" : "#8a6d00");
    if (ev.onset_s != null) out.push([t0 + ev.onset_s, f.kind + " onset" + (what ? ": " + what : ""), c, true]);
    if (ev.detected_s != null) out.push([t0 + ev.detected_s, f.kind + " detected" + (what ? ": " + what : ""), c, false]);
    return out;
  }

  function findingsFor(D, pid, device) {
    return (D.findings || []).filter(function (f) {
      return f.pid === pid && f.device === device;
    });
  }

  function renderFindings(D, root) {
    var list = (D.findings || []).filter(function (f) { return f.kind !== "live_at_exit"; });
    var live = (D.findings || []).length - list.length;
    var sec = el("section", "findings");
    sec.appendChild(el("h2", null, "Findings"));
    if (!list.length) sec.appendChild(el("p", "muted", "No leak, growth or OOM found."));
    var ul = el("ul");
    list.forEach(function (f) {
      var cls = f.kind === "oom" ? "oom" : (f.kind === "leak" ? "leak" : "other");
      var li = el("li", null,
        "<span class=\"kind " + cls + "\">" + esc(f.kind) + "</span> " +
        "<b class=\"culprit\">" + esc(culpritName(f)) + "</b> " +
        "<span class=\"muted\">pid " + esc(f.pid) + ", device " + esc(f.device) + ", " +
        esc(typeof f.level === "string" ? f.level : JSON.stringify(f.level)) + "</span><br>" +
        esc(f.message) +
        (f.stack && f.stack.length ? "<details><summary>stack</summary>" + stackHtml(f.stack) + "</details>" : ""));
      ul.appendChild(li);
    });
    sec.appendChild(ul);
    if (live) sec.appendChild(el("p", "muted", live + " call site(s) still held memory at exit (see the tables)."));
    root.appendChild(sec);
  }

  // Labels on a line of text, thinned so that none overlaps the one before it: `items` are
  // [x, text] in ascending x, centred; returns those kept. Widths are estimated (11px font).
  function thinLabels(items, charPx, gapPx) {
    var kept = [], right = -Infinity;
    items.forEach(function (it) {
      var w = String(it[1]).length * charPx;
      if (it[0] - w / 2 >= right + gapPx) {
        kept.push(it);
        right = it[0] + w / 2;
      }
    });
    return kept;
  }

  // Stacked areas over a step plot: `vals[j]` of each layer on top of `below[j]`; returns the
  // new top. `x`, `y` map time and bytes; the last value holds until `tend`.
  function stackPath(pts, below, vals, x, y, tend) {
    var top = vals.map(function (v, j) { return below[j] + v; });
    var d = "M" + x(pts[0][0]).toFixed(1) + "," + y(below[0]).toFixed(1);
    pts.forEach(function (p, j) {
      if (j > 0) d += "L" + x(p[0]).toFixed(1) + "," + y(top[j - 1]).toFixed(1);
      d += "L" + x(p[0]).toFixed(1) + "," + y(top[j]).toFixed(1);
    });
    var last = pts.length - 1;
    d += "L" + x(tend).toFixed(1) + "," + y(top[last]).toFixed(1) + "L" + x(tend).toFixed(1) + "," + y(below[last]).toFixed(1);
    for (var j = last; j >= 0; j--) {
      d += "L" + x(pts[j][0]).toFixed(1) + "," + y(below[j]).toFixed(1);
      if (j > 0) d += "L" + x(pts[j][0]).toFixed(1) + "," + y(below[j - 1]).toFixed(1);
    }
    return { d: d + "Z", top: top };
  }

  // A step line through `vals` (one per point).
  function stepLine(pts, vals, x, y, tend) {
    return "M" + pts.map(function (p, j) {
      var at = x(p[0]).toFixed(1);
      return (j > 0 ? at + "," + y(vals[j - 1]).toFixed(1) + "L" : "") + at + "," + y(vals[j]).toFixed(1);
    }).join("L") + "L" + x(tend).toFixed(1) + "," + y(vals[vals.length - 1]).toFixed(1);
  }

  function sum(a) { return a.reduce(function (s, v) { return s + v; }, 0); }

  var GAP = "#b00020";

  // The largest reserve minus tensors of [tensors, reserve] pairs.
  function gapPeak(pairs) {
    return pairs.reduce(function (m, p) { return Math.max(m, p[1] - p[0]); }, 0);
  }

  // ", gap X (reserved = R x allocated)" for the readout; "" without a reserve.
  function gapText(allocated, reserved) {
    if (!reserved) return "";
    return ", gap <b>" + esc(bytes(Math.max(0, reserved - allocated))) + "</b>" +
      (allocated > 0 ? " (reserved " + (reserved / allocated).toFixed(2) + "x allocated)" : "");
  }

  // Memory over time. Without tensors: device memory stacked by call site under its total.
  // With PyTorch's tensors (`dev.tensors`; points are [t, device total, [layer bytes], tensors,
  // reserve]): the tensors stacked by call site from zero, PyTorch's reserve (its segments) as
  // a line above them (the gap is what its cache holds), and device memory outside its
  // allocator stacked by call site above the reserve line, up to the device's total. The gap
  // between the tensors and the reserve (what PyTorch's cache holds and no tensor uses) is
  // shaded. Without tensors, PyTorch's own readings at each step (`dev.torch_memory`: [t,
  // allocated, max allocated, reserved], from the step hook) are drawn as two lines,
  // allocated and reserved, with the gap between them shaded the same way.
  function renderChart(D, proc, dev, root) {
    var W = 1160, H = 300, L = 70, R = 40, T = 10, B = 28;
    var tensors = !!dev.tensors;
    var layers = dev.layers || [];
    // The axis starts at the first allocation: before it, nothing was held.
    var t0 = Math.max(0, proc.axis_start_s || 0);
    var zero = layers.map(function () { return 0; });
    // A point's value holds until the next one (a step plot); the series starts at 0.
    var pts = [[t0, 0, zero, 0, 0]].concat((dev.points || []).map(function (p) {
      return [Math.max(p[0], t0), p[1], p[2], p[3] || 0, p[4] || 0];
    }));
    var tmax = Math.max(proc.duration_s || 0, pts[pts.length - 1][0], t0 + 1e-9);
    var marks = [];
    findingsFor(D, proc.pid, dev.device).forEach(function (f) {
      marks = marks.concat(findingMarks(f, proc.analysis_t0_s || 0));
    });
    marks.forEach(function (m) { tmax = Math.max(tmax, m[0]); });
    // PyTorch's own readings (segment mode draws them; with tensors the chart has the same).
    var readings = tensors ? [] : (dev.torch_memory || []).filter(function (r) { return r[0] >= t0; });
    readings.forEach(function (r) { tmax = Math.max(tmax, r[0]); });
    var ymax = Math.max(dev.peak || 0, 1);
    pts.forEach(function (p) { ymax = Math.max(ymax, p[1], p[3] + Math.max(0, p[1] - p[4]), p[4]); });
    readings.forEach(function (r) { ymax = Math.max(ymax, r[1], r[3]); });
    var x = function (t) { return L + (W - L - R) * (Math.max(t, t0) - t0) / (tmax - t0); };
    var y = function (b) { return T + (H - T - B) * (1 - b / ymax); };
    var svg = [];
    svg.push("<svg width=\"" + W + "\" height=\"" + H + "\" viewBox=\"0 0 " + W + " " + H + "\" role=\"img\" data-axis-start=\"" + t0 + "\">");
    for (var g = 0; g <= 4; g++) {
      var gy = y(ymax * g / 4);
      svg.push("<line x1=\"" + L + "\" x2=\"" + (W - R) + "\" y1=\"" + gy + "\" y2=\"" + gy + "\" stroke=\"#e6e6e6\"/>");
      svg.push("<text x=\"" + (L - 6) + "\" y=\"" + (gy + 4) + "\" font-size=\"11\" text-anchor=\"end\">" + esc(bytes(ymax * g / 4)) + "</text>");
    }
    for (var k = 0; k <= 5; k++) {
      var tk = t0 + (tmax - t0) * k / 5;
      svg.push("<text class=\"tick\" x=\"" + x(tk) + "\" y=\"" + (H - 8) + "\" font-size=\"11\" text-anchor=\"middle\">" + esc(secs(tk)) + "</text>");
    }
    var colorOf = function (i) { return COLORS[i % COLORS.length]; };
    var area = function (d, fill, name, cls) {
      svg.push("<path class=\"" + cls + "\" d=\"" + d + "\" fill=\"" + fill + "\" fill-opacity=\"0.85\"><title>" + esc(name) + "</title></path>");
    };
    var layerVals = function (i) { return pts.map(function (p) { return p[2][i] || 0; }); };
    var idx = function (memory) {
      return layers.map(function (l, i) { return l.memory === memory ? i : -1; }).filter(function (i) { return i >= 0; });
    };
    if (tensors) {
      var inT = idx("tensor"), outT = idx("outside");
      var below = pts.map(function () { return 0; });
      inT.forEach(function (i) {
        var a = stackPath(pts, below, layerVals(i), x, y, tmax);
        area(a.d, colorOf(i), layers[i].label, "layer tensor");
        below = a.top;
      });
      var rest = stackPath(pts, below, pts.map(function (p) {
        return Math.max(0, p[3] - sum(inT.map(function (i) { return p[2][i] || 0; })));
      }), x, y, tmax);
      area(rest.d, OTHER, "other tensors", "layer tensor");
      // Memory outside PyTorch's allocator, above its reserve.
      below = pts.map(function (p) { return p[4]; });
      outT.forEach(function (i) {
        var a = stackPath(pts, below, layerVals(i), x, y, tmax);
        area(a.d, colorOf(i), layers[i].label + " (outside PyTorch's allocator)", "layer outside");
        below = a.top;
      });
      var restOut = stackPath(pts, below, pts.map(function (p) {
        return Math.max(0, (p[1] - p[4]) - sum(outT.map(function (i) { return p[2][i] || 0; })));
      }), x, y, tmax);
      svg.push("<path class=\"layer outside\" d=\"" + restOut.d + "\" fill=\"" + OTHER + "\" fill-opacity=\"0.45\"><title>other memory outside PyTorch's allocator</title></path>");
      // The gap: from the tensors up to the reserve, where the reserve is above them.
      var gap = stackPath(pts, pts.map(function (p) { return Math.min(p[3], p[4]); }),
        pts.map(function (p) { return Math.max(0, p[4] - p[3]); }), x, y, tmax);
      svg.push("<path class=\"gap\" d=\"" + gap.d + "\" fill=\"" + GAP + "\" fill-opacity=\"0.18\"><title>PyTorch's cache: reserved, no tensor in it (peak gap " +
        esc(bytes(gapPeak(pts.map(function (p) { return [p[3], p[4]]; })))) + ")</title></path>");
      svg.push("<path class=\"reserve\" d=\"" + stepLine(pts, pts.map(function (p) { return p[4]; }), x, y, tmax) +
        "\" fill=\"none\" stroke=\"#b00020\" stroke-width=\"2\"><title>PyTorch's reserve (its segments): the gap above the tensors is its cache</title></path>");
    } else {
      var under = pts.map(function () { return 0; });
      layers.forEach(function (l, i) {
        var a = stackPath(pts, under, layerVals(i), x, y, tmax);
        area(a.d, colorOf(i), l.label, "layer device");
        under = a.top;
      });
      var others = stackPath(pts, under, pts.map(function (p) { return Math.max(0, p[1] - sum(p[2])); }), x, y, tmax);
      area(others.d, OTHER, "other sites", "layer device");
      if (readings.length) {
        // PyTorch's readings hold from one step to the next: allocated, reserved, the gap.
        var rt = readings.map(function (r) { return [r[0]]; });
        var alloc = readings.map(function (r) { return r[1]; });
        var resv = readings.map(function (r) { return r[3]; });
        var rgap = stackPath(rt, readings.map(function (r) { return Math.min(r[1], r[3]); }),
          readings.map(function (r) { return Math.max(0, r[3] - r[1]); }), x, y, tmax);
        svg.push("<path class=\"gap\" d=\"" + rgap.d + "\" fill=\"" + GAP + "\" fill-opacity=\"0.18\"><title>PyTorch's cache: reserved, no tensor in it (peak gap " +
          esc(bytes(gapPeak(readings.map(function (r) { return [r[1], r[3]]; })))) + ")</title></path>");
        svg.push("<path class=\"torch-reserved\" d=\"" + stepLine(rt, resv, x, y, tmax) +
          "\" fill=\"none\" stroke=\"#b00020\" stroke-width=\"2\"><title>torch.cuda.memory_reserved() at each step</title></path>");
        svg.push("<path class=\"torch-allocated\" d=\"" + stepLine(rt, alloc, x, y, tmax) +
          "\" fill=\"none\" stroke=\"#1a5fb4\" stroke-width=\"2\"><title>torch.cuda.memory_allocated() at each step</title></path>");
      }
    }
    svg.push("<path class=\"total\" d=\"" + stepLine(pts, pts.map(function (p) { return p[1]; }), x, y, tmax) +
      "\" fill=\"none\" stroke=\"#222\" stroke-width=\"1\"" + (tensors ? " stroke-dasharray=\"3,3\"" : "") + "/>");
    var steps = (proc.markers || []).filter(function (m) { return m.t >= t0; });
    steps.forEach(function (m) {
      svg.push("<line class=\"step\" x1=\"" + x(m.t) + "\" x2=\"" + x(m.t) + "\" y1=\"" + T + "\" y2=\"" + (H - B) +
        "\" stroke=\"#999\" stroke-opacity=\"0.35\"><title>step " + esc(m.step) + (m.label ? " (" + esc(m.label) + ")" : "") + " at " + esc(secs(m.t)) + "</title></line>");
    });
    // Step numbers along the bottom of the plot, thinned so that none overlaps another.
    thinLabels(steps.map(function (m) { return [x(m.t), m.step]; }), 6.5, 6).forEach(function (it) {
      svg.push("<text class=\"step-label\" x=\"" + it[0].toFixed(1) + "\" y=\"" + (H - B - 4) + "\" font-size=\"10\" fill=\"#666\" text-anchor=\"middle\">" + esc(it[1]) + "</text>");
    });
    // Finding labels on rows, each on the first row where it overlaps nothing (else only the
    // line and its tooltip).
    var rows = [];
    marks.sort(function (a, b) { return a[0] - b[0]; }).forEach(function (m) {
      var mx = x(m[0]);
      svg.push("<line class=\"finding\" x1=\"" + mx + "\" x2=\"" + mx + "\" y1=\"" + T + "\" y2=\"" + (H - B) + "\" stroke=\"" + m[2] +
        "\" stroke-width=\"2\"" + (m[3] ? " stroke-dasharray=\"5,4\"" : "") + "><title>" + esc(m[1]) + " at " + esc(secs(m[0])) + "</title></line>");
      // Labels near the right edge go to the left of their line.
      var right = mx > W * 0.75;
      var w = String(m[1]).length * 6.2;
      var span = right ? [mx - 4 - w, mx - 4] : [mx + 4, mx + 4 + w];
      for (var r = 0; r < 6; r++) {
        rows[r] = rows[r] || [];
        var free = rows[r].every(function (o) { return span[1] + 4 < o[0] || span[0] > o[1] + 4; });
        if (free) {
          rows[r].push(span);
          svg.push("<text class=\"finding-label\" x=\"" + (right ? mx - 4 : mx + 4) + "\" y=\"" + (T + 12 + 13 * r) + "\" font-size=\"11\" text-anchor=\"" +
            (right ? "end" : "start") + "\" fill=\"" + m[2] + "\">" + esc(m[1]) + "</text>");
          break;
        }
      }
    });
    svg.push("</svg>");
    var box = el("div", "chart");
    box.innerHTML = svg.join("");
    var readout = el("div", "readout");
    box.appendChild(readout);
    var svgEl = box.querySelector("svg");
    svgEl.addEventListener("mousemove", function (e) {
      var r = svgEl.getBoundingClientRect();
      var t = t0 + (e.clientX - r.left - L) / (W - L - R) * (tmax - t0);
      var best = pts[0];
      pts.forEach(function (p) { if (Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p; });
      var parts = layers.map(function (l, i) { return [l.label, best[2][i] || 0]; })
        .filter(function (x) { return x[1] > 0; })
        .sort(function (a, b) { return b[1] - a[1]; }).slice(0, 4)
        .map(function (x) { return esc(x[0]) + " " + esc(bytes(x[1])); });
      var levels = tensors ?
        "tensors <b>" + esc(bytes(best[3])) + "</b>, PyTorch's reserve <b>" + esc(bytes(best[4])) + "</b>" +
          gapText(best[3], best[4]) + ", device <b>" + esc(bytes(best[1])) + "</b>" :
        "<b>" + esc(bytes(best[1])) + "</b> live";
      // The last reading of PyTorch's own statistics at or before t.
      var at = null;
      readings.forEach(function (r) { if (r[0] <= t) at = r; });
      if (at) {
        levels += "; PyTorch at the step before: allocated <b>" + esc(bytes(at[1])) + "</b>, reserved <b>" +
          esc(bytes(at[3])) + "</b>" + gapText(at[1], at[3]) + ", max allocated " + esc(bytes(at[2]));
      }
      readout.innerHTML = esc(secs(best[0])) + ": " + levels + (parts.length ? " — " + parts.join(", ") : "");
    });
    svgEl.addEventListener("mouseleave", function () { readout.textContent = ""; });
    var legend = el("div", "legend");
    legend.innerHTML = layers.map(function (l, i) {
      return "<span><i style=\"background:" + colorOf(i) + "\"></i><span class=\"site-label\">" + esc(l.label) + "</span>" +
        (l.memory === "outside" ? " <span class=\"muted\">(outside PyTorch's allocator)</span>" : "") + "</span>";
    }).join("") + (tensors ?
      "<span><i style=\"background:" + OTHER + "\"></i>other tensors</span>" +
      "<span><i class=\"line\" style=\"background:#b00020\"></i>PyTorch's reserve</span>" +
      "<span><i class=\"gap\"></i>the gap: reserved, no tensor in it (its cache)</span>" +
      "<span><i class=\"line dashed\"></i>device total</span>" :
      "<span><i style=\"background:" + OTHER + "\"></i>other sites</span>" + (readings.length ?
        "<span><i class=\"line\" style=\"background:#1a5fb4\"></i>torch.cuda.memory_allocated()</span>" +
        "<span><i class=\"line\" style=\"background:#b00020\"></i>torch.cuda.memory_reserved()</span>" +
        "<span><i class=\"gap\"></i>the gap: reserved, no tensor in it (its cache), read at each step</span>" : "")) +
      "<span><i style=\"background:#999\"></i>steps (" + esc(proc.marker_count || 0) + ")</span>";
    root.appendChild(box);
    root.appendChild(legend);
  }

  function renderOom(D, proc, dev, root) {
    findingsFor(D, proc.pid, dev.device).filter(function (f) { return f.oom; }).slice(0, 3).forEach(function (f) {
      var o = f.oom;
      var p = el("div", "oompanel");
      var rows = (o.top_sites || []).map(function (s) {
        var st = (s.stack || []).map(frameOf);
        var name = s.label || culpritName({ stack: s.stack });
        return "<tr><td>" + esc(bytes(s.bytes)) + "</td><td>" + esc(s.count) + "</td><td><details><summary class=\"site-label\">" +
          esc(name) + "</summary>" + stackHtml(st) + "</details></td></tr>";
      }).join("");
      p.innerHTML = "<h3>Out of memory at " + esc(secs(o.time_s)) + " in <span class=\"culprit\">" + esc(culpritName(f)) + "</span></h3>" +
        "<div>Requested <b>" + esc(bytes(o.requested_bytes)) + "</b>; free on the device (driver): <b>" + esc(bytes(o.free_bytes)) +
        "</b> of " + esc(bytes(o.total_bytes)) + "; traced live: <b>" + esc(bytes(o.live_bytes)) + "</b></div>" +
        (rows ? "<table><tr><th>held</th><th>allocations</th><th>by</th></tr>" + rows + "</table>" : "") +
        (f.hint ? "<p class=\"muted\">" + esc(f.hint) + "</p>" : "");
      root.appendChild(p);
    });
  }

  // The bytes held at one moment as an icicle. Python frames by default (the stack as the
  // text report merges it, each interpreter-loop frame replaced by the Python frames it ran,
  // native frames left out); every frame with "native frames" ticked.
  function renderFlame(dev, root) {
    var trees = { python: dev.python_flames || {}, native: dev.flames || {} };
    // [key, label] in the order offered: peak, the OOM, `view --at`'s moment, the end, then
    // evenly spaced steps (a page of an older build has only the first three).
    var moments = dev.moments || [["peak", "at peak"], ["oom", "at the OOM"], ["end", "at the end"]];
    var wrap = el("div");
    var pick = el("select");
    var steps = [];
    moments.forEach(function (m) {
      if (!trees.native[m[0]]) return;
      // The moment the page opens on is selected as an attribute too: it shows in the DOM.
      var opens = m[0] === dev.opens_at;
      pick.appendChild(new Option(m[1] + " (" + bytes(trees.native[m[0]].v) + ")", m[0], opens, opens));
      if (m[0].indexOf("step:") === 0) steps.push(m[0]);
    });
    if (dev.opens_at && trees.native[dev.opens_at]) pick.value = dev.opens_at;
    var label = el("label", null, "Bytes held ");
    label.appendChild(pick);
    wrap.appendChild(label);
    // A slider over the steps kept: scrub the icicle through the run.
    var slider = null;
    if (steps.length > 1) {
      slider = el("input");
      slider.type = "range";
      slider.className = "step-slider";
      slider.min = 0;
      slider.max = steps.length - 1;
      slider.value = Math.max(0, steps.indexOf(pick.value));
      slider.title = "scrub through the steps";
      var scrub = el("label", "muted", " steps ");
      scrub.appendChild(slider);
      wrap.appendChild(scrub);
      slider.addEventListener("input", function () {
        pick.value = steps[+slider.value];
        draw();
      });
    }
    var native = el("input");
    native.type = "checkbox";
    native.className = "native-frames";
    // Without Python frames there is nothing else to show.
    native.checked = !dev.has_python;
    native.disabled = !dev.has_python;
    var toggle = el("label", "muted", " ");
    toggle.appendChild(native);
    toggle.appendChild(document.createTextNode(" native frames"));
    wrap.appendChild(toggle);
    var box = el("div", "flame");
    wrap.appendChild(box);
    function draw() {
      var tree = (native.checked ? trees.native : trees.python)[pick.value];
      box.innerHTML = "";
      box.setAttribute("data-frames", native.checked ? "native" : "python");
      if (!tree || !tree.v) { box.style.height = "20px"; box.textContent = "nothing held"; return; }
      // Nodes are [depth, name, bytes], depth first: a node's children start at its left edge.
      var depth = 0, html = [], left = [0];
      (tree.nodes || []).forEach(function (node) {
        var d = node[0], name = String(node[1]), v = node[2];
        var off = left[d] || 0;
        left[d] = off + v;
        left[d + 1] = off;
        var w = v / tree.v * 100;
        if (w < 0.05) return;
        depth = Math.max(depth, d);
        var hue = (name.length * 37 + d * 11) % 60;
        html.push("<div style=\"left:" + (off / tree.v * 100) + "%;width:" + w + "%;top:" + d * 17 + "px;background:hsl(" + (20 + hue) +
          ",85%," + (62 + (d % 3) * 5) + "%)\" title=\"" + esc(name + " — " + bytes(v) + " (" + (v / tree.v * 100).toFixed(1) + "%)") + "\">" + esc(name) + "</div>");
      });
      box.style.height = (depth + 1) * 17 + 2 + "px";
      box.innerHTML = html.join("");
    }
    pick.addEventListener("change", function () {
      if (slider && steps.indexOf(pick.value) >= 0) slider.value = steps.indexOf(pick.value);
      draw();
    });
    native.addEventListener("change", draw);
    draw();
    root.appendChild(wrap);
  }

  function renderTable(dev, root) {
    var cols = [["label", "call site"], ["peak", "held at peak"], ["end", "held at end"],
      ["allocations", "allocations"], ["temporaries", "temporaries"], ["growth_per_step", "growth / step"]];
    if (dev.tensors) {
      // Tensors, and device memory outside PyTorch's allocator (its segments are the reserve).
      cols.splice(1, 0, ["memory", "memory"]);
      root.appendChild(el("p", "muted", "Tensors peaked at " + esc(bytes(dev.tensor_peak)) + " (" + esc(bytes(dev.tensor_end)) +
        " at the end); PyTorch's reserve (its segments, not listed) at " + esc(bytes(dev.reserve_peak)) + " (" +
        esc(bytes(dev.reserve_end)) + " at the end)."));
    }
    var rows = (dev.sites || []).slice();
    var table = el("table", "sites");
    var head = el("tr");
    cols.forEach(function (c) { head.appendChild(el("th", null, esc(c[1]))); });
    table.appendChild(head);
    var body = el("tbody");
    table.appendChild(body);
    var state = { key: "peak", asc: false };
    function cell(r, k) {
      var v = r[k];
      if (k === "peak" || k === "end") return esc(bytes(v));
      if (k === "growth_per_step") return v == null ? "" : esc((v >= 0 ? "+" : "-") + bytes(Math.abs(v)));
      if (k === "memory") return v === "outside" ? "outside PyTorch's allocator" : esc(v);
      return esc(v);
    }
    function draw() {
      rows.sort(function (a, b) {
        var x = a[state.key], y = b[state.key];
        if (x == null) x = -Infinity;
        if (y == null) y = -Infinity;
        var c = typeof x === "string" ? x.localeCompare(y) : x - y;
        return state.asc ? c : -c;
      });
      body.innerHTML = rows.map(function (r) {
        return "<tr>" + cols.map(function (c) {
          if (c[0] === "label") {
            return "<td><details><summary><span class=\"site-label\">" + esc(r.label) + "</span></summary>" + stackHtml(r.stack) + "</details></td>";
          }
          return "<td>" + cell(r, c[0]) + "</td>";
        }).join("") + "</tr>";
      }).join("");
      Array.prototype.forEach.call(head.children, function (th, i) {
        th.className = cols[i][0] === state.key ? "sorted" + (state.asc ? " asc" : "") : "";
      });
    }
    Array.prototype.forEach.call(head.children, function (th, i) {
      th.addEventListener("click", function () {
        var k = cols[i][0];
        state = { key: k, asc: state.key === k ? !state.asc : k === "label" };
        draw();
      });
    });
    draw();
    root.appendChild(table);
    if (dev.site_count > rows.length) {
      root.appendChild(el("p", "muted", "The " + rows.length + " largest of " + dev.site_count + " call sites."));
    }
  }

  // What the memory is (docs/anatomy.md): the device's bytes at its peak split into the
  // tensors' roles, PyTorch's cache not in tensors and memory outside its allocator (a bar
  // whose parts add up to the device's bytes), and the live tensors by role after each step
  // (stacked areas). The chart by call site follows.
  var ROLES = [["parameter", "parameters", "#4e79a7"], ["gradient", "gradients", "#f28e2b"],
    ["optimizer_state", "optimizer state", "#e15759"], ["activation", "activations", "#76b7b2"],
    ["temporary", "temporaries", "#59a14f"], ["input", "inputs", "#edc948"],
    ["workspace", "library workspaces", "#b07aa1"], ["other", "other tensors", "#ff9da7"]];

  function renderAnatomy(dev, root, chartId) {
    var a = dev.anatomy;
    var m = a.at_peak;
    var parts = ROLES.map(function (r) { return [r[1], m.roles[r[0]] || 0, r[2], r[0]]; });
    parts.push(["PyTorch's cache, not in tensors", m.reserve_gap_bytes, OTHER, "gap"]);
    parts.push(["outside PyTorch's allocator", m.outside_pytorch_bytes, "#9c755f", "outside"]);
    parts = parts.filter(function (p) { return p[1] > 0; });
    var wrap = el("div", "anatomy");
    wrap.appendChild(el("p", null, "At the peak: " + esc(bytes(m.device_bytes)) + " at step " + esc(m.step) +
      ", " + esc(secs(m.at_s)) + " into the run. <a href=\"#" + chartId + "\">By call site ↓</a>"));
    var bar = el("div", "anatomy-bar");
    bar.innerHTML = parts.map(function (p) {
      return "<div data-part=\"" + p[3] + "\" style=\"width:" + (p[1] / Math.max(1, m.device_bytes) * 100) + "%;background:" + p[2] +
        "\" title=\"" + esc(p[0] + " — " + bytes(p[1])) + "\"></div>";
    }).join("");
    wrap.appendChild(bar);
    var lines = (m.activations || []).slice(0, 3).map(function (l) {
      var file = String(l.file || "").split("/").pop();
      return (l.line ? file + ":" + l.line : l.function) + " " + bytes(l.bytes);
    });
    var legend = el("div", "legend anatomy-legend");
    legend.innerHTML = parts.map(function (p) {
      var more = p[3] === "activation" && lines.length ? " (made at " + lines.join(", ") + ")" : "";
      return "<span><i style=\"background:" + p[2] + "\"></i>" + esc(p[0] + " " + bytes(p[1]) + more) + "</span>";
    }).join("");
    wrap.appendChild(legend);
    var steps = a.per_step || [];
    if (steps.length > 1) {
      var W = 900, H = 160, max = 1;
      steps.forEach(function (s) {
        var t = 0;
        ROLES.forEach(function (r) { t += s.roles[r[0]] || 0; });
        max = Math.max(max, t);
      });
      var x = function (i) { return i / (steps.length - 1) * W; };
      var y = function (v) { return H - v / max * (H - 10); };
      var below = steps.map(function () { return 0; });
      var areas = ROLES.map(function (r) {
        var top = steps.map(function (s, i) { return below[i] + (s.roles[r[0]] || 0); });
        if (top.every(function (v, i) { return v === below[i]; })) return "";
        var pts = top.map(function (v, i) { return x(i) + "," + y(v); });
        for (var i = steps.length - 1; i >= 0; i--) pts.push(x(i) + "," + y(below[i]));
        below = top;
        return "<polygon data-role=\"" + r[0] + "\" fill=\"" + r[2] + "\" points=\"" + pts.join(" ") + "\"><title>" + esc(r[1]) + "</title></polygon>";
      }).join("");
      var chart = el("div", "chart anatomy-steps");
      chart.innerHTML = "<svg viewBox=\"0 0 " + W + " " + H + "\" width=\"100%\" height=\"" + H + "\" preserveAspectRatio=\"none\">" + areas + "</svg>";
      wrap.appendChild(el("p", "muted", "Live tensors by role after each step (steps " + esc(steps[0].step) + " to " +
        esc(steps[steps.length - 1].step) + ", up to " + esc(bytes(max)) + ")"));
      wrap.appendChild(chart);
    }
    root.appendChild(wrap);
  }

  function main(D) {
    var app = document.getElementById("app");
    app.innerHTML = "";
    document.getElementById("meta").innerHTML = esc(D.path) + " — " + esc(D.producer) +
      (D.simulated ? "<div class=\"simulated\">ran on a simulated " + esc(D.simulated.device_memory) +
        " GPU: no kernel ran, so times say nothing of a real GPU; sizes, lifetimes and steps are real</div>" : "") +
      (D.warnings || []).map(function (w) { return "<div class=\"warn\">warning: " + esc(w) + "</div>"; }).join("");
    renderFindings(D, app);
    (D.processes || []).forEach(function (proc) {
      // GPUs first, pinned host memory (device -1) last.
      (proc.devices || []).slice().sort(function (a, b) {
        return (a.device < 0) - (b.device < 0) || a.device - b.device;
      }).forEach(function (dev) {
        if (!(dev.points || []).length && !(dev.sites || []).length) return;
        var sec = el("section", "device");
        sec.appendChild(el("h2", null, esc(proc.name) + " (pid " + esc(proc.pid) +
          (proc.rank === null || proc.rank === undefined ? "" : ", rank " + esc(proc.rank) +
            (proc.world_size ? "/" + esc(proc.world_size) : "")) + ") — " + esc(dev.label) +
          " <span class=\"muted\">peak " + esc(bytes(dev.peak)) + " at " + esc(secs(dev.peak_t)) + ", " + esc(bytes(dev.end)) + " at the end" +
          (dev.tensors ? "; tensors peak " + esc(bytes(dev.tensor_peak)) : "") + "</span>"));
        var chartId = "chart-" + proc.pid + "-" + dev.device;
        if (dev.anatomy && dev.anatomy.at_peak) {
          sec.appendChild(el("h3", null, "What the memory is"));
          renderAnatomy(dev, sec, chartId);
        }
        var chartHead = el("h3", null, dev.tensors ?
          "Memory over time: PyTorch's tensors by call site, its reserve, and memory outside it" :
          "Memory over time, by call site");
        chartHead.id = chartId;
        sec.appendChild(chartHead);
        renderChart(D, proc, dev, sec);
        renderOom(D, proc, dev, sec);
        sec.appendChild(el("h3", null, "Flame graph of the bytes held"));
        renderFlame(dev, sec);
        sec.appendChild(el("h3", null, "Call sites"));
        renderTable(dev, sec);
        app.appendChild(sec);
      });
    });
    if (!(D.processes || []).length) app.appendChild(el("p", "muted", "This trace has no processes."));
    document.body.setAttribute("data-rendered", "yes");
  }

  try {
    main(JSON.parse(document.getElementById("data").textContent));
  } catch (e) {
    var errs = document.getElementById("errors");
    errs.textContent += "Error: " + (e && e.stack ? e.stack : e) + "\n";
    errs.hidden = false;
  }
})();
