// The persistent model cache: models loaded from a URL are kept on disk under
// that URL, so the next load (offline too) reads them back without the network.
// Stores: OPFS, else Cache Storage (where OPFS or writing to it is missing).
// Reads look in both, so an entry is found whichever store wrote it.
//
// An entry is complete only once its metadata { url, bytes } exists: the data
// is written first (committed only when the download ends), the metadata last,
// and starting a download deletes the old metadata first.

import { BlockdraftError } from './errors.js';

const NAME = 'blockdraft-models';
const META = 'blockdraft-models-meta';
const SLICE = 16 << 20;
// Bytes gathered before one OPFS write: fewer, larger writes.
const BATCH = 4 << 20;

const cacheError = (what, e) => new BlockdraftError('cache',
  `the model cache cannot ${what}: ${e?.message ?? e}; the browser's storage may be full or blocked `
  + '(OPFS and Cache Storage need https or localhost); free space with modelCache.clear()');

export function absoluteUrl(source) {
  return new URL(source, globalThis.location?.href).href;
}

async function fileKey(url) {
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(url));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}

async function* blobChunks(blob, signal) {
  for (let at = 0; at < blob.size; at += SLICE) {
    signal?.throwIfAborted();
    yield new Uint8Array(await blob.slice(at, Math.min(at + SLICE, blob.size)).arrayBuffer());
  }
}

