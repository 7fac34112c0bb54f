// hpctf ui's charts: line charts over uPlot (static/uPlot.iife.min.js, MIT), with vertical
// marks (a restart, a prune). Every label reaches the canvas or the DOM as text.
"use strict";

const HpctfCharts = (() => {
  const COLORS = ["#0b62c4", "#c62828", "#1a7f37", "#9a6700", "#6f42c1", "#00838f",
                  "#d81b60", "#5d4037", "#455a64", "#ef6c00"];

  // Series given as [[x, y], ...] each, aligned on the union of their x values (uPlot's
  // data is one x array and one y array per series; a gap where a series has no point).
  const INTEGER_TICKS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000,
    1e4, 2e4, 2.5e4, 5e4, 1e5, 2e5, 2.5e5, 5e5, 1e6, 2e6, 5e6, 1e7];

  function aligned(series) {
    const xs = new Set();
    series.forEach((s) => s.points.forEach((p) => xs.add(p[0])));
    const x = Array.from(xs).sort((a, b) => a - b);
    const at = new Map(x.map((v, i) => [v, i]));
    const ys = series.map((s) => {
      const y = new Array(x.length).fill(null);
      s.points.forEach((p) => { y[at.get(p[0])] = Number.isFinite(p[1]) ? p[1] : null; });
      return y;
    });
    return [x, ...ys];
  }

  function marksPlugin(marks) {
    return {
      hooks: {
        draw: [(u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.font = `${Math.round(10 * devicePixelRatio)}px sans-serif`;
          marks.forEach((m) => {
            const x = Math.round(u.valToPos(m.step, "x", true));
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            ctx.strokeStyle = m.kind === "pruned" ? "#c62828" : "#777";
            ctx.setLineDash(m.kind === "pruned" ? [6, 4] : [2, 3]);
            ctx.beginPath();
            ctx.moveTo(x, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + u.bbox.height);
            ctx.stroke();
            ctx.setLineDash([]);
            ctx.fillStyle = ctx.strokeStyle;
            ctx.save();
            ctx.translate(x - 3, u.bbox.top + 4);
            ctx.rotate(-Math.PI / 2);
            ctx.textAlign = "right";
            ctx.fillText(String(m.text), 0, 0);
            ctx.restore();
          });
          ctx.restore();
        }],
      },
    };
  }

  // A chart in `holder` (emptied first): `series` [{label, points: [[x, y]], dash?, points?}],
  // `marks` [{step, kind, text}]. Returns the uPlot instance (null without a point).
  function lines(holder, title, xLabel, series, marks) {
    holder.replaceChildren();
    const shown = series.filter((s) => s.points.length);
    if (!shown.length) {
      const p = document.createElement("p");
      p.className = "muted";
      p.textContent = `${title}: nothing logged yet`;
      holder.appendChild(p);
      return null;
    }
    // Side by side in a row of charts: each an equal share of the row.
    const row = holder.parentElement;
    const share = row && row.classList.contains("charts")
      ? (row.clientWidth - 16 * (row.children.length - 1)) / row.children.length
      : holder.clientWidth;
    const width = Math.floor(Math.max(320, Math.min(share || 640, 900)));
    const options = {
      title: String(title),
      width,
      height: 280,
      scales: { x: { time: false } },
      // Trial numbers and steps are whole: no tick between two of them.
      axes: [{ label: xLabel, incrs: INTEGER_TICKS }, {}],
      series: [
        { label: xLabel },
        ...shown.map((s, i) => ({
          label: String(s.label),
          stroke: s.color || COLORS[i % COLORS.length],
          width: s.width || 1.5,
          dash: s.dash,
          spanGaps: true,
          points: { show: Boolean(s.dots) },
          paths: s.dots && !s.line ? () => null
            : s.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
        })),
      ],
      plugins: marks && marks.length ? [marksPlugin(marks)] : [],
    };
    const plot = new uPlot(options, aligned(shown), holder);
    holder.dataset.series = String(shown.length);
    holder.dataset.points = String(shown.reduce((n, s) => n + s.points.length, 0));
    return plot;
  }

  return { lines, COLORS };
})();
