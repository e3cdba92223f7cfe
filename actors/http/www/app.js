// The rtd dashboard: live node figures from the SSE stream /api/v1/stream/top, and the
// clients, rules and sinks from the API (/api/v1/..., the admin commands' JSON). The API key
// stays in sessionStorage, so it is gone when the tab closes. Every API failure is shown in
// the page's error box: nothing is left to the console.
"use strict";

const KEY_ITEM = "rtd.apiKey";
const HISTORY = 120;         // points per chart: two minutes at one sample a second
const REFRESH_MS = 5000;     // clients, rules and sinks are polled; the node is streamed
const STREAM_RETRY_MS = 3000;
const COLORS = ["#2563eb", "#d97706", "#059669", "#7c3aed", "#db2777", "#0891b2", "#65a30d",
                "#dc2626"];

const $ = (id) => document.getElementById(id);
const dash = {               // the page's state; window.rtdash lets a test read it
  key: sessionStorage.getItem(KEY_ITEM) || "",
  samples: [],               // {in, out, conns, sessions, scheds: [utilisation]} per event
  memory: null,              // {rss, bars: [{name, bytes, what}]} from the last vm
  counts: [],                // {t, counters}: the refusal and drop totals of each poll
  refusals: [],              // {auth, acl} per minute at each poll (the chart's points)
  perMinute: null,           // the last poll's figures over the last minute, by counter
  actors: [],
  sortKey: "reductions_delta",
  serverSort: "reductions",
  stream: null,              // the stream's AbortController
  prefix: "",
  errors: [],
};
window.rtdash = dash;

/* ---- Errors: one box at the top, one line per failing source ---- */

const failing = new Map();   // source -> message
function setError(source, msg) {
  if (msg) failing.set(source, msg); else failing.delete(source);
  const box = $("error");
  box.hidden = failing.size === 0;
  box.textContent = [...failing.values()].join("\n");
  dash.errors = [...failing.values()];
}

function fmtBytes(n) {
  if (n == null) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 1 : 0) : n) + " " + u[i];
}
const fmtNum = (n) => n == null ? "-" : (Math.abs(n) >= 100 || Number.isInteger(n) ?
  Math.round(n).toLocaleString("en") : n.toFixed(1));
function fmtUptime(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : `${m}m ${s % 60}s`;
}

/* ---- The API ---- */

function authHeaders() { return { Authorization: "Bearer " + dash.key }; }

// One API call: its parsed JSON, or null with the reason shown under `source`.
async function api(source, path, method = "GET") {
  if (!dash.key) { setError("key", "Enter an API key (rtd apikey NAME read|admin)."); return null; }
  let r;
  try {
    r = await fetch("/api/v1/" + path, { method, headers: authHeaders(), cache: "no-store" });
  } catch (e) {
    setError(source, `${source}: rtd cannot be reached (${e.message})`);
    return null;
  }
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    setError(source, `${source}: ${r.status} ${explain(r.status)}` +
      (body && body.error ? ` - ${body.error}` : ""));
    return null;
  }
  setError(source, null);
  return body;
}

function explain(status) {
  return status === 400 ? "bad request" :
    status === 401 ? "the API key is missing or unknown" :
    status === 403 ? "this key's role may not do that (admin role needed)" :
    status === 404 ? "not found" :
    status === 503 ? "rtd cannot do it now" : "error";
}

// A refused request's status, what it means and the reason in its JSON body.
async function refusal(r) {
  let why = "";
  try { why = (await r.json()).error; } catch (e) { why = ""; }
  return `${r.status} ${explain(r.status)}${why ? " - " + why : ""}`;
}

// Reads a text/event-stream body (parsed by hand) until it ends; each chunk's events,
// [{event, data}], go to onEvents (an empty list for a chunk of comments: `: alive`).
async function readEvents(r, onEvents) {
  const reader = r.body.getReader();
  const text = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += text.decode(value, { stream: true });
    const events = [];
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let event = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trimStart();
      }
      if (data) events.push({ event, data });
    }
    onEvents(events);
  }
}

// An element; attrs.style is an object of CSS properties, set through the CSSOM: the page's
// Content-Security-Policy (style-src 'self') refuses style attributes, not the CSSOM.
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "style") Object.assign(e.style, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : String(k ?? ""));
  return e;
}
const td = (v, cls) => el("td", cls ? { class: cls } : {}, v);

