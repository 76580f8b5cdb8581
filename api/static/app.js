// The stepwise page: a prompt form, the tenant's jobs (paged; each unfinished one followed through its event
// stream, with live previews), and an engine panel. It uses only the public HTTP API. The key lives in
// localStorage and travels only in the Authorization header: images are fetched with it and shown through
// blob: URLs, and the event stream is read with fetch (an EventSource cannot send the header).
"use strict";

const KEY_STORAGE = "stepwise.apiKey";
const PAGE_SIZE = 8;
const ENGINE_MS = 2000;
const LIST_MS = 5000; // the first page is reread this often: jobs submitted elsewhere, live jobs not followed
// A browser keeps at most 6 HTTP/1.1 connections to a host: follow at most 4 jobs' streams at once, so the
// page's other requests always find a connection (the rest of the live jobs show through the list's rereads)
const MAX_STREAMS = 4;
const RECONNECT_MS = 2000;
const PREVIEW_EVERY = 2; // steps between live previews, when the box is ticked
const LIVE_STATES = new Set(["queued", "running"]);
const END_STATES = new Set(["succeeded", "failed", "canceled", "expired"]); // a stream's last event, with the job's view
const OTHER_SIZE = "other"; // the size option that shows the width and height fields

const images = new Map(); // image URL -> blob: URL (fetched once)
const streams = new Map(); // job id -> AbortController of its event stream
// Jobs not to follow again: ended (their stream gave the end state, which is final), gone (deleted elsewhere or past
// retention: the stream's error event, or a 404), or deleted here. Until the next reread of the list shows them
// ended or drops them, following one again would only get a 404 once it is deleted. (A refused key is not the job's.)
const unfollowable = new Set();
let models = []; // GET /v1/models
let maxPixels = null; // the chosen model's limits.max_pixels: height x width the API accepts (GET /v1/models)
let cursors = [null]; // the cursor of each page seen, newest first; the last one is shown
let shownJobs = []; // the jobs of the page shown, as listed
let timers = [];

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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
  const node = $(id); // one message at a time: each replaces the one before
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
  start();
}

function forgetKey() {
  localStorage.removeItem(KEY_STORAGE);
  stop();
  $("jobs").replaceChildren();
  $("jobs-empty").hidden = false;
  $("engine-panel").replaceChildren(element("p", { class: "muted", text: "engine stats appear once a key is saved" }));
  showKeyState();
}

// ---- the form: models, their sizes and samplers ----

function chosenModel() {
  return models.find((model) => model.model === $("model").value) || models.find((model) => model.available) || null;
}

function showModels() {
  const select = $("model");
  const current = select.value;
  const ordered = [...models].sort((a, b) => Number(b.available) - Number(a.available));
  select.replaceChildren(
    ...(ordered.length ? [] : [element("option", { value: "", text: "the service's default" })]),
    ...ordered.map((model) => element("option", { value: model.model, text: model.available ? model.model : `${model.model} (no worker now)` })),
  );
  if (ordered.some((model) => model.model === current)) select.value = current;
  showModelChoices();
}

function showModelChoices() {
  const model = chosenModel();
  if (!model) return;
  const defaults = model.defaults || {};
  const limits = model.limits || {};
  // the sizes the model was trained at (or its family's), best first, from GET /v1/models; any other is typed in
  const sizes = (model.sizes && model.sizes.length ? model.sizes.map((size) => `${size}x${size}`)
    : [`${defaults.width}x${defaults.height}`]);
  $("size").replaceChildren(
    ...sizes.map((size, index) =>
      element("option", { value: size, text: `${size.replace("x", " × ")}${index === 0 ? " (recommended)" : ""}` })),
    element("option", { value: OTHER_SIZE, text: "another size…" }));
  const multiple = String(limits.size_multiple || 8);
  maxPixels = limits.max_pixels || null;
  for (const id of ["width", "height"]) {
    Object.assign($(id), { step: multiple, min: multiple, max: String(limits.max_size || 2048) });
    $(id).value = sizes[0].split("x")[id === "width" ? 0 : 1];
  }
  showCustomSize();
  const samplers = limits.samplers || ["euler"];
  $("sampler").replaceChildren(...samplers.map((name) => element("option", { value: name, text: name })));
  $("sampler").value = samplers.includes(defaults.sampler) ? defaults.sampler : samplers[0];
  if (defaults.num_inference_steps) $("steps").value = defaults.num_inference_steps;
  if (defaults.guidance_scale != null) $("guidance").value = defaults.guidance_scale;
  $("steps").max = String(limits.max_steps || 200);
  $("guidance").max = String(limits.max_guidance || 50);
  // several input images (reference_images), for the models whose family reads a list
  const maxReferences = limits.max_reference_images || 0;
  $("reference-images-field").hidden = maxReferences === 0;
  $("reference-images-limit").textContent = `up to ${maxReferences}`;
}

