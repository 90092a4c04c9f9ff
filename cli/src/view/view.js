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

  function culpritName(f) {
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
    var c = f.kind === "leak" ? "#d36b00" : "#8a6d00";
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

  function renderChart(D, proc, dev, root) {
    var W = 1160, H = 300, L = 70, R = 40, T = 10, B = 28;
    // A point's value holds until the next one (a step plot); the series starts at 0.
    var pts = [[0, 0, (dev.layers || []).map(function () { return 0; })]].concat(dev.points || []);
    var tmax = Math.max(proc.duration_s || 0, pts.length ? pts[pts.length - 1][0] : 0, 1e-9);
    var marks = [];
    findingsFor(D, proc.pid, dev.device).forEach(function (f) {
      marks = marks.concat(findingMarks(f, proc.analysis_t0_s || 0));
    });
    marks.forEach(function (m) { tmax = Math.max(tmax, m[0]); });
    var ymax = Math.max(dev.peak || 0, 1);
    pts.forEach(function (p) { ymax = Math.max(ymax, p[1]); });
    var x = function (t) { return L + (W - L - R) * t / tmax; };
    var y = function (b) { return T + (H - T - B) * (1 - b / ymax); };
    var svg = [];
    svg.push("<svg width=\"" + W + "\" height=\"" + H + "\" viewBox=\"0 0 " + W + " " + H + "\" role=\"img\">");
    for (var g = 0; g <= 4; g++) {
      var gy = y(ymax * g / 4);
      svg.push("<line x1=\"" + L + "\" x2=\"" + (W - R) + "\" y1=\"" + gy + "\" y2=\"" + gy + "\" stroke=\"#e6e6e6\"/>");
      svg.push("<text x=\"" + (L - 6) + "\" y=\"" + (gy + 4) + "\" font-size=\"11\" text-anchor=\"end\">" + esc(bytes(ymax * g / 4)) + "</text>");
    }
    for (var k = 0; k <= 5; k++) {
      var gx = x(tmax * k / 5);
      svg.push("<text x=\"" + gx + "\" y=\"" + (H - 8) + "\" font-size=\"11\" text-anchor=\"middle\">" + esc(secs(tmax * k / 5)) + "</text>");
    }
    var layers = dev.layers || [];
    if (pts.length) {
      // Stacked areas: each layer from the cumulative sum below it; "other" on top.
      var below = pts.map(function () { return 0; });
      var series = layers.map(function (l, i) { return pts.map(function (p) { return p[2][i] || 0; }); });
      series.push(pts.map(function (p) {
        var s = p[2].reduce(function (a, b) { return a + b; }, 0);
        return Math.max(0, p[1] - s);
      }));
      series.forEach(function (vals, i) {
        var top = vals.map(function (v, j) { return below[j] + v; });
        var d = "M" + x(pts[0][0]).toFixed(1) + "," + y(below[0]).toFixed(1);
        pts.forEach(function (p, j) {
          if (j > 0) d += "L" + x(p[0]).toFixed(1) + "," + y(top[j - 1]).toFixed(1);
          d += "L" + x(p[0]).toFixed(1) + "," + y(top[j]).toFixed(1);
        });
        var last = pts.length - 1;
        d += "L" + x(tmax).toFixed(1) + "," + y(top[last]).toFixed(1) + "L" + x(tmax).toFixed(1) + "," + y(below[last]).toFixed(1);
        for (var j = last; j >= 0; j--) {
          d += "L" + x(pts[j][0]).toFixed(1) + "," + y(below[j]).toFixed(1);
          if (j > 0) d += "L" + x(pts[j][0]).toFixed(1) + "," + y(below[j - 1]).toFixed(1);
        }
        var name = i < layers.length ? layers[i].label : "other sites";
        svg.push("<path d=\"" + d + "Z\" fill=\"" + (i < layers.length ? COLORS[i % COLORS.length] : OTHER) +
          "\" fill-opacity=\"0.85\"><title>" + esc(name) + "</title></path>");
        below = top;
      });
      var line = "M" + pts.map(function (p, j) {
        var at = x(p[0]).toFixed(1);
        return (j > 0 ? at + "," + y(pts[j - 1][1]).toFixed(1) + "L" : "") + at + "," + y(p[1]).toFixed(1);
      }).join("L") + "L" + x(tmax).toFixed(1) + "," + y(pts[pts.length - 1][1]).toFixed(1);
      svg.push("<path d=\"" + line + "\" fill=\"none\" stroke=\"#222\" stroke-width=\"1\"/>");
    }
    (proc.markers || []).forEach(function (m) {
      svg.push("<line class=\"step\" x1=\"" + x(m.t) + "\" x2=\"" + x(m.t) + "\" y1=\"" + T + "\" y2=\"" + (H - B) +
        "\" stroke=\"#999\" stroke-opacity=\"0.35\"><title>step " + esc(m.label) + " at " + esc(secs(m.t)) + "</title></line>");
    });
    marks.forEach(function (m, i) {
      var mx = x(m[0]);
      svg.push("<line class=\"finding\" x1=\"" + mx + "\" x2=\"" + mx + "\" y1=\"" + T + "\" y2=\"" + (H - B) + "\" stroke=\"" + m[2] +
        "\" stroke-width=\"2\"" + (m[3] ? " stroke-dasharray=\"5,4\"" : "") + "><title>" + esc(m[1]) + " at " + esc(secs(m[0])) + "</title></line>");
      // Labels near the right edge go to the left of their line.
      var right = mx > W * 0.75;
      svg.push("<text x=\"" + (right ? mx - 4 : mx + 4) + "\" y=\"" + (T + 12 + 13 * (i % 4)) + "\" font-size=\"11\" text-anchor=\"" +
        (right ? "end" : "start") + "\" fill=\"" + m[2] + "\">" + esc(m[1]) + "</text>");
    });
    svg.push("</svg>");
    var box = el("div", "chart");
    box.innerHTML = svg.join("");
    var readout = el("div", "readout");
    box.appendChild(readout);
    var svgEl = box.querySelector("svg");
    svgEl.addEventListener("mousemove", function (e) {
      var r = svgEl.getBoundingClientRect();
      var t = (e.clientX - r.left - L) / (W - L - R) * tmax;
      var best = pts[0];
      pts.forEach(function (p) { if (Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p; });
      var parts = layers.map(function (l, i) { return [l.label, best[2][i] || 0]; })
        .filter(function (x) { return x[1] > 0; })
        .sort(function (a, b) { return b[1] - a[1]; }).slice(0, 4)
        .map(function (x) { return esc(x[0]) + " " + esc(bytes(x[1])); });
      readout.innerHTML = esc(secs(best[0])) + ": <b>" + esc(bytes(best[1])) + "</b> live" + (parts.length ? " — " + parts.join(", ") : "");
    });
    svgEl.addEventListener("mouseleave", function () { readout.textContent = ""; });
    var legend = el("div", "legend");
    legend.innerHTML = layers.map(function (l, i) {
      return "<span><i style=\"background:" + COLORS[i % COLORS.length] + "\"></i><span class=\"site-label\">" + esc(l.label) + "</span></span>";
    }).join("") + "<span><i style=\"background:" + OTHER + "\"></i>other sites</span>" +
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
        var name = culpritName({ stack: s.stack });
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

  function renderFlame(dev, root) {
    var flames = dev.flames || {};
    var names = { peak: "at peak", oom: "at the OOM", end: "at the end" };
    var wrap = el("div");
    var pick = el("select");
    Object.keys(names).forEach(function (k) {
      if (flames[k]) pick.appendChild(new Option(names[k] + " (" + bytes(flames[k].v) + ")", k));
    });
    var label = el("label", null, "Bytes held ");
    label.appendChild(pick);
    wrap.appendChild(label);
    var box = el("div", "flame");
    wrap.appendChild(box);
    function draw() {
      var tree = flames[pick.value];
      box.innerHTML = "";
      if (!tree || !tree.v) { box.style.height = "20px"; box.textContent = "nothing held"; return; }
      var depth = 0, html = [];
      (function walk(n, d, off) {
        depth = Math.max(depth, d);
        var w = n.v / tree.v * 100;
        if (w < 0.05) return;
        var hue = (n.n.length * 37 + d * 11) % 60;
        html.push("<div style=\"left:" + (off / tree.v * 100) + "%;width:" + w + "%;top:" + d * 17 + "px;background:hsl(" + (20 + hue) +
          ",85%," + (62 + (d % 3) * 5) + "%)\" title=\"" + esc(n.n + " — " + bytes(n.v) + " (" + (n.v / tree.v * 100).toFixed(1) + "%)") + "\">" + esc(n.n) + "</div>");
        var o = off;
        (n.c || []).forEach(function (c) { walk(c, d + 1, o); o += c.v; });
      })(tree, 0, 0);
      box.style.height = (depth + 1) * 17 + 2 + "px";
      box.innerHTML = html.join("");
    }
    pick.addEventListener("change", draw);
    draw();
    root.appendChild(wrap);
  }

  function renderTable(dev, root) {
    var cols = [["label", "call site"], ["peak", "held at peak"], ["end", "held at end"],
      ["allocations", "allocations"], ["temporaries", "temporaries"], ["growth_per_step", "growth / step"]];
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

  function main(D) {
    var app = document.getElementById("app");
    app.innerHTML = "";
    document.getElementById("meta").innerHTML = esc(D.path) + " — " + esc(D.producer) +
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
          " <span class=\"muted\">peak " + esc(bytes(dev.peak)) + " at " + esc(secs(dev.peak_t)) + ", " + esc(bytes(dev.end)) + " at the end</span>"));
        sec.appendChild(el("h3", null, "Memory over time, by call site"));
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
