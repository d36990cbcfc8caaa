// blockdraft in the browser: speculative LLM decoding on WebGPU or the CPU
// (WebAssembly), with an OpenAI-shaped API. See index.d.ts.

import { BlockdraftError } from './src/errors.js';
import { PageEngine, WorkerEngine } from './src/transport.js';
import { modelCache as cache } from './src/cache.js';
import { addToCache } from './src/source.js';

export { BlockdraftError };

/** The persistent model cache (see index.d.ts: ModelCache). */
export const modelCache = Object.freeze({
  list: () => cache.list(),
  size: () => cache.size(),
  has: (url) => cache.has(url),
  delete: (url) => cache.delete(url),
  clear: () => cache.clear(),
  add: (url, options) => addToCache(url, options),
});

// URL sources resolved against the page: the worker would resolve a relative
// URL against its own script, and a URL object cannot be posted to it.
function resolveUrl(source, what) {
  if (Array.isArray(source)) return source.map((part) => resolveUrl(part, what));
  if (typeof source !== 'string' && !(source instanceof URL)) return source;
  if (what === 'drafter' && source === 'ngram') return source;
  try {
    return new URL(source, globalThis.location?.href).href;
  } catch {
    throw new BlockdraftError('invalid_argument', `the ${what} URL ${source} is not a valid URL`);
  }
}

export async function createEngine(options = {}) {
  const { worker = true, onProgress = () => {}, ...rest } = options;
  rest.model = resolveUrl(rest.model, 'model');
  if (rest.drafter !== undefined && rest.drafter !== null) rest.drafter = resolveUrl(rest.drafter, 'drafter');
  const engine = worker
    ? await WorkerEngine.create(rest, onProgress)
    : await PageEngine.create(rest, onProgress);
  return new BlockdraftEngine(engine, rest.modelName ?? 'blockdraft');
}

const FIELDS = [
  'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'repeat_penalty', 'repeat_last_n', 'seed',
  'speculative', 'draft_max',
];

// The wasm request for OpenAI-style `params` (unknown fields are refused there).
function toRequest(kind, params) {
  if (!params || typeof params !== 'object') {
    throw new BlockdraftError('invalid_argument', 'create() needs a parameters object');
  }
  const request = {};
  if (kind === 'chat') {
    if (!Array.isArray(params.messages)) {
      throw new BlockdraftError('invalid_argument', 'chat.completions.create needs messages: [{ role, content }]');
    }
    request.messages = params.messages.map(({ role, content }) => ({ role, content }));
    // Opt-in: special-token text in content counts (trusted, pre-formatted content only).
    if (params.special_tokens_in_content !== undefined && params.special_tokens_in_content !== null) {
      request.special_tokens_in_content = params.special_tokens_in_content;
    }
  } else {
    if (typeof params.prompt !== 'string') {
      throw new BlockdraftError('invalid_argument', 'completions.create needs prompt: a string');
    }
    request.prompt = params.prompt;
  }
  for (const f of FIELDS) {
    if (params[f] !== undefined && params[f] !== null) request[f] = params[f];
  }
  if (params.stop !== undefined && params.stop !== null) {
    request.stop = Array.isArray(params.stop) ? params.stop : [params.stop];
  }
  return request;
}

function toUsage(u) {
  return {
    prompt_tokens: u.prompt_tokens,
    completion_tokens: u.completion_tokens,
    total_tokens: u.total_tokens,
    speculative: u.speculative,
    looping: u.looping,
    timings: {
      warmup_seconds: u.warmup_seconds,
      prefill_seconds: u.prefill_seconds,
      decode_seconds: u.decode_seconds,
      prefill_tokens_per_second: u.prefill_tokens_per_second,
      decode_tokens_per_second: u.decode_tokens_per_second,
    },
  };
}

// An async iterator fed by callbacks; ending it (abort) is immediate.
class ChunkQueue {
  #items = [];
  #waiting = null;
  #done = false;
  #error = null;

  push(item) {
    if (this.#done) return;
    if (this.#waiting) { this.#waiting.resolve({ value: item, done: false }); this.#waiting = null; }
    else this.#items.push(item);
  }

  end(error = null) {
    if (this.#done) return;
    this.#done = true;
    this.#error = error;
    if (this.#waiting) {
      const w = this.#waiting;
      this.#waiting = null;
      if (error) w.reject(error); else w.resolve({ value: undefined, done: true });
    }
  }

  next() {
    if (this.#items.length) return Promise.resolve({ value: this.#items.shift(), done: false });
    if (this.#done) {
      const error = this.#error;
      this.#error = null;
      return error ? Promise.reject(error) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => { this.#waiting = { resolve, reject }; });
  }

  return() {
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() { return this; }
}

class BlockdraftEngine {
  #engine;
  #model;

  constructor(engine, model) {
    this.#engine = engine;
    this.#model = model;
    this.info = engine.info;
    this.chat = { completions: { create: (params) => this.#create('chat', params) } };
    this.completions = { create: (params) => this.#create('text', params) };
  }

  async #create(kind, params) {
    const request = toRequest(kind, params);
    const { signal } = params;
    const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${Math.random().toString(36).slice(2, 14)}`;
    const created = Math.floor(Date.now() / 1000);
    const base = { id, object: kind === 'chat' ? 'chat.completion.chunk' : 'text_completion', created, model: this.#model };
    const choice = (text, finish_reason, first) => (kind === 'chat'
      ? { index: 0, delta: text === null ? {} : (first ? { role: 'assistant', content: text } : { content: text }), finish_reason }
      : { index: 0, text: text ?? '', finish_reason });
    if (signal?.aborted) throw new DOMException('the request was aborted', 'AbortError');

    if (params.stream) {
      const queue = new ChunkQueue();
      let first = true;
      const onText = (text) => { queue.push({ ...base, choices: [choice(text, null, first)] }); first = false; };
      const onAbort = () => queue.end();
      signal?.addEventListener('abort', onAbort);
      this.#engine.generate(request, onText, signal).then(
        (u) => {
          queue.push({ ...base, choices: [choice(null, u.finish_reason, false)], usage: toUsage(u) });
          queue.end();
        },
        (e) => queue.end(e),
      ).finally(() => signal?.removeEventListener('abort', onAbort));
      return queue;
    }

    let text = '';
    const u = await new Promise((resolve, reject) => {
      const onAbort = () => reject(new DOMException('the request was aborted', 'AbortError'));
      signal?.addEventListener('abort', onAbort);
      this.#engine.generate(request, (t) => { text += t; }, signal).then(resolve, reject)
        .finally(() => signal?.removeEventListener('abort', onAbort));
    });
    const message = kind === 'chat'
      ? { index: 0, message: { role: 'assistant', content: text }, finish_reason: u.finish_reason }
      : { index: 0, text, finish_reason: u.finish_reason };
    return { ...base, object: kind === 'chat' ? 'chat.completion' : 'text_completion', choices: [message], usage: toUsage(u) };
  }

  unload() {
    return this.#engine.unload();
  }
}
