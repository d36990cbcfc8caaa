// The blockdraft demo: load a model (URL or file, optional drafter), chat
// with streamed output and live statistics, compare speculative with plain
// decoding, manage the model cache. Plain DOM, no dependencies.
import { createEngine, modelCache } from '../index.js';

const $ = (id) => document.getElementById(id);
const ui = {
  loadForm: $('load-form'), modelUrl: $('model-url'), modelFile: $('model-file'),
  drafterKind: $('drafter-kind'), drafterUrl: $('drafter-url'), drafterFile: $('drafter-file'),
  backend: $('backend'), useCache: $('use-cache'), load: $('load'), cancelLoad: $('cancel-load'), unload: $('unload'),
  progress: $('progress'), loadStatus: $('load-status'), offline: $('offline'),
  transcript: $('transcript'), chatForm: $('chat-form'), prompt: $('prompt'), temperature: $('temperature'),
  repeatPenalty: $('repeat-penalty'), loadTime: $('stat-load'), loop: $('stat-loop'),
  maxTokens: $('max-tokens'), speculative: $('speculative'), send: $('send'), stop: $('stop'), compare: $('compare'),
  newChat: $('new-chat'), tps: $('stat-tps'), acceptance: $('stat-acceptance'), tau: $('stat-tau'),
  tokens: $('stat-tokens'), prefill: $('stat-prefill'), compareResult: $('compare-result'),
  cacheTotal: $('cache-total'), cacheBody: document.querySelector('#cache-table tbody'),
  cacheRefresh: $('cache-refresh'), cacheClear: $('cache-clear'),
};

let engine = null;
let history = []; // the conversation: { role, content }
let running = null; // the AbortController of the load or generation in progress

const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;
const modelKind = () => document.querySelector('input[name=model-kind]:checked').value;

function setState(state) {
  document.body.dataset.state = state;
  const busy = state === 'loading' || state === 'generating';
  ui.load.disabled = busy;
  ui.cancelLoad.disabled = state !== 'loading';
  ui.unload.disabled = !engine || busy;
  ui.send.disabled = ui.compare.disabled = !engine || busy;
  ui.stop.disabled = state !== 'generating';
}

function showError(where, e) {
  where.textContent = e?.code ? `${e.message} (${e.code})` : String(e?.message ?? e);
  where.classList.add('error');
}

function toggleSources() {
  for (const el of document.querySelectorAll('[data-when-model]')) el.hidden = el.dataset.whenModel !== modelKind();
  for (const el of document.querySelectorAll('[data-when-drafter]')) el.hidden = el.dataset.whenDrafter !== ui.drafterKind.value;
}

function fileOrUrl(kind, urlInput, fileInput, what) {
  if (kind === 'file') {
    const files = [...fileInput.files];
    if (files.length === 0) throw new Error(`Choose a ${what} file first.`);
    // Several files: the parts of a split set, in name order (…-00001-of-…).
    if (files.length === 1) return files[0];
    return files.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }
  const url = urlInput.value.trim();
  if (!url) throw new Error(`Enter the ${what}'s URL first.`);
  return url;
}

// --- loading -------------------------------------------------------------

function onProgress(p) {
  const part = p.parts > 1 ? ` part ${p.part} of ${p.parts}` : '';
  const label = `${{ model: 'Model', drafter: 'Drafter' }[p.what] ?? p.what}${part}`;
  const verb = p.cached ? 'reading from the model cache' : 'downloading';
  if (p.total) { ui.progress.max = p.total; ui.progress.value = p.loaded; } else ui.progress.removeAttribute('value');
  ui.progress.dataset.cached = String(!!p.cached);
  ui.loadStatus.textContent = `${label}: ${verb}, ${mb(p.loaded)}${p.total ? ` of ${mb(p.total)}` : ''}`;
  if (p.phase === 'download') ui.loadStatus.dataset.source = p.cached ? 'cache' : 'network';
}

