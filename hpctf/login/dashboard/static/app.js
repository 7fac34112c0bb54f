// hpctf ui: the runs page (#/), a run's page (#/run?path=...) and a sweep's (#/sweep?path=...).
// Each refresh is ONE request to the server (/api/runs, /api/run, /api/sweep): one typed call,
// one SSH round trip from a laptop. Run data (names, log lines, config values) is put in the
// page as text only: el() and textContent, never innerHTML.
"use strict";

const REFRESH_MS = { runs: 3000, run: 2000, sweep: 5000 };
const HOURS_EVERY_MS = 60000;  // sacct at most once a minute per page
const state = { timer: null, hoursAt: 0, hours: {}, sort: { key: "created", dir: -1 },
                filter: "", rank: 0, page: "" };

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.entries(props || {}).forEach(([k, v]) => {
    if (v === undefined || v === null) return;
    if (k === "className") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  });
  children.flat().forEach((c) => {
    if (c === null || c === undefined) return;
    node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  });
  return node;
}

// `node`'s children replaced by `children` (nulls left out: a part a page does not have).
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

function num(v, digits) {
  if (typeof v !== "number" || !Number.isFinite(v)) return "-";
  return Number(v.toPrecision(digits || 4)).toString();
}

function duration(s) {
  if (typeof s !== "number") return "-";
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60), sec = Math.floor(s % 60);
  const pad = (n) => String(n).padStart(2, "0");
  if (d) return `${d}d${pad(h)}:${pad(m)}:${pad(sec)}`;
  return h ? `${h}:${pad(m)}:${pad(sec)}` : `${m}:${pad(sec)}`;
}

function slurmWord(s) {
  if (!s) return "local";
  if (!s.state) return "-";
  return s.reason ? `${s.state} (${s.reason})` : s.state;
}

function pendingText(s) {
  if (!s || !["PENDING", "REQUEUED", "REQUEUE_HOLD"].includes(s.state)) return "";
  const when = s.start && s.start !== "N/A" ? `; may start ${s.start}` : "";
  return `${s.reason || "pending"}${when}`;
}

function hoursCells(h) {
  if (!h) return ["…", "…"];
  if (typeof h === "string") return [h, "-"];
  return [h.node_hours.toFixed(2), h.gpu_hours.toFixed(2)];
}

function evalText(e) {
  const keys = Object.keys(e || {}).sort();
  return keys.map((k) => `${k} ${num(e[k])}`).join(", ") || "-";
}

function setStatus(text, error) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = error ? "error" : "";
}

async function fetchPage(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `${response.status}`);
  return body;
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { path, params: new URLSearchParams(query || "") };
}

function link(page, path, text) {
  return el("a", { href: `#/${page}?path=${encodeURIComponent(path)}` }, text);
}

// --- the runs page ------------------------------------------------------------------------

const RUN_COLUMNS = [
  ["run", "Run", (d) => d.run],
  ["state", "State", (d) => d.state],
  ["step", "Step", (d) => d.step === null ? -1 : d.step],
  ["eta_s", "ETA", (d) => d.eta_s === null ? Infinity : d.eta_s],
  ["eval", "Last eval", (d) => evalText(d.last_eval)],
  ["node_h", "Node-h", (d) => (d.hours && d.hours.node_hours) || 0],
  ["gpu_h", "GPU-h", (d) => (d.hours && d.hours.gpu_hours) || 0],
  ["slurm", "Slurm", (d) => slurmWord(d.slurm)],
  ["pending", "Pending: why, may start", (d) => pendingText(d.slurm)],
  ["created", "Created", (d) => d.created || ""],
];

function runRow(d) {
  const [nodeH, gpuH] = hoursCells(d.hours || state.hours[d.path]);
  const step = d.step === null ? "-" : `${d.step}/${d.total_steps || "?"}`;
  return el("tr", { className: "run", dataset: { path: d.path, state: d.state } },
    el("td", { className: "name" }, link("run", d.path, d.run)),
    el("td", { className: `state state-${d.state}` }, d.state, d.why ? el("div", { className: "muted why" }, d.why) : null),
    el("td", { className: "num step" }, step),
    el("td", { className: "num" }, duration(d.eta_s)),
    el("td", {}, evalText(d.last_eval)),
    el("td", { className: "num" }, nodeH),
    el("td", { className: "num" }, gpuH),
    el("td", { className: "slurm" }, slurmWord(d.slurm)),
    el("td", { className: "pending" }, pendingText(d.slurm)),
    el("td", {}, d.created || ""));
}

