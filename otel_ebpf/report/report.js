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
    if (a === 0) return "0 s";
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

  function fmtNum(v) {  // a tick label without a unit: 1355, 1.36k, 2.5M, 0.0012
    var a = Math.abs(v);
    if (a >= 1e9) return +(v / 1e9).toPrecision(3) + "G";
    if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
    if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
    return a === 0 || a >= 1 ? String(+v.toPrecision(4)) : String(+v.toPrecision(2));
  }
  // ---- a time axis in real units, from the first span ----------------------------------------
  function ticks(a, b, n, outward) {  // round values about n apart from a to b (outward: to cover a..b)
    var raw = (b - a) / Math.max(1, n), mag = Math.pow(10, Math.floor(Math.log10(raw || 1))), step = mag;
    [1, 2, 5, 10].some(function (m) { step = m * mag; return step >= raw; });
    var lo = outward ? Math.floor(a / step + 1e-9) * step : Math.ceil(a / step - 1e-9) * step;
    var hi = outward ? Math.ceil(b / step - 1e-9) * step : b, out = [];
    for (var t = lo; t <= hi + step * 1e-9; t += step) out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    return { values: out, step: step };
  }
  function valueScale(unit, m) {  // [divisor, suffix] of a chart's y labels, by its largest value
    var d = 1, i = 0;
    if (unit === "By") {
      var u = ["B", "KiB", "MiB", "GiB", "TiB"];
      while (m / d >= 1024 && i < u.length - 1) { d *= 1024; i++; }
      return [d, " " + u[i]];
    }
    if (unit === "s") return m >= 1 || m === 0 ? [1, " s"] : m >= 1e-3 ? [1e-3, " ms"] : [1e-6, " \u00b5s"];
    return [1, ""];
  }
  function fmtTime(us, step, scale) {  // unit chosen by the view's magnitude, decimals by the step
    var m = Math.max(Math.abs(scale), Math.abs(step)), div = m >= 1e6 ? 1e6 : m >= 1e3 ? 1e3 : 1;
    var name = div === 1e6 ? " s" : div === 1e3 ? " ms" : " \u00b5s";
    var dec = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / div) - 1e-9)));
    return (us / div).toFixed(dec) + name;
  }
  function textWidth(node) {  // a text's drawn width (a stand-in DOM has no layout: estimate)
    try { if (node.getComputedTextLength) return node.getComputedTextLength(); } catch (e) { /* not laid out */ }
    return String(node.firstChild ? node.firstChild.nodeValue : node.textContent).length * 6.2;
  }
  function fitText(node, width) {  // shorten a label to the width, the whole text on hover
    var full = node.textContent;
    el("title", {}, node).textContent = full;
    if (textWidth(node) <= width) return;
    var n = full.length;
    while (n > 4 && textWidth(node) > width) { n = Math.floor(n * 0.9); node.firstChild.nodeValue = full.slice(0, n) + "\u2026"; }
  }

  // ---- header ---------------------------------------------------------------------------
  function header() {
    var m = D.meta, box = document.getElementById("summary");
    function card(label, value, cls) {
      var c = h("div", null, box, "card" + (cls ? " " + cls : ""));
      h("div", value, c, "v"); h("div", label, c, "l");
    }
    if (m.ranks.length) card("ranks", m.ranks.length + " (" + m.ranks.join(", ") + ")");
    card("hosts", m.hosts.length ? m.hosts.join(", ") : "-");
    card("time span (first span to last)", fmtUs(m.span_us));
    card("spans", m.spans + (m.errors ? " (" + m.errors + " errors)" : ""), m.errors ? "warn" : "");
    card("processes / threads", m.processes + " / " + m.threads);
    if (m.collectives) card("collectives", m.collectives + " (" + m.complete + " complete, " + m.partial + " partial)",
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
    card("events lost", String(m.dropped), m.dropped ? "bad" : "");
    if (m.not_recorded) card("not recorded by a limit (not lost)", String(m.not_recorded), "note");
    var foot = document.getElementById("files");
    foot.textContent = "from " + m.files.join(", ") + (m.bad_lines ? " (" + m.bad_lines + " unreadable lines)" : "") +
      "; t=0 is the first span, " + new Date(m.t0_ns / 1e6).toISOString();
    function rows(lost) {
      return m.dropped_by.filter(function (r) { return r.lost === lost; }).map(function (r) {
        return r.source + " " + r.receiver + "/" + r.reason + " " + r.value + (r.why ? " (" + r.why + ")" : ""); });
    }
    if (rows(true).length) foot.textContent += "; LOST: " + rows(true).join(", ");
    if (rows(false).length) foot.textContent += "; not recorded by a limit, not lost: " + rows(false).join(", ");
  }

  // ---- timeline -------------------------------------------------------------------------
  var LABEL = 250, ROWH = 12, HEAD = 18, PAD = 6, TOP = 26, FOOT = 22;
  var SRC = { "Python": "py", "torch ops": "torch", "CUDA": "cuda", "NCCL": "nccl", "NCCL on GPU": "ngpu" };
  var TL = { svg: null, lanes: [], coll: null, height: 0, w: 1000, view: { a: 0, b: 1 }, full: { a: 0, b: 1 } };

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
    return el("rect", { x: left, y: y, width: Math.max(1, Math.min(x1, TL.w) - left), height: ROWH - 2,
                        class: cls }, parent);
  }
  function label(text, x, y, cls, width) {
    var t = el("text", { x: x, y: y, class: cls }, TL.svg);
    t.appendChild(document.createTextNode(text));
    fitText(t, width);
    return t;
  }

  function axis() {
    var svg = TL.svg, tk = ticks(TL.view.a, TL.view.b, Math.max(2, Math.floor(plotWidth() / 110)));
    var scale = Math.max(Math.abs(TL.view.a), Math.abs(TL.view.b));
    tk.values.forEach(function (t) {
      var x = tx(t);
      if (x < LABEL - 0.5 || x > TL.w) return;
      el("line", { x1: x, x2: x, y1: TOP - 6, y2: TL.height - FOOT + 4, class: "grid" }, svg);
      [12, TL.height - 6].forEach(function (y) {
        el("text", { x: x, y: y, class: "tick mid" }, svg).textContent = fmtTime(t, tk.step, scale);
      });
    });
  }

  function lifeBracket(l, g) {  // the process-lifetime span, collapsed to a bracket in the lane's header
    var p = l.process, x0 = tx(p.start), x1 = tx(p.start + p.dur), y = l.y;
    if (x1 < LABEL || x0 > TL.w) return;
    var a = Math.max(x0, LABEL), b = Math.min(Math.max(x1, a + 1), TL.w);
    el("path", { d: "M" + a + "," + (y + HEAD - 4) + "V" + (y + 4) + "H" + b + "V" + (y + HEAD - 4),
                 class: "life" + (p.error ? " err" : "") }, g);
    var hit = el("rect", { x: a, y: y + 1, width: b - a, height: HEAD - 3, class: "hit" }, g);
    hover(hit, function () {
      return [p.name + "  " + fmtUs(p.dur) + " (process lifetime: fork or first exec to exit)",
              l.label + ", t=" + fmtUs(p.start)].concat(attrLines(p.attrs));
    });
    if (b - a > 140) el("text", { x: a + 5, y: y + HEAD - 5, class: "lifet" }, g).textContent =
      p.name + " \u00b7 " + fmtUs(p.dur);
  }

  function drawLanes() {
    var svg = TL.svg, width = TL.w;
    if (TL.coll) label("collectives (joined)", 6, TL.coll.y + ROWH - 2, "lbl", LABEL - 10);
    TL.lanes.forEach(function (l, i) {
      el("rect", { x: 0, y: l.y - 2, width: width, height: l.h - PAD + 4,
                   class: "lane" + (i % 2 ? " odd" : "") + (l.straggler ? " slane" : "") }, svg);
      label(l.label, 6, l.y + HEAD - 5, "lbl" + (l.straggler ? " slbl" : ""), LABEL - 12);
      if (l.straggler) el("text", { x: width - 8, y: l.y + HEAD - 5, class: "snote" }, svg).textContent =
        "\u25c0 the straggler: last rank to arrive at most collectives";
      l.rows.forEach(function (r) { label(r.label, 18, r.y + ROWH - 2, "rlbl", LABEL - 24); });
    });
  }

  function drawSpans(g) {
    // [lane, row, start us, dur us, name, flags (1 straggler, 2 error), attrs, nesting level]
    D.spans.forEach(function (s) {
      var lane = TL.lanes[s[0]], row = lane.rows[s[1]];
      var r = bar(g, s[2], s[3], row.y + s[7] * ROWH, "bar " + (SRC[row.source] || "other") +
                  (s[5] & 1 ? " strag" : "") + (s[5] & 2 ? " err" : ""));
      if (r) hover(r, function () {
        return [s[4] + "  " + fmtUs(s[3]), lane.label + ", " + row.label + ", t=" + fmtUs(s[2]) +
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
    if (!TL.coll) return;
    var y = TL.coll.y;
    D.collectives.forEach(function (c) {
      var r = bar(g, c.start, c.dur, y, "bar coll" + (c.partial ? " partial" : ""));
      if (!r) return;
      hover(r, function () { return collectiveTip(c); });
      if (c.partial) el("line", { x1: tx(c.start), x2: tx(c.start), y1: TOP, y2: TL.height - FOOT, class: "partial-mark" }, g);
      c.desyncs.forEach(function (d) {
        var p = el("path", { d: "M" + tx(d.t) + "," + (y + ROWH) + "l-5,-9h10z", class: "desync" }, g);
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
    axis();
    var g = el("g", {}, TL.svg);  // bars above the lanes' backgrounds and the grid
    TL.lanes.forEach(function (l) { if (l.process) lifeBracket(l, g); });
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
    if (typeof ResizeObserver !== "undefined") {  // a scroll bar appearing narrows the page without a resize event
      new ResizeObserver(function () { if (Math.abs(svgWidth() - TL.w) > 0.5) draw(); }).observe(svg);
    }
  }

  function layout() {
    var y = TOP;
    TL.coll = D.collectives.length ? { y: y } : null;
    if (TL.coll) y += ROWH + PAD + 4;
    TL.lanes = D.lanes.map(function (l) {
      var lane = { label: l.label, straggler: l.straggler, process: l.process, y: y, rows: [] };
      y += HEAD;
      l.rows.forEach(function (r) {
        lane.rows.push({ label: r.label, source: r.source, levels: r.levels, y: y });
        y += r.levels * ROWH + 3;  // a gap between rows
      });
      y += PAD;
      lane.h = y - lane.y;
      return lane;
    });
    TL.height = y + FOOT;
  }

  function timeline() {
    TL.svg = document.getElementById("timeline");
    document.getElementById("span-note").textContent = D.span_note + ". Times from the first span. Scroll to zoom, " +
      "drag to pan, double-click to show the whole run" + (D.collectives.length ? " (it opens on the collectives)." : ".");
    TL.full = { a: 0, b: (D.meta.span_us || 1) * 1.01 };
    TL.view = { a: TL.full.a, b: TL.full.b };
    if (D.collectives.length) {  // open on the collectives (process-lifetime spans would squeeze them)
      var a = Infinity, b = -Infinity;
      D.collectives.forEach(function (c) { a = Math.min(a, c.start); b = Math.max(b, c.start + c.dur); });
      var pad = Math.max((b - a) * 0.05, 1000);
      TL.view = { a: Math.max(TL.full.a, a - pad), b: Math.min(TL.full.b, b + pad) };
    }
    layout();
    TL.svg.setAttribute("height", TL.height);
    TL.svg.setAttribute("data-label-width", LABEL);  // where the plot starts (the browser test checks labels)
    interact();
    draw();
  }

  // ---- charts ---------------------------------------------------------------------------
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

  function values(c, box) {  // a metric read too few times for a line: its readings as a table
    var t = h("table", null, box, "vals"), tr = h("tr", null, h("thead", null, t));
    h("th", "series", tr); h("th", "readings (value at t)", tr);
    var body = h("tbody", null, t);
    c.series.forEach(function (s, i) {
      var row = h("tr", null, body), cell = h("td", null, row);
      h("i", null, cell).style.background = COLORS[i % COLORS.length];
      cell.appendChild(document.createTextNode(s.label));
      h("td", s.points.map(function (p) { return fmtVal(p[1], c.unit) + " at " + fmtUs(p[0]); }).join(", "), row);
    });
  }

  function plot(c, box) {
    var W = 440, H = 180, B = 22, R = 12, T = 10, svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H }, box);
    var xs = [], ys = [];
    c.series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min(0, Math.min.apply(null, ys)),
      y1 = Math.max(0, Math.max.apply(null, ys));
    if (y1 === y0) y1 = y0 + 1;
    var sc = valueScale(c.unit, Math.max(Math.abs(y0), Math.abs(y1))), yt = ticks(y0 / sc[0], y1 / sc[0], 4, true);
    y0 = yt.values[0] * sc[0]; y1 = yt.values[yt.values.length - 1] * sc[0];
    var labels = yt.values.map(function (v) {
      var t = el("text", { x: 0, y: 0, class: "tick end" }, svg);
      t.textContent = fmtNum(v) + sc[1];
      return t;
    });
    var L = 8 + Math.max.apply(null, labels.map(textWidth).concat([20]));  // the widest y label fits
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return H - B - (v - y0) / (y1 - y0) * (H - B - T); }
    labels.forEach(function (t, i) { t.setAttribute("x", L - 4); t.setAttribute("y", Y(yt.values[i] * sc[0]) + 3); });
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis" }, svg);
    el("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis" }, svg);
    var xt = ticks(x0, x1, 4), scale = Math.max(Math.abs(x0), Math.abs(x1));
    xt.values.forEach(function (v) {
      var x = X(v), t = el("text", { x: x, y: H - 6, class: "tick mid" }, svg);
      t.textContent = fmtTime(v, xt.step, scale);
      var w = textWidth(t) / 2;  // keep the first and last label inside the chart
      if (x - w < 0) t.setAttribute("x", w); else if (x + w > W) t.setAttribute("x", W - w);
    });
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

  function chart(c, parent) {
    var box = h("div", null, parent, "chart" + (c.values ? " few" : ""));
    h("div", c.name + " [" + (c.unit || "1") + "]", box, "ct");
    h("div", c.what + (c.series_total > c.series.length ? "; top " + c.series.length + " of " + c.series_total +
      " series" : "") + (c.values ? "; read " + c.readings + (c.readings === 1 ? " time" : " times") +
      ", too few for a line" : "") + (c.note ? "; " + c.note : ""), box, "cs");
    if (c.values) values(c, box); else plot(c, box);
  }

  function charts() {
    var box = document.getElementById("metrics");
    if (!D.charts.length) { h("h2", "Metrics", box); h("p", "No metrics in the input.", box, "muted"); }
    D.sections.forEach(function (title, i) {
      var mine = D.charts.filter(function (c) { return c.section === i; });
      if (!mine.length) return;
      h("h2", title, box);
      var grid = h("div", null, box, "charts");
      mine.forEach(function (c) { chart(c, grid); });
    });
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
  hideEmpty("sec-skew", !D.collectives.length && !D.by_skew.length);  // NCCL-only sections of a job without NCCL
  hideEmpty("sec-hangs", !D.collectives.length && !(D.forensics || []).length);
  timeline();  // last: the page's height (a scroll bar) is known, so is the timeline's width

  function hideEmpty(id, empty) {
    var sec = document.getElementById(id);
    if (sec && empty) sec.style.display = "none";
  }
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
