// Pressroom: stored templates at /templates (each one's latest version) and one template at
// /templates/{name}: its versions, the line-based difference between any two of them (HTML,
// options, sample data), and an editor whose preview pane shows the PDF POST
// /v1/templates/preview renders, half a second after the last keystroke; "Save as new version"
// stores what the editor holds with POST /v1/templates (a draft), and "Publish this version"
// publishes a draft, showing the diff its publishing found (changed pages side by side).
import { api } from "/static/session.js";
import { diffLines, drawDiff } from "/static/templates.diff.js";
import { $, el, link, notice, problemText, when } from "/static/views.js";

const PAGE = 50;
const PREVIEW_DELAY_MS = 500;

const parts = location.pathname.split("/").filter(Boolean);
const name = parts[1] ? decodeURIComponent(parts[1]) : null;
const state = {
  cursors: [null],
  page: 0,
  versions: [],          // summaries, newest first
  nextVersions: null,    // cursor of the older versions, when there are more
  full: new Map(),       // version -> the whole version (GET name@version)
  base: null,            // the version the editor started from
  timer: null,
  previewSeq: 0,
  previewUrl: null,
};

function json(value) {
  return JSON.stringify(value ?? {}, null, 2);
}

function cell(label, ...children) {
  const td = el("td");
  td.dataset.label = label;
  td.append(...children);
  return td;
}

// ------------------------------------------------------------------ the list

async function loadList() {
  try {
    const query = new URLSearchParams({ limit: String(PAGE) });
    const cursor = state.cursors[state.page];
    if (cursor) query.set("cursor", cursor);
    const page = await api(`/v1/templates?${query}`);
    $("templates").replaceChildren(...page.items.map((template) => {
      const row = el("tr", "template");
      row.dataset.name = template.name;
      row.append(
        cell("Name", link(`/templates/${encodeURIComponent(template.name)}`, template.name, "template-link")),
        cell("Latest version", String(template.version)),
        cell("Versions", String(template.versions)),
        cell("Stored", when(template.created_at)),
      );
      row.children[1].classList.add("num");
      row.children[2].classList.add("num");
      return row;
    }));
    $("templates-empty").hidden = page.items.length > 0;
    state.cursors[state.page + 1] = page.next_cursor;
    $("next-page").disabled = !page.next_cursor;
    $("first-page").disabled = state.page === 0;
    notice("");
  } catch (error) {
    notice(problemText(error, "templates"));
  }
  $("view").setAttribute("aria-busy", "false");
}

function showList() {
  $("list-view").hidden = false;
  $("next-page").addEventListener("click", () => { state.page += 1; loadList(); });
  $("first-page").addEventListener("click", () => { state.page = 0; loadList(); });
  loadList();
}

// ------------------------------------------------------------------ versions

async function version(number) {
  if (!state.full.has(number)) {
    state.full.set(number, await api(`/v1/templates/${encodeURIComponent(`${name}@${number}`)}`));
  }
  return state.full.get(number);
}

async function loadVersions({ more = false } = {}) {
  const query = new URLSearchParams({ limit: String(PAGE) });
  if (more && state.nextVersions) query.set("cursor", state.nextVersions);
  const page = await api(`/v1/templates/${encodeURIComponent(name)}/versions?${query}`);
  state.versions = more ? [...state.versions, ...page.items] : page.items;
  state.nextVersions = page.next_cursor;
  renderVersions();
  fillDiffChoices();
}

function renderVersions() {
  $("template-name").textContent = name;
  document.title = `${name} · Templates · Pressroom`;
  $("versions").replaceChildren(...state.versions.map((summary) => {
    const row = el("tr", "version");
    row.dataset.version = String(summary.version);
    row.dataset.kind = summary.kind;
    if (state.base?.version === summary.version) row.setAttribute("aria-current", "true");
    const edit = el("button", "secondary edit-version", summary.kind === "docx" ? "Show" : "Edit");
    edit.type = "button";
    edit.setAttribute("aria-label", `${summary.kind === "docx" ? "Show" : "Edit"} version ${summary.version}`);
    edit.addEventListener("click", () => startEditing(summary.version));
    row.append(
      cell("Version", String(summary.version)),
      cell("Kind", el("span", "kind", summary.kind === "docx" ? "DOCX" : "HTML"),
        ...(summary.status ? [" ", el("span", `kind status-${summary.status}`, summary.status)] : [])),
      cell("Stored", when(summary.created_at)),
      cell("Template id", el("code", "", summary.template_id)),
      cell("", edit),
    );
    row.children[0].classList.add("num");
    return row;
  }));
  $("older-versions").hidden = !state.nextVersions;
}

