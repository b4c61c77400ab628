//! A deterministic, sans-IO engine for `Idempotency-Key` semantics.
//!
//! This crate contains no networking code, no storage, no clock and no randomness: every
//! timestamp ([`UnixMillis`]) and every random value arrives as an argument, and the engine
//! answers with decisions and compare-and-set [`Write`]s that the caller applies to its own
//! store. The same inputs always give the same outputs, which is what makes the simulation
//! and model tests of this crate meaningful, and what lets a host commit an idempotency
//! record in the same database transaction as its own data.
//!
//! # Driving a request
//!
//! A host protects its requests with one [`Policy`] (the [`Engine`] and its settings, the
//! [`KeyKind`], the [`FingerprintSpec`], the [`InFlight`] policy) and one [`Request`] per
//! request: a sans-IO machine that owns the whole lifecycle (identify, claim and decide
//! again after a lost race, wait for or refuse a duplicate in flight, run the handler under a
//! lease with heartbeats, record the outcome before the response leaves) and renders every
//! answer it gives itself ([`Reply`]). The host polls it for the next [`Step`] (read the
//! record, apply a write, wait, run the handler, reply) and feeds back what its store
//! answered; [`Request::drive`] does that over any synchronous [`Store`], and an
//! [`AsyncStore`] is driven with the same steps, one await each.
//!
//! Underneath, [`Engine::decide`], [`Engine::complete`] and [`Engine::extend`] decide one step
//! each and return compare-and-set [`Write`]s; [`Store::claim`] and [`Store::finish`] are the
//! machine's claim and completion for hosts that hold the lease themselves. [`MemoryStore`]
//! is the reference store.
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
mod deadlines;
mod engine;
mod event;
mod fingerprint;
mod key;
mod memory;
mod problem;
mod record;
mod reply;
mod request;
mod store;
pub mod stores;
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
    UnknownOutcomePolicy, DEFAULT_MAX_RETRY_AFTER, RETRY_SOON_SECS,
};
pub use event::Event;
pub use fingerprint::{
    FieldDigests, Fingerprint, FingerprintError, FingerprintSpec, JsonMode, RequestParts,
};
pub use key::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, RecordKey, Scope, UuidVersion,
    MAX_KEY_LEN,
};
pub use memory::{MemoryStore, MemoryStoreError, MemoryStoreLimits, MemoryStoreStats};
pub use problem::Problem;
pub use record::{Expiry, Precondition, Record, RecordState, StoredResponse, Write, WriteOp};
pub use reply::{
    Plain, Refusal, Reply, StoreFailure, ABOUT_BLANK, KEY_HEADER, LOW_WATER_HEADER, PROBLEM_JSON,
    REPLAYED_HEADER, STATUS_HEADER, STATUS_MEDIA_TYPE,
};
pub use request::{
    principal_digest, BodyReader, Claimed, Context, Heartbeat, Hold, InFlight, Intake, KeyFallback,
    KeyKind, KeyStatus, Message, Operation, Policy, Request, StatusQuery, Step, Subject, Target,
    Ticket, Waiters, DEFAULT_MAX_RESPONSE_BYTES, MAX_COMPLETION_ROUNDS, MAX_LOST_RACES,
};
pub use store::{Applied, AsyncStore, Claim, Completing, Finish, Store};
pub use time::UnixMillis;

pub use client::{
    backoff_ms, decode_entry, encode_entry, uuid_v4_key, ClientError, ClientResponse, Completion,
    EntryDecodeError, EntryState, GiveUp, KeyAnswer, NetworkError, NextStep, OutboxEntry,
    RetryPolicy, ENTRY_FORMAT_VERSION, MAX_ENTRY_BYTES, MAX_STATUS_ASKS,
};
pub use counter::{
    parse_counter_key, serial_cmp, CounterAttempt, CounterClaim, CounterConfig, CounterDecision,
    CounterError, CounterKey, CounterLease, CounterSequence, CounterSession, CounterSlot, Counters,
    OpenedSession, SlotState, MAX_WINDOW,
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
