//! What a host protects its requests with: the policy, the key kinds, where a request
//! without a key header finds its key, and the in-flight policy.

use super::*;

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

/// How keys are read from the request, and which rules their records follow. The request
/// machine applies the rules of the kind; `spec/KINDS.md` has them in full.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum KeyKind {
    /// An RFC 8941 sf-string or a Stripe-style bare key (`IDEM-KEY-1`, `IDEM-KEY-2`).
    Opaque,
    /// An RFC 8941 sf-string only.
    OpaqueStrict,
    /// A UUID, of the given version when one is named (`IDEM-KEY-4`).
    Uuid(Option<UuidVersion>),
    /// A client timestamp, `<millis>` or `<client>:<millis>` ([`parse_time_key`](crate::parse_time_key),
    /// `IDEM-TIME-1` to `IDEM-TIME-5`). It is accepted only inside a window around the
    /// server's clock ([`TimeKeyConfig`]), which the key retention must outlive, so that a
    /// key whose record was purged can never run again; the same timestamp with another
    /// payload is a collision, never a replay.
    Time(TimeKeyConfig),
    /// A wrapping per-client counter, `<client>:<epoch>:<seq>` ([`parse_counter_key`](crate::parse_counter_key),
    /// `IDEM-CTR-1` to `IDEM-CTR-13`), sent with the client's low-water mark
    /// ([`LOW_WATER_HEADER`](crate::LOW_WATER_HEADER)). The client opens its session first
    /// ([`Policy::open_session`]); then a number below the mark is stale, one inside the
    /// window is a retry (or a collision, with another payload), the next one runs, and a
    /// gap of a whole window, or a window that would slide over a request still in flight,
    /// is refused.
    Counter(CounterConfig),
    /// A server-issued one-time token (`IDEM-TOKEN-1` to `IDEM-TOKEN-4`), issued by the
    /// token operation ([`Policy::issue_token`]). The first request that presents it
    /// consumes it, and later ones are its retries; a token this server did not sign for the
    /// scope is refused before anything is read, and an unknown or expired one after.
    Token {
        /// The signing secret.
        secret: TokenSecret,
        /// How long an unconsumed token is valid.
        ttl: Duration,
    },
}

impl KeyKind {
    /// This kind with its bounds fitted to a key retention of `key_ttl`: a time key's window
    /// ([`TimeKeyConfig::fit`]) and a token's validity (at most the retention, so that a
    /// consumed token is remembered for longer than an unconsumed one is valid). For a host
    /// whose settings come from elsewhere (the environment, the command line) and may not
    /// fit a retention shortened since; [`Policy::with_keys`] refuses bounds that do not fit.
    pub fn fit(self, key_ttl: Duration) -> KeyKind {
        match self {
            KeyKind::Time(config) => KeyKind::Time(config.fit(key_ttl)),
            KeyKind::Token { secret, ttl } => KeyKind::Token {
                secret,
                ttl: ttl.min(key_ttl),
            },
            other => other,
        }
    }
}

impl Parse {
    /// The key in a key header's value, by this policy's syntax.
    pub(super) fn key(self, value: &[u8]) -> Result<String, KeyError> {
        match self {
            Parse::Strict => parse_opaque_strict(value),
            Parse::Lenient => parse_opaque_lenient(value),
            Parse::Uuid(v) => parse_opaque_lenient(value).and_then(|k| parse_uuid(&k, v)),
        }
    }
}

/// The rules a request's record follows, resolved from a [`KeyKind`].
#[derive(Clone, Debug)]
pub(super) enum Rules {
    Record(Engine),
    Time(TimeKeys),
    Counter(Counters),
    Token(Tokens),
}

impl Rules {
    /// The engine settings the rules follow (a counter's too).
    pub(super) fn config(&self) -> &Config {
        match self {
            Rules::Record(e) => e.config(),
            Rules::Time(t) => t.engine().config(),
            Rules::Token(t) => t.engine().config(),
            Rules::Counter(c) => c.engine_config(),
        }
    }

    pub(super) fn engine(&self) -> Option<&Engine> {
        match self {
            Rules::Record(e) => Some(e),
            Rules::Time(t) => Some(t.engine()),
            Rules::Token(t) => Some(t.engine()),
            Rules::Counter(_) => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parse {
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
    pub(super) engine: Engine,
    pub(super) parse: Parse,
    pub(super) rules: Rules,
    pub(super) fingerprint: FingerprintSpec,
    pub(super) in_flight: InFlight,
    pub(super) methods: Vec<String>,
    pub(super) keys_required: bool,
    pub(super) max_response_bytes: usize,
    /// Where a request without a key header finds its key (`IDEM-DERIVE-4`,
    /// `IDEM-KEY-7`).
    pub(super) fallback: KeyFallback,
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
        self.guards(method) && (has_key || self.keys_required || self.fallback != KeyFallback::None)
    }

    /// Whether `method` is one the policy guards.
    fn guards(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m == method)
    }

    /// Whether a request with this method (and a key or not) needs its body to be identified:
    /// it is protected ([`protects`](Policy::protects)) and carries a key, or its key would be
    /// derived from the body ([`KeyFallback`]). A protected request without a key otherwise
    /// is refused before its body matters, so a host that reads bodies ahead of its routing
    /// (NestJS's intake) leaves it unread.
    pub fn reads_body(&self, method: &str, has_key: bool) -> bool {
        self.guards(method) && (has_key || self.fallback != KeyFallback::None)
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
    pub fn request(&self, intake: &Intake<'_>, nonce: u64) -> Request {
        match self.identify(intake) {
            Ok((key, fingerprint, subject)) => Request::new(self, key, fingerprint, subject, nonce),
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

    /// The machine for an attempt that a host identified and a store that claims for it
    /// sent over (a Durable Object: see [`Request::ticket`]).
    pub fn resume(&self, ticket: Ticket, nonce: u64) -> Request {
        Request::new(self, ticket.key, ticket.fingerprint, ticket.subject, nonce)
    }
}

/// The principal as it enters a scope: the first 16 bytes of its SHA-256 digest in hex, so
/// that credentials never reach a store (`IDEM-SCOPE-2`). [`RecordKey::digest`] is the same
/// function of the storage key (one copy of the code in the WebAssembly module).
///
/// [`RecordKey::digest`]: crate::RecordKey::digest
pub(crate) fn principal_digest(principal: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(principal.as_bytes());
    let mut hex = String::with_capacity(32);
    crate::kind::push_hex(&mut hex, &digest[..16]);
    hex
}
