// Pressroom in the browser: follow a job or a channel live, from any origin the server allows.
// EventSource with resume by event id, the end of a job's stream, token renewal through the
// app's getToken, and a long-poll for where streams cannot pass. No dependencies, no build.
//
//   import { watchJob, watchChannel } from "https://pdf.example.com/pressroom.js";
//
// The rules this follows (cursors, 204, `reset`, `closed` codes) are in docs/streams.md.

const EVENT_TYPES = [
  "job.queued", "job.running", "job.progress", "job.retrying",
  "job.done", "job.failed", "job.cancelled", "batch.progress", "batch.done",
];
// The events after which a job's stream ends (server/events/streams.py FINAL_TYPES).
const FINAL_TYPES = new Set(["job.done", "job.failed", "job.cancelled"]);
const FINAL_STATUSES = new Set(["done", "failed", "cancelled"]);

// A token is renewed this long before it expires: 30 s, or a fifth of its life if shorter.
const RENEW_AHEAD_MAX_MS = 30_000;
const RENEW_AHEAD_SHARE = 0.2;
// Never sooner than this after the last renewal, whatever a token claims: no tight loop.
const RENEW_MIN_MS = 1_000;
// A page whose clock is further than this from the token's `iat` times renewals without it.
const CLOCK_TRUSTED_S = 10;
const MAX_TIMER_MS = 2 ** 31 - 1;
const BACKOFF_MIN_MS = 1_000;
const BACKOFF_MAX_MS = 30_000;
// A stream neither open nor failed after this long is held back on its way (a buffering
// proxy): the long-poll takes over if the API still answers.
const OPEN_TIMEOUT_MS = 10_000;
const POLL_WAIT_S = 25;
// Ids remembered to drop the events a reconnect or renewal replays; they only ever overlap
// by the few events in flight at the switch.
const SEEN_MAX = 1_000;

/** Follow one job until its final event; see pressroom.d.ts for the options. */
export function watchJob(baseUrl, jobId, options = {}) {
  if (!jobId) throw new TypeError("watchJob needs a job id");
  return new Watch(baseUrl, String(jobId), null, options);
}

/** Follow a channel's events (`null`: every job of the tenant) until `close()`. */
export function watchChannel(baseUrl, channel, options = {}) {
  return new Watch(baseUrl, null, channel || null, options);
}

class Watch {
  #base;
  #jobId;
  #channel;
  #options;
  #mode;
  #state = "connecting";
  #closed = false;
  #abort = new AbortController();
  #token;
  #tokenFresh = false; // got from getToken and not yet accepted by the server
  #tokenPending = null;
  #renewTimer = null;
  #cursor;
  #seen = new Set();
  #source = null;
  #sourceFailed = false; // the browser reported an error since it opened this source
  #failures = 0;
  #etag = null;
  #lastJob = null;

