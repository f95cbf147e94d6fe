// The API reference (/docs): Swagger UI over this server's own description. Every file comes
// from this server, and the online validator is off, so the page asks nothing of the Internet.
/* global SwaggerUIBundle */

// The key the dashboard keeps in this browser: "Try it out" sends it as the dashboard does.
const KEY_STORAGE = "pressroom.apiKey";

function storedKey() {
  try {
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
