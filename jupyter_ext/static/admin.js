// gpusession admin page. Every user-supplied string reaches the page through textContent or a
// form value, never as HTML; every change sends Jupyter's XSRF token.
"use strict";

const API = document.body.dataset.api;
const XSRF = document.body.dataset.xsrf;
const REFRESH_MS = 3000;
const USAGE_REFRESH_MS = 30000;
const PRIORITIES = ["low", "normal", "high"];
const COLORS = ["#1976d2", "#ef6c00", "#388e3c", "#7b1fa2", "#c2185b", "#0097a7", "#afb42b", "#5d4037",
  "#455a64", "#f9a825"];
let chart = null;

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

async function api(path, options = {}) {
  const response = await fetch(API + path, {
    credentials: "same-origin",
    ...options,
    headers: { "X-XSRFToken": XSRF, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.message || `${response.status} ${response.statusText}`);
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
    el("td", {}, revokeButton(l)),
  ]));
  const empty = el("tr", {}, el("td", { colspan: 8, class: "empty", text: "No running or queued leases." }));
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

async function saveQuota(user, body, errorCell) {
  try {
    await api(userPath(user), { method: "PUT", body });
    banner(`Saved the quota of ${user}.`);
    return true;
  } catch (error) {
    if (errorCell) errorCell.textContent = error.message;
    else banner(`Could not save the quota of ${user}: ${error.message}`, "error");
    return false;
  }
}

function quotaRow(q) {
  const maxGpus = numberInput(q.max_gpus, `max GPUs of ${q.user}`);
  const gpuHours = numberInput(q.gpu_hours, `GPU-hours of ${q.user}`);
  const priority = prioritySelect(q.max_priority, `max priority of ${q.user}`);
  const save = el("button", { class: "gs-button accept", text: "Save", disabled: true });
  const reset = el("button", { class: "gs-button", text: "Reset", disabled: q.is_default,
    title: "back to the default quota" });
  const error = el("div", { class: "row-error" });
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
  save.addEventListener("click", async () => {
    save.disabled = true;
    if (await saveQuota(q.user, quotaBody(maxGpus, gpuHours, priority), error)) { row.classList.remove("dirty"); settled(); }
    else save.disabled = false;
  });
  reset.addEventListener("click", async () => {
    try { await api(userPath(q.user), { method: "DELETE" }); banner(`${q.user} is back on the default quota.`); settled(); }
    catch (e) { error.textContent = e.message; }
  });
  return row;
}

// After a change: show the server's values, unless another row still holds unsaved edits.
function settled() {
  if (document.activeElement) document.activeElement.blur();
  refresh();
}

function renderQuotas(quotas, force) {
  const body = document.querySelector("#gs-quotas tbody");
  const editing = body.querySelector("tr.dirty") || body.contains(document.activeElement);
  if (editing && !force) return; // never throw away what an admin is typing
  const rows = quotas.map(quotaRow);
  const empty = el("tr", {}, el("td", { colspan: 8, class: "empty", text: "No quotas set yet: everyone has the default." }));
  body.replaceChildren(...(rows.length ? rows : [empty]));
}

async function addQuota() {
  const user = document.getElementById("gs-add-user").value.trim();
  if (!user) return banner("Type the user's name first.", "error");
  const body = quotaBody(document.getElementById("gs-add-max-gpus"), document.getElementById("gs-add-gpu-hours"),
    document.getElementById("gs-add-priority"));
  if (await saveQuota(user, body, null)) {
    for (const id of ["gs-add-user", "gs-add-max-gpus", "gs-add-gpu-hours"]) document.getElementById(id).value = "";
    settled();
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

async function refreshUsage() {
  const count = Number(document.getElementById("gs-range").value);
  const labels = days(count);
  const rows = await api(`/usage?by=day&since=${labels[0]}`);
  const users = [...new Set(rows.map((r) => r.user))].sort();
  const hours = (user, day) => rows.filter((r) => r.user === user && r.day === day).reduce((s, r) => s + r.gpu_seconds / 3600, 0);
  const datasets = users.map((user, i) => ({ label: user, data: labels.map((d) => hours(user, d)),
    backgroundColor: COLORS[i % COLORS.length], stack: "gpu-hours" }));
  const seconds = rows.reduce((s, r) => s + r.gpu_seconds, 0);
  document.getElementById("gs-usage-total").textContent = ` · ${hoursText(seconds / 3600)} in total` +
    (seconds && seconds < 360 ? ` (${seconds.toFixed(1)} GPU-seconds)` : "");
  drawChart(labels.map(dayLabel), datasets);
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

async function refresh(force = false) {
  try {
    const [cluster, leases, quotas] = await Promise.all([api("/cluster"), api("/leases"), api("/quotas")]);
    renderCluster(cluster);
    renderLeases(leases);
    renderQuotas(quotas, force);
    document.getElementById("gs-updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    if (document.getElementById("gs-banner").classList.contains("stale")) banner("");
  } catch (error) {
    banner(`Cannot reach the broker: ${error.message}`, "error stale");
  }
}

async function start() {
  await followJupyterLabTheme();
  document.getElementById("gs-add").addEventListener("click", addQuota);
  document.getElementById("gs-range").addEventListener("change", () => refreshUsage().catch((e) => banner(e.message, "error")));
  await refresh(true);
  await refreshUsage().catch((e) => banner(`Cannot load usage: ${e.message}`, "error"));
  setInterval(refresh, REFRESH_MS);
  setInterval(() => refreshUsage().catch(() => {}), USAGE_REFRESH_MS);
}

start();
