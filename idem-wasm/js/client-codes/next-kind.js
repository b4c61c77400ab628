// Written by idem-wasm/tests/client_codes.rs from `NextKind` (src/interop/), which defines
// these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test
// client_codes` writes it again.
export const Complete = 0;
export const Retry = 1;
export const Failed = 2;
export const Undetermined = 3;
export const AskStatus = 4;
export const Executed = 5;
export const NotExecuted = 6;
