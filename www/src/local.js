// The engine on this thread, over the wasm module. The Web Worker runs this
// file's LocalEngine; `createEngine({ worker: false })` runs it in the page.

import init, { Engine, GgufBytes, take_panic_message } from '../pkg/blockdraft_wasm.js';
import { BlockdraftError, toBlockdraftError } from './errors.js';
import { readSource } from './source.js';

let ready = null;

function initWasm(wasmUrl) {
  ready ??= init(wasmUrl ? { module_or_path: wasmUrl } : undefined);
  return ready;
}

const asError = (e) => toBlockdraftError(e, take_panic_message);

// A model source as GgufBytes, reporting { phase: 'download', what, loaded, total }.
async function toGgufBytes(source, what, signal, onProgress) {
  let bytes = null;
  try {
    await readSource(source, {
      what,
      signal,
      onStart: (total) => { bytes = new GgufBytes(total ?? undefined); },
      push: (chunk) => bytes.push(chunk),
      onBytes: (loaded, total) => onProgress({ phase: 'download', what, loaded, total }),
    });
  } catch (e) {
    bytes?.free();
    throw e.name === 'AbortError' ? e : asError(e);
  }
  return bytes;
}

export class LocalEngine {
  #engine;
  #dead = null;

  constructor(engine) {
    this.#engine = engine;
  }

  // options: { model, drafter?, backend?, wasmUrl?, signal? }
  static async load(options, onProgress = () => {}) {
    const { model, drafter, backend = 'auto', wasmUrl, signal } = options;
    if (model === undefined || model === null) {
      throw new BlockdraftError('invalid_argument', 'createEngine needs a model (URL, Blob/File or ArrayBuffer)');
    }
    try {
      await initWasm(wasmUrl);
    } catch (e) {
      throw new BlockdraftError('internal', `cannot load blockdraft's WebAssembly module: ${e.message}`);
    }
    const modelBytes = await toGgufBytes(model, 'model', signal, onProgress);
    let drafterBytes;
    try {
      if (drafter !== undefined && drafter !== null && drafter !== 'ngram') {
        drafterBytes = await toGgufBytes(drafter, 'drafter', signal, onProgress);
      }
    } catch (e) {
      modelBytes.free();
      throw e;
    }
    try {
      const engine = await Engine.load(modelBytes, backend, drafterBytes, drafter === 'ngram',
        (loaded, total) => onProgress({ phase: 'upload', what: 'weights', loaded, total }));
      return new LocalEngine(engine);
    } catch (e) {
      throw asError(e);
    }
  }

  info() {
    return JSON.parse(this.#engine.info());
  }

  // Runs `request` (the wasm API's JSON fields); `onText(text)` gets each
  // piece; `isAborted()` is asked before each. Resolves to the usage.
  async generate(request, onText, isAborted) {
    if (this.#dead) throw this.#dead;
    try {
      const usage = await this.#engine.generate(JSON.stringify(request), (text) => {
        if (isAborted()) return false;
        onText(text);
        return true;
      });
      return JSON.parse(usage);
    } catch (e) {
      const err = asError(e);
      if (err.code === 'internal') this.#dead = err;
      throw err;
    }
  }

  unload() {
    this.#engine?.free();
    this.#engine = null;
    this.#dead = new BlockdraftError('unloaded', 'the engine was unloaded; create a new one');
  }
}
