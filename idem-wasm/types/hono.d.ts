// Types of `idem/hono`.
import type { IdempotencyOptions } from "idem";

/** Hono middleware with Idempotency-Key semantics. `principal` gets the Hono context. */
export function idempotency<C = any>(
  options: Omit<IdempotencyOptions, "principal"> & {
    principal: ((c: C) => string | number | Promise<string | number>) | "none";
    /** Requests to let through unguarded. */
    skip?: (c: C) => boolean | Promise<boolean>;
  },
): (c: C, next: () => Promise<void>) => Promise<void>;
