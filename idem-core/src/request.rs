//! The per-request machine: everything that happens around one request, written once.

use crate::counter::{CounterAttempt, CounterConfig, CounterDecision, CounterKey, CounterLease};
use crate::counter::{CounterError, Counters};
use crate::engine::{
    Attempt, CompleteError, ConfigError, Decision, Engine, Lease, Outcome, RejectReason,
};
use crate::event::Event;
use crate::fingerprint::{Fingerprint, FingerprintSpec, RequestParts};
use crate::key::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, RecordKey, Scope, UuidVersion,
};
use crate::kind::{parse_decimal, KindConfigError};
use crate::problem::Problem;
use crate::record::{Record, RecordState, StoredResponse, Write};
use crate::reply::{Refusal, Reply, StoreFailure};
use crate::store::{Applied, Claim, Completing, Finish, Store};
use crate::time::UnixMillis;
use crate::timekey::{parse_time_key, TimeKey, TimeKeyConfig, TimeKeys};
use crate::token::{TokenSecret, Tokens};
use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;
use hashbrown::HashMap;

/// Lost races a claim tolerates before it answers [`Decision::CONTENDED`]. Each lost race
/// means another attempt wrote the record between this request's read and its write; many in
/// a row mean the key is being fought over, and the honest answer is "in progress". Counter
/// sessions, which all requests of one client share, lose more races than keys do: the bound
/// covers a window of concurrent requests.
pub const MAX_LOST_RACES: usize = 16;

/// Lost races a completion or heartbeat tolerates before it gives up as fenced out (the
/// record then stays in flight until its lease ends, as after a crash). A completion loses a
/// race only to its own heartbeat (records) or to other requests of the same client
/// (counter sessions), so it keeps trying for longer than a claim.
pub const MAX_COMPLETION_ROUNDS: usize = 64;

/// What a host does with a request whose key is held by an attempt in flight
/// (`IDEM-CONC-1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InFlight {
    /// Answer at once: 409 `in-progress` with `Retry-After` (the default).
    #[default]
    Reject,
    /// Look again every `poll` until the first attempt's result is stored (then replay it),
    /// its lease ends (then take over) or `max` has passed (then 409). Only the latest
    /// waiter for a key keeps waiting: an earlier one, whose client has retried since, is
    /// answered at once ([`Waiters`]).
    Wait {
        /// The longest wait.
        max: Duration,
        /// How often to look again.
        poll: Duration,
    },
}

/// How keys are read from the request, and which rules their records follow.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum KeyKind {
    /// An RFC 8941 sf-string or a Stripe-style bare key (`IDEM-KEY-1`, `IDEM-KEY-2`).
    Opaque,
    /// An RFC 8941 sf-string only.
    OpaqueStrict,
    /// A UUID, of the given version when one is named (`IDEM-KEY-4`).
    Uuid(Option<UuidVersion>),
    /// A client timestamp (`IDEM-TIME-1` to `IDEM-TIME-5`).
    Time(TimeKeyConfig),
    /// A wrapping per-client counter (`IDEM-CTR-1` to `IDEM-CTR-13`).
    Counter(CounterConfig),
    /// A server-issued one-time token (`IDEM-TOKEN-1` to `IDEM-TOKEN-4`).
    Token {
        /// The signing secret.
        secret: TokenSecret,
        /// How long an unconsumed token is valid.
        ttl: Duration,
    },
}

/// The rules a request's record follows, resolved from a [`KeyKind`].
#[derive(Clone, Debug)]
enum Rules {
    Record(Engine),
    Time(TimeKeys),
    Counter(Counters),
    Token(Tokens),
}

