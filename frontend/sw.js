// Caches the app shell only, for installability and a fast first paint.
// Everything dynamic (/api, /v1, /ws, /library, /downloads, ...) always goes to the network.
const CACHE = "hearth-shell-v3";
const SHELL = ["/", "/assets/app.css", "/assets/js/main.js", "/assets/icon.svg", "/assets/vendor/marked-15.0.12.js",
  "/assets/vendor/hljs-11.12.0.js", "/assets/vendor/hljs-light-11.12.0.css", "/assets/vendor/hljs-dark-11.12.0.css"];

self.addEventListener("install", (e) => e.waitUntil(caches.open(CACHE).then((c) => c.addAll(SHELL))));
self.addEventListener("activate", (e) => e.waitUntil(
  caches.keys().then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))));
self.addEventListener("fetch", (e) => {
  const url = new URL(e.request.url);
  if (e.request.method !== "GET" || url.origin !== location.origin || !SHELL.includes(url.pathname)) return;
  // Network first, so a new version shows at once; the cache answers when the server is away.
  e.respondWith(fetch(e.request).then((r) => {
    if (r.ok && !r.redirected) {  // never keep the sign-in page as the shell
      const copy = r.clone();
      caches.open(CACHE).then((c) => c.put(e.request, copy));
    }
    return r;
  }).catch(() => caches.match(e.request)));
});
