// Pressroom dashboard: the one way its pages call the API. Every page (the list, a job, the
// other views) sends its requests through api() and asks keyed() whether its streams need a
// token, so how the dashboard holds its credential is decided here alone.
//
// In keyed mode the first answer 401 opens a dialog that asks for the API key, once. The key
// is exchanged for a dashboard token (POST /v1/tokens {"scope": "dashboard"}) and forgotten:
// only the token is kept, in this tab's sessionStorage, so a reload keeps working. The token
// is renewed with itself before it expires, without asking again, until its session ends
// (PRESSROOM_DASHBOARD_SESSION_S after the key was given); then the dialog asks again.

const TOKEN_STORAGE = "pressroom.dashboardToken";
// Where an older dashboard kept the key itself, in localStorage: erased wherever it is found.
const OLD_KEY_STORAGE = "pressroom.apiKey";
// Renewed this long before it expires: 30 s, or a fifth of its life if shorter (as
// /pressroom.js renews its stream tokens), and never sooner than a second from now.
const RENEW_AHEAD_MAX_MS = 30_000;
const RENEW_AHEAD_SHARE = 0.2;
const RENEW_MIN_MS = 1_000;
const MAX_TIMER_MS = 2 ** 31 - 1;

export class ProblemError extends Error {
  constructor(problem) {
    super(problem.detail || problem.title || "Request failed");
    this.problem = problem;
  }
}

let held = readHeld(); // {token, expires_at, renewable_until} or null
let devMode = false; // the server answered a request that carried no credential
let exchanging = null; // an exchange or renewal in flight: requests wait for it
let asking = null; // the key dialog's promise while it is open
let renewTimer = null;

try {
  localStorage.removeItem(OLD_KEY_STORAGE);
} catch {
  // Storage disabled: nothing was kept there either.
}
scheduleRenewal();

/** The API key this browser holds: always "", as the key is never kept (see setKey). */
export function currentKey() {
  return "";
}

/** Exchange `key` for a dashboard token, kept instead of it ("" forgets the token); resolves
 * once done, rejects with a ProblemError when the key is refused. Requests made meanwhile wait
 * for it. */
export function setKey(key) {
  if (!key) {
    forget();
    return Promise.resolve();
  }
  return track(exchange(key));
}

/** Whether the dashboard holds a token (it may be renewed; streams then need their own). */
export function signedIn() {
  return held !== null;
}

/** Whether streams need a subscription token: unless the server is known to run open (dev
 * mode), asking one (POST /v1/tokens) is what brings up the key dialog when it is needed. */
export function keyed() {
  return held !== null || !devMode;
}

/** JSON request to the API (a FormData body is sent as multipart/form-data); resolves to the
 * parsed body (with `raw`, to the Response itself, for a file such as a preview's PDF), rejects
 * with a ProblemError. A 401 asks for the key (once, however many requests get one), then the
 * request is sent again with the new token. */
export async function api(path, { method = "GET", body, raw = false } = {}) {
  if (exchanging) await exchanging.catch(() => {});
  let sentWith = await freshToken();
  let response = await send(path, method, body, sentWith);
  if (response.status === 401) {
    if (held !== null && held.token === sentWith) forget(); // expired, revoked or rotated
    await askForKey();
    sentWith = held.token;
    response = await send(path, method, body, sentWith);
  }
  if (response.ok && sentWith === null) devMode = true;
  if (raw && response.ok) return response;
  const payload = await readJson(response);
  if (!response.ok) throw new ProblemError(toProblem(payload, response));
  return payload;
}

