// Node (ESM) and Deno: the module is read from disk and compiled synchronously.
import { readFileSync } from "node:fs";
import { initSync } from "./idem_wasm.js";

initSync({ module: readFileSync(new URL("./idem_wasm_bg.wasm", import.meta.url)) });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