// Each body cell's data-label is its column's header: a narrow screen shows rows as cards of
// "label value" lines (app.css), so no column needs a horizontal scrollbar.
function labelCells(table, rows = table.tBodies[0].rows) {
  const heads = [...table.tHead.rows[0].cells].map((c) => c.textContent);
  for (const row of rows)
    if (row.cells.length === heads.length)
      [...row.cells].forEach((c, i) => { c.dataset.label = heads[i]; });
}

/* ---- Charts: hand-drawn on canvas, sized to their box and the screen's pixel ratio ---- */

function prepare(canvas) {
  const ratio = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * ratio) || canvas.height !== Math.round(h * ratio)) {
    canvas.width = Math.round(w * ratio);
    canvas.height = Math.round(h * ratio);
  }
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, w, h);
  g.font = "11px system-ui, sans-serif";
  return { g, w, h };
}

// The axis top: 1, 2 or 5 times a power of ten, at least v (so the ticks read well).
function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map((m) => m * p).find((x) => x >= v);
}

// Lines over the last HISTORY samples; the y axis runs from 0 to the highest value (or max).
function drawLines(canvas, lines, max, fmt) {
  const { g, w, h } = prepare(canvas);
  const top = max || niceCeil(Math.max(...lines.flatMap((l) => l.values), 1));
  const pad = { l: 44, r: 6, t: 8, b: 6 };
  const x = (i) => pad.l + (w - pad.l - pad.r) * i / (HISTORY - 1);
  const y = (v) => h - pad.b - (h - pad.t - pad.b) * v / top;
  g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280"; g.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    g.beginPath(); g.moveTo(pad.l, y(top * f)); g.lineTo(w - pad.r, y(top * f)); g.stroke();
    g.fillText(fmt(top * f), 2, Math.min(h - 2, y(top * f) + 4));
  }
  g.lineWidth = 1.5;
  for (const l of lines) {
    const off = HISTORY - l.values.length;
    g.strokeStyle = l.color; g.beginPath();
    l.values.forEach((v, i) => (i ? g.lineTo : g.moveTo).call(g, x(off + i), y(v)));
    g.stroke();
  }
}

// Memory by kind: one bar per group of vm's memory_by_kind, whose kinds partition RSS (its
// "unexplained" is RSS less the others, read in the same answer), so the bars add up to RSS.
// A negative bar (counted but not resident) is drawn in red, its length its size.
function drawBars(canvas, bars, rss) {
  const { g, w, h } = prepare(canvas);
  const rows = bars.filter((b) => b.bytes !== 0);
  if (!rows.length) return;
  const most = Math.max(...rows.map((b) => Math.abs(b.bytes)));
  const bh = Math.max(10, Math.min(18, (h - 4) / rows.length - 2));
  rows.forEach((b, i) => {
    const yy = 2 + i * (bh + 2);
    if (yy + bh > h) return;
    g.fillStyle = b.bytes < 0 ? "#dc262655" : COLORS[i % COLORS.length] + "55";
    g.fillRect(2, yy, Math.max(1, (w - 4) * Math.abs(b.bytes) / most), bh);
    g.fillStyle = "#1d2330";
    g.fillText(`${b.name}  ${fmtBytesSigned(b.bytes)}  (${share(b.bytes, rss)} of RSS)`, 6,
      yy + bh - 4);
  });
}

const fmtBytesSigned = (n) => (n < 0 ? "-" : "") + fmtBytes(Math.abs(n));
const share = (v, rss) => (100 * v / Math.max(rss, 1)).toFixed(Math.abs(v) * 1000 < rss ? 2 : 1) +
  "%";

