// `npm run bench`: requests per second of idem-wasm beside the npm idempotency libraries, on
// one workload, in one run. Build first (`npm run build`).
//
// Workload (each library): N requests with fresh keys, then the same N keys again (replays),
// then the same N keys with a changed body (mismatches). Requests run one after another (no
// overlap), so the numbers are per-request costs, not throughput under load. Mismatch rows
// count the library's own refusal as the answer.
//
// Equal work. A row's input and output have the same form for every library in it.
//   Plain rows (`Idempotency#handle` and the peers) run as a route handler of a framework
//   that has parsed the request runs: every library starts from the same parsed body object
//   (about 90 bytes of JSON, built for each request inside the timed loop) and ends with a
//   parsed response object. idem pays its own way in and out: `JSON.stringify` and
//   `TextEncoder.encode` of the body, `JSON.stringify` of the handler's reply object (the
//   engine encodes it), then `TextDecoder.decode` and `JSON.parse` of the reply it returns
//   (a fresh answer, a stored one, or its problem+json refusal). The peers take objects and
//   are handed objects: the body object as the request's body (what body-parser would give
//   them), the handler's reply object, and a replay's stored reply comes back as the object
//   the library itself returns; a refusal is the library's own error. Whatever a peer
//   serialises or parses to store a record, it does itself; nothing is added to it.
//   Fetch rows (`withIdempotency` and the rows without idempotency beside it) start from the
//   same body object too: the caller puts `JSON.stringify` of it in a `Request`, the handler
//   reads it with `request.json()` and answers `Response.json(...)` with 201, and the caller
//   reads the answer with `response.json()`, in every Fetch row alike.
//
// The work is repeated for R rounds, each library starting each round on an empty store and
// the libraries taking turns within a round, so that a busy machine slows them alike; each
// row shows the median round.
//
// Fetch rows: Node's Request and Response (undici) cost more than the idempotency work, so
// three more rows measure them without idempotency: "Fetch baseline" is the bare handler
// (the caller builds the Request, the handler reads its body and builds the Response, the
// caller reads it); the first "Fetch plumbing" row adds what any Fetch-standard idempotency
// wrapper must do around a handler that runs (read the request body before the handler and
// give the handler a readable Request; read the response body to store it and return a fresh
// Response); the second is what it must do to answer without the handler (read the body,
// build a Response from stored bytes).
//
// Peers and adapters:
//   @node-idempotency/core 1.0.11 with @node-idempotency/storage-adapter-memory
//   express-idempotency 1.0.6 with its in-memory adapter (the middleware is driven with
//     minimal Express-shaped req/res objects; no Express app or socket is involved; the
//     handler calls `res.send` with the reply object, which the library stores and replays)
//   @aws-lambda-powertools/idempotency 2.35.0 with a small in-memory persistence layer (the
//     conditional put of its DynamoDB layer, over a Map; it holds the reply object itself,
//     where the library's own layers hold it as JSON text or DynamoDB attributes)
//
// Usage: node bench/bench.mjs [N] [R]   (N defaults to 5000 requests, R to 5 rounds)
import { Idempotency, MemoryStore, withIdempotency } from "idem";
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
import { answer, answered, bodyOf, median, orderHandler, plumbing } from "./workload.mjs";

const N = Number(process.argv[2] ?? 5000);
const ROUNDS = Number(process.argv[3] ?? 5);
const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** Every row checks that a 201 it ends with is the reply stored for its key. */
function check(name, phase, i, status, body) {
  if (status !== expected(phase)) throw new Error(`${name} ${phase}: ${status}`);
  if (status === 201 && body.id !== `ord_${i}`) throw new Error(`${name} ${phase}: ${body.id} for key ${i}`);
}
const expected = (phase) => (phase === "mismatch" ? 422 : 201);

async function time(run) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < N; i++) await run(i);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  return N / seconds;
}

function fetchRequest(phase, prefix, i) {
  return new Request("http://api.local/orders", {
    method: "POST",
    headers: { "idempotency-key": `"${prefix}-${i}"`, "content-type": "application/json" },
    body: JSON.stringify(bodyOf(i, phase === "mismatch")),
  });
}