async function load(event) {
  event.preventDefault();
  ui.loadStatus.classList.remove('error');
  let model;
  let drafter;
  try {
    model = fileOrUrl(modelKind(), ui.modelUrl, ui.modelFile, 'model');
    const kind = ui.drafterKind.value;
    if (kind === 'ngram') drafter = 'ngram';
    else if (kind !== 'none') drafter = fileOrUrl(kind, ui.drafterUrl, ui.drafterFile, 'drafter');
  } catch (e) {
    showError(ui.loadStatus, e);
    return;
  }
  if (typeof model === 'string') localStorage.setItem('blockdraft-demo-model', model);
  const old = engine;
  engine = null;
  running = new AbortController();
  setState('loading');
  await old?.unload();
  delete ui.loadStatus.dataset.source;
  // Ask the browser not to evict cached models under storage pressure.
  if (ui.useCache.checked) navigator.storage?.persist?.().catch(() => {});
  const started = performance.now();
  try {
    engine = await createEngine({
      model, drafter, backend: ui.backend.value, cache: ui.useCache.checked, signal: running.signal, onProgress,
      modelName: typeof model === 'string' ? model.split('/').pop() : model.name,
    });
    const { info } = engine;
    const seconds = (performance.now() - started) / 1000;
    // info.device already names the backend: "cpu (1 thread, simd128)", "wgpu (adapter)".
    ui.loadStatus.textContent = `Ready in ${seconds.toFixed(1)} s: ${info.device}, drafter ${info.drafter}`
      + `${ui.loadStatus.dataset.source === 'cache' ? ', model read from the model cache' : ''}.`;
    ui.progress.value = ui.progress.max;
    ui.speculative.disabled = info.drafter === 'none';
    // Load (download, uploads) and the first request's warm-up (weight
    // repacking, shader compilation) are shown apart, so that Prefill is
    // the prompt's own.
    ui.loadTime.textContent = `${info.load_seconds.toFixed(1)} s`;
    if (!info.has_chat_template) addNote('This model has no chat template: chat uses a plain "User: … / Assistant:" prompt.');
  } catch (e) {
    showError(ui.loadStatus, e);
    if (e?.cachedUrls?.length) offerDrop(e.cachedUrls);
  } finally {
    running = null;
    setState(engine ? 'ready' : 'idle');
    document.body.dataset.loads = String(Number(document.body.dataset.loads ?? 0) + 1);
    refreshCache();
  }
}

// A load failed on files read from the model cache (a failed download that
// an older version cached, a damaged entry): offer to drop them and retry.
function offerDrop(urls) {
  const button = document.createElement('button');
  button.type = 'button';
  button.id = 'drop-cached';
  button.textContent = urls.length === 1 ? 'Delete the cached copy and load again' : 'Delete the cached copies and load again';
  button.onclick = async () => {
    button.disabled = true;
    try {
      for (const url of urls) await modelCache.delete(url);
    } catch (e) {
      showError(ui.loadStatus, e);
      return;
    }
    ui.loadForm.requestSubmit();
  };
  ui.loadStatus.append(' ', button);
}

// --- chat ----------------------------------------------------------------

function addMessage(role, text = '') {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  const who = document.createElement('span');
  who.className = 'who';
  who.textContent = role === 'user' ? 'You' : 'Assistant';
  const body = document.createElement('span');
  body.className = 'text';
  body.textContent = text;
  div.append(who, body);
  ui.transcript.append(div);
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
  return body;
}

function addNote(text) {
  const p = document.createElement('p');
  p.className = 'msg note';
  p.textContent = text;
  ui.transcript.append(p);
}

function params() {
  return {
    temperature: Number(ui.temperature.value),
    repeat_penalty: Number(ui.repeatPenalty.value),
    max_tokens: Math.max(1, Math.floor(Number(ui.maxTokens.value))),
  };
}

// A model without a chat template gets the conversation as plain text, and
// stops where it would start the user's next turn.
function plainPrompt(messages) {
  const who = { system: 'System', user: 'User', assistant: 'Assistant' };
  const lines = messages.map((m) => `${who[m.role] ?? m.role}: ${m.content}`);
  return `${lines.join('\n')}\nAssistant:`;
}

// Streams one chat completion; `onText` gets each piece, `onTick` the live
// tokens/s. Resolves to { text, usage, finish_reason }.
async function stream(messages, extra, onText, onTick = () => {}) {
  let text = '';
  let usage = null;
  let finish = null;
  let pieces = 0;
  let first = 0;
  const request = { stream: true, signal: running.signal, ...params(), ...extra };
  const chunks = engine.info.has_chat_template
    ? await engine.chat.completions.create({ messages, ...request })
    : await engine.completions.create({ prompt: plainPrompt(messages), stop: ['\nUser:'], ...request });
  for await (const chunk of chunks) {
    const c = chunk.choices[0];
    const piece = c.delta ? c.delta.content : c.text;
    if (piece) {
      text += piece;
      onText(piece);
      pieces += 1;
      first ||= performance.now();
      const s = (performance.now() - first) / 1000;
      if (s > 0) onTick(pieces / s);
    }
    if (c.finish_reason) finish = c.finish_reason;
    if (chunk.usage) usage = chunk.usage;
  }
  return { text, usage, finish_reason: running.signal.aborted ? 'abort' : finish };
}

