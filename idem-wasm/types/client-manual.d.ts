// Types of `idem/client/manual`: the client's API without initialisation. The host
// instantiates the client's WebAssembly module (`idem/idem_client_bg.wasm`) itself, once,
// before the first call; `initSync` and `init` take what they take for `idem/manual`.
export * from "./client.js";
export { default, initSync, type InitInput, type SyncInitInput } from "./manual.js";
