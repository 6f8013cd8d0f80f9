// The dashboard's one page (launch/dashboard.h serves it at /). Plain HTML, CSS and JavaScript, no libraries and
// nothing fetched from elsewhere: a training cluster's network often reaches nothing outside it. The page polls
// /api/job each second and redraws:
//  - the job line: state, attempt and restarts, layout, the steps of the slowest and fastest rank, uptime, and the
//    newest line worth reading (a hang's blame, why it restarts);
//  - the rank grid: one block per pipeline stage (pp), a row per data-parallel replica (dp), a cell per tensor-
//    parallel rank (tp), each with its rank, step and phase. A rank that is not running, or whose heartbeat is
//    older than 3 intervals, is red; one behind the job's newest step is amber; one with a collective in flight for
//    long shows the collective. Each cell carries data-rank, data-step and data-state for scripts and tests;
//  - the heat map of slow ranks (obs/heat_map.h): a row per rank in (dp, pp, tp) order, a column per recent step,
//    each cell the rank's compute time relative to the median over the ranks at that step, in the colours of
//    heat_colour; beside it the slowest ranks, named. Past 64 ranks on several nodes a row per node (its
//    hottest rank's value at each step) keeps it readable, and a click on a node opens its ranks beneath it (the
//    address keeps the opened nodes: /#open=3,64). Rows
//    carry data-rank (or data-node), data-mean and, on the hottest rank's, data-hottest="true";
//  - the loss, and the fastest and slowest rank's step time, over the steps (SVG);
//  - a MoE model's routing load (absent for a dense model): a row per MoE layer, a cell per expert with its share
//    of the layer's assignments at the newest step, coloured by that share over the even one (heat_colour's
//    scale: white when even, red at twice it, blue at half), then the busiest expert over the mean and the drops.
//    Cells carry data-layer, data-expert, data-tokens and data-share; rows data-max-over-mean and data-dropped;
//    the table data-step and data-rank;
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
  .sdc { background: #f2b1b1; padding: 6px; margin-bottom: 8px; font-weight: bold; }
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
  .heat { display: flex; gap: 16px; align-items: flex-start; margin-bottom: 16px; }
  .heat-node { cursor: pointer; }
  #slowest { margin: 0; font-size: 12px; }
  #moe table { margin: 0 0 16px 0; }
  td.moe-cell { text-align: right; min-width: 44px; }
  td, th { border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
</style>
</head>
<body>
<h1>megatrain</h1>
<div id="job">loading…</div>
<div id="grid" class="stages"></div>
<div>compute time relative to the median over the ranks at the same step (white: the median, red: twice it or more,
  blue: half); rows by (dp, pp, tp)<span id="heat-hint"></span></div>
<div class="heat"><svg id="heat" width="420" height="40"></svg>
  <div><b>slowest ranks</b> (mean × median)<ol id="slowest"></ol></div></div>
<div id="moe"></div>
<div class="charts">
  <div><div>loss</div><svg id="loss" width="420" height="160"></svg></div>
  <div><div>step time, fastest and slowest rank (s)</div><svg id="steptime" width="420" height="160"></svg></div>
</div>
<div id="sdc"></div>
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

const HEAT_RANK_ROWS = 64;  // beyond this many ranks (on several nodes), a row per node
// The nodes whose ranks are shown: a click on a node's row opens or closes it, and the page's address keeps them
// (#open=3,64), so a link to the page shows the same rows.
const heatOpen = new Set((location.hash.match(/^#open=([\d,]+)$/) || ["", ""])[1].split(",")
                                 .filter(x => x).map(Number));
let lastHeat = null;

function heatColour(rel) {  // obs/heat_map.cpp heat_colour: white at 1, blue at 0.5 and below, red at 2 and above
  const hot = rel >= 1, t = Math.min(1, Math.max(0, hot ? rel - 1 : (1 - rel) * 2));
  const to = hot ? [178, 24, 43] : [33, 102, 172];
  return "#" + to.map(c => Math.round(247 + (c - 247) * t).toString(16).padStart(2, "0")).join("");
}

function coordText(c) { return c ? " (dp " + c[0] + ", pp " + c[1] + ", tp " + c[2] + ")" : ""; }

function heatLines(h) {  // what to draw, top to bottom: rank rows, or node rows with the opened nodes' ranks
  const byNode = h.rows.length > HEAT_RANK_ROWS && h.nodes.length > 1;
  document.getElementById("heat-hint").textContent = byNode ? "; a row per node (its hottest rank), click to open" : "";
  if (!byNode) return h.rows.map(r => ({rank: r}));
  const lines = [];
  for (const n of h.nodes) {
    lines.push({node: n});
    if (heatOpen.has(n.node)) h.rows.filter(r => r.node === n.node).forEach(r => lines.push({rank: r, inner: true}));
  }
  return lines;
}

function drawHeat(h) {
  lastHeat = h;
  const svg = document.getElementById("heat"), ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const lines = heatLines(h), hottest = h.slowest.length ? h.slowest[0].rank : null;
  const rowH = 14, left = 190, colW = Math.max(4, Math.min(18, 600 / Math.max(1, h.steps.length)));
  svg.setAttribute("width", left + colW * h.steps.length + 8);
  svg.setAttribute("height", rowH * lines.length + 20);
  const add = (parent, tag, attrs, body) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (body !== undefined) e.textContent = body;
    parent.appendChild(e);
    return e;
  };
  lines.forEach((l, i) => {
    const y = rowH * i, r = l.rank, n = l.node;
    const g = r ? add(svg, "g", {class: "heat-row", "data-rank": r.rank, "data-node": r.node, "data-mean": r.mean})
                : add(svg, "g", {class: "heat-node", "data-node": n.node, "data-mean": n.mean,
                                 "data-hottest-rank": n.hottest_rank === null ? "" : n.hottest_rank});
    if (r && r.rank === hottest) g.setAttribute("data-hottest", "true");
    const label = r ? (l.inner ? "   " : "") + "rank " + r.rank + coordText(r.coord)
                    : (heatOpen.has(n.node) ? "▾" : "▸") + " node " + n.node + " (" + n.ranks.length + " ranks)";
    add(g, "text", {x: 2, y: y + rowH - 3, "font-size": 11}, label);
    const name = r ? "rank " + r.rank : "node " + n.node + " (hottest rank " + n.hottest_rank + ")";
    (r ? r.rel : n.rel).forEach((x, c) => {
      if (x === null) return;
      const cell = add(g, "rect", {x: left + colW * c, y: y, width: colW, height: rowH - 1, fill: heatColour(x)});
      add(cell, "title", {}, name + ", step " + h.steps[c] + ": " + x.toFixed(2) + " × median");
    });
    if (n) g.addEventListener("click", () => {
      heatOpen.has(n.node) ? heatOpen.delete(n.node) : heatOpen.add(n.node);
      history.replaceState(null, "", heatOpen.size ? "#open=" + [...heatOpen].join(",") : location.pathname + location.search);
      drawHeat(lastHeat);
    });
  });
  if (h.steps.length) {
    add(svg, "text", {x: left, y: rowH * lines.length + 14, "font-size": 10}, "step " + h.steps[0]);
    add(svg, "text", {x: left + colW * h.steps.length, y: rowH * lines.length + 14, "font-size": 10,
                      "text-anchor": "end"}, "step " + h.steps[h.steps.length - 1]);
  }
  const list = document.getElementById("slowest");
  list.replaceChildren();
  for (const s of h.slowest)
    list.appendChild(el("li", {"data-rank": s.rank, "data-mean": s.mean},
                        ["rank " + s.rank + coordText(s.coord) + ", node " + s.node + ": " + s.mean.toFixed(2) + "×"]));
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

// Each silent data corruption of the job, however old: which rank, where, and whether it was transient.
function drawSdc(sdc) {
  const box = document.getElementById("sdc");
  box.replaceChildren();
  for (const f of sdc || []) {
    const kind = f.transient ? "transient: its step did not reproduce on a rerun"
        : f.reason === "sdc_culprit" ? "its result did not reproduce when the step was rerun"
        : "its parameters differ from its replicas'";
    box.appendChild(el("div", {class: "sdc"}, [text(
        `silent data corruption: rank ${f.rank} (node ${f.node}) at step ${f.step}` +
        (f.tensor ? `, tensor ${f.tensor}` : "") + `, ${kind}; attempt ${f.attempt}`)]));
  }
}

// A MoE model's routing load at the newest step: a row per MoE layer, each expert's share of the layer's
// assignments (coloured by share x experts: white when even), the busiest expert over the mean, and the drops.
function drawMoe(moe) {
  const box = document.getElementById("moe");
  box.replaceChildren();
  if (!moe) return;  // a dense model
  const experts = Math.max(0, ...moe.layers.map(l => l.share.length));
  const head = [el("th", {}, ["layer"])];
  for (let e = 0; e < experts; ++e) head.push(el("th", {}, ["e" + e]));
  head.push(el("th", {}, ["max / mean"]), el("th", {}, ["dropped"]));
  const rows = moe.layers.map(l => el("tr", {class: "moe-layer", "data-layer": l.layer,
      "data-max-over-mean": l.max_over_mean === null ? "" : String(l.max_over_mean), "data-dropped": l.dropped}, [
    el("td", {}, ["layer " + l.layer]),
    ...l.share.map((x, e) => el("td", {class: "moe-cell", "data-layer": l.layer, "data-expert": e,
        "data-tokens": l.tokens_per_expert[e], "data-share": String(x),
        style: "background:" + heatColour(x * l.share.length),
        title: "layer " + l.layer + ", expert " + e + ": " + l.tokens_per_expert[e] + " of " + l.routed +
               " assignments"}, [(100 * x).toFixed(1) + "%"])),
    el("td", {}, [fmt(l.max_over_mean, 2) + "×"]), el("td", {}, [String(l.dropped)])]));
  box.appendChild(el("div", {}, ["experts' share of each MoE layer's assignments at step " + moe.step + " (rank " +
                                 moe.rank + "; white: an even share, red: twice it, blue: half)"]));
  box.appendChild(el("table", {id: "moe-table", "data-step": moe.step, "data-rank": moe.rank},
                     [el("thead", {}, [el("tr", {}, head)]), el("tbody", {}, rows)]));
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
    drawHeat(d.heatmap);
    drawCharts(d.history);
    drawEvents(d.events);
    drawSdc(d.sdc);
    drawMoe(d.moe);
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