impl Rules {
    fn engine(&self) -> Option<&Engine> {
        match self {
            Rules::Record(e) => Some(e),
            Rules::Time(t) => Some(t.engine()),
            Rules::Token(t) => Some(t.engine()),
            Rules::Counter(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parse {
    Lenient,
    Strict,
    Uuid(Option<UuidVersion>),
}

/// What a request's key names beyond its record key: the data its kind decides with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Subject {
    /// An opaque or UUID key: the record key says it all.
    Record,
    /// A time key.
    Time(TimeKey),
    /// A counter key, with the host's scope and the client's low-water mark.
    Counter {
        /// The host's scope (the session lives in its counter scope).
        scope: Scope,
        /// The key.
        key: CounterKey,
        /// The client's low-water mark, if it sent one.
        low_water: Option<u64>,
    },
    /// A token, with the host's scope it was issued for.
    Token {
        /// The host's scope.
        scope: Scope,
        /// The token.
        token: String,
    },
}

/// Everything a host needs to protect its requests: the engine, the key kind, what goes
/// into fingerprints, the in-flight policy, which requests are guarded, and the largest
/// response its store keeps. One `Policy` serves every request of a host; it makes a
/// [`Request`] for each.
#[derive(Clone, Debug)]
pub struct Policy {
    engine: Engine,
    parse: Parse,
    rules: Rules,
    fingerprint: FingerprintSpec,
    in_flight: InFlight,
    methods: Vec<String>,
    keys_required: bool,
    max_response_bytes: usize,
    /// Where a request without a key header finds its key (`IDEM-DERIVE-4`,
    /// `IDEM-KEY-7`).
    fallback: KeyFallback,
}

/// Where a guarded request without an `Idempotency-Key` header gets its key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeyFallback {
    /// Nowhere: it is refused (keys required) or runs unprotected.
    #[default]
    None,
    /// Derived from the scope, the operation (method and route) and the fingerprint, with
    /// the fingerprint's excluded fields left out (`IDEM-DERIVE-4`). Two identical requests
    /// are then one request: a deliberate second identical order is replayed, not run.
    Derived,
    /// The string at this JSON pointer in the body (`IDEM-KEY-7`), for clients behind
    /// proxies that drop headers.
    JsonPointer(String),
}

/// The largest response a [`Policy`] stores by default: every record it writes stays
/// within [`MAX_RECORD_BYTES`](crate::MAX_RECORD_BYTES), with room for the record's own
/// fields.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = crate::codec::MAX_RECORD_BYTES - (64 << 10);

impl Policy {
    /// Opaque keys (lenient), the default fingerprint, in-flight requests rejected, `POST`
    /// and `PATCH` guarded, keys required.
    pub fn new(engine: Engine) -> Policy {
        Policy {
            rules: Rules::Record(engine.clone()),
            engine,
            parse: Parse::Lenient,
            fingerprint: FingerprintSpec::default(),
            in_flight: InFlight::Reject,
            methods: alloc::vec![String::from("POST"), String::from("PATCH")],
            keys_required: true,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            fallback: KeyFallback::None,
        }
    }

    /// Where a request without a key header finds its key: derived from the request, or
    /// read from the body at a JSON pointer. Only for opaque and UUID keys; a key header,
    /// when present, always wins.
    pub fn with_key_fallback(mut self, fallback: KeyFallback) -> Policy {
        self.fallback = fallback;
        self
    }

    /// The key kind. Time, counter and token settings are checked against the engine's
    /// retention.
    pub fn with_keys(mut self, kind: KeyKind) -> Result<Policy, KindConfigError> {
        let engine = self.engine.clone();
        (self.parse, self.rules) = match kind {
            KeyKind::Opaque => (Parse::Lenient, Rules::Record(engine)),
            KeyKind::OpaqueStrict => (Parse::Strict, Rules::Record(engine)),
            KeyKind::Uuid(v) => (Parse::Uuid(v), Rules::Record(engine)),
            KeyKind::Time(c) => (Parse::Lenient, Rules::Time(TimeKeys::new(engine, c)?)),
            KeyKind::Counter(c) => (Parse::Lenient, Rules::Counter(Counters::new(engine, c)?)),
            KeyKind::Token { secret, ttl } => (
                Parse::Lenient,
                Rules::Token(Tokens::new(engine, secret, ttl)?),
            ),
        };
        Ok(self)
    }

    /// What goes into fingerprints.
    pub fn with_fingerprint(mut self, spec: FingerprintSpec) -> Policy {
        self.fingerprint = spec;
        self
    }

    /// The in-flight policy; a zero wait or poll interval is refused.
    pub fn with_in_flight(mut self, in_flight: InFlight) -> Result<Policy, ConfigError> {
        if let InFlight::Wait { max, poll } = in_flight {
            for (name, d) in [("in-flight wait", max), ("in-flight poll", poll)] {
                if d.is_zero() {
                    return Err(ConfigError::ZeroDuration(name));
                }
            }
        }
        self.in_flight = in_flight;
        Ok(self)
    }

    /// The methods whose requests are guarded (case-sensitive, as HTTP methods are).
    pub fn with_methods<I, S>(mut self, methods: I) -> Policy
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.methods = methods.into_iter().map(Into::into).collect();
        self
    }

    /// Whether a guarded request without a key is refused (`true`, the default) or runs
    /// unprotected.
    pub fn with_keys_required(mut self, required: bool) -> Policy {
        self.keys_required = required;
        self
    }

    /// The largest response the host's store can keep (`IDEM-STORE-5`): a larger final
    /// response is replaced in the store by a `response-not-stored` answer.
    pub fn with_max_response_bytes(mut self, max: usize) -> Policy {
        self.max_response_bytes = max.min(DEFAULT_MAX_RESPONSE_BYTES);
        self
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// What goes into fingerprints (a host reads [`FingerprintSpec::headers`] to pass the
    /// right header values).
    pub fn fingerprint_spec(&self) -> &FingerprintSpec {
        &self.fingerprint
    }

    /// The in-flight policy.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight
    }

    /// The largest response stored as it is.
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    /// Whether a request with this method is idempotency-protected: its method is guarded,
    /// and it carries a key or keys are required. Other requests go straight to the handler.
    pub fn protects(&self, method: &str, has_key: bool) -> bool {
        self.methods.iter().any(|m| m == method)
            && (has_key || self.keys_required || self.fallback != KeyFallback::None)
    }

    /// Refuses a body of `len` bytes, announced before it is read, that is larger than the
    /// fingerprint accepts (`IDEM-LIMIT-1`).
    // A refusal is built once per refused request and answered at once: boxing it would add
    // an allocation to every refusal for nothing.
    #[allow(clippy::result_large_err)]
    pub fn check_body_size(&self, len: u64) -> Result<(), Refusal> {
        if len > self.fingerprint.max_body as u64 {
            return Err(Refusal::body_too_large(len, self.fingerprint.max_body));
        }
        Ok(())
    }

    /// Identifies a request (key, scope, fingerprint) and returns its machine. A request
    /// that cannot be identified (no key, a malformed key or body, no principal) gets a
    /// machine that answers the refusal at once. `nonce` is a random value: the first
    /// version of a record this request creates.
    pub fn request(&self, intake: &Intake<'_>, nonce: u64) -> Request<'static> {
        match self.identify(intake) {
            Ok((key, fingerprint, subject)) => Request::new(
                self,
                Cow::Owned(key),
                Cow::Owned(fingerprint),
                subject,
                nonce,
            ),
            Err(refusal) => Request::refused(refusal),
        }
    }

    /// The scope of requests from `principal` (`None`: the host serves one tenant) with
    /// `method` to `route`: where their records live, what a token is issued for
    /// ([`Policy::issue_token`]) and where a counter session is opened
    /// ([`Policy::open_session`]). An empty principal is refused (`IDEM-SCOPE-3`).
    #[allow(clippy::result_large_err)] // as for check_body_size
    pub fn scope(
        &self,
        principal: Option<&str>,
        method: &str,
        route: &str,
    ) -> Result<Scope, Refusal> {
        let principal = match principal {
            Some("") => {
                return Err(Refusal::new(
                    Problem::NO_PRINCIPAL,
                    "the host gave no principal for this request",
                ))
            }
            Some(p) => principal_digest(p),
            // One tenant: the empty string, which no digest equals.
            None => String::new(),
        };
        Ok(Scope::new(&principal, method, route))
    }

    /// Issues a one-time token for requests in `scope` from 128 random bits
    /// (`IDEM-TOKEN-1`); `None` unless the policy's keys are server-issued tokens. Apply
    /// the token's write before handing it out.
    pub fn issue_token(
        &self,
        now: UnixMillis,
        scope: &Scope,
        random: [u64; 2],
    ) -> Option<crate::IssuedToken> {
        match &self.rules {
            Rules::Token(t) => Some(t.issue(now, scope, random)),
            _ => None,
        }
    }

    /// The machine that opens (or moves to a new epoch) the counter session of `client` in
    /// `scope`, its first number `first_seq` (`IDEM-CTR-3`, `IDEM-CTR-5`); `None` unless
    /// the policy's keys are counters. `nonce` is random: a new session's epoch.
    pub fn open_session(
        &self,
        scope: &Scope,
        client: &str,
        first_seq: u64,
        nonce: u64,
    ) -> Option<crate::SessionOpening> {
        match &self.rules {
            Rules::Counter(c) => Some(c.opening(scope, client, first_seq, nonce)),
            _ => None,
        }
    }

    #[allow(clippy::result_large_err)] // as for check_body_size
    fn identify(&self, i: &Intake<'_>) -> Result<(RecordKey, Fingerprint, Subject), Refusal> {
        let scope = self.scope(i.principal, i.method, i.route)?;
        if i.keys.is_empty() && matches!(self.rules, Rules::Record(_)) {
            match &self.fallback {
                KeyFallback::None => {}
                KeyFallback::Derived => return self.derived(i, scope),
                KeyFallback::JsonPointer(pointer) => {
                    let key = key_at(i.body, pointer)?;
                    return self.identify(&Intake {
                        keys: &[key.as_bytes()],
                        ..*i
                    });
                }
            }
        }
        let value = match i.keys {
            [] => Err(KeyError::Empty),
            [one] => Ok(*one),
            _ => Err(KeyError::List),
        }
        .map_err(|e| Refusal::key(&e))?;
        let key = match self.parse {
            Parse::Strict => parse_opaque_strict(value),
            Parse::Lenient => parse_opaque_lenient(value),
            Parse::Uuid(v) => parse_opaque_lenient(value).and_then(|k| parse_uuid(&k, v)),
        }
        .map_err(|e| Refusal::key(&e))?;
        let fingerprint = self.fingerprint_of(i)?;
        let (record_key, subject) = match &self.rules {
            Rules::Record(_) => (RecordKey::new(scope, key), Subject::Record),
            Rules::Time(t) => {
                let k = parse_time_key(&key).map_err(|e| Refusal::kind_key(&e, "IDEM-TIME-1"))?;
                (t.record_key(&scope, &k), Subject::Time(k))
            }
            Rules::Counter(c) => {
                let k = crate::counter::parse_counter_key(&key, c.config().bits)
                    .map_err(|e| Refusal::kind_key(&e, "IDEM-CTR-1"))?;
                let low_water = i
                    .low_water
                    .map(|w| parse_decimal(w, "low-water mark"))
                    .transpose()
                    .map_err(|e| Refusal::kind_key(&e, "IDEM-CTR-11"))?;
                let record_key = c.session_key(&scope, &k.client);
                (
                    record_key,
                    Subject::Counter {
                        scope,
                        key: k,
                        low_water,
                    },
                )
            }
            Rules::Token(t) => (
                t.record_key(&scope, &key),
                Subject::Token { scope, token: key },
            ),
        };
        Ok((record_key, fingerprint, subject))
    }

    /// The request's fingerprint, or its refusal (too large, invalid JSON).
    #[allow(clippy::result_large_err)] // as for check_body_size
    fn fingerprint_of(&self, i: &Intake<'_>) -> Result<Fingerprint, Refusal> {
        self.fingerprint
            .fingerprint(&RequestParts {
                method: i.method,
                target: i.target,
                content_type: i.content_type,
                headers: i.headers,
                body: i.body,
            })
            .map_err(|e| Refusal::fingerprint(&e))
    }

    /// A request identified by its derived key, in the derived scope of its own scope.
    #[allow(clippy::result_large_err)] // as for check_body_size
    fn derived(
        &self,
        i: &Intake<'_>,
        scope: Scope,
    ) -> Result<(RecordKey, Fingerprint, Subject), Refusal> {
        let fingerprint = self.fingerprint_of(i)?;
        let mut operation = String::from(i.method);
        operation.push(' ');
        operation.push_str(i.route);
        let key = crate::derive_key(&scope, &operation, &fingerprint);
        Ok((
            RecordKey::new(crate::kind::kind_scope(&scope, "derived"), key),
            fingerprint,
            Subject::Record,
        ))
    }

    /// The machine for an attempt that a host identified and a store that claims for it
    /// sent over (a Durable Object: see [`Request::ticket`]).
    pub fn resume(&self, ticket: Ticket, nonce: u64) -> Request<'static> {
        Request::new(
            self,
            Cow::Owned(ticket.key),
            Cow::Owned(ticket.fingerprint),
            ticket.subject,
            nonce,
        )
    }
}

/// The key at JSON pointer `pointer` in `body` (`IDEM-KEY-7`): a string, refused as missing
/// when the body is not JSON or has nothing there, as malformed when it is not a string.
#[allow(clippy::result_large_err)] // as for check_body_size
fn key_at(body: &[u8], pointer: &str) -> Result<String, Refusal> {
    let missing = || Refusal {
        requirement: "IDEM-KEY-7",
        ..Refusal::new(
            Problem::MISSING_KEY,
            alloc::format!("no Idempotency-Key header, and no key at {pointer} in the body"),
        )
    };
    match crate::canon::string_at(body, pointer).map_err(|_| missing())? {
        crate::canon::Found::String(key) => Ok(key),
        crate::canon::Found::NotString => Err(Refusal {
            requirement: "IDEM-KEY-7",
            ..Refusal::new(
                Problem::MALFORMED_KEY,
                alloc::format!("the key at {pointer} in the body is not a string"),
            )
        }),
        crate::canon::Found::Missing => Err(missing()),
    }
}

/// The principal as it enters a scope: the first 16 bytes of its SHA-256 digest in hex, so
/// that credentials never reach a store (`IDEM-SCOPE-2`).
pub fn principal_digest(principal: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(principal.as_bytes());
    let mut hex = String::with_capacity(32);
    crate::kind::push_hex(&mut hex, &digest[..16]);
    hex
}

/// One request as the host received it.
#[derive(Clone, Copy, Debug)]
pub struct Intake<'a> {
    /// Who sent it: an account or user id, never a credential that rotates (`IDEM-SCOPE-3`).
    /// `None` when the host serves one tenant and says so; an empty principal is refused.
    pub principal: Option<&'a str>,
    /// The method.
    pub method: &'a str,
    /// The route (a template such as `/orders/{id}`, or the path).
    pub route: &'a str,
    /// Path and query.
    pub target: &'a str,
    /// Every value of the key header, as received (none, one, or several lines).
    pub keys: &'a [&'a [u8]],
    /// The client's low-water mark, for counter keys.
    pub low_water: Option<&'a str>,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The header fields the fingerprint selects ([`FingerprintSpec::headers`]).
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The body.
    pub body: &'a [u8],
}

