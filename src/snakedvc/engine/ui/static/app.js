// snakedvc ui: one page, views chosen by the address's #fragment, data from /api (same origin;
// the token is in a cookie). Each view refreshes itself while it is shown.
"use strict";

const view = document.getElementById("view");
let timer = null;

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

async function api(path) {
  const response = await fetch("/api/" + path, {credentials: "same-origin"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function every(ms, draw) {
  const tick = async () => {
    try {
      await draw();
      document.getElementById("status").textContent = "";
    } catch (error) {
      document.getElementById("status").textContent = error.message;
    }
  };
  tick();
  timer = setInterval(tick, ms);
}

function table(headers, rows, rowClass) {
  const head = "<tr>" + headers.map((h) => `<th>${esc(h)}</th>`).join("") + "</tr>";
  const body = rows.map((row, i) => `<tr class="${rowClass ? rowClass(i) : ""}">` + row.join("") + "</tr>").join("");
  return `<table>${head}${body}</table>`;
}

function cell(value, attrs = "") {
  return `<td ${attrs}>${esc(value)}</td>`;
}

// One chart per name: traces {name: [[step, value], ...]}; the div says how many points it shows.
function chart(div, title, traces, wide) {
  const data = Object.entries(traces).map(([name, points]) => ({
    name, x: points.map((p) => p[0]), y: points.map((p) => p[1]), mode: "lines+markers", type: "scatter",
  }));
  div.className = wide ? "chart wide" : "chart";
  div.dataset.points = data.reduce((n, trace) => n + trace.x.length, 0);
  div.dataset.traces = data.length;
  Plotly.react(div, data, {title: {text: title, font: {size: 14}}, margin: {t: 36, l: 50, r: 10, b: 40},
    xaxis: {title: {text: "step"}}, showlegend: data.length > 1}, {displayModeBar: false, responsive: false});
}

function charts(container, groups, wide) {
  for (const [key, traces] of Object.entries(groups)) {
    let div = container.querySelector(`[data-curve="${CSS.escape(key)}"]`);
    if (!div) {
      div = document.createElement("div");
      div.dataset.curve = key;
      container.appendChild(div);
    }
    chart(div, key, traces, wide);
  }
}

// --- views ------------------------------------------------------------------------------

async function runsView() {
  view.innerHTML = `<h1>Runs</h1><div id="runs"></div>`;
  every(2000, async () => {
    const runs = await api("runs");
    const rows = runs.map((r) => [
      `<td><a href="#/run/${esc(r.id)}">${esc(r.id)}</a></td>`, cell(r.name), cell(r.state, `class="state-${esc(r.state)}"`),
      cell(r.jobs), cell(r.started), cell(r.slurm_jobs.join(", ") || "-"),
      cell(r.training.map((t) => t.summary).join("; ") || r.note || ""), cell(r.experiments.join(", ")),
    ]);
    document.getElementById("runs").innerHTML = runs.length
      ? table(["run", "name", "state", "jobs", "started", "SLURM jobs", "now", "experiments"], rows)
      : `<p class="muted">No runs yet: <code>snakedvc submit</code> starts one.</p>`;
  });
}

async function runView(id) {
  view.innerHTML = `<h1>Run ${esc(id)}</h1><div id="head"></div><h2>Curves</h2><div id="curves" class="charts"></div>
    <h2>Params and metrics</h2><div id="record"></div>
    <div id="jobs"></div><pre id="joblog" hidden></pre>
    <h2>DAG</h2><p id="dagnote" class="muted"></p><div id="dag" class="dag"></div>
    <h2>Log</h2><p id="logpath" class="muted"></p><pre id="log"></pre>`;
  let drawnFor = null;  // the run's state the DAG was drawn in: drawn again when it changes
  const drawDag = async (state) => {
    drawnFor = state;
    const dag = await api(`runs/${encodeURIComponent(id)}/dag`);
    document.getElementById("dag").innerHTML = dag.svg;
    document.getElementById("dagnote").textContent = dag.note;
    document.getElementById("dag").dataset.drawn = dag.svg ? "1" : "0";
  };
  window.showJobLog = async (jobid) => {
    const log = await api(`runs/${encodeURIComponent(id)}/jobs/${encodeURIComponent(jobid)}`);
    const pre = document.getElementById("joblog");
    pre.hidden = false;
    pre.textContent = `${log.path}\n\n${log.lines.join("\n")}`;
  };
  every(1000, async () => {
    const run = await api("runs/" + encodeURIComponent(id));
    document.getElementById("head").innerHTML = table(["state", "jobs", "SLURM jobs", "started", "experiments", "note"],
      [[cell(run.state, `class="state-${esc(run.state)}"`), cell(run.jobs), cell(run.slurm_jobs.join(", ") || "-"),
        cell(run.started), cell(run.experiments.join(", ")), cell(run.note || "")]]);
    const groups = {};
    for (const [folder, curves] of Object.entries(run.curves)) {
      for (const [name, points] of Object.entries(curves)) groups[`${folder}: ${name}`] = {[name]: points};
    }
    charts(document.getElementById("curves"), groups, false);
    await showRecord(run);
    if (run.state !== drawnFor) drawDag(run.state);
    document.getElementById("jobs").innerHTML = run.slurm.length ? "<h2>SLURM jobs</h2>" + table(
      ["job", "rule", "state", "elapsed", "nodes", "log"], run.slurm.map((j) => [cell(j.id), cell(j.rule), cell(j.state),
        cell(j.elapsed), cell(j.nodes), j.log ? `<td><a href="javascript:showJobLog('${esc(j.id)}')">log</a></td>` : cell("")])) : "";
    document.getElementById("logpath").textContent = run.log_path;
    const log = document.getElementById("log");
    const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = run.log.join("\n");
    if (atEnd) log.scrollTop = log.scrollHeight;  // follows the log's end unless the reader scrolled up
  });
}

// A run's params and metrics: those of the experiments it saved (DVC's, as the Experiments page
// reads them); until it has saved one, what its command line gave.
async function showRecord(run) {
  const div = document.getElementById("record");
  const given = run.given.length ? `<p>Given on its command line: <code>${esc(run.given.join(" "))}</code></p>` : "";
  if (!run.experiments.length) {
    div.innerHTML = given + `<p class="muted">Its experiment's params and metrics show here once it is saved.</p>`;
    return;
  }
  const listing = await api("experiments");
  const rows = listing.rows.filter((r) => run.experiments.includes(r.name));
  const filled = rows.filter((r) => Object.keys(r.params).length + Object.keys(r.metrics).length);
  if (!filled.length) {
    div.innerHTML = given + `<p class="muted">DVC is reading the experiment's params and metrics…</p>`;
    return;
  }
  div.innerHTML = given + filled.map((r) => `<h3>${esc(r.name)}</h3>` + table(["", "value"],
    [...Object.entries(r.params).map(([k, v]) => [`<td data-param="${esc(k)}">${esc(k)}</td>`, cell(v)]),
     ...Object.entries(r.metrics).map(([k, v]) => [`<td data-metric="${esc(k)}">${esc(k)}</td>`, cell(v)])])).join("");
}

async function sweepsView() {
  view.innerHTML = `<h1>Sweeps</h1><div id="sweeps"></div>`;
  every(2000, async () => {
    const sweeps = await api("sweeps");
    const rows = sweeps.map((s) => [`<td><a href="#/sweep/${encodeURIComponent(s.name)}">${esc(s.name)}</a></td>`,
      cell(s.trials), cell(s.ended ? "ended" : "running"), cell(s.folder)]);
    document.getElementById("sweeps").innerHTML = sweeps.length
      ? table(["sweep", "trials", "state", "folder"], rows) : `<p class="muted">No sweeps in this project yet.</p>`;
  });
}

function sweepRows(sweep) {
  return Object.entries(sweep.trials).map(([id, t]) => {
    const rungs = Object.keys(t.rungs);
    const last = rungs.length ? t.rungs[rungs[rungs.length - 1]] : {};
    const value = last[sweep.metric];
    const params = Object.entries(t.params || {}).map(([k, v]) => `${k}=${v}`).join(", ");
    return {id, row: [`<td data-trial="${esc(id)}">${esc(id)}${t.best ? " ★" : ""}</td>`, cell(rungs.join(", ") || "-"),
      cell(typeof value === "number" ? value.toFixed(4) : "-"), cell(t.fate || (sweep.ended ? "ended" : "")), cell(params)]};
  });
}

function parallel(div, sweep) {
  const trials = Object.values(sweep.trials).filter((t) => t.params && Object.keys(t.rungs).length);
  if (!trials.length) return;
  const keys = Object.keys(trials[0].params);
  const dims = keys.map((k) => ({label: k, values: trials.map((t) => Number(t.params[k]))}));
  dims.push({label: "rung reached", values: trials.map((t) => Math.max(...Object.keys(t.rungs).map(Number)))});
  const metricOf = (t) => t.rungs[Object.keys(t.rungs).pop()][sweep.metric] ?? 0;
  dims.push({label: sweep.metric, values: trials.map(metricOf)});
  div.dataset.lines = trials.length;
  Plotly.react(div, [{type: "parcoords", line: {color: trials.map(metricOf), colorscale: "Viridis"}, dimensions: dims}],
    {title: {text: `Parameters against the rung reached and ${sweep.metric}`, font: {size: 14}}, margin: {t: 80, l: 60, r: 60}},
    {displayModeBar: false});
}

async function sweepView(name) {
  view.innerHTML = `<h1>Sweep ${esc(name)}</h1><div id="trials"></div><div id="curves" class="charts"></div>
    <div id="parallel" class="chart wide"></div><h2>What <code>sweep-explain</code> says</h2><pre id="explain"></pre>`;
  every(2000, async () => {
    const sweep = await api("sweeps/" + encodeURIComponent(name));
    const rows = sweepRows(sweep);
    document.getElementById("trials").innerHTML = `<p>${rows.length} trials, ${sweep.ended ? "ended" : "running"}.</p>` +
      table(["trial", "rungs", `${sweep.metric} (last rung)`, "status and why", "params"], rows.map((r) => r.row));
    const groups = {};
    for (const [id, t] of Object.entries(sweep.trials)) {
      for (const [metric, points] of Object.entries(t.curves || {})) (groups[metric] ??= {})[id] = points;
    }
    charts(document.getElementById("curves"), groups, false);
    parallel(document.getElementById("parallel"), sweep);
    document.getElementById("explain").textContent = sweep.explain || "(not an asha sweep: its report tells the rungs)";
  });
}

async function experimentsView() {
  view.innerHTML = `<h1>Experiments</h1><p>Pick two or more, then <button id="compare">Compare</button>
    <span id="reading" class="muted"></span></p><div id="exps"></div>`;
  document.getElementById("compare").onclick = () => {
    const picked = [...document.querySelectorAll("#exps input:checked")].map((i) => "rev=" + encodeURIComponent(i.value));
    location.hash = "#/compare?" + picked.join("&");
  };
  every(2000, async () => {
    const listing = await api("experiments");
    const checked = new Set([...document.querySelectorAll("#exps input:checked")].map((i) => i.value));
    const rows = listing.rows.map((e) => [`<td><input type="checkbox" value="${esc(e.rev)}" data-name="${esc(e.name)}"
      ${checked.has(e.rev) ? "checked" : ""}></td>`, cell(e.name || e.rev.slice(0, 7)), cell(e.baseline),
      cell(e.is_baseline ? "baseline" : "experiment"), cell(Object.entries(e.metrics).map(([k, v]) => `${k}=${v}`).join(", "))]);
    document.getElementById("exps").innerHTML = table(["", "experiment", "baseline", "kind", "metrics"], rows);
    document.getElementById("reading").textContent = listing.error || (listing.complete ? "" : "DVC is reading their params and metrics…");
    document.getElementById("exps").dataset.complete = listing.complete ? 1 : 0;
    if (listing.complete) clearInterval(timer);
  });
}

async function compareView(query) {
  view.innerHTML = `<h1>Compare</h1><div id="side"></div><h2>Curves</h2><div id="curves" class="charts"></div>`;
  const found = await api("compare?" + query);
  const names = found.experiments.map((e) => e.name || e.rev.slice(0, 7));
  let html = "";
  for (const kind of ["params", "metrics"]) {
    const differ = new Set(found.differ[kind]);
    const rows = found.keys[kind].map((key) => [`<td data-key="${esc(key)}" data-differs="${differ.has(key) ? 1 : 0}">${esc(key)}</td>`,
      ...found.experiments.map((e) => cell(JSON.stringify(e[kind][key] ?? null)))]);
    html += `<h2>${kind}</h2>` + table(["key", ...names], rows, (i) => (differ.has(found.keys[kind][i]) ? "differs" : ""));
  }
  document.getElementById("side").innerHTML = html;
  const groups = {};
  for (const [exp, curves] of Object.entries(found.curves)) {
    for (const [metric, points] of Object.entries(curves)) (groups[metric] ??= {})[exp] = points;
  }
  charts(document.getElementById("curves"), groups, false);
}

function route() {
  clearInterval(timer);
  const hash = location.hash.slice(2) || "runs";
  const [path, query] = hash.split("?");
  const [page, arg] = path.split("/").map(decodeURIComponent);
  const views = {runs: runsView, run: () => runView(arg), sweeps: sweepsView, sweep: () => sweepView(arg),
    experiments: experimentsView, compare: () => compareView(query || "")};
  (views[page] || runsView)().catch((error) => { view.innerHTML = `<p class="state-failed">${esc(error.message)}</p>`; });
}

window.addEventListener("hashchange", route);
route();
