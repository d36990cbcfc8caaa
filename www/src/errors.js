// Typed errors: every failure the package reports is a BlockdraftError with
// a `code` (see index.d.ts for the list) and a message that says what to do.

// `details` adds fields: `cachedUrls` (a load that failed on files read
// from the model cache).
export class BlockdraftError extends Error {
  constructor(code, message, details = {}) {
    super(message);
    this.name = 'BlockdraftError';
    this.code = code;
    if (details.cachedUrls) this.cachedUrls = details.cachedUrls;
  }
}

// Plain data, for postMessage between the worker and the page.
export function serializeError(e) {
  const err = toBlockdraftError(e);
  return { code: err.code, message: err.message, cachedUrls: err.cachedUrls };
}

export function deserializeError(d) {
  return new BlockdraftError(d.code, d.message, d);
}

// Errors from the wasm module carry name 'BlockdraftError' and a code; a
// trap (WebAssembly.RuntimeError) is a bug whose message the panic hook
// kept; anything else is wrapped as `internal`.
export function toBlockdraftError(e, panicMessage) {
  if (e instanceof BlockdraftError) return e;
  if (e && e.name === 'BlockdraftError' && typeof e.code === 'string') {
    return new BlockdraftError(e.code, e.message);
  }
  if (e && e.name === 'AbortError') {
    return new BlockdraftError('aborted', 'the operation was aborted by its signal');
  }
  if (typeof WebAssembly !== 'undefined' && e instanceof WebAssembly.RuntimeError) {
    const msg = (panicMessage && panicMessage()) || `WebAssembly trap: ${e.message}`;
    return new BlockdraftError('internal', `${msg}; this engine is unusable now, create a new one`);
  }
  return new BlockdraftError('internal', String(e && e.message ? e.message : e));
}
