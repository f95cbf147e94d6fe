// Pressroom dashboard: the submit form. One source of seven (inline HTML, a stored template,
// Markdown, a page URL, an Office file, a Word template, PDFs to merge), its data, the options
// that matter and any other as JSON (finishing: select_pages, rotate, fill_form, flatten,
// metadata, compress, …); files go as a multipart body (a `job` part with the JSON, file parts
// named as POST /v1/jobs reads them); a problem's field errors are shown beside the fields they
// name.
import { api } from "/static/session.js";
import { $, el, shortId } from "/static/rows.js";

// GET /v1/templates pages read for the select (200 names each).
const TEMPLATE_PAGES = 5;
const TEMPLATE_PAGE_LIMIT = 200;
// A phone: the list first, the form folded (one tap away, from "+ New job").
const NARROW = "(max-width: 860px)";
const CHECK_DATA_AFTER_MS = 400;

// The field a problem names → the input beside which its message goes. Deeper paths
// ("data.items.0", "options.thumbnail.width") go to the input of their first parts.
const FIELD_INPUTS = {
  template: "template",
  "index.html": "template",
  "index.md": "markdown",
  template_id: "template-id",
  markdown: "markdown",
  page_url: "page-url",
  office: "office",
  docx: "docx",
  pdfs: "pdfs",
  data: "data",
  // An option the form has no control of its own for is one the JSON field gave.
  options: "options-json",
  "options.format": "format",
  "options.landscape": "landscape",
  "options.print_background": "print-background",
  "options.thumbnail": "thumbnail",
  priority: "priority",
  channel: "job-channel",
};
// The sources sent as files: the part each file goes in (pdfs: a part per file, by its name).
const FILE_SOURCES = new Set(["office", "docx", "pdfs"]);
const TEXT_SOURCES = new Set(["template", "markdown"]);

let onCreated = () => {};
let files = new Map(); // the part name a file was sent under → the input it came from

function source() {
  return document.querySelector("#job-form input[name=source]:checked")?.value ?? "template";
}

/** Show the chosen source's field, and the data and options that apply to it. */
function showSource() {
  const chosen = source();
  for (const node of document.querySelectorAll("#job-form [data-source]")) {
    node.hidden = node.dataset.source !== chosen;
  }
  for (const node of document.querySelectorAll("#job-form [data-for]")) {
    node.hidden = !node.dataset.for.split(" ").includes(chosen);
  }
  clearProblem();
  if (chosen === "template_id") loadTemplates();
}

// ---------------------------------------------------------------- stored templates

/** Fill the select from GET /v1/templates: each name (its latest version), then each version. */
async function loadTemplates() {
  const select = $("template-id");
  const kept = select.value;
  const items = [];
  try {
    let cursor = "";
    for (let page = 0; page < TEMPLATE_PAGES; page += 1) {
      const params = new URLSearchParams({ limit: String(TEMPLATE_PAGE_LIMIT) });
      if (cursor) params.set("cursor", cursor);
      const answer = await api(`/v1/templates?${params}`);
      items.push(...(answer?.items ?? []));
      cursor = answer?.next_cursor ?? "";
      if (!cursor) break;
    }
  } catch (error) {
    select.replaceChildren(new Option("Could not read the templates", ""));
    setFieldError("template-id", error.problem?.detail || error.problem?.title || String(error));
    return;
  }
  if (items.length === 0) {
    select.replaceChildren(new Option("No stored templates yet (see Templates)", ""));
    return;
  }
  const groups = items.map((item) => {
    const group = el("optgroup");
    group.label = item.name;
    // The name alone is its latest published version (none: a draft is named by its version).
    if (item.published != null) {
      group.append(new Option(`${item.name} (published: ${item.published})`, item.name));
    }
    const listed = item.versions > 1 || item.published == null; // a lone draft by its version
    for (let version = item.version; listed && version >= 1; version -= 1) {
      group.append(new Option(`${item.name}@${version}`, `${item.name}@${version}`));
    }
    return group;
  });
  select.replaceChildren(new Option("Choose a template…", ""), ...groups);
  if (kept && Array.from(select.options).some((option) => option.value === kept)) select.value = kept;
}

// ---------------------------------------------------------------- field errors

/** Put `message` beside an input ("" clears it); a hidden input's goes to the options'. */
function setFieldError(inputId, message) {
  const input = $(inputId);
  let box = $(`${inputId}-error`);
  if (!box) return;
  if (message && (input?.closest("[hidden]") || box.closest("[hidden]:not(.field-error)"))) {
    box = $("options-error");
  }
  if (input && input.tagName !== "FIELDSET") {
    if (message) input.setAttribute("aria-invalid", "true");
    else input.removeAttribute("aria-invalid");
  }
  box.textContent = message;
  box.hidden = !message;
}

