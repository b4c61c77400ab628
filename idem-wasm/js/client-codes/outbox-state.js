// Written by idem-wasm/tests/client_codes.rs from `OutboxState` (src/interop/), which defines
// these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test
// client_codes` writes it again.
export const Created = 0;
export const Sent = 1;
export const Waiting = 2;
export const Answered = 3;
export const Processed = 4;
export const Failed = 5;
export const Undetermined = 6;
export const Asking = 7;
export const Executed = 8;
export const NotExecuted = 9;
