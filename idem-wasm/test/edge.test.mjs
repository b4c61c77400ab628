// The HTTP edge's own problems (plainProblem, methodNotAllowed): the core's about:blank
// renderer, for a host's routing errors and failures, against the built package.
import assert from "node:assert/strict";
import { test } from "node:test";
import { methodNotAllowed, plainProblem } from "idem";

test("plainProblem renders the core's about:blank problems, titled with the reason phrase", async () => {
  for (const [status, title] of [
    [400, "Bad Request"],
    [404, "Not Found"],
    [405, "Method Not Allowed"],
    [500, "Internal Server Error"],
    [503, "Service Unavailable"],
  ]) {
    const r = plainProblem(status, `detail ${status} "quoted" ✓`);
    assert.equal(r.status, status);
    assert.equal(r.headers.get("content-type"), "application/problem+json");
    assert.deepEqual(await r.json(), { detail: `detail ${status} "quoted" ✓`, status, title, type: "about:blank" });
  }
  assert.throws(
    () => plainProblem(418, "a teapot"),
    (err) => err instanceof RangeError && err.code === "IDEM-JS-1",
  );
});

test("methodNotAllowed names the methods the resource takes in Allow", async () => {
  const r = methodNotAllowed("GET, POST");
  assert.equal(r.status, 405);
  assert.equal(r.headers.get("allow"), "GET, POST");
  assert.equal(r.headers.get("content-type"), "application/problem+json");
  const body = await r.json();
  assert.equal(body.type, "about:blank");
  assert.equal(body.title, "Method Not Allowed");
  assert.match(body.detail, /GET, POST/);
});
