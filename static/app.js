// Pressroom dashboard: submit jobs, show the job list as a table with its counts, filters (all
// in the URL), pages and bulk actions, and keep it live over one stream (/pressroom.js: resume,
// token renewal and the long-poll fallback are the module's).
import { watchChannel } from "/pressroom.js";
import { api, currentKey, keyed, setKey } from "/static/session.js";

const STATUSES = ["queued", "running", "done", "failed", "cancelled"];
const LIST_LIMIT = 50;
// If the stream has not opened by then, show the list anyway (it is reloaded once it opens).
const LIST_FALLBACK_MS = 2500;
// Events come in bursts; the counts are read again once a burst has passed.
const COUNTS_AFTER_EVENT_MS = 250;
const NOTICE_MS = 6000;
// The filters of GET /v1/jobs, as the URL and the API name them.
const FILTERS = ["status", "channel", "q", "created_from", "created_to"];

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
  filter: emptyFilter(),    // what the list shows (status, channel, q, created_from/to)
  cursor: "",               // the page shown: "" for the newest, else a next_cursor
  newer: [],                // the cursors of the pages before this one (for "Newer")
  nextCursor: null,         // the next (older) page's cursor; null on the last page
  countsTimer: null,
  countsSeq: 0,             // drops counts answers that a later request overtook
};

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function emptyFilter() {
  return Object.fromEntries(FILTERS.map((name) => [name, ""]));
}

// ---------------------------------------------------------------- API key

function setupApiKey() {
  const input = $("api-key");
  input.value = currentKey();
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
  setKey(key);
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
  loadCounts();
}

// ---------------------------------------------------------------- the view and the URL

/** The filters and the page a URL names (/?status=failed&channel=user-1&cursor=…). */
function viewOfUrl() {
  const params = new URLSearchParams(window.location.search);
  const filter = emptyFilter();
  for (const name of FILTERS) filter[name] = (params.get(name) ?? "").trim();
  if (!STATUSES.includes(filter.status)) filter.status = "";
  return { filter, cursor: params.get("cursor") ?? "" };
}

function urlOf(filter, cursor = "") {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (filter[name]) params.set(name, filter[name]);
  if (cursor) params.set("cursor", cursor);
  const query = params.toString();
  return query ? `/?${query}` : "/";
}

/** Show a view: its filters in the form, its page in the table; `push` makes a history entry
 * (a change by the user), else the URL already says it (the first load, back and forward). */
function showView(view, { push = false, newer = [] } = {}) {
  const channelChanged = view.filter.channel !== state.filter.channel;
  state.filter = { ...view.filter };
  state.cursor = view.cursor;
  state.newer = newer;
  if (push) window.history.pushState(null, "", urlOf(state.filter, state.cursor));
  fillFilterForm();
  const { status, channel } = state.filter;
  $("jobs-heading").textContent = channel ? `Jobs of channel ${channel}` : "Jobs";
  document.title = status ? `${status} jobs · Pressroom` : "Pressroom";
  if (channelChanged) {
    startOver(); // the stream follows the channel: a new one, then the list
  } else {
    state.listStale = true;
    if (state.pending) state.reloadAfter = true;
    else loadJobs();
    loadCounts();
  }
}

function fillFilterForm() {
  const { status, channel, q, created_from: from, created_to: to } = state.filter;
  $("filter-status").value = status;
  $("channel-filter-input").value = channel;
  $("filter-q").value = q;
  $("filter-from").value = localInput(from);
  $("filter-to").value = localInput(to);
}

/** An API time (ISO 8601) as a datetime-local input shows it, in this browser's zone. */
function localInput(iso) {
  const date = parseTime(iso);
  if (!date) return "";
  const shifted = new Date(date.getTime() - date.getTimezoneOffset() * 60_000);
  return shifted.toISOString().slice(0, 16);
}

