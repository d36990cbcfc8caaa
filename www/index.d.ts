// Types of the blockdraft npm package (index.js).

/** One GGUF file: a URL (fetched as a stream), a Blob/File, or bytes. */
export type FileSource = string | URL | Blob | ArrayBuffer | ArrayBufferView;

/**
 * A GGUF model: one file, or the parts of a split set in order (llama.cpp's
 * gguf-split). The URL of a first part, `…-00001-of-0000N.gguf`, stands for
 * all N parts beside it. The model's tensors go to the device one by one
 * as they arrive, so the file is never whole in WebAssembly memory.
 */
export type ModelSource = FileSource | FileSource[];

export interface LoadProgress {
  /** Bytes of a file read (and, for the model, made resident as they arrive). */
  phase: 'download';
  what: 'model' | 'drafter';
  /** Bytes of this file (part) so far. */
  loaded: number;
  /** `null` when the server gives no length. */
  total: number | null;
  /** This file's number (from 1) among the `parts` of a split set (1 for one file). */
  part: number;
  parts: number;
  /** Download events of a URL source: `true` when the file is read from the model cache. */
  cached?: boolean;
}

export interface EngineOptions {
  model: ModelSource;
  /** A drafter GGUF (DFlash, or a small model of the same vocabulary) or `"ngram"` (prompt lookup). */
  drafter?: ModelSource | 'ngram';
  /** `auto` (default): WebGPU, else the CPU. `webgpu` fails with code `no_webgpu` when there is no adapter. */
  backend?: 'auto' | 'webgpu' | 'cpu';
  /**
   * The KV cache's element type: `f16` (default: half the memory, and
   * llama.cpp's default, as the CLI's) or `f32` (the precise one). Other
   * values fail with code `invalid_argument`.
   */
  kvType?: 'f16' | 'f32';
  onProgress?: (p: LoadProgress) => void;
  /** Run in a dedicated Web Worker (default true); false runs on the calling thread. */
  worker?: boolean;
  /** Aborts loading (download included). */
  signal?: AbortSignal;
  /** The `model` field of responses (default `blockdraft`). */
  modelName?: string;
  /** Where blockdraft_wasm_bg.wasm is, if not beside pkg/blockdraft_wasm.js. */
  wasmUrl?: string | URL;
  /**
   * Keep URL models in the persistent model cache (default true): a cached
   * URL is read from disk (offline too), any other is stored as it
   * downloads. `false` neither reads nor writes the cache. Relative URLs
   * are resolved against the page.
   */
  cache?: boolean;
}

export interface EngineInfo {
  backend: 'webgpu' | 'cpu';
  /** Backend and adapter description. */
  device: string;
  drafter: 'none' | 'ngram' | 'dflash' | 'draft-model';
  kv_type: 'f16' | 'f32';
  has_chat_template: boolean;
  n_ctx_train: number;
  /** Seconds from choosing the backend to the engine being ready (download and uploads included). */
  load_seconds: number;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | string;
  content: string;
}

interface CommonParams {
  /** Default 256 (bounded by the model's context). */
  max_tokens?: number;
  /** 0 is greedy; default 1. */
  temperature?: number;
  /** 0..=1; default 1 (off). */
  top_p?: number;
  /** Default 0 (off). */
  top_k?: number;
  /** 0..=1; default 0 (off). */
  min_p?: number;
  /**
   * Penalty of tokens among the last `repeat_last_n`, 1..=2; default 1
   * (off). 1.1 keeps small models from looping.
   */
  repeat_penalty?: number;
  /**
   * Subtracted once from the logit of every token among the last
   * `repeat_last_n` (OpenAI's presence penalty), -2..=2; default 0 (off).
   */
  presence_penalty?: number;
  /**
   * Subtracted from a token's logit per occurrence among the last
   * `repeat_last_n` (OpenAI's frequency penalty), -2..=2; default 0 (off).
   */
  frequency_penalty?: number;
  /** How many recent tokens the penalties look at; default 64. */
  repeat_last_n?: number;
  /** Seeds the sampler (same seed, same text). */
  seed?: number;
  stop?: string | string[];
  /** Use the engine's drafter (default: when it has one). */
  speculative?: boolean;
  /** Most tokens drafted per round, 1..=64 (default 8). */
  draft_max?: number;
  /** Aborts promptly: a stream ends, a non-streamed call rejects with an AbortError. */
  signal?: AbortSignal;
}

export interface ChatParams extends CommonParams {
  /**
   * The conversation. Message content is plain text: special-token text in
   * it (`<|im_end|>`, `<start_of_turn>`...) stays text, so user input or a
   * retrieved document cannot end its turn or open a system turn; only the
   * chat template's own markers are special tokens. A role holding
   * special-token text fails with `invalid_argument`.
   */
  messages: ChatMessage[];
  stream?: boolean;
  /**
   * Parse special-token text inside message content as special tokens
   * (default false). Only for trusted, pre-formatted content: never for
   * anything a user or a document supplies.
   */
  special_tokens_in_content?: boolean;
}

