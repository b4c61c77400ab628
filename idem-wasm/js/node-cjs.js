// Node (CommonJS): bundled by esbuild into dist/node.cjs, next to the .wasm file.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { initSync } from "./idem_wasm.js";

// `__dirname` is CommonJS's own: this file only runs as the bundled dist/node.cjs.
initSync({ module: readFileSync(join(__dirname, "idem_wasm_bg.wasm")) });

export * from "./index.js";
