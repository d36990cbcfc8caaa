// The wasm module, initialized once per thread: the engine (local.js) and
// the model cache's download check (source.js) share it.

import init, * as wasm from '../pkg/blockdraft_wasm.js';

let ready = null;

// Resolves to the module's exports (EngineBuilder, GgufCheck, ...).
export function initWasm(wasmUrl) {
  ready ??= init(wasmUrl ? { module_or_path: wasmUrl } : undefined).then(() => wasm, (e) => {
    ready = null; // a later call may try again
    throw e;
  });
  return ready;
}
