// Charts of a pipeline's recent batches (uPlot, served from static/vendor), from the API's
// /metrics/history/ with the page's own session: per batch, and the lag as the metrics
// collector sampled it (also while the job was down). A pipeline that keeps state also has
// its operators' charts, from /metrics/state/: rows held, memory and size, late rows dropped
// and commit times, per operator. Redrawn every 10 s.
//
// Every chart on the page has the same time axis, ending now: the last hour, or from the
// first point of the page's figures when that is later (but at least the last 5 minutes),
// so that a run of ten minutes fills the charts instead of their last sixth.
(function () {
  "use strict";
  if (!window.uPlot) return;
  const HEIGHT = 180;
  const HOUR = 3600;
  const MIN_SPAN = 300;

  const everyChart = [];  // every chart on the page
  const firsts = {};  // per figures' source: the time of its first point (null: none)

  function span() {
    const now = Date.now() / 1000;
    const known = Object.values(firsts).filter((x) => x != null);
    const first = known.length ? Math.min(...known) : now - HOUR;
    const from = Math.max(now - HOUR, Math.min(first, now - MIN_SPAN));
    return [Math.max(now - HOUR, from - (now - from) * 0.01), now];
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

  // Fetch `url` (since an hour ago) now and every 10 s, handing the answer to `draw`.
  function poll(root, url, draw, plots) {
    async function refresh() {
      const since = new Date(Date.now() - 3600 * 1000).toISOString();
      try {
        const response = await fetch(`${url}?since=${encodeURIComponent(since)}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (response.ok) draw(await response.json());
      } catch (e) { /* the next refresh tries again */ }
    }
    refresh();
    setInterval(refresh, 10000);
    window.addEventListener("resize", () => plots().forEach((p) => p.setSize({ width: width(root), height: HEIGHT })));
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
    poll(root, root.dataset.history, (body) => {
      root.querySelector(".chart-empty").hidden = body.points.length + body.lag.length > 0;
      charts.forEach((chart, i) => {
        const data = columns(chart.source === "lag" ? body.lag : body.points, chart.series);
        if (plots[i]) plots[i].setData(data); else plots[i] = plot(root, chart, data);
      });
      firstPoint("history", [...body.points, ...body.lag].map((p) => Date.parse(p.at) / 1000));
    }, () => plots);
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
    poll(stateRoot, stateRoot.dataset.state, (body) => {
      const drawn = body.operators.filter((op) => op.points.length > 0);
      stateRoot.querySelector(".chart-empty").hidden = drawn.length > 0;
      drawn.forEach((op) => {
        stateCharts(op).forEach((chart, i) => {
          const key = `${op.operator}/${i}`;
          const data = columns(op.points, chart.series);
          if (plots[key]) plots[key].setData(data); else plots[key] = plot(stateRoot, chart, data);
        });
      });
      firstPoint("state", drawn.flatMap((op) => op.points.map((p) => Date.parse(p.at) / 1000)));
    }, () => Object.values(plots));
  }
})();
