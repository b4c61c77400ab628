// Browsers, bundlers and other ESM runtimes: the module is fetched next to this file (a
// bundler rewrites the URL) and instantiated with top-level await.
import init from "./idem_wasm.js";

await init({ module_or_path: new URL("./idem_wasm_bg.wasm", import.meta.url) });

// The API: every name of the bundle imported above, and initSync, which returns at once once
// the module is instantiated.
export * from "./idem_wasm.js";
