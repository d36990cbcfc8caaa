// The engine on this thread, over the wasm module. The Web Worker runs this
// file's LocalEngine; `createEngine({ worker: false })` runs it in the page.

import init, { EngineBuilder, take_panic_message } from '../pkg/blockdraft_wasm.js';
import { BlockdraftError, toBlockdraftError } from './errors.js';
import { readSource, sourceParts } from './source.js';

let ready = null;

function initWasm(wasmUrl) {
  ready ??= init(wasmUrl ? { module_or_path: wasmUrl } : undefined);
  return ready;
}

const asError = (e) => toBlockdraftError(e, take_panic_message);

// Streams every part of `source` into the builder as `what`, reporting
// { phase: 'download', what, loaded, total, part, parts }.
async function streamInto(builder, what, source, signal, onProgress) {
  const parts = sourceParts(source);
  for (const [i, part] of parts.entries()) {
    await readSource(part, {
      what,
      signal,
      onStart: (total) => builder.begin(what, total ?? undefined),
      push: (chunk) => builder.push(chunk),
      onBytes: (loaded, total) => onProgress({ phase: 'download', what, loaded, total, part: i + 1, parts: parts.length }),
    });
    builder.end();
  }
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
    let builder;
    try {
      builder = await EngineBuilder.create(backend);
    } catch (e) {
      throw asError(e);
    }
    try {
      // Weights go to the backend tensor by tensor as they arrive.
      await streamInto(builder, 'model', model, signal, onProgress);
      const ngram = drafter === 'ngram';
      if (drafter !== undefined && drafter !== null && !ngram) {
        await streamInto(builder, 'drafter', drafter, signal, onProgress);
      }
      // build() consumes the builder, also when it fails.
      const b = builder;
      builder = null;
      return new LocalEngine(b.build(ngram));
    } catch (e) {
      builder?.free();
      throw e.name === 'AbortError' ? e : asError(e);
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
      if (err.code === 'device') {
        // The GPU is gone: free what is left now; later calls get this error.
        this.#engine.free();
        this.#engine = null;
        this.#dead = err;
      }
      throw err;
    }
  }

  unload() {
    this.#engine?.free();
    this.#engine = null;
    this.#dead = new BlockdraftError('unloaded', 'the engine was unloaded; create a new one');
  }
}
