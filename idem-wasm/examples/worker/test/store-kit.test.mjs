// The store tests (`idem/store-tests`) against the Durable Object store, with real Durable
// Objects under workerd: the test drives `DurableObjectStore` from Node through Miniflare's
// namespace binding, so every load, claim and compare-and-set runs in the worker's
// `IdempotencyShard` objects, and expiry runs on their alarms.
import { after, before, describe, test } from "node:test";
import { DurableObjectStore } from "../../../dist/node.js";
import { storeTests } from "../../../dist/store-tests.js";
import { startWorker } from "./runtime.mjs";

describe("DurableObjectStore", () => {
  let worker;
  let namespace;
  before(async () => {
    worker = await startWorker();
    namespace = await worker.mf.getDurableObjectNamespace("IDEM");
  });
  after(async () => {
    await worker?.dispose();
  });
  storeTests(test, {
    name: "DurableObjectStore",
    // Two stores on one namespace reach the same objects, as two isolates of a worker do.
    // Miniflare's namespace reaches the objects from Node with synchronous calls: 32 racing
    // requests take turns through it, which on a loaded machine takes longer than a call's
    // default bound.
    open: () => new DurableObjectStore(namespace, { timeout: 30_000 }),
    selfExpiring: true,
  });
});
