// The dashboard's one page (launch/dashboard.h serves it at /). Plain HTML, CSS and JavaScript, no libraries and
// nothing fetched from elsewhere: a training cluster's network often reaches nothing outside it. The page polls
// /api/job each second and redraws:
//  - the job line: state, attempt and restarts, layout, the steps of the slowest and fastest rank, uptime, and the
//    newest line worth reading (a hang's blame, why it restarts);
//  - the rank grid: one block per pipeline stage (pp), a row per data-parallel replica (dp), a cell per tensor-
//    parallel rank (tp), each with its rank, step and phase. A rank that is not running, or whose heartbeat is
//    older than 3 intervals, is red; one behind the job's newest step is amber; one with a collective in flight for
//    long shows the collective. Each cell carries data-rank, data-step and data-state for scripts and tests;
//  - the loss, and the fastest and slowest rank's step time, over the steps (SVG);
//  - the newest events of the event log.
#include "megatrain/launch/dashboard.h"

namespace mt::launch {

const char* const kDashboardPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>megatrain</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; background: #fafafa; }
  h1 { font-size: 18px; margin: 0 0 8px 0; }
  #job { margin-bottom: 12px; }
  #job span { margin-right: 18px; }
  #detail { color: #a33; }
  .stages { display: flex; gap: 16px; flex-wrap: wrap; margin-bottom: 16px; }
  .stage { border: 1px solid #ccc; padding: 6px; background: #fff; }
  .stage h2 { font-size: 13px; margin: 0 0 4px 0; }
  .row { display: flex; gap: 4px; margin-bottom: 4px; }
  .rank { width: 92px; padding: 4px; border-radius: 4px; background: #cde8cd; font-size: 12px; }
  .rank.behind { background: #f5dfa6; }
  .rank.bad { background: #f2b1b1; }
  .rank .coll { color: #844; font-size: 11px; }
  .charts { display: flex; gap: 16px; flex-wrap: wrap; }
  svg { background: #fff; border: 1px solid #ccc; }
  table { border-collapse: collapse; font-size: 12px; margin-top: 12px; }
  td, th { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
</style>
</head>
<body>
<h1>megatrain</h1>
<div id="job">loading…</div>
<div id="grid" class="stages"></div>
<div class="charts">
  <div><div>loss</div><svg id="loss" width="420" height="160"></svg></div>
  <div><div>step time, fastest and slowest rank (s)</div><svg id="steptime" width="420" height="160"></svg></div>
</div>
<table id="events"><thead><tr><th>time</th><th>event</th><th>what</th></tr></thead><tbody></tbody></table>
<script>
"use strict";
const HEARTBEAT_STALE_S = 6;  // 3 heartbeat intervals (train/heartbeat.h: 2 s)

function text(s) { return document.createTextNode(s === null || s === undefined ? "" : String(s)); }
function el(tag, attrs, children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children || []) e.appendChild(typeof c === "string" ? text(c) : c);
  return e;
}
function fmt(x, digits) { return x === null || x === undefined ? "–" : Number(x).toFixed(digits); }

function drawJob(job, ranks) {
  const d = document.getElementById("job");
  d.replaceChildren();
  const l = job.layout;
  const parts = [
    ["state", job.state],
    ["attempt", job.attempt + " (" + job.restarts + " restart" + (job.restarts === 1 ? "" : "s") + ")"],
    ["layout", l ? "dp" + l.dp + " × pp" + l.pp + " × tp" + l.tp : "–"],
    ["ranks", job.world + " on " + job.nodes + " node" + (job.nodes === 1 ? "" : "s")],
    ["step", job.step ? job.step.min + (job.step.max !== job.step.min ? "–" + job.step.max : "") : "–"],
    ["up", fmt(job.uptime_s, 0) + " s"],
  ];
  const mfu = ranks.map(r => r.mfu).filter(x => x !== null);
  if (mfu.length) parts.push(["MFU", (100 * mfu[0]).toFixed(1) + "%"]);
  const tps = ranks.map(r => r.tokens_per_s).filter(x => x !== null);
  if (tps.length) parts.push(["tokens/s", Math.round(tps[0]).toLocaleString("en")]);
  // The kept steps' time over the time since launch: what faults and overheads have cost so far.
  if (job.effective_training !== null && job.useful_s > 0)
    parts.push(["effective training", (100 * job.effective_training).toFixed(1) + "%"]);
  for (const [k, v] of parts) d.appendChild(el("span", {id: "job-" + k.replace(/\W/g, "")}, [k + ": ", el("b", {}, [v])]));
  if (job.detail) d.appendChild(el("div", {id: "detail"}, [job.detail]));
}

function rankCell(r, newest) {
  let state = "ok";
  if (!r.running || (r.age_s !== null && r.age_s > HEARTBEAT_STALE_S)) state = "bad";
  else if (r.step < newest) state = "behind";
  const lines = [el("b", {}, ["rank " + r.rank]), el("br"), "step " + r.step, el("br"), r.phase || "–"];
  for (const c of r.in_flight) lines.push(el("div", {class: "coll"}, [c.op + " " + c.group + " #" + c.seq]));
  const cell = el("div", {class: "rank" + (state === "ok" ? "" : " " + state), "data-rank": r.rank,
                          "data-step": r.step, "data-state": state,
                          title: "node " + r.node + ", heartbeat " + fmt(r.age_s, 1) + " s ago, step time " +
                                 fmt(r.step_time, 3) + " s, compute " + fmt(r.compute_time, 3) + " s, loss " +
                                 fmt(r.loss, 4)}, lines);
  return cell;
}

function drawGrid(job, ranks) {
  const g = document.getElementById("grid");
  g.replaceChildren();
  const newest = ranks.reduce((m, r) => Math.max(m, r.step), 0);
  const placed = ranks.filter(r => r.coord), loose = ranks.filter(r => !r.coord);
  const pp = Math.max(0, ...placed.map(r => r.coord[1] + 1));
  for (let s = 0; s < pp; ++s) {
    const stage = el("div", {class: "stage", "data-stage": s}, [el("h2", {}, ["stage pp" + s])]);
    const dps = [...new Set(placed.filter(r => r.coord[1] === s).map(r => r.coord[0]))].sort((a, b) => a - b);
    for (const dp of dps) {
      const row = el("div", {class: "row"}, []);
      row.appendChild(el("span", {style: "width:36px;font-size:11px"}, ["dp" + dp]));
      placed.filter(r => r.coord[1] === s && r.coord[0] === dp).sort((a, b) => a.coord[2] - b.coord[2])
            .forEach(r => row.appendChild(rankCell(r, newest)));
      stage.appendChild(row);
    }
    g.appendChild(stage);
  }
  if (loose.length) {  // ranks that have not said where they are (still starting)
    const stage = el("div", {class: "stage"}, [el("h2", {}, ["starting"])]);
    const row = el("div", {class: "row"}, []);
    loose.forEach(r => row.appendChild(rankCell(r, newest)));
    stage.appendChild(row);
    g.appendChild(stage);
  }
}

function drawSeries(id, series) {  // series: [{points: [[x, y]], color}]
  const svg = document.getElementById(id);
  svg.replaceChildren();
  const pts = series.flatMap(s => s.points);
  if (pts.length < 2) return;
  const W = svg.width.baseVal.value, H = svg.height.baseVal.value, pad = 34;
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => pad + (W - pad - 6) * (x - x0) / Math.max(1e-12, x1 - x0);
  const sy = y => H - 16 - (H - 26) * (y - y0) / Math.max(1e-12, y1 - y0);
  const ns = "http://www.w3.org/2000/svg";
  for (const s of series) {
    const p = document.createElementNS(ns, "polyline");
    p.setAttribute("points", s.points.map(q => sx(q[0]).toFixed(1) + "," + sy(q[1]).toFixed(1)).join(" "));
    p.setAttribute("fill", "none");
    p.setAttribute("stroke", s.color);
    svg.appendChild(p);
  }
  const label = (x, y, t) => { const e = document.createElementNS(ns, "text"); e.setAttribute("x", x);
    e.setAttribute("y", y); e.setAttribute("font-size", "10"); e.textContent = t; svg.appendChild(e); };
  label(2, 12, y1.toPrecision(4)); label(2, H - 18, y0.toPrecision(4));
  label(pad, H - 3, "step " + x0); label(W - 60, H - 3, "step " + x1);
}

function drawCharts(history) {
  const attempt = history.length ? history[history.length - 1].attempt : 0;
  const h = history.filter(p => p.attempt === attempt);
  drawSeries("loss", [{points: h.filter(p => p.loss !== null).map(p => [p.step, p.loss]), color: "#2a6"}]);
  drawSeries("steptime", [{points: h.map(p => [p.step, p.slowest]), color: "#c33"},
                          {points: h.map(p => [p.step, p.fastest]), color: "#36c"}]);
}

function drawEvents(events) {
  const body = document.querySelector("#events tbody");
  body.replaceChildren();
  for (const e of events.slice(-20).reverse()) {
    const rest = Object.assign({}, e);
    for (const k of ["t", "event", "attempt", "node"]) delete rest[k];
    body.appendChild(el("tr", {}, [el("td", {}, [new Date(e.t * 1000).toLocaleTimeString("en-GB")]),
                                   el("td", {}, [e.event]), el("td", {}, [JSON.stringify(rest)])]));
  }
}

async function refresh() {
  try {
    // The page's own query (?token=...) goes with each fetch: a dashboard with a token wants it on every request.
    const r = await fetch("/api/job" + location.search, {cache: "no-store"});
    if (r.status === 401) {
      document.getElementById("job").replaceChildren(
          text("this dashboard needs its token: open it as /?token=TOKEN (launch --dashboard-token-file)"));
      return;
    }
    const d = await r.json();
    drawJob(d.job, d.ranks);
    drawGrid(d.job, d.ranks);
    drawCharts(d.history);
    drawEvents(d.events);
  } catch (err) {
    document.getElementById("job").replaceChildren(text("the supervisor does not answer (" + err + ")"));
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";

}  // namespace mt::launch
