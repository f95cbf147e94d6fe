// Pressroom dashboard: what the batches, templates and assets pages share (their header's
// connection badge, the notice, formatting). Requests go through session.js alone.
import { api } from "/static/session.js";

export const $ = (id) => document.getElementById(id);

/** An element with a class and a text (text set as text, never as HTML). */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/** A link with a text. */
export function link(href, text, className) {
  const node = el("a", className, text);
  node.href = href;
  return node;
}

export function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

export function setConn(kind, text) {
  $("conn").dataset.state = kind;
  $("conn").querySelector(".conn-text").textContent = text;
}

/** A date and time in this browser's zone, in a <time> element. */
export function when(iso) {
  const node = el("time", "when");
  if (!iso) {
    node.textContent = "—";
    return node;
  }
  const at = new Date(iso);
  node.dateTime = iso;
  node.textContent = Number.isNaN(at.getTime()) ? String(iso) : at.toLocaleString();
  return node;
}

export function size(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  if (bytes < 1024 ** 3) return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
  return `${(bytes / 1024 ** 3).toFixed(1)} GiB`;
}

/** What to tell for a refused read: an unknown object, a missing key, or the problem itself. */
export function problemText(error, what) {
  const status = error.problem?.status;
  if (status === 404) return `No ${what} (or it is another tenant's).`;
  if (status === 401) return "This server needs an API key: reload the page to give it.";
  return error.problem?.detail || error.message;
}

/** A subscription token for the tenant's streams (a key cannot go in a stream's URL). */
export async function tenantToken() {
  const answer = await api("/v1/tokens", { method: "POST", body: {} });
  return answer.token;
}

/** Call `fn` at most once at a time; calls meanwhile are folded into one more call after it. */
export function folded(fn) {
  let running = null;
  let again = false;
  return async function run() {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        await fn();
      } while (again);
    })();
    try {
      await running;
    } finally {
      running = null;
    }
    return undefined;
  };
}