/// What a store that claims for the host (a Durable Object next to its storage) needs to
/// claim a request: its record key, fingerprint and key data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ticket {
    /// The record.
    pub key: RecordKey,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// What the key names.
    pub subject: Subject,
}

/// The lease a request holds while its handler runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Hold {
    /// A record's lease (opaque, UUID, time and token keys).
    Record(Lease),
    /// A counter slot's lease.
    Slot(CounterLease),
}

impl Hold {
    /// The fencing number.
    pub fn fence(&self) -> u64 {
        match self {
            Hold::Record(l) => l.fence,
            Hold::Slot(l) => l.fence,
        }
    }

    /// When the lease ends.
    pub fn expires(&self) -> UnixMillis {
        match self {
            Hold::Record(l) => l.expires,
            Hold::Slot(l) => l.expires,
        }
    }
}

/// The lease a request holds, borrowed where the host holds it already ([`Store::finish`]).
#[derive(Debug)]
enum Held<'a> {
    Record(Cow<'a, Lease>),
    Slot(Cow<'a, CounterLease>),
}

impl Held<'_> {
    fn fence(&self) -> u64 {
        match self {
            Held::Record(l) => l.fence,
            Held::Slot(l) => l.fence,
        }
    }

    fn expires(&self) -> UnixMillis {
        match self {
            Held::Record(l) => l.expires,
            Held::Slot(l) => l.expires,
        }
    }

    fn to_hold(&self) -> Hold {
        match self {
            Held::Record(l) => Hold::Record(l.clone().into_owned()),
            Held::Slot(l) => Hold::Slot(l.clone().into_owned()),
        }
    }

    fn into_hold(self) -> Hold {
        match self {
            Held::Record(l) => Hold::Record(l.into_owned()),
            Held::Slot(l) => Hold::Slot(l.into_owned()),
        }
    }
}

impl From<Hold> for Held<'_> {
    fn from(h: Hold) -> Self {
        match h {
            Hold::Record(l) => Held::Record(Cow::Owned(l)),
            Hold::Slot(l) => Held::Slot(Cow::Owned(l)),
        }
    }
}

/// What a store that claims for the host sends back: the lease, or the decision.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Claimed {
    /// The claim was applied: run the handler under this lease.
    Execute {
        /// The lease.
        hold: Hold,
        /// Whether an earlier attempt may have started the work.
        recovered: bool,
    },
    /// Anything but execute.
    Done(Decision),
}

/// What a handler is told when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// An earlier attempt's lease expired and this one took over: reconcile before acting
    /// (`IDEM-LEASE-1`).
    pub recovered: bool,
    /// The fencing number (`IDEM-LEASE-2`): hand it to resources that can check it.
    pub fence: u64,
    /// When the lease ends unless a heartbeat extends it.
    pub lease_expires: UnixMillis,
    /// This attempt's identity: the random value the host made its request with, the same
    /// in [`Completing::attempt`]. A store that keeps something for one attempt (a
    /// handler's transaction) keys it by this, never by the fence alone: a key released and
    /// claimed again starts over at fence 1.
    pub attempt: u64,
}

/// Where a request's heartbeats stand (`IDEM-LEASE-3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heartbeat {
    /// None asked for, or the last one is on its way to the store.
    Quiet,
    /// The lease was extended; it now ends here.
    Extended(UnixMillis),
    /// The lease was taken over by another attempt: stop, nothing this attempt writes will
    /// be kept (`IDEM-LEASE-2`).
    FencedOut,
    /// The lease had ended before the heartbeat (`IDEM-LEASE-3`).
    Expired,
    /// The store failed; the lease may or may not have been extended.
    Failed(StoreFailure),
}

/// What the host does next. See [`Request`].
#[must_use = "a Step is the next thing the host must do"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read the record under [`Request::key`] and pass it to [`Request::handle_record`]. A
    /// store that claims for the host instead gets [`Request::ticket`] and its answer goes
    /// to [`Request::handle_claimed`].
    Claim,
    /// Read the record under [`Request::key`] and pass it to [`Request::handle_record`] (a
    /// completion or heartbeat that needs the current record).
    Load,
    /// Apply this compare-and-set write atomically and pass the result to
    /// [`Request::handle_applied`].
    Apply(Write),
    /// Nothing to do before this time: poll again then (waiting for a request in flight).
    WaitUntil(UnixMillis),
    /// Run the handler, then pass its outcome to [`Request::handle_outcome`]. Returned once.
    Run(Context),
    /// Waiting for an input: the handler's outcome, or the result of a step handed out.
    Idle,
    /// Send [`Request::reply`]: the request is over without running the handler.
    Reply,
    /// The handler's outcome is recorded (or could not be, as this says): send the handler's
    /// response, except after [`Finish::FencedOut`]: then send [`Request::reply`], the
    /// key's outcome as a retry would find it (`IDEM-LEASE-5`). The request is over.
    Done(Finish),
}

#[derive(Clone, Copy, Debug)]
struct Wait {
    until: UnixMillis,
    ticket: u64,
    last_look: bool,
}

#[derive(Debug)]
enum Answer {
    Decision(Decision),
    Refusal(Refusal),
}

#[derive(Debug)]
enum Op {
    None,
    /// A completion write is out; applying it means this.
    Completing(Finish),
    /// A heartbeat's write is out, for this lease.
    Extending(Hold),
    /// The record must be read (`out`: the read is handed out).
    Load {
        purpose: Purpose,
        out: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// To complete (counter sessions).
    Complete,
    /// To extend (counter sessions).
    Extend,
    /// After a conflict, to see whether the record is still this lease's.
    Conflict { heartbeat: bool },
}

impl Op {
    fn load(purpose: Purpose) -> Op {
        Op::Load {
            purpose,
            out: false,
        }
    }

    fn is_heartbeat(&self) -> bool {
        matches!(
            self,
            Op::Extending(_)
                | Op::Load {
                    purpose: Purpose::Extend | Purpose::Conflict { heartbeat: true },
                    ..
                }
        )
    }
}

/// A stored outcome that can be rebuilt after a conflict without copying the response.
#[derive(Clone, Debug)]
pub(crate) enum SharedOutcome {
    Final(Arc<StoredResponse>),
    Retryable,
    Unknown(Option<Arc<StoredResponse>>),
}

#[derive(Debug)]
struct Holding<'a> {
    hold: Held<'a>,
    recovered: bool,
    started: bool,
    outcome: Option<SharedOutcome>,
    heartbeat: Heartbeat,
    wants_heartbeat: bool,
    op: Op,
    rounds: usize,
}

#[derive(Debug)]
enum State<'a> {
    /// Next: read the record (or ask the store to claim).
    Claim { lost: usize, wait: Option<Wait> },
    /// The read is out.
    Reading { lost: usize, wait: Option<Wait> },
    /// The claim write is out.
    Applying {
        hold: Hold,
        recovered: bool,
        lost: usize,
        wait: Option<Wait>,
    },
    /// Waiting for a request in flight.
    Waiting { next: UnixMillis, wait: Wait },
    /// The handler runs under the lease, or has run and its outcome is being recorded.
    Holding(Holding<'a>),
    /// Answered without running the handler.
    Answered(Answer),
    /// The handler's outcome is recorded, or could not be.
    Finished(Finish),
    /// The handler ran, but its lease was taken over and its outcome refused: its caller
    /// gets this answer instead of the handler's (`IDEM-LEASE-5`).
    Superseded(Answer),
}