function showCustomSize() {
  $("custom-size").hidden = $("size").value !== OTHER_SIZE;
  checkCustomSize();
}

// A typed size over the model's pixel limit is refused here, with the API's own limit, before it is sent.
function checkCustomSize() {
  const pixels = Number($("width").value) * Number($("height").value);
  const isOver = $("size").value === OTHER_SIZE && maxPixels !== null && pixels > maxPixels;
  const message = isOver ? `width × height = ${pixels} is over this model's limit of ${maxPixels} pixels` : "";
  for (const id of ["width", "height"]) $(id).setCustomValidity(message);
}

function chooseSize(width, height) {
  const size = `${width}x${height}`;
  const isOffered = [...$("size").options].some((option) => option.value === size);
  $("size").value = isOffered ? size : OTHER_SIZE;
  if (!isOffered) {
    $("width").value = String(width);
    $("height").value = String(height);
  }
  showCustomSize();
}

// ---- submitting ----

async function uploadImage(file) {
  const form = new FormData();
  form.append("file", file);
  const upload = await api("/v1/uploads", { method: "POST", body: form });
  return upload.id;
}

async function uploadInitImage() {
  const file = $("init-image").files[0];
  return file ? uploadImage(file) : null;
}

async function uploadReferenceImages() {
  if ($("reference-images-field").hidden) return [];
  const ids = [];
  for (const file of $("reference-images").files) ids.push(await uploadImage(file)); // in the order chosen
  return ids;
}

async function jobRequest() {
  const [width, height] = $("size").value === OTHER_SIZE ? [Number($("width").value), Number($("height").value)]
    : $("size").value.split("x").map(Number);
  const request = {
    prompt: $("prompt").value,
    height,
    width,
    sampler: $("sampler").value,
    num_inference_steps: Number($("steps").value),
    guidance_scale: Number($("guidance").value),
    num_images: Number($("num-images").value),
    preview_every: $("previews").checked ? PREVIEW_EVERY : 0,
  };
  if ($("model").value) request.model = $("model").value;
  if ($("negative-prompt").value) request.negative_prompt = $("negative-prompt").value;
  if ($("seed").value !== "") request.seed = Number($("seed").value);
  if ($("cache").value) request.cache = $("cache").value;
  const initImage = await uploadInitImage();
  if (initImage) Object.assign(request, { init_image: initImage, strength: Number($("strength").value), resize_mode: "crop" });
  const referenceImages = await uploadReferenceImages();
  if (referenceImages.length) request.reference_images = referenceImages;
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
      body: JSON.stringify(await jobRequest()),
    });
    const warnings = job.warnings || []; // e.g. a prompt outside what the model knows: accepted, but said
    say("job-status", `Submitted job ${job.job_id} (seed ${job.params.seed}).${warnings.map((w) => ` Note: ${w}.`).join("")}`,
      warnings.length ? "warning" : "ok");
    cursors = [null];
    await showJobs();
  } catch (error) {
    say("job-status", `Not submitted: ${error.message}`, "error");
  } finally {
    $("submit-job").disabled = apiKey() === "";
  }
}

// ---- a job's event stream (text/event-stream over fetch) ----

