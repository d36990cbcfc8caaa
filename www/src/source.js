// Model sources (URL, Blob/File, ArrayBuffer or typed array) as a stream of
// byte chunks, so no single JS buffer has to hold a whole model.

import { BlockdraftError } from './errors.js';

const SLICE = 16 << 20;

// Calls `push(Uint8Array)` for every chunk; `onBytes(loaded, total)` after
// each (total is null when unknown). Returns the total when known up front.
export async function readSource(source, { what, signal, onStart, onBytes, push }) {
  if (typeof source === 'string' || source instanceof URL) {
    let res;
    try {
      res = await fetch(source, { signal });
    } catch (e) {
      if (e && e.name === 'AbortError') throw e;
      throw new BlockdraftError('network', `cannot download the ${what} from ${source}: ${e.message}; check the URL (and CORS headers for another origin)`);
    }
    if (!res.ok) {
      throw new BlockdraftError('network', `cannot download the ${what} from ${source}: HTTP ${res.status}; check the URL`);
    }
    // Content-Length is the size on the wire: only the file's size when not compressed.
    const len = res.headers.get('content-encoding') ? null : res.headers.get('content-length');
    const total = len !== null && /^\d+$/.test(len) ? Number(len) : null;
    onStart(total);
    const reader = res.body.getReader();
    let loaded = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      push(value);
      loaded += value.byteLength;
      onBytes(loaded, total);
    }
    return;
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
}