// The groups the chart shows, each vm kind in one (a kind rtd adds later gets a bar of its own).
const MEM_GROUPS = [
  ["actors: structs and heaps", (k) => k.startsWith("actors: "),
    "every actor's struct, state and heap (by type: Actors tab, `rtctl vm`)"],
  ["actors: charged", null,
    "what actors hold outside their heaps and are charged for: Lua states, SQLite, libbson, buffers"],
  ["binaries", (k) => k.startsWith("binaries"), "message payloads, each counted once, and the free memory pooled for the next"],
  ["runtime", (k) => k.startsWith("runtime: ") || k === "transports",
    "free slab, heap-chunk and socket-buffer memory, tables, message envelopes, sockets, schedulers, TLS states"],
  ["broker and rules", (k) => k.startsWith("broker: ") || k.startsWith("rules: "),
    "topic trie, retained index, rule sets, Lua states no worker holds"],
  ["libraries, no actor", (k) => k.startsWith("sqlite: ") || k.startsWith("libbson: "),
    "SQLite and libbson memory no actor is charged for, SQLite's WAL index"],
  ["allocator", (k) => k.startsWith("malloc: "),
    "malloc's in-use blocks nothing above names (OpenSSL's among them, per-block overhead) and its free memory"],
  ["thread stacks", (k) => k === "thread stacks", "pages the threads' stacks touched"],
  ["code and static data", (k) => k === "program and libraries",
    "the program and its libraries as mapped from files, their written data and .bss"],
  ["other (RSS - the rest)", (k) => k === "unexplained",
    "RSS (VmRSS) less every bar above, read in the same answer"],
];

// vm's memory_by_kind as the chart's bars: [{name, bytes, what}] adding up to mem.rss.
function memoryBars(mem) {
  const bars = MEM_GROUPS.map(([name, , what]) => ({ name, bytes: 0, what }));
  const charged = mem.actors.reduce((sum, a) => sum + a.ext, 0);
  for (const { kind, bytes, what } of mem.kinds) {
    const i = MEM_GROUPS.findIndex(([, match]) => match && match(kind));
    if (i >= 0) bars[i].bytes += bytes;
    else bars.splice(bars.length - 1, 0, { name: kind, bytes, what });
  }
  bars[0].bytes -= charged;
  bars[1].bytes += charged;
  return bars;
}

function renderMemory(mem) {
  const bars = memoryBars(mem);
  dash.memory = { rss: mem.rss, bars };
  $("fig-rss").textContent = fmtBytes(mem.rss);
  $("mem-table").tBodies[0].replaceChildren(...bars.map((b) =>
    el("tr", { class: b.bytes < 0 ? "neg" : "" }, td(b.name), td(fmtBytesSigned(b.bytes), "num"),
      td(share(b.bytes, mem.rss), "num"), td(b.what))),
  el("tr", {}, td("sum: RSS"), td(fmtBytes(bars.reduce((sum, b) => sum + b.bytes, 0)), "num"),
    td("100%", "num"), td("resident memory, as the kernel counts it")));
  labelCells($("mem-table"));
  drawCharts();
}

function drawCharts() {
  const s = dash.samples;
  drawLines($("chart-msgs"), [
    { values: s.map((p) => p.in), color: COLORS[0] },
    { values: s.map((p) => p.out), color: COLORS[1] }], 0, fmtNum);
  drawLines($("chart-conns"), [
    { values: s.map((p) => p.conns), color: COLORS[0] },
    { values: s.map((p) => p.sessions), color: COLORS[1] }], 0, fmtNum);
  const nsched = s.length ? s[s.length - 1].scheds.length : 0;
  drawLines($("chart-scheds"), [...Array(nsched).keys()].map((i) => ({
    values: s.map((p) => (p.scheds[i] || 0) * 100), color: COLORS[i % COLORS.length] })),
  100, (v) => v.toFixed(0) + "%");
  drawLines($("chart-refusals"), [
    { values: dash.refusals.map((p) => p.auth), color: COLORS[0] },
    { values: dash.refusals.map((p) => p.acl), color: COLORS[1] }], 0, fmtNum);
  if (dash.memory) drawBars($("chart-mem"), dash.memory.bars, dash.memory.rss);
}

/* ---- The live stream: fetch() and its body reader, since EventSource sends no headers ---- */

function onTop(top) {
  const n = top.node;
  dash.samples.push({ in: n.messages_in_per_s, out: n.messages_out_per_s, conns: n.connections,
    sessions: n.sessions, scheds: n.schedulers.map((x) => x.utilisation) });
  if (dash.samples.length > HISTORY) dash.samples.shift();
  $("node-info").textContent = `${n.version} - up ${fmtUptime(n.uptime_s)} - ${n.actors} actors`;
  $("fig-in").textContent = fmtNum(n.messages_in_per_s);
  $("fig-out").textContent = fmtNum(n.messages_out_per_s);
  $("fig-conns").textContent = fmtNum(n.connections);
  $("fig-sessions").textContent = fmtNum(n.sessions);
  $("fig-scheds").replaceChildren(...n.schedulers.map((x, i) => el("span",
    { style: { color: COLORS[i % COLORS.length] } }, `${x.kind[0]}${x.id} `,
    el("b", {}, (x.utilisation * 100).toFixed(0) + "%"))));
  dash.actors = top.actors;
  renderActors();
  drawCharts();
}

