// The persistent model cache: models loaded from a URL are kept on disk under
// that URL, so the next load (offline too) reads them back without the network.
// Stores (stores.js): OPFS, else Cache Storage (where OPFS or writing to it
// is missing). Reads look in both, so an entry is found whichever store wrote it.

import { BlockdraftError } from './errors.js';
import { cacheStorage, opfs } from './stores.js';
import { sourceParts } from './source.js';

const cacheError = (what, e) => new BlockdraftError('cache',
  `the model cache cannot ${what}: ${e?.message ?? e}; the browser's storage may be full or blocked `
  + '(OPFS and Cache Storage need https or localhost); free space with modelCache.clear()');

export function absoluteUrl(source) {
  return new URL(source, globalThis.location?.href).href;
}

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
  // Every URL of each file (all parts of a split set).
  const urls = {};
  for (const what of ['model', 'drafter']) {
    const s = rest[what];
    if (s === undefined || s === null || (what === 'drafter' && s === 'ngram')) continue;
    try {
      urls[what] = sourceParts(s)
        .filter((part) => typeof part === 'string' || part instanceof URL)
        .map((part) => absoluteUrl(part));
    } catch {
      // readSource reports the invalid URL
    }
  }
  const release = cache === false ? bypassCache(Object.values(urls).flat()) : () => {};
  const cached = {};
  for (const [what, list] of Object.entries(urls)) {
    if (list.length === 0) continue;
    const hits = cache !== false && await Promise.all(list.map((u) => lookup(u)));
    cached[what] = cache !== false && hits.every((h) => h !== null);
  }
  const wrapped = (p) => onProgress(p.phase === 'download' && p.what in cached ? { ...p, cached: cached[p.what] } : p);
  return { options: rest, onProgress: wrapped, release };
}
