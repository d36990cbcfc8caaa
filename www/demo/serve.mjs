#!/usr/bin/env node
// The demo's one-command server (no dependencies): serves www/ (the package,
// demo/, pkg/), a folder of GGUF models under /models/ and the repository's
// shipped drafters under /drafters/ (the demo's default drafter).
//   node www/demo/serve.mjs [--port 8080] [--host 127.0.0.1] [--models DIR]
// then open http://127.0.0.1:8080/demo/. Builds pkg/ first if it is missing.
// The tests import startServer.
import { createServer } from 'node:http';
import { createReadStream, existsSync, statSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { homedir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const WWW = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8', '.json': 'application/json', '.wasm': 'application/wasm', '.svg': 'image/svg+xml',
  '.ts': 'text/plain; charset=utf-8', '.md': 'text/plain; charset=utf-8', '.png': 'image/png', '.gguf': 'application/octet-stream',
};

// `files` maps extra URL paths to files (the tests serve their model so),
// `routes` URL paths to handlers `(req, res) => void` (the tests' broken
// downloads). Resolves to { origin, close() }; close() also ends open
// connections.
export async function startServer({
  root = WWW, models = null, drafters = null, files = {}, routes = {}, port = 0, host = '127.0.0.1',
} = {}) {
  const server = createServer((req, res) => {
    let pathname;
    try {
      pathname = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    } catch {
      res.writeHead(400).end(); // a malformed %-escape
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') { res.writeHead(405).end(); return; }
    if (pathname === '/' || pathname === '/demo') { res.writeHead(302, { location: '/demo/' }).end(); return; }
    if (Object.hasOwn(routes, pathname)) { routes[pathname](req, res); return; }
    let file = files[pathname];
    for (const [prefix, dir] of [['/models/', models], ['/drafters/', drafters]]) {
      if (!file && dir && pathname.startsWith(prefix)) {
        file = path.join(dir, path.basename(pathname));
        if (!file.endsWith('.gguf')) { res.writeHead(404).end(); return; }
      }
    }
    if (!file) {
      file = path.join(root, path.normalize(pathname));
      if (!file.startsWith(root + path.sep)) { res.writeHead(403).end(); return; }
      if (pathname.endsWith('/')) file = path.join(file, 'index.html');
    }
    let size;
    try {
      const st = statSync(file);
      if (!st.isFile()) throw new Error('not a file');
      size = st.size;
    } catch {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      return;
    }
    const headers = {
      'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream',
      'content-length': size,
      // Revalidate: the demo's service worker serves its copy only offline.
      'cache-control': 'no-cache',
    };
    // The demo's service worker (demo/sw.js) controls www/ as a whole, so
    // the engine's worker (src/worker.js) is offline too.
    if (pathname.endsWith('/demo/sw.js')) headers['service-worker-allowed'] = '/';
    res.writeHead(200, headers);
    if (req.method === 'HEAD') res.end(); else createReadStream(file).pipe(res);
  });
  await new Promise((resolve, reject) => { server.once('error', reject); server.listen(port, host, resolve); });
  return {
    origin: `http://${host}:${server.address().port}`,
    close: () => new Promise((resolve) => { server.close(resolve); server.closeAllConnections(); }),
  };
}

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && process.argv[i + 1] ? process.argv[i + 1] : fallback;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  if (!existsSync(path.join(WWW, 'pkg', 'blockdraft_wasm.js'))) {
    console.log('www/pkg/ is missing: building it with www/test/build.sh (PROFILE=dev for a faster build) ...');
    const r = spawnSync(path.join(WWW, 'test', 'build.sh'), { stdio: 'inherit' });
    if (r.status !== 0) {
      console.error('serve.mjs: the build failed; see www/README.md ("Build and browser test") for what it needs');
      process.exit(1);
    }
  }
  const fallbackModels = path.join(homedir(), '.cache', 'blockdraft', 'models');
  const models = arg('models', existsSync(fallbackModels) ? fallbackModels : null);
  const drafters = path.resolve(WWW, '..', 'drafters');
  const { origin } = await startServer({ port: Number(arg('port', 8080)), host: arg('host', '127.0.0.1'), models, drafters });
  console.log(`blockdraft demo: ${origin}/demo/`);
  console.log(models ? `models: ${models} at ${origin}/models/<file>.gguf` : 'models: none served (--models DIR); use a URL or a local file');
  console.log(`drafters: ${drafters} at ${origin}/drafters/<file>.gguf`);
}