function sortedRuns(runs) {
  const column = RUN_COLUMNS.find((c) => c[0] === state.sort.key) || RUN_COLUMNS[9];
  const needle = state.filter.toLowerCase();
  const shown = runs.filter((d) => !needle || `${d.run} ${d.state} ${slurmWord(d.slurm)}`
    .toLowerCase().includes(needle));
  return shown.sort((a, b) => {
    const x = column[2](a), y = column[2](b);
    return (x < y ? -1 : x > y ? 1 : 0) * state.sort.dir;
  });
}

function runsTable(runs) {
  const head = el("tr", {}, RUN_COLUMNS.map(([key, title]) => el("th", {
    className: state.sort.key === key ? (state.sort.dir > 0 ? "sorted-asc" : "sorted-desc") : "",
    dataset: { key },
    onclick: () => {
      state.sort = { key, dir: state.sort.key === key ? -state.sort.dir : 1 };
      refresh();
    },
  }, title)));
  return el("table", { id: "runs" }, el("thead", {}, head),
    el("tbody", {}, sortedRuns(runs).map(runRow)));
}

function sweepsTable(sweeps) {
  if (!sweeps.length) return null;
  return el("div", {}, el("h2", {}, "Sweeps and searches"),
    el("table", { id: "sweeps" },
      el("thead", {}, el("tr", {}, ["Sweep", "Points", "States", "Job", "Created"].map((t) => el("th", {}, t)))),
      el("tbody", {}, sweeps.map((s) => el("tr", { className: "sweep" },
        el("td", { className: "name" }, link("sweep", s.path, s.sweep)),
        el("td", { className: "num" }, s.points),
        el("td", {}, Object.entries(s.states).map(([k, n]) => `${n} ${k}`).join(", ")),
        el("td", {}, s.job || "-"),
        el("td", {}, s.created || ""))))));
}

async function showRuns() {
  const wantHours = Date.now() - state.hoursAt > HOURS_EVERY_MS;
  const page = await fetchPage(`/api/runs${wantHours ? "?hours=1" : ""}`);
  if (wantHours) {
    state.hoursAt = Date.now();
    state.hours = Object.fromEntries(page.runs.map((d) => [d.path, d.hours]));
  }
  document.getElementById("where").textContent = page.root;
  const filter = el("input", { className: "filter", id: "filter", type: "search",
    placeholder: "filter: name, state, Slurm", value: state.filter,
    oninput: (e) => { state.filter = e.target.value; renderRuns(page); } });
  const main = document.getElementById("main");
  const focused = document.activeElement && document.activeElement.id === "filter";
  fill(main,
    el("h1", {}, `Runs (${page.runs.length}${page.unread ? ` + ${page.unread} not read yet` : ""})`),
    el("div", { className: "notes" }, page.notes.map((n) => el("div", {}, n))),
    filter, el("div", { id: "runs-holder" }), sweepsTable(page.sweeps));
  renderRuns(page);
  if (focused) { filter.focus(); filter.setSelectionRange(state.filter.length, state.filter.length); }
  document.body.dataset.loaded = "runs";
}

function renderRuns(page) {
  document.getElementById("runs-holder").replaceChildren(runsTable(page.runs));
}

// --- a run's page -------------------------------------------------------------------------

function facts(pairs) {
  return el("dl", { className: "facts" }, pairs.filter((p) => p[1] !== null && p[1] !== "")
    .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { fact: k } }, v)]));
}

// What the chief logs beside the training values (progress and the worker's health): not a
// curve of the model's.
const HOUSEKEEPING = new Set(["step", "time", "epoch", "steps_per_s", "rss_mb", "threads",
  "total_steps", "save_s"]);

function curves(rows) {
  const train = {}, evals = {};
  rows.forEach((r) => {
    Object.entries(r).forEach(([k, v]) => {
      if (k === "eval" && v && typeof v === "object") {
        Object.entries(v).forEach(([m, y]) => {
          if (typeof y === "number") (evals[m] = evals[m] || []).push([r.step, y]);
        });
      } else if (typeof v === "number" && !HOUSEKEEPING.has(k)) {
        (train[k] = train[k] || []).push([r.step, v]);
      }
    });
  });
  return { train, evals };
}

