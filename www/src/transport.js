// Two ways to run the engine behind one interface:
//   { info, generate(request, onText, signal) -> Promise<usage>, unload() }
// WorkerEngine (default) runs it in a dedicated Web Worker; PageEngine on
// the calling thread. Requests run one at a time, in order.

import { LocalEngine } from './local.js';
import { prepareLoad } from './cache.js';
import { BlockdraftError, deserializeError } from './errors.js';

function serial() {
  let tail = Promise.resolve();
  return (task) => {
    const run = tail.then(task, task);
    tail = run.catch(() => {});
    return run;
  };
}

export class PageEngine {
  #engine;
  #queue = serial();

  static async create(options, onProgress) {
    const t = new PageEngine();
    const prepared = await prepareLoad(options, onProgress);
    try {
      t.#engine = await LocalEngine.load(prepared.options, prepared.onProgress);
    } finally {
      prepared.release();
    }
    t.info = t.#engine.info();
    return t;
  }

  generate(request, onText, signal) {
    return this.#queue(() => this.#engine.generate(request, onText, () => !!signal?.aborted));
  }

  // After the running request (freeing the module's engine under it would fail).
  unload() {
    return this.#queue(() => this.#engine.unload());
  }
}

export class WorkerEngine {
  #worker;
  #next = 1;
  #pending = new Map();
  #queue = serial();

  static async create(options, onProgress) {
    const { signal, ...rest } = options; // an AbortSignal cannot cross to the worker
    const aborted = () => new BlockdraftError('aborted', 'loading was aborted by its signal');
    if (signal?.aborted) throw aborted();
    const t = new WorkerEngine();
    t.#worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
    t.#worker.onmessage = ({ data }) => t.#onMessage(data);
    t.#worker.onerror = (e) => t.#failAll(new BlockdraftError('internal', `the engine's worker failed: ${e.message}`));
    // Ending the worker ends the load; the pending call must fail with it.
    const onAbort = () => { t.#worker.terminate(); t.#failAll(aborted()); };
    signal?.addEventListener('abort', onAbort);
    try {
      const { info } = await t.#call({ type: 'load', options: rest }, { onProgress });
      t.info = info;
    } catch (e) {
      t.#worker.terminate();
      throw signal?.aborted ? aborted() : e;
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
    return t;
  }

  #call(message, handlers = {}) {
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, ...handlers });
      this.#worker.postMessage({ ...message, id });
      handlers.onStart?.(id);
    });
  }

  #onMessage(m) {
    const p = this.#pending.get(m.id);
    if (!p) return;
    switch (m.type) {
      case 'progress': p.onProgress?.(m.progress); break;
      case 'text': p.onText?.(m.text); break;
      case 'done': this.#pending.delete(m.id); p.resolve(m); break;
      case 'error': this.#pending.delete(m.id); p.reject(deserializeError(m.error)); break;
    }
  }

  #failAll(err) {
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
  }

  generate(request, onText, signal) {
    return this.#queue(async () => {
      let id = null;
      const onAbort = () => { if (id !== null) this.#worker.postMessage({ type: 'abort', id }); };
      signal?.addEventListener('abort', onAbort);
      try {
        const { usage } = await this.#call({ type: 'generate', request }, {
          onText,
          onStart: (i) => { id = i; if (signal?.aborted) onAbort(); },
        });
        return usage;
      } finally {
        signal?.removeEventListener('abort', onAbort);
      }
    });
  }

  // Ending the worker frees everything at once, even mid-request.
  async unload() {
    this.#worker.terminate();
    this.#failAll(new BlockdraftError('unloaded', 'the engine was unloaded; create a new one'));
  }
}
