// Pressroom: the tenant's assets at /assets: each one's id, type, size and creation, and what
// uses it (the template versions whose assets map names it, the queued and running jobs), as
// GET /v1/assets tells, by its cursor.
import { api } from "/static/session.js";
import { $, el, link, notice, problemText, size, when } from "/static/views.js";

const PAGE = 50;
const state = { cursors: [null], page: 0 };

function cell(label, ...children) {
  const td = el("td");
  td.dataset.label = label;
  td.append(...children);
  return td;
}

function templatesCell(used) {
  if (!used.template_versions) return "—";
  const list = el("ul", "users template-users");
  for (const user of used.templates) {
    const item = el("li");
    const target = link(`/templates/${encodeURIComponent(user.name)}`, `${user.name}@${user.version}`);
    item.append(target, " as ", el("code", "", user.path));
    list.append(item);
  }
  const more = used.template_versions - used.templates.length;
  if (more > 0) list.append(el("li", "hint", `and ${more} more`));
  return list;
}

function jobsCell(used) {
  if (!used.jobs_in_flight) return "—";
  const list = el("ul", "users job-users");
  for (const job of used.jobs) {
    const item = el("li");
    const target = link(`/jobs/${encodeURIComponent(job.id)}`, job.id.slice(0, 8));
    target.setAttribute("aria-label", `Job ${job.id}`);
    item.append(target);
    list.append(item);
  }
  const more = used.jobs_in_flight - used.jobs.length;
  if (more > 0) list.append(el("li", "hint", `and ${more} more`));
  return list;
}

function assetRow(asset) {
  const row = el("tr", "asset");
  row.dataset.assetId = asset.id;
  // The id's first digits shown, the whole id read out and in the tooltip.
  const id = link(asset.links.content, asset.id.slice(0, 19), "asset-link");
  id.title = `Download ${asset.id}`;
  id.append(el("span", "visually-hidden", asset.id.slice(19)), el("span", "", "…"));
  id.lastChild.setAttribute("aria-hidden", "true");
  const used = asset.used_by;
  row.append(
    cell("Id", id),
    cell("Type", el("code", "", asset.content_type)),
    cell("Size", size(asset.size)),
    cell("Created", when(asset.created_at)),
    cell("Template versions", templatesCell(used)),
    cell("Jobs in flight", jobsCell(used)),
  );
  row.children[2].classList.add("num");
  row.dataset.templateVersions = String(used.template_versions);
  row.dataset.jobsInFlight = String(used.jobs_in_flight);
  return row;
}

async function load() {
  try {
    const query = new URLSearchParams({ limit: String(PAGE) });
    const cursor = state.cursors[state.page];
    if (cursor) query.set("cursor", cursor);
    const page = await api(`/v1/assets?${query}`);
    $("quota").textContent = `${size(page.total_bytes)} stored of ${size(page.quota_bytes)} allowed.`;
    $("assets").replaceChildren(...page.items.map(assetRow));
    $("assets-empty").hidden = page.items.length > 0;
    state.cursors[state.page + 1] = page.next_cursor;
    $("next-page").disabled = !page.next_cursor;
    $("first-page").disabled = state.page === 0;
    notice("");
  } catch (error) {
    notice(problemText(error, "assets"));
  }
  $("view").setAttribute("aria-busy", "false");
}

$("next-page").addEventListener("click", () => { state.page += 1; load(); });
$("first-page").addEventListener("click", () => { state.page = 0; load(); });
load();
