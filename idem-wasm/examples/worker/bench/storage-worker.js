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

  constructor(ctx, env) {
    super(ctx, env);
    // A record as one SQL row: its key, its deadline (indexed, for the expiry sweep) and its
    // bytes, in place of the key-value API's two rows (the record's, the deadline index's).
    ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS records (key TEXT PRIMARY KEY, deadline INTEGER NOT NULL, value BLOB NOT NULL) WITHOUT ROWID");
    ctx.storage.sql.exec("CREATE INDEX IF NOT EXISTS records_by_deadline ON records (deadline)");
  }

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
        case "record-and-index":
          // What a record takes through the key-value API: its row and its deadline's.
          storage.put(randomKey(), { version: "1", value: VALUE, deadline: 1764300000000, chunks: 1, length: VALUE.byteLength });
          storage.put(`d:${String(this.#next * TIMES + i).padStart(16, "0")}`, "1");
          break;
        case "record-row-sql":
          storage.sql.exec("INSERT INTO records (key, deadline, value) VALUES (?, ?, ?)", randomKey(), 1764300000000 + this.#next * TIMES + i, VALUE);
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
