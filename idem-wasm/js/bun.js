// Bun: the module is imported as a file (`with { type: "file" }`), so that `bun build` copies
// it next to the bundle and `bun build --compile` embeds it in the executable; the import
// gives its path (absolute when run from node_modules or compiled, relative to the bundle's
// directory once bundled), read and compiled synchronously.
import wasmPath from "./idem_wasm_bg.wasm" with { type: "file" };
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { initSync } from "./idem_wasm.js";

initSync({ module: readFileSync(resolve(import.meta.dirname, wasmPath)) });

// The API: every name of the bundle imported above, and initSync, which does nothing when the
// module is already instantiated.
export * from "./idem_wasm.js";