async function follow(jobId, onEvent, signal) {
  let lastId = null;
  while (!signal.aborted) {
    const headers = { Authorization: `Bearer ${apiKey()}`, Accept: "text/event-stream" };
    if (lastId) headers["Last-Event-ID"] = lastId;
    try {
      const response = await fetch(`/v1/jobs/${jobId}/events`, { headers, signal, cache: "no-store" });
      if (response.status === 404) return "gone";
      if (!response.ok) { // the key was refused: nothing to follow with it; look again later, not at once
        await sleep(RECONNECT_MS);
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let event = { name: "message", data: [] };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let newline;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline).replace(/\r$/, "");
          buffer = buffer.slice(newline + 1);
          if (line === "") {
            if (event.data.length && onEvent(event.name, JSON.parse(event.data.join("\n")))) return;
            event = { name: "message", data: [] };
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "event") event.name = text;
            else if (field === "data") event.data.push(text);
            else if (field === "id") lastId = text;
          }
        }
      }
    } catch (error) {
      if (signal.aborted) return;
    }
    await sleep(RECONNECT_MS); // the connection dropped mid-job: resume after the last event seen
  }
}

function followSome() {
  const live = shownJobs.filter(
    (job) => LIVE_STATES.has(job.state) && !streams.has(job.job_id) && !unfollowable.has(job.job_id),
  );
  live.sort((a, b) => Number(b.state === "running") - Number(a.state === "running")); // running ones first
  for (const job of live.slice(0, Math.max(0, MAX_STREAMS - streams.size))) {
    const card = document.querySelector(`li.job[data-job-id="${job.job_id}"]`);
    if (card) watch(card, job);
  }
}

function watch(card, job) {
  if (streams.has(job.job_id) || unfollowable.has(job.job_id) || !LIVE_STATES.has(job.state)) return;
  const controller = new AbortController();
  streams.set(job.job_id, controller);
  follow(job.job_id, (name, data) => {
    const live = document.querySelector(`li.job[data-job-id="${job.job_id}"]`) || card;
    if (name === "progress" || name === "preview") showProgress(live, data, (job.params || {}).num_images);
    if (name === "preview") showPreview(live, data.image);
    if (name === "queued") showState(live, "queued", data.queue_position);
    if (name === "started") showState(live, "running", null);
    if (name === "storing") showStoring(live, data.reason);
    // Any other event but an end state or an error goes on; `reconnect` says this API process is stopping: its
    // stream ends, and follow() resumes the job's after the last event seen (Last-Event-ID), on another replica.
    if (!END_STATES.has(name) && name !== "error") return false;
    streams.delete(job.job_id);
    if (name !== "error" || (data.error && data.error.code === "not_found")) unfollowable.add(job.job_id);
    if (name !== "error") live.replaceWith(jobCard(data)); // the end state carries the job's view
    return true; // an error (the job deleted, the key revoked): nothing more will come
  }, controller.signal).then((ended) => {
    if (ended === "gone") unfollowable.add(job.job_id);
  }).finally(() => {
    streams.delete(job.job_id);
    followSome(); // its connection is free: follow another live job
  });
}

// `data`: a progress or preview event. A preview carries no current_image: the card keeps the last progress's.
function showProgress(card, data, numImages) {
  if (data.image === undefined) card.dataset.currentImage = data.current_image || "";
  const bar = card.querySelector("progress");
  bar.max = String(Math.max(data.total, 1));
  bar.value = String(Math.min(data.step, data.total));
  const progress = { step: data.step, total: data.total, current_image: Number(card.dataset.currentImage) };
  card.querySelector(".step").textContent = stepText(progress, numImages);
}

// A job's progress as its card shows it: the job's own steps (a 2-image job of 200 steps counts to 200), and
// the image it is on while it runs its images one after another.
function stepText(progress, numImages) {
  const image = progress.current_image && numImages > 1 ? ` · image ${progress.current_image} of ${numImages}` : "";
  return ` · step ${progress.step}/${progress.total}${image}`;
}

