// A stand-in for a browser DOM (test double; no jsdom here): runs the JS of a report.html
// under node and prints, as JSON, what it drew. Usage: node dom_stand_in.js report.html
const fs = require("fs");
const html = fs.readFileSync(process.argv[2], "utf8");
const data = html.match(/<script type="application\/json" id="oe-data">([\s\S]*?)<\/script>/)[1];
const js = html.match(/<script>\n([\s\S]*?)<\/script>/)[1];
const all = [];
class Node_ {
  constructor(tag) { this.tagName = tag; this.children = []; this.attrs = {}; this.style = {}; this._text = "";
    this.className = ""; this.listeners = {}; all.push(this); }
  appendChild(c) { this.children.push(c); return c; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  addEventListener(t, f) { this.listeners[t] = f; }
  set textContent(v) { this._text = String(v); if (v === "") this.children = []; }
  get textContent() { return this._text + this.children.map(c => c.textContent).join(""); }
  get firstChild() { return this.children[0]; }
  get nodeValue() { return this._text; }
  set nodeValue(v) { this._text = String(v); }
  get clientWidth() { return 1200; }
  get offsetWidth() { return 100; }
  get offsetHeight() { return 50; }
}
const byId = {};
for (const id of ["summary", "files", "span-note", "timeline", "metrics", "slow", "skew", "forensics", "tip",
                  "sec-skew", "sec-hangs"]) byId[id] = new Node_(id);
byId["oe-data"] = { textContent: data };
global.document = { getElementById: id => byId[id], createElement: t => new Node_(t),
  createElementNS: (ns, t) => new Node_(t), createTextNode: t => { const n = new Node_("#text"); n._text = t; return n; } };
global.window = { innerWidth: 1400, innerHeight: 900, addEventListener() {} };
eval(js);
const count = (root, pred) => { let n = 0; const walk = e => { if (pred(e)) n++; e.children.forEach(walk); }; walk(root); return n; };
const tl = byId.timeline;
const out = {
  cards: byId.summary.children.length,
  summary: byId.summary.textContent,
  bars: count(tl, e => e.tagName === "rect" && (e.attrs.class || "").startsWith("bar")),
  straggler_bars: count(tl, e => (e.attrs.class || "").includes("strag")),
  coll_bars: count(tl, e => (e.attrs.class || "").includes("coll")),
  partial_bars: count(tl, e => (e.attrs.class || "").includes("partial")),
  desyncs: count(tl, e => (e.attrs.class || "") === "desync"),
  straggler_lane_labels: count(tl, e => (e.attrs.class || "") === "lbl slbl"),
  lane_labels: count(tl, e => (e.attrs.class || "").startsWith("lbl")),
  row_labels: count(tl, e => (e.attrs.class || "") === "rlbl"),
  brackets: count(tl, e => e.tagName === "path" && /^life( |$)/.test(e.attrs.class || "")),
  sections: byId.metrics.children.filter(e => e.tagName === "h2").map(e => e.textContent),
  charts: count(byId.metrics, e => e.tagName === "div" && /^chart( |$)/.test(e.className)),
  chart_lines: count(byId.metrics, e => e.tagName === "path"),
  value_tables: count(byId.metrics, e => e.className === "vals"),
  hidden: ["sec-skew", "sec-hangs"].filter(id => byId[id].style.display === "none"),
  slow_rows: count(byId.slow, e => e.tagName === "tr") - 1,
  skew_rows: count(byId.skew, e => e.tagName === "tr") - 1,
};
// hover one straggler bar: the tooltip names it
let strag = null; (function walk(e) { if (!strag && (e.attrs.class || "").includes("strag")) strag = e; e.children.forEach(walk); })(tl);
if (strag) { strag.listeners.mousemove({ clientX: 10, clientY: 10 }); out.tip = byId.tip.textContent.slice(0, 1000); }
console.log(JSON.stringify(out));