// Reads events until the stream ends or is aborted; a parse of the SSE lines by hand.
async function runStream() {
  if (dash.stream) dash.stream.abort();
  if (!dash.key) return;
  const ctl = new AbortController();
  dash.stream = ctl;
  const state = $("stream-state");
  try {
    const r = await fetch(`/api/v1/stream/top?n=20&every=1&sort=${dash.serverSort}`,
      { headers: authHeaders(), signal: ctl.signal, cache: "no-store" });
    if (!r.ok) {
      setError("live", `live figures: ${await refusal(r)}`);
      state.textContent = "stopped";
      if (r.status === 401 || r.status === 403) return; // a new key restarts it
      throw new Error("status " + r.status);
    }
    setError("live", null);
    state.textContent = "live";
    await readEvents(r, (events) => {
      for (const { event, data } of events) {
        if (event !== "top") continue;
        const top = JSON.parse(data);
        if (top.error) setError("live", "live figures: rtd could not answer top");
        else onTop(top);
      }
    });
    throw new Error("the stream ended");
  } catch (e) {
    if (ctl.signal.aborted) return;
    state.textContent = "reconnecting";
    if (e.name !== "AbortError" && !failing.has("live"))
      setError("live", `live figures: ${e.message}; retrying`);
    setTimeout(() => { if (dash.stream === ctl) runStream(); }, STREAM_RETRY_MS);
  }
}

/* ---- Busiest actors ---- */

function renderActors() {
  const k = dash.sortKey;
  const rows = [...dash.actors].sort((a, b) => typeof a[k] === "number" ? b[k] - a[k] :
    String(a[k]).localeCompare(String(b[k])));
  $("actors-table").tBodies[0].replaceChildren(...rows.map((a) => el("tr", {},
    td(a.pid), td(a.name || a.type), td(fmtNum(a.reductions_delta), "num"),
    td(fmtNum(a.reductions), "num"), td(fmtBytes(a.memory), "num"), td(fmtNum(a.mailbox), "num"),
    td(a.cpu_pct.toFixed(1), "num"), td((a.cpu_us / 1e6).toFixed(2) + " s", "num"),
    td(a.handler, "wrap"))));
  labelCells($("actors-table"));
  for (const th of $("actors-table").tHead.rows[0].cells)
    th.classList.toggle("sorted", th.dataset.key === k);
}

// A column with a server sort key also restarts the stream with it: the top 20 by that key.
$("actors-table").tHead.addEventListener("click", (ev) => {
  const th = ev.target.closest("th[data-key]");
  if (!th) return;
  dash.sortKey = th.dataset.key;
  renderActors();
  if (th.dataset.sort && th.dataset.sort !== dash.serverSort) {
    dash.serverSort = th.dataset.sort;
    runStream();
  }
});

/* ---- Packet trace: GET /api/v1/trace/client/ID or /trace/topic/FILTER (admin), an event
   stream of one JSON object per packet until its duration passes. Stop aborts the fetch: the
   connection closes and rtd ends the trace. The table keeps the last dash.traceMax rows. ---- */

const MQTT_VERSIONS = { 3: "3.1", 4: "3.1.1", 5: "5" };
dash.traceMax = 500;
dash.trace = null;           // {ctl, packets, dropped, cut, started, ended, state} of the last

function traceState(t, state) {
  t.state = state;
  $("trace-state").textContent = state;
  const on = state === "starting" || state.startsWith("tracing");
  $("trace-start").disabled = on;
  $("trace-stop").disabled = !on;
}

function traceInfo(t) {
  $("trace-info").textContent = `${t.packets} packet${t.packets === 1 ? "" : "s"}` +
    (t.dropped ? `, ${t.dropped} dropped` : "") +
    (t.cut ? `; the ${t.cut} oldest rows were cut (the last ${dash.traceMax} are kept)` : "");
}

const traceCols = () => $("trace-table").tHead.rows[0].cells.length;
const noteRow = (text, cls = "note") =>
  el("tr", { class: cls }, el("td", { colspan: traceCols() }, text));