function showPreview(card, image) {
  let preview = card.querySelector("img.preview");
  if (!preview) {
    preview = element("img", { class: "preview", alt: `live preview of job ${card.dataset.jobId}`, width: "96", height: "96" });
    card.querySelector(".thumbs").append(preview);
  }
  preview.src = image; // a data: URI, small: an approximate image of the job so far
}

// Its images are made, but image storage failed: they wait in the worker's spool, and the job succeeds once stored.
function showStoring(card, reason) {
  card.querySelector(".position").textContent = ` · storing its image (storage unavailable: ${reason})`;
}

function showState(card, state, position) {
  card.className = `job state-${state}`;
  card.querySelector(".state").textContent = state;
  card.querySelector(".position").textContent = position != null ? ` · queue position ${position}` : "";
}

// ---- the jobs list ----

function isOwnApiUrl(url) {
  return new URL(url, location.href).origin === location.origin;
}

async function imageFor(url) {
  if (!isOwnApiUrl(url)) return url; // a presigned storage URL needs no key
  if (!images.has(url)) {
    const response = await fetch(url, { headers: { Authorization: `Bearer ${apiKey()}` } });
    if (!response.ok) throw new Error(`image: HTTP ${response.status}`);
    images.set(url, URL.createObjectURL(await response.blob()));
  }
  return images.get(url);
}

function openViewer(src, job, index) {
  const extension = { png: "png", jpeg: "jpg", webp: "webp" }[(job.params || {}).output_format] || "png";
  $("viewer-image").src = src;
  $("viewer-image").alt = `image ${index + 1} of job ${job.job_id}, full size`;
  $("viewer-download").href = src;
  $("viewer-download").download = `stepwise-${job.job_id}-${index + 1}.${extension}`;
  $("viewer").showModal();
  if ($("viewer-image").complete && $("viewer-image").naturalWidth) fitViewer(); // no load event for the same src
}

// A small image is zoomed by whole pixels to fill the view, pixelated as image viewers show them (a 128 px
// image would otherwise be barely larger than its thumbnail); a large one is scaled down to fit by the CSS.
function fitViewer() {
  const image = $("viewer-image");
  const room = { width: Math.min(window.innerWidth * 0.92, 1100) - 48, height: window.innerHeight * 0.75 };
  const scale = Math.min(room.width / image.naturalWidth, room.height / image.naturalHeight);
  const zoom = scale >= 2 ? Math.floor(scale) : 1;
  image.classList.toggle("zoomed", zoom > 1);
  image.style.width = zoom > 1 ? `${image.naturalWidth * zoom}px` : ""; // the CSSOM: the CSP allows no style attribute
  $("viewer-scale").textContent =
    `${image.naturalWidth} × ${image.naturalHeight} px${zoom > 1 ? `, shown ${zoom}× with square pixels` : ""}`;
}

async function cancelJob(job, button) {
  button.disabled = true;
  try {
    const view = await api(`/v1/jobs/${job.job_id}/cancel`, { method: "POST" });
    button.textContent = view.state === "canceled" ? "Canceled" : "Canceling…";
  } catch (error) {
    button.textContent = `Not canceled: ${error.message}`;
  }
}

async function deleteJob(job, button) {
  button.disabled = true;
  unfollowable.add(job.job_id);
  streams.get(job.job_id)?.abort(); // before the job is gone: a stream reconnecting after the delete gets a 404
  try {
    await api(`/v1/jobs/${job.job_id}`, { method: "DELETE" }); // a live job is canceled first, by the API
    for (const url of job.image_urls || []) {
      if (images.has(url)) URL.revokeObjectURL(images.get(url));
      images.delete(url);
    }
    document.querySelector(`li.job[data-job-id="${job.job_id}"]`)?.remove();
    say("job-status", `Deleted job ${job.job_id} and its images.`, "ok");
    await showJobs();
  } catch (error) {
    unfollowable.delete(job.job_id);
    followSome(); // still there: follow it again
    button.disabled = false;
    button.textContent = `Not deleted: ${error.message}`;
  }
}

