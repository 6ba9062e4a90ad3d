// gpusession admin page. Every user-supplied string reaches the page through textContent or a
// form value, never as HTML; every change sends Jupyter's XSRF token.
"use strict";

const API = document.body.dataset.api;
const XSRF = document.body.dataset.xsrf;
const REFRESH_MS = 3000;
const PRIORITIES = ["low", "normal", "high"];
const COLORS = ["#1976d2", "#ef6c00", "#388e3c", "#7b1fa2", "#c2185b", "#0097a7", "#afb42b", "#5d4037",
  "#455a64", "#f9a825"];
let chart = null;
let lastChart = null; // redraw the chart only when its numbers changed

// ----- small helpers -------------------------------------------------------------------------------
function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value);
  }
  for (const child of [].concat(children)) node.append(child);
  return node;
}

// A failed answer becomes an Error carrying the server's JSON (message, and state: "starting" while
// the server brings its cluster up), so the page can say what the server said.
async function api(path, options = {}) {
  const response = await fetch(API + path, {
    credentials: "same-origin",
    ...options,
    headers: { "X-XSRFToken": XSRF, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw Object.assign(new Error(body.message || `${response.status} ${response.statusText}`), { body });
  return body;
}

function banner(message, kind = "info") {
  const node = document.getElementById("gs-banner");
  node.hidden = !message;
  node.textContent = message || "";
  node.className = "gs-banner " + kind;
}

const fmt = (n, digits = 1) => (n === null || n === undefined ? "" : Number(n).toFixed(digits).replace(/\.0+$/, ""));
const userPath = (user) => "/quotas/" + encodeURIComponent(user);

function age(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// ----- cluster -------------------------------------------------------------------------------------
function renderCluster(c) {
  const logical = c.logical_gpus ? el("span", { class: "gs-badge warn", text: "logical: training runs on CPU" }) : "";
  const card = (value, label, extra = "") => el("div", { class: "gs-card" },
    [el("div", { class: "value", text: value }), el("div", { class: "label" }, [label, " ", extra])]);
  document.getElementById("gs-cards").replaceChildren(
    card(fmt(c.gpus_total), "GPUs in the cluster", logical), card(fmt(c.gpus_leased), "leased"),
    card(fmt(c.gpus_free), "free"), card(String(c.requests_queued), `queued (${fmt(c.gpus_queued)} GPUs)`));
  const total = c.gpus_total || 1;
  const bar = document.getElementById("gs-bar");
  bar.replaceChildren(el("div", { style: `width:${(100 * c.gpus_leased) / total}%`, title: "leased" }),
    el("div", { class: "unmanaged", style: `width:${(100 * c.gpus_unmanaged) / total}%`, title: "unmanaged" }));
  bar.setAttribute("aria-label", `${fmt(c.gpus_leased)} of ${fmt(c.gpus_total)} GPUs leased`);
  const nodes = c.nodes.length === 1 ? "1 node" : `${c.nodes.length} nodes`;
  document.getElementById("gs-nodes").textContent = ` · ${nodes}: ${c.nodes.map((n) => fmt(n.gpus)).join(" + ")} GPUs`;
}

// ----- leases --------------------------------------------------------------------------------------
function revokeButton(lease) {
  if (lease.notice && lease.notice.kind === "revoke") return el("span", { class: "gs-muted", text: "revoking…" });
  const button = el("button", { class: "gs-button", text: "Revoke", "data-lease": lease.lease_id,
    "aria-label": `revoke lease ${lease.lease_id}` });
  let armed = null;
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = "Confirm revoke";
      button.classList.add("danger");
      armed = setTimeout(() => { armed = null; button.textContent = "Revoke"; button.classList.remove("danger"); }, 4000);
      return;
    }
    clearTimeout(armed);
    button.disabled = true;
    try {
      await api(`/leases/${lease.lease_id}`, { method: "DELETE" });
      banner(`Revoking lease ${lease.lease_id} of ${lease.user}: it was asked to stop; its GPUs are freed shortly.`);
      refresh();
    } catch (error) {
      banner(`Could not revoke lease ${lease.lease_id}: ${error.message}`, "error");
      button.disabled = false;
    }
  });
  return button;
}

function stateCell(lease) {
  if (lease.state !== "queued") return lease.notice ? `${lease.state} (${lease.notice.kind})` : lease.state;
  return `queued #${lease.position ?? "?"}` + (lease.reason ? `: ${lease.reason}` : "");
}

function renderLeases(leases) {
  const rows = leases.map((l) => el("tr", { "data-lease": l.lease_id }, [
    el("td", { text: String(l.lease_id) }), el("td", { class: "user", text: l.user }),
    el("td", { class: "num", text: fmt(l.gpus, 2) }), el("td", { text: l.priority }),
    el("td", { text: stateCell(l) }), el("td", { class: "num", text: age(l.age_s) }),
    el("td", {}, l.over_quota ? el("span", { class: "gs-badge warn", text: "over quota" }) : ""),
    el("td", { class: "sweep", text: l.sweep_id || "" }),  // a sweep's trials share its id
    el("td", {}, revokeButton(l)),
  ]));
  const empty = el("tr", {}, el("td", { colspan: 9, class: "empty", text: "No running or queued leases." }));
  document.querySelector("#gs-leases tbody").replaceChildren(...(rows.length ? rows : [empty]));
}

// ----- quotas --------------------------------------------------------------------------------------
function numberInput(value, label) {
  return el("input", { type: "number", min: "0", step: "any", placeholder: "no limit", "aria-label": label,
    value: value === null || value === undefined ? "" : String(value) });
}

function prioritySelect(value, label) {
  return el("select", { "aria-label": label }, PRIORITIES.map((p) => el("option", { value: p, text: p, selected: p === value })));
}

function quotaBody(maxGpus, gpuHours, priority) {
  const number = (input) => (input.value.trim() === "" ? (input.validity.badInput ? input.value : null) : Number(input.value));
  return JSON.stringify({ max_gpus: number(maxGpus), gpu_hours: number(gpuHours), max_priority: priority.value });
}

// Every action redraws from the server's answer, never from what the page assumes: a saved or reset
// row is replaced by the row the server sent back, then the whole page is fetched again. A rejected
// save keeps the admin's input and shows the server's message on that row only.
function quotaRow(q) {
  const maxGpus = numberInput(q.max_gpus, `max GPUs of ${q.user}`);
  const gpuHours = numberInput(q.gpu_hours, `GPU-hours of ${q.user}`);
  const priority = prioritySelect(q.max_priority, `max priority of ${q.user}`);
  const save = el("button", { class: "gs-button accept", text: "Save", disabled: true });
  const reset = el("button", { class: "gs-button", text: "Reset", disabled: q.is_default,
    title: "back to the default quota" });
  const error = el("div", { class: "row-error", role: "alert" });
  const row = el("tr", { "data-user": q.user }, [
    el("td", {}, [el("span", { class: "user", text: q.user }), error]),
    el("td", { class: "num" }, maxGpus), el("td", { class: "num" }, gpuHours), el("td", {}, priority),
    el("td", { class: "num", text: fmt(q.gpus_in_use, 2) }), el("td", { class: "num", text: hoursText(q.gpu_hours_7d).replace("GPU-hours", "h") }),
    el("td", {}, el("span", { class: q.is_default ? "gs-badge" : "gs-badge brand", text: q.is_default ? "default" : "custom" })),
    el("td", {}, [save, " ", reset]),
  ]);
  const dirty = () => { row.classList.add("dirty"); save.disabled = false; error.textContent = ""; };
  for (const input of [maxGpus, gpuHours, priority]) {
    input.addEventListener("input", dirty);
    input.addEventListener("keydown", (e) => { if (e.key === "Enter") save.click(); });
  }
  const act = async (request, done) => {
    banner("");
    save.disabled = reset.disabled = true;
    try {
      const answer = await request();
      row.replaceWith(quotaRow(answer)); // the server's values, not the inputs
      banner(done(answer));
      refresh();
    } catch (e) {
      row.classList.add("dirty");
      error.textContent = e.message;
      save.disabled = false;
      reset.disabled = q.is_default;
    }
  };
  save.addEventListener("click", () => act(
    () => api(userPath(q.user), { method: "PUT", body: quotaBody(maxGpus, gpuHours, priority) }),
    (answer) => `Saved the quota of ${answer.user}.`));
  reset.addEventListener("click", () => act(
    () => api(userPath(q.user), { method: "DELETE" }),
    (answer) => `${answer.user} is back on the default quota.`));
  return row;
}

// Rows from the server replace the page's rows, except one an admin is editing (unsaved input or a
// rejected save): that one stays as typed until saved or reset.
function renderQuotas(quotas) {
  const body = document.querySelector("#gs-quotas tbody");
  const kept = new Map();
  for (const row of body.querySelectorAll("tr[data-user]")) {
    if (row.classList.contains("dirty") || row.contains(document.activeElement)) kept.set(row.dataset.user, row);
  }
  const rows = quotas.map((q) => kept.get(q.user) || quotaRow(q));
  const empty = el("tr", {}, el("td", { colspan: 8, class: "empty", text: "No quotas set yet: everyone has the default." }));
  body.replaceChildren(...(rows.length ? rows : [empty]));
}

async function addQuota() {
  banner("");
  const error = document.getElementById("gs-add-error");
  error.textContent = "";
  const user = document.getElementById("gs-add-user").value.trim();
  if (!user) { error.textContent = "Type the user's name first."; return; }
  const body = quotaBody(document.getElementById("gs-add-max-gpus"), document.getElementById("gs-add-gpu-hours"),
    document.getElementById("gs-add-priority"));
  try {
    const answer = await api(userPath(user), { method: "PUT", body });
    for (const id of ["gs-add-user", "gs-add-max-gpus", "gs-add-gpu-hours"]) document.getElementById(id).value = "";
    banner(`Saved the quota of ${answer.user}.`);
    await refresh();
  } catch (e) {
    error.textContent = e.message;
  }
}

// ----- usage chart ---------------------------------------------------------------------------------
function themeColor(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function hoursText(hours) {
  if (hours > 0 && hours < 0.01) return "< 0.01 GPU-hours";
  return `${hours.toFixed(2)} GPU-hours`;
}

function dayLabel(isoDay) {
  return new Date(isoDay + "T00:00:00Z").toLocaleDateString(undefined, { month: "short", day: "numeric", timeZone: "UTC" });
}

function days(count) {
  const out = [];
  const today = new Date();
  for (let i = count - 1; i >= 0; i--) out.push(new Date(today.getTime() - i * 86400000).toISOString().slice(0, 10));
  return out;
}

// The chart's period is rolling (now minus N days), like the quota table's "Used (7 days)", and both
// are fetched in the same refresh: the page never shows two GPU-hour figures of different moments.
function renderUsage(rows, labels) {
  const users = [...new Set(rows.map((r) => r.user))].sort();
  const hours = (user, day) => rows.filter((r) => r.user === user && r.day === day).reduce((s, r) => s + r.gpu_seconds / 3600, 0);
  const datasets = users.map((user, i) => ({ label: user, data: labels.map((d) => hours(user, d)),
    backgroundColor: COLORS[i % COLORS.length], stack: "gpu-hours" }));
  const seconds = rows.reduce((s, r) => s + r.gpu_seconds, 0);
  document.getElementById("gs-usage-total").textContent = ` · ${hoursText(seconds / 3600)} in the last ${labels.length} days` +
    (seconds && seconds < 360 ? ` (${seconds.toFixed(1)} GPU-seconds)` : "");
  const key = JSON.stringify([labels, datasets.map((d) => [d.label, d.data])]);
  if (key !== lastChart) { lastChart = key; drawChart(labels.map(dayLabel), datasets); }
}

function drawChart(labels, datasets) {
  const text = themeColor("--jp-ui-font-color1");
  const grid = themeColor("--jp-border-color2");
  const scale = (title) => ({ stacked: true, ticks: { color: text }, grid: { color: grid },
    title: { display: Boolean(title), text: title, color: text } });
  const config = { type: "bar", data: { labels, datasets }, options: {
    responsive: true, maintainAspectRatio: false, animation: false,
    plugins: { legend: { labels: { color: text } },
      tooltip: { callbacks: { label: (item) => `${item.dataset.label}: ${item.parsed.y.toFixed(3)} GPU-hours` } } },
    scales: { x: scale(""), y: { ...scale("GPU-hours"), beginAtZero: true } } } };
  if (chart) chart.destroy();
  chart = new Chart(document.getElementById("gs-chart"), config);
}

// ----- theme, refresh loop -------------------------------------------------------------------------
async function followJupyterLabTheme() {
  const asked = new URLSearchParams(location.search).get("theme");
  if (asked === "dark" || asked === "light") return void (document.documentElement.dataset.jpThemeLight = String(asked === "light"));
  try { // JupyterLab's own theme setting, when JupyterLab is installed; otherwise the system's preference
    const response = await fetch(document.body.dataset.lab + "/api/settings/@jupyterlab/apputils-extension:themes",
      { credentials: "same-origin" });
    const setting = (await response.json()).composite || {};
    if (!setting["adaptive-theme"] && setting.theme) document.documentElement.dataset.jpThemeLight = String(!/dark/i.test(setting.theme));
  } catch (_) { /* no JupyterLab: prefers-color-scheme decides */ }
}

function usagePath() {
  const count = Number(document.getElementById("gs-range").value);
  const since = Math.floor(Date.now() / 1000) - count * 86400;
  return [`/usage?by=day&since=${since}`, days(count)];
}

let latest = 0; // the newest refresh started; an older one's answers are never drawn over it
let inFlight = 0;
// One refresh draws everything from one set of answers. An action (save, reset, add, revoke)
// starts a new one at once, and answers fetched before it are dropped: the page never goes back to
// what the server held before the action. While the server brings its cluster up it answers
// {"state": "starting", "elapsed_s": N}: the banner says so, and the page keeps asking.
async function refresh() {
  const id = ++latest;
  inFlight++;
  const [path, labels] = usagePath();
  try {
    const [cluster, leases, quotas, usage] = await Promise.all([api("/cluster"), api("/leases"), api("/quotas"), api(path)]);
    if (id !== latest) return;
    renderCluster(cluster);
    renderLeases(leases);
    renderQuotas(quotas);
    renderUsage(usage, labels);
    document.getElementById("gs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if (document.getElementById("gs-banner").classList.contains("stale")) banner("");
  } catch (error) {
    if (id !== latest) return;
    const starting = error.body && error.body.state === "starting";
    document.getElementById("gs-updated").textContent = starting ? "starting the cluster…" : "not updated";
    banner(starting ? `Starting the cluster (${error.body.elapsed_s} s)… the page fills in when it is up.`
      : `Cannot reach the broker: ${error.message}`, starting ? "info stale" : "error stale");
  } finally {
    inFlight--;
  }
}

// The controls answer from the moment the page is there: an Add clicked while JupyterLab's theme
// setting is still on its way is not lost. The first drawing waits for the theme (the chart's colours).
async function start() {
  document.getElementById("gs-add").addEventListener("click", addQuota);
  document.getElementById("gs-add-user").addEventListener("keydown", (e) => { if (e.key === "Enter") addQuota(); });
  document.getElementById("gs-range").addEventListener("change", () => refresh());
  await followJupyterLabTheme();
  await refresh();
  setInterval(() => { if (!inFlight) refresh(); }, REFRESH_MS); // a slow server is not asked twice at once
}

start();
