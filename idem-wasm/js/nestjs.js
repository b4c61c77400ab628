// `idem/nestjs`: Idempotency-Key semantics for NestJS 10 and 11, on the Express and the
// Fastify platforms. No lifecycle of its own: a guarded request goes through
// `Idempotency#handle` (the engine's request machine), with the rest of Nest's request
// (pipes, the handler, interceptors after this one, exception filters, serialisation) as its
// handler, and the answer Nest writes is captured under Nest, on the platform, stored, and
// then sent.
//
//   @Module({ imports: [IdempotencyModule.forRoot({ store })] }) class AppModule {}
//   @Post("orders") @Idempotent() create(@Body() order) { ... }
//
// Two pieces, both registered by `IdempotencyModule.forRoot`:
// - the body intake, installed on the platform when the module is created (before Nest adds
//   its body parsers): for a request whose body may identify it (`readsBody`: its method,
//   and a key or a key derived from the body), it reads
//   the raw body for the fingerprint and hands it on to Nest's parsing (a JSON body past
//   the engine's limit is refused at once; any other body, whole or past the limit, goes on
//   as it came, for the parsers of the route, whichever it is);
// - the interceptor (global): on a handler marked `@Idempotent()`, after the guards (so that
//   `req.user` is set), it claims the key and runs the rest of the request; when the engine
//   answers itself (a replay, a refusal), the handler does not run and the answer Nest then
//   writes (of nothing) is replaced under Nest, on the platform, by the engine's reply:
//   an interceptor has no other way to answer with a status and headers of its own, and an
//   exception filter could be preempted by the application's own catch-all filters. A `GET`
//   with `Idempotency-Status` routed to a marked handler is a status query, answered the
//   same way (after the guards, which set the principal).
//
// Both pieces stay in this file: they hand the request to each other through the symbols
// and the binding defined here (the body read, the capture), on both platforms; what they
// share with the other adapters is in adapter.js, node-response.js and fastify-reply.js.
import { Readable } from "node:stream";
import { BadRequestException, Module, SetMetadata } from "@nestjs/common";
import { RESPONSE_PASSTHROUGH_METADATA, ROUTE_ARGS_METADATA } from "@nestjs/common/constants.js";
import { RouteParamtypes } from "@nestjs/common/enums/route-paramtypes.enum.js";
import { APP_INTERCEPTOR, HttpAdapterHost, Reflector } from "@nestjs/core";
import { from, mergeMap, of, throwError } from "rxjs";
import { Idempotency, plainProblem } from "idem";
import { begin, isJson, readNodeBody } from "./adapter.js";
import { closeUnread, readBody } from "./body.js";
import { rangeError } from "./errors.js";
import { answerInstead, answered, sendReply } from "./fastify-reply.js";
import { capture as captureNode, send as sendNode, sendInstead } from "./node-response.js";

/** The metadata key `@Idempotent()` sets. */
const IDEMPOTENT = "idem:idempotent";
/** The provider token of the module's `Idempotency` (the engine on its store), for a
 * service that issues tokens or opens sessions with it. */
export const IDEMPOTENCY = Symbol.for("idem:nestjs:idempotency");
const BINDING = Symbol.for("idem:nestjs:binding");
/** What the intake keeps on a request: `{ body, invalid }`, the raw bytes and, for JSON that
 * does not parse, its `SyntaxError`; or `{ refused }`, the slot of the 413 of a body past the
 * limit that it let through. */
const INTAKE = Symbol("idempotency intake");
/** The intake of a request the engine refuses before its body matters. */
const NO_BODY = { body: new Uint8Array(0) };
/** Where a request that runs on the Fastify platform keeps its capture. */
const CAPTURE = Symbol("idempotency capture");
const RUN = Symbol("run");

/** Marks a handler (or every handler of a controller) as guarded by idempotency keys. */
export function Idempotent() {
  return SetMetadata(IDEMPOTENT, true);
}

