//! A deterministic, sans-IO engine for `Idempotency-Key` semantics.
//!
//! This crate contains no networking code, no storage, no clock and no randomness: every
//! timestamp ([`UnixMillis`]) and every random value arrives as an argument, and the machines
//! answer with what the host does next: read a record, apply a compare-and-set [`Write`] to
//! its own store, run the handler, wait, reply. The same inputs always give the same outputs,
//! which is what makes the simulation and model tests of this crate meaningful, and what lets
//! a host commit an idempotency record in the same database transaction as its own data.
//!
//! # Driving a request
//!
//! A host protects its requests with one [`Policy`] (the [`Engine`] and its settings, the
//! [`KeyKind`], the [`FingerprintSpec`], the [`InFlight`] policy) and one [`Request`] per
//! request, made from what the host received ([`Policy::request`] of an [`Intake`]): a
//! sans-IO machine that owns the whole lifecycle (identify, claim and decide again after a
//! lost race, wait for or refuse a duplicate in flight, run the handler under a lease with
//! heartbeats, record the outcome before the response leaves) and renders every answer it
//! gives itself ([`Reply`]). The host polls it for the next [`Step`] (read the record, apply a
//! write, wait, run the handler, reply) and feeds back what its store answered;
//! [`Request::drive`] does that over any synchronous [`Store`], and an [`AsyncStore`] is
//! driven with the same steps, one await each. A store that claims for the host (a Durable
//! Object next to its storage) takes the request's [`Ticket`], runs the claim on its side
//! ([`Policy::resume`]) and answers with a [`Claimed`].
//!
//! The same machine, with the same steps and the same loop, serves what a host answers
//! beside its guarded requests: opening a counter client's session
//! ([`Policy::open_session`]), issuing one-time tokens ([`Policy::issue_token`]), and the
//! deliveries of redelivered messages to an [`Inbox`] ([`Inbox::deliver`]).
//!
//! # Stores and records
//!
//! [`MemoryStore`] is the reference store. Stores drive expiry with
//! [`Record::next_deadline`] (an alarm or a sweep) and [`Record::expire`]; the engine also
//! reads expiry times directly from the record, so a store that sweeps late is never less
//! safe, only larger. Records cross process and language boundaries through the record codec
//! ([`encode_record`], [`decode_record`]), sealed for stores outside the process with [`seal`];
//! [`stores`] holds what the Redis and Postgres stores
//! of every language share.
//!
//! # Keys and the client side
//!
//! Besides opaque and UUID keys ([`parse_opaque_lenient`], [`parse_opaque_strict`],
//! [`parse_uuid`]), a policy takes key kinds with rules of their own over the same records and
//! the same store contract: client timestamps ([`KeyKind::Time`], [`parse_time_key`]),
//! wrapping per-client counters with a window and a low-water mark ([`KeyKind::Counter`],
//! [`parse_counter_key`], and [`CounterSequence`] on the client), server-issued one-time
//! tokens ([`KeyKind::Token`]), and keys derived from the request ([`KeyFallback::Derived`],
//! [`derive_key`], [`sub_key`]). The client half of the protocol is [`OutboxEntry`]: when to
//! retry with the same key, and when to give up as *undetermined* rather than failed.
//! `spec/KINDS.md` has the rules.
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
mod persist;
mod problem;
mod record;
mod reply;
mod request;
mod response;
pub mod seal;
mod session;
mod store;
pub mod stores;
pub mod telemetry;
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
    CompleteError, Config, ConfigError, Decision, Engine, Lease, Outcome, RejectReason,
    UnknownOutcomePolicy, DEFAULT_MAX_RETRY_AFTER, RETRY_SOON_SECS,
};
pub use event::Event;
pub use fingerprint::{
    payload_digest, payload_message, FieldDigests, Fingerprint, FingerprintError, FingerprintSpec,
    JsonMode, RequestParts,
};
pub use key::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, RecordKey, Scope, UuidVersion,
    MAX_IN_CLEAR, MAX_KEY_LEN,
};
pub use memory::{
    MemoryStore, MemoryStoreError, MemoryStoreLimits, MemoryStoreStats, ENTRY_OVERHEAD,
    SWEEP_PER_WRITE,
};
pub use problem::Problem;
pub use record::{Expiry, Precondition, Record, RecordState, Write, WriteOp};
pub use reply::{
    Plain, Refusal, Reply, ABOUT_BLANK, KEY_HEADER, LOW_WATER_HEADER, PROBLEM_JSON,
    REPLAYED_HEADER, STATUS_HEADER, STATUS_MEDIA_TYPE,
};
pub use request::{
    BodyReader, Claimed, Context, Heartbeat, Hold, InFlight, Intake, KeyFallback, KeyKind,
    KeyStatus, Message, Operation, Policy, Request, StatusQuery, Step, Subject, Target, Ticket,
    Waiters, DEFAULT_MAX_RESPONSE_BYTES, MAX_COMPLETION_ROUNDS, MAX_LOST_RACES,
};
pub use response::StoredResponse;
pub use session::{CounterSession, CounterSlot, SlotState, MAX_WINDOW};
pub use store::{Applied, AsyncStore, Completing, Finish, Store, StoreFailure};
pub use time::UnixMillis;

pub use client::{
    backoff_ms, decode_entry, encode_entry, uuid_v4_key, uuid_v7_key, ClientError, ClientResponse,
    Completion, EntryDecodeError, EntryState, GiveUp, KeyAnswer, NetworkError, NextStep,
    OutboxEntry, RetryPolicy, ENTRY_FORMAT_VERSION, MAX_ENTRY_BYTES, MAX_STATUS_ASKS,
};
pub use counter::{
    parse_counter_key, serial_cmp, CounterConfig, CounterError, CounterKey, CounterLease,
    CounterSequence,
};
pub use derive::{derive_key, sub_key, DeriveError, DERIVED_PREFIX, SUB_KEY_LABEL_LEN};
pub use inbox::{Delivery, Inbox};
pub use kind::{KindConfigError, KindKeyError, MAX_CLIENT_ID_LEN};
pub use timekey::{parse_time_key, time_key_of, TimeKey, TimeKeyConfig};
pub use token::{TokenSecret, TOKEN_LEN, TOKEN_PREFIX};

// The README's example runs as a doc test, so the crate page never shows code that does
// not compile.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