/** A datetime-local input's value (local time) as the API takes it. */
function apiTime(local) {
  const date = local ? new Date(local) : null;
  return date && !Number.isNaN(date.getTime()) ? date.toISOString() : "";
}

function setupFilters() {
  $("channel-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    const filter = {
      status: $("filter-status").value,
      channel: $("channel-filter-input").value.trim(),
      q: $("filter-q").value.trim(),
      created_from: apiTime($("filter-from").value),
      created_to: apiTime($("filter-to").value),
    };
    showView({ filter, cursor: "" }, { push: true });
  });
  $("filter-status").addEventListener("change", () => $("channel-filter").requestSubmit());
  $("channel-filter-clear").addEventListener("click", () => {
    showView({ filter: emptyFilter(), cursor: "" }, { push: true });
  });
  $("counts").addEventListener("click", (event) => {
    const link = event.target.closest("a[data-state]");
    if (!link || event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
    event.preventDefault();
    showView({ filter: { ...state.filter, status: link.dataset.state }, cursor: "" }, { push: true });
  });
  $("older").addEventListener("click", () => {
    if (!state.nextCursor) return;
    const newer = [...state.newer, state.cursor];
    showView({ filter: state.filter, cursor: state.nextCursor }, { push: true, newer });
  });
  $("newer").addEventListener("click", () => {
    const newer = state.newer.slice(0, -1);
    const cursor = state.newer.length ? state.newer[state.newer.length - 1] : "";
    showView({ filter: state.filter, cursor }, { push: true, newer });
  });
  window.addEventListener("popstate", () => showView(viewOfUrl()));
}

/** Whether a job the stream brings belongs in the table as shown now: the newest page, and a
 * filter the job's JSON can be judged by (a search or an end of the range: the next load). */
function shown(job) {
  const { status, channel, q, created_to: to } = state.filter;
  if (state.cursor || q || to) return false;
  return (!status || job?.status === status) && (!channel || job?.channel === channel);
}

/** The filter as the API's bodies and queries take it (the empty ones left out). */
function filterParams() {
  const params = {};
  for (const name of FILTERS) if (state.filter[name]) params[name] = state.filter[name];
  return params;
}

// ---------------------------------------------------------------- HTTP