/** The default principal: the id of the request's user (`req.user`, as authentication guards
 * such as Passport's set it): the user itself when it is a string or number, else its `id`,
 * else its `sub`. Without a user the principal is empty, which the engine refuses
 * (IDEM-SCOPE-3): never a shared scope. */
function userOf(req) {
  const user = req.user;
  if (typeof user === "string" || typeof user === "number") return user;
  return user?.id ?? user?.sub ?? "";
}

/** The engine on its store, and the platform glue of one application. */
class Binding {
  constructor(options, adapterHost) {
    if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "IdempotencyModule.forRoot(options) needs { store }");
    const { principal = userOf, ...rest } = options;
    this.idem = new Idempotency({
      ...rest,
      principal: typeof principal === "function" ? (input) => principal(input.req) : principal,
    });
    const instance = adapterHost?.httpAdapter?.getInstance?.();
    if (instance == null) throw rangeError("IDEM-JS-1", "IdempotencyModule needs an HTTP application (NestFactory.create with the Express or Fastify platform)");
    this.fastify = typeof instance.addHook === "function";
    if (this.fastify) this.#installFastify(instance);
    else this.#installExpress(instance);
  }

  /** The key header's value among these headers (a Node header record), or null. */
  #keyOf(headers) {
    return headers[this.idem.keyHeader] ?? null;
  }

  #installExpress(app) {
    const idem = this.idem;
    app.use((req, res, next) => {
      const key = this.#keyOf(req.headers);
      // Before routing: only a body that may identify a guarded request is read; another
      // route's (a form, an upload) is left to its own parsers.
      if (!idem.readsBody(req.method, key !== null)) return next();
      readNodeBody(idem, req).then(async (read) => {
        if (typeof read !== "number") req[INTAKE] = { body: read.bytes, invalid: read.invalid };
        // A JSON body past the limit is refused at once (IDEM-LIMIT-1); any other was given
        // back, for the guarded handler to refuse and another to read (an upload).
        else if (isJson(req.headers["content-type"])) {
          closeUnread(req, res);
          return sendNode(res, await idem.serve(read, (answer) => answer), idem);
        } else req[INTAKE] = { refused: read };
        next();
      }).catch(next);
    });
  }

  #installFastify(fastify) {
    const idem = this.idem;
    fastify.addHook("preParsing", async (request, reply, payload) => {
      const key = this.#keyOf(request.headers);
      if (!idem.readsBody(request.method, key !== null)) return payload;
      const json = isJson(request.headers["content-type"]);
      const body = await readBody(idem, request.headers["content-length"], payload, json ? false : "refused");
      if (typeof body === "number") {
        // As on Express: only a JSON body is refused here; any other goes on as it came.
        if (!json) {
          request[INTAKE] = { refused: body };
          return payload;
        }
        closeUnread(request.raw, reply.raw);
        await sendReply(reply, await idem.serve(body, (answer) => answer), idem);
        return reply;
      }
      let bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
      // As NestFactory.create's `rawBody: true` keeps it (its parser sets the same bytes).
      request.rawBody = bytes;
      // JSON that does not parse is refused by the engine on a guarded handler (IDEM-FP-6):
      // Fastify's parser is given `null` instead, so that it does not answer first.
      const invalid = json && bytes.length > 0 ? parseError(bytes) : undefined;
      if (invalid !== undefined) bytes = Buffer.from("null");
      request[INTAKE] = { body, invalid };
      const again = Readable.from(bytes.length === 0 ? [] : [bytes]);
      // Fastify checks the length it was told against this.
      again.receivedEncodedLength = body.byteLength;
      return again;
    });
    fastify.addHook("onSend", async (request, reply, payload) => {
      const capture = request[CAPTURE];
      if (capture === undefined) return payload;
      request[CAPTURE] = undefined;
      return capture.instead !== undefined ? answerInstead(capture, reply, idem) : answered(capture, reply, payload, idem);
    });
  }

  /**
   * Begins a guarded request (in the interceptor): resolves to RUN when the rest of the
   * request is to run (its answer is then captured under Nest, stored and sent), or to
   * nothing when the engine answered itself (a replay, a refusal, or a status query: a `GET`
   * with `Idempotency-Status`, answered from the store in the principal's scope, after the
   * guards).
   */
  async begin(req, res, ownAnswer) {
    const idem = this.idem;
    const headers = req.headers;
    const field = req.method === "GET" && idem.statusQueries ? headers[idem.statusHeader] : undefined;
    if (field !== undefined) {
      const key = headers[idem.keyHeader] ?? null;
      const reply = await idem.status({ req, target: req.originalUrl ?? req.url, key, status: field, headers });
      return this.#answerInstead(req, res, reply, ownAnswer);
    }
    const key = this.#keyOf(headers);
    if (!idem.protects(req.method, key !== null)) {
      const invalid = req[INTAKE]?.invalid;
      if (invalid !== undefined) throw parserRefusal(invalid);
      return RUN;
    }
    // A request whose body does not identify it (no key, none derived) is refused whatever
    // its body: the intake left it unread.
    const intake = req[INTAKE] ?? (idem.readsBody(req.method, key !== null) ? undefined : NO_BODY);
    if (intake === undefined) throw bodyTakenError();
    // A body past the limit that the intake let through, not knowing the handler.
    if (intake.refused !== undefined) {
      if (this.fastify) closeUnread(req.raw, res.raw);
      else closeUnread(req, res);
      return this.#answerInstead(req, res, await idem.serve(intake.refused, (answer) => answer), ownAnswer);
    }
    const held = { node: null, fastify: { resolve: null, reject: null, done: null, context: null, before: null } };
    const begun = await begin(
      idem,
      {
        req,
        method: req.method,
        target: req.originalUrl ?? req.url,
        route: undefined,
        key,
        lowWater: headers[idem.lowWaterHeader],
        contentType: headers["content-type"],
        headers,
        body: intake.body,
      },
      (context) => {
        req.idempotency = context;
        let answer;
        if (this.fastify) {
          held.fastify.context = context;
          // The headers set before the handler (hooks, guards): they stay on the engine's
          // replies.
          held.fastify.before = new Map(Object.entries(res.getHeaders()));
          answer = new Promise((resolve, reject) => {
            held.fastify.resolve = resolve;
            held.fastify.reject = reject;
          });
          req[CAPTURE] = held.fastify;
        } else {
          held.node = captureNode(res, idem.maxResponseBytes, context);
          answer = held.node.answer;
        }
        return answer;
      },
    );
    if (!begun.ran) return this.#answerInstead(req, res, begun.reply, ownAnswer);
    const done = begun.done;
    held.fastify.done = done;
    if (!this.fastify) {
      // What Nest writes is held back until the outcome is stored, then sent.
      done
        .then(
          (reply) => sendNode(res, reply, idem, held.node),
          async () => {
            held.node.release();
            if (res.headersSent || res.destroyed) return;
            // The core's about:blank 500, as every host renders a failure of its own.
            const problem = plainProblem(500, "the answer could not be recorded");
            res.writeHead(500, Object.fromEntries(problem.headers));
            res.end(Buffer.from(await problem.arrayBuffer()));
          },
        )
        // Only a failing problem hook gets here: the connection is closed, not left open.
        .catch(() => res.destroy());
    } else {
      // Awaited in onSend; an answer that never reaches it leaves nothing unhandled.
      done.catch(() => {});
    }
    return RUN;
  }

  /**
   * Answers with the engine's `reply` in place of the handler: it replaces what Nest then
   * writes (of nothing), or, for a handler that answers by itself (`@Res()` or `@Next()`
   * without passthrough), for which Nest writes nothing, it is sent at once. Resolves to
   * nothing: the handler does not run.
   */
  async #answerInstead(req, res, reply, ownAnswer) {
    const idem = this.idem;
    if (ownAnswer) {
      if (this.fastify) await sendReply(res, reply, idem);
      else await sendNode(res, reply, idem);
    } else if (this.fastify) req[CAPTURE] = { instead: reply, before: new Map(Object.entries(res.getHeaders())) };
    else sendInstead(res, reply, idem).catch(() => res.destroy());
    return undefined;
  }
}

