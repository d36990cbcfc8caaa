// The dedicated Web Worker: runs a LocalEngine and talks to WorkerEngine
// (transport.js) by messages, so generation never blocks the page.

import { LocalEngine } from './local.js';
import { prepareLoad } from './cache.js';
import { serializeError } from './errors.js';

let engine = null;
// Requests running or queued here, and those the page aborted.
const active = new Set();
const aborted = new Set();

async function handle(m) {
  switch (m.type) {
    case 'load': {
      const post = (progress) => postMessage({ type: 'progress', id: m.id, progress });
      const { options, onProgress, release } = await prepareLoad(m.options, post);
      try {
        engine = await LocalEngine.load(options, onProgress);
      } finally {
        release();
      }
      return { info: engine.info() };
    }
    case 'generate': {
      active.add(m.id);
      try {
        const onText = (text) => postMessage({ type: 'text', id: m.id, text });
        const usage = await engine.generate(m.request, onText, () => aborted.has(m.id));
        return { usage };
      } finally {
        active.delete(m.id);
        aborted.delete(m.id);
      }
    }
    default:
      throw new Error(`unknown message ${m.type}`);
  }
}

self.onmessage = ({ data: m }) => {
  if (m.type === 'abort') {
    if (active.has(m.id)) aborted.add(m.id);
    return;
  }
  handle(m).then(
    (result) => postMessage({ type: 'done', id: m.id, ...result }),
    (e) => postMessage({ type: 'error', id: m.id, error: serializeError(e) }),
  );
};
