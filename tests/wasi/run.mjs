// Cargo runner for wasm32-wasip1 test binaries: runs the .wasm under Node's
// WASI with the host's cwd visible, passing the test harness's arguments.
// Used as CARGO_TARGET_WASM32_WASIP1_RUNNER (see tests/run.sh).
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import process from "node:process";

const [wasmPath, ...args] = process.argv.slice(2);
const wasi = new WASI({
  version: "preview1",
  args: [wasmPath, ...args],
  env: process.env,
  preopens: { ".": process.cwd() },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(wasmPath));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