  constructor(baseUrl, jobId, channel, options) {
    this.#base = String(baseUrl ?? "").replace(/\/+$/, "");
    this.#jobId = jobId;
    this.#channel = channel;
    this.#options = options;
    this.#token = options.token || null;
    const cursor = options.lastEventId;
    this.#cursor = cursor === null || cursor === undefined || cursor === "" ? null : String(cursor);
    // EventSource cannot send headers: an API key (server-side use) goes by the long-poll.
    const noStream = typeof EventSource === "undefined" || Boolean(options.apiKey);
    this.#mode = noStream || options.transport === "longpoll" ? "longpoll" : "eventsource";
    // Started on the next turn, so that the caller holds the handle before any callback.
    queueMicrotask(() => this.#start());
  }

  /** The id of the last event handled: pass it as `lastEventId` to resume elsewhere. */
  get lastEventId() {
    return this.#cursor;
  }

  /** "eventsource", or "longpoll" once the stream could not be used. */
  get transport() {
    return this.#mode;
  }

  get state() {
    return this.#state;
  }

  /** Stop: the stream, every timer and every request in flight. */
  close() {
    if (this.#closed) return;
    this.#stop();
    this.#setState("closed");
  }

  // ------------------------------------------------------------------ start and end

  async #start() {
    if (this.#closed) return;
    if (this.#token === null && this.#options.getToken) {
      if (!(await this.#newToken())) return;
    } else {
      this.#scheduleRenewal();
    }
    this.#connect();
  }

  #connect() {
    if (this.#closed) return;
    if (this.#mode === "eventsource") this.#open();
    else this.#poll();
  }

  #stop() {
    this.#closed = true;
    this.#closeSource();
    clearTimeout(this.#renewTimer);
    this.#abort.abort(); // requests in flight, and every pause (see #pause)
  }

  #finish(job) {
    this.#stop();
    this.#setState("done");
    this.#call("onDone", job);
  }

  #fail(problem) {
    this.#stop();
    this.#setState("failed", problem);
    if (typeof this.#options.onError === "function") this.#call("onError", problem);
    else console.error("pressroom:", problem.title, problem.detail ?? "");
  }

  // ------------------------------------------------------------------ EventSource

  #open() {
    this.#closeSource();
    const path = this.#jobId ? `/v1/jobs/${encodeURIComponent(this.#jobId)}/events` : "/v1/events";
    // A new EventSource sends no Last-Event-ID of its own: the cursor goes in the URL. Its own
    // reconnects send the header, which the server prefers.
    const source = new EventSource(this.#url(path, { last_event_id: this.#cursor }));
    this.#source = source;
    this.#sourceFailed = false;
    for (const type of [...EVENT_TYPES, "reset", "closed"]) {
      source.addEventListener(type, (message) => this.#onMessage(source, type, message));
    }
    source.onopen = () => {
      if (source !== this.#source) return;
      this.#failures = 0;
      this.#tokenFresh = false;
      this.#setState("live");
    };
    source.onerror = () => this.#onSourceError(source);
    this.#watchOpening(source);
  }

  #closeSource() {
    if (this.#source === null) return;
    this.#source.close();
    this.#source = null;
  }

  #onMessage(source, type, message) {
    if (source !== this.#source || this.#closed) return;
    const data = parseJson(message.data);
    if (data === undefined) return;
    if (type === "closed") this.#onClosed(data);
    else if (type === "reset") this.#onReset(data);
    else this.#deliver(data, message.lastEventId);
  }

  #onSourceError(source) {
    if (source !== this.#source || this.#closed) return;
    this.#sourceFailed = true;
    if (source.readyState !== EventSource.CLOSED) {
      // A network error: the browser reconnects by itself, with Last-Event-ID.
      this.#setState("reconnecting");
      return;
    }
    // The browser gave up: a 204 (the job's stream is over), a 4xx, a refusal, a proxy's
    // page. EventSource does not say which; one plain request does.
    this.#closeSource();
    this.#probe();
  }

  /** A stream that neither opens nor fails is held up on its way: ask the API directly. */
  #watchOpening(source) {
    const timeoutMs = this.#options.openTimeoutMs ?? OPEN_TIMEOUT_MS;
    this.#pause(timeoutMs).then(() => {
      if (source !== this.#source || this.#closed || source.readyState === EventSource.OPEN) return;
      if (this.#sourceFailed) {
        // The server is unreachable and the browser keeps trying: nothing is held up.
        this.#sourceFailed = false;
        this.#watchOpening(source);
        return;
      }
      this.#closeSource();
      this.#probe();
    });
  }

  #onClosed(data) {
    this.#closeSource();
    const needsToken = data.code === "token_expired" || data.code === "revoked";
    if (needsToken && !this.#options.getToken) {
      this.#fail({ title: "The stream was closed", status: 401, detail: data.reason, code: data.code });
      return;
    }
    this.#setState("reconnecting", data);
    this.#reconnect(needsToken);
  }

  async #reconnect(withNewToken) {
    // The first reconnect at once (a server that shuts down has others to go to); then backoff.
    const delayMs = this.#failures === 0 ? 0 : this.#backoff();
    this.#failures += 1;
    await this.#pause(delayMs);
    if (this.#closed) return;
    if (withNewToken && !(await this.#newToken())) return;
    this.#connect();
  }

  /** Why the stream failed, from one plain request: the job's end, an error, or a stream
   * that cannot pass (then the long-poll, for good). */
  async #probe() {
    this.#setState("reconnecting");
    const answer = await this.#request(this.#pollUrl(0));
    if (this.#closed) return;
    if (answer.status >= 200 && answer.status < 300) {
      if (this.#jobId && FINAL_STATUSES.has(answer.body?.status)) {
        // The stream had nothing more to send (a 204: its final event was seen already).
        this.#finish(answer.body);
        return;
      }
      if (this.#jobId) this.#takeJob(answer.body, answer.etag);
      else this.#takeEvents(answer.body);
      this.#failures = 0;
      this.#mode = "longpoll";
      this.#poll();
      return;
    }
    if (!(await this.#recover(answer))) return;
    this.#open();
  }

  // ------------------------------------------------------------------ long-poll

  #pollUrl(waitS) {
    if (this.#jobId) {
      return this.#url(`/v1/jobs/${encodeURIComponent(this.#jobId)}`, { wait: waitS || null });
    }
    return this.#url("/v1/events", { wait: waitS, last_event_id: this.#cursor });
  }

  async #poll() {
    const waitS = this.#options.waitS ?? POLL_WAIT_S;
    while (!this.#closed) {
      // A job's first poll reads its state now; then each waits for a change of that state.
      const etag = this.#jobId ? this.#etag : null;
      const wait = this.#jobId && etag === null ? 0 : waitS;
      const answer = await this.#request(this.#pollUrl(wait), etag ? { "If-None-Match": etag } : {});
      if (this.#closed) return;
      if (answer.status === 304 || (answer.status >= 200 && answer.status < 300)) {
        this.#failures = 0;
        this.#tokenFresh = false;
        this.#setState("live");
        if (answer.status === 304) continue;
        if (this.#jobId ? this.#takeJob(answer.body, answer.etag) : this.#takeEvents(answer.body)) {
          return;
        }
      } else if (!(await this.#recover(answer))) {
        return;
      }
    }
  }

  /** After a failed request: true once it is worth trying again (after a pause or with a new
   * token), false when the watch has ended (a 4xx: onError). */
  async #recover(answer) {
    if (answer.status === 401 && this.#options.getToken) {
      if (answer.token !== this.#token) return true; // renewed while the request was out
      if (!this.#tokenFresh) return this.#newToken(); // expired meanwhile: one fresh try
    }
    const retryable = answer.status === 0 || answer.status === 408 || answer.status === 429;
    if (retryable || answer.status >= 500) {
      this.#failures += 1;
      const reason = answer.status === 0 ? answer.error : `HTTP ${answer.status}`;
      this.#setState("reconnecting", { reason });
      await this.#pause(this.#backoff(answer.retryAfter));
      return !this.#closed;
    }
    this.#fail(problemOf(answer));
    return false;
  }

  /** A job's state from GET /v1/jobs/{id}: an event when it changed; true when final. */
  #takeJob(job, etag) {
    if (etag) this.#etag = etag;
    if (!job || typeof job !== "object" || !job.status) return false;
    if (!sameState(job, this.#lastJob)) {
      this.#lastJob = job;
      // The long-poll answers states, not events: no event_id, and steps may merge.
      this.#call("onEvent", { type: `job.${job.status}`, at: job.updated_at ?? null, job });
    }
    if (!FINAL_STATUSES.has(job.status)) return false;
    this.#finish(job);
    return true;
  }

  /** The answer of GET /v1/events?wait=: its events, then its cursor. */
  #takeEvents(body) {
    for (const item of Array.isArray(body?.events) ? body.events : []) {
      if (item?.type === "reset") this.#onReset(item);
      else this.#deliver(item, item?.event_id);
      if (this.#closed) return true;
    }
    // Past events the filters skipped too: the next poll starts there.
    if (body?.last_event_id !== undefined && body.last_event_id !== null) {
      this.#cursor = String(body.last_event_id);
    }
    return false;
  }

  // ------------------------------------------------------------------ events

  #deliver(event, id) {
    if (!event || typeof event !== "object") return;
    const key = id === undefined || id === null || id === "" ? eventKey(event) : String(id);
    if (key !== null) {
      if (this.#seen.has(key)) return; // replayed after a reconnect or a renewal
      this.#seen.add(key);
      if (this.#seen.size > SEEN_MAX) this.#seen.delete(this.#seen.values().next().value);
      this.#cursor = key;
    }
    if (event.job) this.#lastJob = event.job;
    this.#call("onEvent", event);
    if (this.#jobId && FINAL_TYPES.has(event.type) && !this.#closed) this.#finish(event.job);
  }

  #onReset(reset) {
    // What follows a reset is news, whatever ids were seen before it.
    this.#seen.clear();
    if (reset.job) this.#lastJob = reset.job;
    this.#call("onReset", reset);
  }

  // ------------------------------------------------------------------ tokens

  /** A token from getToken, retried with backoff; false once the watch has ended. */
  #newToken() {
    this.#tokenPending ??= this.#fetchToken().finally(() => {
      this.#tokenPending = null;
    });
    return this.#tokenPending;
  }

  async #fetchToken() {
    while (!this.#closed) {
      try {
        const got = await this.#options.getToken();
        const token = typeof got === "string" ? got : got?.token;
        if (typeof token !== "string" || token === "") throw new TypeError("getToken() gave no token");
        this.#token = token;
        this.#tokenFresh = true;
        this.#scheduleRenewal();
        return !this.#closed;
      } catch (error) {
        this.#failures += 1;
        this.#setState("reconnecting", { reason: `getToken() failed: ${error?.message ?? error}` });
        await this.#pause(this.#backoff());
      }
    }
    return false;
  }

  #scheduleRenewal() {
    clearTimeout(this.#renewTimer);
    this.#renewTimer = null;
    const claims = this.#options.getToken && this.#token ? jwtClaims(this.#token) : null;
    if (typeof claims?.exp !== "number") return;
    // By this page's clock when it agrees with the issuer's; else by the token's own lifetime
    // from now (less the second `iat` may have been rounded down by), so a page whose clock
    // is off renews neither in a loop nor too late.
    const nowS = Date.now() / 1000;
    const issued = typeof claims.iat === "number";
    const skewed = issued && Math.abs(nowS - claims.iat) > CLOCK_TRUSTED_S;
    const leftMs = (skewed ? claims.exp - claims.iat - 1 : claims.exp - nowS) * 1000;
    const lifetimeMs = issued ? (claims.exp - claims.iat) * 1000 : leftMs;
    const aheadMs = Math.min(RENEW_AHEAD_MAX_MS, Math.max(0, lifetimeMs) * RENEW_AHEAD_SHARE);
    const delayMs = Math.max(RENEW_MIN_MS, leftMs - aheadMs);
    this.#renewTimer = setTimeout(() => this.#renew(), Math.min(delayMs, MAX_TIMER_MS));
  }

  async #renew() {
    this.#renewTimer = null;
    if (!(await this.#newToken())) return;
    // A stream's URL cannot change: a new one, from the last event handled. The long-poll
    // sends the new token with its next request.
    if (this.#mode === "eventsource" && this.#source !== null) this.#open();
  }

  // ------------------------------------------------------------------ helpers

  #url(path, params) {
    const query = new URLSearchParams();
    if (this.#channel !== null && !this.#jobId) query.set("channel", this.#channel);
    const types = this.#options.types;
    if (!this.#jobId && Array.isArray(types) && types.length) query.set("type", types.join(","));
    for (const [name, value] of Object.entries(params)) {
      if (value !== null && value !== undefined) query.set(name, String(value));
    }
    if (this.#token) query.set("token", this.#token);
    const text = query.toString();
    return `${this.#base}${path}${text ? `?${text}` : ""}`;
  }

  /** One GET; never throws: status 0 for a network error (or a CORS refusal). */
  async #request(url, extraHeaders = {}) {
    const token = this.#token;
    const headers = { Accept: "application/json, application/problem+json", ...extraHeaders };
    if (this.#options.apiKey) headers.Authorization = `Bearer ${this.#options.apiKey}`;
    try {
      const response = await fetch(url, { headers, cache: "no-store", signal: this.#abort.signal });
      const text = await response.text();
      return {
        status: response.status,
        statusText: response.statusText,
        body: text ? (parseJson(text) ?? null) : null,
        etag: response.headers.get("ETag"),
        retryAfter: response.headers.get("Retry-After"),
        token,
      };
    } catch (error) {
      return { status: 0, error: String(error?.message ?? error), token };
    }
  }

  /** Resolves after ms, or at once when the watch is closed. */
  #pause(ms) {
    return new Promise((resolve) => {
      const signal = this.#abort.signal;
      if (signal.aborted) return resolve();
      const timer = setTimeout(done, ms);
      signal.addEventListener("abort", done, { once: true });
      function done() {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        resolve();
      }
    });
  }

  #backoff(retryAfter) {
    const steps = Math.max(1, this.#failures);
    const capMs = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** (steps - 1));
    const jitteredMs = capMs / 2 + (Math.random() * capMs) / 2;
    const askedS = Number(retryAfter);
    return Number.isFinite(askedS) && askedS > 0 ? Math.max(jitteredMs, askedS * 1000) : jitteredMs;
  }

  #setState(state, detail) {
    if (state === this.#state && state !== "reconnecting") return;
    this.#state = state;
    this.#call("onState", state, detail);
  }

  #call(name, ...args) {
    const callback = this.#options[name];
    if (typeof callback !== "function") return;
    try {
      const result = callback(...args);
      if (typeof result?.then === "function") result.then(undefined, report);
    } catch (error) {
      report(error); // the app's bug must not stop the stream
    }
  }
}

function report(error) {
  if (typeof reportError === "function") reportError(error);
  else console.error(error);
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function eventKey(event) {
  return event.event_id === undefined || event.event_id === null ? null : String(event.event_id);
}

function sameState(job, before) {
  if (!before) return false;
  return ["id", "status", "updated_at", "progress", "attempts"].every((k) => job[k] === before[k]);
}

/** The problem+json body of a refusal, or one made from its status. */
function problemOf(answer) {
  const body = answer.body;
  if (body && typeof body === "object" && (body.title || body.type)) {
    return { ...body, status: body.status ?? answer.status };
  }
  return { title: answer.statusText || `HTTP ${answer.status}`, status: answer.status, detail: "" };
}

/** The claims of a JWT, read without checking it (the server does): only to time renewals. */
function jwtClaims(token) {
  const part = String(token).split(".")[1];
  if (!part) return null;
  try {
    const base64 = part.replace(/-/g, "+").replace(/_/g, "/");
    const bytes = Uint8Array.from(atob(base64.padEnd(Math.ceil(base64.length / 4) * 4, "=")), (c) =>
      c.charCodeAt(0),
    );
    const claims = JSON.parse(new TextDecoder().decode(bytes));
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}
