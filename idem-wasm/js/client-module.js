// The client's WebAssembly module: how it is instantiated, and its one entry point. The module
// has no imports and three exports beside its memory (src/exports.rs is the other end):
// `alloc(len)` makes room for a call's input, `call(op, at, len)` runs an operation on it and
// answers where its answer is (a u32 length, little-endian, then the bytes), and
// `free(answer, len)` frees that answer once copied. Each bundle that includes this file has
// its own instance: a browser page's lean module and, when it needs it, the full one.

let wasm;

/** `{ module }` or the value itself, as the `idem/manual` initialisers take it. */
const unwrap = (input, name) => (input?.constructor === Object ? input[name] : input);

/** Instantiates the module synchronously from its bytes or its compiled `WebAssembly.Module`,
 * once; later calls keep the first instance. */
export function initSync(module) {
  module = unwrap(module, "module");
  wasm ??= new WebAssembly.Instance(module instanceof WebAssembly.Module ? module : new WebAssembly.Module(module)).exports;
  return wasm;
}

/** Instantiates the module asynchronously, once (later calls return at once), from a URL, a
 * `Request`, a `Response`, its bytes or its compiled `WebAssembly.Module` (or a promise of
 * one), compiled from its bytes; by default the `idem_client_bg.wasm` beside this file. */
export default async function init(source) {
  if (wasm !== undefined) return wasm;
  source = unwrap(source, "module_or_path") ?? new URL("./idem_client_bg.wasm", import.meta.url);
  if (typeof source === "string" || source instanceof URL || (typeof Request === "function" && source instanceof Request)) source = fetch(source);
  source = await source;
  if (typeof Response === "function" && source instanceof Response) source = await moduleBytes(source);
  const made = await WebAssembly.instantiate(source);
  wasm ??= (made.instance ?? made).exports;
  return wasm;
}

/** The module's bytes from `response`, the `Response` (or a promise of it) that fetched it. */
export async function moduleBytes(response) {
  response = await response;
  if (!response.ok) throw new Error(`failed to fetch the client's WebAssembly module: ${response.status} ${response.url}`);
  return response.arrayBuffer();
}

/** Runs operation `op` (ClientOp) on `input`, its arguments' bytes: its answer's bytes.
 * Addresses cross as i32, which JavaScript reads signed: `>>> 0` reads them as the
 * unsigned addresses they are (a heap past 2 GiB). */
export function call(op, input) {
  const at = wasm.alloc(input.length) >>> 0;
  new Uint8Array(wasm.memory.buffer, at, input.length).set(input);
  const answer = wasm.call(op, at, input.length) >>> 0;
  const length = new DataView(wasm.memory.buffer).getUint32(answer, true);
  const bytes = new Uint8Array(wasm.memory.buffer, answer + 4, length).slice();
  wasm.free(answer, length + 4);
  return bytes;
}