/// The events a request has yielded and the host has not read yet.
#[derive(Debug, Default)]
struct Events {
    ring: [Option<Event>; 4],
    head: usize,
    len: usize,
}

impl Events {
    fn push(&mut self, e: Event) {
        if self.len == self.ring.len() {
            // The host does not read events: keep the latest.
            self.head = (self.head + 1) % self.ring.len();
            self.len -= 1;
        }
        self.ring[(self.head + self.len) % self.ring.len()] = Some(e);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Event> {
        if self.len == 0 {
            return None;
        }
        let e = self.ring[self.head].take();
        self.head = (self.head + 1) % self.ring.len();
        self.len -= 1;
        e
    }
}

/// One request's lifecycle, sans-IO: identify, claim (deciding again after a lost race),
/// wait for or refuse a duplicate in flight, run the handler under a lease with heartbeats,
/// record the outcome before the response leaves, and render every answer. Every host
/// (a Rust server, the WebAssembly package, a Durable Object) drives this machine, so none
/// of them holds a lifecycle rule, a retry bound or a reply format of its own.
///
/// # Driving it
///
/// Make one with [`Policy::request`] (or [`Policy::resume`], [`Request::for_attempt`]), then
/// call [`poll`](Request::poll) with the current time and do what the [`Step`] says, feeding
/// the result back through the matching `handle_*` method, until it says
/// [`Step::Reply`] or [`Step::Done`]:
///
/// * [`Step::Claim`] / [`Step::Load`]: read the record under [`Request::key`] →
///   [`handle_record`](Request::handle_record) (or, with a store that claims itself,
///   [`handle_claimed`](Request::handle_claimed));
/// * [`Step::Apply`]: apply the write atomically → [`handle_applied`](Request::handle_applied);
///   a store failure in either → [`handle_store_error`](Request::handle_store_error);
/// * [`Step::WaitUntil`]: sleep until then, and poll again;
/// * [`Step::Run`]: run the handler; meanwhile [`heartbeat`](Request::heartbeat) extends the
///   lease; afterwards [`handle_outcome`](Request::handle_outcome);
/// * [`Step::Idle`]: an input is due (the handler's outcome, or the result of a step handed
///   out);
/// * [`Step::Reply`]: send [`reply`](Request::reply); [`Step::Done`]: send the handler's own
///   response, or [`reply`](Request::reply) when the lease was taken over
///   ([`Finish::FencedOut`], `IDEM-LEASE-5`).
///
/// The methods fall into families, as in quinn-proto's `Connection`: getters ([`key`],
/// [`context`], [`heartbeat_state`]), inputs (`handle_*`, [`heartbeat`]) and outputs
/// ([`poll`], [`poll_event`], [`reply`]). Inputs that do not fit the current state are
/// ignored. Time must not go backwards between calls by more than a clock's jitter; the
/// engine reads every expiry from the records, so a late or early clock is never less safe,
/// only slower.
///
/// Only one store operation is out at a time: a heartbeat asked for while the outcome is
/// being written is answered as finished, and an outcome that arrives while a heartbeat is
/// on its way is written after it, with the lease that heartbeat produced. So a completion
/// always carries the latest committed lease, and a heartbeat and a completion never fence
/// each other out (`IDEM-LEASE-4`). A completion that still finds the record changed reads
/// it again: if it is still in flight under this lease's fencing number (a heartbeat whose
/// answer was lost), it completes from there.
///
/// [`key`]: Request::key
/// [`context`]: Request::context
/// [`heartbeat_state`]: Request::heartbeat_state
/// [`heartbeat`]: Request::heartbeat
/// [`poll`]: Request::poll
/// [`poll_event`]: Request::poll_event
/// [`reply`]: Request::reply
#[derive(Debug)]
pub struct Request<'a> {
    rules: Rules,
    in_flight: InFlight,
    max_response_bytes: usize,
    key: Cow<'a, RecordKey>,
    fingerprint: Cow<'a, Fingerprint>,
    subject: Subject,
    nonce: u64,
    write: Option<Write>,
    state: State<'a>,
    events: Events,
}

fn refused_key() -> RecordKey {
    RecordKey::new(Scope::custom(String::new()), String::new())
}

