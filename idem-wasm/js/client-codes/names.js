// Written by idem-wasm/tests/client_codes.rs from idem-core's names and `FetchOutcome`
// (src/interop/): do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test
// client_codes` writes it again.
export const key = "idempotency-key";
export const lowWater = "idempotency-low-water";
export const replayed = "idempotent-replayed";
export const status = "idempotency-status";
export const statusMediaType = "application/vnd.idem.key-status+json";
export const problemMediaType = "application/problem+json";
export const statusMembers = [["status"],["response","status"],["response","replayable"],["retryAfter"]];
export const outcomes = ["completed","rejected","failed","undetermined","executed","not-executed"];
