// Pressroom: the tenant's batches at /batches (newest first, by the list's cursor) and one batch
// at /batches/{id}: its progress, counts, failed items with their errors, its combined file.
// Both follow the batch events of the tenant's stream (/pressroom.js): the list updates its rows
// from each event, a batch's page reads the batch again at each of its own.
import { watchChannel } from "/pressroom.js";
import { api, keyed } from "/static/session.js";
import { $, el, folded, link, notice, problemText, setConn, size, tenantToken, when } from "/static/views.js";

const STATES = ["queued", "running", "done", "failed", "cancelled"];
const BATCH_EVENTS = ["batch.progress", "batch.done"];
const PAGE = 50;

const parts = location.pathname.split("/").filter(Boolean);
const batchId = parts[1] ? decodeURIComponent(parts[1]) : null;
const state = { watch: null, cursors: [null], page: 0, rows: new Map(), current: null };

// ------------------------------------------------------------------ shared pieces

function badge(status) {
  return el("span", `badge badge-${STATES.includes(status) ? status : "running"}`, status);
}

function meter(progress, label) {
  const box = el("div", "meter");
  const track = el("div", "meter-track");
  track.setAttribute("role", "progressbar");
  track.setAttribute("aria-label", label);
  track.setAttribute("aria-valuemin", "0");
  track.setAttribute("aria-valuemax", "100");
  track.setAttribute("aria-valuenow", String(progress));
  const bar = el("div", "meter-bar");
  bar.style.width = `${progress}%`;
  track.append(bar);
  box.append(track, el("span", "meter-text", `${progress} %`));
  return box;
}

function combinedText(combined) {
  if (!combined) return "—";
  if (combined.status === "done") return `done · ${combined.pages ?? "?"} pages · ${size(combined.bytes)}`;
  return combined.status;
}

function cell(label, ...children) {
  const td = el("td");
  td.dataset.label = label;
  td.append(...children);
  return td;
}

function follow(onEvent) {
  setConn("reconnecting", "Connecting…");
  const watch = watchChannel("", null, {
    types: BATCH_EVENTS,
    getToken: keyed() ? tenantToken : undefined,
    onEvent,
    onReset: () => onEvent(null),
    onState: (streamState) => {
      if (watch !== state.watch) return;
      if (streamState === "live") setConn("live", "Live");
      else if (streamState === "reconnecting") setConn("reconnecting", "Reconnecting…");
    },
    onError: (problem) => {
      if (watch !== state.watch) return;
      state.watch = null;
      setConn("ended", "Stopped");
      notice(problem?.detail || "The stream stopped.");
    },
  });
  state.watch = watch;
}

// ------------------------------------------------------------------ the list

function batchRow(batch) {
  const row = el("tr", "batch");
  row.dataset.batchId = batch.id;
  row.dataset.status = batch.status;
  const id = link(`/batches/${encodeURIComponent(batch.id)}`, batch.id.slice(0, 8), "batch-link");
  id.setAttribute("aria-label", `Batch ${batch.id}`);
  const failed = batch.counts.failed + batch.counts.cancelled;
  row.append(
    cell("Batch", id),
    cell("State", badge(batch.status)),
    cell("Progress", meter(batch.progress, `Batch ${batch.id.slice(0, 8)}: items final`)),
    cell("Items", `${batch.counts.done} of ${batch.total} done`),
    cell("Failed", failed ? el("span", "error-text", `${batch.counts.failed} failed${batch.counts.cancelled ? `, ${batch.counts.cancelled} cancelled` : ""}`) : "—"),
    cell("Combined file", combinedText(batch.combined)),
    cell("Channel", batch.channel || "—"),
    cell("Created", when(batch.created_at)),
  );
  row.querySelector("td:nth-child(4)").classList.add("num");
  return row;
}

const loadList = folded(async () => {
  try {
    const cursor = state.cursors[state.page];
    const query = new URLSearchParams({ limit: String(PAGE) });
    if (cursor) query.set("cursor", cursor);
    const page = await api(`/v1/batches?${query}`);
    state.rows = new Map(page.items.map((batch) => [batch.id, batch]));
    $("batches").replaceChildren(...page.items.map(batchRow));
    $("batches-empty").hidden = page.items.length > 0;
    state.cursors[state.page + 1] = page.next_cursor;
    $("older").disabled = !page.next_cursor;
    $("newer").disabled = state.page === 0;
    notice("");
  } catch (error) {
    notice(problemText(error, "batches"));
  }
  $("view").setAttribute("aria-busy", "false");
});

function onListEvent(event) {
  const batch = event?.batch;
  if (!batch || !state.rows.has(batch.id)) {
    // A new batch (or a reset): it belongs at the top of the newest page.
    if (state.page === 0) loadList();
    return;
  }
  const shown = { ...state.rows.get(batch.id), ...batch };
  state.rows.set(batch.id, shown);
  const old = $("batches").querySelector(`tr[data-batch-id="${CSS.escape(batch.id)}"]`);
  if (old) old.replaceWith(batchRow(shown));
}