// A cell for text that may be long (topics, payloads): cut to its box, whole in its title.
function longTd(text, ...kids) {
  const cell = el("td", { class: "long" }, ...kids, text);
  if (text) cell.setAttribute("title", text.length > 2000 ? text.slice(0, 2000) + "..." : text);
  return cell;
}

function packetRow(p) {
  let what = "", qos = "";
  if (p.type === "PUBLISH") {
    qos = `${p.qos}${p.retain ? " retain" : ""}${p.dup ? " dup" : ""}`;
    what = (p.topic ?? "") + (p.topic_alias ? " (alias)" : "");
  } else if (p.filters) {
    what = p.filters.map((f) => f.qos == null ? f.filter : `${f.filter} (qos ${f.qos})`)
      .join(", ");
  } else if (p.type === "CONNECT" && p.version != null) {
    what = `MQTT ${MQTT_VERSIONS[p.version] || p.version}, keepalive ${p.keepalive}` +
      (p.clean_start ? ", clean start" : "");
  } else if (p.type === "CONNACK") {
    what = p.session_present ? "session present" : "";
  }
  const rc = p.reason_codes ? p.reason_codes.join(",") : (p.reason_code ?? "");
  let shown = "";
  if (p.payload != null) shown = p.payload;
  else if (p.payload_hex != null) shown = "0x" + p.payload_hex;
  if (p.payload_truncated) shown += "...";
  const size = p.payload_size == null ? "" :
    el("span", { class: "muted" }, `${p.payload_size} B `);
  const out = p.dir === "out";
  return el("tr", { class: p.error ? "bad" : "", "data-type": p.type },
    el("td", { title: p.time || "" }, (p.time || "").slice(11, 23)),
    el("td", { class: "dir-" + p.dir, title: out ? "to the client" : "from the client" },
      out ? "\u2190" : "\u2192", el("span", { class: "dirword" }, out ? " out" : " in")),
    td(p.type), longTd(p.client),
    p.error ? longTd(what, el("span", { class: "bad" }, `error ${p.error} `)) : longTd(what),
    td(p.packet_id ?? "", "num"), td(qos), td(rc), td(p.size, "num"), longTd(shown, size));
}

// Whether the trace box follows the newest row: it does until the user scrolls up, and again
// once they scroll back to the bottom. Kept from scroll events, not read when rows come: a
// layout change (a narrower screen turns rows into taller cards) leaves the box where it was
// without the user having scrolled away.
dash.traceFollow = true;
$("trace-box").addEventListener("scroll", () => {
  const box = $("trace-box");
  dash.traceFollow = box.scrollTop + box.clientHeight >= box.scrollHeight - 8;
});

// One chunk's events: their rows added at once, the oldest cut past traceMax, and the box
// kept scrolled to the bottom unless the user scrolled up.
function onTrace(t, events) {
  if (dash.trace !== t) return;
  const box = $("trace-box"), body = $("trace-table").tBodies[0];
  const rows = [];
  for (const { event, data } of events) {
    if (event !== "trace") continue;
    const e = JSON.parse(data);
    if (e.event === "started") {
      t.started = e;
      t.until = Date.now() + e.duration * 1000;
      rows.push(noteRow(`tracing ${e.kind} "${e.what}" for ${e.duration} s` +
        (e.payload ? `, ${e.payload} payload bytes shown` : "")));
    } else if (e.event === "packet") {
      t.packets++;
      rows.push(packetRow(e));
    } else if (e.event === "dropped") {
      t.dropped = e.dropped_total;
      rows.push(noteRow(`dropped ${e.dropped} packets: this trace fell behind ` +
        `(${e.dropped_total} in all)`, "note drop"));
    } else if (e.event === "ended") {
      t.ended = e;
      t.dropped = e.dropped;
      rows.push(noteRow(`ended: ${e.events} packets sent, ${e.dropped} dropped`));
    }
  }
  if (rows.length) {
    labelCells($("trace-table"), rows);
    body.append(...rows);
    const over = body.rows.length - dash.traceMax;
    for (let i = 0; i < over; i++) body.deleteRow(0);
    if (over > 0) t.cut += over;
    if (dash.traceFollow) box.scrollTop = box.scrollHeight;
    traceInfo(t);
  }
  if (t.ended) traceState(t, "ended");
  else if (t.started)
    traceState(t, `tracing, ${Math.max(0, Math.round((t.until - Date.now()) / 1000))} s left`);
}