// Fill the form with a job's settings and seed: the same picture again, or a variation of one setting.
function reuseJob(job) {
  const params = job.params || {};
  if (models.some((model) => model.model === params.model)) {
    $("model").value = params.model;
    showModelChoices(); // that model's sizes and samplers, before the job's own values go in
  }
  const has = (id, value) => [...$(id).options].some((option) => option.value === String(value));
  $("prompt").value = params.prompt || "";
  $("negative-prompt").value = params.negative_prompt || "";
  chooseSize(params.width, params.height);
  if (has("sampler", params.sampler)) $("sampler").value = params.sampler;
  if (params.num_inference_steps) $("steps").value = String(params.num_inference_steps);
  if (params.guidance_scale != null) $("guidance").value = String(params.guidance_scale);
  $("seed").value = params.seed != null ? String(params.seed) : "";
  $("num-images").value = String(params.num_images || 1);
  $("cache").value = has("cache", params.cache) ? String(params.cache) : "";
  say("job-status", `The form holds job ${job.job_id}'s settings and seed ${params.seed}: change what you like, then Generate.`, "ok");
  $("prompt").focus();
}

const PLAYED_FORMATS = new Set(["mp4", "webm"]); // a video job's output, played by a <video> element

function jobCard(job) {
  const card = element("li", { class: `job state-${job.state}`, "data-job-id": job.job_id });
  const progress = job.progress || { step: 0, total: 0 };
  const total = Math.max(progress.total, 1);
  const params = job.params || {};
  const bar = element("progress", { max: String(total), value: String(Math.min(progress.step, total)),
    "aria-label": `progress of job ${job.job_id}` });
  card.append(
    element("p", { class: "prompt", text: params.prompt || "" }),
    element("p", { class: "meta" },
      element("span", { class: "state", text: job.state }),
      element("span", { class: "step", text: stepText(progress, params.num_images) }),
      element("span", { class: "position", text: job.queue_position != null ? ` · queue position ${job.queue_position}` :
        job.storing ? ` · storing its image (storage unavailable: ${job.storing.reason})` : "" })),
    bar,
    element("p", { class: "meta", text:
      `${params.model || ""} · ${params.width}×${params.height}${params.num_frames > 1 ? ` × ${params.num_frames} frames at ${params.fps} fps` : ""} · ${params.num_inference_steps} steps · ${params.sampler} · guidance ${params.guidance_scale} · seed ${params.seed}` }),
  );
  if (params.negative_prompt) card.append(element("p", { class: "meta", text: `not: ${params.negative_prompt}` }));
  if (job.error) card.append(element("p", { class: "meta error", text: `${job.error.code}: ${job.error.message}` }));
  for (const warning of job.warnings || []) card.append(element("p", { class: "meta warning", text: warning }));
  const thumbs = element("div", { class: "thumbs" });
  const isVideo = PLAYED_FORMATS.has(params.output_format); // a GIF shows as an image
  (job.image_urls || []).forEach((url, index) => {
    if (isVideo) {
      const video = element("video", { controls: "", loop: "", muted: "", playsinline: "", width: "192",
        "aria-label": `video ${index + 1} of job ${job.job_id}: ${params.prompt || ""}` });
      thumbs.append(video);
      imageFor(url).then((src) => { video.src = src; }).catch((error) => { video.title = error.message; });
      return;
    }
    const image = element("img", { alt: `image ${index + 1} of job ${job.job_id}: ${params.prompt || ""}`, width: "96", height: "96" });
    const open = element("button", { type: "button", title: "full size" }, image);
    thumbs.append(open);
    imageFor(url).then((src) => {
      image.src = src;
      open.addEventListener("click", () => openViewer(src, job, index));
    }).catch((error) => { image.alt = error.message; });
  });
  card.append(thumbs);
  const actions = element("div", { class: "actions" });
  if (LIVE_STATES.has(job.state)) {
    const cancel = element("button", { type: "button", class: "cancel", text: "Cancel" });
    cancel.addEventListener("click", () => cancelJob(job, cancel));
    actions.append(cancel);
  }
  const reuse = element("button", { type: "button", class: "reuse", text: "Reuse seed" });
  reuse.addEventListener("click", () => reuseJob(job));
  const remove = element("button", { type: "button", class: "delete", text: "Delete" });
  remove.addEventListener("click", () => deleteJob(job, remove));
  actions.append(reuse, remove);
  card.append(actions);
  card.dataset.signature = signature(job);
  return card;
}