function showList() {
  $("list-view").hidden = false;
  $("older").addEventListener("click", () => { state.page += 1; loadList(); });
  $("newer").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); loadList(); });
  follow(onListEvent);
  loadList();
}

// ------------------------------------------------------------------ one batch

function renderBatch(batch) {
  document.title = `Batch ${batch.id} · ${batch.status} · Pressroom`;
  document.body.dataset.status = batch.status;
  $("batch-id").textContent = batch.id;
  $("batch-status").replaceWith(Object.assign(badge(batch.status), { id: "batch-status" }));
  $("batch-progress").setAttribute("aria-valuenow", String(batch.progress));
  $("batch-bar").style.width = `${batch.progress}%`;
  $("batch-percent").textContent = `${batch.progress} %`;
  $("batch-counts").replaceChildren(...STATES.map((name) => {
    const item = el("li", `tally-${name}`, `${batch.counts[name]} ${name}`);
    item.dataset.state = name;
    item.dataset.n = String(batch.counts[name]);
    return item;
  }));
  const facts = [
    ["Items", batch.total],
    ["Created", when(batch.created_at)],
    ["Finished", when(batch.finished_at)],
    ["Channel", batch.channel || "—"],
    ["Webhook", batch.webhook_url || "—"],
    ["JSON", link(batch.links.self, batch.links.self)],
  ];
  $("batch-facts").replaceChildren(...facts.flatMap(([name, value]) => {
    const dd = el("dd");
    dd.append(value instanceof Node ? value : String(value));
    return [el("dt", "", name), dd];
  }));
  renderCombined(batch);
  renderItems(batch);
}

function renderCombined(batch) {
  const box = $("combined");
  const combined = batch.combined;
  box.dataset.status = combined ? combined.status : "none";
  if (!combined) {
    box.replaceChildren(el("p", "hint", "This batch asked for no combined file (combine)."));
    return;
  }
  const facts = el("dl", "facts");
  const add = (name, value) => {
    const dd = el("dd");
    dd.append(value instanceof Node ? value : String(value));
    facts.append(el("dt", "", name), dd);
  };
  add("State", badge(combined.status === "pending" ? "queued" : combined.status));
  facts.querySelector(".badge").textContent = combined.status;
  add("Pages", combined.pages ?? "—");
  add("Size", size(combined.bytes));
  add("Joins started", combined.attempts);
  add("Finished", when(combined.finished_at));
  if (combined.error) add("Error", el("span", "error-text", combined.error));
  const parts = [facts];
  if (combined.status === "done" && combined.url) {
    const file = link(combined.url, "Download the combined PDF", "download");
    file.id = "combined-link";
    const line = el("p", "combined-file");
    line.append(file);
    parts.push(line);
  } else if (combined.status === "pending") {
    parts.push(el("p", "hint", "Joined once every item is done."));
  }
  box.replaceChildren(...parts);
}

function jobLink(item) {
  const node = link(`/jobs/${encodeURIComponent(item.job_id)}`, item.job_id.slice(0, 8), "job-link");
  node.setAttribute("aria-label", `Job ${item.job_id} (item ${item.key})`);
  return node;
}

function renderItems(batch) {
  const failed = batch.items.filter((item) => item.status === "failed" || item.status === "cancelled");
  $("failures-empty").hidden = failed.length > 0;
  $("failures").replaceChildren(...failed.map((item) => {
    const entry = el("li", "failure");
    entry.dataset.key = item.key;
    const head = el("p");
    head.append(el("strong", "", item.key), " ", badge(item.status), " ", jobLink(item));
    entry.append(head, el("p", "error-text", item.error || "(no error recorded)"));
    return entry;
  }));
  $("items").replaceChildren(...batch.items.map((item, index) => {
    const row = el("tr", "item");
    row.dataset.key = item.key;
    row.dataset.status = item.status;
    const file = item.url ? link(item.url, "PDF") : "—";
    row.append(cell("#", String(index + 1)), cell("Key", el("code", "", item.key)),
      cell("State", badge(item.status)), cell("Pages", item.pages ?? "—"), cell("Job", jobLink(item)),
      cell("File", file));
    row.children[0].classList.add("num");
    row.children[3].classList.add("num");
    return row;
  }));
}

const loadBatch = folded(async () => {
  try {
    const batch = await api(`/v1/batches/${encodeURIComponent(batchId)}`);
    state.current = batch;
    renderBatch(batch);
    $("batch-view").hidden = false;
    notice("");
    if (!state.watch) follow((event) => {
      if (!event || event.batch?.id === batchId) loadBatch();
    });
  } catch (error) {
    notice(problemText(error, `batch ${batchId}`));
    const status = error.problem?.status;
    if (status === 404 || status === 401) {
      if (state.watch) state.watch.close();
      state.watch = null;
      setConn("ended", "Stopped");
    }
  }
  $("view").setAttribute("aria-busy", "false");
});

if (batchId) loadBatch();
else showList();
