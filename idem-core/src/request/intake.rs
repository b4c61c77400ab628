//! A request as the host received it, identified: its key, scope and fingerprint, or the
//! refusal that answers it at once.

use super::*;

/// The key at JSON pointer `pointer` in `body` (`IDEM-KEY-7`): a string, refused as missing
/// when the body is not JSON or has nothing there, as malformed when it is not a string.
#[allow(clippy::result_large_err)] // as for check_body_size
pub(super) fn key_at(body: &[u8], pointer: &str) -> Result<String, Refusal> {
    let missing = || Refusal {
        requirement: "IDEM-KEY-7",
        ..Refusal::new(
            Problem::MISSING_KEY,
            alloc::format!("no Idempotency-Key header, and no key at {pointer} in the body"),
        )
    };
    match crate::canon::string_at(body, pointer).map_err(|_| missing())? {
        crate::canon::Found::String(key) => Ok(key),
        crate::canon::Found::NotString
        | crate::canon::Found::Bool(_)
        | crate::canon::Found::Number(_) => Err(Refusal {
            requirement: "IDEM-KEY-7",
            ..Refusal::new(
                Problem::MALFORMED_KEY,
                alloc::format!("the key at {pointer} in the body is not a string"),
            )
        }),
        crate::canon::Found::Missing => Err(missing()),
    }
}

/// Whose requests, with which method to which route, an operation beside the guarded
/// request is for (a session, a token): the parts of a scope ([`Policy::scope`]).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// Who asks: an account or user id, never a credential that rotates (`IDEM-SCOPE-3`);
    /// `None` when the host serves one tenant.
    pub principal: Option<&'a str>,
    /// The method of the requests it is for.
    pub method: &'a str,
    /// The route of the requests it is for.
    pub route: &'a str,
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
    /// The client a unix-time key is from when the key names none: the value of a header the
    /// host reads beside the key ([`time_key_of`](crate::timekey::time_key_of)). Other kinds
    /// ignore it.
    pub client: Option<&'a str>,
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

impl Policy {
    #[allow(clippy::result_large_err)] // as for check_body_size
    pub(super) fn identify(
        &self,
        i: &Intake<'_>,
    ) -> Result<(RecordKey, Fingerprint, Subject), Refusal> {
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
        let key = self.parse.key(value).map_err(|e| Refusal::key(&e))?;
        let fingerprint = self.fingerprint_of(i)?;
        let (record_key, subject) = match &self.rules {
            Rules::Record(_) => (RecordKey::new(scope, key), Subject::Record),
            Rules::Time(t) => {
                let k = time_key_of(&key, i.client)
                    .map_err(|e| Refusal::kind_key(&e, "IDEM-TIME-1"))?;
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
    pub(super) fn fingerprint_of(&self, i: &Intake<'_>) -> Result<Fingerprint, Refusal> {
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
    pub(super) fn derived(
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
}

/// A request body read as it arrives, within the limit of the policy's fingerprint
/// (`IDEM-LIMIT-1`): a host feeds it the chunks its framework gives it and answers the core's
/// 413 as soon as one goes past the limit, so that an endless upload never fills its memory.
/// Start one with [`Policy::read_body`].
#[derive(Debug)]
pub struct BodyReader {
    max: usize,
    bytes: Vec<u8>,
}

impl Policy {
    /// Starts reading a request body whose declared length (its `Content-Length`, when it
    /// has one) is `declared`: refused at once, before a byte is read, with the core's 413
    /// `body-too-large` when that is more than the fingerprint accepts.
    pub fn read_body(&self, declared: Option<u64>) -> Result<BodyReader, Reply> {
        if let Some(len) = declared {
            self.check_body_size(len).map_err(|r| r.reply())?;
        }
        // A declared length within the limit is the size to expect; an undeclared one grows.
        let expected = declared.map_or(0, |len| len as usize);
        Ok(BodyReader {
            max: self.fingerprint.max_body,
            bytes: Vec::with_capacity(expected),
        })
    }
}

impl BodyReader {
    /// The next chunk of the body; 413 `body-too-large` once the body goes past the limit
    /// (stop reading then: nothing is claimed, nothing runs).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), Reply> {
        let len = self.bytes.len().saturating_add(chunk.len());
        if len > self.max {
            return Err(Refusal::body_too_large(len as u64, self.max).reply());
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// The body, once every chunk is in.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }

    /// The answer to a body that broke off before its end (the client went away, the
    /// connection or its framing failed): 400, nothing claimed, nothing run.
    pub fn broken(self) -> Reply {
        Reply::plain(Plain::BadRequest, "the request body could not be read")
    }
}