/** Whether the handler answers by itself (Nest's own rule: a `@Res()` or `@Next()`
 * parameter, without `passthrough`), so that Nest writes nothing after it. */
function answersItself(context) {
  const owner = context.getClass();
  const name = context.getHandler().name;
  const args = Reflect.getMetadata(ROUTE_ARGS_METADATA, owner, name) ?? {};
  const own = Object.keys(args).some((k) => {
    const type = Number(k.split(":")[0]);
    return type === RouteParamtypes.RESPONSE || type === RouteParamtypes.NEXT;
  });
  return own && Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, owner, name) !== true;
}

/** The `SyntaxError` of JSON bytes that do not parse; undefined when they do. */
function parseError(bytes) {
  try {
    JSON.parse(bytes.toString("utf8"));
    return undefined;
  } catch (err) {
    return err;
  }
}

/** Nest's answer to JSON its parser refuses (its 400, through the app's exception filters),
 * for a request the module does not guard whose JSON the intake took before routing. */
function parserRefusal(invalid) {
  return new BadRequestException(invalid.message);
}

function bodyTakenError() {
  const err = new Error(
    "idem/nestjs: the body of a guarded request was not read by IdempotencyModule's intake " +
      "(something read it first, or the application was not created with NestFactory.create), so it cannot be fingerprinted.",
  );
  err.code = "IDEM-JS-6";
  return err;
}

