// The API reference (/docs): Swagger UI over this server's own description. Every file comes
// from this server, and the online validator is off, so the page asks nothing of the Internet.
/* global SwaggerUIBundle */

// The dashboard token this tab holds (static/session.js), which "Try it out" sends as the
// dashboard does; else a key an older dashboard kept in this browser.
const TOKEN_STORAGE = "pressroom.dashboardToken";
const KEY_STORAGE = "pressroom.apiKey";

function storedKey() {
  try {
    const held = JSON.parse(sessionStorage.getItem(TOKEN_STORAGE) || "null");
    if (held && typeof held.token === "string") return held.token;
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return ""; // storage disabled: Authorize asks for the key
  }
}

const ui = SwaggerUIBundle({
  url: "/v1/openapi.json",
  dom_id: "#swagger-ui",
  presets: [SwaggerUIBundle.presets.apis],
  plugins: [SwaggerUIBundle.plugins.DownloadUrl],
  layout: "BaseLayout",
  validatorUrl: null,
  deepLinking: true,
  onComplete() {
    const key = storedKey();
    if (key) ui.preauthorizeApiKey("bearer", key);
  },
});
