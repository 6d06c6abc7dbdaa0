// The job page's plots, drawn by Chart.js (vendor/, loaded before this module): where the
// time went, stacked, and the step time of each generation with the nodes named slow.
const COLOURS = {
  productive: "#2da44e",
  queued: "#8c959f",
  checkpoint_stalls: "#bf8700",
  retrained: "#cf222e",
  slow_ranks: "#fb8f44",
  first_start: "#57606a",
  detection: "#a40e26",
  reforming: "#8250df",
  startup_restore: "#0969da",
  waiting: "#d0d7de",
  ending: "#6e7781",
};

function canvasIn(root, id) {
  const canvas = document.createElement("canvas");
  canvas.id = id;
  const box = document.createElement("div");
  box.className = "chart";
  box.append(canvas);
  root.append(box);
  return canvas;
}

// One horizontal bar, a segment per part of the wall time; the wall time and ETTR beside it.
export function goodputChart(root) {
  const said = document.createElement("p");
  said.id = "goodput-said";
  root.append(said);
  const canvas = canvasIn(root, "goodput-chart");
  const chart = new window.Chart(canvas, {
    type: "bar",
    data: { labels: ["wall"], datasets: [] },
    options: {
      indexAxis: "y",
      animation: false,
      maintainAspectRatio: false,
      scales: {
        x: { stacked: true, title: { display: true, text: "seconds" } },
        y: { stacked: true, display: false },
      },
      plugins: { legend: { position: "bottom" } },
    },
  });
  return {
    show(goodput) {
      if (!goodput) {
        said.textContent = "Nothing to account yet.";
        chart.data.datasets = [];
        chart.update("none");
        return;
      }
      const parts = Object.entries(goodput.parts).filter(([, v]) => v > 0);
      said.dataset.wall = goodput.wall_s;
      said.textContent =
        `wall ${goodput.wall_s.toFixed(1)} s, ETTR ` +
        `${goodput.ettr === null ? "–" : (goodput.ettr * 100).toFixed(1) + " %"}` +
        `, ${goodput.steps_lost} step(s) lost${goodput.ended ? "" : " (so far)"}`;
      const names = parts.map(([k]) => k).join();
      if (names !== chart.$names) {
        chart.data.datasets = parts.map(([k, v]) => ({
          label: k.replace("_", " "),
          data: [v],
          backgroundColor: COLOURS[k] || "#999",
        }));
        chart.$names = names;
      } else {
        parts.forEach(([, v], i) => (chart.data.datasets[i].data = [v]));
      }
      chart.update("none");
    },
    destroy: () => chart.destroy(),
  };
}

// Each generation's mean step time over the time it trained (a line from its first step to
// its last), and each node named slow as a point at its step time then.
export function stepChart(root) {
  const canvas = canvasIn(root, "step-chart");
  const chart = new window.Chart(canvas, {
    type: "scatter",
    data: { datasets: [] },
    options: {
      animation: false,
      maintainAspectRatio: false,
      showLine: true,
      scales: {
        x: { title: { display: true, text: "seconds since the first step" } },
        y: { title: { display: true, text: "step time (s)" }, beginAtZero: true },
      },
    },
  });
  return {
    show(goodput) {
      const trained = (goodput?.trained || []).filter((t) => t.step_s !== null);
      const zero = trained.length ? trained[0].first_s : 0;
      const lines = trained.map((t) => ({
        label: `generation ${t.generation} (world ${t.world})`,
        data: [
          { x: t.first_s - zero, y: t.step_s },
          { x: t.last_s - zero, y: t.step_s },
        ],
        borderColor: "#0969da",
        backgroundColor: "#0969da",
        pointRadius: 2,
      }));
      const slow = (goodput?.slow || []).map((s) => ({ x: s.at_s - zero, y: s.step_s, node: s.node }));
      if (slow.length) {
        lines.push({
          label: `named slow: ${[...new Set(slow.map((s) => s.node))].join(", ")}`,
          data: slow,
          showLine: false,
          pointStyle: "triangle",
          pointRadius: 7,
          borderColor: "#cf222e",
          backgroundColor: "#cf222e",
        });
      }
      chart.data.datasets = lines;
      chart.update("none");
    },
    destroy: () => chart.destroy(),
  };
}
