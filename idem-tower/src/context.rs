//! What a handler learns about the execution it runs ([`IdempotencyContext`]), and why a
//! heartbeat may fail ([`LeaseError`]).

use crate::drive::Beat;
use idem_core::{RecordKey, UnixMillis};
use std::fmt;
use std::sync::Arc;

/// What a handler learns about the execution it runs: in the request's extensions as
/// `IdempotencyContext` (with axum, `Extension<IdempotencyContext>`).
#[derive(Clone)]
pub struct IdempotencyContext {
    key: String,
    record: RecordKey,
    recovered: bool,
    fence: u64,
    lease_expires: UnixMillis,
    attempt: u64,
    heartbeat: Arc<dyn Beat>,
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyContext")
            .field("key", &self.key)
            .field("recovered", &self.recovered)
            .field("fence", &self.fence)
            .field("lease_expires", &self.lease_expires)
            .finish_non_exhaustive()
    }
}

impl IdempotencyContext {
    /// The context of the execution the request machine let run, as `context` describes it,
    /// on record `record`, with its heartbeat.
    pub(crate) fn new(
        record: RecordKey,
        context: &idem_core::Context,
        heartbeat: Arc<dyn Beat>,
    ) -> Self {
        IdempotencyContext {
            key: record.key.clone(),
            record,
            recovered: context.recovered,
            fence: context.fence,
            lease_expires: context.lease_expires,
            attempt: context.attempt,
            heartbeat,
        }
    }

    /// The idempotency key, as parsed.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The record's key in the store: the scope (principal, method, route) and the key
    /// (for `PostgresStore::transaction`).
    pub fn record_key(&self) -> &RecordKey {
        &self.record
    }

    /// Whether this execution takes over from an attempt whose lease ended: reconcile with
    /// whatever that attempt may have done before acting (`IDEM-LEASE-1`).
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// The fencing number (`IDEM-LEASE-2`): hand it to resources that can check it.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// When the lease ends unless a heartbeat extends it.
    pub fn lease_expires(&self) -> UnixMillis {
        self.lease_expires
    }

    /// This attempt's identity, unique across every attempt at every key (for a store that
    /// keeps something for the attempt, such as `PostgresStore::transaction`).
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// Whether the request is over (its outcome recorded, or its finish dropped half-way): a
    /// transaction opened for it then is refused (`PostgresStore::transaction`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_over(&self) -> bool {
        self.heartbeat.is_over()
    }

    /// A heartbeat (`IDEM-LEASE-3`): extends the lease by one lease period, and the key's
    /// retention with it. Resolves to the new end of the lease.
    pub async fn extend(&self) -> Result<UnixMillis, LeaseError> {
        self.heartbeat.extend().await
    }
}

/// Why a heartbeat did not extend the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// Another attempt took the lease over: stop; nothing this attempt writes will be kept
    /// (`IDEM-LEASE-2`).
    FencedOut,
    /// The lease had ended before the heartbeat (`IDEM-LEASE-3`).
    Expired,
    /// The store failed; the lease may or may not have been extended (`IDEM-STORE-4`).
    StoreFailed,
    /// The request is over.
    Finished,
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaseError::FencedOut => "the lease was taken over by another attempt",
            LeaseError::Expired => "the lease had ended before the heartbeat",
            LeaseError::StoreFailed => "the store failed; the lease may not have been extended",
            LeaseError::Finished => "the request is over",
        })
    }
}

impl std::error::Error for LeaseError {}