function fetchBench(make) {
  let handler = null;
  return {
    setup() {
      handler = make();
    },
    run: (phase, prefix) =>
      time(async (i) => {
        const response = await handler(fetchRequest(phase, prefix, i));
        const body = await response.json();
        if (make === idemFetch) check("withIdempotency", phase, i, response.status, body);
        // The rows without idempotency run the handler every time; the stored-bytes row
        // answers with one fixed reply.
        else if (response.status !== 201) throw new Error(`fetch ${phase}: ${response.status}`);
      }),
  };
}

// --- idem-wasm, Fetch API --------------------------------------------------------------------
const idemFetch = () => withIdempotency(orderHandler, { store: new MemoryStore(), principal: "none" });

// --- Node's Fetch objects alone ------------------------------------------------------------
function bare() {
  return orderHandler;
}
function idemPlain() {
  let idem = null;
  return {
    setup() {
      idem = new Idempotency({ store: new MemoryStore(), principal: "none" });
    },
    run: (phase, prefix) =>
      time(async (i) => {
        const body = bodyOf(i, phase === "mismatch");
        const reply = await idem.handle(
          {
            method: "POST",
            target: "/orders",
            key: `"${prefix}-${i}"`,
            contentType: "application/json",
            body: encoder.encode(JSON.stringify(body)),
          },
          () => ({ status: 201, headers: [["content-type", "application/json"]], body: JSON.stringify(answer(i)) }),
        );
        const parsed = JSON.parse(typeof reply.body === "string" ? reply.body : decoder.decode(reply.body));
        check("idem plain", phase, i, reply.status, parsed);
      }),
  };
}

