// Pressroom: one job's story at /jobs/{id}. Reads GET /v1/jobs/{id}/story with the dashboard's
// key, follows the job's own stream while it may change (/pressroom.js: resume, token renewal,
// the end of the stream) and reads the story again at each event; stops at the final event.
import { watchJob } from "/pressroom.js";
import { api, keyed } from "/static/session.js";

const FINAL = new Set(["done", "failed", "cancelled"]);
const STATUSES = ["queued", "running", "done", "failed", "cancelled"];
const IMAGES = new Set(["png", "jpeg", "webp"]);
// Webhook deliveries have no stream: while one is pending, the story is read again this often.
const DELIVERY_RECHECK_MS = 2000;

const $ = (id) => document.getElementById(id);
const jobId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
const state = { watch: null, loading: null, again: false, recheck: null, shownUrl: null };

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

function setConn(kind, text) {
  $("conn").dataset.state = kind;
  $("conn").querySelector(".conn-text").textContent = text;
}

// ------------------------------------------------------------------ formatting

function time(iso) {
  if (!iso) return "—";
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? String(iso) : at.toLocaleString();
}

function took(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

function json(value) {
  return JSON.stringify(value ?? null, null, 2);
}

// ------------------------------------------------------------------ rendering

function render(story) {
  const job = story.job;
  const status = STATUSES.includes(job.status) ? job.status : "unknown";
  document.body.dataset.status = status;
  document.title = `Job ${job.id} · ${status} · Pressroom`;
  $("job-id").textContent = job.id;
  $("status").textContent = status;
  $("status").className = `badge badge-${status}`;
  $("attempt-count").textContent = `attempt ${job.attempts} of ${job.max_attempts}`;
  const progress = job.status === "done" ? 100 : (job.progress ?? 0);
  $("progress-bar").style.width = `${progress}%`;
  $("progress-text").textContent = job.status === "done" ? "100 %"
    : job.progress === null || job.progress === undefined ? "" : `${job.progress} %`;
  renderFacts(story);
  renderLinks(story);
  renderDocument(job);
  renderTimeline(story);
  renderAttempts(story.attempts);
  renderDeliveries(story.deliveries);
  $("data").textContent = json(story.data);
  $("options").textContent = json(job.options);
  $("metadata").textContent = json(job.metadata);
  $("story").setAttribute("aria-busy", "false");
}

// What each kind of source is called, as the list names it (server/web/jobs_api.py).
const SOURCE_LABELS = {
  template: "Template", markdown: "Markdown", page_url: "Page URL",
  office: "Office file", docx: "Word template", pdfs: "PDFs",
};

/** A file the job converts or merges: its name, and the asset it is when the name is a path. */
function fileText(file) {
  if (!file.asset_id) return `${file.name} (no longer stored)`;
  return file.asset_id === file.name ? file.name : `${file.name} (${file.asset_id.slice(0, 19)}…)`;
}

/** What the job's finishing reports (its `finishing`, server/pdf/finishing.py), as facts: the
 * document information read back from the finished PDF, and compress's sizes. */
function finishingFacts(finishing) {
  const facts = [];
  const metadata = finishing?.metadata;
  if (metadata && Object.keys(metadata).length) {
    const list = el("dl", "finishing-metadata");
    list.id = "finishing-metadata";
    for (const [key, value] of Object.entries(metadata)) list.append(el("dt", "", key), el("dd", "", value));
    facts.push(["Document information", list]);
  }
  const sizes = finishing?.compress;
  if (sizes) {
    const { bytes_before: before, bytes_after: after } = sizes;
    const change = before ? Math.round((100 * (before - after)) / before) : 0;
    const text = `${before} → ${after} bytes`
      + (change > 0 ? ` (${change} % smaller)` : change < 0 ? ` (${-change} % larger)` : "");
    const figure = el("span", "finishing-compress", text);
    figure.id = "finishing-compress";
    figure.dataset.before = String(before);
    figure.dataset.after = String(after);
    facts.push(["Compressed", figure]);
  }
  return facts;
}

function renderFacts(story) {
  const job = story.job;
  const facts = [
    ["Source", [SOURCE_LABELS[story.source] || story.source, story.template].filter(Boolean).join(" ")],
    ...(story.files.length ? [["Files", story.files.map(fileText).join(", ")]] : []),
    ...finishingFacts(job.finishing),
    ["Created", time(job.created_at)],
    ["Started", time(job.started_at)],
    ["Finished", time(job.finished_at)],
    ["Pages", job.pages ?? "—"],
    ["Size", job.bytes === null || job.bytes === undefined ? "—" : `${job.bytes} bytes`],
    ["Channel", job.channel || "—"],
    ["Last error", job.error || "—"],
    ["Warnings", job.warnings?.length ? job.warnings.join("; ") : "—"],
  ];
  $("facts").replaceChildren(...facts.flatMap(([name, value]) => {
    const cell = value instanceof Node ? el("dd") : el("dd", "", value);
    if (value instanceof Node) cell.append(value);
    return [el("dt", "", name), cell];
  }));
}

function renderLinks(story) {
  const links = [];
  for (const batch of story.batches) {
    const link = el("a", "batch-link", `Batch ${batch.id} (item ${batch.key})`);
    link.href = `/batches/${encodeURIComponent(batch.id)}`;
    links.push(link);
  }
  if (story.template) {
    const [name] = story.template.split("@");
    const version = el("a", "template-link", `Template ${story.template}`);
    version.href = `/templates/${encodeURIComponent(name)}`;
    links.push(version);
  }
  const raw = el("a", "json-link", "Job JSON");
  raw.href = story.job.links.self;
  links.push(raw);
  $("links").replaceChildren(...links.flatMap((link, i) => (i ? [document.createTextNode(" · "), link] : [link])));
}

function renderDocument(job) {
  const box = $("document");
  const url = job.status === "done" ? job.url : null;
  $("document-empty").hidden = Boolean(url);
  box.hidden = !url;
  // The signed URL changes at every read: keep what is shown while the job has not changed.
  if (!url || state.shownUrl === job.id + job.updated_at) return;
  state.shownUrl = job.id + job.updated_at;
  const parts = [];
  if (IMAGES.has(job.options?.output)) {
    const image = el("img", "document-image");
    image.id = "image";
    image.src = url;
    image.alt = `The image of job ${job.id}`;
    parts.push(image);
  } else {
    // The browser's own PDF viewer; the file is served inline.
    const frame = el("iframe", "document-pdf");
    frame.id = "pdf";
    frame.src = url;
    frame.title = `The PDF of job ${job.id}`;
    parts.push(frame);
  }
  const actions = el("p", "document-actions");
  const open = el("a", "", "Open in a new tab");
  open.href = url;
  open.target = "_blank";
  open.rel = "noopener";
  actions.append(open);
  if (job.thumbnail_url) {
    const thumb = el("img", "thumbnail");
    thumb.id = "thumbnail";
    thumb.src = job.thumbnail_url;
    thumb.alt = "First page";
    actions.append(thumb);
  }
  parts.push(actions);
  box.replaceChildren(...parts);
}

function renderTimeline(story) {
  const total = story.phases.reduce((sum, p) => sum + p.seconds, 0) || 1;
  $("phases").replaceChildren(...story.phases.map((phase) => {
    const item = el("li", `phase phase-${phase.phase}`);
    item.dataset.phase = phase.phase;
    item.dataset.seconds = String(phase.seconds);
    item.append(el("span", "phase-name", phase.phase), el("span", "phase-time", took(phase.seconds)));
    const bar = el("span", "phase-bar");
    bar.style.width = `${Math.max(2, (100 * phase.seconds) / total)}%`;
    item.append(bar);
    return item;
  }));
  $("timeline").replaceChildren(...story.timeline.map((event) => {
    const item = el("li", "event");
    item.dataset.type = event.type;
    item.dataset.eventId = String(event.event_id);
    const head = el("p", "event-head");
    head.append(el("span", `badge badge-${event.status}`, event.type.replace("job.", "")),
      el("time", "event-at", time(event.at)));
    item.append(head);
    const detail = event.attempt ? [`attempt ${event.attempt}`] : [];
    if (event.phase) detail.push(`then ${event.phase} for ${took(event.seconds)}${story.live && event === story.timeline.at(-1) ? " so far" : ""}`);
    if (event.progress !== null && event.progress !== undefined && event.status === "running") detail.push(`${event.progress} %`);
    item.append(el("p", "hint", detail.join(" · ")));
    if (event.error && event.type !== "job.queued") item.append(el("p", "event-error", event.error));
    return item;
  }));
}

// An attempt's steps in its worker, in the order it goes through them (the story's `phases`).
const STEPS = ["template", "render", "finishing", "store"];

// A bar of the steps an attempt reached, each as wide as its share of their time, and the
// figures beside it; nothing for an attempt without phases (running, cancelled, released).
function attemptPhases(attempt) {
  const reached = STEPS.filter((step) => attempt.phases && attempt.phases[step] !== null
    && attempt.phases[step] !== undefined);
  const row = el("tr", "attempt-phases");
  row.dataset.attempt = String(attempt.attempt);
  row.hidden = reached.length === 0;
  const cell = el("td", "");
  cell.colSpan = 7;
  const total = reached.reduce((sum, step) => sum + attempt.phases[step], 0) || 1;
  const bar = el("div", "step-bar");
  bar.setAttribute("aria-hidden", "true");
  const figures = el("ul", "steps");
  figures.setAttribute("aria-label", `Time of attempt ${attempt.attempt} in each step`);
  for (const step of reached) {
    const seconds = attempt.phases[step];
    const part = el("span", `step-part step-${step}`);
    part.style.width = `${(100 * seconds) / total}%`;
    bar.append(part);
    const figure = el("li", `step step-${step}`);
    figure.dataset.step = step;
    figure.dataset.seconds = String(seconds);
    figure.append(el("span", "step-swatch"), el("span", "step-name", step),
      el("span", "step-time", took(seconds)));
    figures.append(figure);
  }
  const box = el("div", "attempt-steps");
  box.append(bar, figures);
  cell.append(box);
  row.append(cell);
  return row;
}

function renderAttempts(attempts) {
  $("attempts-empty").hidden = attempts.length > 0;
  $("attempts").replaceChildren(...attempts.flatMap((attempt) => {
    const row = el("tr", "attempt");
    row.dataset.outcome = attempt.outcome;
    const notes = el("td", "attempt-notes");
    if (attempt.error) notes.append(el("p", "event-error", attempt.error));
    for (const warning of attempt.warnings) notes.append(el("p", "warning", warning));
    if (!attempt.error && !attempt.warnings.length) notes.textContent = "—";
    const worker = el("td", "", "");
    worker.append(el("code", "", attempt.worker_id));
    row.append(el("td", "", attempt.attempt), el("td", "", attempt.outcome), worker,
      el("td", "", time(attempt.started_at)), el("td", "", time(attempt.ended_at)),
      el("td", "", took(attempt.seconds)), notes);
    return [row, attemptPhases(attempt)];
  }));
}

function renderDeliveries(deliveries) {
  $("deliveries-empty").hidden = deliveries.length > 0;
  $("deliveries").replaceChildren(...deliveries.map((delivery) => {
    const item = el("li", "delivery");
    item.dataset.deliveryId = delivery.id;
    item.dataset.status = delivery.status;
    const head = el("p", "delivery-head");
    head.append(el("span", `badge delivery-${delivery.status}`, delivery.status),
      el("span", "", `${delivery.type} → `), el("code", "delivery-url", delivery.url));
    item.append(head);
    const tries = el("ol", "tries");
    for (const attempt of delivery.tries) {
      const line = el("li", "try");
      line.dataset.statusCode = attempt.status_code === null ? "" : String(attempt.status_code);
      line.append(el("strong", "", attempt.status_code ?? "no answer"),
        el("span", "hint", ` ${time(attempt.at)} · ${attempt.duration_ms} ms`));
      if (attempt.error) line.append(el("span", "event-error", ` ${attempt.error}`));
      tries.append(line);
    }
    item.append(tries);
    const button = el("button", "redeliver secondary", "Deliver again");
    button.type = "button";
    button.disabled = delivery.status === "pending";
    button.title = button.disabled ? "Due or in flight already" : "Queue it again (same webhook-id)";
    button.addEventListener("click", () => redeliver(delivery, button));
    item.append(button);
    return item;
  }));
  clearTimeout(state.recheck);
  if (!state.watch && deliveries.some((d) => d.status === "pending")) {
    state.recheck = setTimeout(load, DELIVERY_RECHECK_MS);
  }
}

async function redeliver(delivery, button) {
  button.disabled = true;
  try {
    await api(delivery.redeliver, { method: "POST" });
    notice("");
  } catch (error) {
    notice(error.problem?.detail || error.message);
  }
  await load();
}

// ------------------------------------------------------------------ loading and live

/** Read the story; reads asked for meanwhile are folded into one more read after it. */
async function load() {
  if (state.loading) {
    state.again = true;
    return state.loading;
  }
  state.loading = (async () => {
    do {
      state.again = false;
      try {
        const story = await api(`/v1/jobs/${encodeURIComponent(jobId)}/story`);
        render(story);
        if (!story.live) stopWatching("Final");
        else if (!state.watch) follow();
      } catch (error) {
        const status = error.problem?.status;
        notice(status === 404 ? `No job ${jobId} (or it is another tenant's).`
          : status === 401 ? "This server needs an API key: set it on the dashboard's front page."
          : error.message);
        if (status === 404 || status === 401) stopWatching("Stopped");
      }
    } while (state.again);
  })();
  try {
    await state.loading;
  } finally {
    state.loading = null;
  }
  return undefined;
}

function stopWatching(text) {
  if (state.watch) state.watch.close();
  state.watch = null;
  setConn("ended", text);
}

async function jobToken() {
  const answer = await api("/v1/tokens", { method: "POST", body: { job_id: jobId } });
  return answer.token;
}

function follow() {
  setConn("reconnecting", "Connecting…");
  const watch = watchJob("", jobId, {
    getToken: keyed() ? jobToken : undefined,
    onEvent: () => load(),
    onReset: () => load(),
    onDone: () => {
      state.watch = null;
      load();
    },
    onState: (streamState) => {
      if (watch !== state.watch) return;
      if (streamState === "live") setConn("live", "Live");
      else if (streamState === "reconnecting") setConn("reconnecting", "Reconnecting…");
    },
    onError: (problem) => {
      if (watch !== state.watch) return;
      state.watch = null;
      setConn("ended", "Stopped");
      notice(problem?.detail || "The job's stream stopped.");
    },
  });
  state.watch = watch;
}

if (!jobId) notice("No job id in the address: /jobs/{id}.");
else load();
