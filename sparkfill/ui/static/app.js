// The sparkfill ui page: polls /api/watch and redraws itself in place (no reload).
// window.sparkfill holds the last facts, the number of updates and the charts
// (read by the browser tests).
"use strict";

(function () {
  const params = new URLSearchParams(location.search);
  const INTERVAL = Math.max(200, Number(params.get("interval")) || 1000);
  const EPOCHS = Math.max(1, Number(params.get("epochs")) || 120);
  const state = { facts: null, updates: 0, errors: 0, charts: {}, lastOk: null };
  window.sparkfill = state;

  // --- formatting -------------------------------------------------------------------------
  const int = (n) => (n == null ? "–" : Math.round(n).toLocaleString("en-US"));
  function bytes(n) {
    if (n == null) return "…";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + " " + units[i];
  }
  function secs(s) {
    if (s == null) return "–";
    if (s < 10) return s.toFixed(2) + " s";
    if (s < 120) return s.toFixed(0) + " s";
    const m = Math.floor(s / 60);
    if (m < 120) return m + "m " + Math.round(s - 60 * m) + "s";
    return Math.floor(m / 60) + "h " + (m % 60) + "m";
  }
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null) continue;
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c));
    return node;
  }
  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v != null) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    return node;
  }

  // --- header, errors, warnings -------------------------------------------------------------
  function renderHeader(f) {
    const s = f.status;
    document.getElementById("warehouse").textContent = s.warehouse;
    document.getElementById("epoch").textContent = "epoch " + s.committed_epoch;
    const ago = f.last_commit_at == null ? "no epoch committed yet"
      : "committed " + secs(Math.max(0, f.now - f.last_commit_at)) + " ago";
    const inflight = f.pending && f.pending.planned_at
      ? " · epoch " + f.pending.epoch + " running for " + secs(Math.max(0, f.now - f.pending.planned_at)) : "";
    document.getElementById("inflight").textContent = ago + inflight;
  }

  function renderErrors(f, fetchError) {
    const box = document.getElementById("errors");
    box.replaceChildren();
    if (fetchError) box.append(el("div", { class: "error", id: "fetch-error" }, fetchError));
    for (const e of (f ? f.errors : [])) box.append(el("div", { class: "error" }, e.text));
  }

  function renderWarnings(f) {
    const list = document.getElementById("warnings");
    const items = [...f.errors.map((e) => ["error", e]), ...f.warnings.map((w) => ["warning", w])];
    document.getElementById("warnings-count").textContent = items.length ? "(" + items.length + ")" : "";
    list.replaceChildren(...(items.length ? items.map(([kind, w]) =>
      el("li", { class: kind, "data-kind": w.kind },
        (w.epoch != null ? "epoch " + w.epoch + ": " : "") + w.text))
      : [el("li", { class: "dim" }, "none")]));
  }

  // --- jobs ---------------------------------------------------------------------------------
  function renderJobs(f) {
    const box = document.getElementById("jobs");
    const jobs = f.status.jobs;
    if (!jobs.length) { box.replaceChildren(el("p", { class: "dim" }, "none")); return; }
    box.replaceChildren(el("div", { class: "jobs" }, ...jobs.map((j) => {
      const cls = "job" + (j.stalled ? " stalled" : "") + (j.paused ? " paused" : "");
      const title = el("div", { class: "title" },
        el("span", { class: "name" }, j.name),
        el("span", { class: "tag" }, j.strategy),
        el("span", { class: "tag phase" }, j.phase),
        ...(j.stalled ? [el("span", { class: "tag stalled" }, "stalled")] : []),
        ...(j.paused ? [el("span", { class: "tag paused" }, "paused (rate limit 0)")] : []),
        el("span", { class: "pct" }, j.percent.toFixed(1) + " %"));
      const bar = el("div", { class: "bar" }, el("div", { style: "width:" + j.percent.toFixed(2) + "%" }));
      const fact = (label, value) => el("span", {}, label + " ", el("b", {}, value));
      const facts = el("div", { class: "facts" },
        fact("rows", int(j.rows_done) + " / " + int(j.rows_total_estimate)),
        // one epoch recorded: no rate yet
        fact("rate", j.rows_per_second > 0 || j.stalled ? int(j.rows_per_second) + " rows/s" : "measuring…"),
        fact("ETA", j.eta_seconds == null ? "–" : secs(j.eta_seconds)),
        fact("rate limit", j.rate_limit == null ? "none" : int(j.rate_limit) + " rows/s"),
        fact("running", secs(j.running_seconds)),
        ...(j.lag_epochs != null ? [fact("lag", j.lag_epochs + " epochs")] : []),
        ...(j.strategy === "arrangement" ? [fact("vnodes", j.vnodes_done + " / 256")] : []));
      const strips = j.vnodes.map((s, leaf) => el("div", { class: "strip", title: "leaf " + leaf + ": 256 vnodes" },
        ...Array.from(s, (c) => el("span", { class: c }))));
      return el("div", { class: cls, "data-name": j.name, "data-percent": j.percent.toFixed(3),
        "data-phase": j.phase }, title, bar, facts, ...strips);
    })));
  }

  // --- the dataflow graph -------------------------------------------------------------------
  function renderDag(f) {
    const { nodes, edges } = f.dag;
    const W = 220, H = 64, GX = 60, GY = 16;
    const byId = new Map(nodes.map((n) => [n.id, n]));
    const preds = new Map(nodes.map((n) => [n.id, []]));
    for (const e of edges) preds.get(e.to).push(e.from);
    const layer = new Map();
    const depth = (id, seen = new Set()) => {
      if (layer.has(id)) return layer.get(id);
      if (seen.has(id)) return 0;
      seen.add(id);
      const d = Math.max(-1, ...preds.get(id).map((p) => depth(p, seen))) + 1;
      layer.set(id, d);
      return d;
    };
    nodes.forEach((n) => depth(n.id));
    const columns = [];
    for (const n of nodes) (columns[layer.get(n.id)] ||= []).push(n);
    const pos = new Map();
    columns.forEach((col, c) => {
      // order by the mean row of each node's inputs: fewer crossings
      const rank = (n) => {
        const ys = preds.get(n.id).map((p) => pos.get(p)).filter(Boolean).map((p) => p.row);
        return ys.length ? ys.reduce((a, b) => a + b, 0) / ys.length : 0;
      };
      col.sort((a, b) => rank(a) - rank(b));
      col.forEach((n, r) => pos.set(n.id, { x: 10 + c * (W + GX), y: 10 + r * (H + GY), row: r }));
    });
    const width = 20 + columns.length * (W + GX) - GX;
    const height = 20 + Math.max(1, ...columns.map((c) => c.length)) * (H + GY) - GY;
    const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
    const defs = svg("defs");
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
      markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#adb5bd" }));
    defs.append(marker);
    root.append(defs);
    for (const e of edges) {
      const a = pos.get(e.from), b = pos.get(e.to);
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      root.append(svg("path", { class: "edge", d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
        "marker-end": "url(#arrow)", "data-from": e.from, "data-to": e.to }));
    }
    for (const n of nodes) {
      const p = pos.get(n.id);
      const g = svg("g", { class: "node", "data-id": n.id, "data-kind": n.kind, "data-state": n.state,
        transform: `translate(${p.x},${p.y})` });
      g.append(svg("rect", { width: W, height: H, rx: 6 }));
      // a creating MV's progress: a bar along the node's bottom edge
      if (n.percent != null) g.append(svg("rect", { class: "fill", x: 3, y: H - 6, width: (W - 6) * n.percent / 100, height: 3 }));
      const kind = n.kind === "mv" ? "MV" : n.kind;
      const what = [kind + (n.strategy ? " · " + n.strategy : "")];
      if (n.kind !== "table" || n.state !== "created") what.push(n.state + (n.percent != null ? " " + n.percent.toFixed(0) + "%" : ""));
      g.append(svg("text", { class: "name", x: 8, y: 17 }, n.name));
      g.append(svg("text", { class: "sub", x: 8, y: 34 }, what.join(" · ")));
      const facts = [];
      if (n.rows != null) facts.push(int(n.rows) + " rows");
      if (n.kind === "table" || n.kind === "mv") facts.push(bytes(n.bytes));
      if (n.last_epoch != null) facts.push("e" + n.last_epoch);
      if (n.dead_letters) facts.push(int(n.dead_letters) + " dead");
      g.append(svg("text", { class: "sub", x: 8, y: 51 }, facts.join(" · ")));
      g.append(svg("title", {}, `${n.name} (${kind}, ${n.state})`));
      root.append(g);
    }
    document.getElementById("dag").replaceChildren(root);
    byId.clear();
  }

  // --- the epoch timeline -------------------------------------------------------------------
  const COLORS = { changes: "#4dabf7", backfill: "#ff922b", commit: "#adb5bd", jobs: "#7048e8", count: "#2f9e44" };

  function markers(u) {
    // each backfill's first and last epoch, as dashed lines with a label
    const f = state.facts;
    if (!f) return;
    const ctx = u.ctx, px = window.devicePixelRatio || 1;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.font = `${11 * px}px system-ui, sans-serif`;
    ctx.setLineDash([4 * px, 3 * px]);
    ctx.lineWidth = px;
    let lane = 0;
    for (const b of f.timeline.backfills) {
      const marks = [[b.start_epoch - 0.5, "▶ " + b.name, "#e8590c"]];
      if (b.end_epoch != null) marks.push([b.end_epoch + 0.5, "■ " + b.name + " created", "#2b8a3e"]);
      for (const [epoch, label, color] of marks) {
        const x = u.valToPos(epoch, "x", true);
        if (x < left - 1 || x > left + width + 1) continue;
        ctx.strokeStyle = color;
        ctx.fillStyle = color;
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        ctx.fillText(label, x + 3 * px, top + (12 + 12 * (lane % 3)) * px);
        lane++;
      }
    }
    ctx.restore();
  }

  function chartWidth() {
    return Math.max(320, document.getElementById("timeline-section").clientWidth - 30);
  }

  function secondsData(t) {
    const parts = { changes: [], backfill: [], commit: [] };
    const top1 = [], top2 = [], top3 = [];
    t.epoch.forEach((_, i) => {
      const c = t.changes_seconds[i] != null ? t.changes_seconds[i] : t.seconds[i];
      const b = t.backfill_seconds[i] || 0, k = t.commit_seconds[i];
      parts.changes.push(c); parts.backfill.push(t.backfill_seconds[i]); parts.commit.push(k);
      top1.push(c); top2.push(c + b); top3.push(c + b + (k || 0));
    });
    return { parts, data: [t.epoch, top3, top2, top1] };
  }

  function makeCharts(f) {
    const bars = uPlot.paths.bars({ size: [0.7, 40] });
    const x = { time: false, range: (u, min, max) => [min - 0.5, max + 0.5] };
    const xAxis = { scale: "x", label: "epoch", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000],
      values: (u, vals) => vals.map((v) => (Number.isInteger(v) ? v : "")) };
    const part = (name) => (u, v, si, i) => {
      const value = i == null ? null : state.seconds.parts[name][i];
      return value == null ? "–" : value.toFixed(3) + " s";
    };
    state.seconds = secondsData(f.timeline);
    state.charts.seconds = new uPlot({
      width: chartWidth(), height: 240, cursor: { sync: { key: "epochs" } },
      scales: { x, s: { range: (u, min, max) => [0, Math.max(max, 0.001) * 1.1] } },
      axes: [xAxis, { scale: "s", label: "seconds", size: 70, values: (u, vals) => vals.map((v) => v + " s") }],
      series: [
        { label: "epoch" },
        { label: "commit & after", scale: "s", stroke: COLORS.commit, fill: COLORS.commit, paths: bars, points: { show: false }, value: part("commit") },
        { label: "backfill share", scale: "s", stroke: COLORS.backfill, fill: COLORS.backfill, paths: bars, points: { show: false }, value: part("backfill") },
        { label: "changes", scale: "s", stroke: COLORS.changes, fill: COLORS.changes, paths: bars, points: { show: false }, value: part("changes") },
      ],
      hooks: { draw: [markers] },
    }, state.seconds.data, document.getElementById("chart-seconds"));
    state.charts.counts = new uPlot({
      width: chartWidth(), height: 170, cursor: { sync: { key: "epochs" } },
      scales: { x, n: { range: (u, min, max) => [0, Math.max(1, max) * 1.1] },
        j: { range: (u, min, max) => [0, Math.max(1, max) * 1.1] } },
      axes: [xAxis, { scale: "n", label: "rows changed", size: 70 }, { scale: "j", side: 1, label: "Spark jobs", grid: { show: false } }],
      series: [
        { label: "epoch" },
        { label: "changes (rows)", scale: "n", stroke: COLORS.count, width: 2 },
        { label: "Spark jobs", scale: "j", stroke: COLORS.jobs, width: 2 },
      ],
      hooks: { draw: [markers] },
    }, countsData(f.timeline), document.getElementById("chart-counts"));
    window.addEventListener("resize", () => {
      for (const c of Object.values(state.charts)) c.setSize({ width: chartWidth(), height: c.height });
    });
  }

  const countsData = (t) => [t.epoch, t.changes, t.spark_jobs];

  function renderTimeline(f) {
    const t = f.timeline;
    document.getElementById("timeline-range").textContent = t.epoch.length
      ? `(${t.epoch.length} epochs: ${t.epoch[0]}–${t.epoch[t.epoch.length - 1]}; the last epoch's commit part is known once the next commits)` : "(none yet)";
    if (!state.charts.seconds) { makeCharts(f); return; }
    state.seconds = secondsData(t);
    state.charts.seconds.setData(state.seconds.data);
    state.charts.counts.setData(countsData(t));
  }

  // --- relations, sources, sinks ------------------------------------------------------------
  function table(headers, rows) {
    return el("table", {}, el("tr", {}, ...headers.map(([h, n]) => el("th", { class: n ? "n" : null }, h))),
      ...rows.map((r) => el("tr", {}, ...r.map((v, i) => el("td", { class: headers[i][1] ? "n" : null }, v == null ? "" : String(v))))));
  }

  function renderTables(f) {
    const s = f.status;
    const parts = [table([["relation"], ["kind"], ["strategy"], ["state"], ["rows", 1], ["backfilled rows", 1], ["vnodes done", 1]],
      s.relations.filter((r) => r.kind !== "state").map((r) => [r.name, r.kind, r.strategy, r.state, int(r.rows),
        r.backfilled_rows == null ? "" : int(r.backfilled_rows), r.vnodes_done]))];
    if (s.sources.length) parts.push(table([["source"], ["connector"], ["last epoch", 1], ["batches", 1], ["rows", 1], ["dead letters", 1]],
      s.sources.map((x) => [x.name, x.connector, x.last_epoch, x.batches, int(x.rows), x.dead_letters == null ? "" : int(x.dead_letters)])));
    if (s.sinks.length) parts.push(table([["sink"], ["from"], ["connector"], ["path"], ["epoch written", 1]],
      s.sinks.map((x) => [x.name, x.from, x.connector, x.path, x.epoch_written])));
    if (s.verified.length) parts.push(table([["sampled VERIFY of"], ["epoch", 1], ["sample", 1], ["differing rows", 1]],
      s.verified.map((v) => [v.name, v.epoch, (100 * v.sample).toFixed(1) + " %", int(v.differences)])));
    document.getElementById("tables").replaceChildren(...parts);
  }

  // --- polling ------------------------------------------------------------------------------
  function render(f) {
    renderHeader(f);
    renderErrors(f, null);
    renderJobs(f);
    renderDag(f);
    renderTimeline(f);
    renderWarnings(f);
    renderTables(f);
  }

  async function poll() {
    try {
      const response = await fetch("api/watch?epochs=" + EPOCHS, { cache: "no-store" });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      state.facts = body;
      render(body);
      state.updates++;
      state.lastOk = Date.now();
    } catch (err) {
      state.errors++;
      // keep the last facts on the page; say why they are not fresh
      renderErrors(state.facts, "not refreshed: " + err.message);
    }
    document.getElementById("updated").textContent = state.lastOk == null ? "no data yet"
      : "updated " + new Date(state.lastOk).toLocaleTimeString() + " · every " + INTERVAL / 1000 + " s";
    setTimeout(poll, INTERVAL);
  }
  poll();
})();