function clearFieldErrors() {
  for (const box of document.querySelectorAll("#job-form .field-error")) {
    box.textContent = "";
    box.hidden = true;
  }
  for (const input of document.querySelectorAll("#job-form [aria-invalid]")) {
    input.removeAttribute("aria-invalid");
  }
}

/** A problem's field name as a dotted path: "/options/format", "body.data[0]" → "options.format",
 * "data.0"; a multipart body's "job.options" is the job's "options". */
function fieldPath(field) {
  return String(field ?? "")
    .replace(/^\/+/, "")
    .replace(/^body[./]/, "")
    .replace(/\[(\d+)\]/g, ".$1")
    .replaceAll("/", ".")
    .replace(/^job\./, "");
}

/** Which input a field path points at: its own, its first parts', or the file input a file
 * name (or assets.NAME) came from; null for a field the form has no input for. */
function inputForField(path) {
  if (FIELD_INPUTS[path]) return FIELD_INPUTS[path];
  const name = path.replace(/^assets\./, "");
  if (files.has(name)) return files.get(name);
  const parts = path.split(".");
  for (let n = parts.length - 1; n >= 1; n -= 1) {
    const input = FIELD_INPUTS[parts.slice(0, n).join(".")];
    if (input) return input;
  }
  return null;
}

/** Put a field error beside its input; a deeper path ("data.items.0") is named in the text. */
function markField(field, message) {
  const path = fieldPath(field);
  const input = inputForField(path);
  if (!input) return;
  setFieldError(input, FIELD_INPUTS[path] === input ? message : `${path}: ${message}`);
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
  const first = document.querySelector("#job-form .field-error:not([hidden])") ?? box;
  first.scrollIntoView({ block: "nearest" });
}

function clearProblem() {
  $("form-problem").hidden = true;
  clearFieldErrors();
}

// ---------------------------------------------------------------- reading the form

/** The data textarea as an object, or undefined after showing why it is not one. */
const readData = () => readObject("data", "Data", '{"name": "Ada"}');

/** The JSON object typed in field `id` ({} when empty), or undefined after showing why it is
 * not one (`example`: an object the message shows). */
function readObject(id, what, example) {
  const text = $(id).value.trim();
  let value;
  try {
    value = JSON.parse(text || "{}");
  } catch (error) {
    setFieldError(id, `Invalid JSON: ${error.message}`);
    return undefined;
  }
  if (!value || typeof value !== "object" || Array.isArray(value)) {
    setFieldError(id, `${what} must be a JSON object, for example ${example}.`);
    return undefined;
  }
  setFieldError(id, "");
  return value;
}

function readPriority() {
  const text = $("priority").value.trim();
  const value = text === "" ? 0 : Number(text);
  if (!Number.isInteger(value)) {
    setFieldError("priority", "Priority must be a whole number.");
    return undefined;
  }
  return value;
}

/** The source's value (text, a template name, a URL, or the chosen files), or undefined after
 * saying what is missing. */
function readSource(chosen) {
  const missing = {
    template: ["template", "The template is empty."],
    template_id: ["template-id", "Choose a stored template (store one under Templates)."],
    markdown: ["markdown", "The Markdown is empty."],
    page_url: ["page-url", "Give the address of the page to print."],
    office: ["office", "Choose an Office file."],
    docx: ["docx", "Choose a Word template (.docx)."],
    pdfs: ["pdfs", "Choose the PDFs to merge."],
  }[chosen];
  const input = $(missing[0]);
  const value = FILE_SOURCES.has(chosen) ? Array.from(input.files ?? []) : input.value;
  const empty = Array.isArray(value) ? value.length === 0 : !value.trim();
  if (empty) {
    setFieldError(missing[0], missing[1]);
    return undefined;
  }
  // Text is sent as typed; a name, a URL as given but for the spaces around it.
  return typeof value === "string" && !TEXT_SOURCES.has(chosen) ? value.trim() : value;
}

/** The options the form sets for this source (only those that differ from the defaults, so a
 * stored template's own options stand unless the form changes them). */