impl<'a> Request<'a> {
    fn new(
        policy: &Policy,
        key: Cow<'a, RecordKey>,
        fingerprint: Cow<'a, Fingerprint>,
        subject: Subject,
        nonce: u64,
    ) -> Request<'a> {
        Request {
            in_flight: policy.in_flight,
            max_response_bytes: policy.max_response_bytes,
            ..Request::with_rules(policy.rules.clone(), key, fingerprint, subject, nonce)
        }
    }

    /// A request refused before it could be identified: it answers `refusal` at once.
    pub fn refused(refusal: Refusal) -> Request<'static> {
        let mut req = Request::with_rules(
            Rules::Record(Engine::default()),
            Cow::Owned(refused_key()),
            Cow::Owned(Fingerprint::from_digest([0; 32])),
            Subject::Record,
            0,
        );
        req.events.push(Event::Rejected);
        req.state = State::Answered(Answer::Refusal(refusal));
        req
    }

    /// The machine for an attempt the host identified itself, with `engine`'s rules and no
    /// waiting ([`Store::claim`] drives it).
    pub fn for_attempt(engine: &Engine, attempt: &Attempt<'a>) -> Request<'a> {
        Request::with_rules(
            Rules::Record(engine.clone()),
            Cow::Borrowed(attempt.key),
            Cow::Borrowed(attempt.fingerprint),
            Subject::Record,
            attempt.nonce,
        )
    }

    fn with_rules(
        rules: Rules,
        key: Cow<'a, RecordKey>,
        fingerprint: Cow<'a, Fingerprint>,
        subject: Subject,
        nonce: u64,
    ) -> Request<'a> {
        Request {
            rules,
            in_flight: InFlight::Reject,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            key,
            fingerprint,
            subject,
            nonce,
            write: None,
            state: State::Claim {
                lost: 0,
                wait: None,
            },
            events: Events::default(),
        }
    }

    /// The machine of a handler that already holds `lease` (a host that claimed with
    /// [`Store::claim`] and completes with [`Store::finish`]).
    pub fn holding(engine: &Engine, lease: &'a Lease) -> Request<'a> {
        Request::held(
            Rules::Record(engine.clone()),
            Cow::Borrowed(&lease.key),
            Held::Record(Cow::Borrowed(lease)),
        )
    }

    fn held(rules: Rules, key: Cow<'a, RecordKey>, hold: Held<'a>) -> Request<'a> {
        let mut req = Request::with_rules(
            rules,
            key,
            Cow::Owned(Fingerprint::from_digest([0; 32])),
            Subject::Record,
            0,
        );
        req.state = State::Holding(Holding {
            hold,
            recovered: false,
            started: true,
            outcome: None,
            heartbeat: Heartbeat::Quiet,
            wants_heartbeat: false,
            op: Op::None,
            rounds: 0,
        });
        req
    }

    // --- getters ---------------------------------------------------------------------------

    /// The record this request reads and writes.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// What a store that claims for the host needs ([`Policy::resume`] on its side).
    pub fn ticket(&self) -> Ticket {
        Ticket {
            key: self.key.clone().into_owned(),
            fingerprint: self.fingerprint.clone().into_owned(),
            subject: self.subject.clone(),
        }
    }

    /// The handler's context, while it runs.
    pub fn context(&self) -> Option<Context> {
        match &self.state {
            State::Holding(h) => Some(Context {
                recovered: h.recovered,
                fence: h.hold.fence(),
                lease_expires: h.hold.expires(),
                attempt: self.nonce,
            }),
            _ => None,
        }
    }

    /// The lease held, while the handler runs.
    pub fn hold(&self) -> Option<Hold> {
        match &self.state {
            State::Holding(h) => Some(h.hold.to_hold()),
            _ => None,
        }
    }

    /// Where the heartbeats stand.
    pub fn heartbeat_state(&self) -> Heartbeat {
        match &self.state {
            State::Holding(h) => h.heartbeat,
            _ => Heartbeat::Quiet,
        }
    }

    /// The decision that answered the request, if it was answered by a decision.
    pub fn decision(&self) -> Option<&Decision> {
        match &self.state {
            State::Answered(Answer::Decision(d)) => Some(d),
            _ => None,
        }
    }

    /// What a store that claims for the host sends back ([`Request::handle_claimed`] on the
    /// other side): the lease once the claim is applied, or the decision.
    pub fn claimed(&self) -> Option<Claimed> {
        match &self.state {
            State::Holding(h) => Some(Claimed::Execute {
                hold: h.hold.to_hold(),
                recovered: h.recovered,
            }),
            State::Answered(Answer::Decision(d)) => Some(Claimed::Done(d.clone())),
            _ => None,
        }
    }

    /// The answer to send when [`poll`](Request::poll) says [`Step::Reply`], or
    /// [`Step::Done`] with [`Finish::FencedOut`].
    pub fn reply(&self) -> Option<Reply> {
        match &self.state {
            // A counter's collision and staleness cite the counter rules, not the time
            // keys' that their problem types name by default.
            State::Answered(Answer::Decision(
                d @ Decision::Rejected(RejectReason::Collision | RejectReason::Stale),
            )) if matches!(self.subject, Subject::Counter { .. }) => {
                let mut refusal = Refusal::of_decision(d)?;
                refusal.requirement = match d {
                    Decision::Rejected(RejectReason::Collision) => "IDEM-CTR-7",
                    _ => "IDEM-CTR-6",
                };
                Some(refusal.reply())
            }
            State::Answered(Answer::Decision(d)) | State::Superseded(Answer::Decision(d)) => {
                Reply::of_decision(d)
            }
            State::Answered(Answer::Refusal(r)) | State::Superseded(Answer::Refusal(r)) => {
                Some(r.reply())
            }
            _ => None,
        }
    }

    /// The refusal that answered the request, if it was not answered by a decision.
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.state {
            State::Answered(Answer::Refusal(r)) => Some(r),
            _ => None,
        }
    }

    // --- outputs ---------------------------------------------------------------------------

    /// What applying the write handed out by the last [`Step::Apply`] means, when that
    /// write is the handler's completion: [`Finish::Stored`] when it stores the response,
    /// [`Finish::Released`] or [`Finish::OutcomeUnknown`] otherwise, with the fence of the
    /// attempt's lease. `None` for a claim or a heartbeat. A host passes it to
    /// [`AsyncStore::apply_completion`](crate::AsyncStore::apply_completion).
    pub fn completing(&self) -> Option<Completing> {
        match &self.state {
            State::Holding(h) => match &h.op {
                Op::Completing(finish) => Some(Completing {
                    finish: finish.clone(),
                    fence: h.hold.fence(),
                    attempt: self.nonce,
                }),
                _ => None,
            },
            _ => None,
        }
    }

    /// The next event (`IDEM-EVT-1`): hosts log or count them.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop()
    }

    /// What to do next.
    pub fn poll(&mut self, now: UnixMillis, waiters: &mut Waiters) -> Step {
        if let Some(write) = self.write.take() {
            return Step::Apply(write);
        }
        loop {
            match &mut self.state {
                State::Claim { lost, wait } => {
                    let (lost, wait) = (*lost, *wait);
                    if let Some(d) = self.precheck(now) {
                        self.decided(now, Decided::Decision(d), lost, wait, waiters);
                        continue;
                    }
                    self.state = State::Reading { lost, wait };
                    return Step::Claim;
                }
                State::Waiting { next, wait } => {
                    let (next, mut wait) = (*next, *wait);
                    let latest = waiters.is_latest(&self.key, wait.ticket);
                    if latest && now < next {
                        return Step::WaitUntil(next);
                    }
                    // Time to look again; superseded or past the bound, for the last time.
                    wait.last_look = !latest || now >= wait.until;
                    self.state = State::Claim {
                        lost: 0,
                        wait: Some(wait),
                    };
                }
                State::Holding(h) => {
                    if !h.started {
                        h.started = true;
                        return Step::Run(Context {
                            recovered: h.recovered,
                            fence: h.hold.fence(),
                            lease_expires: h.hold.expires(),
                            attempt: self.nonce,
                        });
                    }
                    match &mut h.op {
                        Op::None => {}
                        Op::Load { out, .. } if !*out => {
                            *out = true;
                            return Step::Load;
                        }
                        _ => return Step::Idle,
                    }
                    if h.outcome.is_some() {
                        return self.complete(now);
                    }
                    if h.wants_heartbeat {
                        h.wants_heartbeat = false;
                        return self.extend(now);
                    }
                    return Step::Idle;
                }
                State::Reading { .. } | State::Applying { .. } => return Step::Idle,
                State::Answered(_) => return Step::Reply,
                State::Finished(f) => return Step::Done(f.clone()),
                State::Superseded(_) => return Step::Done(Finish::FencedOut),
            }
        }
    }

    /// Drives the machine over a synchronous store until the host has something else to do
    /// (run the handler, wait, reply, or send the handler's response): never returns
    /// [`Step::Claim`], [`Step::Load`] or [`Step::Apply`]. A store error is returned after
    /// the machine has recorded it ([`Request::handle_store_error`], with the failure the
    /// store reports through [`Store::failure`]); polling again then gives the answer.
    pub fn drive<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
        waiters: &mut Waiters,
    ) -> Result<Step, S::Error> {
        self.drive_then(store, now, waiters, |step| step)
    }

    /// [`Request::drive`], handing the step it stops at to `then` where it stands (the
    /// drivers that only need the state it leaves pass `drop`, and no step is moved).
    #[inline]
    fn drive_then<S: Store + ?Sized, T>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
        waiters: &mut Waiters,
        then: impl FnOnce(Step) -> T,
    ) -> Result<T, S::Error> {
        loop {
            let result = match self.poll(now, waiters) {
                Step::Claim | Step::Load => store
                    .read(&self.key)
                    .map(|r| self.handle_record(now, r.as_deref(), waiters)),
                Step::Apply(write) => store
                    .apply(now, write)
                    .map(|a| self.handle_applied(now, a, waiters)),
                other => return Ok(then(other)),
            };
            if let Err(e) = result {
                self.handle_store_error(S::failure(&e), waiters);
                return Err(e);
            }
        }
    }

    // --- inputs ----------------------------------------------------------------------------

    /// The record read for [`Step::Claim`] or [`Step::Load`] (`None`: there is none).
    pub fn handle_record(
        &mut self,
        now: UnixMillis,
        record: Option<&Record>,
        waiters: &mut Waiters,
    ) {
        match &mut self.state {
            State::Reading { lost, wait } => {
                let (lost, wait) = (*lost, *wait);
                let decided = self.decide(now, record);
                self.decided(now, decided, lost, wait, waiters);
            }
            State::Holding(h) => {
                let Op::Load { purpose, out: true } = h.op else {
                    return;
                };
                h.op = Op::None;
                match purpose {
                    Purpose::Complete => self.complete_counter(now, record),
                    Purpose::Extend => self.extend_counter(now, record),
                    Purpose::Conflict { heartbeat } => self.after_conflict(now, record, heartbeat),
                }
            }
            _ => {}
        }
    }

    /// A completion or heartbeat of a record lease lost a race: if the record read now is
    /// still this lease's (same incarnation, same fencing number, in flight), a write of this
    /// lease moved it on and its answer was lost; carry on from it. Otherwise the lease was
    /// taken over.
    fn after_conflict(&mut self, now: UnixMillis, record: Option<&Record>, heartbeat: bool) {
        let State::Holding(h) = &mut self.state else {
            return;
        };
        let Held::Record(lease) = &mut h.hold else {
            return;
        };
        let ours = record.and_then(|r| match r.state {
            RecordState::InFlight { lease_expires }
                if r.fence == lease.fence
                    && r.created == lease.created
                    && r.version.wrapping_sub(lease.version) < MAX_COMPLETION_ROUNDS as u64 =>
            {
                Some((r.version, lease_expires, r.key_expires))
            }
            _ => None,
        });
        match ours {
            Some((version, expires, key_expires)) => {
                let lease = lease.to_mut();
                lease.version = version;
                lease.expires = expires;
                lease.key_expires = key_expires;
                if heartbeat {
                    h.heartbeat = Heartbeat::Extended(expires);
                }
            }
            None => self.fenced_out(now, heartbeat, record),
        }
    }

    /// [`Request::handle_record`] for a driver that has read the record and decided on it
    /// itself, by the same rules (`Engine::decide` for the attempt).
    fn handle_decision(&mut self, now: UnixMillis, decision: Decision, waiters: &mut Waiters) {
        if let State::Reading { lost, wait } = self.state {
            self.decided(now, Decided::Decision(decision), lost, wait, waiters);
        }
    }

    /// What a store that claims for the host answered (for [`Step::Claim`]).
    pub fn handle_claimed(&mut self, now: UnixMillis, claimed: Claimed, waiters: &mut Waiters) {
        let State::Reading { lost, wait } = self.state else {
            return;
        };
        match claimed {
            Claimed::Execute { hold, recovered } => {
                self.claimed_lease(hold, recovered, wait, waiters)
            }
            // A store that claimed answers an execute as `Claimed::Execute`, having applied
            // its write. An execute inside `Done` carries a write nobody applied (hosts that
            // decode claims refuse it); if one gets here, nothing is applied and the request
            // reads as contended, never as an answer without a reply.
            Claimed::Done(Decision::Execute { .. }) => self.decided(
                now,
                Decided::Decision(Decision::CONTENDED),
                lost,
                wait,
                waiters,
            ),
            Claimed::Done(d) => self.decided(now, Decided::Decision(d), lost, wait, waiters),
        }
    }

    /// Whether the write of [`Step::Apply`] was applied.
    pub fn handle_applied(&mut self, now: UnixMillis, applied: Applied, waiters: &mut Waiters) {
        match &mut self.state {
            State::Applying {
                recovered,
                lost,
                wait,
                ..
            } => {
                let (recovered, lost, wait) = (*recovered, *lost, *wait);
                match applied {
                    Applied::Applied => {
                        // The lease moves from the claim to the holding, without a copy.
                        let State::Applying { hold, .. } =
                            core::mem::replace(&mut self.state, State::Finished(Finish::FencedOut))
                        else {
                            return;
                        };
                        self.claimed_lease(hold, recovered, wait, waiters);
                    }
                    Applied::Conflict if lost + 1 >= MAX_LOST_RACES => {
                        self.decided(
                            now,
                            Decided::Decision(Decision::CONTENDED),
                            0,
                            wait,
                            waiters,
                        );
                    }
                    Applied::Conflict => {
                        self.state = State::Claim {
                            lost: lost + 1,
                            wait,
                        }
                    }
                }
            }
            State::Holding(h) => {
                let op = core::mem::replace(&mut h.op, Op::None);
                match (op, applied) {
                    (Op::Completing(finish), Applied::Applied) => self.finish(finish),
                    (Op::Extending(next), Applied::Applied) => {
                        h.heartbeat = Heartbeat::Extended(next.expires());
                        h.hold = Held::from(next);
                        h.rounds = 0;
                        self.events.push(Event::Extended);
                    }
                    (op @ (Op::Completing(_) | Op::Extending(_)), Applied::Conflict) => {
                        let heartbeat = matches!(op, Op::Extending(_));
                        h.rounds += 1;
                        if h.rounds >= MAX_COMPLETION_ROUNDS {
                            self.fenced_out(now, heartbeat, None);
                        } else if matches!(h.hold, Held::Slot(_)) {
                            // Another request of the client wrote the session: read it
                            // again and redo the write against it.
                            h.op = Op::load(if heartbeat {
                                Purpose::Extend
                            } else {
                                Purpose::Complete
                            });
                        } else {
                            h.op = Op::load(Purpose::Conflict { heartbeat });
                        }
                    }
                    (op, _) => h.op = op,
                }
            }
            _ => {}
        }
    }

    /// The store failed on the step handed out. Before the handler ran: the request is
    /// answered 503 and nothing runs (`IDEM-STORE-3`, `IDEM-STORE-4`). While completing: the
    /// response is still sent and the lease is left to expire (`IDEM-OUT-5`). While
    /// extending: [`Heartbeat::Failed`].
    pub fn handle_store_error(&mut self, failure: StoreFailure, waiters: &mut Waiters) {
        match &mut self.state {
            State::Reading { wait, .. } | State::Applying { wait, .. } => {
                if let Some(w) = wait {
                    waiters.leave(&self.key, w.ticket);
                }
                self.events.push(Event::Rejected);
                self.state = State::Answered(Answer::Refusal(Refusal::store(failure)));
            }
            State::Holding(h) => {
                let heartbeat = h.op.is_heartbeat();
                h.op = Op::None;
                if heartbeat {
                    h.heartbeat = Heartbeat::Failed(failure);
                } else if h.outcome.is_some() {
                    self.events.push(Event::Rejected);
                    self.state = State::Finished(Finish::StoreFailed(failure));
                }
            }
            _ => {}
        }
    }

    /// Asks for a heartbeat (`IDEM-LEASE-3`): the next poll hands out the write that extends
    /// the lease by one lease period from then. Refused once the lease has ended, after the
    /// outcome, and when the lease was lost; a heartbeat already on its way serves this one
    /// too.
    pub fn heartbeat(&mut self, now: UnixMillis) -> Result<(), Heartbeat> {
        let State::Holding(h) = &mut self.state else {
            return Err(Heartbeat::FencedOut);
        };
        if h.outcome.is_some() || h.heartbeat == Heartbeat::FencedOut {
            return Err(Heartbeat::FencedOut);
        }
        if now >= h.hold.expires() {
            h.heartbeat = Heartbeat::Expired;
            return Err(Heartbeat::Expired);
        }
        if !h.op.is_heartbeat() {
            h.heartbeat = Heartbeat::Quiet;
            h.wants_heartbeat = true;
        }
        Ok(())
    }

    /// The handler's outcome (`IDEM-OUT-1` to `IDEM-OUT-4`). A response larger than the
    /// store keeps is replaced by a `response-not-stored` answer (`IDEM-STORE-5`).
    pub fn handle_outcome(&mut self, outcome: Outcome) {
        let max = self.max_response_bytes;
        let State::Holding(h) = &mut self.state else {
            return;
        };
        if h.outcome.is_some() {
            return;
        }
        let keep = |r: StoredResponse| {
            Arc::new(if r.size() > max {
                not_stored(r.size(), max)
            } else {
                r
            })
        };
        h.outcome = Some(match outcome {
            Outcome::Final(r) => SharedOutcome::Final(keep(r)),
            Outcome::Retryable => SharedOutcome::Retryable,
            Outcome::Unknown(r) => SharedOutcome::Unknown(r.map(keep)),
        });
        h.wants_heartbeat = false;
    }

    // --- the rules ---------------------------------------------------------------------------

    /// Refusals that need no record: a time key outside its window, a forged token.
    fn precheck(&self, now: UnixMillis) -> Option<Decision> {
        match (&self.rules, &self.subject) {
            (Rules::Time(t), Subject::Time(k)) => t.check(now, k).err().map(Decision::Rejected),
            (Rules::Token(t), Subject::Token { scope, token }) => {
                t.verify(scope, token).err().map(Decision::Rejected)
            }
            _ => None,
        }
    }

    fn decide(&self, now: UnixMillis, record: Option<&Record>) -> Decided {
        let attempt = Attempt {
            key: &self.key,
            fingerprint: &self.fingerprint,
            nonce: self.nonce,
        };
        let decision = match (&self.rules, &self.subject) {
            (Rules::Record(e), _) => e.decide(now, &attempt, record),
            (Rules::Time(t), Subject::Time(k)) => t.decide(now, k, &attempt, record),
            (Rules::Token(t), Subject::Token { scope, token }) => {
                t.decide(now, scope, token, &attempt, record)
            }
            (
                Rules::Counter(c),
                Subject::Counter {
                    scope,
                    key,
                    low_water,
                },
            ) => {
                let attempt = CounterAttempt {
                    scope,
                    key,
                    fingerprint: &self.fingerprint,
                    low_water: *low_water,
                };
                return match c.decide(now, &attempt, record) {
                    CounterDecision::Execute {
                        lease,
                        write,
                        recovered,
                    } => Decided::Slot(Box::new((lease, write, recovered))),
                    CounterDecision::Replay(r) => Decided::Decision(Decision::Replay(r)),
                    CounterDecision::InProgress { retry_after_secs } => {
                        Decided::Decision(Decision::InProgress { retry_after_secs })
                    }
                    CounterDecision::Rejected(r) => Decided::Decision(Decision::Rejected(r)),
                };
            }
            // A subject of another kind than the rules: the ticket was built by a host with
            // other settings. It names another kind of record (`IDEM-KIND-1`).
            _ => Decision::Rejected(crate::engine::RejectReason::Collision),
        };
        Decided::Decision(decision)
    }

    fn decided(
        &mut self,
        now: UnixMillis,
        decided: Decided,
        lost: usize,
        wait: Option<Wait>,
        waiters: &mut Waiters,
    ) {
        let (hold, write, recovered) = match decided {
            Decided::Decision(Decision::Execute {
                lease,
                write,
                recovered,
            }) => (Hold::Record(*lease), *write, recovered),
            Decided::Slot(claim) => {
                let (lease, write, recovered) = *claim;
                (Hold::Slot(lease), write, recovered)
            }
            Decided::Decision(Decision::InProgress { .. })
                if !wait.is_some_and(|w| w.last_look)
                    && matches!(self.in_flight, InFlight::Wait { .. }) =>
            {
                let InFlight::Wait { max, poll } = self.in_flight else {
                    return;
                };
                let wait = match wait {
                    Some(w) => w,
                    None => {
                        let until = now.saturating_add(max);
                        Wait {
                            until,
                            ticket: waiters.enter(&self.key, until, now),
                            last_look: false,
                        }
                    }
                };
                let next = now.saturating_add(poll).min(wait.until);
                self.state = State::Waiting { next, wait };
                return;
            }
            Decided::Decision(d) => {
                if let Some(w) = wait {
                    waiters.leave(&self.key, w.ticket);
                }
                self.events.push(d.event());
                self.state = State::Answered(Answer::Decision(d));
                return;
            }
        };
        self.write = Some(write);
        self.state = State::Applying {
            hold,
            recovered,
            lost,
            wait,
        };
    }

    fn claimed_lease(
        &mut self,
        hold: Hold,
        recovered: bool,
        wait: Option<Wait>,
        waiters: &mut Waiters,
    ) {
        if let Some(w) = wait {
            waiters.leave(&self.key, w.ticket);
        }
        self.events.push(if recovered {
            Event::TookOver {
                fence: hold.fence(),
            }
        } else {
            Event::Executed
        });
        self.state = State::Holding(Holding {
            hold: Held::from(hold),
            recovered,
            started: false,
            outcome: None,
            heartbeat: Heartbeat::Quiet,
            wants_heartbeat: false,
            op: Op::None,
            rounds: 0,
        });
    }

    /// The completion step while holding, with an outcome and nothing out.
    fn complete(&mut self, now: UnixMillis) -> Step {
        let State::Holding(h) = &mut self.state else {
            return Step::Idle;
        };
        if matches!(h.hold, Held::Slot(_)) {
            h.op = Op::Load {
                purpose: Purpose::Complete,
                out: true,
            };
            return Step::Load;
        }
        let (Held::Record(lease), Some(outcome), Some(engine)) =
            (&h.hold, &h.outcome, self.rules.engine())
        else {
            return Step::Idle;
        };
        match engine.complete_shared(now, lease, outcome.clone()) {
            Ok(write) => {
                h.op = Op::Completing(Finish::of(&write));
                Step::Apply(write)
            }
            Err(e) => {
                self.finish(Finish::Invalid(e));
                self.poll_finished()
            }
        }
    }

    fn complete_counter(&mut self, now: UnixMillis, record: Option<&Record>) {
        let (Rules::Counter(c), State::Holding(h)) = (&self.rules, &mut self.state) else {
            return;
        };
        let (Held::Slot(lease), Some(outcome)) = (&h.hold, &h.outcome) else {
            return;
        };
        match c.complete_shared(now, lease, outcome.clone(), record) {
            Ok((write, finish)) => {
                h.op = Op::Completing(finish);
                self.write = Some(write);
            }
            Err(CounterError::InvalidStatus(s)) => {
                self.finish(Finish::Invalid(CompleteError::InvalidStatus(s)))
            }
            Err(_) => self.fenced_out(now, false, record),
        }
    }

    /// The heartbeat step while holding, with nothing out.
    fn extend(&mut self, now: UnixMillis) -> Step {
        let State::Holding(h) = &mut self.state else {
            return Step::Idle;
        };
        let Held::Record(lease) = &h.hold else {
            h.op = Op::Load {
                purpose: Purpose::Extend,
                out: true,
            };
            return Step::Load;
        };
        let Some(engine) = self.rules.engine() else {
            return Step::Idle;
        };
        match engine.extend(now, lease) {
            Ok((next, write)) => {
                h.op = Op::Extending(Hold::Record(next));
                Step::Apply(write)
            }
            Err(_) => {
                h.heartbeat = Heartbeat::Expired;
                Step::Idle
            }
        }
    }

    fn extend_counter(&mut self, now: UnixMillis, record: Option<&Record>) {
        let (Rules::Counter(c), State::Holding(h)) = (&self.rules, &mut self.state) else {
            return;
        };
        let Held::Slot(lease) = &h.hold else {
            return;
        };
        match c.extend(now, lease, record) {
            Ok((next, write)) => {
                h.op = Op::Extending(Hold::Slot(next));
                self.write = Some(write);
            }
            Err(CounterError::LeaseExpired) => h.heartbeat = Heartbeat::Expired,
            Err(_) => self.fenced_out(now, true, record),
        }
    }

    /// The lease was taken over (`record`: the record as last read, if it was). A
    /// heartbeat before the outcome only says so; a completion ends the request with the
    /// answer its caller gets instead of the handler's.
    fn fenced_out(&mut self, now: UnixMillis, heartbeat: bool, record: Option<&Record>) {
        self.events.push(Event::FencedOut);
        if let State::Holding(h) = &mut self.state {
            if heartbeat && h.outcome.is_none() {
                h.heartbeat = Heartbeat::FencedOut;
                return;
            }
        }
        self.state = State::Superseded(self.superseded(now, record));
    }

    /// What the caller of an attempt whose lease was taken over is told (`IDEM-LEASE-5`): the
    /// key's outcome as a retry would find it in `record` (the response stored by the
    /// attempt that completed, replayed; the attempt still in flight; the response expired;
    /// the outcome held), or `superseded` when no outcome is recorded. Never the handler's
    /// own answer: it was not recorded, and it may describe work that was rolled back.
    fn superseded(&self, now: UnixMillis, record: Option<&Record>) -> Answer {
        match self.decide(now, record) {
            Decided::Decision(
                d @ (Decision::Replay(_)
                | Decision::InProgress { .. }
                | Decision::Rejected(RejectReason::KeyExpired | RejectReason::OutcomeUnknown)),
            ) => Answer::Decision(d),
            _ => Answer::Refusal(Refusal {
                retry_after: Some(crate::engine::RETRY_SOON_SECS),
                ..Refusal::new(
                    Problem::SUPERSEDED,
                    "another attempt with this key took over while this one ran; its outcome was not recorded; retry with the same key",
                )
            }),
        }
    }

    fn finish(&mut self, finish: Finish) {
        self.events.push(finish.event());
        self.state = State::Finished(finish);
    }

    fn poll_finished(&self) -> Step {
        match &self.state {
            State::Finished(f) => Step::Done(f.clone()),
            _ => Step::Idle,
        }
    }

    // --- drivers for the synchronous store API ------------------------------------------

    /// Runs the claim over `store` with no waiting, as [`Store::claim`] answers it.
    pub(crate) fn claim_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
    ) -> Result<Claimed, S::Error> {
        // Without waiting, driving ends at Run (claimed) or Reply (decided).
        self.drive_then(store, now, &mut Waiters::default(), drop)?;
        Ok(self.take_claimed())
    }

    /// [`Store::claim`]: the claim of `attempt` under `engine`'s rules, with no waiting.
    ///
    /// The machine's claim starts with a read and [`Engine::decide`] on it; that first step
    /// is made here. A replay, a mismatch or a refusal is then the whole answer
    /// ([`Request::decided`] answers those decisions as they are, with nothing to write or
    /// wait for), so no machine is built for them. Any other decision is handed to the
    /// machine as if it had read and decided itself, and it goes on from there.
    pub(crate) fn claim_attempt<S: Store + ?Sized>(
        store: &mut S,
        engine: &Engine,
        now: UnixMillis,
        attempt: &Attempt<'_>,
    ) -> Result<Claim, S::Error> {
        let decision = engine.decide(now, attempt, store.read(attempt.key)?.as_deref());
        if matches!(
            decision,
            Decision::Replay(_) | Decision::Mismatch { .. } | Decision::Rejected(_)
        ) {
            return Ok(Claim::Done(decision));
        }
        let mut request = Request::for_attempt(engine, attempt);
        let mut waiters = Waiters::default();
        // Under a record's rules nothing is decided before the read: the first step is it.
        if matches!(request.poll(now, &mut waiters), Step::Claim) {
            request.handle_decision(now, decision, &mut waiters);
        }
        request.drive_then(store, now, &mut waiters, drop)?;
        Ok(request.take_claim())
    }

    /// [`Request::claim_on`] for a record lease, as [`Store::claim`] answers it.
    pub(crate) fn claim_record_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
    ) -> Result<Claim, S::Error> {
        self.drive_then(store, now, &mut Waiters::default(), drop)?;
        Ok(self.take_claim())
    }

    /// What a claim driven to its end answers: the decision, or the lease.
    fn take_claim(&mut self) -> Claim {
        match self.take_answer() {
            Some(d) => Claim::Done(d),
            None => self.take_claimed().into(),
        }
    }

    /// The decision of a request answered without a lease, moved out alone: the state
    /// around it is large.
    fn take_answer(&mut self) -> Option<Decision> {
        match &mut self.state {
            State::Answered(Answer::Decision(d)) => {
                Some(core::mem::replace(d, Decision::CONTENDED))
            }
            _ => None,
        }
    }

    /// [`Request::claimed`], moving the lease or decision out.
    pub fn into_claimed(mut self) -> Claimed {
        self.take_claimed()
    }

    /// [`Request::claimed`], moving the lease or decision out and leaving the request
    /// finished, without moving the request itself.
    fn take_claimed(&mut self) -> Claimed {
        if let Some(d) = self.take_answer() {
            return Claimed::Done(d);
        }
        match core::mem::replace(&mut self.state, State::Finished(Finish::FencedOut)) {
            State::Holding(h) => Claimed::Execute {
                hold: h.hold.into_hold(),
                recovered: h.recovered,
            },
            _ => Claimed::Done(Decision::CONTENDED),
        }
    }

    /// Records `outcome` over `store` for a request already holding its lease.
    pub(crate) fn finish_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
        outcome: Outcome,
    ) -> Result<Finish, S::Error> {
        self.handle_outcome(outcome);
        self.drive_then(store, now, &mut Waiters::default(), |step| match step {
            Step::Done(finish) => finish,
            _ => Finish::FencedOut,
        })
    }
}