async function runTrace(kind, what, duration, payload) {
  if (!dash.key) { setError("key", "Enter an API key (rtd apikey NAME admin)."); return; }
  if (dash.trace) dash.trace.ctl.abort();
  const t = { ctl: new AbortController(), packets: 0, dropped: 0, cut: 0, started: null,
    ended: null, until: 0, state: "" };
  dash.trace = t;
  $("trace-table").tBodies[0].replaceChildren();
  $("trace-box").hidden = true;
  dash.traceFollow = true;
  traceInfo(t);
  traceState(t, "starting");
  try {
    const r = await fetch(`/api/v1/trace/${kind}/${encodeURIComponent(what)}` +
      `?duration=${duration}&payload=${payload}`,
    { headers: authHeaders(), signal: t.ctl.signal, cache: "no-store" });
    if (!r.ok) {
      setError("trace", `trace: ${await refusal(r)}`);
      traceState(t, "refused");
      return;
    }
    setError("trace", null);
    $("trace-box").hidden = false;
    await readEvents(r, (events) => onTrace(t, events));
    if (!t.ended) throw new Error("the stream ended before the trace did");
  } catch (e) {
    if (t.ctl.signal.aborted) return; // Stop, or a new trace
    setError("trace", `trace: ${e.message}`);
    traceState(t, "failed");
  }
}

function stopTrace() {
  const t = dash.trace;
  if (!t || t.ended || t.ctl.signal.aborted) return;
  t.ctl.abort();
  if (t.started) {
    $("trace-table").tBodies[0].append(noteRow("stopped"));
    const box = $("trace-box");
    box.scrollTop = box.scrollHeight;
  }
  traceState(t, "stopped");
}

$("trace-kind").addEventListener("change", () => {
  $("trace-what").placeholder = $("trace-kind").value === "client" ? "client id" :
    "topic filter (a/+/c, a/#)";
});
$("trace-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  runTrace($("trace-kind").value, $("trace-what").value, $("trace-duration").value,
    $("trace-payload").value);
});
$("trace-stop").addEventListener("click", stopTrace);

/* ---- Clients ---- */

/* The server pages the client table by id: the first 200 ids with the searched prefix. */
async function loadClients() {
  const list = await api("clients", "clients/list?limit=200&after=&prefix=" +
    encodeURIComponent(dash.prefix));
  if (!list) return;
  const shown = list.sort((a, b) => (a.client_id < b.client_id ? -1 : 1));
  $("clients-count").textContent = `${shown.length}${shown.length === 200 ? "+" : ""}`;
  $("clients-table").tBodies[0].replaceChildren(...shown.map((c) => {
    const tr = el("tr", { class: "clickable", "data-client": c.client_id },
      td(c.client_id, "wrap"), td(c.username, "wrap"), td(c.peer, "wrap"), td(c.state),
      td(c.protocol),
      td(c.subscriptions, "num"), td(c.queued, "num"),
      el("td", {}, kickButton(c.client_id)));
    tr.addEventListener("click", (ev) => { if (ev.target.tagName !== "BUTTON") showClient(c.client_id); });
    return tr;
  }));
  labelCells($("clients-table"));
}

async function showClient(id) {
  const c = await api("clients", "clients/show/" + encodeURIComponent(id));
  const pre = $("client-detail");
  pre.hidden = !c;
  if (c) pre.textContent = JSON.stringify(c, null, 2);
}

// Two clicks: the first arms the button for a few seconds, the second kicks (no modal dialog).
function kickButton(id) {
  const b = el("button", { class: "danger kick", type: "button" }, "Kick");
  b.addEventListener("click", async () => {
    if (!b.dataset.armed) {
      b.dataset.armed = "1";
      b.textContent = "Sure?";
      setTimeout(() => { delete b.dataset.armed; b.textContent = "Kick"; }, 4000);
      return;
    }
    b.disabled = true;
    if (await api("kick", "clients/kick/" + encodeURIComponent(id), "POST")) loadClients();
    b.disabled = false;
  });
  return b;
}

$("clients-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  dash.prefix = $("clients-prefix").value;
  loadClients();
});

/* ---- Rules ---- */

