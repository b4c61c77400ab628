// The ESM bundle, dist/idem_wasm.js: the generated glue and the whole API in one module.
// Entries initialise the module (initSync or init) and re-export the public names.
export { default, initSync } from "./idem_wasm.js";
export * from "./index.js";
