// Pressroom dashboard, the health page: the tenant's last hour minute by minute and its queue
// now (GET /v1/stats), drawn as inline SVG by the few lines below (no library, no CDN).
//
// Read again a second after the tenant's stream says a job changed (at most once a second
// however many change), and every 10 s besides: the minutes roll on and the oldest job ages
// with no event at all.
import { watchChannel } from "/pressroom.js";
import { api, keyed } from "/static/session.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 120;
const EVENT_DEBOUNCE_MS = 1_000;
const TICK_MS = 10_000;
const CHANGES = ["job.queued", "job.running", "job.retrying", "job.done", "job.failed", "job.cancelled"];

const $ = (id) => document.getElementById(id);
const state = { reading: null, again: false, debounce: null, watch: null };

function setConn(kind, text) {
  $("conn").dataset.state = kind;
  $("conn").querySelector(".conn-text").textContent = text;
}

function notice(text) {
  $("notice").textContent = text || "";
  $("notice").hidden = !text;
}

/** Seconds as people read them: 850 ms, 4.2 s, 3 min 10 s, 2 h 5 min. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function clock(iso) {
  return new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

// ---------------------------------------------------------------- charts

function node(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  return element;
}

/** Clear an SVG chart but its <title>, with a baseline. */
function reset(svg, label) {
  svg.querySelector("title").textContent = label;
  for (const child of [...svg.children]) if (child.tagName !== "title") child.remove();
  svg.append(node("line", { x1: 0, y1: HEIGHT - 0.5, x2: WIDTH, y2: HEIGHT - 0.5, class: "baseline" }));
}

/** A rounded-up scale top: 1, 2, 5, 10, 20, 50… */
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((step) => step * power).find((top) => top >= value);
}

function bars(svg, values, kind, label) {
  reset(svg, label);
  const top = niceMax(Math.max(...values));
  const slot = WIDTH / values.length;
  values.forEach((value, n) => {
    if (!value) return;
    const height = Math.max(1.5, (value / top) * (HEIGHT - 4));
    svg.append(node("rect", {
      x: n * slot + slot * 0.12, y: HEIGHT - height, width: slot * 0.76, height, class: `bar ${kind}`,
    }));
  });
  return top;
}

function lines(svg, series, label) {
  reset(svg, label);
  const all = series.flatMap(([values]) => values.filter((value) => value !== null));
  const top = niceMax(Math.max(0, ...all));
  const slot = WIDTH / series[0][0].length;
  for (const [values, kind] of series) {
    // A line through the minutes that have a figure; a minute without a job done breaks it.
    let path = "";
    values.forEach((value, n) => {
      if (value === null) return;
      const x = n * slot + slot / 2;
      const y = HEIGHT - (value / top) * (HEIGHT - 4);
      const joined = n > 0 && values[n - 1] !== null;
      path += `${joined ? "L" : "M"}${x.toFixed(1)} ${y.toFixed(1)} `;
      if (!joined && (n === values.length - 1 || values[n + 1] === null)) {
        path += `h0.1 `; // a lone minute: a dot, drawn by the round cap
      }
    });
    if (path) svg.append(node("path", { d: path.trim(), class: `line ${kind}` }));
  }
  return top;
}

// ---------------------------------------------------------------- the figures

function perMinute(count, minutes) {
  const rate = count / minutes;
  return rate >= 10 || rate === 0 ? String(Math.round(rate)) : rate.toFixed(1);
}