function showUsage(u) {
  ui.tps.textContent = u.timings.decode_tokens_per_second.toFixed(1);
  ui.tokens.textContent = `${u.completion_tokens} (prompt ${u.prompt_tokens})`;
  ui.prefill.textContent = `${u.timings.prefill_tokens_per_second.toFixed(0)} tok/s`;
  const s = u.speculative;
  // Without a single draft (the policy kept speculation off) there is no
  // rate to show.
  const drafted = s && s.drafted > 0;
  ui.acceptance.textContent = !s ? 'off' : drafted ? `${(s.acceptance_rate * 100).toFixed(0)} % (${s.accepted}/${s.drafted})` : 'no drafts';
  ui.tau.textContent = drafted ? s.tau.toFixed(2) : '–';
  if (u.timings.warmup_seconds > 0) {
    ui.loadTime.textContent = `${engine.info.load_seconds.toFixed(1)} s + warm-up ${u.timings.warmup_seconds.toFixed(2)} s`;
  }
  ui.loop.textContent = u.looping ? 'loops (raise the repeat penalty)' : 'ok';
  ui.loop.classList.toggle('error', !!u.looping);
}

async function send(event) {
  event.preventDefault();
  const prompt = ui.prompt.value.trim();
  if (!prompt || !engine || running) return;
  ui.prompt.value = '';
  addMessage('user', prompt);
  history.push({ role: 'user', content: prompt });
  const out = addMessage('assistant');
  const reply = out.parentElement;
  reply.dataset.state = 'streaming';
  running = new AbortController();
  setState('generating');
  for (const el of [ui.acceptance, ui.tau, ui.tokens, ui.prefill, ui.loop]) el.textContent = '…';
  try {
    const r = await stream(history, { speculative: ui.speculative.checked && !ui.speculative.disabled },
      (t) => { out.textContent += t; ui.transcript.scrollTop = ui.transcript.scrollHeight; },
      (tps) => { ui.tps.textContent = `≈ ${tps.toFixed(1)}`; });
    history.push({ role: 'assistant', content: r.text });
    if (r.usage) showUsage(r.usage);
    reply.dataset.state = r.finish_reason ?? 'stop';
    if (r.finish_reason === 'abort') addNote('Stopped.');
  } catch (e) {
    reply.dataset.state = 'error';
    showError(out, e);
  } finally {
    running = null;
    setState('ready');
  }
}

// Runs the prompt (as a new one-message chat) plain and then speculative.
async function compare() {
  const prompt = ui.prompt.value.trim() || history.findLast((m) => m.role === 'user')?.content;
  if (!prompt || !engine || running) {
    ui.compareResult.textContent = 'Type a message to compare on.';
    return;
  }
  if (engine.info.drafter === 'none') {
    ui.compareResult.textContent = 'Load the model with a drafter to compare speculative with plain decoding.';
    return;
  }
  running = new AbortController();
  setState('generating');
  ui.compareResult.classList.remove('error');
  ui.compareResult.dataset.state = 'running';
  ui.compareResult.textContent = 'Comparing: plain decoding…';
  try {
    const messages = [{ role: 'user', content: prompt }];
    const plain = await stream(messages, { speculative: false }, () => {});
    ui.compareResult.textContent = 'Comparing: speculative decoding…';
    const spec = await stream(messages, { speculative: true }, () => {});
    if (!plain.usage || !spec.usage) throw new Error('Stopped.');
    const a = plain.usage.timings.decode_tokens_per_second;
    const b = spec.usage.timings.decode_tokens_per_second;
    const s = spec.usage.speculative;
    ui.compareResult.innerHTML = '';
    const p = document.createElement('p');
    p.textContent = `Plain ${a.toFixed(1)} tok/s, speculative ${b.toFixed(1)} tok/s: speedup ×${(b / a).toFixed(2)}`
      + (s ? ` (acceptance ${(s.acceptance_rate * 100).toFixed(0)} %, τ ${s.tau.toFixed(2)})` : ' (no drafter)')
      + `. Same text: ${plain.text === spec.text ? 'yes' : 'no'}.`;
    p.id = 'compare-summary';
    p.dataset.speedup = String(b / a);
    p.dataset.same = String(plain.text === spec.text);
    const details = document.createElement('details');
    const summary = document.createElement('summary');
    summary.textContent = 'Both outputs';
    const texts = [['Plain', plain.text], ['Speculative', spec.text]].map(([k, t]) => {
      const pre = document.createElement('pre');
      pre.textContent = `${k}: ${t}`;
      return pre;
    });
    details.append(summary, ...texts);
    ui.compareResult.append(p, details);
    ui.compareResult.dataset.state = 'done';
  } catch (e) {
    ui.compareResult.dataset.state = 'error';
    showError(ui.compareResult, e);
  } finally {
    running = null;
    setState('ready');
  }
}

