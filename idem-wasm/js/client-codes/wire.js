// Written by idem-wasm/tests/client_codes.rs from `Wire` (src/interop/), which defines
// these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test
// client_codes` writes it again.
export const Absent = 0;
export const Number = 1;
export const Bytes = 2;
export const Text = 3;
export const Error = 4;
