// The live page of an offbroadway daemon: draws the state /api/events pushes (server-sent
// events: every second, and at once when the supervision tree changes).  Rates (messages
// per second per stage and per subscription, CPU %) are differences between two states at
// least RATE_WINDOW seconds apart, so a burst of pushes around a crash does not make them
// jump.  No library, nothing fetched from anywhere but this daemon.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const NODE_W = 168, NODE_H = 78, COL_GAP = 104, ROW_GAP = 14, PAD = 14, TITLE_H = 22;
const LABEL_W = 70, PORT_H = 13;   // the subscription labels left of a stage
const RATE_WINDOW = 2.9;   // seconds: stages report once a second, a shorter window aliases
const KEEP_SAMPLES = 8;    // seconds of samples kept for rates

const samples = [];        // [{t, counts: {key: number}}], oldest first

function $(id) { return document.getElementById(id); }

function el(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function html(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  if (Math.abs(n) >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (Math.abs(n) >= 1e7) return (n / 1e6).toFixed(1) + "M";
  return Math.round(n).toLocaleString("en-US");
}

function rate(r) {
  if (r === null || r === undefined) return "–";
  if (r >= 1e6) return (r / 1e6).toFixed(2) + "M";
  if (r >= 1e4) return (r / 1e3).toFixed(1) + "k";
  if (r >= 100) return Math.round(r).toString();
  return r.toFixed(r >= 10 ? 0 : 1);
}

// a count in a node's narrow box: 9,876 / 98.8k / 9.88M
function short(n) {
  if (typeof n !== "number") return "–";
  if (n < 10000) return String(n);
  if (n < 1e6) return (n / 1e3).toFixed(n < 1e5 ? 1 : 0) + "k";
  return (n / 1e6).toFixed(n < 1e8 ? 2 : 0) + "M";
}

function mib(b) { return b ? (b / 1048576).toFixed(1) + "M" : "–"; }

function duration(s) {
  s = Math.max(0, Math.floor(s));
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600),
        m = Math.floor(s % 3600 / 60), r = s % 60;
  if (d) return `${d}d${String(h).padStart(2, "0")}h`;
  if (h) return `${h}h${String(m).padStart(2, "0")}m`;
  if (m) return `${m}m${String(r).padStart(2, "0")}s`;
  return `${r}s`;
}

function clock(epoch) {
  return new Date(epoch * 1000).toLocaleTimeString("en-GB", {hour12: false});
}

// -- rates -----------------------------------------------------------------------------
function record(t, counts) {
  samples.push({t, counts});
  while (samples.length > 2 && t - samples[0].t > KEEP_SAMPLES) samples.shift();
}

// per second between the newest sample and the newest one at least RATE_WINDOW older;
// null when there is none yet.  A counter that went back belongs to a stage that
// restarted within the window: what it counted since is a (slight) underestimate
function rateOf(key) {
  const now = samples[samples.length - 1];
  let base = null;
  for (let i = samples.length - 2; i >= 0; i--) {
    if (now.t - samples[i].t >= RATE_WINDOW) { base = samples[i]; break; }
  }
  if (!base) return null;
  const a = base.counts[key], b = now.counts[key];
  if (typeof a !== "number" || typeof b !== "number") return null;
  return (b < a ? b : b - a) / (now.t - base.t);
}

// -- the state -------------------------------------------------------------------------
function index(tree) {
  const byId = {}, parents = {};
  (function walk(n) {
    byId[n.id] = n;
    for (const c of n.children || []) { parents[c.id] = n; walk(c); }
  })(tree);
  return [byId, parents];
}

function counts(state, byId) {
  const c = {};
  for (const [id, n] of Object.entries(byId)) {
    const m = n.messages || {};
    if (typeof m.out === "number") c["out:" + id] = m.out;
    if (typeof m.in === "number") c["in:" + id] = m.in;
    if (typeof n.cpu_seconds === "number") c["cpu:" + id + ":" + n.pid] = n.cpu_seconds;
  }
  for (const e of state.edges) {
    if (typeof e.count === "number") c["edge:" + e.from + ">" + e.to] = e.count;
  }
  c["fetched"] = state.totals.fetched;
  c["acked"] = state.totals.acked;
  return c;
}

// what is wrong with a worker, if anything: [class, the state to show].  A stage on its
// way back up is "restarting" whatever step it is at (its supervisor's restart stopped
// it, or it is starting again after a crash); the supervisors' own states are the table's
function trouble(n, state, parents) {
  const m = n.messages || {};
  const limit = state.limits[n.id];
  const age = state.ages[n.id];
  const st = state.status;
  if (n.state === "restarting" || (n.state === "starting" && n.restarts > 0)) {
    return ["warn", "restarting"];
  }
  if (n.state === "starting") return ["warn", "starting"];
  if (n.state !== "running") {
    let up = parents[n.id];
    while (up && !st.stopping) {
      if (["restarting", "starting"].includes(up.state)) return ["warn", "restarting"];
      up = parents[up.id];
    }
    return ["bad", n.state];
  }
  if (limit && n.rss_bytes && n.rss_bytes > limit) return ["bad", "over memory"];
  if (m.source_connected === 0) return ["warn", "no-source"];
  if (typeof age === "number" && age > state.silent_after) return ["silent", "silent"];
  return ["ok", "running"];
}

// -- drawing ---------------------------------------------------------------------------
function layout(state) {
  // x per column; y per node: batch processors stacked by batcher, each batcher and
  // committer at the middle of its batch processors, other columns centred
  const cols = state.columns;
  const pos = {};
  const heights = cols.map(c => c.ids.length * (NODE_H + ROW_GAP) - ROW_GAP);
  const inner = Math.max(...heights, NODE_H);
  cols.forEach((c, i) => {
    const x = PAD + i * (NODE_W + COL_GAP);
    const top = PAD + TITLE_H + (inner - heights[i]) / 2;
    c.ids.forEach((id, j) => { pos[id] = {x, y: top + j * (NODE_H + ROW_GAP)}; });
  });
  const groups = {};
  for (const e of state.edges) {
    if (e.to.startsWith("batch_processor_")) (groups[e.from] = groups[e.from] || []).push(e.to);
  }
  for (const [batcher, bps] of Object.entries(groups)) {
    const ys = bps.filter(b => pos[b]).map(b => pos[b].y);
    if (!ys.length) continue;
    const mid = ys.reduce((a, b) => a + b, 0) / ys.length;
    const key = batcher.replace(/^batcher_/, "");
    for (const id of [batcher, "committer_" + key]) if (pos[id]) pos[id].y = mid;
  }
  let bottom = PAD + TITLE_H + inner;
  if (state.spark && pos[state.spark]) {
    // the Spark server under the lowest committer, its edges coming down to it
    const above = Object.entries(pos).filter(([id, p]) => id !== state.spark &&
                                             p.x === pos[state.spark].x).map(([, p]) => p.y);
    pos[state.spark].y = Math.max(...above, PAD + TITLE_H - NODE_H) + NODE_H + 2.5 * ROW_GAP;
    bottom = Math.max(bottom, pos[state.spark].y + NODE_H);
  }
  const width = PAD * 2 + cols.length * NODE_W + (cols.length - 1) * COL_GAP;
  return {pos, width, height: bottom + PAD};
}

function drawGraph(state, byId, parents) {
  const svg = $("graph");
  const {pos, width, height} = layout(state);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.style.maxWidth = Math.round(width * 1.3) + "px";
  svg.replaceChildren();
  state.columns.forEach((c, i) => {
    svg.appendChild(el("text", {x: PAD + i * (NODE_W + COL_GAP), y: PAD + 10,
                                 class: "col-title"}, c.title));
  });
  // edges first, under the nodes.  Each stage's subscriptions end at ports down its
  // left side, one per upstream, labelled there with the subscription's rate and the
  // demand outstanding on it (GenStage's picture), so labels never sit on a crossing
  const into = {};
  for (const e of state.edges) (into[e.to] = into[e.to] || []).push(e);
  const labels = [];
  for (const list of Object.values(into)) {
    list.forEach((e, k) => {
      const a = pos[e.from], b = pos[e.to];
      if (!a || !b) return;
      if (a.x === b.x) { labels.push(...drawDown(svg, e, a, b, k, list.length)); return; }
      const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x;
      const y2 = b.y + NODE_H / 2 + (k - (list.length - 1) / 2) * PORT_H;
      const dx = Math.max(20, (x2 - LABEL_W - x1) / 2);
      const r = rateOf("edge:" + e.from + ">" + e.to);
      const unit = e.unit === "batches" ? " b" : "";
      const demand = e.demand === null || e.demand === undefined ? "" : ` d${e.demand}`;
      const text = `${rate(r)}${unit}/s${demand}`;
      const path = el("path", {d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - LABEL_W - dx},${y2} ` +
                                  `${x2 - LABEL_W},${y2} L${x2},${y2}`,
                               class: "edge" + (r ? " busy" : ""),
                               "data-from": e.from, "data-to": e.to});
      const why = `${e.from} → ${e.to}: ${rate(r)} ${e.unit}/s` +
                  (demand ? `, demand outstanding ${e.demand}` : "");
      path.appendChild(el("title", {}, why));
      svg.appendChild(path);
      const label = el("text", {x: x2 - 3, y: y2 - 2, "text-anchor": "end", class: "edge-label",
                                "data-from": e.from, "data-to": e.to,
                                "data-rate": r === null ? "" : r.toFixed(3),
                                "data-demand": e.demand ?? ""}, text);
      label.appendChild(el("title", {}, why));
      labels.push(label);
    });
  }
  labels.forEach(l => svg.appendChild(l));
  for (const c of state.columns) {
    for (const id of c.ids) {
      const n = byId[id], p = pos[id];
      if (!n || !p) continue;
      svg.appendChild(drawNode(n, p, state, parents));
    }
  }
}

// an edge within a column (a committer to the Spark server below it): straight down,
// labelled beside its end
function drawDown(svg, e, a, b, k, count) {
  const x = b.x + NODE_W / 2 + (k - (count - 1) / 2) * 10;
  const r = rateOf("edge:" + e.from + ">" + e.to);
  const text = `${rate(r)} ${e.unit}/s`;
  const path = el("path", {d: `M${a.x + NODE_W / 2},${a.y + NODE_H} L${x},${b.y}`,
                           class: "edge" + (r ? " busy" : ""),
                           "data-from": e.from, "data-to": e.to});
  path.appendChild(el("title", {}, `${e.from} → ${e.to}: ${text}`));
  svg.appendChild(path);
  return [el("text", {x: x + 4, y: b.y - 4, class: "edge-label", "data-from": e.from,
                      "data-to": e.to, "data-rate": r === null ? "" : r.toFixed(3),
                      "data-demand": ""}, text)];
}

function drawNode(n, p, state, parents) {
  const [cls, shown] = trouble(n, state, parents);
  const m = n.messages || {};
  const g = el("g", {class: "node " + cls, transform: `translate(${p.x},${p.y})`,
                     "data-id": n.id, "data-state": shown, "data-restarts": n.restarts,
                     "data-pid": n.pid ?? ""});
  g.appendChild(el("rect", {width: NODE_W, height: NODE_H, rx: 5}));
  const idText = el("text", {x: 8, y: 15, class: "id"}, n.id);
  if (n.id.length > 22) {   // a long id is squeezed into the box rather than cut
    idText.setAttribute("textLength", NODE_W - 14);
    idText.setAttribute("lengthAdjust", "spacingAndGlyphs");
  }
  g.appendChild(idText);
  const line2 = el("text", {x: 8, y: 29});
  line2.appendChild(el("tspan", {class: "state"}, shown));
  line2.appendChild(el("tspan", {class: "dim"}, `  pid ${n.pid ?? "–"}`));
  g.appendChild(line2);
  const cpuKey = "cpu:" + n.id + ":" + n.pid;
  const cpu = rateOf(cpuKey);
  const limit = state.limits[n.id];
  const mem = mib(n.rss_bytes) + (limit ? "/" + mib(limit) : "");
  g.appendChild(el("text", {x: 8, y: 43, class: "usage"},
                   `rst ${n.restarts} · ${mem} · ${cpu === null ? "–" : Math.round(cpu * 100)}% cpu`));
  const out = rateOf("out:" + n.id);
  g.appendChild(el("text", {x: 8, y: 57, class: "flow", "data-out": m.out ?? ""},
                   n.messages ? `${rate(out)}/s · ${short(m.out)} out`
                              : (n.id === state.spark ? "Spark Connect server (JVM)" : "")));
  let held = "";
  if (typeof m.inflight === "number") held = `${short(m.inflight)} in flight`;
  else if (typeof m.buffered === "number") held = `${short(m.buffered)} buffered`;
  else if (typeof m.waiting_rows === "number") held = `${short(m.waiting_rows)} rows waiting`;
  if (m.failed) held += (held ? " · " : "") + `${short(m.failed)} failed`;
  g.appendChild(el("text", {x: 8, y: 71, class: "dim"}, held));
  const title = [`${n.id}: ${shown}`];
  if (typeof state.ages[n.id] === "number") title.push(`last report ${state.ages[n.id]}s ago`);
  if (m.failed) title.push(`failed ${m.failed}`);
  g.appendChild(el("title", {}, title.join("\n")));
  return g;
}

function card(k, v, s, bad) {
  const c = html("div", {class: "card" + (bad ? " bad" : ""), "data-key": k});
  c.appendChild(html("div", {class: "k"}, k));
  c.appendChild(html("div", {class: "v"}, v));
  c.appendChild(html("div", {class: "s"}, s || "\u00a0"));
  return c;
}

function drawTotals(state) {
  const t = state.totals, st = state.status;
  const rl = st.rate_limit || {};
  const lc = t.last_commit;
  const cards = [
    card("fetched", num(t.fetched), rate(rateOf("fetched")) + "/s"),
    card("acked", num(t.acked), rate(rateOf("acked")) + "/s"),
    card("failed", num(t.failed), "", t.failed > 0),
    card("in flight", num(t.inflight), ""),
    card("dead letters", num(t.dead_letters), t.dead_letters_to, t.dead_letters > 0),
    card("poison strikes", num(t.poison_strikes),
         t.poison_failed ? `${num(t.poison_failed)} failed as poison` : "", t.poison_strikes > 0),
  ];
  if (t.commits !== null) {
    cards.push(card("Spark commits", num(t.commits),
                    lc ? `last ${duration(lc.age)} ago · ${num(lc.rows)} rows · ${lc.seconds.toFixed(2)}s`
                       : "none yet", t.commit_failures > 0));
  }
  cards.push(card("rate limit",
                  rl.allowed_messages == null ? "off" : `${num(rl.allowed_messages)}/${rl.interval}s`,
                  `throttled ${num(rl.throttled || 0)}`));
  $("totals").replaceChildren(...cards);
}

function drawHeader(state) {
  const st = state.status;
  $("pipeline").textContent = `${st.pipeline} · up ${duration(st.uptime)} · pid ${st.pid}`;
  const flags = [];
  for (const f of ["stopping", "draining", "paused"]) {
    if (st[f]) flags.push(html("span", {class: "warn"}, f));
  }
  for (const d of st.sources_down || []) flags.push(html("span", {class: "bad"}, "source down: " + d));
  for (const d of st.spark_down || []) flags.push(html("span", {class: "bad"}, "Spark " + d));
  if ((st.leaving || []).length) flags.push(html("span", {class: "warn"}, "leaving: " + st.leaving.join(", ")));
  $("flags").replaceChildren(...flags);
}

function drawTimeline(state) {
  const items = state.events.slice().reverse().map(ev => {
    const li = html("li", {class: ev.kind});
    li.appendChild(html("span", {class: "t"}, clock(ev.at)));
    li.appendChild(html("span", {class: "kind"}, ev.kind));
    li.appendChild(document.createTextNode(ev.what + " "));
    if (ev.reason) li.appendChild(html("span", {class: "reason"}, "— " + ev.reason));
    return li;
  });
  if (!items.length) items.push(html("li", {class: "empty"}, "nothing yet: no restart, crash or reload since the daemon started"));
  $("timeline").replaceChildren(...items);
}

function drawSupervisors(byId) {
  const rows = [html("tr")];
  for (const h of ["supervisor", "strategy", "state", "restarts"]) rows[0].appendChild(html("th", {}, h));
  for (const n of Object.values(byId)) {
    if (n.kind !== "supervisor" && n.id !== "terminator") continue;
    const cls = n.state === "running" ? "" : (["restarting", "starting", "stopping"].includes(n.state) ? "warn" : "bad");
    const tr = html("tr", {class: cls, "data-id": n.id});
    tr.appendChild(html("td", {}, n.id + (n.kind === "supervisor" ? "" : " (in the daemon)")));
    tr.appendChild(html("td", {}, n.strategy || "–"));
    tr.appendChild(html("td", {}, n.state));
    tr.appendChild(html("td", {class: "num"}, String(n.restarts)));
    rows.push(tr);
  }
  $("supervisors").replaceChildren(...rows);
}

function render(state) {
  const [byId, parents] = index(state.status.tree);
  record(state.now, counts(state, byId));
  drawHeader(state);
  drawTotals(state);
  drawGraph(state, byId, parents);
  drawTimeline(state);
  drawSupervisors(byId);
  document.body.dataset.updated = String(state.now);
  $("conn").textContent = "live · " + clock(state.now);
  $("conn").className = "conn";
}

function connect() {
  const source = new EventSource("/api/events");
  source.onmessage = ev => {
    try { render(JSON.parse(ev.data)); } catch (err) { console.error(err); }
  };
  source.onerror = () => {
    $("conn").textContent = "not connected: the daemon is not answering (retrying)";
    $("conn").className = "conn lost";
  };
}

connect();