/// The stored answer for a final response too large to keep (`IDEM-STORE-5`).
fn not_stored(size: usize, max: usize) -> StoredResponse {
    let refusal = Refusal::new(
        Problem::RESPONSE_NOT_STORED,
        alloc::format!(
            "the request was processed, but its {size}-byte response exceeded the {max} bytes the store keeps and cannot be replayed"
        ),
    );
    StoredResponse {
        status: refusal.problem.status,
        headers: alloc::vec![(
            String::from("content-type"),
            String::from("application/problem+json")
        )],
        body: refusal.body().into_bytes(),
    }
}

/// What deciding produced: the engine's decision (for a record, an execute holds its lease
/// and write boxed), or a counter slot's claim, boxed too, so that every other answer
/// moves as a small value.
enum Decided {
    Decision(Decision),
    Slot(Box<(CounterLease, Write, bool)>),
}

/// Who is waiting for which key, in one host: only the latest waiter for a key keeps
/// waiting (`IDEM-CONC-2`). A host keeps one and passes it to every
/// [`Request::poll`]; hosts that never wait can pass a fresh one.
#[derive(Debug, Default)]
pub struct Waiters {
    latest: HashMap<String, (u64, UnixMillis)>,
    next: u64,
}

impl Waiters {
    fn enter(&mut self, key: &RecordKey, until: UnixMillis, now: UnixMillis) -> u64 {
        // Waiters that were dropped without leaving (their client went away) are pruned
        // once their bound has passed, whenever the map has doubled.
        if self.latest.len() >= 64 && self.latest.len().is_power_of_two() {
            self.latest.retain(|_, (_, u)| *u > now);
        }
        self.next += 1;
        self.latest.insert(key.storage_key(), (self.next, until));
        self.next
    }