// --- @node-idempotency/core ------------------------------------------------------------------
function nodeIdempotency() {
  let idem = null;
  return {
    setup() {
      idem = new NodeIdempotency(new MemoryStorageAdapter(), { enforceIdempotency: true });
    },
    run: (phase, prefix) =>
      time(async (i) => {
        const req = {
          headers: { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
          path: "/orders",
          method: "POST",
          body: bodyOf(i, phase === "mismatch"),
        };
        let status;
        let body;
        try {
          const cached = await idem.onRequest(req);
          if (cached) {
            status = cached.additional.status;
            body = cached.body;
          } else {
            const res = { body: answer(i), additional: { status: 201 } };
            await idem.onResponse(req, res);
            status = 201;
            body = res.body;
          }
        } catch (err) {
          status = err.code === "IDEMPOTENCY_FINGERPRINT_MISSMATCH" ? 422 : 500;
        }
        check("node-idempotency", phase, i, status, body);
      }),
  };
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
function expressIdem() {
  let middleware = null;
  return {
    setup() {
      middleware = expressIdempotency();
    },
    run: (phase, prefix) => {
      const service = getSharedIdempotencyService();
      return time(
        (i) =>
          new Promise((resolve, reject) => {
            const req = expressReq(
              { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
              bodyOf(i, phase === "mismatch"),
            );
            const finish = (status, body) => {
              // express-idempotency refuses a changed payload with 417.
              if (status !== (phase === "mismatch" ? 417 : 201)) reject(new Error(`express-idempotency ${phase}: ${status}`));
              else if (status === 201 && body.id !== `ord_${i}`) reject(new Error(`express-idempotency ${phase}: ${body.id}`));
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
    },
  };
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
function powertools() {
  let fn = null;
  return {
    setup() {
      const config = new IdempotencyConfig({
        eventKeyJmesPath: 'headers."idempotency-key"',
        payloadValidationJmesPath: "body",
        throwOnNoIdempotencyKey: true,
      });
      // Outside Lambda there is no invocation deadline; give the in-progress lock 60 s, as
      // the other libraries' leases.
      config.registerLambdaContext({ getRemainingTimeInMillis: () => 60_000 });
      fn = makeIdempotent(async (event) => ({ statusCode: 201, body: answer(event.i) }), {
        persistenceStore: new MemoryPersistenceLayer(),
        config,
      });
    },
    run: (phase, prefix) =>
      time(async (i) => {
        const event = {
          headers: { "idempotency-key": `${prefix}-${i}`, "content-type": "application/json" },
          body: bodyOf(i, phase === "mismatch"),
          i,
        };
        let status;
        let body;
        try {
          const result = await fn(event);
          status = result.statusCode;
          body = result.body;
        } catch (err) {
          status = err.name === "IdempotencyValidationError" ? 422 : 500;
          if (status === 500 || phase !== "mismatch") throw err;
        }
        check("powertools", phase, i, status, body);
      }),
  };
}

const libraries = [
  ["idem Idempotency#handle (plain objects)", idemPlain()],
  ["@node-idempotency/core (memory adapter)", nodeIdempotency()],
  ["express-idempotency (in-memory adapter)", expressIdem()],
  ["@aws-lambda-powertools/idempotency (in-memory layer)", powertools()],
  ["idem withIdempotency (Fetch Request/Response)", fetchBench(idemFetch)],
  ["Fetch baseline: the handler alone, no idempotency", fetchBench(bare)],
  ["Fetch plumbing: body and Response copies, no idempotency", fetchBench(plumbing)],
  ["Fetch plumbing: body read, Response from stored bytes", fetchBench(answered)],
];
const PEERS = libraries.slice(1, 4).map(([name]) => name);
const phases = ["fresh", "replay", "mismatch"];

// Warm up every path on keys of its own.
for (const [, lib] of libraries) {
  lib.setup();
  for (const phase of phases) await lib.run(phase, "warm");
}

// Each round starts every library on an empty store.
const samples = {};
for (const [name] of libraries) samples[name] = { fresh: [], replay: [], mismatch: [] };
for (let round = 0; round < ROUNDS; round++) {
  for (const [name, lib] of libraries) {
    lib.setup();
    for (const phase of phases) samples[name][phase].push(await lib.run(phase, `run${round}`));
  }
}
const results = {};
for (const [name] of libraries) {
  results[name] = Object.fromEntries(phases.map((p) => [p, median(samples[name][p])]));
}

const fmt = (n) => Math.round(n).toLocaleString("en-US").padStart(9);
const us = (rps) => 1e6 / rps;
console.log(`\nrequests per second (median of ${ROUNDS} rounds of ${N} requests), Node ${process.version}\n`);
console.log(`${"library".padEnd(62)}${phases.map((p) => p.padStart(11)).join("")}`);
for (const [name] of libraries) {
  console.log(`${name.padEnd(62)}${phases.map((p) => `  ${fmt(results[name][p])}`).join("")}`);
}

const PLAIN = libraries[0][0];
const FETCH = libraries[4][0];
const BASE = libraries[5][0];
const PLUMB = libraries[6][0];
const ANSWER = libraries[7][0];
// Ratios are taken round by round (the two ran one after the other), then the median of the
// rounds is shown with the lowest and highest: a machine that slows down between rounds
// moves both sides of a round alike.
console.log(`\nratio: ${PLAIN} / peer (above 1.00 = idem faster), median of the rounds' ratios [lowest–highest]`);
for (const peer of PEERS) {
  const cell = (p) => {
    const ratios = samples[PLAIN][p].map((rps, round) => rps / samples[peer][p][round]);
    const text = `${median(ratios).toFixed(2)}x [${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}]`;
    return text.padStart(24);
  };
  console.log(`  vs ${peer.padEnd(58)}${phases.map(cell).join("")}`);
}

// The Fetch path, taken apart: what Node's objects cost, and what idem adds on top. A fresh
// request makes all of the plumbing's copies around the handler; a replay or a mismatch reads
// the body and answers from stored bytes without the handler. The difference is taken round
// by round (the rows of a round ran one after another) and the median of the rounds is shown.
console.log("\nFetch path, microseconds per request:");
const row = (label, f) => console.log(`  ${label.padEnd(60)}${phases.map((p) => f(p).toFixed(1).padStart(10)).join("")}`);
const work = (p) => (p === "fresh" ? PLUMB : ANSWER);
row("withIdempotency", (p) => us(results[FETCH][p]));
row("Node's Request/Response with the handler alone (baseline)", (p) => us(results[BASE][p]));
row("the Fetch work withIdempotency needs (plumbing rows)", (p) => us(results[work(p)][p]));
row("idem's own cost: withIdempotency - that Fetch work", (p) =>
  median(samples[FETCH][p].map((rps, round) => us(rps) - us(samples[work(p)][p][round]))),
);
row("the same idempotency work through Idempotency#handle", (p) => us(results[PLAIN][p]));
