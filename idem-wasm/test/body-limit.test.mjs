// Bodies without a declared length, and the in-flight wait policy's waiters, against the built package.
import assert from "node:assert/strict";
import { test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";

test("a chunked body past the limit is refused with 413 after reading only up to the limit (IDEM-LIMIT-1)", async () => {
  let executions = 0;
  const handler = withIdempotency(
    async () => {
      executions++;
      return new Response("ok", { status: 201 });
    },
    { principal: "none", store: new MemoryStore(), fingerprint: { maxBody: 1024 } },
  );
  let pulled = 0;
  let cancelled = false;
  const endless = new ReadableStream({
    pull(controller) {
      pulled++;
      controller.enqueue(new Uint8Array(256));
    },
    cancel() {
      cancelled = true;
    },
  });
  const request = new Request("http://127.0.0.1/orders", {
    method: "POST",
    headers: { "idempotency-key": '"chunked-1"', "content-type": "application/octet-stream" },
    body: endless,
    duplex: "half",
  });
  const response = await handler(request);
  assert.equal(response.status, 413);
  assert.equal(response.headers.get("content-type"), "application/problem+json");
  assert.equal((await response.json()).type, "urn:idem:problem:body-too-large");
  assert.equal(executions, 0);
  assert.ok(cancelled, "the upload is cancelled");
  assert.ok(pulled <= 8, `read ${pulled} chunks of 256 bytes for a 1024-byte limit`);

  // A chunked body within the limit is read whole and executes.
  const small = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode("ab"));
      controller.enqueue(new TextEncoder().encode("cd"));
      controller.close();
    },
  });
  const ok = await handler(
    new Request("http://127.0.0.1/orders", {
      method: "POST",
      headers: { "idempotency-key": '"chunked-2"', "content-type": "application/octet-stream" },
      body: small,
      duplex: "half",
    }),
  );
  assert.equal(ok.status, 201);
  assert.equal(executions, 1);
});
