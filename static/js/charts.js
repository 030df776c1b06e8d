// Charts of a pipeline's recent batches (uPlot, served from static/vendor), from the API's
// /metrics/history/ with the page's own session: per batch, and the lag as the metrics
// collector sampled it (also while the job was down). A pipeline that keeps state also has
// its operators' charts, from /metrics/state/: rows held, memory and size, late rows dropped
// and commit times, per operator. Redrawn every 10 s.
(function () {
  "use strict";
  if (!window.uPlot) return;
  const HEIGHT = 180;

  function width(root) { return Math.max(280, Math.floor(root.clientWidth / 2) - 24); }

  // 8.9 MB, 244.1 KB: byte axes in the units of the page's tables (1 KB = 1024 bytes).
  function bytes(value) {
    if (value == null) return "";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let i = 0;
    while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i++; }
    return `${i ? value.toFixed(1) : value.toFixed(0)} ${units[i]}`;
  }

  function columns(points, series) {
    const xs = points.map((p) => Date.parse(p.at) / 1000);
    return [xs, ...series.map(([key]) => points.map((p) => p[key]))];
  }

  // One chart in `root`, always showing the last hour, whatever few points there are.
  function plot(root, chart, data) {
    const box = document.createElement("figure");
    box.className = "chart";
    root.appendChild(box);
    return new uPlot({
      title: chart.title, width: width(root), height: HEIGHT,
      scales: { x: { time: true, range: () => { const now = Date.now() / 1000; return [now - 3600, now]; } } },
      series: [{}, ...chart.series.map(([, label, stroke]) => ({ label, stroke, width: 1.5, spanGaps: true, ...(chart.bytes ? { value: (u, v) => bytes(v) } : {}) }))],
      axes: [{}, chart.bytes ? { size: 70, values: (u, splits) => splits.map(bytes) } : { size: 60 }],
    }, data, box);
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
    }, () => Object.values(plots));
  }
})();
