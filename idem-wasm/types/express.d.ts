// Types of `idem/express`.
import type { IdempotencyContext, IdempotencyOptions } from "idem";

/** Express middleware with Idempotency-Key semantics. Mount it before body parsers: it
 * sets `req.rawBody`, `req.body` (JSON) and `req.idempotency`; a body already read by a
 * middleware before it is an error with code `IDEM-JS-6`. Every error goes to `next(err)`.
 * `principal` gets the Express request. */
export function idempotency<Req = any, Res = any>(
  options: Omit<IdempotencyOptions, "principal" | "route"> & {
    principal: ((req: Req) => string | number | Promise<string | number>) | "none";
    /** Requests to let through unguarded. */
    skip?: (req: Req) => boolean | Promise<boolean>;
  },
): (req: Req, res: Res, next: (err?: unknown) => void) => void;

declare global {
  namespace Express {
    interface Request {
      /** The raw body, read by the idempotency middleware for the fingerprint. */
      rawBody?: Uint8Array;
      /** The idempotency context of the execution (the request that runs). */
      idempotency?: IdempotencyContext;
    }
  }
}
