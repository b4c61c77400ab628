// Types of `idem/manual`: the API without initialisation. The host instantiates the
// WebAssembly module itself, once, before the first call.
export * from "./index.js";

/** What `initSync` takes: the compiled module (a `WebAssembly.Module`, for hosts that
 * compile or import it themselves) or its bytes (`dist/idem_wasm_bg.wasm`, exported as
 * `idem/idem_wasm_bg.wasm`). */
export type SyncInitInput = BufferSource | WebAssembly.Module;

/** What `init` takes: as `initSync`, or where to fetch the module from. */
export type InitInput = RequestInfo | URL | Response | BufferSource | WebAssembly.Module;

/** Instantiates the module synchronously. Later calls (or a call after the main entry
 * initialised it) return at once. */
export function initSync(options: { module: SyncInitInput }): unknown;

/** Instantiates the module asynchronously: fetched when given a URL, a string or a
 * `Request`, compiled when given bytes; without `module_or_path`, fetched from next to the
 * package's JavaScript file. Later calls (or a call after the main entry initialised it)
 * return at once. */
export default function init(options?: { module_or_path?: InitInput | Promise<InitInput> }): Promise<unknown>;
