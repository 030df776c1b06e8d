// Charts of a pipeline's recent batches (uPlot, served from static/vendor), from the API's
// /metrics/history/ with the page's own session: per batch, and the lag as the metrics
// collector sampled it (also while the job was down). Redrawn every 10 s.
(function () {
  "use strict";
  const root = document.getElementById("charts");
  if (!root || !window.uPlot) return;
  const url = root.dataset.history;
  const charts = [
    { title: "Rows per second", series: [["input_rows_per_second", "in", "#2563eb"], ["processed_rows_per_second", "processed", "#16a34a"]] },
    { title: "Batch duration (ms)", series: [["batch_duration_ms", "duration", "#9333ea"]] },
    { title: "Lag (records)", source: "lag", series: [["records", "lag", "#dc2626"]] },
    { title: "Busy ratio (duration / trigger)", series: [["busy_ratio", "busy", "#d97706"]] },
  ];
  const plots = [];

  function width() { return Math.max(280, Math.floor(root.clientWidth / 2) - 24); }

  function columns(points, chart) {
    const xs = points.map((p) => Date.parse(p.at) / 1000);
    return [xs, ...chart.series.map(([key]) => points.map((p) => p[key]))];
  }

  function draw(body) {
    root.querySelector(".chart-empty").hidden = body.points.length + body.lag.length > 0;
    charts.forEach((chart, i) => {
      const data = columns(chart.source === "lag" ? body.lag : body.points, chart);
      if (plots[i]) { plots[i].setData(data); return; }
      const box = document.createElement("figure");
      box.className = "chart";
      root.appendChild(box);
      plots[i] = new uPlot({
        title: chart.title, width: width(), height: 180,
        // Always the last hour, whatever few points there are.
        scales: { x: { time: true, range: () => { const now = Date.now() / 1000; return [now - 3600, now]; } } },
        series: [{}, ...chart.series.map(([, label, stroke]) => ({ label, stroke, width: 1.5, spanGaps: true }))],
        axes: [{}, { size: 60 }],
      }, data, box);
    });
  }

  async function refresh() {
    const since = new Date(Date.now() - 3600 * 1000).toISOString();
    try {
      const response = await fetch(`${url}?since=${encodeURIComponent(since)}`, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.ok) draw(await response.json());
    } catch (e) { /* the next refresh tries again */ }
  }

  refresh();
  setInterval(refresh, 10000);
  window.addEventListener("resize", () => plots.forEach((p) => p.setSize({ width: width(), height: 180 })));
})();