    fn is_latest(&self, key: &RecordKey, ticket: u64) -> bool {
        self.latest
            .get(key.storage_key().as_str())
            .is_some_and(|(t, _)| *t == ticket)
    }

    fn leave(&mut self, key: &RecordKey, ticket: u64) {
        let k = key.storage_key();
        if self
            .latest
            .get(k.as_str())
            .is_some_and(|(t, _)| *t == ticket)
        {
            self.latest.remove(k.as_str());
        }
    }

    /// Keys with someone waiting.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

impl From<Claimed> for Claim {
    /// The claim of a record lease (a counter slot's lease has no [`Claim`]; it reads as
    /// contended).
    fn from(c: Claimed) -> Claim {
        match c {
            Claimed::Execute {
                hold: Hold::Record(lease),
                recovered,
            } => Claim::Execute {
                lease: Box::new(lease),
                recovered,
            },
            Claimed::Execute { .. } => Claim::Done(Decision::CONTENDED),
            Claimed::Done(d) => Claim::Done(d),
        }
    }
}

/// The rules of the other key kinds, for their own claim and finish functions.
impl<'a> Request<'a> {
    pub(crate) fn for_time(
        keys: &TimeKeys,
        scope: &Scope,
        key: &TimeKey,
        fingerprint: &'a Fingerprint,
        nonce: u64,
    ) -> Request<'a> {
        Request::with_rules(
            Rules::Time(keys.clone()),
            Cow::Owned(keys.record_key(scope, key)),
            Cow::Borrowed(fingerprint),
            Subject::Time(key.clone()),
            nonce,
        )
    }