async function loadRules() {
  const [list, metrics] = await Promise.all([api("rules", "rules/list"),
    api("rules metrics", "rules/metrics")]);
  if (!list) return;
  const m = new Map((metrics || []).map((x) => [x.name, x]));
  $("rules-table").tBodies[0].replaceChildren(...list.map((r) => {
    const on = r.state === "enabled";
    const b = el("button", { type: "button", class: "toggle" }, on ? "Disable" : "Enable");
    b.addEventListener("click", async () => {
      b.disabled = true;
      // Its own error source: the list reloaded next must not clear a refusal.
      await api("rule switch",
        `rules/${on ? "disable" : "enable"}/${encodeURIComponent(r.name)}`, "POST");
      loadRules();
    });
    const x = m.get(r.name) || {};
    return el("tr", { "data-rule": r.name }, td(r.name, "wrap"), td(r.state), td(r.from, "wrap"),
      td(r.to, "wrap"),
      td(fmtNum(r.matched), "num"), td(fmtNum(r.passed), "num"), td(fmtNum(r.filtered), "num"),
      td(fmtNum(r.failed), "num"), td(fmtNum(x.rows_out), "num"), el("td", {}, b));
  }));
  labelCells($("rules-table"));
}

$("dry-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const q = new URLSearchParams({ topic: $("dry-topic").value, payload: $("dry-payload").value });
  const r = await api("dry run",
    `rules/test/${encodeURIComponent($("dry-rule").value)}?${q}`);
  const out = $("dry-result");
  out.hidden = !r;
  if (!r) return;
  const rows = r.rows || [];
  const cols = [...new Set(rows.flatMap((row) => Object.keys(row)))];
  out.replaceChildren(el("p", {}, `${rows.length} row${rows.length === 1 ? "" : "s"} ` +
    `for the sinks (nothing written)`), el("table", { id: "dry-rows", class: "fit cards" },
    el("thead", {}, el("tr", {}, ...cols.map((c) => el("th", {}, c)))),
    el("tbody", {}, ...rows.map((row) => el("tr", {}, ...cols.map((c) =>
      td(typeof row[c] === "object" ? JSON.stringify(row[c]) : row[c])))))));
  labelCells($("dry-rows"));
});

/* ---- Overview: listeners, refusals and drops, memory, sinks; all a read key may ask ---- */

const WINDOW_MS = 60000;

// The counters the Refusals and drops table shows: [what, reason, total] from one poll.
function counters(stats, metrics, vm, listeners, sinks) {
  const rows = [];
  const sum = (o) => Object.values(o).reduce((a, b) => a + b, 0);
  rows.push(["auth failures", "all", sum(stats.auth_failures)]);
  for (const [k, v] of Object.entries(stats.auth_failures))
    rows.push(["auth failures", k.replace(/_/g, " "), v]);
  rows.push(["ACL denials", "all", sum(stats.acl_denied)]);
  for (const [k, v] of Object.entries(stats.acl_denied)) rows.push(["ACL denials", k, v]);
  rows.push(["messages dropped", "a subscriber's queue full", metrics.messages.dropped]);
  rows.push(["messages dropped", "expired", metrics.messages.expired]);
  rows.push(["actor messages dropped", "mailbox full (shed)", vm.actors.shed]);
  rows.push(["actor messages dropped", "to an actor gone (dead letters)", vm.actors.dead_letters]);
  rows.push(["sink rows dropped", "byte limit, or refused for good",
    sinks.reduce((a, x) => a + x.dropped, 0)]);
  for (const k of ["max_conns", "per_ip", "rate", "error", "untrusted_proxy", "fd_reserve"])
    rows.push(["connections refused", k.replace(/_/g, " "),
      listeners.reduce((a, l) => a + (l["refused_" + k] || 0), 0)]);
  return rows;
}

// Each counter's rise over the last minute: since the newest poll a minute old or more, or
// since the page's first poll (the table's caption says which).
function perMinute(now) {
  const base = [...dash.counts].reverse().find((c) => c.t <= now.t - WINDOW_MS) || dash.counts[0];
  return { since: now.t - base.t, rows: now.rows.map(([what, why, v], i) =>
    [what, why, v - base.rows[i][2], v]) };
}

