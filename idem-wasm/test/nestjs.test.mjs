// `idem/nestjs` on NestJS 11 and NestJS 10 over loopback HTTP (IDEM-JS-4), on the Express
// and the Fastify platforms (Nest 10's is Fastify 4; Nest 10 comes from test/nestjs10, with the
// built package copied into its node_modules for the run): the adapters' shared checks (test/framework-http.mjs), the store kit's
// shared-store case on one Redis through two Nest apps, what only Nest has (the principal
// from req.user set by a guard, pipes and exception filters inside the guarded request,
// unmarked handlers untouched), and the TypeScript example of docs/frameworks/nestjs.md,
// compiled with the pinned typescript and run as written.
//
// Node 20 does not parse decorators: the test app applies them as functions.
import "reflect-metadata";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { BadRequestException, Body, Catch, Controller, Get, HttpException, Module, Post, Req, Res } from "@nestjs/common";
import { NestFactory } from "@nestjs/core";
import { ExpressAdapter } from "@nestjs/platform-express";
import { FastifyAdapter } from "@nestjs/platform-fastify";
import Redis from "ioredis";
import ts from "typescript";
import { MemoryStore } from "idem";
import { Idempotent, IdempotencyModule } from "idem/nestjs";
import { RedisStore } from "idem/redis";
import { MAX_BODY, ORDER, adapterChecks, checkEndlessAnswer, endlessSource, fresh, post, sharedStoreCheck } from "./framework-http.mjs";
import { startRedis } from "./servers.mjs";

const here = dirname(fileURLToPath(import.meta.url));

/** Nest and idem/nestjs, as one major of Nest sees them. */
const NEST_11 = { version: 11, BadRequestException, Body, Catch, Controller, Get, HttpException, Module, Post, Req, Res, NestFactory, ExpressAdapter, FastifyAdapter, MemoryStore, Idempotent, IdempotencyModule };

/** NestJS 10 from test/nestjs10 (`npm ci` there), with this build of the package copied into
 * its node_modules, so that idem/nestjs resolves Nest 10 and its own copy of idem. */
async function nest10() {
  const root = join(here, "nestjs10");
  const modules = join(root, "node_modules");
  if (!existsSync(join(modules, "@nestjs", "core"))) throw new Error("NestJS 10 is not installed: run npm ci in idem-wasm/test/nestjs10 (cargo xtask setup does)");
  const idem = join(modules, "idem");
  rmSync(idem, { recursive: true, force: true });
  mkdirSync(idem);
  cpSync(join(here, "..", "package.json"), join(idem, "package.json"));
  cpSync(join(here, "..", "dist"), join(idem, "dist"), { recursive: true });
  after(() => rmSync(idem, { recursive: true, force: true }));
  const from = (path) => import(pathToFileURL(join(modules, path)).href);
  const [common, core, express, fastify, idemMain, idemNest] = await Promise.all([
    from("@nestjs/common/index.js"),
    from("@nestjs/core/index.js"),
    from("@nestjs/platform-express/index.js"),
    from("@nestjs/platform-fastify/index.js"),
    from("idem/dist/node.js"),
    from("idem/dist/nestjs.js"),
  ]);
  assert.match(JSON.parse(readFileSync(join(modules, "@nestjs", "core", "package.json"), "utf8")).version, /^10\./);
  const { BadRequestException, Body, Catch, Controller, Get, HttpException, Module, Post, Req, Res } = common;
  return {
    version: 10,
    ...{ BadRequestException, Body, Catch, Controller, Get, HttpException, Module, Post, Req, Res },
    NestFactory: core.NestFactory,
    ExpressAdapter: express.ExpressAdapter,
    FastifyAdapter: fastify.FastifyAdapter,
    MemoryStore: idemMain.MemoryStore,
    Idempotent: idemNest.Idempotent,
    IdempotencyModule: idemNest.IdempotencyModule,
  };
}

const platforms = (nest) => [
  ["Express", () => new nest.ExpressAdapter()],
  ["Fastify", () => new nest.FastifyAdapter()],
];

/** Applies method decorators to `Class.prototype[name]`, as `@a @b name() {}` would. */
function decorate(Class, name, ...decorators) {
  const proto = Class.prototype;
  Reflect.decorate(decorators, proto, name, Object.getOwnPropertyDescriptor(proto, name));
}

