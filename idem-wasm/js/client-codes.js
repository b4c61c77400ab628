// Written by idem-wasm/tests/client_codes.rs from the enums of src/interop/ (call.rs and
// client.rs), which define these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p
// idem-wasm --test client_codes` writes it again.
/** The client module's operations (`ClientOp`). */
export const ClientOp = Object.freeze({
  Names: 0,
  Digest: 1,
  KeyV4: 2,
  KeyV7: 3,
  Create: 4,
  Restore: 5,
  NextSend: 6,
  NextAsk: 7,
  CheckPayload: 8,
  Send: 9,
  OnResponse: 10,
  OnNetworkError: 11,
  OnStatus: 12,
  MarkProcessed: 13,
  StatusField: 14,
  CounterNew: 15,
  CounterRestore: 16,
  CounterTake: 17,
  CounterDone: 18,
  CounterLowWater: 19,
  Echo: 20,
  PayloadMessage: 21,
});
/** The tags of a call's values (`Wire`). */
export const Wire = Object.freeze({
  Absent: 0,
  Number: 1,
  Bytes: 2,
  Text: 3,
  Error: 4,
});
/** What `idempotentFetch` resolves to (`FetchOutcome`). */
export const FetchOutcome = Object.freeze({
  Completed: 0,
  Rejected: 1,
  Failed: 2,
  Undetermined: 3,
  Executed: 4,
  NotExecuted: 5,
});
/** What the outbox says to do next (`NextKind`). */
export const NextKind = Object.freeze({
  Complete: 0,
  Retry: 1,
  Failed: 2,
  Undetermined: 3,
  AskStatus: 4,
  Executed: 5,
  NotExecuted: 6,
});
/** Where an outbox entry stands (`OutboxState`). */
export const OutboxState = Object.freeze({
  Created: 0,
  Sent: 1,
  Waiting: 2,
  Answered: 3,
  Processed: 4,
  Failed: 5,
  Undetermined: 6,
  Asking: 7,
  Executed: 8,
  NotExecuted: 9,
});
