// Cloudflare Workers (workerd): the runtime compiles the imported .wasm file at deploy time,
// so it is instantiated synchronously here. No random values are drawn at load: Workers
// refuse to generate them outside a request handler.
import wasm from "./idem_wasm_bg.wasm";
import { initSync } from "./idem_wasm.js";

initSync({ module: wasm });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