// ------------------------------------------------------------------ differences

function fillDiffChoices() {
  const from = $("diff-from");
  const to = $("diff-to");
  const keep = [from.value, to.value];
  for (const select of [from, to]) {
    select.replaceChildren(...state.versions.map((summary) => {
      const option = el("option", "", `${summary.version}${summary.kind === "docx" ? " (DOCX)" : ""}`);
      option.value = String(summary.version);
      return option;
    }));
  }
  const newest = state.versions[0]?.version;
  const before = state.versions[1]?.version ?? newest;
  from.value = keep[0] && from.querySelector(`option[value="${keep[0]}"]`) ? keep[0] : String(before ?? "");
  to.value = keep[1] && to.querySelector(`option[value="${keep[1]}"]`) ? keep[1] : String(newest ?? "");
  showDiff();
}

async function showDiff() {
  const box = $("diff");
  const a = Number($("diff-from").value);
  const b = Number($("diff-to").value);
  if (!a || !b) {
    box.replaceChildren(el("p", "hint", "No versions."));
    return;
  }
  let older;
  let newer;
  try {
    [older, newer] = await Promise.all([version(a), version(b)]);
  } catch (error) {
    box.replaceChildren(el("p", "error-text", problemText(error, "such version")));
    return;
  }
  if (Number($("diff-from").value) !== a || Number($("diff-to").value) !== b) return; // changed meanwhile
  const shown = [];
  const sections = [
    ["HTML", older.html ?? (older.docx ? `(Word template ${older.docx})` : ""), newer.html ?? (newer.docx ? `(Word template ${newer.docx})` : "")],
    ["Options", json(older.options), json(newer.options)],
    ["Sample data", json(older.sample_data), json(newer.sample_data)],
    ["Assets", json(older.assets), json(newer.assets)],
  ];
  for (const [title, before, after] of sections) {
    const part = el("div", "diff-section");
    part.dataset.part = title.toLowerCase().replace(" ", "-");
    const lines = diffLines(before, after);
    const added = lines.filter((line) => line.op === "added").length;
    const removed = lines.filter((line) => line.op === "removed").length;
    part.append(el("h3", "diff-part", `${title}: ${added || removed ? `+${added} −${removed}` : "the same"}`));
    if (added || removed) part.append(drawDiff(lines, `${title}, version ${a} to ${b}`));
    shown.push(part);
  }
  box.replaceChildren(...shown);
}

// ------------------------------------------------------------------ the editor

async function startEditing(number) {
  let base;
  try {
    base = await version(number);
  } catch (error) {
    notice(problemText(error, `version ${number}`));
    return;
  }
  state.base = base;
  renderVersions();
  const docx = base.kind === "docx" || base.html === null || base.html === undefined;
  $("editor-base").textContent = `From version ${base.version}; saving stores version ${(state.versions[0]?.version ?? 0) + 1}.`;
  $("editor").hidden = docx;
  $("docx-note").hidden = !docx;
  if (docx) {
    $("docx-note").textContent = `Version ${base.version} is a Word template (DOCX, asset ${base.docx}): edit it in Word, upload it as an asset and store it as a new version. Its sample data: ${JSON.stringify(base.sample_data)}`;
    return;
  }
  showPublishing(base);
  $("edit-html").value = base.html;
  fillSamples(base);
  fieldError("html", "");
  fieldError("data", "");
  $("save-status").textContent = "";
  preview();
}

/** The data sets a version previews with: its sample_data, then each of its named samples. */
function fillSamples(base) {
  const samples = Object.keys(base.samples || {});
  $("edit-sample").replaceChildren(
    new Option("sample_data", ""),
    ...samples.map((sample) => new Option(`sample: ${sample}`, sample)),
  );
  $("edit-sample-field").hidden = samples.length === 0;
  $("edit-data").value = json(base.sample_data);
}

/** Another data set chosen: its data in the field, previewed. */
function chooseSample() {
  const sample = $("edit-sample").value;
  const base = state.base || {};
  $("edit-data").value = json(sample ? base.samples[sample] : base.sample_data);
  preview();
}

