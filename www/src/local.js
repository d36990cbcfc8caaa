// The engine on this thread, over the wasm module. The Web Worker runs this
// file's LocalEngine; `createEngine({ worker: false })` runs it in the page.

import { take_panic_message } from '../pkg/blockdraft_wasm.js';
import { BlockdraftError, toBlockdraftError } from './errors.js';
import { readSource, sourceParts } from './source.js';
import { initWasm } from './wasm.js';

const asError = (e) => toBlockdraftError(e, take_panic_message);

// Streams every part of `source` into the builder as `what`, reporting
// { phase: 'download', what, loaded, total, part, parts }. Each file read
// gets a record in `files`: { what, url, cached, entry, done } (`entry`: a
// download to commit to the model cache once the whole load succeeded).
async function streamInto(builder, what, source, signal, onProgress, files) {
  const parts = sourceParts(source);
  for (const [i, part] of parts.entries()) {
    const file = { what, url: null, cached: false, entry: null, done: false };
    files.push(file);
    const read = await readSource(part, {
      what,
      signal,
      onUrl: ({ url, cached }) => { file.url = url; file.cached = cached; },
      onStart: (total) => builder.begin(what, total ?? undefined),
      push: (chunk) => builder.push(chunk),
      onBytes: (loaded, total) => onProgress({ phase: 'download', what, loaded, total, part: i + 1, parts: parts.length }),
    });
    file.entry = read?.entry ?? null;
    builder.end();
    file.done = true;
  }
}

// Codes of a load failure that a bad file can cause.
const FILE_CODES = new Set(['bad_gguf', 'unsupported_model', 'cache']);

// A failed load that read files from the model cache: the error says so and
// lists them in `cachedUrls`, so the page can drop them (modelCache.delete)
// and load again. The suspects are the file being read when it failed, or
// every file when it failed after all were read.
function fromCache(err, files) {
  if (!FILE_CODES.has(err.code)) return err;
  const pending = files.filter((f) => !f.done);
  const urls = (pending.length ? pending : files).filter((f) => f.cached).map((f) => f.url);
  if (!urls.length) return err;
  const which = urls.length === 1 ? `the cached copy of ${urls[0]}` : `the cached copies of ${urls.join(', ')}`;
  return new BlockdraftError(err.code, `${err.message}. This was read from the model cache: ${which} may be `
    + 'a failed or damaged download; delete it (modelCache.delete(url), the URLs are in error.cachedUrls) and load again',
  { cachedUrls: urls });
}

export class LocalEngine {
  #engine;
  #dead = null;

  constructor(engine) {
    this.#engine = engine;
  }

  // options: { model, drafter?, backend?, kvType?, wasmUrl?, signal? }
  static async load(options, onProgress = () => {}) {
    const { model, drafter, backend = 'auto', kvType = 'f16', wasmUrl, signal } = options;
    if (model === undefined || model === null) {
      throw new BlockdraftError('invalid_argument', 'createEngine needs a model (URL, Blob/File or ArrayBuffer)');
    }
    let wasm;
    try {
      wasm = await initWasm(wasmUrl);
    } catch (e) {
      throw new BlockdraftError('internal', `cannot load blockdraft's WebAssembly module: ${e.message}`);
    }
    let builder;
    try {
      builder = await wasm.EngineBuilder.create(backend);
    } catch (e) {
      throw asError(e);
    }
    const files = [];
    let engine;
    try {
      // Weights go to the backend tensor by tensor as they arrive.
      await streamInto(builder, 'model', model, signal, onProgress, files);
      const ngram = drafter === 'ngram';
      if (drafter !== undefined && drafter !== null && !ngram) {
        await streamInto(builder, 'drafter', drafter, signal, onProgress, files);
      }
      // build() consumes the builder, also when it fails.
      const b = builder;
      builder = null;
      engine = new LocalEngine(b.build(ngram, String(kvType)));
    } catch (e) {
      builder?.free();
      // Downloads become cache entries only when the load succeeds.
      await Promise.all(files.map((f) => f.entry?.abort()));
      throw e.name === 'AbortError' ? e : fromCache(asError(e), files);
    }
    // A failure to store costs the entry, never the load.
    await Promise.all(files.map((f) => f.entry?.commit()));
    return engine;
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