/** The app of the shared checks on Nest: the user is set by a global guard from `x-user`,
 * CORS is on, and a catch-all exception filter answers every error in the app's own format
 * (the engine's replays and refusals must get past it untouched). */
async function startApp(nest, platform, { store = new nest.MemoryStore(), ...options } = {}) {
  const { BadRequestException, Body, Catch, Controller, Get, HttpException, Module, Post, Req, Res, NestFactory, Idempotent, IdempotencyModule } = nest;
  const state = { count: 0 };
  class OrdersController {
    async create(order, req, res) {
      const id = ++state.count;
      await new Promise((resolve) => setTimeout(resolve, 40));
      if (order === null || typeof order !== "object" || Array.isArray(order)) throw new BadRequestException("invalid order");
      res.header("x-order-id", String(id));
      return { id, order, key: req.idempotency?.key, raw: req.rawBody?.byteLength, user: req.user.id };
    }
    list() {
      return { orders: state.count };
    }
    // Answers by itself through the platform's response (Nest then writes nothing).
    own(res) {
      const id = ++state.count;
      const body = JSON.stringify({ id, own: true });
      if (typeof res.code === "function") res.code(201).header("content-type", "application/json").send(body);
      else res.status(201).type("json").send(body);
    }
    // Answers by itself, writes part of its answer, then fails (on Fastify, fails at once).
    async partial(res) {
      state.count++;
      if (typeof res.code !== "function") {
        res.status(201);
        res.write('{"id":');
      }
      await new Promise((resolve) => setTimeout(resolve, 5));
      throw new Error("failed after part of its answer");
    }
    // Answers by itself with a stream that never ends.
    endless(res) {
      const source = endlessSource(state);
      if (typeof res.code === "function") {
        res.raw.once("close", () => (state.closed = true));
        res.code(200).header("content-type", "application/octet-stream").send(source);
      } else {
        res.once("close", () => {
          state.closed = true;
          source.destroy();
        });
        res.status(200).type("application/octet-stream");
        source.pipe(res);
      }
    }
  }
  Controller("api/orders")(OrdersController);
  Body()(OrdersController.prototype, "create", 0);
  Req()(OrdersController.prototype, "create", 1);
  Res({ passthrough: true })(OrdersController.prototype, "create", 2);
  decorate(OrdersController, "create", Post(), Idempotent());
  // Marked, so that a GET with Idempotency-Status routed to it is a status query; any other
  // GET runs it.
  decorate(OrdersController, "list", Get(), Idempotent());
  Res()(OrdersController.prototype, "own", 0);
  decorate(OrdersController, "own", Post("own"), Idempotent());
  Res()(OrdersController.prototype, "partial", 0);
  decorate(OrdersController, "partial", Post("partial"), Idempotent());
  Res()(OrdersController.prototype, "endless", 0);
  decorate(OrdersController, "endless", Post("endless"), Idempotent());

  class OpenController {
    create() {
      state.count++;
      return { open: true };
    }
    echo(body) {
      state.count++;
      return { body: body ?? null };
    }
    // Reads the request stream itself, as an upload route does (Express's request; on
    // Fastify, the body its parser made).
    async upload(req) {
      state.count++;
      if (req.raw !== undefined) return { size: typeof req.body === "string" ? req.body.length : null };
      let size = 0;
      for await (const chunk of req) size += chunk.byteLength;
      return { size };
    }
  }
  Controller("open/orders")(OpenController);
  decorate(OpenController, "create", Post());
  decorate(OpenController, "echo", Post("echo"));
  Body()(OpenController.prototype, "echo", 0);
  decorate(OpenController, "upload", Post("upload"));
  Req()(OpenController.prototype, "upload", 0);

  class AppModule {}
  Module({
    imports: [IdempotencyModule.forRoot({ store, fingerprint: { maxBody: MAX_BODY }, ...options })],
    controllers: [OrdersController, OpenController],
  })(AppModule);

  const app = await NestFactory.create(AppModule, platform(), { logger: false });
  app.useGlobalGuards({
    canActivate(context) {
      const req = context.switchToHttp().getRequest();
      const user = req.headers["x-user"];
      if (user !== undefined) req.user = { id: user };
      return true;
    },
  });
  app.enableCors();
  // As Nest's own BaseExceptionFilter: an answer already under way is ended, not replaced.
  class CatchAll {
    catch(exception, host) {
      const adapter = app.getHttpAdapter();
      const res = host.switchToHttp().getResponse();
      if (adapter.isHeadersSent(res)) return adapter.end(res);
      const status = exception instanceof HttpException ? exception.getStatus() : 500;
      adapter.reply(res, { error: exception.message }, status);
    }
  }
  Catch()(CatchAll);
  app.useGlobalFilters(new CatchAll());
  await app.listen(0, "127.0.0.1");
  const port = app.getHttpServer().address().port;
  return { url: `http://127.0.0.1:${port}`, port, state, close: () => app.close() };
}

