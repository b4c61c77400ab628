// Errors with a stable code, shared by the main bundle and the entries beside it (stores,
// adapters), which must not pull in the WebAssembly glue.

/** A RangeError with a stable code (a requirement ID from spec/requirements.toml). */
export function rangeError(code, message) {
  const e = new RangeError(message);
  e.code = code;
  return e;
}
