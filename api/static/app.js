// The stepwise page: a prompt form, the tenant's recent jobs with live progress, and an engine panel.
// It uses only the public HTTP API. The key lives in localStorage and travels only in the
// Authorization header; images are fetched with that header and shown through blob: URLs.
"use strict";

const KEY_STORAGE = "stepwise.apiKey";
const POLL_MS = 1000;
const NUM_RECENT_JOBS = 12;
const FINAL_STATES = new Set(["succeeded", "failed", "canceled", "expired"]);

const thumbnails = new Map(); // image URL -> blob: URL (fetched once)
let pollTimer = null;

const $ = (id) => document.getElementById(id);

function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || "";
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${apiKey()}`, ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers, cache: "no-store" });
  const isJson = (response.headers.get("Content-Type") || "").includes("json");
  const body = isJson ? await response.json() : null;
  if (!response.ok) {
    const error = (body && body.error) || {};
    const where = error.field ? ` (${error.field})` : "";
    throw Object.assign(new Error(`${error.message || response.statusText}${where}`), { status: response.status });
  }
  return body;
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, value);
  }
  node.append(...children);
  return node;
}

function say(id, message, kind = "") {
  const node = $(id);
  node.textContent = message;
  node.className = kind;
}

// ---- the key ----

function showKeyState() {
  const saved = apiKey() !== "";
  say("key-status", saved ? "A key is saved in this browser." : "No key saved yet.", saved ? "ok" : "");
  $("submit-job").disabled = !saved;
}

async function saveKey(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  localStorage.setItem(KEY_STORAGE, key);
  $("api-key").value = "";
  showKeyState();
  try {
    await api(`/v1/jobs?limit=1`);
    say("key-status", "Key saved and accepted.", "ok");
  } catch (error) {
    say("key-status", error.status === 401 ? "The API refused this key." : `Could not check the key: ${error.message}`, "error");
  }
  refresh();
}

function forgetKey() {
  localStorage.removeItem(KEY_STORAGE);
  $("jobs").replaceChildren();
  $("jobs-empty").hidden = false;
  $("engine-panel").replaceChildren(element("p", { class: "muted", text: "engine stats appear once a key is saved" }));
  showKeyState();
}

// ---- submitting ----

function jobRequest() {
  const size = Number($("size").value);
  const request = {
    prompt: $("prompt").value,
    height: size,
    width: size,
    num_inference_steps: Number($("steps").value),
    guidance_scale: Number($("guidance").value),
    num_images: Number($("num-images").value),
  };
  if ($("seed").value !== "") request.seed = Number($("seed").value);
  return request;
}

async function submitJob(event) {
  event.preventDefault();
  $("submit-job").disabled = true;
  say("job-status", "Submitting…");
  try {
    const job = await api("/v1/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(jobRequest()),
    });
    say("job-status", `Submitted job ${job.job_id} (seed ${job.params.seed}).`, "ok");
    refresh();
  } catch (error) {
    say("job-status", `Not submitted: ${error.message}`, "error");
  } finally {
    $("submit-job").disabled = apiKey() === "";
  }
}

// ---- recent jobs ----

function isOwnApiUrl(url) {
  return new URL(url, location.href).origin === location.origin;
}

async function thumbnailFor(url) {
  if (!isOwnApiUrl(url)) return url; // a presigned storage URL needs no key
  if (!thumbnails.has(url)) {
    const response = await fetch(url, { headers: { Authorization: `Bearer ${apiKey()}` } });
    if (!response.ok) throw new Error(`image: HTTP ${response.status}`);
    thumbnails.set(url, URL.createObjectURL(await response.blob()));
  }
  return thumbnails.get(url);
}

function jobCard(job) {
  const card = element("li", { class: `job state-${job.state}`, "data-job-id": job.job_id });
  const progress = job.progress || { step: 0, total: 0 };
  const total = Math.max(progress.total, 1);
  const params = job.params || {};
  const bar = element("progress", { max: String(total), value: String(Math.min(progress.step, total)),
    "aria-label": `progress of job ${job.job_id}` });
  const position = job.queue_position != null ? ` · queue position ${job.queue_position}` : "";
  card.append(
    element("p", { class: "prompt", text: params.prompt || "" }),
    element("p", { class: "meta" },
      element("span", { class: "state", text: job.state }),
      ` · step ${progress.step}/${progress.total}${position}`),
    bar,
    element("p", { class: "meta", text:
      `${params.width}×${params.height} · ${params.num_inference_steps} steps · guidance ${params.guidance_scale} · seed ${params.seed}` }),
  );
  if (job.error) card.append(element("p", { class: "meta error", text: `${job.error.code}: ${job.error.message}` }));
  const thumbs = element("div", { class: "thumbs" });
  (job.image_urls || []).forEach((url, index) => {
    const image = element("img", { alt: `image ${index + 1} of job ${job.job_id}: ${params.prompt || ""}`,
      width: "96", height: "96" });
    thumbs.append(image);
    thumbnailFor(url).then((src) => { image.src = src; }).catch((error) => { image.alt = error.message; });
  });
  card.append(thumbs);
  return card;
}

function jobSignature(job) {
  return `${job.state}:${job.progress && job.progress.step}:${(job.image_urls || []).length}:${job.queue_position}`;
}

async function refreshJobs() {
  const { jobs } = await api(`/v1/jobs?limit=${NUM_RECENT_JOBS}`);
  const list = $("jobs");
  const existing = new Map([...list.children].map((card) => [card.dataset.jobId, card]));
  const cards = jobs.map((job) => {
    const card = existing.get(job.job_id);
    const signature = jobSignature(job);
    if (card && card.dataset.signature === signature) return card; // unchanged: keep focus and images
    const fresh = jobCard(job);
    fresh.dataset.signature = signature;
    return fresh;
  });
  list.replaceChildren(...cards);
  $("jobs-empty").hidden = jobs.length > 0;
  return jobs.some((job) => !FINAL_STATES.has(job.state));
}

// ---- engine panel (GET /v1/models) ----

function keyTable(title, counts) {
  const rows = Object.entries(counts || {});
  if (rows.length === 0) return element("p", { class: "muted", text: `${title}: none` });
  return element("table", {},
    element("caption", { class: "muted", text: title }),
    element("tr", {}, element("th", { text: "compatibility key" }), element("th", { text: "jobs" })),
    ...rows.map(([key, count]) => element("tr", {}, element("td", { text: key }), element("td", { text: String(count) }))));
}

function jobsPerForward(histogram) {
  const rows = Object.entries(histogram || {}).sort((a, b) => Number(a[0]) - Number(b[0]));
  if (rows.length === 0) return element("p", { class: "muted", text: "jobs per forward: no forwards yet" });
  const most = Math.max(...rows.map(([, count]) => count));
  return element("table", {},
    element("caption", { class: "muted", text: "jobs per forward (how many forwards had that many jobs)" }),
    ...rows.map(([size, count]) => element("tr", {},
      element("td", { text: `${size} job${size === "1" ? "" : "s"}` }),
      element("td", {}, bar(Math.max(2, (100 * count) / most)), ` ${count}`))));
}

function bar(widthPx) {
  const node = element("span", { class: "bar" });
  node.style.width = `${widthPx}px`; // set through the CSSOM: the page's CSP allows no inline style attributes
  return node;
}

function modelPanel(model) {
  const engine = model.engine || {};
  const rate = (value) => (typeof value === "number" ? value.toFixed(2) : "–");
  return element("div", { class: "model" },
    element("p", {}, element("strong", { text: model.model }),
      ` · ${model.available ? "available" : "unavailable"} · ${model.workers ?? 0} worker(s) · queue ${model.queue_depth ?? 0}`),
    element("p", { class: "meta", text:
      `running ${engine.num_running ?? 0} · waiting ${engine.num_waiting ?? 0} · ` +
      `${rate(engine.steps_per_second)} steps/s · ${rate(engine.images_per_second)} images/s` }),
    jobsPerForward(engine.jobs_per_forward),
    keyTable("running per key", engine.running_by_key),
    keyTable("waiting per key", engine.waiting_by_key));
}

async function refreshEngine() {
  const panel = $("engine-panel");
  try {
    const { models } = await api("/v1/models");
    panel.replaceChildren(...(models.length ? models.map(modelPanel)
      : [element("p", { class: "muted", text: "no worker has reported yet" })]));
  } catch (error) {
    panel.replaceChildren(element("p", { class: "muted",
      text: error.status === 404 ? "engine stats unavailable (this API has no /v1/models)" : `engine stats unavailable: ${error.message}` }));
  }
}

// ---- polling ----

async function refresh() {
  clearTimeout(pollTimer);
  if (!apiKey()) return;
  try {
    await Promise.all([refreshJobs(), refreshEngine()]);
  } catch (error) {
    say("job-status", error.status === 401 ? "The API refused the saved key." : `Could not refresh: ${error.message}`, "error");
  }
  pollTimer = setTimeout(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", saveKey);
  $("forget-key").addEventListener("click", forgetKey);
  $("job-form").addEventListener("submit", submitJob);
  showKeyState();
  refresh();
});
