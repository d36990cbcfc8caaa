// The model cache's two stores, each with one interface:
//   lookup(url) -> { bytes, chunks(signal) } | null, writer(url) ->
//   { write(chunk), commit(bytes), abort() }, entries() -> [{ url, bytes }],
//   remove(url) -> boolean, clear(), available() -> boolean.
// An entry is complete only once its metadata { url, bytes } exists: the data
// is written first (committed only when the download ends), the metadata last,
// and starting a download deletes the old metadata first.

const NAME = 'blockdraft-models';
const META = 'blockdraft-models-meta';
const SLICE = 16 << 20;
// Bytes gathered before one OPFS write: fewer, larger writes.
const BATCH = 4 << 20;

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
export const opfs = {
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
export const cacheStorage = {
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
