// `npm run bench`: requests per second of idem-wasm beside the npm idempotency libraries, on
// one workload, in one run. Build first (`npm run build`).
//
// Workload (each row, each library): N requests with fresh keys, then the same N keys again
// (replays), then the same N keys with a changed body (mismatches). Every request starts as
// the same raw data (method, path, headers, JSON text), and each library is given it in its
// own native form, built inside the timed loop: a Fetch `Request` for withIdempotency, plain
// objects with the parsed body for the others (what body-parser would hand them). The
// handler does the same work everywhere: it answers 201 with a small JSON body. Requests run
// one after another (no overlap), so the numbers are per-request costs, not throughput under
// load. Mismatch rows count the library's own refusal (422 or its error) as the answer.
//
// Peers and adapters:
//   @node-idempotency/core 1.0.11 with @node-idempotency/storage-adapter-memory
//   express-idempotency 1.0.6 with its in-memory adapter (the middleware is driven with
//     minimal Express-shaped req/res objects; no Express app or socket is involved)
//   @aws-lambda-powertools/idempotency 2.35.0 with a small in-memory persistence layer (the
//     conditional put of its DynamoDB layer, over a Map)
//
// Usage: node bench/bench.mjs [N]   (N defaults to 5000)
import { Idempotency, MemoryStore, withIdempotency } from "idem-wasm";
import { Idempotency as NodeIdempotency } from "@node-idempotency/core";
import { MemoryStorageAdapter } from "@node-idempotency/storage-adapter-memory";
import { getSharedIdempotencyService, idempotency as expressIdempotency } from "express-idempotency";
import {
  IdempotencyConfig,
  IdempotencyItemAlreadyExistsError,
  IdempotencyItemNotFoundError,
  makeIdempotent,
} from "@aws-lambda-powertools/idempotency";
import { BasePersistenceLayer, IdempotencyRecord } from "@aws-lambda-powertools/idempotency/persistence";

const N = Number(process.argv[2] ?? 5000);
const encoder = new TextEncoder();
const bodyOf = (i, changed) =>
  JSON.stringify({ amount: changed ? 2000 + i : 1000 + i, currency: "eur", customer: `cus_${i}`, note: "benchmark order" });
const answer = (i) => JSON.stringify({ id: `ord_${i}`, status: "created" });

async function time(run) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < N; i++) await run(i);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  return N / seconds;
}

// --- idem-wasm, Fetch API --------------------------------------------------------------------
async function idemFetch(phase, prefix) {
  const handler = idemFetch.handler;
  return time(async (i) => {
    const request = new Request("http://api.local/orders", {
      method: "POST",
      headers: { "idempotency-key": `"${prefix}-${i}"`, "content-type": "application/json" },
      body: bodyOf(i, phase === "mismatch"),
    });
    const response = await handler(request);
    await response.arrayBuffer();
    if (response.status !== (phase === "mismatch" ? 422 : 201)) throw new Error(`idem fetch ${phase}: ${response.status}`);
  });
}

// --- idem-wasm, plain objects ----------------------------------------------------------------
async function idemPlain(phase, prefix) {
  const idem = idemPlain.idem;
  return time(async (i) => {
    const reply = await idem.handle(
      {
        method: "POST",
        target: "/orders",
        key: `"${prefix}-${i}"`,
        contentType: "application/json",
        body: encoder.encode(bodyOf(i, phase === "mismatch")),
      },
      () => ({ status: 201, headers: [["content-type", "application/json"]], body: answer(i) }),
    );
    if (reply.status !== (phase === "mismatch" ? 422 : 201)) throw new Error(`idem plain ${phase}: ${reply.status}`);
  });
}