for (const nest of [NEST_11, await nest10()]) {
for (const [name, platform] of platforms(nest)) {
  describe(`idem/nestjs on NestJS ${nest.version} with the ${name} platform`, () => {
    let running;
    before(async () => {
      running = await startApp(nest, platform);
    });
    after(async () => running?.close());
    adapterChecks(() => running);

    test("the handler gets the parsed body, the raw bytes, the context and the user the guard set", async () => {
      const key = fresh();
      const first = await post(running.url, { key, body: ` ${ORDER}`, user: "carol" });
      const answer = await first.json();
      assert.equal(first.status, 201);
      assert.deepEqual(answer.order, JSON.parse(ORDER));
      assert.equal(answer.raw, ORDER.length + 1);
      assert.equal(answer.key, key.slice(1, -1));
      assert.equal(answer.user, "carol");
      const retry = await post(running.url, { key, body: ` ${ORDER}`, user: "carol" });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(retry.headers.get("access-control-allow-origin"), "*");
      const mismatch = await post(running.url, { key, body: '{"amount":1}', user: "carol" });
      assert.equal(mismatch.status, 422);
      assert.equal(mismatch.headers.get("access-control-allow-origin"), "*");
      assert.equal(mismatch.headers.get("content-type"), "application/problem+json");
    });

    test("a request without a key to a handler not marked is left to Nest: its parsers, its 400, its size (IDEM-JS-4)", async () => {
      const send = (body, contentType) =>
        fetch(`${running.url}/open/orders/echo`, { method: "POST", headers: { "content-type": contentType }, body, signal: AbortSignal.timeout(10_000) });
      const json = await send('{"a":1}', "application/json");
      assert.equal(json.status, 201);
      assert.deepEqual(await json.json(), { body: { a: 1 } });
      const before = running.state.count;
      const malformed = await send("{bad", "application/json");
      assert.equal(malformed.status, 400, "malformed JSON reached the handler");
      assert.equal(running.state.count, before);
      // Larger than the fingerprint takes: no business of idem's on this route.
      const large = await send(JSON.stringify({ pad: "x".repeat(MAX_BODY) }), "application/json");
      assert.notEqual(large.status, 413, "idem refused the body of a route it does not guard");
    });

    test("a request with a key to a handler not marked: a body that is not JSON reaches the route's parsers whatever its size (IDEM-JS-11)", async () => {
      const send = (path, body, contentType) =>
        fetch(`${running.url}/open/orders/${path}`, { method: "POST", headers: { "content-type": contentType, "idempotency-key": fresh() }, body, signal: AbortSignal.timeout(10_000) });
      const large = "u".repeat(4 * MAX_BODY);
      if (name === "Express") {
        // Nest parses forms on Express; the upload route reads the stream itself.
        for (const form of ["amount=4200&currency=eur", `amount=4200&pad=${"p".repeat(2 * MAX_BODY)}`]) {
          const r = await send("echo", form, "application/x-www-form-urlencoded");
          assert.equal(r.status, 201);
          assert.equal((await r.json()).body.amount, "4200", "Nest's form parser read the body");
        }
        for (const body of ["u".repeat(100), large]) {
          const r = await send("upload", body, "application/octet-stream");
          assert.equal(r.status, 201);
          assert.deepEqual(await r.json(), { size: body.length });
        }
      } else {
        // Fastify parses text; a body past idem's limit is within Fastify's.
        const r = await send("upload", large, "text/plain");
        assert.equal(r.status, 201);
        assert.deepEqual(await r.json(), { size: large.length });
      }
    });

    test("a request with a key to a handler not marked: JSON that does not parse is Nest's 400, and the handler does not run (IDEM-JS-11)", async () => {
      const before = running.state.count;
      const r = await fetch(`${running.url}/open/orders/echo`, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": fresh() },
        body: "{bad",
        signal: AbortSignal.timeout(10_000),
      });
      // The app's catch-all filter answers it, as it answers Nest's parser's 400.
      assert.equal(r.status, 400, "malformed JSON reached the handler");
      assert.match((await r.json()).error, /JSON/);
      assert.equal(running.state.count, before);
      // On a marked handler the same body is the engine's refusal.
      const marked = await post(running.url, { key: fresh(), body: "{bad" });
      assert.equal(marked.status, 400);
      assert.equal((await marked.json()).type, "urn:idem:problem:invalid-json");
    });

    test("a body that is not JSON past the limit, to a marked handler: 413, nothing runs (IDEM-LIMIT-1)", async () => {
      const before = running.state.count;
      const key = fresh();
      const r = await post(running.url, { key, body: "u".repeat(4 * MAX_BODY), contentType: "text/plain" });
      assert.equal(r.status, 413);
      assert.equal(r.headers.get("content-type"), "application/problem+json");
      assert.equal((await r.json()).type, "urn:idem:problem:body-too-large");
      assert.equal(running.state.count, before);
      const retry = await post(running.url, { key });
      assert.equal(retry.status, 201, "the key was never claimed");
    });

    test("a handler that answers by itself (@Res() without passthrough) runs once, and its answer is replayed", async () => {
      const key = fresh();
      const before = running.state.count;
      const first = await post(running.url, { key, path: "/api/orders/own" });
      assert.equal(first.status, 201);
      const body = await first.json();
      assert.equal(body.own, true);
      const retry = await post(running.url, { key, path: "/api/orders/own" });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await retry.json(), body);
      const mismatch = await post(running.url, { key, path: "/api/orders/own", body: '{"amount":1}' });
      assert.equal(mismatch.status, 422);
      assert.equal(running.state.count, before + 1);
    });

    test("a handler that fails after part of its own answer: nothing of it is stored, and the retry runs again (IDEM-OUT-3)", async () => {
      const key = fresh();
      const before = running.state.count;
      const first = await post(running.url, { key, path: "/api/orders/partial" }).then(
        async (r) => [r.status, await r.text()],
        () => "closed",
      );
      // Never a partial answer kept as a success: a 5xx, or the connection closed.
      assert.ok(first === "closed" || first[0] >= 500, `${first}`);
      const retry = await post(running.url, { key, path: "/api/orders/partial" }).then(
        (r) => r.headers.get("idempotent-replayed"),
        () => null,
      );
      assert.equal(retry, null, "the retry is not a replay");
      assert.equal(running.state.count, before + 2, "the retry runs again");
    });

    test("an answer that never ends goes out at the pace the client reads it, held no further than the store keeps (IDEM-STORE-5)", async () => {
      await checkEndlessAnswer(running.port, "/api/orders/endless", running.state);
    });

    test("an error the handler throws goes to the app's exception filter, whose answer is stored and replayed", async () => {
      const key = fresh();
      const first = await post(running.url, { key, body: "[1]" });
      assert.equal(first.status, 400);
      assert.deepEqual(await first.json(), { error: "invalid order" });
      const retry = await post(running.url, { key, body: "[1]" });
      assert.equal(retry.status, 400);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await retry.json(), { error: "invalid order" });
    });

    test("without a user the principal is empty, and the request is refused with 500 no-principal: never a shared scope (IDEM-SCOPE-3)", async () => {
      const before = running.state.count;
      const r = await fetch(`${running.url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": fresh() }, body: ORDER });
      const text = await r.text();
      assert.equal(r.status, 500, text);
      assert.equal(JSON.parse(text).type, "urn:idem:problem:no-principal");
      assert.equal(r.headers.get("content-type"), "application/problem+json", text);
      assert.equal(running.state.count, before);
    });

    test("a status query is answered after the guards, in the user's scope: without a user it is refused with 500 no-principal (IDEM-SCOPE-3)", async () => {
      const key = fresh();
      assert.equal((await post(running.url, { key })).status, 201);
      const r = await fetch(`${running.url}/api/orders`, { headers: { "idempotency-key": key, "idempotency-status": "POST" } });
      const text = await r.text();
      assert.equal(r.status, 500, text);
      assert.equal(r.headers.get("content-type"), "application/problem+json", text);
      assert.equal(JSON.parse(text).type, "urn:idem:problem:no-principal");
    });
  });

  describe(`idem/nestjs ${nest.version} (${name}): the key header's name and the problem hook are options`, () => {
    test("with statusQueries: false, a GET with Idempotency-Status runs its handler", async () => {
      const running = await startApp(nest, platform, { statusQueries: false });
      try {
        const key = fresh();
        assert.equal((await post(running.url, { key })).status, 201);
        const r = await fetch(`${running.url}/api/orders`, { headers: { "idempotency-key": key, "idempotency-status": "POST", "x-user": "alice" } });
        assert.deepEqual(await r.json(), { orders: 1 });
      } finally {
        await running.close();
      }
    });

    test("X-Request-Key carries the key, and refusals come in the host's own error format", async () => {
      const running = await startApp(nest, platform, {
        keyHeader: "X-Request-Key",
        problem: (problem) => Response.json({ error: problem.type.replace("urn:idem:problem:", "") }, { status: problem.status }),
      });
      try {
        const key = fresh();
        const send = (body = ORDER) =>
          fetch(`${running.url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "x-user": "alice", "x-request-key": key }, body });
        assert.equal((await send()).status, 201);
        assert.equal((await send()).headers.get("idempotent-replayed"), "true");
        const missing = await post(running.url, { key });
        assert.equal(missing.status, 400);
        assert.deepEqual(await missing.json(), { error: "missing-key" });
        const mismatch = await send('{"amount":2}');
        assert.equal(mismatch.status, 422);
        assert.deepEqual(await mismatch.json(), { error: "key-reuse-mismatch" });
        assert.equal(running.state.count, 1);
      } finally {
        await running.close();
      }
    });
  });

  describe(`idem/nestjs ${nest.version} (${name}): two apps on one Redis (the store kit's shared-store case)`, () => {
    let redis;
    const clients = [];
    before(async () => {
      redis = await startRedis();
    });
    after(async () => {
      for (const c of clients) c.disconnect();
      await redis?.stop();
    });
    sharedStoreCheck(`NestJS ${nest.version} (${name}) on RedisStore`, {
      open: () => {
        const client = new Redis(redis.url);
        clients.push(client);
        return new RedisStore(client);
      },
      start: (store) => startApp(nest, platform, { store }),
    });
  });
}
}

describe("docs/frameworks/nestjs.md: the example runs as written", () => {
  const file = join(here, "..", "examples", "frameworks", "nestjs.ts");
  const example = readFileSync(file, "utf8");

  test("the page opens with the example's text", () => {
    const page = readFileSync(join(here, "..", "..", "docs", "frameworks", "nestjs.md"), "utf8");
    assert.ok(page.includes("```ts\n" + example + "```"), "docs/frameworks/nestjs.md must show examples/frameworks/nestjs.ts verbatim");
  });

  test("the example, compiled with the pinned typescript, serves an order once and replays it", async () => {
    const { outputText, diagnostics } = ts.transpileModule(example, {
      reportDiagnostics: true,
      compilerOptions: {
        module: ts.ModuleKind.ES2022,
        target: ts.ScriptTarget.ES2022,
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
      },
    });
    assert.deepEqual(diagnostics, []);
    // Inside the package, so that "idem" resolves to it.
    const dir = mkdtempSync(join(here, ".nestjs-example-"));
    const compiled = join(dir, "main.mjs");
    writeFileSync(compiled, outputText);
    const child = spawn(process.execPath, [compiled], { env: { ...process.env, PORT: "0", NO_COLOR: "1" }, stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      const url = await new Promise((resolve, reject) => {
        let out = "";
        let err = "";
        child.stderr.on("data", (d) => (err += d));
        child.stdout.on("data", (d) => {
          out += d;
          const line = out.match(/^http:\/\/\S+$/m);
          if (line) resolve(line[0].replace("[::1]", "127.0.0.1"));
        });
        child.once("exit", (code) => reject(new Error(`the example exited (${code}): ${out}${err}`)));
      });
      const key = fresh();
      const first = await post(url, { key, path: "/orders" });
      assert.equal(first.status, 201);
      const body = await first.json();
      assert.deepEqual(body.order, JSON.parse(ORDER));
      const retry = await post(url, { key, path: "/orders" });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await retry.json(), body);
      const mismatch = await post(url, { key, path: "/orders", body: '{"amount":1}' });
      assert.equal(mismatch.status, 422);
      assert.equal(mismatch.headers.get("content-type"), "application/problem+json");
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
