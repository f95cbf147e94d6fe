// Pressroom dashboard, the list page: the API key box, the job list (static/list.js: table,
// counts, filters in the URL, pages, bulk actions, live over one stream) and the submit form
// (static/submit.js: every source, files as a multipart body, errors beside their fields).
import { currentKey, setKey } from "/static/session.js";
import { startList, startOver, showSubmitted } from "/static/list.js";
import { $ } from "/static/rows.js";
import { startForm } from "/static/submit.js";

// ---------------------------------------------------------------- API key

function setupApiKey() {
  const input = $("api-key");
  input.value = currentKey();
  $("api-key-status").textContent = input.value ? "A key is set." : "No key: dev mode.";
  $("api-key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    applyApiKey(input.value.trim());
  });
  $("api-key-clear").addEventListener("click", () => {
    input.value = "";
    applyApiKey("");
  });
}

function applyApiKey(key) {
  setKey(key);
  $("api-key-status").textContent = key ? "Key saved." : "Key cleared: dev mode.";
  // Another key may mean another tenant: start over with a fresh list and stream.
  startOver();
}

// ---------------------------------------------------------------- start

function start() {
  setupApiKey();
  startForm(showSubmitted);
  startList();
}

document.addEventListener("DOMContentLoaded", start);
