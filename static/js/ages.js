// Ages that tick: every <time data-ago datetime="..."> says how long ago, in the units the
// server's `ago` filter uses (controlplane/pages/units.py), updated every second, also in
// fragments htmx swaps in.
(function () {
  "use strict";
  const UNITS = [[86400, "day", "days"], [3600, "h", "h"], [60, "min", "min"], [1, "s", "s"]];

  function human(seconds) {
    if (seconds < 10) return `${seconds.toFixed(1).replace(/\.0$/, "")} s`;
    const parts = [];
    let left = Math.round(seconds);
    for (const [size, one, many] of UNITS) {
      if (left >= size && parts.length < 2) {
        const count = Math.floor(left / size);
        left -= count * size;
        parts.push(`${count} ${count === 1 ? one : many}`);
      } else if (parts.length) break;
    }
    return parts.join(" ");
  }

  function tick() {
    const now = Date.now();
    document.querySelectorAll("time[data-ago]").forEach((el) => {
      const then = Date.parse(el.getAttribute("datetime"));
      if (!Number.isNaN(then)) el.textContent = `${human(Math.max(0, (now - then) / 1000))} ago`;
    });
  }
  setInterval(tick, 1000);
})();
