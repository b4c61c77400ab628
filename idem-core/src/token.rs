//! Server-issued one-time tokens (`IDEM-TOKEN-1` to `IDEM-TOKEN-4`).

use crate::engine::{Attempt, CompleteError, Decision, Engine, Lease, RejectReason, SharedOutcome};
use crate::fingerprint::Fingerprint;
use crate::key::{RecordKey, Scope};
use crate::kind::{decode_hex, kind_scope, push_hex, KindConfigError};
use crate::record::{Precondition, Record, RecordState, Write, WriteOp};
use crate::time::UnixMillis;
use alloc::string::String;
use core::fmt;
use core::time::Duration;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Every token starts with this.
pub const TOKEN_PREFIX: &str = "tok_";
/// Length of a token in characters.
pub const TOKEN_LEN: usize = TOKEN_PREFIX.len() + 64;
const DOMAIN: &[u8] = b"idem-token-v1";

/// The secret that signs tokens: 32 random bytes the host keeps (and rotates by issuing
/// with a new one while still accepting the old until its tokens expire).
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(pub [u8; 32]);

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(..)")
    }
}

/// A token just issued, and the write that stores it.
#[must_use = "the token exists only once its write is applied"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IssuedToken {
    /// The token to hand to the client.
    pub(crate) token: String,
    /// When it expires unless consumed.
    pub(crate) expires: UnixMillis,
    /// Apply this write before handing out the token. A conflict (the token already exists,
    /// with probability 2^-128) means: issue again with new random bytes.
    pub(crate) write: Write,
}

/// The rules of server-issued tokens.
///
/// The token operation ([`Policy::issue_token`](crate::Policy::issue_token)) issues with
/// [`Tokens::issue`] and applies its write; a request's machine, under a policy whose keys
/// are tokens ([`KeyKind::Token`](crate::KeyKind::Token)), verifies the token before it reads
/// anything ([`Tokens::verify`]), then decides on the record under [`Tokens::record_key`]
/// ([`Tokens::decide`]); completion goes through [`Tokens::engine`] as for any key. To
/// [`Engine::decide`] alone an unknown token is simply a new key, and it would run.
///
/// The server hands out a token (for example with the form that will submit the request);
/// the client sends it back as its idempotency key. The first request that presents the
/// token consumes it with one compare-and-set and runs; every later presentation is a retry
/// of that request (replay, in-progress, mismatch) exactly like an opaque key. A token the
/// server did not issue is refused without reading the store.
///
/// A token is `tok_` followed by 64 lowercase hex digits: 16 random bytes, its expiry
/// (milliseconds, big-endian) and the first 8 bytes of HMAC-SHA-256 under the host's secret
/// over the scope, the random bytes and the expiry. The MAC binds the token to the scope it
/// was issued for, and lets a forged, damaged or foreign token be refused at once (400
/// `token-forged`); the expiry in the token says whether an unknown token expired (410
/// `token-expired`) or was never stored (400 `token-unknown`).
#[derive(Clone, Debug)]
pub(crate) struct Tokens {
    engine: Engine,
    secret: TokenSecret,
    ttl: Duration,
}

impl Tokens {
    /// Tokens over `engine`, signed with `secret`, valid for `ttl` until consumed. The
    /// default TTL worth using is an hour (long enough to fill a form, short enough that a
    /// leaked token is soon useless); it may not exceed the key retention, so a consumed
    /// token is remembered for longer than an unconsumed one is valid.
    pub(crate) fn new(
        engine: Engine,
        secret: TokenSecret,
        ttl: Duration,
    ) -> Result<Tokens, KindConfigError> {
        if ttl.is_zero() {
            return Err(KindConfigError::ZeroDuration("token ttl"));
        }
        if ttl > engine.config().key_ttl {
            return Err(KindConfigError::ExceedsKeyRetention("token ttl"));
        }
        Ok(Tokens {
            engine,
            secret,
            ttl,
        })
    }

