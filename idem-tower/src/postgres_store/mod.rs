//! A store on Postgres, shared by every process that talks to it.
//!
//! The table and the statements are idem-core's ([`idem_core::stores::POSTGRES_SQL`]), the
//! same the JavaScript `PostgresStore` runs, with the same record encoding: a Rust service
//! and a JavaScript one can share one table. A claim is `INSERT … ON CONFLICT DO NOTHING`;
//! every other write is `UPDATE`/`DELETE … WHERE version = $n`.
//!
//! This file is the store: its pool, its error, its bounded calls, its writes and its sweep,
//! one statement each. A handler's own transaction, which the store holds for the request's
//! completion, is in `transaction.rs`.

use crate::IdempotencyContext;
use deadpool_postgres::{ClientWrapper, Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use idem_core::stores::{postgres_statement, unopened_due, CALL_TIMEOUT};
use idem_core::{
    Applied, AsyncStore, Completing, Expiry, Finish, Precondition, Record, RecordKey, StoreFailure,
    UnixMillis, Write, WriteOp,
};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::NoTls;

use crate::seal::{self, Seal, Unreadable};

mod transaction;

use transaction::InTransaction;
pub use transaction::Transaction;

fn statement(name: &str) -> &'static str {
    // The names are this file's, checked by idem-core's tests of the SQL file.
    postgres_statement(name).unwrap_or("")
}

/// Why a Postgres store call failed.
#[derive(Debug)]
pub enum PostgresStoreError {
    /// No connection could be had from the pool.
    Pool(deadpool_postgres::PoolError),
    /// Postgres failed.
    Postgres(tokio_postgres::Error),
    /// The bytes of a row are not a record, or a sealed one this store cannot open
    /// (`IDEM-SEAL-3`).
    Record(Unreadable),
    /// The pool could not be built from the settings.
    Config(String),
    /// Postgres did not answer in time ([`PostgresStore::with_timeout`]); the write may or
    /// may not have been applied.
    Timeout(Duration),
    /// The request already has a transaction ([`PostgresStore::transaction`]): one request
    /// commits one.
    TransactionOpen,
    /// The request is over ([`PostgresStore::transaction`]): nothing would commit a
    /// transaction opened for it.
    RequestOver,
    /// A completion that was to commit the handler's transaction with its stored response
    /// failed: whether the transaction committed is unknown (`IDEM-STORE-7`).
    Uncommitted(Box<PostgresStoreError>),
}

impl fmt::Display for PostgresStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostgresStoreError::Pool(e) => write!(f, "postgres pool: {e}"),
            PostgresStoreError::Postgres(e) => write!(f, "postgres: {e}"),
            PostgresStoreError::Record(e) => e.fmt(f),
            PostgresStoreError::Config(e) => write!(f, "postgres settings: {e}"),
            PostgresStoreError::Timeout(d) => {
                write!(f, "postgres did not answer within {} ms", d.as_millis())
            }
            PostgresStoreError::TransactionOpen => {
                f.write_str("this request already has a transaction open")
            }
            PostgresStoreError::RequestOver => {
                f.write_str("the request is over: no completion would commit its transaction")
            }
            PostgresStoreError::Uncommitted(e) => {
                write!(f, "the handler's transaction may not have committed: {e}")
            }
        }
    }
}

impl std::error::Error for PostgresStoreError {}

impl From<deadpool_postgres::PoolError> for PostgresStoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        PostgresStoreError::Pool(e)
    }
}

impl From<tokio_postgres::Error> for PostgresStoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        PostgresStoreError::Postgres(e)
    }
}

/// A store on Postgres through a deadpool pool of tokio-postgres connections.
pub struct PostgresStore {
    pool: Pool,
    /// Attempt → its handler's transaction: still running, or handed over and waiting for
    /// the completion.
    open: Mutex<HashMap<Attempt, Held>>,
    /// How long one store call may take.
    timeout: Duration,
    seal: Option<Seal>,
    /// Storage key → the store's last write of it that Postgres has not answered yet: its
    /// sender is dropped when Postgres answers, or when the write is given up.
    unanswered: Arc<Mutex<HashMap<String, watch::Receiver<()>>>>,
}