function readOptions() {
  const options = {};
  const applies = (id) => !$(id).closest("[data-for]")?.hidden;
  if (applies("format") && $("format").value) options.format = $("format").value;
  if (applies("landscape") && $("landscape").checked) options.landscape = true;
  if (applies("print-background") && !$("print-background").checked) options.print_background = false;
  if ($("thumbnail").checked) options.thumbnail = { width: 200 };
  return Object.keys(options).length ? options : undefined;
}

/** A file's name as a part of the body (an asset path: no \ ? # % : and no leading dot), not
 * one of `taken`. */
function partName(file, taken) {
  const base = file.name.replace(/[\\/?#%:\u0000-\u001f\u007f]/g, "-").replace(/^\.+/, "") || "file";
  let name = base;
  for (let n = 2; taken.has(name); n += 1) name = base.replace(/(\.[^.]*)?$/, ` (${n})$1`);
  return name;
}

/** The request's body: JSON, or a FormData of the job part and its files. */
function requestBody(chosen, value, job) {
  files = new Map();
  if (!FILE_SOURCES.has(chosen)) return { [chosen]: value, ...job };
  const form = new FormData();
  const parts = [];
  for (const file of value) {
    const name = partName(file, files);
    files.set(name, chosen);
    parts.push([chosen === "pdfs" ? name : chosen, file, name]);
  }
  const body = chosen === "pdfs" ? { ...job, pdfs: parts.map(([, , name]) => name) } : job;
  form.append("job", new Blob([JSON.stringify(body)], { type: "application/json" }), "job.json");
  for (const [part, file, name] of parts) form.append(part, file, name);
  return form;
}

// ---------------------------------------------------------------- submitting

async function submitJob(event) {
  event.preventDefault();
  clearProblem();
  const chosen = source();
  const value = readSource(chosen);
  const usesData = !$("data").closest("[data-for]").hidden;
  const data = usesData ? readData() : {};
  const priority = readPriority();
  const moreOptions = readObject("options-json", "Options", '{"compress": {}}');
  const firstInvalid = document.querySelector("#job-form [aria-invalid='true']");
  if (firstInvalid || value === undefined || data === undefined || moreOptions === undefined) {
    (firstInvalid ?? document.querySelector("#job-form .field-error:not([hidden])"))?.focus?.();
    return;
  }
  const job = { priority };
  if (usesData) job.data = data;
  const options = { ...readOptions(), ...moreOptions };
  if (Object.keys(options).length) job.options = options;
  const channel = $("job-channel").value.trim();
  if (channel) job.channel = channel;
  const button = $("submit");
  const status = $("form-status");
  button.disabled = true;
  status.textContent = "Submitting…";
  try {
    const created = await api("/v1/jobs", { method: "POST", body: requestBody(chosen, value, job) });
    status.replaceChildren();
    if (created?.id) {
      const link = el("a", "", shortId(created.id));
      link.href = `/jobs/${encodeURIComponent(created.id)}`;
      status.append("Job ", link, ` ${created.status || "queued"}.`);
    } else {
      status.textContent = "Submitted.";
    }
    onCreated(created);
  } catch (error) {
    status.textContent = "";
    showProblem(error.problem ?? { title: "Submit failed", detail: String(error), errors: [] });
  } finally {
    button.disabled = false;
  }
}

function showPdfOrder() {
  const chosen = Array.from($("pdfs").files ?? []);
  $("pdfs-order").replaceChildren(...chosen.map((file) => el("li", "", file.name)));
}

/** On a phone the form starts folded; "+ New job" unfolds it and takes you there. */
function setupFold() {
  const box = $("new-job");
  if (window.matchMedia(NARROW).matches) box.open = false;
  $("new-job-link").addEventListener("click", (event) => {
    event.preventDefault();
    box.open = true;
    box.scrollIntoView({ block: "start" });
    document.querySelector("#job-form input[name=source]:checked")?.focus({ preventScroll: true });
  });
}

/** Wire the form; `created(job)` is told of each job it submits. */
export function startForm(created) {
  onCreated = created;
  setupFold();
  const form = $("job-form");
  form.addEventListener("submit", submitJob);
  for (const radio of form.querySelectorAll("input[name=source]")) {
    radio.addEventListener("change", showSource);
  }
  $("pdfs").addEventListener("change", showPdfOrder);
  for (const id of ["template-id", "page-url", "office", "docx", "pdfs", "template", "markdown",
    "options-json"]) {
    $(id).addEventListener("input", () => setFieldError(id, ""));
  }
  let timer = null;
  // Check the JSON as it is typed, but only once typing pauses.
  $("data").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(readData, CHECK_DATA_AFTER_MS);
  });
  showSource();
}
