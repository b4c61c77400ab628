// The public API. The build bundles it with the generated glue into dist/idem_wasm.js (ESM)
// and dist/node.cjs (CommonJS); the entries initialise the WebAssembly module and re-export
// these names.
export { Idempotency } from "./server.js";
export { idempotencyOf, withIdempotency } from "./fetch.js";
export { Inbox } from "./inbox.js";
export { methodNotAllowed, plainProblem } from "./edge.js";
export { MemoryStore, expire, redisKeys, responseApart } from "./stores.js";
export { IdempotencyShard } from "./shard.js";
export { DurableObjectStore, shardName } from "./shard-store.js";
export { DurableObjectLocalStore, TRANSACTION_KEYS } from "./local-store.js";
export { StoreFullError } from "./util.js";
export { keyHeader, lowWaterHeader, statusHeader, statusMediaType, storeTimeoutMs, unopenedDue } from "./idem_wasm.js";
export { openedRecord, recordSealer } from "./seal.js";