/// An attempt's transaction, as the store holds it.
enum Held {
    /// A [`Transaction`] the handler still runs: the attempt's one.
    Running,
    /// Handed over ([`Transaction::commit_with_completion`]): the completion commits it.
    Open(Box<Object>),
}

/// One attempt at a key: its storage key and the attempt's identity
/// ([`IdempotencyContext::attempt`]). An attempt that took over a key has a transaction of its
/// own, apart from the one it displaced, and so has an attempt at a key released and claimed
/// again (which starts over at fence 1).
type Attempt = (String, u64);

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("seal", &self.seal)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A pool of at most `max_connections` connections to `url`
    /// (`postgres://user@host:port/db`), without TLS.
    pub fn connect(url: &str, max_connections: usize) -> Result<PostgresStore, PostgresStoreError> {
        let config: tokio_postgres::Config = url.parse()?;
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_connections)
            .build()
            .map_err(|e| PostgresStoreError::Config(e.to_string()))?;
        Ok(PostgresStore::new(pool))
    }

    /// A store on a pool you made.
    pub fn new(pool: Pool) -> PostgresStore {
        PostgresStore {
            pool,
            open: Mutex::new(HashMap::new()),
            timeout: CALL_TIMEOUT,
            seal: None,
            unanswered: Arc::default(),
        }
    }

    /// Seals every record this store writes with `seal`'s first key and opens records sealed
    /// with any of its keys (`IDEM-SEAL-1`, `IDEM-SEAL-2`): no response is kept in clear in
    /// the table. Rows written in clear before are still read; a row sealed with a key the
    /// seal does not hold is answered 500 `record-sealed` and never executed
    /// (`IDEM-SEAL-3`), and the sweep leaves it alone.
    pub fn with_seal(mut self, seal: Seal) -> PostgresStore {
        self.seal = Some(seal);
        self
    }

    /// How long one store call may take, the wait for a connection included (default
    /// idem-core's [`CALL_TIMEOUT`], 2 s). A call that runs out of time fails with
    /// [`PostgresStoreError::Timeout`], which the layer answers with 503 like any store
    /// failure. A claim or heartbeat that runs out of time keeps its connection until
    /// Postgres answers it, for at most twice this long, so that the next write of its key
    /// is sent after it (`IDEM-STORE-12`); any other call's connection is closed then, and a
    /// connection whose call failed or was given up is never pooled: a statement may still
    /// be running on it, or a transaction be open.
    pub fn with_timeout(mut self, timeout: Duration) -> PostgresStore {
        self.timeout = timeout;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The migration: the table and its deadline index (safe to run again).
    pub fn schema() -> &'static str {
        statement("schema")
    }

    /// Runs the migration.
    pub async fn migrate(&self) -> Result<(), PostgresStoreError> {
        self.pool
            .get()
            .await?
            .batch_execute(statement("schema"))
            .await?;
        Ok(())
    }

    fn open(&self) -> MutexGuard<'_, HashMap<Attempt, Held>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Expires what is due at `now`, at most `limit` records, through the deadline index:
    /// responses past their expiry become tombstones, records whose key (and any live lease)
    /// has ended are deleted. Returns how many changed. Until a record is swept the engine
    /// reads its expiry from the record anyway.
    pub async fn sweep(&self, now: UnixMillis, limit: i64) -> Result<usize, PostgresStoreError> {
        let client = self.pool.get().await?;
        let due = client.prepare_cached(statement("due")).await?;
        let rows = client.query(&due, &[&(now.0 as i64), &limit]).await?;
        let mut changed = 0;
        for row in rows {
            let key: String = row.get(0);
            let version: String = row.get(1);
            let record = match seal::decode(self.seal.as_ref(), &key, row.get::<_, &[u8]>(2)) {
                Ok(record) => record,
                // Sealed with a key this store does not hold (`IDEM-SEAL-3`), or bytes that are
                // not a record this version reads (`IDEM-REC-1`: damaged, or a newer writer's
                // format): idem-core's rule for a record it cannot open. Returned as an error,
                // one such record would stop the expiry of every record due after it.
                Err(_) => {
                    let expires = UnixMillis(u64::try_from(row.get::<_, i64>(3)).unwrap_or(0));
                    if let Some(due) = unopened_due(expires, now) {
                        let due = i64::try_from(due.0).unwrap_or(i64::MAX);
                        let defer = client.prepare_cached(statement("defer")).await?;
                        client.execute(&defer, &[&key, &version, &due]).await?;
                    } else {
                        let seal = self.seal.as_ref();
                        if write_on(&client, seal, &key, Some(&version), &WriteOp::Delete).await?
                            == Applied::Applied
                        {
                            changed += 1;
                        }
                    }
                    continue;
                }
            };
            let op = match record.expire(now) {
                Expiry::Keep(_) => continue,
                Expiry::Tombstone(t) => WriteOp::Put(t),
                Expiry::Delete => WriteOp::Delete,
            };
            let seal = self.seal.as_ref();
            if write_on(&client, seal, &key, Some(&version), &op).await? == Applied::Applied {
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// Opens a transaction on a connection of the pool for the request whose context is
    /// `context`. Run the handler's own statements on [`Transaction::client`], then call
    /// [`Transaction::commit_with_completion`]: the transaction then commits together with
    /// the request's completion (the stored response), or not at all: a handler that fails
    /// or panics, a response that is not kept, or a completion under a lease that another
    /// attempt took over commits nothing (`IDEM-STORE-7`), and a stored response never
    /// commits without the transaction. A `Transaction` dropped before that rolls back, and
    /// so does one handed over whose request ends without a stored response.
    pub async fn transaction(
        &self,
        context: &IdempotencyContext,
    ) -> Result<Transaction<'_>, PostgresStoreError> {
        let attempt = (context.record_key().storage_key(), context.attempt());
        match self.open().entry(attempt.clone()) {
            Entry::Occupied(_) => return Err(PostgresStoreError::TransactionOpen),
            Entry::Vacant(place) => place.insert(Held::Running),
        };
        // A request already over has no completion to commit with (its end, if it comes
        // after the place was taken, lets the place go, and the transaction rolls back).
        if context.is_over() {
            self.open().remove(&attempt);
            return Err(PostgresStoreError::RequestOver);
        }
        // The attempt's place is the transaction's from here: whatever fails below drops
        // it, and lets the place go.
        let mut transaction = Transaction {
            store: self,
            attempt,
            client: None,
        };
        let client = connection(&self.pool, self.timeout).await?;
        // From BEGIN on, a future dropped half-way closes the connection (`InTransaction`).
        let client = InTransaction(Some(client));
        timed(self.timeout, async {
            Ok(client.batch_execute("BEGIN").await?)
        })
        .await?;
        transaction.client = client.keep();
        Ok(transaction)
    }
}

/// The failure of a completion that was to commit the handler's transaction.
fn uncommitted(e: PostgresStoreError) -> PostgresStoreError {
    PostgresStoreError::Uncommitted(Box::new(e))
}

/// A connection from `pool`, waited for at most `limit`.
async fn connection(pool: &Pool, limit: Duration) -> Result<Object, PostgresStoreError> {
    timed(limit, async { Ok(pool.get().await?) }).await
}

/// `error`, with a timeout named by the call's whole `limit` rather than what was left of it.
fn within(error: PostgresStoreError, limit: Duration) -> PostgresStoreError {
    match error {
        PostgresStoreError::Timeout(_) => PostgresStoreError::Timeout(limit),
        other => other,
    }
}

/// The map of writes not answered yet, whole whatever a panic elsewhere left.
fn lock<T>(map: &Mutex<T>) -> MutexGuard<'_, T> {
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `call`, given at most `limit` to answer.
async fn timed<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, PostgresStoreError>>,
) -> Result<T, PostgresStoreError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or(Err(PostgresStoreError::Timeout(limit)))
}

