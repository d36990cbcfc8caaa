// The demo's service worker: keeps the app shell (the page, the package's
// JS, the wasm module) so the demo opens offline. Models are not its job:
// the package's model cache keeps them. Network first, so a rebuilt package
// is picked up at once while online.
const SHELL = 'blockdraft-demo-shell-v1';
const ROOT = new URL('../', self.location.href); // www/
// The page and the modules it starts from; install follows their imports
// (and `new URL('…', import.meta.url)`: the engine's worker, the wasm), so
// files the package adds later are kept too.
const ENTRIES = ['demo/', 'demo/demo.css', 'demo/demo.js', 'index.js'];
const SHELL_TYPES = /(\/|\.html|\.js|\.mjs|\.css|\.wasm|\.json|\.svg)$/;
const REFERENCES = [
  /\b(?:import|export)\s[^;'"]*?from\s*['"](\.{1,2}\/[^'"]+)['"]/g,
  /\bimport\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g,
  /new URL\(\s*['"]([^'"]+)['"]\s*,\s*import\.meta\.url/g,
];

async function precache() {
  const cache = await caches.open(SHELL);
  const seen = new Set();
  const queue = ENTRIES.map((f) => new URL(f, ROOT).href);
  while (queue.length) {
    const url = queue.shift();
    if (seen.has(url) || !url.startsWith(ROOT.href)) continue;
    seen.add(url);
    const res = await fetch(url, { cache: 'no-cache' });
    // An entry must be there; a crawled name may be a false match in a comment.
    if (!res.ok) {
      if (ENTRIES.some((f) => new URL(f, ROOT).href === url)) throw new Error(`${url}: HTTP ${res.status}`);
      continue;
    }
    if (/\.m?js$/.test(new URL(url).pathname)) {
      const text = await res.clone().text();
      for (const re of REFERENCES) {
        for (const m of text.matchAll(re)) queue.push(new URL(m[1], url).href);
      }
    }
    await cache.put(url, res);
  }
}

self.addEventListener('install', (event) => {
  event.waitUntil(precache().then(() => self.skipWaiting()));
});

self.addEventListener('activate', (event) => {
  event.waitUntil((async () => {
    for (const name of await caches.keys()) {
      if (name.startsWith('blockdraft-demo-shell-') && name !== SHELL) await caches.delete(name);
    }
    await self.clients.claim();
  })());
});

self.addEventListener('fetch', (event) => {
  const { request } = event;
  const url = new URL(request.url);
  // Only the shell: a model download (any other path) goes straight to the network.
  if (request.method !== 'GET' || url.origin !== ROOT.origin || !url.pathname.startsWith(ROOT.pathname)
      || !SHELL_TYPES.test(url.pathname)) return;
  event.respondWith((async () => {
    try {
      const res = await fetch(request);
      if (res.ok) {
        const copy = res.clone();
        event.waitUntil(caches.open(SHELL).then((c) => c.put(request, copy)));
      }
      return res;
    } catch (e) {
      const hit = await (await caches.open(SHELL)).match(request, { ignoreSearch: true });
      if (hit) return hit;
      throw e;
    }
  })());
});