export interface CompletionParams extends CommonParams {
  /** The raw prompt: its special-token text is parsed (the caller writes the markup). */
  prompt: string;
  stream?: boolean;
}

export interface SpeculativeUsage {
  drafter: string;
  rounds: number;
  drafted: number;
  accepted: number;
  acceptance_rate: number;
  /** Tokens committed per speculative round (accepted + 1). */
  tau: number;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  speculative: SpeculativeUsage | null;
  /** The output ends in a loop (the same few tokens again and again); `repeat_penalty: 1.1` usually helps. */
  looping: boolean;
  timings: {
    /**
     * The engine's first request only: a one-token pass before the prompt
     * (weight repacking, shader compilation), so that the prefill figures
     * are the prompt's own; 0 afterwards.
     */
    warmup_seconds: number;
    prefill_seconds: number;
    decode_seconds: number;
    prefill_tokens_per_second: number;
    decode_tokens_per_second: number;
  };
}

export type FinishReason = 'stop' | 'length' | 'abort';

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: [{ index: 0; delta: { role?: 'assistant'; content?: string }; finish_reason: FinishReason | null }];
  /** Only on the last chunk. */
  usage?: Usage;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: [{ index: 0; message: { role: 'assistant'; content: string }; finish_reason: FinishReason }];
  usage: Usage;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: [{ index: 0; text: string; finish_reason: FinishReason | null }];
  /** Only on the last chunk of a stream; always when not streamed. */
  usage?: Usage;
}

export interface Engine {
  readonly info: EngineInfo;
  chat: {
    completions: {
      create(params: ChatParams & { stream: true }): Promise<AsyncIterableIterator<ChatCompletionChunk>>;
      create(params: ChatParams & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  completions: {
    create(params: CompletionParams & { stream: true }): Promise<AsyncIterableIterator<Completion>>;
    create(params: CompletionParams & { stream?: false }): Promise<Completion>;
  };
  /** Frees the model (ends the worker). The engine is unusable afterwards. */
  unload(): Promise<void>;
}

export type ErrorCode =
  | 'invalid_argument'
  | 'bad_gguf'
  | 'unsupported_model'
  | 'no_webgpu'
  | 'device'
  | 'out_of_memory'
  | 'busy'
  | 'generation'
  | 'network'
  | 'aborted'
  | 'unloaded'
  /** The model cache cannot be used (no OPFS nor Cache Storage, storage full or blocked, an unreadable entry). */
  | 'cache'
  | 'internal';

/** Every failure is one of these; `message` says what to do. */
export class BlockdraftError extends Error {
  readonly name: 'BlockdraftError';
  readonly code: ErrorCode;
  /**
   * Set when `createEngine` failed (`bad_gguf`, `unsupported_model`,
   * `cache`) on files read from the model cache: their URLs. The cached
   * copy may be a failed or damaged download; `modelCache.delete` each and
   * load again to download them afresh.
   */
  readonly cachedUrls?: string[];
  constructor(code: ErrorCode, message: string, details?: { cachedUrls?: string[] });
}

export function createEngine(options: EngineOptions): Promise<Engine>;

export interface CachedModel {
  /** The absolute URL the model was loaded from. */
  url: string;
  bytes: number;
}

/**
 * The persistent model cache: OPFS, or Cache Storage where OPFS is missing;
 * the same from the page and from the engine's worker. Entries are keyed by
 * absolute URL and never revalidated: delete one to download it again.
 * Failures are BlockdraftErrors with code `cache`.
 */
export interface ModelCache {
  /**
   * Complete entries only: a download becomes an entry once the file
   * loaded (or, for `add`, parsed as a whole GGUF file of its announced
   * length), so an interrupted or failed download (an empty body, an error
   * page) leaves none.
   */
  list(): Promise<CachedModel[]>;
  /** Total bytes of the entries. */
  size(): Promise<number>;
  has(url: string | URL): Promise<boolean>;
  /** Removes the entry; `true` when there was one. */
  delete(url: string | URL): Promise<boolean>;
  clear(): Promise<void>;
  /**
   * Downloads a model into the cache without loading it (nothing when it
   * is there). `cached`: it was there before. The download is checked as a
   * GGUF file by the WebAssembly module (loaded for it if needed). Code
   * `bad_gguf` when the download is not a whole GGUF file (nothing is
   * stored), `cache` when it cannot be stored (no storage, quota),
   * `network` when it cannot be downloaded.
   */
  add(url: string | URL, options?: {
    signal?: AbortSignal;
    onProgress?: (p: { loaded: number; total: number | null }) => void;
    /** Where blockdraft_wasm_bg.wasm is, as in createEngine. */
    wasmUrl?: string | URL;
  }): Promise<CachedModel & { cached: boolean }>;
}

export const modelCache: ModelCache;