    /// The engine (for completion, heartbeats and expiry).
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Issues a token for `scope` at `now` from 128 random bits supplied by the caller
    /// (`IDEM-TOKEN-1`). The record it writes is in state [`RecordState::Issued`] until the
    /// first request consumes it, and disappears at the expiry if none does.
    pub(crate) fn issue(&self, now: UnixMillis, scope: &Scope, random: [u64; 2]) -> IssuedToken {
        let expires = now.saturating_add(self.ttl);
        let mut body = [0u8; 24];
        body[..8].copy_from_slice(&random[0].to_le_bytes());
        body[8..16].copy_from_slice(&random[1].to_le_bytes());
        body[16..].copy_from_slice(&expires.0.to_be_bytes());
        let tag = self.mac(scope, &body).finalize().into_bytes();
        let mut token = String::with_capacity(TOKEN_LEN);
        token.push_str(TOKEN_PREFIX);
        push_hex(&mut token, &body);
        push_hex(&mut token, &tag[..8]);
        let mut version = [0u8; 8];
        version.copy_from_slice(&tag[8..16]);
        let record = Record {
            // Keyed and random: versions of different tokens never repeat (`IDEM-STORE-2`).
            version: u64::from_le_bytes(version),
            fence: 0,
            fingerprint: Fingerprint::from_digest([0; 32]),
            created: now,
            key_expires: expires,
            state: RecordState::Issued { expires },
        };
        let write = Write {
            key: self.record_key(scope, &token),
            precondition: Precondition::Absent,
            op: WriteOp::Put(record),
        };
        IssuedToken {
            token,
            expires,
            write,
        }
    }

    /// Checks that `token` was issued by this secret for `scope`, and returns its expiry.
    /// Any other string is [`RejectReason::TokenForged`] (`IDEM-TOKEN-3`). The comparison
    /// of the MAC takes the same time wherever it differs.
    pub(crate) fn verify(&self, scope: &Scope, token: &str) -> Result<UnixMillis, RejectReason> {
        let hex = token
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(RejectReason::TokenForged)?;
        let mut raw = [0u8; 32];
        decode_hex(hex, &mut raw).ok_or(RejectReason::TokenForged)?;
        let (body, tag) = raw.split_at(24);
        self.mac(scope, body)
            .verify_truncated_left(tag)
            .map_err(|_| RejectReason::TokenForged)?;
        let mut expires = [0u8; 8];
        expires.copy_from_slice(&body[16..]);
        Ok(UnixMillis(u64::from_be_bytes(expires)))
    }

    fn mac(&self, scope: &Scope, body: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length; 32 bytes can never be refused.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(DOMAIN);
        mac.update(&(scope.as_str().len() as u64).to_le_bytes());
        mac.update(scope.as_str().as_bytes());
        mac.update(body);
        mac
    }

    /// Where the record for `token` lives: in the token scope of `scope` (`IDEM-KIND-1`).
    pub(crate) fn record_key(&self, scope: &Scope, token: &str) -> RecordKey {
        RecordKey::new(kind_scope(scope, "token"), token)
    }

    /// The completion write of a request that consumed `token` (`IDEM-TOKEN-2`): as any
    /// key's ([`Engine::complete_shared`]), except that a key released for a retry goes back
    /// to [`RecordState::Issued`] until the token's own expiry, the record's version chain
    /// going on. Deleted, it would leave a retry of the request no record, and the retry
    /// would be refused as `token-unknown` where an opaque key's runs again.
    pub(crate) fn complete_shared(
        &self,
        now: UnixMillis,
        scope: &Scope,
        token: &str,
        lease: &Lease,
        outcome: SharedOutcome,
    ) -> Result<Write, CompleteError> {
        let mut write = self.engine.complete_shared(now, lease, outcome)?;
        if let (WriteOp::Delete, Ok(expires)) = (&write.op, self.verify(scope, token)) {
            write.op = WriteOp::Put(Record {
                version: lease.version.wrapping_add(1),
                fence: lease.fence,
                fingerprint: Fingerprint::from_digest([0; 32]),
                created: lease.created,
                key_expires: expires,
                state: RecordState::Issued { expires },
            });
        }
        Ok(write)
    }

    /// Decides a request that presents `token`, whose `attempt.key` is
    /// [`Tokens::record_key`], given the record read for it (`IDEM-TOKEN-2` to
    /// `IDEM-TOKEN-4`):
    ///
    /// * not issued by this secret for this scope: [`RejectReason::TokenForged`];
    /// * no live record: [`RejectReason::TokenExpired`] once the token's expiry has passed,
    ///   else [`RejectReason::TokenUnknown`] (issued but never stored, or lost by the store);
    /// * issued and unexpired: [`Decision::Execute`], consuming it;
    /// * consumed: as [`Engine::decide`] for any key (replay, in-progress, mismatch, …),
    ///   whether or not the token's own expiry has passed.
    pub(crate) fn decide(
        &self,
        now: UnixMillis,
        scope: &Scope,
        token: &str,
        attempt: &Attempt<'_>,
        stored: Option<&Record>,
    ) -> Decision {
        let expires = match self.verify(scope, token) {
            Ok(e) => e,
            Err(reason) => return Decision::Rejected(reason),
        };
        match stored.filter(|r| now < r.key_expires) {
            Some(_) => self.engine.decide(now, attempt, stored),
            None if now >= expires => Decision::Rejected(RejectReason::TokenExpired),
            None => Decision::Rejected(RejectReason::TokenUnknown),
        }
    }
}
