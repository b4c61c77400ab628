//! A handler's own transaction ([`PostgresStore::transaction`]), which the request's
//! completion commits with its stored response (`IDEM-STORE-7`), and the guard that closes a
//! connection left half-way inside a transaction rather than pool it.

use super::{pooled_unless_failed, Attempt, Held, PostgresStore, PostgresStoreError};
use deadpool_postgres::Object;
use std::fmt;
use tokio_postgres::Client;

/// A handler's transaction: see [`PostgresStore::transaction`].
pub struct Transaction<'a> {
    pub(super) store: &'a PostgresStore,
    pub(super) attempt: Attempt,
    pub(super) client: Option<Object>,
}

impl fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("key", &self.attempt.0)
            .field("fence", &self.attempt.1)
            .finish_non_exhaustive()
    }
}

impl Transaction<'_> {
    /// The connection the transaction runs on.
    pub fn client(&self) -> &Client {
        // Set from the start until one of the methods that consume the transaction.
        self.client
            .as_deref()
            .map(|c| &**c)
            .expect("the transaction is open")
    }

    /// Leaves the transaction open for the request's completion, which commits it (or rolls
    /// it back) with the stored response. A request that was already answered (its
    /// completion came while the transaction ran) or is over commits nothing of it: it is
    /// rolled back.
    pub fn commit_with_completion(mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let mut open = self.store.open();
        match open.get_mut(&self.attempt) {
            Some(held @ Held::Running) => *held = Held::Open(Box::new(client)),
            _ => {
                tracing::warn!(
                    "idempotency: a transaction was handed over after its request was answered; it is rolled back"
                );
                drop(Object::take(client));
            }
        }
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        // Never back to the pool mid-transaction: the connection is closed, which rolls the
        // transaction back.
        if let Some(client) = self.client.take() {
            drop(Object::take(client));
        }
        // Not handed over: the attempt's place goes with it.
        let mut open = self.store.open();
        if matches!(open.get(&self.attempt), Some(Held::Running)) {
            open.remove(&self.attempt);
        }
    }
}

/// A connection with a transaction open (or being opened) while a future uses it: dropped
/// half-way (the future cancelled), it is closed, never pooled, which rolls the transaction
/// back; pooled once the transaction is over ([`InTransaction::pooled`]), or kept open for
/// later ([`InTransaction::keep`]).
pub(super) struct InTransaction(pub(super) Option<Object>);

impl InTransaction {
    /// The connection, still in its transaction, for whoever keeps it open.
    pub(super) fn keep(mut self) -> Option<Object> {
        self.0.take()
    }

    /// `result` of the statement that ended the transaction, the connection pooled only when
    /// it succeeded ([`pooled_unless_failed`]).
    pub(super) fn pooled<T>(
        mut self,
        result: Result<T, PostgresStoreError>,
    ) -> Result<T, PostgresStoreError> {
        match self.0.take() {
            Some(client) => pooled_unless_failed(client, result),
            None => result,
        }
    }
}

impl std::ops::Deref for InTransaction {
    type Target = Object;

    fn deref(&self) -> &Object {
        // Set from its making until `keep` or `pooled` consumes it.
        self.0.as_ref().expect("the connection is held")
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(Object::take(client));
        }
    }
}