// One start's steps as a bar over the run's total: the history as a timeline in steps.
function spanBar(start, doc, last) {
  const total = doc.total_steps || Math.max(1, ...doc.starts.map((s) => s.end_step || 0), doc.step || 0);
  const end = start.end_step !== null ? start.end_step : last ? (doc.step || start.from_step) : start.from_step;
  const bar = el("div", { className: `bar end-${start.reason || "open"}` });
  bar.style.left = `${Math.min(100, 100 * start.from_step / total)}%`;
  bar.style.width = `${Math.max(0.5, Math.min(100, 100 * (end - start.from_step) / total))}%`;
  return el("div", { className: "span", title: `steps ${start.from_step}-${end}` }, bar);
}

function historyTable(doc) {
  const rows = doc.starts.map((s, i) => el("tr", { className: "start" },
    el("td", { className: "num" }, i + 1),
    el("td", { className: "timeline" }, spanBar(s, doc, i === doc.starts.length - 1)),
    el("td", {}, s.job || "-"),
    el("td", { className: "num" }, s.from_step), el("td", {}, s.nodes || "-"),
    el("td", {}, s.reason || "not ended"), el("td", {}, s.cause || "-"),
    el("td", { className: "num" }, s.end_step === null ? "-" : s.end_step),
    el("td", { className: "num" }, s.exit_code === null ? "-" : s.exit_code),
    el("td", {}, s.user_code || "")));
  return el("table", { id: "history" },
    el("thead", {}, el("tr", {}, ["#", "Steps", "Job", "From step", "Nodes", "Ended", "Cause",
      "At step", "Exit", "User code"].map((t) => el("th", {}, t)))),
    el("tbody", {}, rows));
}

async function showRun(path) {
  const wantHours = state.page !== `run:${path}` || Date.now() - state.hoursAt > HOURS_EVERY_MS;
  const q = new URLSearchParams({ path, rank: String(state.rank) });
  if (wantHours) q.set("hours", "1");
  const page = await fetchPage(`/api/run?${q}`);
  const d = page.document;
  if (wantHours) { state.hoursAt = Date.now(); state.hours[path] = d.hours; }
  const [nodeH, gpuH] = hoursCells(d.hours || state.hours[path]);
  const { train, evals } = curves(page.rows);
  const log = el("pre", { id: "log" }, page.log || "(no log yet)");
  const ranks = el("select", { id: "rank", onchange: (e) => { state.rank = Number(e.target.value); refresh(); } },
    (page.ranks.length ? page.ranks : [0]).map((r) => el("option", { value: r }, `rank ${r}`)));
  ranks.value = String(page.rank);
  const trainChart = el("div", { className: "chart", id: "train-chart" });
  const evalChart = el("div", { className: "chart", id: "eval-chart" });
  fill(document.getElementById("main"),
    el("h1", { id: "run-name" }, d.run),
    facts([
      ["state", `${d.state}${d.why ? ` (${d.why})` : ""}`],
      ["step", d.step === null ? "-" : `${d.step}/${d.total_steps || "?"}`],
      ["loss", num(d.loss)], ["steps/s", num(d.steps_per_s, 3)],
      ["elapsed", duration(d.elapsed_s)], ["ETA", duration(d.eta_s)],
      ["Slurm", d.job ? `job ${d.job}: ${slurmWord(d.slurm)}` : slurmWord(d.slurm)],
      ["pending", pendingText(d.slurm)],
      ["node-hours", nodeH], ["GPU-hours", gpuH],
      ["path", d.path],
    ]),
    el("div", { className: "charts" }, trainChart, evalChart),
    el("h2", {}, "History"), historyTable(d),
    el("h2", {}, "Log ", ranks), log,
    el("h2", {}, "Config (secrets as ***)"),
    el("pre", { id: "config" }, JSON.stringify(page.config, null, 2)));
  HpctfCharts.lines(trainChart, "training", "step",
    Object.entries(train).map(([k, pts]) => ({ label: k, points: pts })), page.marks);
  HpctfCharts.lines(evalChart, "evaluation", "step",
    Object.entries(evals).map(([k, pts]) => ({ label: `eval ${k}`, points: pts, dots: true, line: true })),
    page.marks);
  log.scrollTop = log.scrollHeight;
  document.getElementById("where").textContent = d.path;
  document.body.dataset.loaded = "run";
}