async function send(path, method, body, token) {
  const headers = { Accept: "application/json, application/problem+json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  // A FormData body: the browser writes its Content-Type, with the boundary.
  const multipart = body instanceof FormData;
  if (body !== undefined && !multipart) headers["Content-Type"] = "application/json";
  try {
    return await fetch(path, {
      method,
      headers,
      body: body === undefined || multipart ? body : JSON.stringify(body),
      cache: "no-store",
    });
  } catch {
    throw new ProblemError({ title: "Network error", detail: "The server could not be reached.", status: 0 });
  }
}

// ---------------------------------------------------------------- the token

function readHeld() {
  try {
    const kept = JSON.parse(sessionStorage.getItem(TOKEN_STORAGE) || "null");
    if (kept && typeof kept.token === "string" && Date.parse(kept.expires_at) > Date.now()) return kept;
    sessionStorage.removeItem(TOKEN_STORAGE);
  } catch {
    // Unreadable or storage disabled: no token.
  }
  return null;
}

function hold(answer) {
  held = { token: answer.token, expires_at: answer.expires_at, renewable_until: answer.renewable_until };
  try {
    sessionStorage.setItem(TOKEN_STORAGE, JSON.stringify(held));
  } catch {
    // Storage disabled (private mode): the token lasts as long as the page.
  }
  scheduleRenewal();
}

function forget() {
  held = null;
  clearTimeout(renewTimer);
  renewTimer = null;
  try {
    sessionStorage.removeItem(TOKEN_STORAGE);
  } catch {
    // Nothing was kept.
  }
}

function track(promise) {
  const tracked = promise.finally(() => {
    if (exchanging === tracked) exchanging = null;
  });
  exchanging = tracked;
  return tracked;
}

/** POST /v1/tokens {"scope": "dashboard"} with a key, or with the token to renew it. */
async function exchange(credential) {
  const response = await send("/v1/tokens", "POST", { scope: "dashboard" }, credential);
  const payload = await readJson(response);
  if (!response.ok) throw new ProblemError(toProblem(payload, response));
  hold(payload);
}

/** The token to send: the one held, renewed first if it is due (a timer may have slept). */
async function freshToken() {
  if (held !== null && renewDelayMs(held.token) <= RENEW_MIN_MS && !exchanging) await renew();
  return held === null ? null : held.token;
}

function renew() {
  const token = held?.token;
  if (!token) return Promise.resolve();
  return track(
    exchange(token).catch(() => {
      // Refused (its session ended, its key revoked) or unreachable: the token serves while
      // it lasts; the request it fails asks for the key.
      if (held !== null && held.token === token && Date.parse(held.expires_at) <= Date.now()) forget();
    }),
  );
}

function scheduleRenewal() {
  clearTimeout(renewTimer);
  renewTimer = null;
  if (held === null) return;
  const delayMs = Math.max(RENEW_MIN_MS, renewDelayMs(held.token));
  renewTimer = setTimeout(() => {
    renewTimer = null;
    renew();
  }, Math.min(delayMs, MAX_TIMER_MS));
}

/** How long until a token is due for renewal, by its own iat and exp. */
function renewDelayMs(token) {
  const claims = jwtClaims(token);
  if (typeof claims?.exp !== "number") return 0;
  const lifetimeMs = (claims.exp - (claims.iat ?? claims.exp)) * 1000;
  const aheadMs = Math.min(RENEW_AHEAD_MAX_MS, Math.max(0, lifetimeMs) * RENEW_AHEAD_SHARE);
  return claims.exp * 1000 - Date.now() - aheadMs;
}

function jwtClaims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), "=")));
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- the key dialog

/** Ask for the API key until one is exchanged; every request that got a 401 waits on it. */
function askForKey() {
  if (!asking) {
    asking = new Promise((resolve) => openDialog(resolve)).finally(() => {
      asking = null;
    });
  }
  return asking;
}

function openDialog(done) {
  addStyles();
  const dialog = document.createElement("dialog");
  dialog.className = "key-dialog";
  dialog.setAttribute("aria-labelledby", "key-dialog-title");
  dialog.setAttribute("aria-describedby", "key-dialog-text");
  dialog.innerHTML = `
    <form class="key-dialog-form">
      <h2 id="key-dialog-title">API key needed</h2>
      <p id="key-dialog-text">This server requires an API key. It is exchanged for a dashboard
        token that this tab keeps and renews; the key itself is not kept.</p>
      <label for="key-dialog-input">API key</label>
      <input id="key-dialog-input" name="key" type="password" autocomplete="off"
             spellcheck="false" required>
      <p class="key-dialog-error" id="key-dialog-error" role="alert"></p>
      <button type="submit">Continue</button>
    </form>`;
  document.body.append(dialog);
  const form = dialog.querySelector("form");
  const input = dialog.querySelector("input");
  const error = dialog.querySelector(".key-dialog-error");
  // Nothing on the page works without a key: Escape does not close it.
  dialog.addEventListener("cancel", (event) => event.preventDefault());
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    form.querySelector("button").disabled = true;
    error.textContent = "";
    try {
      await setKey(key);
    } catch (refused) {
      error.textContent = refused.problem?.detail || refused.message;
      form.querySelector("button").disabled = false;
      input.select();
      return;
    }
    input.value = "";
    dialog.close();
    dialog.remove();
    done();
  });
  dialog.showModal();
  input.focus();
}

function addStyles() {
  if (document.getElementById("key-dialog-styles")) return;
  const style = document.createElement("style");
  style.id = "key-dialog-styles";
  style.textContent = `
    .key-dialog { border: 1px solid var(--border, #d9dde4); border-radius: var(--radius, 8px);
      background: var(--panel, #fff); color: var(--text, #1c2230); padding: 1.25rem;
      width: min(28rem, calc(100vw - 2rem)); }
    .key-dialog::backdrop { background: rgb(0 0 0 / 45%); }
    .key-dialog-form { display: grid; gap: 0.6rem; }
    .key-dialog-form h2 { margin: 0; font-size: 1.15rem; }
    .key-dialog-form p { margin: 0; }
    .key-dialog-form label { font-weight: 600; }
    .key-dialog-form input { font: inherit; padding: 0.45rem 0.6rem; border-radius: 6px;
      border: 1px solid var(--muted, #5b6475); background: var(--bg, #f4f5f7); color: inherit; }
    .key-dialog-form button { justify-self: start; font: inherit; font-weight: 600;
      padding: 0.45rem 1rem; border-radius: 6px; border: 0; cursor: pointer;
      background: var(--accent, #1f4fd1); color: var(--accent-text, #fff); }
    .key-dialog-form :focus-visible { outline: 3px solid var(--focus, #1f4fd1); outline-offset: 2px; }
    .key-dialog-error { color: var(--danger, #b42318); min-height: 1.2em; }
    .key-dialog-error:empty { min-height: 0; }`;
  document.head.append(style);
}

// ---------------------------------------------------------------- answers

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
