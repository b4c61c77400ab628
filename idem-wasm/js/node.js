// Node (ESM) and Deno: the module is read from disk and compiled synchronously.
import { readFileSync } from "node:fs";
import { initSync } from "./idem_wasm.js";

initSync({ module: readFileSync(new URL("./idem_wasm_bg.wasm", import.meta.url)) });

export {
  DurableObjectStore,
  Idempotency,
  IdempotencyShard,
  Inbox,
  MemoryStore,
  StoreFullError,
  expire,
  idempotencyOf,
  idempotentFetch,
  shardName,
  withIdempotency,
} from "./idem_wasm.js";