function renderRefusals(rows) {
  const now = { t: Date.now(), rows };
  dash.counts.push(now);
  while (dash.counts.length > 2 && dash.counts[1].t <= now.t - WINDOW_MS) dash.counts.shift();
  const pm = perMinute(now);
  dash.perMinute = pm;
  const auth = pm.rows.find((r) => r[0] === "auth failures" && r[1] === "all")[2];
  const acl = pm.rows.find((r) => r[0] === "ACL denials" && r[1] === "all")[2];
  dash.refusals.push({ auth, acl });
  if (dash.refusals.length > HISTORY) dash.refusals.shift();
  $("fig-auth").textContent = fmtNum(auth);
  $("fig-acl").textContent = fmtNum(acl);
  $("refusals-window").textContent = pm.since >= WINDOW_MS ? "last minute: the last 60 s" :
    `last minute: since this page opened, ${Math.round(pm.since / 1000)} s ago`;
  // The totals always, a reason once it has happened.
  const shown = pm.rows.filter((r) => r[1] === "all" || r[3] > 0);
  $("refusals-table").tBodies[0].replaceChildren(...shown.map(([what, why, last, total]) =>
    el("tr", { class: last > 0 ? "bad" : "" }, td(what), td(why), td(fmtNum(last), "num"),
      td(fmtNum(total), "num"))));
  labelCells($("refusals-table"));
}

function renderListeners(list) {
  $("listeners-table").tBodies[0].replaceChildren(...list.map((l) => el("tr",
    { "data-listener": l.listener }, td(l.listener, "wrap"), td(l.kind), td(l.state),
    td(fmtNum(l.connections) + (l.max_connections > 0 ? ` / ${fmtNum(l.max_connections)}` : ""),
      "num"),
    td(l.tls ? fmtNum(l.tls.days_left) : "-", l.tls && l.tls.days_left < 14 ? "num bad" : "num"),
    td(fmtNum(l.refused), "num"),
    td(`publish ${fmtNum(l.acl_denied_publish)}, subscribe ${fmtNum(l.acl_denied_subscribe)}`))));
  labelCells($("listeners-table"));
}

// The sinks, and each one's last error (only `sinks show` has it).
async function renderSinks(list) {
  const full = await Promise.all(list.map((s) =>
    api("sinks", "sinks/show/" + encodeURIComponent(s.name))));
  $("sinks-table").tBodies[0].replaceChildren(...list.map((s, i) => el("tr", {},
    td(s.name), td(s.type), td(s.state), td(fmtNum(s.queued), "num"), td(fmtNum(s.spilled), "num"),
    td(fmtNum(s.dropped), "num"), td(fmtNum(s.failed), "num"),
    td((full[i] && full[i].last_error) || "", "err wrap"))));
  labelCells($("sinks-table"));
}

async function loadOverview() {
  const [listeners, stats, metrics, vm, sinks] = await Promise.all([
    api("listeners", "listeners"), api("broker stats", "broker/stats"),
    api("broker metrics", "broker/metrics"), api("vm", "vm"), api("sinks", "sinks/list")]);
  if (listeners) renderListeners(listeners);
  if (vm) renderMemory(vm.memory_by_kind);
  if (listeners && stats && metrics && vm && sinks)
    renderRefusals(counters(stats, metrics, vm, listeners, sinks));
  if (sinks) await renderSinks(sinks);
  drawCharts();
}

/* ---- Tabs: the overview first; actors, rules and the trace each on their own ---- */

function showTab(name) {
  for (const b of $("tabs").querySelectorAll("button"))
    b.setAttribute("aria-selected", String(b.dataset.tab === name));
  for (const sec of document.querySelectorAll("main > section"))
    sec.hidden = sec.dataset.tab !== name;
  drawCharts();
}
$("tabs").addEventListener("click", (ev) => {
  const b = ev.target.closest("button[data-tab]");
  if (b) showTab(b.dataset.tab);
});

/* ---- The key, and starting everything ---- */

function refresh() {
  if (!dash.key) return;
  loadClients();
  loadRules();
  loadOverview();
}

function start() {
  $("key").value = dash.key;
  if (!dash.key) {
    setError("key", "Enter an API key (made by `rtd apikey NAME read|admin`) to see rtd.");
    return;
  }
  setError("key", null);
  runStream();
  refresh();
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  dash.key = $("key").value.trim();
  sessionStorage.setItem(KEY_ITEM, dash.key);
  failing.clear();
  start();
});
$("key-forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_ITEM);
  dash.key = "";
  if (dash.stream) dash.stream.abort();
  stopTrace();
  failing.clear();
  start();
});

setInterval(refresh, REFRESH_MS);
window.addEventListener("resize", drawCharts);
start();
drawCharts();