function signature(job) {
  return `${job.state}:${(job.progress || {}).step}:${(job.image_urls || []).length}:${job.queue_position}:${Boolean(job.storing)}`;
}

async function showJobs() {
  const cursor = cursors[cursors.length - 1];
  const query = new URLSearchParams({ limit: String(PAGE_SIZE), ...(cursor ? { cursor } : {}) });
  const { jobs, next_cursor: next } = await api(`/v1/jobs?${query}`);
  const list = $("jobs");
  const existing = new Map([...list.children].map((card) => [card.dataset.jobId, card]));
  const shown = new Set(jobs.map((job) => job.job_id));
  for (const [jobId, controller] of streams) if (!shown.has(jobId)) controller.abort(); // paged away
  list.replaceChildren(...jobs.map((job) => {
    const card = existing.get(job.job_id);
    // a followed job's card is updated by its stream; any other is kept while it shows the same
    if (card && (streams.has(job.job_id) || card.dataset.signature === signature(job))) return card;
    return jobCard(job);
  }));
  shownJobs = jobs;
  followSome();
  $("jobs-empty").hidden = jobs.length > 0;
  $("newer-jobs").disabled = cursors.length === 1;
  $("older-jobs").disabled = !next;
  $("older-jobs").dataset.cursor = next || "";
}

async function pageTo(direction) {
  if (direction > 0 && $("older-jobs").dataset.cursor) cursors.push($("older-jobs").dataset.cursor);
  if (direction < 0 && cursors.length > 1) cursors.pop();
  await showJobs().catch((error) => say("job-status", `Could not list jobs: ${error.message}`, "error"));
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
    const { models: served } = await api("/v1/models");
    const isNew = served.map((model) => model.model).join() !== models.map((model) => model.model).join();
    models = served;
    if (isNew) showModels();
    panel.replaceChildren(...(models.length ? models.map(modelPanel)
      : [element("p", { class: "muted", text: "no worker has reported yet" })]));
  } catch (error) {
    panel.replaceChildren(element("p", { class: "muted",
      text: error.status === 404 ? "engine stats unavailable (this API has no /v1/models)" : `engine stats unavailable: ${error.message}` }));
  }
}

// ---- start and stop ----

function every(ms, task) {
  const run = async () => {
    try { await task(); } catch (error) { /* shown by the task itself where it matters */ }
    timers.push(setTimeout(run, ms));
  };
  run();
}

function stop() {
  timers.forEach(clearTimeout);
  timers = [];
  for (const controller of streams.values()) controller.abort();
  streams.clear();
}

function start() {
  stop();
  if (!apiKey()) return;
  every(ENGINE_MS, refreshEngine);
  every(LIST_MS, async () => {
    if (cursors.length > 1) return; // an older page stays as it is
    await showJobs().catch((error) => {
      say("job-status", error.status === 401 ? "The API refused the saved key." : `Could not list jobs: ${error.message}`, "error");
    });
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", saveKey);
  $("forget-key").addEventListener("click", forgetKey);
  $("job-form").addEventListener("submit", submitJob);
  $("model").addEventListener("change", showModelChoices);
  $("size").addEventListener("change", showCustomSize);
  for (const id of ["width", "height"]) $(id).addEventListener("input", checkCustomSize);
  $("viewer-image").addEventListener("load", fitViewer);
  $("newer-jobs").addEventListener("click", () => pageTo(-1));
  $("older-jobs").addEventListener("click", () => pageTo(1));
  $("viewer-close").addEventListener("click", () => $("viewer").close());
  showKeyState();
  start();
});
