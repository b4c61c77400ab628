// The worker of bench/storage.mjs: one SQLite-backed Durable Object that, for each request,
// reads its body, counts the request (one put, as the order handler counts a run), and then
// does one storage operation ten times over, named by the path. Nothing of idem: what the
// object's storage costs by itself, next to which the idempotency record's writes are read.
import { DurableObject } from "cloudflare:workers";

/** How many times each request does its operation. */
const TIMES = 10;
const VALUE = new Uint8Array(520);
/** Storage keys of the length and shape of a record's: a prefix, a scope, a random key. */
const randomKey = () => `idem:r:62:0123456789abcdef0123456789abcdef:POST7:/orders"${crypto.randomUUID()}"`;

export class Storage extends DurableObject {
  #next = 0;

  async fetch(request) {
    const operation = new URL(request.url).pathname.slice(1);
    await request.text();
    const storage = this.ctx.storage;
    await storage.put("count", ++this.#next);
    for (let i = 0; i < TIMES; i++) {
      switch (operation) {
        case "none":
          break;
        case "read-missing-kv":
          storage.kv.get(randomKey());
          break;
        case "read-missing":
          await storage.get(randomKey());
          break;
        case "record-at-random":
          storage.put(randomKey(), { version: "1", value: VALUE, deadline: 1764300000000, chunks: 1, length: VALUE.byteLength });
          break;
        case "bytes-at-random":
          storage.put(randomKey(), VALUE);
          break;
        case "small-at-random":
          storage.put(randomKey(), "1");
          break;
        case "small-appended":
          storage.put(`d:${String(this.#next * TIMES + i).padStart(16, "0")}`, "1");
          break;
        default:
          return new Response("no such operation", { status: 404 });
      }
    }
    return new Response("ok");
  }
}

export default {
  fetch(request, env) {
    return env.STORAGE.get(env.STORAGE.idFromName("storage")).fetch(request);
  },
};