async function* streamChunks(body, signal) {
  const reader = body.getReader();
  try {
    for (;;) {
      signal?.throwIfAborted();
      const { done, value } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

const notFound = (e) => {
  if (e?.name === 'NotFoundError') return null;
  throw e;
};

// OPFS: <dir>/<sha256(url)>.gguf and .json. A writable's data replaces the
// file only on close(), so an aborted download leaves no partial data.
const opfs = {
  available: () => typeof navigator !== 'undefined' && typeof navigator.storage?.getDirectory === 'function'
    && typeof globalThis.FileSystemFileHandle?.prototype.createWritable === 'function',

  async dir() {
    return (await navigator.storage.getDirectory()).getDirectoryHandle(NAME, { create: true });
  },

  async readMeta(dir, name) {
    const handle = await dir.getFileHandle(name).catch(notFound);
    if (!handle) return null;
    try {
      return JSON.parse(await (await handle.getFile()).text());
    } catch {
      return null; // unreadable metadata: not a complete entry
    }
  },

  // The data file of a complete entry, or null.
  async complete(dir, key, url) {
    const meta = await this.readMeta(dir, `${key}.json`);
    if (!meta || (url !== undefined && meta.url !== url)) return null;
    const handle = await dir.getFileHandle(`${key}.gguf`).catch(notFound);
    const file = handle && await handle.getFile();
    return file && file.size === meta.bytes ? { url: meta.url, bytes: meta.bytes, file } : null;
  },

  async lookup(url) {
    const hit = await this.complete(await this.dir(), await fileKey(url), url);
    return hit && { bytes: hit.bytes, chunks: (signal) => blobChunks(hit.file, signal) };
  },

  async writer(url) {
    const dir = await this.dir();
    const key = await fileKey(url);
    await dir.removeEntry(`${key}.json`).catch(notFound);
    const out = await (await dir.getFileHandle(`${key}.gguf`, { create: true })).createWritable();
    let parts = [];
    let held = 0;
    // One write in flight while the next batch gathers: the download does
    // not wait for the disk unless the disk falls a whole batch behind.
    let writing = Promise.resolve();
    const flush = async () => {
      await writing;
      if (!held) return;
      const blob = new Blob(parts);
      parts = [];
      held = 0;
      writing = out.write(blob);
      writing.catch(() => {}); // surfaces at the next flush
    };
    return {
      async write(chunk) {
        parts.push(new Blob([chunk])); // a copy: the caller may hand the chunk on
        held += chunk.byteLength;
        if (held >= BATCH) await flush();
      },
      async commit(bytes) {
        await flush();
        await writing;
        await out.close();
        const meta = await (await dir.getFileHandle(`${key}.json`, { create: true })).createWritable();
        await meta.write(JSON.stringify({ url, bytes, stored: Date.now() }));
        await meta.close();
      },
      async abort() {
        await writing.catch(() => {});
        await out.abort().catch(() => {});
        await dir.removeEntry(`${key}.gguf`).catch(() => {});
      },
    };
  },

  async entries() {
    const dir = await this.dir();
    const out = [];
    for await (const [name] of dir.entries()) {
      if (!name.endsWith('.json')) continue;
      const hit = await this.complete(dir, name.slice(0, -5));
      if (hit) out.push({ url: hit.url, bytes: hit.bytes });
    }
    return out;
  },

  async remove(url) {
    const dir = await this.dir();
    const key = await fileKey(url);
    const had = await dir.removeEntry(`${key}.json`).then(() => true, notFound);
    await dir.removeEntry(`${key}.gguf`).catch(notFound);
    return !!had;
  },

  async clear() {
    await (await navigator.storage.getDirectory()).removeEntry(NAME, { recursive: true }).catch(notFound);
  },
};

// Cache Storage: the data under the URL in one cache, { url, bytes } in
// another (matching ignores a URL's fragment, so one cache cannot hold both).
// cache.put() stores a streamed body only once the stream has ended.
const cacheStorage = {
  available: () => typeof caches !== 'undefined',

  async lookup(url) {
    const meta = await (await caches.open(META)).match(url);
    if (!meta) return null;
    const { bytes } = await meta.json();
    const data = await (await caches.open(NAME)).match(url);
    return data?.body ? { bytes, chunks: (signal) => streamChunks(data.body, signal) } : null;
  },

  async writer(url) {
    const [data, meta] = await Promise.all([caches.open(NAME), caches.open(META)]);
    await meta.delete(url);
    const pipe = new TransformStream();
    const out = pipe.writable.getWriter();
    const put = data.put(url, new Response(pipe.readable, { headers: { 'content-type': 'application/octet-stream' } }));
    put.catch(() => {}); // awaited in commit; an abort rejects it
    return {
      async write(chunk) {
        await out.ready;
        await out.write(chunk.slice()); // a copy: the caller may hand the chunk on
      },
      async commit(bytes) {
        await out.close();
        await put;
        await meta.put(url, new Response(JSON.stringify({ url, bytes, stored: Date.now() }),
          { headers: { 'content-type': 'application/json' } }));
      },
      async abort() {
        await out.abort(new Error('download ended')).catch(() => {});
        await put.catch(() => {});
        await data.delete(url).catch(() => {});
      },
    };
  },

  async entries() {
    const meta = await caches.open(META);
    const out = [];
    for (const request of await meta.keys()) {
      const m = await (await meta.match(request)).json();
      if (await (await caches.open(NAME)).match(m.url)) out.push({ url: m.url, bytes: m.bytes });
    }
    return out;
  },

  async remove(url) {
    const had = await (await caches.open(META)).delete(url);
    await (await caches.open(NAME)).delete(url);
    return had;
  },

  async clear() {
    await caches.delete(META);
    await caches.delete(NAME);
  },
};

// The usable stores, writing to the first.
function stores() {
  return [opfs, cacheStorage].filter((s) => s.available());
}

// URLs loaded with `cache: false` at the moment (see bypassCache).
const bypassed = new Map();

// While the returned function is not called, readSource neither reads nor
// writes these URLs in the cache.
export function bypassCache(urls) {
  for (const u of urls) bypassed.set(u, (bypassed.get(u) ?? 0) + 1);
  return () => {
    for (const u of urls) {
      const n = bypassed.get(u) - 1;
      if (n) bypassed.set(u, n); else bypassed.delete(u);
    }
  };
}

export function cacheUsable(url) {
  return !bypassed.has(url) && stores().length > 0;
}

// A complete entry as { bytes, chunks(signal) }, or null (a store that
// fails to answer counts as a miss: the network still works).
export async function lookup(url) {
  for (const store of stores()) {
    const hit = await store.lookup(url).catch(() => null);
    if (hit) return hit;
  }
  return null;
}

// A writer for `url` ({ write(chunk), commit(bytes), abort() }), or null when
// `total` known bytes would not fit in the storage quota.
export async function openWriter(url, total) {
  const [store] = stores();
  if (!store) return null;
  if (total !== null && navigator.storage?.estimate) {
    const { quota, usage } = await navigator.storage.estimate();
    if (quota !== undefined && quota - (usage ?? 0) < total) return null;
  }
  return store.writer(url);
}

function requireStores(what) {
  const all = stores();
  if (!all.length) throw cacheError(what, new Error('no OPFS and no Cache Storage in this context'));
  return all;
}

// The public cache API (index.js exports it as modelCache). URLs are resolved
// against the page, as createEngine resolves them.
export const modelCache = {
  /** Complete entries: [{ url, bytes }], each URL once. */
  async list() {
    const seen = new Map();
    for (const store of requireStores('list its entries')) {
      let entries;
      try {
        entries = await store.entries();
      } catch (e) {
        throw cacheError('list its entries', e);
      }
      for (const e of entries) if (!seen.has(e.url)) seen.set(e.url, e);
    }
    return [...seen.values()];
  },

  async size() {
    return (await modelCache.list()).reduce((sum, e) => sum + e.bytes, 0);
  },

  async has(url) {
    requireStores('look up a model');
    return (await lookup(absoluteUrl(url))) !== null;
  },

  /** Removes `url`'s entry; true when there was one. */
  async delete(url) {
    const href = absoluteUrl(url);
    let had = false;
    for (const store of requireStores(`delete ${href}`)) {
      try {
        had = (await store.remove(href)) || had;
      } catch (e) {
        throw cacheError(`delete ${href}`, e);
      }
    }
    return had;
  },

  async clear() {
    for (const store of requireStores('clear')) {
      try {
        await store.clear();
      } catch (e) {
        throw cacheError('clear', e);
      }
    }
  },
};

// Readies a load's options (transport.js, worker.js): `cache: false` bypasses
// the cache for the model and drafter URLs until release(); download progress
// gets `cached: true` when that file is read from the cache.
export async function prepareLoad(options, onProgress) {
  const { cache = true, ...rest } = options;
  const urls = {};
  for (const what of ['model', 'drafter']) {
    const s = rest[what];
    if ((typeof s === 'string' && !(what === 'drafter' && s === 'ngram')) || s instanceof URL) {
      try {
        urls[what] = absoluteUrl(s);
      } catch {
        // readSource reports the invalid URL
      }
    }
  }
  const release = cache === false ? bypassCache(Object.values(urls)) : () => {};
  const cached = {};
  for (const [what, url] of Object.entries(urls)) {
    cached[what] = cache !== false && (await lookup(url)) !== null;
  }
  const wrapped = (p) => onProgress(p.phase === 'download' && p.what in cached ? { ...p, cached: cached[p.what] } : p);
  return { options: rest, onProgress: wrapped, release };
}