function fieldError(field, text) {
  const node = $(`edit-${field}-error`);
  node.textContent = text || "";
  node.hidden = !text;
  $(`edit-${field}`).setAttribute("aria-invalid", text ? "true" : "false");
}

/** The editor's fields as a body, or null (and the error shown) when the data is no JSON object. */
function edited() {
  let data;
  try {
    data = JSON.parse($("edit-data").value || "{}");
  } catch (error) {
    fieldError("data", `Not JSON: ${error.message}`);
    return null;
  }
  if (data === null || typeof data !== "object" || Array.isArray(data)) {
    fieldError("data", "The sample data must be a JSON object, such as {\"customer\": \"Ana\"}.");
    return null;
  }
  fieldError("data", "");
  return { html: $("edit-html").value, data };
}

/** Where a 422 belongs: the field its errors name (html, data), else the HTML (a template error). */
function showProblem(problem) {
  const byField = { html: [], data: [] };
  for (const error of problem.errors || []) {
    const field = String(error.field || "");
    const target = /^(data|sample_data|samples)/.test(field) ? "data" : "html";
    byField[target].push(field && field !== "html" && target === "html" ? `${field}: ${error.message}` : error.message);
  }
  if (!byField.html.length && !byField.data.length) byField.html.push(problem.detail || problem.title);
  fieldError("html", byField.html.join(" "));
  fieldError("data", byField.data.join(" "));
}

function schedulePreview() {
  clearTimeout(state.timer);
  state.timer = setTimeout(preview, PREVIEW_DELAY_MS);
}

async function preview() {
  clearTimeout(state.timer);
  const body = edited();
  if (!body || !state.base) return;
  const seq = ++state.previewSeq;
  const pane = $("preview");
  pane.dataset.state = "rendering";
  $("preview-status").textContent = "Rendering…";
  const started = performance.now();
  try {
    const response = await api("/v1/templates/preview", {
      method: "POST",
      body: { ...body, options: state.base.options, assets: state.base.assets },
      raw: true,
    });
    const pages = response.headers.get("Pressroom-Pages");
    const blob = await response.blob();
    if (seq !== state.previewSeq) return; // a newer preview is on its way
    fieldError("html", "");
    if (state.previewUrl) URL.revokeObjectURL(state.previewUrl);
    state.previewUrl = URL.createObjectURL(new Blob([blob], { type: "application/pdf" }));
    $("preview-frame").src = state.previewUrl;
    $("preview-open").href = state.previewUrl;
    $("preview-open").hidden = false;
    pane.dataset.state = "shown";
    pane.dataset.seq = String(seq);
    const took = Math.round(performance.now() - started);
    $("preview-status").textContent = `${pages ?? "?"} page${pages === "1" ? "" : "s"}, ${blob.size} bytes, rendered in ${took} ms.`;
  } catch (error) {
    if (seq !== state.previewSeq) return;
    pane.dataset.state = "error";
    const problem = error.problem || { title: error.message };
    if (problem.status === 422) {
      showProblem(problem);
      $("preview-status").textContent = "Not rendered: see the error beside the field.";
    } else {
      $("preview-status").textContent = `Not rendered: ${problem.detail || problem.title}`;
    }
  }
}

async function save(event) {
  event.preventDefault();
  const body = edited();
  if (!body || !state.base) return;
  $("save").disabled = true;
  $("save-status").textContent = "Saving…";
  try {
    // The data in the field is the data set it was chosen as; the version keeps its contract.
    const sample = $("edit-sample").value;
    const samples = { ...(state.base.samples || {}) };
    if (sample) samples[sample] = body.data;
    const stored = await api("/v1/templates", {
      method: "POST",
      body: {
        name,
        html: body.html,
        sample_data: sample ? state.base.sample_data : body.data,
        samples,
        data_schema: state.base.data_schema ?? null,
        options: state.base.options,
        assets: state.base.assets,
      },
    });
    state.full.set(stored.version, stored);
    state.base = stored;
    await loadVersions();
    $("save-status").textContent = `Saved as version ${stored.version}.`;
    $("editor-base").textContent = `From version ${stored.version}; saving stores version ${stored.version + 1}.`;
    renderVersions();
  } catch (error) {
    const problem = error.problem || { title: error.message };
    $("save-status").textContent = "Not saved.";
    if (problem.status === 422) showProblem(problem);
    else notice(problem.detail || problem.title);
  } finally {
    $("save").disabled = false;
  }
}

// ------------------------------------------------------------------ publishing

