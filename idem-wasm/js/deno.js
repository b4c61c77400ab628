// Deno: the module is imported in the source phase (`import source`, Deno 2.6 and later),
// so Deno loads and compiles it as part of the module graph. Unlike reading the file, this
// needs no --allow-read permission.
import source wasm from "./idem_wasm_bg.wasm";
import { initSync } from "./idem_wasm.js";

initSync({ module: wasm });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
