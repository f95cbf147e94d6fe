// Pressroom dashboard: one job as a row of the list (its cells, its actions, its notices), and
// the small helpers the list and the submit form share.

export const STATUSES = ["queued", "running", "done", "failed", "cancelled"];
const NOTICE_MS = 6000;
const COPY_MS = 1500;

export const $ = (id) => document.getElementById(id);

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** A problem in one line, with the fields it names: what to change is in them. */
export function problemText(problem) {
  if (!problem) return "Something went wrong.";
  const text = problem.detail ? `${problem.title}: ${problem.detail}` : problem.title;
  const fields = (problem.errors ?? [])
    .filter((error) => error?.field)
    .map((error) => `${error.field}: ${error.message}`);
  return fields.length ? `${text} (${fields.join("; ")})` : text;
}

// ---------------------------------------------------------------- formatting

/** A short id that still tells jobs apart: time-ordered UUIDs (v1, v6, v7) share their prefix. */
export function shortId(id) {
  const text = String(id ?? "");
  const version = /^[0-9a-f]{8}-[0-9a-f]{4}-([0-9a-f])/i.exec(text)?.[1];
  return ["1", "6", "7"].includes(version) ? text.slice(-8) : text.slice(0, 8);
}

export function parseTime(value) {
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


/** A row for the job `id`; its Cancel and Retry buttons call `onAction(id, action, button)`. */
export function createEntry(id, onAction) {
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
  entry.cancel.addEventListener("click", () => onAction(id, "cancel", entry.cancel));
  entry.retry.addEventListener("click", () => onAction(id, "retry", entry.retry));
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

export function renderEntry(entry) {
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

export function flashNotice(entry, text) {
  clearTimeout(entry.noticeTimer);
  entry.notice.textContent = text;
  entry.noticeTimer = setTimeout(() => {
    entry.notice.textContent = "";
  }, NOTICE_MS);
}