// --- @node-idempotency/core ------------------------------------------------------------------
async function nodeIdempotency(phase, prefix) {
  const idem = nodeIdempotency.idem;
  return time(async (i) => {
    const req = {
      headers: { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
      path: "/orders",
      method: "POST",
      body: JSON.parse(bodyOf(i, phase === "mismatch")),
    };
    let status;
    try {
      const cached = await idem.onRequest(req);
      if (cached) {
        status = cached.additional.status;
      } else {
        const res = { body: JSON.parse(answer(i)), additional: { status: 201 } };
        await idem.onResponse(req, res);
        status = 201;
      }
    } catch (err) {
      status = err.code === "IDEMPOTENCY_FINGERPRINT_MISSMATCH" ? 422 : 500;
    }
    if (status !== (phase === "mismatch" ? 422 : 201)) throw new Error(`node-idempotency ${phase}: ${status}`);
  });
}

// --- express-idempotency ---------------------------------------------------------------------
function expressReq(headers, body) {
  return { headers, body, method: "POST", url: "/orders", query: {}, get: (name) => headers[name.toLowerCase()] };
}
function expressRes(done) {
  const headers = {};
  const res = {
    statusCode: 200,
    setHeader: (n, v) => {
      headers[n.toLowerCase()] = v;
    },
    getHeaders: () => headers,
    status(code) {
      res.statusCode = code;
      return res;
    },
    send(body) {
      done(res.statusCode, body);
      return res;
    },
  };
  return res;
}
async function expressIdem(phase, prefix) {
  const middleware = expressIdem.middleware;
  const service = getSharedIdempotencyService();
  return time(
    (i) =>
      new Promise((resolve, reject) => {
        const req = expressReq(
          { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
          JSON.parse(bodyOf(i, phase === "mismatch")),
        );
        const finish = (status) => {
          if (status !== (phase === "mismatch" ? 417 : 201)) reject(new Error(`express-idempotency ${phase}: ${status}`));
          else setImmediate(resolve); // let the library's response hook store the result
        };
        const res = expressRes(finish);
        middleware(req, res, (err) => {
          if (err) return finish(res.statusCode);
          if (service.isHit(req)) return; // replayed by the middleware through res.send
          res.setHeader("content-type", "application/json");
          res.status(201).send(answer(i));
        }).catch(reject);
      }),
  );
}

// --- @aws-lambda-powertools/idempotency --------------------------------------------------------
/** The same conditional put as the library's DynamoDB layer, over a Map. (The library's own
 * CachePersistenceLayer drops the payload hash when it completes a record, so every replay
 * would fail validation; a layer of our own keeps the comparison fair.) */
class MemoryPersistenceLayer extends BasePersistenceLayer {
  #items = new Map();
  async _getRecord(key) {
    const item = this.#items.get(key);
    if (item === undefined) throw new IdempotencyItemNotFoundError("Item does not exist in persistence store");
    return new IdempotencyRecord({ ...item });
  }
  async _putRecord(record) {
    const now = Date.now();
    const existing = this.#items.get(record.idempotencyKey);
    const free =
      existing === undefined ||
      existing.expiryTimestamp < now / 1000 ||
      (existing.status === "INPROGRESS" &&
        existing.inProgressExpiryTimestamp !== undefined &&
        existing.inProgressExpiryTimestamp < now);
    if (!free) {
      throw new IdempotencyItemAlreadyExistsError(
        `Failed to put record for already existing idempotency key: ${record.idempotencyKey}`,
        new IdempotencyRecord({ ...existing }),
      );
    }
    this.#items.set(record.idempotencyKey, this.#item(record));
  }
  async _updateRecord(record) {
    const existing = this.#items.get(record.idempotencyKey);
    this.#items.set(record.idempotencyKey, { ...this.#item(record), payloadHash: record.payloadHash ?? existing?.payloadHash });
  }
  async _deleteRecord(record) {
    this.#items.delete(record.idempotencyKey);
  }
  #item(record) {
    return {
      idempotencyKey: record.idempotencyKey,
      status: record.getStatus(),
      expiryTimestamp: record.expiryTimestamp,
      inProgressExpiryTimestamp: record.inProgressExpiryTimestamp,
      responseData: record.responseData,
      payloadHash: record.payloadHash,
    };
  }
}
async function powertools(phase, prefix) {
  const fn = powertools.fn;
  return time(async (i) => {
    const event = {
      headers: { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
      body: JSON.parse(bodyOf(i, phase === "mismatch")),
    };
    let status;
    try {
      status = (await fn(event)).statusCode;
    } catch (err) {
      status = err.name === "IdempotencyValidationError" ? 422 : 500;
      if (status === 500 || phase !== "mismatch") throw err;
    }
    if (status !== (phase === "mismatch" ? 422 : 201)) throw new Error(`powertools ${phase}: ${status}`);
  });
}

function setup() {
  idemFetch.handler = withIdempotency(
    async (request) => {
      await request.arrayBuffer();
      return new Response(answer(0), { status: 201, headers: { "content-type": "application/json" } });
    },
    { store: new MemoryStore() },
  );
  idemPlain.idem = new Idempotency({ store: new MemoryStore() });
  nodeIdempotency.idem = new NodeIdempotency(new MemoryStorageAdapter(), { enforceIdempotency: true });
  expressIdem.middleware = expressIdempotency();
  const config = new IdempotencyConfig({
    eventKeyJmesPath: 'headers."idempotency-key"',
    payloadValidationJmesPath: "body",
    throwOnNoIdempotencyKey: true,
  });
  // Outside Lambda there is no invocation deadline; give the in-progress lock 60 s, as the
  // other libraries' leases.
  config.registerLambdaContext({ getRemainingTimeInMillis: () => 60_000 });
  powertools.fn = makeIdempotent(async (event) => ({ statusCode: 201, body: answer(event.body.amount) }), {
    persistenceStore: new MemoryPersistenceLayer(),
    config,
  });
}

const libraries = [
  ["idem-wasm withIdempotency (Fetch Request/Response)", idemFetch],
  ["idem-wasm Idempotency#handle (plain objects)", idemPlain],
  ["@node-idempotency/core (memory adapter)", nodeIdempotency],
  ["express-idempotency (in-memory adapter)", expressIdem],
  ["@aws-lambda-powertools/idempotency (in-memory layer)", powertools],
];
const phases = ["fresh", "replay", "mismatch"];

setup();
// Warm up every path on keys of its own.
for (const [, bench] of libraries) for (const phase of phases) await bench(phase, "warm");
setup();

const results = {};
for (const [name, bench] of libraries) {
  results[name] = {};
  for (const phase of phases) results[name][phase] = await bench(phase, "run");
}

const fmt = (n) => Math.round(n).toLocaleString("en-US").padStart(9);
console.log(`\nrequests per second, ${N} requests per row, Node ${process.version}, one run\n`);
console.log(`${"library".padEnd(62)}${phases.map((p) => p.padStart(11)).join("")}`);
for (const [name] of libraries) {
  console.log(`${name.padEnd(62)}${phases.map((p) => `  ${fmt(results[name][p])}`).join("")}`);
}
for (const [ours] of libraries.slice(0, 2)) {
  console.log(`\nratio: ${ours} / peer (above 1.00 = idem faster)`);
  for (const [peer] of libraries.slice(2)) {
    console.log(`  vs ${peer.padEnd(58)}${phases.map((p) => `${(results[ours][p] / results[peer][p]).toFixed(2).padStart(9)}x`).join("")}`);
  }
}
