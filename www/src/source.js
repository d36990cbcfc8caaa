// Model sources (URL, Blob/File, ArrayBuffer or typed array) as a stream of
// byte chunks, so no single JS buffer has to hold a whole model. URLs go
// through the persistent model cache (cache.js): a cached URL is read from
// disk, any other is written to it while it downloads, and becomes an entry
// only once the caller says the file was good (it loaded, or parsed as a
// GGUF file of its announced length): a failed download (an empty body, an
// error page, a cut-off stream) is never cached.

import { BlockdraftError } from './errors.js';
import { absoluteUrl, cacheUsable, lookup, openWriter } from './cache.js';
import { initWasm } from './wasm.js';

const SLICE = 16 << 20;

const SPLIT = /^(.*)-00001-of-(\d{5})\.gguf((?:[?#].*)?)$/;

// The files of a source, in order: an array is a split set's parts; the
// URL of a first part (`…-00001-of-0000N.gguf`) stands for all N parts,
// named as llama.cpp's gguf-split names them.
export function sourceParts(source) {
  if (Array.isArray(source)) {
    if (source.length === 0) throw new BlockdraftError('invalid_argument', 'an array of model parts must not be empty');
    return source;
  }
  const url = typeof source === 'string' ? source : (source instanceof URL ? source.href : null);
  const m = url === null ? null : SPLIT.exec(url);
  if (!m) return [source];
  const count = Number(m[2]);
  return Array.from({ length: count }, (_, i) => `${m[1]}-${String(i + 1).padStart(5, '0')}-of-${m[2]}.gguf${m[3]}`);
}

// Calls `push(Uint8Array)` for every chunk; `onBytes(loaded, total)` after
// each (total is null when unknown); `onStart(total)` before the first;
// `onUrl({ url, cached })` first for a URL. Resolves to null, or for a URL to
// readUrl's result, whose `entry` the caller must commit or abort.
export async function readSource(source, { what, signal, onStart, onBytes, push, onUrl = () => {} }) {
  if (typeof source === 'string' || source instanceof URL) {
    return readUrl(source, { what, signal, onStart, onBytes, push, onUrl });
  }
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    onStart(source.size);
    for (let at = 0; at < source.size; at += SLICE) {
      const end = Math.min(at + SLICE, source.size);
      push(new Uint8Array(await source.slice(at, end).arrayBuffer()));
      onBytes(end, source.size);
    }
    return;
  }
  let bytes = null;
  if (source instanceof ArrayBuffer) bytes = new Uint8Array(source);
  else if (ArrayBuffer.isView(source)) bytes = new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
  if (!bytes) {
    throw new BlockdraftError('invalid_argument', `the ${what} must be a URL, a Blob/File or an ArrayBuffer`);
  }
  onStart(bytes.byteLength);
  for (let at = 0; at < bytes.byteLength; at += SLICE) {
    const end = Math.min(at + SLICE, bytes.byteLength);
    push(bytes.subarray(at, end));
    onBytes(end, bytes.byteLength);
  }
  return null;
}

function toUrl(source, what) {
  try {
    return absoluteUrl(source);
  } catch {
    throw new BlockdraftError('invalid_argument', `the ${what} URL ${source} is not a valid URL`);
  }
}

const isAbort = (e) => e?.name === 'AbortError';

// Resolves to { url, from: 'cache' | 'network', bytes, entry, why }. For a
// download, `entry` ({ commit() -> Promise<boolean>, abort() }) holds the
// bytes written to the cache, not yet an entry: commit() once the file proved
// good, abort() otherwise (a failed commit costs the entry, never the load:
// it resolves to false). `entry` is null, with `why`, when nothing was
// written, and for a file read from the cache.
async function readUrl(source, { what, signal, onStart, onBytes, push, onUrl }) {
  const url = toUrl(source, what);
  const caching = cacheUsable(url);
  const hit = caching ? await lookup(url) : null;
  onUrl({ url, cached: !!hit });
  if (hit) {
    await readCached(url, hit, { what, signal, onStart, onBytes, push });
    return { url, from: 'cache', bytes: hit.bytes, entry: null, why: null };
  }

  let res;
  try {
    res = await fetch(url, { signal });
  } catch (e) {
    if (isAbort(e)) throw e;
    throw new BlockdraftError('network', `cannot download the ${what} from ${url}: ${e.message}; check the URL (and CORS headers for another origin)`);
  }
  if (!res.ok) {
    throw new BlockdraftError('network', `cannot download the ${what} from ${url}: HTTP ${res.status}; check the URL`);
  }
  // Content-Length is the size on the wire: only the file's size when not compressed.
  const len = res.headers.get('content-encoding') ? null : res.headers.get('content-length');
  const total = len !== null && /^\d+$/.test(len) ? Number(len) : null;

  // A failing cache write costs the cache entry, never the load.
  let writer = null;
  let why = caching ? null : 'caching is off for this URL';
  const dropWriter = async (e) => {
    why = `storing failed: ${e?.message ?? e}`;
    console.warn(`blockdraft: not caching ${url}: ${why}`);
    const w = writer;
    writer = null;
    await w?.abort();
  };
  if (caching) {
    try {
      writer = await openWriter(url, total);
      if (!writer) why = 'not enough storage quota';
    } catch (e) {
      await dropWriter(e);
    }
  }

  onStart(total);
  const reader = res.body?.getReader();
  let loaded = 0;
  try {
    for (;;) {
      let next;
      try {
        next = reader ? await reader.read() : { done: true };
      } catch (e) {
        if (isAbort(e)) throw e;
        throw new BlockdraftError('network', `the download of the ${what} from ${url} broke off after ${loaded} bytes: ${e.message}; try again`);
      }
      if (next.done) break;
      const chunk = next.value;
      if (writer) await writer.write(chunk).catch(dropWriter);
      push(chunk);
      loaded += chunk.byteLength;
      onBytes(loaded, total);
    }
    if (total !== null && loaded !== total) {
      throw new BlockdraftError('network', `the download of the ${what} from ${url} ended after ${loaded} of ${total} bytes; try again`);
    }
  } catch (e) {
    await writer?.abort();
    throw e;
  }
  if (!writer) return { url, from: 'network', bytes: loaded, entry: null, why };
  const w = writer;
  let settled = false;
  const entry = {
    why: null,
    async commit() {
      if (settled) return false;
      settled = true;
      try {
        await w.commit(loaded);
        return true;
      } catch (e) {
        entry.why = `storing failed: ${e?.message ?? e}`;
        console.warn(`blockdraft: not caching ${url}: ${entry.why}`);
        await w.abort();
        return false;
      }
    },
    async abort() {
      if (settled) return;
      settled = true;
      await w.abort();
    },
  };
  return { url, from: 'network', bytes: loaded, entry, why: null };
}

async function readCached(url, hit, { what, signal, onStart, onBytes, push }) {
  const broken = (detail) => new BlockdraftError('cache',
    `cannot read the cached ${what} for ${url} (${detail}); delete it with modelCache.delete(url) and load it again`);
  onStart(hit.bytes);
  const chunks = hit.chunks(signal);
  let loaded = 0;
  for (;;) {
    let next;
    try {
      next = await chunks.next();
    } catch (e) {
      if (isAbort(e)) throw e;
      throw broken(e.message);
    }
    if (next.done) break;
    push(next.value);
    loaded += next.value.byteLength;
    onBytes(loaded, hit.bytes);
  }
  if (loaded !== hit.bytes) throw broken(`${loaded} of ${hit.bytes} bytes`);
}

// Downloads `url` into the model cache (nothing when it is there already).
// onProgress({ loaded, total }). Resolves to { url, bytes, cached } where
// `cached` says it was there before. The download is stored only when it is
// a whole GGUF file of its announced length (checked by the wasm module as
// the bytes arrive; `wasmUrl` as createEngine's).
export async function addToCache(url, { signal, onProgress = () => {}, wasmUrl } = {}) {
  const href = toUrl(url, 'model');
  if (!cacheUsable(href)) {
    throw new BlockdraftError('cache', `cannot cache ${href}: this context has no OPFS and no Cache Storage (they need https or localhost)`);
  }
  const hit = await lookup(href);
  if (hit) return { url: href, bytes: hit.bytes, cached: true };
  let GgufCheck;
  try {
    ({ GgufCheck } = await initWasm(wasmUrl));
  } catch (e) {
    throw new BlockdraftError('internal', `cannot load blockdraft's WebAssembly module (it checks downloads before they are cached): ${e.message}`);
  }
  let check = null;
  const notGguf = (e) => new BlockdraftError('bad_gguf',
    `the download of ${href} is not a GGUF model (${e?.message ?? e}); nothing was cached: check the URL`);
  let r;
  try {
    r = await readUrl(href, {
      what: 'model',
      signal,
      onUrl: () => {},
      onStart: (total) => { check = new GgufCheck(total ?? undefined); },
      push: (chunk) => {
        try {
          check.push(chunk);
        } catch (e) {
          throw notGguf(e);
        }
      },
      onBytes: (loaded, total) => onProgress({ loaded, total }),
    });
    try {
      check.finish();
    } catch (e) {
      await r.entry?.abort();
      throw notGguf(e);
    }
  } catch (e) {
    if (isAbort(e)) throw new BlockdraftError('aborted', `the download of ${href} was aborted by its signal; nothing was cached`);
    throw e;
  } finally {
    check?.free();
  }
  if (r.from === 'cache') return { url: href, bytes: r.bytes, cached: true }; // stored meanwhile
  if (!r.entry || !(await r.entry.commit())) {
    throw new BlockdraftError('cache', `downloaded ${href} but could not store it (${r.entry?.why ?? r.why}); free space with modelCache.clear() or delete entries`);
  }
  return { url: href, bytes: r.bytes, cached: false };
}
