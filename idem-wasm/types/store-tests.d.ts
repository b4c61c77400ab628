// Types of `idem/store-tests`.
import type { IdempotencyStore } from "idem";

/** Registers the store tests with `test` (node:test's, Deno's or Bun's). */
export function storeTests(
  test: (name: string, fn: () => Promise<void>) => unknown,
  options: {
    name?: string;
    open: () => IdempotencyStore | Promise<IdempotencyStore>;
    outage?: () => IdempotencyStore | Promise<IdempotencyStore>;
    shared?: boolean;
    selfExpiring?: boolean;
    maxResponseBytes?: number;
  },
): void;
