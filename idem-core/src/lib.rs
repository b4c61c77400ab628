//! A deterministic, sans-IO engine for `Idempotency-Key` semantics.
//!
//! This crate contains no networking code, no storage, no clock and no randomness: every
//! timestamp ([`UnixMillis`]) and every random value arrives as an argument, and the engine
//! answers with decisions and compare-and-set [`Write`]s that the caller applies to its own
//! store. The same inputs always give the same outputs, which is what makes the simulation
//! and model tests of this crate meaningful, and what lets a host commit an idempotency
//! record in the same database transaction as its own data.
//!
//! # Driving the engine
//!
//! A host handles one request in three steps:
//!
//! 1. **Identify.** Parse the key ([`parse_opaque_strict`], [`parse_opaque_lenient`],
//!    [`parse_uuid`]), build the [`Scope`] (by default principal + method + route) and the
//!    request [`Fingerprint`] ([`FingerprintSpec::fingerprint`]).
//! 2. **Claim.** Read the current [`Record`] for the [`RecordKey`] (or none) from the store and
//!    call [`Engine::decide`]. On [`Decision::Execute`], apply its [`Write`] with the store's
//!    one atomic conditional write. If the store reports a lost race, read again and decide
//!    again: another attempt got there first. Every other decision maps to a response
//!    ([`Decision::problem`] gives the HTTP status and `application/problem+json` type).
//! 3. **Complete.** Run the handler, classify its result as an [`Outcome`] and apply
//!    [`Engine::complete`]'s write *before* the response leaves the host. A lost race here
//!    means the lease was fenced out: another attempt took over after this one's lease
//!    expired, and this attempt's result must not be stored. Long handlers call
//!    [`Engine::extend`] as a heartbeat.
//!
//! [`Store::claim`] and [`Store::finish`] run steps 2 and 3 for any synchronous [`Store`];
//! [`MemoryStore`] is the reference store.
//!
//! Stores drive expiry with [`Record::next_deadline`] (an alarm or a sweep) and
//! [`Record::expire`]; the engine also reads expiry times directly from the record, so a
//! store that sweeps late is never less safe, only larger.
//!
//! # Other key kinds and the client side
//!
//! Besides opaque and UUID keys, the crate has first-class key kinds, each with its own
//! rules over the same records and the same store contract: client timestamps
//! ([`TimeKeys`]), wrapping per-client counters with a window and a low-water mark
//! ([`Counters`]), server-issued one-time tokens ([`Tokens`]), keys derived from the request
//! ([`derive_key`], [`sub_key`]), and an [`Inbox`] for receivers of redelivered messages. The
//! client half of the protocol is [`OutboxEntry`]: when to retry with the same key, and when
//! to give up as *undetermined* rather than failed. `spec/KINDS.md` has the rules.
//!
//! The requirement IDs cited in the docs (`IDEM-…`) are defined in `spec/requirements.toml`.
#![no_std]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

extern crate alloc;
// `std` is only linked for the `std` feature and for tests, so that everyone gets an error
// when they reach for the std prelude by accident.
#[cfg(any(feature = "std", test))]
extern crate std;

mod canon;
mod codec;
mod engine;
mod event;
mod fingerprint;
mod key;
mod memory;
mod problem;
mod record;
mod store;
mod time;

// Key kinds beyond the IETF draft's opaque keys, and the client side.
mod client;
mod counter;
mod derive;
mod inbox;
mod kind;
mod timekey;
mod token;

pub use codec::{
    decode_record, encode_record, DecodeError, MAX_RECORD_BYTES, RECORD_FORMAT_VERSION,
};
pub use engine::{
    Attempt, CompleteError, Config, ConfigError, Decision, Engine, Lease, Outcome, RejectReason,
    UnknownOutcomePolicy,
};
pub use event::Event;
pub use fingerprint::{
    FieldDigest, Fingerprint, FingerprintError, FingerprintSpec, JsonMode, RequestParts,
};
pub use key::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, RecordKey, Scope, UuidVersion,
    MAX_KEY_LEN,
};
pub use memory::{MemoryStore, MemoryStoreError, MemoryStoreLimits, MemoryStoreStats};
pub use problem::Problem;
pub use record::{Expiry, Precondition, Record, RecordState, StoredResponse, Write, WriteOp};
pub use store::{Applied, Claim, Finish, Store, MAX_LOST_RACES};
pub use time::UnixMillis;

pub use client::{
    backoff_ms, decode_entry, encode_entry, uuid_v4_key, ClientError, ClientResponse, Completion,
    EntryDecodeError, EntryState, GiveUp, KeyAnswer, NetworkError, NextStep, OutboxEntry,
    RetryPolicy, ENTRY_FORMAT_VERSION, MAX_ENTRY_BYTES,
};
pub use counter::{
    parse_counter_key, serial_cmp, CounterAttempt, CounterClaim, CounterConfig, CounterDecision,
    CounterError, CounterKey, CounterLease, CounterSession, CounterSlot, Counters, OpenedSession,
    SlotState, MAX_WINDOW,
};
pub use derive::{derive_key, sub_key, DeriveError, DERIVED_PREFIX, SUB_KEY_LABEL_LEN};
pub use inbox::{Delivery, Inbox};
pub use kind::{KindConfigError, KindKeyError, MAX_CLIENT_ID_LEN};
pub use timekey::{parse_time_key, TimeKey, TimeKeyConfig, TimeKeys};
pub use token::{IssuedToken, TokenSecret, Tokens, TOKEN_LEN, TOKEN_PREFIX};

// The README's example runs as a doc test, so the crate page never shows code that does
// not compile.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
