// otel-ebpf report: draws the embedded JSON (script#oe-data) as SVG. No network, no libraries.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("oe-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var tip = document.getElementById("tip");

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function h(tag, text, parent, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmtUs(us) {
    var a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (a >= 1e3) return (us / 1e3).toFixed(2) + " ms";
    return us.toFixed(1) + " \u00b5s";
  }
  function fmtVal(v, unit) {
    if (v === null || v === undefined) return "-";
    if (unit === "By") {
      var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
      while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
      return (i ? v.toFixed(1) : v.toFixed(0)) + " " + u[i];
    }
    if (unit === "s") return fmtUs(v * 1e6);
    var s = Math.abs(v) >= 100 || v === Math.round(v) ? v.toFixed(0) : v.toPrecision(3);
    return s + (unit && unit !== "1" ? " " + unit.replace(/[{}]/g, "") : "");
  }
  function showTip(ev, lines) {
    tip.textContent = "";
    lines.forEach(function (l, i) { h("div", l, tip, i === 0 ? "t" : ""); });
    tip.style.display = "block";
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = ev.clientX - tip.offsetWidth - 10;
    if (y + tip.offsetHeight > window.innerHeight) y = Math.max(0, ev.clientY - tip.offsetHeight - 10);
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }
  function attrLines(attrs) {
    return Object.keys(attrs || {}).map(function (k) { return k + " = " + JSON.stringify(attrs[k]); });
  }

  // ---- header ---------------------------------------------------------------------------
  function header() {
    var m = D.meta, box = document.getElementById("summary");
    function card(label, value, cls) {
      var c = h("div", null, box, "card" + (cls ? " " + cls : ""));
      h("div", value, c, "v"); h("div", label, c, "l");
    }
    card("ranks", m.ranks.length ? m.ranks.length + " (" + m.ranks.join(", ") + ")" : "-");
    card("hosts", m.hosts.length ? m.hosts.join(", ") : "-");
    card("time span", fmtUs(m.span_us));
    card("spans", m.spans + (m.errors ? " (" + m.errors + " errors)" : ""), m.errors ? "warn" : "");
    card("processes", String(m.processes));
    card("collectives", m.collectives + " (" + m.complete + " complete, " + m.partial + " partial)",
         m.partial ? "bad" : "");
    if (m.straggler) card("straggler", "rank " + m.straggler.rank + " on " + (m.straggler.host || "?") +
                          ": last in " + m.straggler.count + "/" + m.straggler.of, "bad");
    (m.straggler && m.straggler.why || []).forEach(function (w) {  // sched figures: why it was late
      card("why late: " + w[0].replace(/_/g, "-").replace(".", " ") + " before the collective",
           w[1].toFixed(1) + " ms vs " + w[2].toFixed(1) + " ms (peers' median)", "bad");
    });
    if (m.skew_p50_ms !== null) card("skew p50 / max", m.skew_p50_ms.toFixed(1) + " / " +
                                     m.skew_max_ms.toFixed(1) + " ms");
    if (m.desyncs) card("desync events", String(m.desyncs), "bad");
    card("metric points", m.metric_points + " (" + m.metric_names + " metrics)");
    card("dropped events", String(m.dropped), m.dropped ? "bad" : "");
    var foot = document.getElementById("files");
    foot.textContent = "from " + m.files.join(", ") + (m.bad_lines ? " (" + m.bad_lines + " unreadable lines)" : "") +
      "; t=0 is " + new Date(m.t0_ns / 1e6).toISOString();
    if (m.dropped_by.length) {
      foot.textContent += "; dropped: " + m.dropped_by.map(function (r) {
        return r.source + " " + r.receiver + "/" + r.reason + " " + r.value; }).join(", ");
    }
  }

  // ---- timeline -------------------------------------------------------------------------
  var LABEL = 170, ROW = 14, LANE_PAD = 6, TOP = 24;
  var TL = { svg: null, lanes: [], height: 0, w: 1000, view: { a: 0, b: 1 }, full: { a: 0, b: 1 } };

  function hover(node, lines) {
    node.addEventListener("mousemove", function (ev) { showTip(ev, lines()); });
    node.addEventListener("mouseleave", hideTip);
  }
  function svgWidth() {  // Firefox reports clientWidth 0 for <svg>: prefer the layout box
    var box = TL.svg.getBoundingClientRect ? TL.svg.getBoundingClientRect() : null;
    return (box && box.width) || TL.svg.clientWidth || 1000;
  }
  function svgLeft() { return TL.svg.getBoundingClientRect ? TL.svg.getBoundingClientRect().left : 0; }
  function plotWidth() { return TL.w - LABEL - 10; }  // TL.w: measured once per draw (no layout per bar)
  function tx(t) { return LABEL + (t - TL.view.a) / (TL.view.b - TL.view.a) * plotWidth(); }
  function bar(parent, t, dur, y, cls) {  // null when outside the view
    var x0 = tx(t), x1 = tx(t + dur);
    if (x1 < LABEL || x0 > TL.w) return null;
    var left = Math.max(x0, LABEL);
    return el("rect", { x: left, y: y, width: Math.max(1, x1 - left), height: ROW - 2, class: cls }, parent);
  }

  function drawLanes() {
    var svg = TL.svg, width = TL.w;
    TL.lanes.forEach(function (l, i) {
      el("rect", { x: 0, y: l.y - 2, width: width, height: l.rows * ROW + 4,
                   class: "lane" + (i % 2 ? " odd" : "") + (l.straggler ? " slane" : "") }, svg);
      el("text", { x: 6, y: l.y + ROW - 3, class: "lbl" + (l.straggler ? " slbl" : "") }, svg).textContent =
        l.label + (l.straggler ? "  \u25c0 straggler" : "");
    });
    for (var k = 0; k <= 8; k++) {
      var t = TL.view.a + (TL.view.b - TL.view.a) * k / 8, x = tx(t);
      el("line", { x1: x, x2: x, y1: TOP - 6, y2: TL.height, class: "grid" }, svg);
      el("text", { x: x + 2, y: 12, class: "tick" }, svg).textContent = fmtUs(t);
    }
  }

  function drawSpans(g) {
    D.spans.forEach(function (s) {  // [lane, row, start us, dur us, name, flags (1 straggler, 2 error), attrs]
      var lane = TL.lanes[s[0] + 1];
      var r = bar(g, s[2], s[3], lane.y + s[1] * ROW, "bar " + (s[1] ? "cuda" : "nccl") + (s[5] & 1 ? " strag" : "") +
                  (s[5] & 2 ? " err" : ""));
      if (r) hover(r, function () {
        return [s[4] + "  " + fmtUs(s[3]), lane.label + ", t=" + fmtUs(s[2]) +
                (s[5] & 1 ? "  (STRAGGLER: last rank to arrive)" : "")].concat(attrLines(s[6]));
      });
    });
  }

  function collectiveTip(c) {
    var head = c.op + " seq " + c.seq + "  " + fmtUs(c.dur) +
      (c.partial ? "  PARTIAL: missing ranks " + c.missing.join(",") : "");
    var sub = c.straggler_rank !== null && c.straggler_rank !== undefined ? "straggler rank " + c.straggler_rank +
      " on " + c.straggler_host + ", skew " + (c.skew_ms || 0).toFixed(2) + " ms" :
      c.arrived + "/" + c.nranks + " ranks arrived";
    return [head, sub].concat(attrLines(c.attrs));
  }

  function drawCollectives(g) {
    var y = TL.lanes[0].y;
    D.collectives.forEach(function (c) {
      var r = bar(g, c.start, c.dur, y, "bar coll" + (c.partial ? " partial" : ""));
      if (!r) return;
      hover(r, function () { return collectiveTip(c); });
      if (c.partial) el("line", { x1: tx(c.start), x2: tx(c.start), y1: TOP, y2: TL.height, class: "partial-mark" }, g);
      c.desyncs.forEach(function (d) {
        var p = el("path", { d: "M" + tx(d.t) + "," + (y + ROW) + "l-5,-9h10z", class: "desync" }, g);
        hover(p, function () {
          return ["nccl.desync: " + c.op + " seq " + c.seq, "missing ranks " + d.missing.join(",") + ", waited " +
                  d.waited_ms.toFixed(0) + " ms"].concat(d.where || []);
        });
      });
    });
  }

  function draw() {
    TL.w = svgWidth();
    TL.svg.textContent = "";
    drawLanes();
    var g = el("g", {}, TL.svg);
    drawSpans(g);
    drawCollectives(g);
  }

  function interact() {
    var svg = TL.svg, drag = null;
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var v = TL.view, f = ev.deltaY > 0 ? 1.25 : 0.8;
      var t = v.a + (Math.max(0, ev.clientX - svgLeft() - LABEL) / plotWidth()) * (v.b - v.a);
      TL.view = { a: t - (t - v.a) * f, b: t + (v.b - t) * f };
      draw();
    }, { passive: false });
    svg.addEventListener("mousedown", function (ev) { drag = { x: ev.clientX, a: TL.view.a, b: TL.view.b }; });
    window.addEventListener("mouseup", function () { drag = null; });
    window.addEventListener("mousemove", function (ev) {
      if (!drag) return;
      var dt = (ev.clientX - drag.x) / plotWidth() * (drag.b - drag.a);
      TL.view = { a: drag.a - dt, b: drag.b - dt };
      draw();
    });
    svg.addEventListener("dblclick", function () { TL.view = { a: TL.full.a, b: TL.full.b }; draw(); });
    window.addEventListener("resize", draw);
  }

  function timeline() {
    TL.svg = document.getElementById("timeline");
    document.getElementById("span-note").textContent = D.span_note + ". Scroll to zoom, drag to pan, " +
      "double-click to show the whole run (it opens on the collectives).";
    TL.full = { a: 0, b: (D.meta.span_us || 1) * 1.01 };
    TL.view = { a: TL.full.a, b: TL.full.b };
    if (D.collectives.length) {  // open on the collectives (process-lifetime spans would squeeze them)
      var a = Infinity, b = -Infinity;
      D.collectives.forEach(function (c) { a = Math.min(a, c.start); b = Math.max(b, c.start + c.dur); });
      var pad = Math.max((b - a) * 0.05, 1000);
      TL.view = { a: Math.max(TL.full.a, a - pad), b: Math.min(TL.full.b, b + pad) };
    }
    TL.lanes = [{ label: "collectives (joined)", rows: 1 }].concat(D.lanes.map(function (l) {
      return { label: l.label, rows: 2, straggler: l.straggler };
    }));
    var y = TOP;
    TL.lanes.forEach(function (l) { l.y = y; y += l.rows * ROW + LANE_PAD; });
    TL.height = y + 4;
    TL.svg.setAttribute("height", TL.height);
    interact();
    draw();
  }

  // ---- charts ---------------------------------------------------------------------------
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

  function chart(c, parent) {
    var box = h("div", null, parent, "chart");
    h("div", c.name + " [" + (c.unit || "1") + "]", box, "ct");
    h("div", c.what + (c.series_total > c.series.length ? "; top " + c.series.length + " of " +
      c.series_total + " series" : ""), box, "cs");
    var W = 420, H = 170, L = 64, B = 22, svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H }, box);
    var xs = [], ys = [];
    c.series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    if (!xs.length) return;
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min(0, Math.min.apply(null, ys)),
      y1 = Math.max.apply(null, ys);
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) y1 = y0 + 1;
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - 8); }
    function Y(v) { return H - B - (v - y0) / (y1 - y0) * (H - B - 8); }
    el("line", { x1: L, x2: W - 8, y1: H - B, y2: H - B, class: "axis" }, svg);
    el("line", { x1: L, x2: L, y1: 8, y2: H - B, class: "axis" }, svg);
    el("text", { x: L - 4, y: 14, class: "tick end" }, svg).textContent = fmtVal(y1, c.unit);
    el("text", { x: L - 4, y: H - B, class: "tick end" }, svg).textContent = fmtVal(y0, c.unit);
    el("text", { x: L, y: H - 6, class: "tick" }, svg).textContent = fmtUs(x0);
    el("text", { x: W - 8, y: H - 6, class: "tick end" }, svg).textContent = fmtUs(x1);
    c.series.forEach(function (s, i) {
      var d = s.points.map(function (p, j) { return (j ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); });
      el("path", { d: d.join(""), class: "line", stroke: COLORS[i % COLORS.length] }, svg);
      s.points.forEach(function (p) {
        var dot = el("circle", { cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: COLORS[i % COLORS.length] }, svg);
        dot.addEventListener("mousemove", function (ev) {
          showTip(ev, [c.name + " = " + fmtVal(p[1], c.unit), s.label, "t=" + fmtUs(p[0])]);
        });
        dot.addEventListener("mouseleave", hideTip);
      });
    });
    var leg = h("div", null, box, "legend");
    c.series.forEach(function (s, i) {
      var it = h("span", null, leg);
      h("i", null, it).style.background = COLORS[i % COLORS.length];
      it.appendChild(document.createTextNode(s.label));
    });
  }

  function charts() {
    var box = document.getElementById("charts");
    if (!D.charts.length) h("p", "No metrics in the input.", box, "muted");
    D.charts.forEach(function (c) { chart(c, box); });
  }

  // ---- tables ---------------------------------------------------------------------------
  function table(id, cols, rows, rowClass) {
    var t = document.getElementById(id), tr = h("tr", null, h("thead", null, t));
    cols.forEach(function (c) { h("th", c[0], tr); });
    var body = h("tbody", null, t);
    if (!rows.length) { h("td", "none", h("tr", null, body)).colSpan = cols.length; return; }
    rows.forEach(function (r) {
      var row = h("tr", null, body, rowClass ? rowClass(r) : "");
      cols.forEach(function (c) { h("td", c[1](r), row); });
    });
  }
  function dash(v) { return v === null || v === undefined || v === "" ? "-" : String(v); }

  header();
  timeline();
  charts();
  table("slow", [["span", function (r) { return r.name; }],
                 ["duration", function (r) { return fmtUs(r.dur_ms * 1e3); }],
                 ["process", function (r) { return r.process; }], ["rank", function (r) { return dash(r.rank); }],
                 ["host", function (r) { return dash(r.host); }], ["at", function (r) { return fmtUs(r.start); }]],
        D.top_slow, function (r) { return r.status === "error" ? "err" : ""; });
  table("skew", [["collective", function (r) { return r.op + " seq " + r.seq; }],
                 ["skew", function (r) { return r.skew_ms === null ? "-" : r.skew_ms.toFixed(2) + " ms"; }],
                 ["straggler", function (r) { return r.straggler_rank === null || r.straggler_rank === undefined ? "-" :
                   "rank " + r.straggler_rank + " on " + dash(r.straggler_host); }],
                 ["ranks", function (r) { return dash(r.arrived) + "/" + dash(r.nranks) +
                   (r.partial ? " (missing " + r.missing.join(",") + ")" : ""); }],
                 ["at", function (r) { return fmtUs(r.start); }]],
        D.by_skew, function (r) { return r.partial ? "err" : ""; });
  forensics();

  function forensics() {
    var box = document.getElementById("forensics"), rows = D.forensics || [];
    if (!rows.length) { h("p", "none", box, "muted"); return; }
    rows.forEach(function (r) {
      var d = h("details", null, box, r.severity === "WARN" ? "err" : "");
      h("summary", (r.t === null ? "" : fmtUs(r.t) + "  ") + r.event.replace("otel_ebpf.", "") +
        (r.who ? " [" + r.who + "]" : "") + ": " + r.title, d);
      h("pre", r.body, d);
    });
  }
})();
