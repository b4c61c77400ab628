// The answers of the HTTP edge that idem has no problem type of its own for (a route that does
// not exist, a method a resource does not take, a failure of the host): RFC 9457's
// `about:blank` problems, rendered by the core, so that a host answers them as every host
// built on idem does instead of writing problem bodies by hand.
import { methodNotAllowedReply, plainReply } from "./idem_wasm.js";
import { readReply, toResponse } from "./util.js";
import { STALLED } from "./errors.js";

/**
 * An `about:blank` problem+json Response of `status` (400, 404, 405, 500 or 503), titled with
 * the status's reason phrase, with `detail`. Throws a RangeError (IDEM-JS-1) for another
 * status.
 */
export function plainProblem(status, detail) {
  return toResponse(readReply(plainReply(status, String(detail ?? ""))));
}

/** The reply to the caller of an attempt whose answer stalled past its lease (IDEM-OUT-7):
 * the core's 500 about:blank problem. */
export function stalledReply() {
  return readReply(plainReply(500, STALLED));
}

/** 405, naming the methods the resource takes (`allow`, for example `"POST"`) in `Allow`. */
export function methodNotAllowed(allow) {
  return toResponse(readReply(methodNotAllowedReply(String(allow))));
}
