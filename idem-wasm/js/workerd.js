// Cloudflare Workers (workerd): the runtime compiles the imported .wasm file at deploy time,
// so it is instantiated synchronously here. No random values are drawn at load: Workers
// refuse to generate them outside a request handler.
import wasm from "./idem_wasm_bg.wasm";
import { initSync } from "./idem_wasm.js";

initSync({ module: wasm });

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
