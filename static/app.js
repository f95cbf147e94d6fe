// Pressroom dashboard: submit jobs, show the job list, keep it live over one stream
// (/pressroom.js: resume, token renewal and the long-poll fallback are the module's).
import { watchChannel } from "/pressroom.js";

const STATUSES = ["queued", "running", "done", "failed", "cancelled"];
const LIST_LIMIT = 50;
const MAX_ROWS = 200;
// If the stream has not opened by then, show the list anyway (it is reloaded once it opens).
const LIST_FALLBACK_MS = 2500;
const NOTICE_MS = 6000;
const KEY_STORAGE = "pressroom.apiKey";

const state = {
  jobs: new Map(),          // job id -> row entry {job, row, ...elements}
  appliedEvent: new Map(),  // job id -> highest event_id applied (drops replayed duplicates)
  watch: null,              // the live stream (watchChannel)
  live: false,              // whether it is open now
  pending: null,            // events held back while a list load is in flight
  listLoaded: false,
  listStale: true,          // the list may have missed events: reload when the stream opens
  reloadAfter: false,       // a load was asked for while another (now outdated) was in flight
  fallbackTried: false,     // the one list load allowed before the stream first opens
  channel: "",              // the channel shown (list and stream); empty: every job
};

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// ---------------------------------------------------------------- API key

function loadApiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

function saveApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    // Storage disabled (private mode): the key simply does not persist.
  }
}

function setupApiKey() {
  const input = $("api-key");
  input.value = loadApiKey();
  $("api-key-status").textContent = input.value ? "A key is set." : "No key: dev mode.";
  $("api-key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    applyApiKey(input.value.trim());
  });
  $("api-key-clear").addEventListener("click", () => {
    input.value = "";
    applyApiKey("");
  });
}

function applyApiKey(key) {
  saveApiKey(key);
  $("api-key-status").textContent = key ? "Key saved." : "Key cleared: dev mode.";
  // Another key may mean another tenant: start over with a fresh list and stream.
  startOver();
}

/** A fresh list and stream (another tenant, another channel): nothing of the old one is kept. */
function startOver() {
  state.appliedEvent.clear();
  state.listStale = true;
  if (state.pending) state.reloadAfter = true;
  openStream();
}

// ---------------------------------------------------------------- channel filter

function setupChannelFilter() {
  const input = $("channel-filter-input");
  $("channel-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    applyChannel(input.value.trim());
  });
  $("channel-filter-clear").addEventListener("click", () => {
    input.value = "";
    applyChannel("");
  });
}

function applyChannel(channel) {
  if (channel === state.channel) return;
  state.channel = channel;
  $("jobs-heading").textContent = channel ? `Jobs of channel ${channel}` : "Jobs";
  startOver();
}

/** Whether a job belongs in the list as filtered now. */
function shown(job) {
  return !state.channel || job?.channel === state.channel;
}

// ---------------------------------------------------------------- HTTP

class ProblemError extends Error {
  constructor(problem) {
    super(problem.detail || problem.title);
    this.problem = problem;
  }
}

/** JSON request to the API; resolves to the parsed body, rejects with a ProblemError. */
async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json, application/problem+json" };
  const key = loadApiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ProblemError({ title: "Network error", detail: "The server could not be reached.", status: 0 });
  }
  const payload = await readJson(response);
  if (!response.ok) throw new ProblemError(toProblem(payload, response));
  return payload;
}