// --- the model cache -------------------------------------------------------

async function refreshCache() {
  try {
    const entries = await modelCache.list();
    ui.cacheBody.replaceChildren(...entries.map(({ url, bytes }) => {
      const tr = document.createElement('tr');
      const del = document.createElement('button');
      del.type = 'button';
      del.textContent = 'Delete';
      del.setAttribute('aria-label', `Delete ${url} from the cache`);
      del.onclick = async () => { await modelCache.delete(url).catch((e) => showError(ui.cacheTotal, e)); refreshCache(); };
      const cells = [url, mb(bytes)].map((t) => { const td = document.createElement('td'); td.textContent = t; return td; });
      const td = document.createElement('td');
      td.append(del);
      tr.append(...cells, td);
      tr.dataset.url = url;
      tr.dataset.bytes = String(bytes);
      return tr;
    }));
    const total = await modelCache.size();
    ui.cacheTotal.classList.remove('error');
    ui.cacheTotal.textContent = entries.length ? `${entries.length} model(s), ${mb(total)} in all.` : 'No models cached.';
  } catch (e) {
    showError(ui.cacheTotal, e);
  }
}

// --- offline -----------------------------------------------------------------

async function registerServiceWorker() {
  if (!('serviceWorker' in navigator)) {
    ui.offline.textContent = 'This browser has no service workers: the demo needs the network to open.';
    return;
  }
  try {
    await navigator.serviceWorker.register('sw.js', { scope: '../', type: 'classic' });
    await navigator.serviceWorker.ready;
    // Active is not yet in control: clients.claim() follows activation.
    if (!navigator.serviceWorker.controller) {
      await new Promise((resolve) => {
        navigator.serviceWorker.addEventListener('controllerchange', resolve, { once: true });
        setTimeout(resolve, 5000);
      });
    }
    ui.offline.textContent = 'Works offline: the app is cached; loaded models stay in the model cache.';
    ui.offline.dataset.ready = 'true';
  } catch (e) {
    ui.offline.textContent = `Offline use is unavailable (${e.message}).`;
  }
}

// --- wiring --------------------------------------------------------------------

ui.modelUrl.value = localStorage.getItem('blockdraft-demo-model') ?? ui.modelUrl.value;
for (const r of document.querySelectorAll('input[name=model-kind]')) r.addEventListener('change', toggleSources);
ui.drafterKind.addEventListener('change', toggleSources);
ui.loadForm.addEventListener('submit', load);
ui.cancelLoad.addEventListener('click', () => running?.abort());
ui.unload.addEventListener('click', async () => {
  await engine?.unload();
  engine = null;
  ui.loadStatus.textContent = 'No model loaded.';
  setState('idle');
});
ui.chatForm.addEventListener('submit', send);
ui.prompt.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) ui.chatForm.requestSubmit(); });
ui.stop.addEventListener('click', () => running?.abort());
ui.compare.addEventListener('click', compare);
ui.newChat.addEventListener('click', () => { history = []; ui.transcript.replaceChildren(); });
ui.cacheRefresh.addEventListener('click', refreshCache);
ui.cacheClear.addEventListener('click', async () => { await modelCache.clear().catch((e) => showError(ui.cacheTotal, e)); refreshCache(); });
toggleSources();
setState('idle');
refreshCache();
registerServiceWorker();