/** Where a version stands, its Publish button (a draft's), and the diff its last publishing kept. */
async function showPublishing(base) {
  const draft = base.status === "draft";
  $("publish-state").textContent = draft
    ? `Version ${base.version} is a draft: jobs naming ${name} get it once it is published.`
    : `Version ${base.version} is published.`;
  $("publish-form").hidden = !draft;
  $("publish-diff").replaceChildren();
  try {
    drawPublishing(await api(`${base.links.diff}`));
  } catch (error) {
    if (error.problem?.status !== 404) notice(problemText(error, "the diff"));
  }
}

/** A diff: what refused it, then per sample its pages and each changed page, side by side. */
function drawPublishing(diff) {
  const pane = $("publish-diff");
  const head = diff.against === null
    ? "Nothing to compare with (the first version published): each sample rendered."
    : `Compared with version ${diff.against}${diff.forced ? ", published by force" : ""}.`;
  const parts = [el("p", "hint", head)];
  if (diff.refused.length) {
    const refused = el("ul", "refused");
    refused.append(...diff.refused.map((reason) => el("li", "", reason)));
    parts.push(refused);
  }
  for (const sample of diff.samples) {
    const section = el("section", "publish-sample");
    section.dataset.sample = sample.sample;
    const pages = sample.error
      ? `does not render: ${sample.error}`
      : `${sample.pages_before ?? "–"} → ${sample.pages_after} page(s), ${sample.pages.length} changed`;
    section.append(el("h3", "diff-part", `Sample ${sample.sample}: ${pages}`));
    for (const page of sample.pages) {
      const share = (page.changed_pixels * 100).toFixed(2);
      const figure = el("figure", "publish-page");
      const caption = el("figcaption", "", `Page ${page.page}: ${share} % of its pixels changed`);
      const lines = [
        ...page.text_removed.map((line) => el("li", "line-removed", `− ${line}`)),
        ...page.text_added.map((line) => el("li", "line-added", `+ ${line}`)),
      ];
      figure.append(caption);
      if (lines.length) {
        const changed = el("ul", "diff");
        changed.append(...lines);
        figure.append(changed);
      }
      if (page.image) {
        const image = el("img");
        image.alt = `Page ${page.page} of sample ${sample.sample}: published (left) and this version (right), changes in red`;
        image.style.maxWidth = "100%";
        api(page.image, { raw: true })
          .then((response) => response.blob())
          .then((blob) => { image.src = URL.createObjectURL(blob); })
          .catch(() => { image.alt += " (not loaded)"; });
        figure.append(image);
      }
      section.append(figure);
    }
    parts.push(section);
  }
  pane.replaceChildren(...parts);
}

async function publish(event) {
  event.preventDefault();
  const base = state.base;
  if (!base) return;
  $("publish").disabled = true;
  $("publish-state").textContent = "Rendering its samples with it and with the published version…";
  try {
    const published = await api(base.links.publish, {
      method: "POST",
      body: { force: $("publish-force").checked },
    });
    state.full.set(published.version, published);
    state.base = published;
    await loadVersions();
    renderVersions();
    $("publish-state").textContent = `Version ${published.version} is published.`;
    $("publish-form").hidden = true;
    drawPublishing(published.diff);
  } catch (error) {
    const problem = error.problem || { title: error.message };
    $("publish-state").textContent = problem.detail || problem.title;
    // Refused: the diff it kept says what changed.
    if (problem.status === 409) drawPublishing(await api(base.links.diff).catch(() => null) ?? { against: null, refused: [], samples: [] });
  } finally {
    $("publish").disabled = false;
  }
}

async function showTemplate() {
  try {
    await loadVersions();
    $("template-view").hidden = false;
    notice("");
    const latest = state.versions[0];
    if (latest) await startEditing(latest.version);
  } catch (error) {
    notice(problemText(error, `template ${name}`));
  }
  $("view").setAttribute("aria-busy", "false");
}

if (name) {
  $("diff-from").addEventListener("change", showDiff);
  $("diff-to").addEventListener("change", showDiff);
  $("edit-html").addEventListener("input", schedulePreview);
  $("edit-data").addEventListener("input", schedulePreview);
  $("edit-sample").addEventListener("change", chooseSample);
  $("publish-form").addEventListener("submit", publish);
  $("editor-form").addEventListener("submit", save);
  $("older-versions").addEventListener("click", () => loadVersions({ more: true }));
  showTemplate();
} else {
  showList();
}