/// `result` of a call on `client`; the connection goes back to the pool only when the call
/// succeeded. After a failure or a timeout nobody knows its state (a statement may still
/// run on it, a transaction may be open), so it is closed, which also rolls back whatever
/// transaction it had open.
fn pooled_unless_failed<T>(
    client: Object,
    result: Result<T, PostgresStoreError>,
) -> Result<T, PostgresStoreError> {
    if result.is_err() {
        drop(Object::take(client));
    }
    result
}

/// A write on `client`: the compare-and-set on the row's version.
/// Applies `write` on `client`.
async fn write_at(
    client: &ClientWrapper,
    seal: Option<&Seal>,
    write: &Write,
) -> Result<Applied, PostgresStoreError> {
    let expect = match write.precondition {
        Precondition::Absent => None,
        Precondition::Version(v) => Some(v.to_string()),
    };
    write_on(
        client,
        seal,
        &write.key.storage_key(),
        expect.as_deref(),
        &write.op,
    )
    .await
}

async fn write_on(
    client: &ClientWrapper,
    seal: Option<&Seal>,
    key: &str,
    expect: Option<&str>,
    op: &WriteOp,
) -> Result<Applied, PostgresStoreError> {
    let rows = match (expect, op) {
        (Some(v), WriteOp::Delete) => {
            let s = client.prepare_cached(statement("delete")).await?;
            client.execute(&s, &[&key, &v]).await?
        }
        // Deleting what must not exist changes nothing; the engine never asks for it.
        (None, WriteOp::Delete) => return Ok(Applied::Conflict),
        (None, WriteOp::Put(record)) => {
            let s = client.prepare_cached(statement("insert")).await?;
            let (version, value, deadline, expires) = columns(seal, key, record);
            client
                .execute(&s, &[&key, &version, &value, &deadline, &expires])
                .await?
        }
        (Some(v), WriteOp::Put(record)) => {
            let s = client.prepare_cached(statement("update")).await?;
            let (version, value, deadline, expires) = columns(seal, key, record);
            client
                .execute(&s, &[&key, &v, &version, &value, &deadline, &expires])
                .await?
        }
    };
    Ok(if rows == 1 {
        Applied::Applied
    } else {
        Applied::Conflict
    })
}

