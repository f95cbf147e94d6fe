// Pressroom dashboard: the job list as a table with its counts, filters (all in the URL), pages
// and bulk actions, kept live over one stream (/pressroom.js: resume, token renewal and the
// long-poll fallback are the module's).
import { watchChannel } from "/pressroom.js";
import { api, keyed } from "/static/session.js";
import {
  $, STATUSES, createEntry, el, flashNotice, parseTime, problemText, renderEntry,
} from "/static/rows.js";

const LIST_LIMIT = 50;
// If the stream has not opened by then, show the list anyway (it is reloaded once it opens).
const LIST_FALLBACK_MS = 2500;
// Events come in bursts; the counts are read again once a burst has passed.
const COUNTS_AFTER_EVENT_MS = 250;
// The filters of GET /v1/jobs, as the API names them.
const FILTERS = ["status", "channel", "template", "q", "created_from", "created_to"];
// The dashboard's URL names the state filter `state` (/?state=failed&template=invoice); older
// links name it as the API does, `status`, which is still read.
const URL_NAMES = { status: "state" };

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
  filter: emptyFilter(),    // what the list shows (status, channel, template, q, created_…)
  cursor: "",               // the page shown: "" for the newest, else a next_cursor
  newer: [],                // the cursors of the pages before this one (for "Newer")
  nextCursor: null,         // the next (older) page's cursor; null on the last page
  countsTimer: null,
  countsSeq: 0,             // drops counts answers that a later request overtook
};

function emptyFilter() {
  return Object.fromEntries(FILTERS.map((name) => [name, ""]));
}

/** A fresh list and stream (another tenant, another channel): nothing of the old one is kept. */
export function startOver() {
  state.appliedEvent.clear();
  state.listStale = true;
  if (state.pending) state.reloadAfter = true;
  openStream();
  loadCounts();
}

// ---------------------------------------------------------------- the view and the URL

/** The filters and the page a URL names (/?state=failed&channel=user-1&cursor=…). */
function viewOfUrl() {
  const params = new URLSearchParams(window.location.search);
  const filter = emptyFilter();
  for (const name of FILTERS) {
    const value = params.get(URL_NAMES[name] ?? name) ?? params.get(name);
    filter[name] = (value ?? "").trim();
  }
  if (!STATUSES.includes(filter.status)) filter.status = "";
  return { filter, cursor: params.get("cursor") ?? "" };
}

function urlOf(filter, cursor = "") {
  const params = new URLSearchParams();
  for (const name of FILTERS) if (filter[name]) params.set(URL_NAMES[name] ?? name, filter[name]);
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
  const { status, channel, template, q, created_from: from, created_to: to } = state.filter;
  $("filter-status").value = status;
  $("channel-filter-input").value = channel;
  $("filter-template").value = template;
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
      template: $("filter-template").value.trim(),
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
 * filter the job's JSON can be judged by (a template, a search or an end of the range, which
 * the job's JSON does not tell: the next load). */
function shown(job) {
  const { status, channel, template, q, created_to: to } = state.filter;
  if (state.cursor || template || q || to) return false;
  return (!status || job?.status === status) && (!channel || job?.channel === channel);
}

/** The filter as the API's bodies and queries take it (the empty ones left out). */
function filterParams() {
  const params = {};
  for (const name of FILTERS) if (state.filter[name]) params[name] = state.filter[name];
  return params;
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

/** Show a job (new, or newer than its row) where it belongs, if the list as shown holds it. */
export function upsertJob(job) {
  let entry = state.jobs.get(job.id);
  if (entry) {
    entry.job = { ...job, source: job.source ?? entry.job?.source };
    renderEntry(entry);
  } else {
    if (!shown(job)) return;
    entry = createEntry(job.id, runAction);
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
      entry = createEntry(job.id, runAction);
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


/** A job the form just submitted: shown unless the stream already brought it (in a later state),
 * then its source as the list names it (neither the answer nor the stream carries it). */
export async function showSubmitted(job) {
  if (!job?.id) return;
  if (!state.jobs.has(job.id)) upsertJob(job);
  let found;
  try {
    found = (await api(`/v1/jobs?${new URLSearchParams({ q: job.id, limit: "1" })}`))?.items?.[0];
  } catch {
    return; // the row simply shows no source until the list is read again
  }
  const entry = state.jobs.get(job.id);
  if (!entry || found?.id !== job.id || !found.source) return;
  entry.job = { ...entry.job, source: found.source };
  renderEntry(entry);
}

// ---------------------------------------------------------------- start

export function startList() {
  setupFilters();
  setupBulk();
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
