// Node (ESM) and Deno: the module is read from disk and compiled synchronously.
import { readFileSync } from "node:fs";
import { initSync } from "./idem_wasm.js";

initSync({ module: readFileSync(new URL("./idem_wasm_bg.wasm", import.meta.url)) });

// The API: every name of the bundle imported above, and initSync, which returns at once once
// the module is instantiated.
export * from "./idem_wasm.js";
