// Pressroom dashboard: the one way its pages call the API. Every page (the list, a job, the
// other views) sends its requests through api() and asks keyed() whether its streams need a
// token, so how the dashboard holds its credential is decided here alone.

const KEY_STORAGE = "pressroom.apiKey";

export class ProblemError extends Error {
  constructor(problem) {
    super(problem.detail || problem.title || "Request failed");
    this.problem = problem;
  }
}

/** The API key this browser holds ("" in dev mode). */
export function currentKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

/** Hold `key` ("" forgets it). */
export function setKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    // Storage disabled (private mode): the key simply does not persist.
  }
}

/** Whether requests carry a credential (so streams need a subscription token). */
export function keyed() {
  return Boolean(currentKey());
}

/** JSON request to the API (a FormData body is sent as multipart/form-data); resolves to the
 * parsed body (with `raw`, to the Response itself, for a file such as a preview's PDF), rejects
 * with a ProblemError. */
export async function api(path, { method = "GET", body, raw = false } = {}) {
  const headers = { Accept: "application/json, application/problem+json" };
  const key = currentKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  // A FormData body: the browser writes its Content-Type, with the boundary.
  const multipart = body instanceof FormData;
  if (body !== undefined && !multipart) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined || multipart ? body : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ProblemError({ title: "Network error", detail: "The server could not be reached.", status: 0 });
  }
  if (raw && response.ok) return response;
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