    pub(crate) fn for_token(
        tokens: &Tokens,
        scope: &Scope,
        token: &str,
        fingerprint: &'a Fingerprint,
        nonce: u64,
    ) -> Request<'a> {
        Request::with_rules(
            Rules::Token(tokens.clone()),
            Cow::Owned(tokens.record_key(scope, token)),
            Cow::Borrowed(fingerprint),
            Subject::Token {
                scope: scope.clone(),
                token: String::from(token),
            },
            nonce,
        )
    }

    pub(crate) fn for_counter(counters: &Counters, attempt: &CounterAttempt<'a>) -> Request<'a> {
        Request::with_rules(
            Rules::Counter(counters.clone()),
            Cow::Owned(counters.session_key(attempt.scope, &attempt.key.client)),
            Cow::Borrowed(attempt.fingerprint),
            Subject::Counter {
                scope: attempt.scope.clone(),
                key: attempt.key.clone(),
                low_water: attempt.low_water,
            },
            0,
        )
    }

    pub(crate) fn holding_slot(counters: &Counters, lease: &'a CounterLease) -> Request<'a> {
        Request::held(
            Rules::Counter(counters.clone()),
            Cow::Borrowed(&lease.session),
            Held::Slot(Cow::Borrowed(lease)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{Events, Request};
    use crate::{
        Attempt, Claim, Config, Decision, Engine, Event, Fingerprint, MemoryStore, Outcome,
        RecordKey, Scope, Store, StoredResponse, UnixMillis,
    };
    use core::time::Duration;

    /// `Store::claim` answers a replay, a mismatch or a refusal from its read
    /// (`claim_attempt`): the same claim as the whole machine's from the same record, in
    /// flight, completed, and past its response's expiry.
    #[test]
    fn a_claim_answered_by_its_read_is_the_machines_claim() {
        let engine = Engine::default();
        let now = UnixMillis(1_700_000_000_000);
        let key = RecordKey::new(Scope::new("tenant", "POST", "/orders"), "k-1");
        let (same, other) = (
            Fingerprint::from_digest([1; 32]),
            Fingerprint::from_digest([2; 32]),
        );
        let attempt = |fingerprint, nonce| Attempt {
            key: &key,
            fingerprint,
            nonce,
        };
        let mut store = MemoryStore::default();
        let Claim::Execute { lease, .. } = store.claim(&engine, now, &attempt(&same, 1)).unwrap()
        else {
            panic!("a new key executes");
        };
        let mut answers = std::vec::Vec::new();
        let mut check = |store: &mut MemoryStore, at: UnixMillis| {
            for (fingerprint, nonce) in [(&same, 2), (&other, 3)] {
                let by_read = store
                    .claim(&engine, at, &attempt(fingerprint, nonce))
                    .unwrap();
                let by_machine = Request::for_attempt(&engine, &attempt(fingerprint, nonce))
                    .claim_record_on(store, at)
                    .unwrap();
                assert_eq!(by_read, by_machine);
                answers.push(by_read);
            }
        };
        check(&mut store, now);
        let response = StoredResponse {
            status: 201,
            headers: std::vec::Vec::new(),
            body: b"{}".to_vec(),
        };
        let _ = store
            .finish(&engine, now, &lease, Outcome::Final(response))
            .unwrap();
        check(&mut store, now);
        let later = Config::default().response_ttl + Duration::from_secs(1);
        check(&mut store, now.saturating_add(later));
        // In flight, the same payload waits (the machine answers) and another is a mismatch;
        // completed, a replay; past the response's expiry, a refusal: each kind of answer
        // the shortcut takes came up.
        assert!(matches!(
            answers[0],
            Claim::Done(Decision::InProgress { .. })
        ));
        assert!(matches!(answers[1], Claim::Done(Decision::Mismatch { .. })));
        assert!(matches!(answers[2], Claim::Done(Decision::Replay(_))));
        assert!(matches!(answers[4], Claim::Done(Decision::Rejected(_))));
    }

    #[test]
    fn events_keep_the_latest_when_nobody_reads_them() {
        let mut e = Events::default();
        for ev in [
            Event::Executed,
            Event::Extended,
            Event::Extended,
            Event::Completed,
            Event::Replayed,
        ] {
            e.push(ev);
        }
        let drained: std::vec::Vec<Event> = core::iter::from_fn(|| e.pop()).collect();
        assert_eq!(
            drained,
            [
                Event::Extended,
                Event::Extended,
                Event::Completed,
                Event::Replayed
            ]
        );
        assert_eq!(e.pop(), None);
    }
}
