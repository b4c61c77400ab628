// The public API. Entries (node.js, node.cjs, workerd.js, web.js) initialise the WebAssembly
// module, then re-export this file.
export { Idempotency, idempotencyOf, withIdempotency } from "./server.js";
export { MemoryStore } from "./stores.js";
export { DurableObjectStore, IdempotencyShard } from "./shard.js";
export { StoreFullError } from "./util.js";
export { idempotentFetch } from "./client.js";
