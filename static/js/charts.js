// Charts of a pipeline's recent batches (uPlot, served from static/vendor), from the API's
// /metrics/history/ with the page's own session: per batch, and the lag as the metrics
// collector sampled it (also while the job was down). A pipeline that keeps state also has
// its operators' charts, from /metrics/state/: rows held, memory and size, late rows dropped
// and commit times, per operator. Every 10 s each chart asks only for what is new since its
// last point (`since`), appends it and drops what fell out of the range.
//
// The range (1 h, 6 h, 24 h, 7 d: the page's #chart-range picker; older than the raw
// retention, the API answers with hourly roll-ups) is fetched whole when it is chosen. Every
// chart on the page has the same time axis, ending now: the range, or from the first point
// of the page's figures when that is later (but at least the last 5 minutes), so that a run
// of ten minutes fills the charts instead of their last sixth.
(function () {
  "use strict";
  if (!window.uPlot) return;
  const HEIGHT = 180;
  const MIN_SPAN = 300;
  const picker = document.getElementById("chart-range");
  let range = picker ? Number(picker.value) : 3600;  // seconds

  const everyChart = [];  // every chart on the page
  const firsts = {};  // per figures' source: the time of its first point (null: none)
  const restarts = [];  // what each poller does when the range changes

  function span() {
    const now = Date.now() / 1000;
    const known = Object.values(firsts).filter((x) => x != null);
    const first = known.length ? Math.min(...known) : now - range;
    const from = Math.max(now - range, Math.min(first, now - MIN_SPAN));
    return [Math.max(now - range, from - (now - from) * 0.01), now];
  }

  if (picker) {
    picker.addEventListener("change", () => {
      range = Number(picker.value);
      restarts.forEach((restart) => restart());
    });
  }

  // Points of `older` and `newer` (each oldest first) in one list: newer ones after the last
  // of `older`, none before the range's start.
  function merged(older, newer) {
    const last = older.length ? Date.parse(older[older.length - 1].at) : -Infinity;
    const from = Date.now() - range * 1000;
    return older.concat(newer.filter((p) => Date.parse(p.at) > last))
      .filter((p) => Date.parse(p.at) >= from);
  }

  // A source's figures came: the time axis of every chart follows its first point.
  function firstPoint(source, xs) {
    firsts[source] = xs.length ? Math.min(...xs) : null;
    const [min, max] = span();
    everyChart.forEach((u) => u.setScale("x", { min, max }));
  }

  function width(root) { return Math.max(280, Math.floor(root.clientWidth / 2) - 24); }

  // 8.9 MB, 244.1 KB: byte axes in the units of the page's tables (1 KB = 1024 bytes).
  function bytes(value) {
    if (value == null) return "";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i++; }
    return `${i ? value.toFixed(1).replace(/\.0$/, "") : value.toFixed(0)} ${units[i]}`;
  }
  // A byte axis' steps: 1, 2, 5, 10, 20... of a unit (100 MB, not 95.4 MB).
  const BYTE_STEPS = [];
  for (let unit = 1; unit <= 2 ** 40; unit *= 1024) {
    [1, 2, 5, 10, 20, 50, 100, 200, 500].forEach((m) => BYTE_STEPS.push(m * unit));
  }

  // 15,000, 2.5M: a count axis' labels fit it (the tables have the exact figures).
  const COMPACT = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
  function count(value) {
    if (value == null) return "";
    return Math.abs(value) >= 1e5 ? COMPACT.format(value) : value.toLocaleString("en");
  }

  function columns(points, series) {
    const xs = points.map((p) => Date.parse(p.at) / 1000);
    return [xs, ...series.map(([key]) => points.map((p) => p[key]))];
  }

  // One chart in `root`, on the page's time axis (`span`), whatever few points there are.
  // Its figure holds it (`figure.uplot`: tests read what a chart draws).
  function plot(root, chart, data) {
    const box = document.createElement("figure");
    box.className = "chart";
    root.appendChild(box);
    const u = new uPlot({
      title: chart.title, width: width(root), height: HEIGHT,
      scales: { x: { time: true, range: span } },
      series: [{}, ...chart.series.map(([, label, stroke]) => ({ label, stroke, width: 1.5, spanGaps: true, ...(chart.bytes ? { value: (u, v) => bytes(v) } : {}) }))],
      axes: [{}, chart.bytes
        ? { size: 70, incrs: BYTE_STEPS, values: (u, splits) => splits.map(bytes) }
        : { size: 60, values: (u, splits) => splits.map(count) }],
    }, data, box);
    box.uplot = u;
    everyChart.push(u);
    return u;
  }

  // Fetch `url` now (the whole range) and every 10 s (since `last()`, the newest point
  // drawn), handing each answer to `draw`; `reset()` forgets what was drawn (a new range).
  function poll(root, url, draw, plots, last, reset) {
    let generation = 0;
    async function refresh() {
      const mine = generation;
      const newest = last();
      const since = new Date(newest != null ? newest : Date.now() - range * 1000).toISOString();
      try {
        const response = await fetch(`${url}?since=${encodeURIComponent(since)}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (response.ok && mine === generation) draw(await response.json());
      } catch (e) { /* the next refresh tries again */ }
    }
    refresh();
    setInterval(refresh, 10000);
    restarts.push(() => { generation += 1; reset(); refresh(); });
    window.addEventListener("resize", () => plots().forEach((p) => p.setSize({ width: width(root), height: HEIGHT })));
  }

  function newestOf(lists) {
    const times = lists.filter((l) => l.length).map((l) => Date.parse(l[l.length - 1].at));
    return times.length ? Math.max(...times) : null;
  }

  const root = document.getElementById("charts");
  if (root) {
    const charts = [
      { title: "Rows per second", series: [["input_rows_per_second", "in", "#2563eb"], ["processed_rows_per_second", "processed", "#16a34a"]] },
      { title: "Batch duration (ms)", series: [["batch_duration_ms", "duration", "#9333ea"]] },
      { title: "Lag (records)", source: "lag", series: [["records", "lag", "#dc2626"]] },
      { title: "Busy ratio (duration / trigger)", series: [["busy_ratio", "busy", "#d97706"]] },
    ];
    const plots = [];
    let held = { points: [], lag: [] };
    poll(root, root.dataset.history, (body) => {
      held = { points: merged(held.points, body.points), lag: merged(held.lag, body.lag) };
      root.querySelector(".chart-empty").hidden = held.points.length + held.lag.length > 0;
      charts.forEach((chart, i) => {
        const data = columns(chart.source === "lag" ? held.lag : held.points, chart.series);
        if (plots[i]) plots[i].setData(data); else plots[i] = plot(root, chart, data);
      });
      firstPoint("history", [...held.points, ...held.lag].map((p) => Date.parse(p.at) / 1000));
    }, () => plots, () => newestOf([held.points, held.lag]), () => { held = { points: [], lag: [] }; });
  }

  const stateRoot = document.getElementById("state-charts");
  if (stateRoot) {
    // Per operator: four charts, made when the operator first appears.
    function stateCharts(op) {
      const who = `${op.operator} · ${op.name || "?"}`;
      const size = op.size_in === "disk" ? "on disk" : op.size_in === "memory" ? "in memory" : "size";
      return [
        { title: `State rows (${who})`, series: [["rows", "rows", "#2563eb"]] },
        { title: `State bytes (${who})`, bytes: true, series: [["memory_bytes", "memory", "#9333ea"], ["size_bytes", size, "#16a34a"]] },
        { title: `Late rows dropped per batch (${who})`, series: [["rows_dropped", "dropped", "#dc2626"]] },
        { title: `Commit (ms) (${who})`, series: [["commit_ms", "state commit", "#d97706"], ["checkpoint_ms", "WAL + offsets", "#0891b2"], ["store_checkpoint_ms", "RocksDB checkpoint", "#64748b"]] },
      ];
    }
    const plots = {};
    let held = {};  // operator -> the operator as last answered, with every point drawn
    poll(stateRoot, stateRoot.dataset.state, (body) => {
      body.operators.forEach((op) => {
        const before = held[op.operator];
        held[op.operator] = { ...op, points: merged(before ? before.points : [], op.points) };
      });
      const drawn = Object.values(held).filter((op) => op.points.length > 0);
      stateRoot.querySelector(".chart-empty").hidden = drawn.length > 0;
      drawn.forEach((op) => {
        stateCharts(op).forEach((chart, i) => {
          const key = `${op.operator}/${i}`;
          const data = columns(op.points, chart.series);
          if (plots[key]) plots[key].setData(data); else plots[key] = plot(stateRoot, chart, data);
        });
      });
      firstPoint("state", drawn.flatMap((op) => op.points.map((p) => Date.parse(p.at) / 1000)));
    }, () => Object.values(plots), () => newestOf(Object.values(held).map((op) => op.points)), () => { held = {}; });
  }
})();