/**
 * The interceptor (registered globally by `IdempotencyModule.forRoot`): guards the handlers
 * marked `@Idempotent()`; others, and requests the engine does not protect, pass through.
 */
export class IdempotencyInterceptor {
  #reflector;
  #binding;
  constructor(reflector, binding) {
    this.#reflector = reflector;
    this.#binding = binding;
  }

  intercept(context, next) {
    if (context.getType() !== "http") return next.handle();
    const http = context.switchToHttp();
    if (this.#reflector.getAllAndOverride(IDEMPOTENT, [context.getHandler(), context.getClass()]) !== true) {
      // A handler not marked gets the request as without the module: JSON the intake took
      // that does not parse is Nest's 400, not a body of `undefined` (or `null`).
      const invalid = http.getRequest()[INTAKE]?.invalid;
      return invalid === undefined ? next.handle() : throwError(() => parserRefusal(invalid));
    }
    return from(this.#binding.begin(http.getRequest(), http.getResponse(), answersItself(context))).pipe(
      mergeMap((outcome) => (outcome === RUN ? next.handle() : of(undefined))),
    );
  }
}

/**
 * The module. `IdempotencyModule.forRoot(options)` takes `withIdempotency`'s options (a
 * store is required); `principal(req)` is called with the platform's request after the
 * guards, and defaults to the id of `req.user` (see `userOf`); `"none"` is for an API with a
 * single tenant. It is global: `@Idempotent()` works in every module, and `IDEMPOTENCY`
 * gives the `Idempotency` it made.
 */
export class IdempotencyModule {
  static forRoot(options) {
    return {
      module: IdempotencyModule,
      global: true,
      providers: [
        { provide: BINDING, useFactory: (host) => new Binding(options, host), inject: [HttpAdapterHost] },
        { provide: IDEMPOTENCY, useFactory: (binding) => binding.idem, inject: [BINDING] },
        { provide: APP_INTERCEPTOR, useFactory: (reflector, binding) => new IdempotencyInterceptor(reflector, binding), inject: [Reflector, BINDING] },
      ],
      exports: [IDEMPOTENCY],
    };
  }
}
Module({})(IdempotencyModule);
