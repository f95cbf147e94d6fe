// Pressroom dashboard, the list page: the API key box, the job list (static/list.js: table,
// counts, filters in the URL, pages, bulk actions, live over one stream) and the submit form
// (static/submit.js: every source, files as a multipart body, errors beside their fields).
import { setKey, signedIn } from "/static/session.js";
import { startList, startOver, showSubmitted } from "/static/list.js";
import { $ } from "/static/rows.js";
import { startForm } from "/static/submit.js";

// ---------------------------------------------------------------- API key

function setupApiKey() {
  const input = $("api-key");
  $("api-key-status").textContent = signedIn() ? "This tab holds a token (not the key)." : "No key given.";
  $("api-key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    applyApiKey(input.value.trim());
  });
  $("api-key-clear").addEventListener("click", () => {
    input.value = "";
    applyApiKey("");
  });
}

async function applyApiKey(key) {
  try {
    await setKey(key); // exchanged for a token; the key itself is not kept
  } catch (error) {
    $("api-key-status").textContent = error.problem?.detail || error.message;
    return;
  }
  $("api-key").value = "";
  $("api-key-status").textContent = key ? "Key exchanged for a token." : "Token forgotten.";
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