async function readJson(response) {
  try {
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

function toProblem(payload, response) {
  const body = payload && typeof payload === "object" ? payload : {};
  return {
    title: String(body.title || response.statusText || "Request failed"),
    status: body.status || response.status,
    detail: body.detail ? String(body.detail) : "",
    errors: Array.isArray(body.errors) ? body.errors : [],
  };
}

function problemText(problem) {
  if (!problem) return "Something went wrong.";
  return problem.detail ? `${problem.title}: ${problem.detail}` : problem.title;
}

// ---------------------------------------------------------------- formatting

/** A short id that still tells jobs apart: time-ordered UUIDs (v1, v6, v7) share their prefix. */
function shortId(id) {
  const text = String(id ?? "");
  const version = /^[0-9a-f]{8}-[0-9a-f]{4}-([0-9a-f])/i.exec(text)?.[1];
  return ["1", "6", "7"].includes(version) ? text.slice(-8) : text.slice(0, 8);
}

function parseTime(value) {
  const ms = value ? Date.parse(value) : NaN;
  return Number.isNaN(ms) ? null : new Date(ms);
}

function formatTime(value) {
  const date = parseTime(value);
  if (!date) return "";
  const sameDay = date.toDateString() === new Date().toDateString();
  return sameDay
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })
    : date.toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

function formatBytes(bytes) {
  if (typeof bytes !== "number" || bytes < 0) return "";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

/** The facts shown under a job's heading, each a short phrase. */
function metaParts(job) {
  const parts = [];
  if (isNumber(job.attempts)) {
    parts.push(`attempts ${job.attempts}/${isNumber(job.max_attempts) ? job.max_attempts : "?"}`);
  }
  const output = outputOf(job);
  if (output !== "pdf") parts.push(output.toUpperCase());
  if (isNumber(job.pages)) parts.push(job.pages === 1 ? "1 page" : `${job.pages} pages`);
  if (isNumber(job.bytes)) parts.push(formatBytes(job.bytes));
  if (isNumber(job.priority) && job.priority !== 0) parts.push(`priority ${job.priority}`);
  if (job.channel) parts.push(`channel ${job.channel}`);
  const runAfter = parseTime(job.run_after);
  if (job.status === "queued" && runAfter && runAfter > new Date()) {
    parts.push(`next try ${formatTime(job.run_after)}`);
  }
  return parts;
}

function describeError(error) {
  if (error === null || error === undefined || error === "") return "";
  if (typeof error === "string") return error;
  if (typeof error === "object") {
    const text = error.message ?? error.error ?? error.detail;
    return text ? String(text) : JSON.stringify(error);
  }
  return String(error);
}

function errorText(job) {
  const last = describeError(job.error);
  if (last || job.status !== "failed" || !Array.isArray(job.errors)) return last;
  return describeError(job.errors[job.errors.length - 1]);
}

/** What the job makes: "pdf", or the image format its options ask for. */
function outputOf(job) {
  const output = job.options?.output;
  return typeof output === "string" && output ? output : "pdf";
}

function downloadUrl(job) {
  return job.url || job.links?.pdf || `/v1/jobs/${encodeURIComponent(job.id)}/pdf`;
}

// ---------------------------------------------------------------- job rows

function createEntry(id) {
  const entry = {
    job: null,
    row: el("li", "job"),
    idEl: el("a", "job-id"),
    badge: el("span", "badge"),
    created: el("time", "job-created"),
    meta: el("p", "job-meta"),
    progressWrap: el("div", "job-progress"),
    progress: el("progress"),
    progressText: el("span", "job-progress-text"),
    error: el("p", "job-error"),
    actions: el("div", "job-actions"),
    notice: el("p", "job-notice"),
    download: el("a", "download button", "Download"),
    thumb: el("a", "job-thumb"),
    thumbImg: el("img"),
    cancel: el("button", "cancel secondary", "Cancel"),
    retry: el("button", "retry secondary", "Retry"),
    noticeTimer: null,
  };
  entry.row.dataset.jobId = id;
  entry.progress.max = 100;
  entry.progress.setAttribute("aria-label", "Progress");
  // The bar carries the value; the repeated percentage text would only be noise when read out.
  entry.progressText.setAttribute("aria-hidden", "true");
  entry.progressWrap.append(entry.progress, entry.progressText);
  entry.thumbImg.alt = "";
  entry.thumbImg.loading = "lazy";
  entry.thumb.append(entry.thumbImg);
  entry.thumb.hidden = true;
  entry.cancel.type = "button";
  entry.retry.type = "button";
  entry.cancel.addEventListener("click", () => runAction(id, "cancel", entry.cancel));
  entry.retry.addEventListener("click", () => runAction(id, "retry", entry.retry));
  const head = el("div", "job-head");
  head.append(entry.idEl, entry.badge, entry.created);
  entry.row.append(
    head, entry.meta, entry.thumb, entry.progressWrap, entry.error, entry.actions, entry.notice,
  );
  return entry;
}

function renderEntry(entry) {
  const job = entry.job;
  const status = STATUSES.includes(job.status) ? job.status : "unknown";
  entry.row.dataset.status = String(job.status ?? "unknown");
  entry.idEl.textContent = shortId(job.id);
  entry.idEl.href = `/jobs/${encodeURIComponent(job.id)}`; // the job's story (static/job.js)
  entry.idEl.title = String(job.id);
  entry.badge.textContent = String(job.status ?? "unknown");
  entry.badge.className = `badge badge-${status}`;
  entry.created.textContent = formatTime(job.created_at);
  entry.created.dateTime = job.created_at || "";
  entry.created.title = job.created_at ? `created ${job.created_at}` : "";
  entry.meta.replaceChildren(...metaParts(job).map((part) => el("span", "", part)));
  renderThumbnail(entry, job);
  renderProgress(entry, job);
  const error = errorText(job);
  entry.error.textContent = error;
  entry.error.hidden = !error;
  // After a retry the last error stays on the job; it is history then, not the outcome.
  entry.error.classList.toggle("job-error-past", job.status !== "failed");
  renderActions(entry, job);
}

/** The first page of a done job that asked for a thumbnail, linking to its file. */
function renderThumbnail(entry, job) {
  const show = job.status === "done" && typeof job.thumbnail_url === "string";
  entry.thumb.hidden = !show;
  if (!show) return;
  // Each answer signs a fresh URL: load the picture once per attempt, not on every event.
  const attempt = String(job.attempts);
  if (entry.thumbImg.dataset.attempt !== attempt) {
    entry.thumbImg.dataset.attempt = attempt;
    entry.thumbImg.src = job.thumbnail_url;
  }
  entry.thumbImg.alt = `First page of job ${shortId(job.id)}`;
  entry.thumb.href = downloadUrl(job);
}

function renderProgress(entry, job) {
  const show = job.status === "running" && isNumber(job.progress);
  entry.progressWrap.hidden = !show;
  if (!show) return;
  const percent = Math.max(0, Math.min(100, Math.round(job.progress)));
  entry.progress.value = percent;
  entry.progressText.textContent = `${percent}%`;
}

function renderActions(entry, job) {
  const wanted = [];
  if (job.status === "done") {
    entry.download.href = downloadUrl(job);
    const kind = outputOf(job).toUpperCase();
    entry.download.setAttribute("aria-label", `Download ${kind} of job ${shortId(job.id)}`);
    wanted.push(entry.download);
  }
  if (job.status === "queued" || job.status === "running") wanted.push(entry.cancel);
  if (job.status === "failed") wanted.push(entry.retry);
  entry.cancel.setAttribute("aria-label", `Cancel job ${shortId(job.id)}`);
  entry.retry.setAttribute("aria-label", `Retry job ${shortId(job.id)}`);
  // Only touch the DOM when the set changes, so a focused button keeps its focus.
  const current = Array.from(entry.actions.children);
  const same = current.length === wanted.length && current.every((node, i) => node === wanted[i]);
  if (!same) entry.actions.replaceChildren(...wanted);
  entry.actions.hidden = wanted.length === 0;
}

function flashNotice(entry, text) {
  clearTimeout(entry.noticeTimer);
  entry.notice.textContent = text;
  entry.notice.hidden = false;
  entry.noticeTimer = setTimeout(() => {
    entry.notice.hidden = true;
    entry.notice.textContent = "";
  }, NOTICE_MS);
}

function createdMs(job) {
  // A job without a creation time was just made here: it belongs at the top.
  return parseTime(job?.created_at)?.getTime() ?? Infinity;
}

/** Put a new row where its creation time says, newest first. */
function insertRow(entry) {
  const list = $("jobs");
  const created = createdMs(entry.job);
  for (const row of list.children) {
    if (created >= createdMs(state.jobs.get(row.dataset.jobId)?.job)) {
      list.insertBefore(entry.row, row);
      return;
    }
  }
  list.append(entry.row);
}

function trimRows() {
  const list = $("jobs");
  while (list.children.length > MAX_ROWS) {
    const row = list.lastElementChild;
    state.jobs.delete(row.dataset.jobId);
    row.remove();
  }
}

function upsertJob(job) {
  let entry = state.jobs.get(job.id);
  if (entry) {
    entry.job = job;
    renderEntry(entry);
  } else {
    entry = createEntry(job.id);
    entry.job = job;
    state.jobs.set(job.id, entry);
    renderEntry(entry);
    insertRow(entry);
    trimRows();
  }
  updateListMessage();
}

/** Apply a job from a REST answer unless the row already shows a later state. */
function upsertIfNewer(job) {
  const current = state.jobs.get(job.id)?.job;
  const incoming = parseTime(job.updated_at);
  const shown = parseTime(current?.updated_at);
  if (current && (!incoming || (shown && incoming < shown))) return;
  upsertJob(job);
}

/** Replace the whole list with a fresh page, reusing the rows that stay. */
function renderSnapshot(items) {
  const keep = new Set();
  const rows = [];
  for (const job of items) {
    if (!job || !job.id || keep.has(job.id)) continue;
    keep.add(job.id);
    let entry = state.jobs.get(job.id);
    if (!entry) {
      entry = createEntry(job.id);
      state.jobs.set(job.id, entry);
    }
    entry.job = job;
    renderEntry(entry);
    rows.push(entry.row);
  }
  for (const id of Array.from(state.jobs.keys())) {
    if (!keep.has(id)) state.jobs.delete(id);
  }
  $("jobs").replaceChildren(...rows);
}

function updateListMessage(text) {
  const message = $("jobs-message");
  if (text) {
    message.textContent = text;
  } else if (state.jobs.size === 0 && state.listLoaded) {
    message.textContent = "No jobs yet. Submit one with the form.";
  } else {
    message.textContent = "";
  }
  message.hidden = !message.textContent;
  message.classList.toggle("error-text", Boolean(text) && text.startsWith("Could not"));
}

// ---------------------------------------------------------------- list loading

/** Fetch the newest jobs once; events arriving meanwhile wait and are applied on top. */
async function loadJobs() {
  if (state.pending) return; // a load is in flight; its answer is as fresh as another would be
  state.pending = [];
  const streamWasOpen = state.live;
  if (!state.listLoaded) updateListMessage("Loading jobs…");
  try {
    const params = new URLSearchParams({ limit: String(LIST_LIMIT) });
    if (state.channel) params.set("channel", state.channel);
    const page = await api(`/v1/jobs?${params}`);
    renderSnapshot(Array.isArray(page?.items) ? page.items : []);
    state.listLoaded = true;
    // Loaded before the stream was open: events in between were missed, so load again on open.
    state.listStale = !streamWasOpen;
    updateListMessage();
  } catch (error) {
    state.listStale = true;
    updateListMessage(`Could not load jobs: ${problemText(error.problem)}`);
  } finally {
    const held = state.pending;
    state.pending = null;
    held.forEach(applyJobEvent);
  }
  if (state.reloadAfter) {
    state.reloadAfter = false;
    loadJobs();
  }
}

// ---------------------------------------------------------------- event stream

function setConn(connState, text, detail = "") {
  const conn = $("conn");
  conn.dataset.state = connState;
  conn.title = detail;
  conn.querySelector(".conn-text").textContent = text;
}

function handleEvent(payload) {
  if (state.pending) state.pending.push(payload);
  else applyJobEvent(payload);
}

function applyJobEvent(payload) {
  const job = payload.job;
  if (!job || typeof job !== "object" || !job.id) return;
  const eventId = Number(payload.event_id);
  if (Number.isFinite(eventId)) {
    const applied = state.appliedEvent.get(job.id);
    if (applied !== undefined && eventId <= applied) return;
    state.appliedEvent.set(job.id, eventId);
  }
  upsertJob(job);
}

/** The server could not resume from our cursor: take the current state as the new start. */
function handleReset(payload) {
  state.appliedEvent.clear();
  if (payload.job && payload.job.id && !state.pending) upsertJob(payload.job);
  loadJobs();
}

/** Subscription token for the stream, which cannot send the API key. */
async function fetchStreamToken() {
  const answer = await api("/v1/tokens", { method: "POST", body: {} });
  return answer.token;
}

function closeStream() {
  if (state.watch) state.watch.close();
  state.watch = null;
  state.live = false;
}

function openStream() {
  closeStream();
  setConn("reconnecting", "Connecting…");
  const watch = watchChannel("", state.channel || null, {
    // In dev mode no token is needed; with a key, a token for the tenant's streams.
    getToken: loadApiKey() ? fetchStreamToken : undefined,
    onEvent: handleEvent,
    onReset: handleReset,
    onState: (streamState, detail) => onStreamState(watch, streamState, detail),
    onError: (problem) => {
      if (watch !== state.watch) return;
      state.live = false;
      setConn("reconnecting", "Disconnected", problemText(problem));
      streamTrouble();
    },
  });
  state.watch = watch;
}

function onStreamState(watch, streamState, detail) {
  if (watch !== state.watch) return;
  if (streamState === "live") {
    state.live = true;
    setConn("live", watch.transport === "longpoll" ? "Live (polling)" : "Live");
    if (state.listStale) loadJobs();
  } else if (streamState === "reconnecting") {
    state.live = false;
    // Without a cursor the all-jobs stream starts live, so whatever happened meanwhile is lost.
    if (watch.lastEventId === null) state.listStale = true;
    setConn("reconnecting", "Reconnecting…", detail?.reason ? String(detail.reason) : "");
    streamTrouble();
  }
}

/** While the stream is down, still show what the REST API knows (once, not as a poll). */
function streamTrouble() {
  if (state.listLoaded || state.fallbackTried) return;
  state.fallbackTried = true;
  loadJobs();
}

// ---------------------------------------------------------------- job actions

async function runAction(id, action, button) {
  const entry = state.jobs.get(id);
  button.disabled = true;
  try {
    const answer = await api(`/v1/jobs/${encodeURIComponent(id)}/${action}`, { method: "POST" });
    const job = answer?.job ?? answer;
    if (job && job.id === id && job.status) upsertIfNewer(job);
  } catch (error) {
    const current = state.jobs.get(id) ?? entry;
    if (current) flashNotice(current, `${action === "cancel" ? "Cancel" : "Retry"} failed: ${problemText(error.problem)}`);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- submit form

const FIELD_INPUTS = {
  template: "template",
  data: "data",
  options: "format",
  "options.format": "format",
  "options.landscape": "landscape",
  "options.print_background": "print-background",
  priority: "priority",
  channel: "job-channel",
};
const FIELD_ERRORS = {
  template: "template-error",
  data: "data-error",
  priority: "priority-error",
  "job-channel": "job-channel-error",
};

function setFieldError(inputId, message) {
  const input = $(inputId);
  const errorId = FIELD_ERRORS[inputId] ?? "format-error";
  const box = $(errorId);
  if (message) {
    input.setAttribute("aria-invalid", "true");
    box.textContent = message;
    box.hidden = false;
  } else {
    input.removeAttribute("aria-invalid");
    box.textContent = "";
    box.hidden = true;
  }
}

function clearFieldErrors() {
  for (const inputId of new Set(Object.values(FIELD_INPUTS))) setFieldError(inputId, "");
}

/** A problem's field name as a dotted path: "/options/format", "body.data[0]" → "options.format", "data.0". */
function fieldPath(field) {
  return String(field ?? "")
    .replace(/^\/+/, "")
    .replace(/^body[./]/, "")
    .replace(/\[(\d+)\]/g, ".$1")
    .replaceAll("/", ".");
}

/** Which input a field path points at, if any. */
function inputForField(path) {
  return FIELD_INPUTS[path] ?? FIELD_INPUTS[path.split(".")[0]] ?? null;
}

/** Put a field error next to its input; a deeper path ("data.items.0") is named in the text. */
function markField(field, message) {
  const path = fieldPath(field);
  const input = inputForField(path);
  if (!input) return;
  setFieldError(input, FIELD_INPUTS[path] ? message : `${path}: ${message}`);
}

/** The data textarea as an object, or undefined after showing why it is not one. */
function readData() {
  const text = $("data").value.trim();
  let value;
  try {
    value = JSON.parse(text || "{}");
  } catch (error) {
    setFieldError("data", `Invalid JSON: ${error.message}`);
    return undefined;
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    setFieldError("data", 'Data must be a JSON object, for example {"name": "Ada"}.');
    return undefined;
  }
  setFieldError("data", "");
  return value;
}

function readPriority() {
  const text = $("priority").value.trim();
  const value = text === "" ? 0 : Number(text);
  if (!Number.isInteger(value)) {
    setFieldError("priority", "Priority must be a whole number.");
    return undefined;
  }
  setFieldError("priority", "");
  return value;
}

function readTemplate() {
  const value = $("template").value;
  setFieldError("template", value.trim() ? "" : "The template is empty.");
  return value.trim() ? value : undefined;
}

function showProblem(problem) {
  const box = $("form-problem");
  box.querySelector(".problem-title").textContent = problem.title;
  const detail = box.querySelector(".problem-detail");
  detail.textContent = problem.detail;
  detail.hidden = !problem.detail;
  const list = box.querySelector(".problem-errors");
  list.replaceChildren();
  for (const item of problem.errors) {
    const field = item?.field ? String(item.field) : "";
    const message = String(item?.message ?? item?.detail ?? "invalid");
    const li = el("li");
    if (field) li.append(el("code", "", field), document.createTextNode(`: ${message}`));
    else li.textContent = message;
    list.append(li);
    markField(field, message);
  }
  list.hidden = problem.errors.length === 0;
  box.hidden = false;
  box.scrollIntoView({ block: "nearest" });
}

function clearProblem() {
  $("form-problem").hidden = true;
  clearFieldErrors();
}

async function submitJob(event) {
  event.preventDefault();
  clearProblem();
  const template = readTemplate();
  const data = readData();
  const priority = readPriority();
  const firstInvalid = document.querySelector("#job-form [aria-invalid='true']");
  if (firstInvalid) {
    firstInvalid.focus();
    return;
  }
  const body = {
    template,
    data,
    options: {
      format: $("format").value,
      landscape: $("landscape").checked,
      print_background: $("print-background").checked,
    },
    priority,
  };
  const channel = $("job-channel").value.trim();
  if (channel) body.channel = channel;
  const button = $("submit");
  const status = $("form-status");
  button.disabled = true;
  status.textContent = "Submitting…";
  try {
    const created = await api("/v1/jobs", { method: "POST", body });
    status.textContent = created?.id ? `Job ${shortId(created.id)} ${created.status || "queued"}.` : "Submitted.";
    // The stream may already have shown this job in a later state; the answer is older then.
    if (created?.id && !state.jobs.has(created.id) && shown(created)) upsertJob(created);
  } catch (error) {
    status.textContent = "";
    showProblem(error.problem ?? { title: "Submit failed", detail: String(error), errors: [] });
  } finally {
    button.disabled = false;
  }
}

function setupForm() {
  const form = $("job-form");
  form.addEventListener("submit", submitJob);
  let timer = null;
  // Check the JSON as it is typed, but only once typing pauses.
  $("data").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(readData, 400);
  });
}

// ---------------------------------------------------------------- start

function start() {
  setupApiKey();
  setupChannelFilter();
  setupForm();
  // Stream first, list on open: events after the snapshot cannot slip between the two.
  openStream();
  setTimeout(streamTrouble, LIST_FALLBACK_MS);
}

document.addEventListener("DOMContentLoaded", start);
