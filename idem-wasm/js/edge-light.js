// Vercel Edge Functions and Next.js Edge routes and middleware (the `edge-light` condition):
// the runtime refuses to compile WebAssembly from bytes (WebAssembly.compile, or instantiate
// with a buffer), so the module is imported with the `?module` suffix, which their bundler
// turns into a WebAssembly.Module compiled at build time, and instantiated synchronously.
import wasm from "./idem_wasm_bg.wasm?module";
import { initSync } from "./idem_wasm.js";

initSync({ module: wasm });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