// --- a sweep's or search's page -----------------------------------------------------------

function trialsTable(page) {
  const doc = page.document;
  const rows = page.search ? doc.trials : doc.points;
  const best = page.search && doc.best ? doc.best.trial : null;
  return el("table", { id: "trials" },
    el("thead", {}, el("tr", {}, [page.search ? "Trial" : "Point", "Parameters", "State",
      page.search ? "Value" : "Last eval", "Step", "Slurm", "Run"].map((t) => el("th", {}, t)))),
    el("tbody", {}, rows.map((t) => el("tr", {
      className: `trial${t.trial !== undefined && t.trial === best ? " best" : ""}`,
      dataset: { state: t.state } },
    el("td", { className: "num" }, page.search ? t.trial : t.index),
    el("td", {}, Object.entries(t.params || t.values || {}).map(([k, v]) => `${k.split(".").pop()}=${v}`).join(" ")),
    el("td", { className: `state state-${t.state}` }, t.state),
    el("td", { className: "num" }, page.search ? num(t.value) : evalText(t.eval)),
    el("td", { className: "num" }, t.step === null ? "-" : `${t.step}/${t.total_steps || "?"}`),
    el("td", {}, slurmWord(t.slurm)),
    el("td", { className: "name" }, link("run", t.run_dir, t.run_dir.split("/").pop()))))));
}

async function showSweep(path) {
  const page = await fetchPage(`/api/sweep?${new URLSearchParams({ path })}`);
  const objective = el("div", { className: "chart", id: "objective-chart" });
  const together = el("div", { className: "chart", id: "curves-chart" });
  const best = page.search && page.document.best;
  fill(document.getElementById("main"),
    el("h1", { id: "sweep-name" }, path.split("/").pop()),
    page.search ? facts([
      ["objective", `${page.metric} (${page.direction})`],
      ["trials", `${page.document.budget.asked} asked of ${page.document.budget.trials}`],
      ["best", best ? `trial ${best.trial}: ${num(best.value)}` : "-"],
    ]) : null,
    el("div", { className: "charts" }, page.search ? objective : null, together),
    el("h2", {}, page.search ? "Trials" : "Points"), trialsTable(page));
  if (page.search) {
    HpctfCharts.lines(objective, `${page.metric} over trials`, "trial", [
      { label: "trial", points: page.objective, dots: true },
      { label: "best so far", points: page.best_so_far, width: 2, stepped: true },
    ], []);
  }
  HpctfCharts.lines(together, `${page.metric || "eval"} of each`, "step",
    page.curves.map((c) => ({ label: c.label, points: c.points, dots: true, line: true })),
    page.curves.filter((c) => c.pruned_at).map((c) => ({ step: c.pruned_at[0], kind: "pruned", text: `${c.label} pruned` })));
  document.getElementById("where").textContent = path;
  document.body.dataset.loaded = "sweep";
}

// --- refresh loop -------------------------------------------------------------------------

async function refresh() {
  clearTimeout(state.timer);
  const { path, params } = route();
  const page = path === "/run" ? "run" : path === "/sweep" ? "sweep" : "runs";
  const key = `${page}:${params.get("path") || ""}`;
  const began = performance.now();
  try {
    if (page === "run") await showRun(params.get("path"));
    else if (page === "sweep") await showSweep(params.get("path"));
    else await showRuns();
    state.page = key;
    setStatus(`updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(String(error.message || error), true);
  }
  // What the page took (benchmarks/bench_dashboard.py reads them): the first paint since the
  // navigation began, and each refresh from its request to its table in the page.
  const body = document.body.dataset;
  if (!body.firstPaintMs) body.firstPaintMs = String(Math.round(performance.now()));
  body.refreshMs = String(Math.round(performance.now() - began));
  body.refreshes = String(Number(body.refreshes || 0) + 1);
  state.timer = setTimeout(refresh, REFRESH_MS[page]);
}

window.addEventListener("hashchange", () => { state.rank = 0; state.hoursAt = 0; refresh(); });
refresh();
