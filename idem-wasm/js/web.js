// Browsers, bundlers and other ESM runtimes: the module is fetched next to this file (a
// bundler rewrites the URL) and instantiated with top-level await.
import init from "./idem_wasm.js";

await init({ module_or_path: new URL("./idem_wasm_bg.wasm", import.meta.url) });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