/** A problem in one line, with the fields it names: what to change is in them. */
function problemText(problem) {
  if (!problem) return "Something went wrong.";
  const text = problem.detail ? `${problem.title}: ${problem.detail}` : problem.title;
  const fields = (problem.errors ?? [])
    .filter((error) => error?.field)
    .map((error) => `${error.field}: ${error.message}`);
  return fields.length ? `${text} (${fields.join("; ")})` : text;
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

function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
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

/** Date and time, as the list shows a job's creation. */
function formatDateTime(value) {
  const date = parseTime(value);
  return date ? date.toLocaleString([], { dateStyle: "short", timeStyle: "medium" }) : "";
}

/** How long the job's last attempt took (running: so far), in a unit that reads. */
function duration(job) {
  const started = parseTime(job.started_at);
  if (!started) return "";
  const ended = parseTime(job.finished_at) ?? (job.status === "running" ? new Date() : null);
  if (!ended) return "";
  const ms = Math.max(0, ended - started);
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

// ---------------------------------------------------------------- job rows

const COPY_MS = 1500;

function createEntry(id) {
  const cell = (name) => el("td", name);
  const entry = {
    job: null,
    row: el("tr", "job"),
    idCell: cell("job-idcell"),
    idEl: el("a", "job-id"),
    copy: el("button", "copy-id", "⧉"),
    stateCell: cell("job-state"),
    badge: el("span", "badge"),
    progress: el("progress"),
    error: el("span", "job-error"),
    source: cell("job-source"),
    channel: cell("job-channel"),
    createdCell: cell("job-created"),
    created: el("time"),
    duration: cell("job-duration"),
    pages: cell("job-pages"),
    attempts: cell("job-attempts"),
    actions: cell("job-actions"),
    notice: el("span", "job-notice"),
    download: el("a", "download", "PDF"),
    thumb: el("a", "job-thumb"),
    thumbImg: el("img"),
    cancel: el("button", "cancel", "Cancel"),
    retry: el("button", "retry", "Retry"),
    noticeTimer: null,
  };
  entry.row.dataset.jobId = id;
  entry.copy.type = "button";
  entry.copy.title = "Copy the full id";
  entry.copy.setAttribute("aria-label", `Copy the id ${id}`);
  entry.copy.addEventListener("click", () => copyId(entry, id));
  entry.idCell.append(entry.idEl, entry.copy);
  entry.progress.max = 100;
  entry.progress.setAttribute("aria-label", "Progress");
  entry.stateCell.append(entry.badge, entry.progress, entry.error);
  entry.createdCell.append(entry.created);
  entry.thumbImg.alt = "";
  entry.thumbImg.loading = "lazy";
  entry.thumb.append(entry.thumbImg);
  entry.cancel.type = "button";
  entry.retry.type = "button";
  entry.cancel.addEventListener("click", () => runAction(id, "cancel", entry.cancel));
  entry.retry.addEventListener("click", () => runAction(id, "retry", entry.retry));
  entry.row.append(
    entry.idCell, entry.stateCell, entry.source, entry.channel, entry.createdCell,
    entry.duration, entry.pages, entry.attempts, entry.actions,
  );
  return entry;
}

async function copyId(entry, id) {
  try {
    await navigator.clipboard.writeText(id);
    entry.copy.textContent = "✓";
    setTimeout(() => { entry.copy.textContent = "⧉"; }, COPY_MS);
  } catch {
    flashNotice(entry, id); // no clipboard (an insecure origin): show it to copy by hand
  }
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
  const running = job.status === "running" && isNumber(job.progress);
  entry.progress.hidden = !running;
  if (running) entry.progress.value = Math.max(0, Math.min(100, Math.round(job.progress)));
  const error = errorText(job);
  entry.error.textContent = error;
  entry.error.title = error;
  entry.error.hidden = !error;
  // After a retry the last error stays on the job; it is history then, not the outcome.
  entry.error.classList.toggle("job-error-past", job.status !== "failed");
  // A job from the stream carries no source (the list's answers do): keep the one shown.
  if (job.source) entry.source.textContent = job.source;
  entry.channel.textContent = job.channel ?? "";
  entry.created.textContent = formatDateTime(job.created_at);
  entry.created.dateTime = job.created_at || "";
  entry.duration.textContent = duration(job);
  entry.pages.textContent = isNumber(job.pages) ? String(job.pages) : "";
  const max = isNumber(job.max_attempts) ? job.max_attempts : "?";
  entry.attempts.textContent = isNumber(job.attempts) ? `${job.attempts}/${max}` : "";
  renderActions(entry, job);
}

function renderActions(entry, job) {
  const wanted = [];
  if (job.status === "done") {
    entry.download.href = downloadUrl(job);
    const kind = outputOf(job).toUpperCase();
    entry.download.textContent = kind;
    entry.download.setAttribute("aria-label", `Download ${kind} of job ${shortId(job.id)}`);
    wanted.push(entry.download);
    if (typeof job.thumbnail_url === "string") {
      // Each answer signs a fresh URL: load the picture once per attempt, not on every event.
      const attempt = String(job.attempts);
      if (entry.thumbImg.dataset.attempt !== attempt) {
        entry.thumbImg.dataset.attempt = attempt;
        entry.thumbImg.src = job.thumbnail_url;
      }
      entry.thumbImg.alt = `First page of job ${shortId(job.id)}`;
      entry.thumb.href = downloadUrl(job);
      wanted.push(entry.thumb);
    }
  }
  if (job.status === "queued" || job.status === "running") wanted.push(entry.cancel);
  if (job.status === "failed") wanted.push(entry.retry);
  wanted.push(entry.notice);
  entry.cancel.setAttribute("aria-label", `Cancel job ${shortId(job.id)}`);
  entry.retry.setAttribute("aria-label", `Retry job ${shortId(job.id)}`);
  // Only touch the DOM when the set changes, so a focused button keeps its focus.
  const current = Array.from(entry.actions.children);
  const same = current.length === wanted.length && current.every((node, i) => node === wanted[i]);
  if (!same) entry.actions.replaceChildren(...wanted);
}

function flashNotice(entry, text) {
  clearTimeout(entry.noticeTimer);
  entry.notice.textContent = text;
  entry.noticeTimer = setTimeout(() => {
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

/** A page shows LIST_LIMIT jobs: those pushed off the end are on the next page now. */
function trimRows() {
  const list = $("jobs");
  while (list.children.length > LIST_LIMIT) {
    const row = list.lastElementChild;
    state.jobs.delete(row.dataset.jobId);
    row.remove();
    // The older page starts after the last job shown now.
    const last = state.jobs.get(list.lastElementChild?.dataset.jobId)?.job;
    state.nextCursor = last ? cursorOf(last) : state.nextCursor;
  }
  renderPager();
}

/** The cursor GET /v1/jobs gives for a page ending with this job: its created_at (with six
 * digits of the second and a numeric zone, as the server writes it) and id. */
function cursorOf(job) {
  const match = /^(.+T\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?(Z|[+-]\d\d:\d\d)$/.exec(job.created_at ?? "");
  if (!match) return null;
  const [, seconds, fraction, zone] = match;
  const micro = fraction ? `.${fraction.padEnd(6, "0")}` : "";
  return `${seconds}${micro}${zone === "Z" ? "+00:00" : zone}~${job.id}`;
}

function upsertJob(job) {
  let entry = state.jobs.get(job.id);
  if (entry) {
    entry.job = { ...job, source: job.source ?? entry.job?.source };
    renderEntry(entry);
  } else {
    if (!shown(job)) return;
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
  const shownAt = parseTime(current?.updated_at);
  if (current && (!incoming || (shownAt && incoming < shownAt))) return;
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
  const filtered = FILTERS.some((name) => state.filter[name]);
  if (text) {
    message.textContent = text;
  } else if (state.jobs.size === 0 && state.listLoaded) {
    message.textContent = filtered ? "No job matches these filters." : "No jobs yet. Submit one with the form.";
  } else {
    message.textContent = "";
  }
  message.hidden = !message.textContent;
  message.classList.toggle("error-text", Boolean(text) && text.startsWith("Could not"));
}

function renderPager() {
  $("older").disabled = !state.nextCursor;
  $("newer").disabled = !state.cursor;
}

// ---------------------------------------------------------------- list loading

/** Fetch the page shown once; events arriving meanwhile wait and are applied on top. */
async function loadJobs() {
  if (state.pending) return; // a load is in flight; its answer is as fresh as another would be
  state.pending = [];
  const streamWasOpen = state.live;
  if (!state.listLoaded) updateListMessage("Loading jobs…");
  try {
    const params = new URLSearchParams({ limit: String(LIST_LIMIT), ...filterParams() });
    if (state.cursor) params.set("cursor", state.cursor);
    const page = await api(`/v1/jobs?${params}`);
    renderSnapshot(Array.isArray(page?.items) ? page.items : []);
    state.nextCursor = page?.next_cursor ?? null;
    state.listLoaded = true;
    // Loaded before the stream was open: events in between were missed, so load again on open.
    state.listStale = !streamWasOpen;
    updateListMessage();
  } catch (error) {
    state.listStale = true;
    renderSnapshot([]);
    state.nextCursor = null;
    updateListMessage(`Could not load jobs: ${problemText(error.problem)}`);
  } finally {
    renderPager();
    const held = state.pending;
    state.pending = null;
    held.forEach(applyJobEvent);
  }
  if (state.reloadAfter) {
    state.reloadAfter = false;
    loadJobs();
  }
}

// ---------------------------------------------------------------- counts

/** The counts by state of the jobs the filters (but the state) match, each a link to them. */
async function loadCounts() {
  clearTimeout(state.countsTimer);
  state.countsTimer = null;
  const seq = ++state.countsSeq;
  const { status: _status, ...rest } = filterParams();
  let counts;
  try {
    counts = await api(`/v1/jobs/counts?${new URLSearchParams(rest)}`);
  } catch {
    return; // the list says what is wrong; the counts keep their last figures
  }
  if (seq !== state.countsSeq) return;
  const links = [["", "all", counts.total], ...STATUSES.map((s) => [s, s, counts[s]])];
  $("counts").replaceChildren(
    ...links.map(([value, label, n]) => {
      const link = el("a", `count count-${label}`);
      link.href = urlOf({ ...state.filter, status: value });
      link.dataset.state = value;
      if (value === state.filter.status) link.setAttribute("aria-current", "page");
      link.append(el("span", "count-label", label), el("b", "count-n", String(n ?? 0)));
      return link;
    }),
  );
}

/** An event changed some job: read the counts again once the burst has passed. */
function countsChanged() {
  if (state.countsTimer === null) state.countsTimer = setTimeout(loadCounts, COUNTS_AFTER_EVENT_MS);
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
  countsChanged();
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
  const watch = watchChannel("", state.filter.channel || null, {
    // In dev mode no token is needed; with a key, a token for the tenant's streams.
    getToken: keyed() ? fetchStreamToken : undefined,
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

// ---------------------------------------------------------------- acting on every matching job

const BULK = {
  retry: { verb: "Retry", done: "Retried", which: "failed" },
  cancel: { verb: "Cancel", done: "Cancelled", which: "queued or running" },
};

/** Retry or cancel every job the filters match: the server counts first (dry_run), the
 * confirmation names that count, then one request does it all. */
async function bulkAction(action, button) {
  const { verb, done, which } = BULK[action];
  const status = $("bulk-status");
  const body = filterParams();
  button.disabled = true;
  try {
    const planned = await api(`/v1/jobs/${action}`, { method: "POST", body: { ...body, dry_run: true } });
    if (planned.applied === 0) {
      status.textContent = `No ${which} job matches these filters.`;
      return;
    }
    const plural = planned.applied === 1 ? "job" : "jobs";
    const left = planned.skipped ? ` (${planned.skipped} others match and are left as they are)` : "";
    if (!window.confirm(`${verb} ${planned.applied} ${which} ${plural}?${left}`)) {
      status.textContent = "";
      return;
    }
    const result = await api(`/v1/jobs/${action}`, { method: "POST", body });
    status.textContent = `${done} ${result.applied}; ${result.skipped} left as they are.`;
    loadCounts();
  } catch (error) {
    status.textContent = `${verb} failed: ${problemText(error.problem)}`;
  } finally {
    button.disabled = false;
  }
}

function setupBulk() {
  $("bulk-retry").addEventListener("click", (event) => bulkAction("retry", event.currentTarget));
  $("bulk-cancel").addEventListener("click", (event) => bulkAction("cancel", event.currentTarget));
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
    if (created?.id && !state.jobs.has(created.id)) upsertJob(created);
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
  setupFilters();
  setupBulk();
  setupForm();
  const view = viewOfUrl();
  state.filter = view.filter;
  state.cursor = view.cursor;
  fillFilterForm();
  if (state.filter.channel) $("jobs-heading").textContent = `Jobs of channel ${state.filter.channel}`;
  renderPager();
  // Stream first, list on open: events after the snapshot cannot slip between the two.
  openStream();
  loadCounts();
  setTimeout(streamTrouble, LIST_FALLBACK_MS);
}

document.addEventListener("DOMContentLoaded", start);