fn columns(seal: Option<&Seal>, key: &str, record: &Record) -> (String, Vec<u8>, i64, i64) {
    (
        record.version.to_string(),
        seal::encode(seal, key, record),
        record.next_deadline().0 as i64,
        record.retained_until().0 as i64,
    )
}

impl AsyncStore for PostgresStore {
    type Error = PostgresStoreError;

    fn failure(error: &PostgresStoreError) -> StoreFailure {
        match error {
            PostgresStoreError::Record(e) if e.is_sealed() => StoreFailure::Sealed,
            PostgresStoreError::Uncommitted(_) => StoreFailure::Uncommitted,
            _ => StoreFailure::Unavailable,
        }
    }

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, PostgresStoreError>> + Send {
        let pool = self.pool.clone();
        let key = key.storage_key();
        let limit = self.timeout;
        let seal = self.seal.clone();
        async move {
            let client = connection(&pool, limit).await?;
            let row = timed(limit, async {
                let s = client.prepare_cached(statement("load")).await?;
                Ok(client.query_opt(&s, &[&key]).await?)
            })
            .await;
            let row = pooled_unless_failed(client, row)?;
            row.map(|r| {
                seal::decode(seal.as_ref(), &key, r.get::<_, &[u8]>(1))
                    .map_err(PostgresStoreError::Record)
            })
            .transpose()
        }
    }

