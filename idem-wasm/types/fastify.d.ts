// Types of `idem/fastify`.
import type { FastifyPluginCallback, FastifyRequest } from "fastify";
import type { IdempotencyContext, IdempotencyOptions } from "idem";

/** The options of the Fastify plugin: `withIdempotency`'s, with `principal` given the
 * Fastify request, plus `skip`. */
export type FastifyIdempotencyOptions<Req = FastifyRequest> = Omit<IdempotencyOptions, "principal" | "route"> & {
  principal: ((request: Req) => string | number | Promise<string | number>) | "none";
  /** Requests to let through unguarded. */
  skip?: (request: Req) => boolean | Promise<boolean>;
};

/** A Fastify 5 plugin with Idempotency-Key semantics, for the routes whose config has
 * `idempotency: true`, in the context it is registered in. It reads the raw body in
 * `preParsing` (kept as `request.rawBody`; Fastify still parses `request.body`), claims the
 * key there, and stores the answer in `onSend` before it leaves; replays carry
 * `Idempotent-Replayed: true`, refusals are problem+json. A `GET` with `Idempotency-Status`
 * is a status query. Errors go to Fastify's error handling. */
export declare const idempotency: FastifyPluginCallback<FastifyIdempotencyOptions>;
export default idempotency;

declare module "fastify" {
  interface FastifyRequest {
    /** The raw body, read by the idempotency plugin for the fingerprint (guarded routes). */
    rawBody?: Uint8Array;
    /** The idempotency context of the execution (the request that runs). */
    idempotency?: IdempotencyContext;
  }
  interface FastifyContextConfig {
    /** Guards this route with the idempotency plugin. */
    idempotency?: boolean;
  }
}
