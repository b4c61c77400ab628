// Two processes, one store: two Node HTTP servers with `withIdempotency` on the same Redis,
// and again on the same Postgres, behind a round-robin proxy (a load balancer in one
// function: each connection goes to the next server). The conformance suite's concurrent
// case fires 32 duplicates per round over separate connections, so each round's duplicates
// split across both processes; the count oracle lives in the store, so it counts both. The
// result must be exactly one execution per key (IDEM-CONC-1, IDEM-EXEC-1).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { PostgresStore } from "idem/postgres";
import pg from "pg";
import { assertOneExecutionPerRound, conformanceBinary, runProcess } from "./conformance.mjs";
import { startPostgres, startRedis } from "./servers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const CONCURRENCY = 32;
const ROUNDS = 10;

/** Starts the orders server on `kind` at `url`; resolves to `{ port, stop() }`. */
function startServer(kind, url) {
  const child = spawn(process.execPath, [join(here, "fixtures", "orders-server.mjs"), kind, url], { stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  child.stderr.on("data", (d) => (err += d));
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
    await exited;
  };
  return new Promise((resolve, reject) => {
    child.stdout.once("data", (d) => resolve({ port: Number(String(d).trim()), stop, pid: child.pid }));
    child.once("exit", (code) => reject(new Error(`orders server exited (${code}): ${err}`)));
  });
}

/** A round-robin TCP proxy to `ports` on 127.0.0.1: `{ port, connections, close() }`, where
 * `connections[i]` counts the connections sent to `ports[i]`. */
async function roundRobin(ports) {
  const connections = ports.map(() => 0);
  let next = 0;
  const sockets = new Set();
  const server = createServer((client) => {
    const i = next++ % ports.length;
    connections[i]++;
    const upstream = connect(ports[i], "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    connections,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

for (const kind of ["redis", "postgres"]) {
  describe(`two processes on one ${kind === "redis" ? "Redis" : "Postgres"}`, () => {
    let db;
    let servers = [];
    let proxy;
    let dir;
    before(async () => {
      dir = mkdtempSync(join(tmpdir(), "idem-two-"));
      db = kind === "redis" ? await startRedis() : await startPostgres();
      if (kind === "postgres") {
        const pool = new pg.Pool({ connectionString: db.url });
        await new PostgresStore(pool).migrate();
        await pool.query("CREATE TABLE test_executions (n bigint NOT NULL); INSERT INTO test_executions VALUES (0);");
        await pool.end();
      }
      servers = await Promise.all([startServer(kind, db.url), startServer(kind, db.url)]);
      proxy = await roundRobin(servers.map((s) => s.port));
    });
    after(async () => {
      await proxy?.close();
      await Promise.all(servers.map((s) => s.stop()));
      await db?.stop();
      rmSync(dir, { recursive: true, force: true });
    });

    test(`${CONCURRENCY} duplicates per round over ${ROUNDS} rounds, split across both processes: one execution per key`, { timeout: 120_000 }, async () => {
      const url = `http://127.0.0.1:${proxy.port}`;
      const json = join(dir, `${kind}.json`);
      const before = [...proxy.connections];
      const result = await runProcess(
        conformanceBinary(),
        ["run", `${url}/orders`, "--case", "concurrent", "--count-url", `${url}/count`, "--concurrency", String(CONCURRENCY), "--rounds", String(ROUNDS), "-H", "Authorization: Bearer a", "--json", json, "--quiet"],
        100_000,
      );
      const output = `${result.stdout}\n${result.stderr}`;
      assert.equal(result.code, 0, output);
      const report = JSON.parse(readFileSync(json, "utf8"));
      const concurrent = assertOneExecutionPerRound(report, { rounds: ROUNDS, concurrency: CONCURRENCY });
      // Both processes took their share of the connections.
      const sent = proxy.connections.map((n, i) => n - before[i]);
      assert.ok(sent.every((n) => n >= (CONCURRENCY * ROUNDS) / 4), `connections per process: ${sent}`);
      const executions = (await (await fetch(`${url}/count`)).json()).count;
      console.log(`${kind}: ${CONCURRENCY * ROUNDS} racing requests in ${ROUNDS} rounds over 2 processes (connections ${sent.join(" + ")}); executions: ${executions} (${concurrent.reason})`);
    });
  });
}