function show(stats) {
  const minutes = stats.minutes;
  const done = minutes.map((m) => m.done);
  const failed = minutes.map((m) => m.failed);
  // The last minute is still running: the rate is the last full minute's.
  const last = minutes[minutes.length - 2];
  $("read-at").textContent = new Date(stats.at).toLocaleTimeString();
  $("read-at").dateTime = stats.at;
  $("tile-rate").textContent = String(last.done);
  $("tile-rate-hint").textContent = `last full minute; ${perMinute(stats.hour.done, minutes.length)} a minute over the hour`;
  $("tile-depth").textContent = String(stats.queue.depth);
  const waiting = stats.queue.depth - stats.queue.due;
  $("tile-depth-hint").textContent = waiting ? `${stats.queue.due} due, ${waiting} scheduled or backing off` : "all due";
  $("tile-oldest").textContent = stats.queue.oldest_age_s === null ? "none due" : duration(stats.queue.oldest_age_s);
  $("tile-oldest-hint").textContent = stats.queue.oldest_due_at ? `submitted ${clock(stats.queue.oldest_due_at)}` : "";
  $("tile-latency").textContent = `${duration(stats.hour.p50_s)} / ${duration(stats.hour.p95_s)}`;
  $("tile-failures").textContent = String(last.failed);
  $("tile-failures-hint").textContent = `last full minute; ${stats.hour.failed} in the hour`;

  const span = `${clock(minutes[0].at)} to now`;
  const doneTop = bars($("chart-done"), done, "done", `Jobs done per minute, ${span}: ${stats.hour.done} in all, at most ${Math.max(...done)} in a minute`);
  $("done-scale").textContent = `scale 0–${doneTop}`;
  const failedTop = bars($("chart-failed"), failed, "failed", `Failures per minute, ${span}: ${stats.hour.failed} in all, at most ${Math.max(...failed)} in a minute`);
  $("failed-scale").textContent = `scale 0–${failedTop}`;
  const latencyTop = lines(
    $("chart-latency"),
    [[minutes.map((m) => m.p50_s), "p50"], [minutes.map((m) => m.p95_s), "p95"]],
    `Submit to done per minute, ${span}: p50 ${duration(stats.hour.p50_s)}, p95 ${duration(stats.hour.p95_s)} over the hour`,
  );
  $("latency-scale").textContent = `scale 0–${duration(latencyTop)}`;
  $("axis-from").textContent = clock(minutes[0].at);
  fillTable(minutes);
}

function fillTable(minutes) {
  const rows = [...minutes].reverse().map((m) => {
    const tr = document.createElement("tr");
    for (const text of [clock(m.at), m.done, m.failed, duration(m.p50_s), duration(m.p95_s)]) {
      const td = document.createElement("td");
      td.textContent = String(text);
      tr.append(td);
    }
    return tr;
  });
  $("minutes-body").replaceChildren(...rows);
}

// ---------------------------------------------------------------- reading, live

/** Read the figures; calls meanwhile fold into one more read after this one. */
async function read() {
  if (state.reading) {
    state.again = true;
    return state.reading;
  }
  state.reading = (async () => {
    try {
      show(await api("/v1/stats"));
      notice("");
    } catch (error) {
      notice(error.problem?.detail || error.message);
    } finally {
      $("health").setAttribute("aria-busy", "false");
    }
  })();
  await state.reading;
  state.reading = null;
  if (state.again) {
    state.again = false;
    await read();
  }
  return undefined;
}

function soon() {
  if (state.debounce !== null) return;
  state.debounce = setTimeout(() => {
    state.debounce = null;
    read();
  }, EVENT_DEBOUNCE_MS);
}

async function tenantToken() {
  const answer = await api("/v1/tokens", { method: "POST", body: {} });
  return answer.token;
}

function follow() {
  setConn("reconnecting", "Connecting…");
  const watch = watchChannel("", null, {
    types: CHANGES,
    getToken: keyed() ? tenantToken : undefined,
    onEvent: soon,
    onReset: soon,
    onState: (streamState) => {
      if (watch !== state.watch) return;
      if (streamState === "live") setConn("live", "Live");
      else if (streamState === "reconnecting") setConn("reconnecting", "Reconnecting…");
    },
    onError: (problem) => {
      if (watch !== state.watch) return;
      setConn("ended", "Every 10 s");
      notice(problem?.detail || "The stream stopped: the figures are read every 10 s.");
    },
  });
  state.watch = watch;
}

async function start() {
  await read();
  follow();
  setInterval(read, TICK_MS);
}

document.addEventListener("DOMContentLoaded", start);