    fn apply(
        &self,
        _now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, PostgresStoreError>> + Send {
        // A claim or a heartbeat (or the withdrawal of a claim): never in the handler's
        // transaction. Statements on other connections run in no set order, and a write whose
        // call ran out of time may still be applied: the next write of the same key is sent
        // once Postgres has answered it, so that a withdrawal comes after its claim
        // (`IDEM-STORE-12`), all within the call's time.
        let pool = self.pool.clone();
        let limit = self.timeout;
        let seal = self.seal.clone();
        let unanswered = Arc::clone(&self.unanswered);
        async move {
            let deadline = Instant::now() + limit;
            let key = write.key.storage_key();
            let before = lock(&unanswered).get(&key).cloned();
            if let Some(mut before) = before {
                // Nothing is ever sent: `changed` ends when the earlier write's sender is gone.
                if tokio::time::timeout_at(deadline, before.changed())
                    .await
                    .is_err()
                {
                    return Err(PostgresStoreError::Timeout(limit));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let client = connection(&pool, left)
                .await
                .map_err(|e| within(e, limit))?;
            let (sender, mine) = watch::channel(());
            lock(&unanswered).insert(key.clone(), mine.clone());
            let running = tokio::spawn(async move {
                // Nobody waits for its answer past twice the limit: the next write of the key
                // waits at most until then.
                let applied = timed(2 * limit, write_at(&client, seal.as_ref(), &write)).await;
                let applied = pooled_unless_failed(client, applied);
                let mut unanswered = lock(&unanswered);
                if unanswered.get(&key).is_some_and(|r| r.same_channel(&mine)) {
                    unanswered.remove(&key);
                }
                drop(sender);
                applied
            });
            match tokio::time::timeout_at(deadline, running).await {
                Ok(Ok(applied)) => applied.map_err(|e| within(e, limit)),
                Ok(Err(join)) => match join.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(_) => Err(PostgresStoreError::Timeout(limit)),
                },
                Err(_) => Err(PostgresStoreError::Timeout(limit)),
            }
        }
    }

    fn apply_completion(
        &self,
        _now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> impl Future<Output = Result<Applied, PostgresStoreError>> + Send {
        // The completion takes over its own attempt's open transaction, if it left one: never
        // another attempt's (the one that took over, or the one it displaced).
        let attempt = (write.key.storage_key(), completion.attempt);
        // A transaction the handler still runs is not part of the answer: without its place,
        // it is rolled back when it is handed over (`commit_with_completion`).
        let open = match self.open().remove(&attempt) {
            Some(Held::Open(client)) => Some(*client),
            Some(Held::Running) | None => None,
        };
        let pool = self.pool.clone();
        let limit = self.timeout;
        let seal = self.seal.clone();
        async move {
            let Some(client) = open else {
                let client = connection(&pool, limit).await?;
                let applied = timed(limit, write_at(&client, seal.as_ref(), &write)).await;
                return pooled_unless_failed(client, applied);
            };
            // Cancelled half-way, the completion closes the connection (`InTransaction`).
            let client = InTransaction(Some(client));
            // Anything but a stored response rolls the handler's rows back and is written
            // alone: a release, or an outcome held as unknown.
            if completion.finish != Finish::Stored {
                let rolled_back = timed(limit, async {
                    client.batch_execute("ROLLBACK").await?;
                    write_at(&client, seal.as_ref(), &write).await
                })
                .await;
                return client.pooled(rolled_back);
            }
            // A stored response commits the handler's rows, in one commit with it.
            let written = timed(limit, write_at(&client, seal.as_ref(), &write)).await;
            match written {
                Ok(Applied::Applied) => {
                    let committed = timed(limit, async {
                        client.batch_execute("COMMIT").await?;
                        Ok(Applied::Applied)
                    })
                    .await;
                    client.pooled(committed).map_err(uncommitted)
                }
                // The record moved on: a write of this lease whose answer was lost (a
                // heartbeat), after which the machine completes again from the record as it
                // reads, or a takeover by another attempt. Either way the transaction stays
                // open for this attempt: its next completion commits it, and the end of the
                // attempt rolls it back (`end_attempt`). It is never given up here, or the
                // next completion would store the response without its rows.
                Ok(Applied::Conflict) => {
                    if let Some(client) = client.keep() {
                        self.open().insert(attempt, Held::Open(Box::new(client)));
                    }
                    Ok(Applied::Conflict)
                }
                Err(e) => client.pooled(Err(e)).map_err(uncommitted),
            }
        }
    }

    fn end_attempt(&self, key: &RecordKey, attempt: u64) -> bool {
        // A transaction handed over that no stored response committed: closed, never
        // pooled, which rolls it back and lets go of its row locks.
        match self.open().remove(&(key.storage_key(), attempt)) {
            Some(Held::Open(client)) => {
                drop(Object::take(*client));
                true
            }
            // One the handler still runs is not part of its answer.
            Some(Held::Running) | None => false,
        }
    }
}
