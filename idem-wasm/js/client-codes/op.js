// Written by idem-wasm/tests/client_codes.rs from `ClientOp` (src/interop/), which defines
// these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test
// client_codes` writes it again.
export const PayloadMessage = 0;
export const Digest = 1;
export const KeyV4 = 2;
export const KeyV7 = 3;
export const Create = 4;
export const Restore = 5;
export const NextSend = 6;
export const NextAsk = 7;
export const CheckPayload = 8;
export const Send = 9;
export const OnResponse = 10;
export const OnNetworkError = 11;
export const OnStatus = 12;
export const MarkProcessed = 13;
export const StatusField = 14;
export const CounterNew = 15;
export const CounterRestore = 16;
export const CounterTake = 17;
export const CounterDone = 18;
export const CounterLowWater = 19;
export const Echo = 20;
