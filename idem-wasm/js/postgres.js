// `idem/postgres`: a store on Postgres, shared by every process that talks to it.
//
// One table, `idem_records`, and every statement on it come from idem-core/stores/
// postgres.sql, shared with the Rust store. A claim is `INSERT … ON CONFLICT DO NOTHING`;
// every other write is `UPDATE`/`DELETE … WHERE version = $n`: the row's version is the
// compare-and-set. `sweep()` expires what is due through the index on the deadline.
// `transaction(context, fn)` commits the handler's own rows in the transaction that
// completes its key: both or neither (the reason idem records writes, not actions).
//
// One class in one file: the store's calls, the handler's transaction and the sweep share
// the pool, its bounded checkout (a client watched from the moment the pool hands it over,
// nothing sent after the caller gave up) and the transactions open by attempt, which are
// the class's private state; split, each part would need that state made public.
import { expire, openedRecord, recordSealer, storeTimeoutMs, unopenedDue } from "idem";
import SQL from "../../idem-core/stores/postgres.sql";
import { attemptOf, attemptOfContext } from "./attempt.js";
import { bounded, milliseconds, rangeError, timedOut, uncommitted } from "./errors.js";

/** The statements of postgres.sql, by the name on the `-- name:` line before each. */
function statements(text) {
  const out = {};
  let name = null;
  let lines = [];
  const flush = () => {
    if (name !== null) out[name] = lines.filter((l) => !l.trimStart().startsWith("--")).join("\n").trim();
  };
  for (const line of text.split("\n")) {
    const m = /^-- name: (\w+)\s*$/.exec(line);
    if (m) {
      flush();
      name = m[1];
      lines = [];
    } else {
      lines.push(line);
    }
  }
  flush();
  return out;
}

const Q = statements(SQL);

const bytes = (v) => Buffer.from(v.buffer, v.byteOffset, v.byteLength);

/** The error listener of a client while this store holds it, from the moment the pool hands
 * it over: a dead connection fails the statements that follow, and is then discarded
 * (`giveBack`), instead of ending the process with an unhandled 'error' event. */
function unwatched() {}

/** A client this store checked out back to the pool, or discarded with `err` (its state
 * unknown). */
function ignore() {}

function giveBack(client, err) {
  client.off?.("error", unwatched);
  if (err === undefined) client.release();
  else client.release(err);
}

/**
 * A store on Postgres through a `pg` pool (or anything with its `query`, and its `connect`
 * in the callback form). The pool is the caller's: it is neither created nor ended here. Run
 * the migration once, with `migrate()` or from `PostgresStore.schema` in your own migration
 * tool.
 */
export class PostgresStore {
  #pool;
  /** Attempt → the handler's open transaction, waiting for its completion. An attempt that
   * took over has a transaction of its own. */
  #open = new Map();
  #timeout;
  #seal;
  /** Storage key → its last write on a pool connection that Postgres has not answered yet
   * (settled either way when it does). */
  #unanswered = new Map();

  /**
   * @param pool a pg `Pool`
   * @param options `{ timeout, seal }`: how long one call may take in milliseconds (default
   * idem-core's, 2000): a call Postgres does not answer by then fails, and the request is
   * answered 503; a transaction's connection whose call ran out of time is discarded, never
   * given back to the pool. And `{ keys: [{ id, key }, …] }` to seal every record written
   * with the first key (AES-256-GCM) and open records sealed with any (IDEM-SEAL-1,
   * IDEM-SEAL-2)
   */
  constructor(pool, { timeout, seal } = {}) {
    if (pool == null || typeof pool.query !== "function" || typeof pool.connect !== "function") {
      throw rangeError("IDEM-JS-1", "PostgresStore needs a pg Pool (new pg.Pool({ connectionString }))");
    }
    this.#pool = pool;
    this.#timeout = milliseconds(timeout, storeTimeoutMs(), "options.timeout");
    this.#seal = recordSealer(seal);
  }

  /** One statement on `db` (the pool, or a transaction's client), bounded in time. */
  #query(db, statement) {
    if (db === this.#pool) return this.#pooled(statement);
    return bounded(db.query(statement), this.#timeout, "Postgres");
  }

  /** One statement on a client of the pool, the wait for the client included in the store's
   * timeout (IDEM-STORE-10). Not `pool.query`, which sends a statement whenever a connection
   * frees up: a claim whose caller gave up (and answered 503, nothing run) would then hold
   * its key for nobody until its lease ends. The client goes back once Postgres answers,
   * whether or not its caller still waits. */
  async #pooled(statement, deadline = Date.now() + this.#timeout, key = undefined) {
    const client = await this.#checkout(deadline);
    const running = client.query(statement);
    const answered = running.then(
      () => giveBack(client),
      (err) => giveBack(client, err),
    );
    if (key !== undefined) {
      this.#unanswered.set(key, answered);
      answered.then(() => {
        if (this.#unanswered.get(key) === answered) this.#unanswered.delete(key);
      });
    }
    return bounded(running, Math.max(deadline - Date.now(), 1), "Postgres");
  }

  /** A write of `key` on a client of the pool, sent once Postgres has answered the store's
   * previous write of that key, all within the store's timeout: statements on other
   * connections run in no set order, and a claim whose call ran out of time may still be
   * written after it; the write that withdraws it (IDEM-STORE-12) then comes after it. A
   * delete whose wait runs out (Postgres paused, or a lock held, past both calls' time)
   * fails on time, and is still sent once that write is answered, the key's later writes
   * queued behind it: a claim written that late is withdrawn all the same, not held for
   * nobody until its lease ends. (It deletes on condition, so it never takes a later
   * claim's record.) */
  async #pooledWrite(key, statement, isDelete) {
    const deadline = Date.now() + this.#timeout;
    const before = this.#unanswered.get(key);
    if (before !== undefined) {
      try {
        await bounded(before, Math.max(deadline - Date.now(), 1), "Postgres");
      } catch (err) {
        if (isDelete) {
          const late = before.then(() => this.#pooled(statement)).then(ignore, ignore);
          this.#unanswered.set(key, late);
          late.then(() => {
            if (this.#unanswered.get(key) === late) this.#unanswered.delete(key);
          });
        }
        throw err;
      }
    }
    return this.#pooled(statement, deadline, key);
  }

  /** A client of the pool, watched (`unwatched`) from the moment the pool hands it over, or
   * a rejection (IDEM-STORE-4) once the store's timeout passes without one: a client that
   * comes later goes straight back, unused. */
  #checkout(deadline = Date.now() + this.#timeout) {
    return new Promise((resolve, reject) => {
      let waiting = true;
      const timer = setTimeout(
        () => {
          waiting = false;
          reject(timedOut("Postgres", this.#timeout));
        },
        Math.max(deadline - Date.now(), 1),
      );
      // The callback form: pg-pool calls it in the same tick as it drops its own error
      // listener from the client, often while pg is still reading the reply that freed the
      // connection. A FATAL in that same read (a terminated backend) is emitted before any
      // promise continuation runs, and with no listener it would end the process.
      this.#pool.connect((err, client) => {
        client?.on?.("error", unwatched);
        if (!waiting) {
          // Back in a later turn: pg-pool hands a released client to its next waiter at
          // once, and after a stall the waiters are many callers that gave up, each of
          // which would give it back within the last one's call, deeper and deeper (past
          // about a thousand, beyond the stack).
          if (client) queueMicrotask(() => giveBack(client));
          return;
        }
        waiting = false;
        clearTimeout(timer);
        if (client) resolve(client);
        else reject(err);
      });
    });
  }

  /** The migration: the table and its deadline index (safe to run again). */
  static get schema() {
    return Q.schema;
  }

  /** Runs the migration. */
  async migrate() {
    await this.#pool.query(Q.schema);
  }

  async load(key) {
    const { rows } = await this.#query(this.#pool, { name: "idem_load", text: Q.load, values: [key] });
    if (rows.length === 0) return null;
    const stored = rows[0].value;
    const value = new Uint8Array(stored.buffer, stored.byteOffset, stored.byteLength);
    return { version: rows[0].version, value: this.#seal === null ? value : await this.#seal.open(key, value) };
  }

  async apply(key, write, _now, info) {
    const attempt = info?.outcome === undefined ? undefined : attemptOf(key, info.attempt);
    const open = attempt === undefined ? undefined : this.#open.get(attempt);
    if (open !== undefined) {
      this.#open.delete(attempt);
      // A transaction still running when its request answered is not part of the answer:
      // it rolls back when it is done.
      if (open.ready) return this.#complete(open, attempt, key, write, info.outcome);
    }
    return this.#write(this.#pool, key, write);
  }

  /** The attempt's request is over: a transaction it handed over that no stored response
   * committed is rolled back, and its connection goes back to the pool (IDEM-STORE-7).
   * Resolves to whether there was one: the handler's writes, never committed. */
  async end(key, attempt) {
    const id = attemptOf(key, attempt);
    const open = this.#open.get(id);
    if (open === undefined) return false;
    this.#open.delete(id);
    if (!open.ready) return false;
    // A ROLLBACK that fails discards the connection, which rolls back all the same.
    await this.#close(open.client, "ROLLBACK").catch(() => {});
    return true;
  }

  /** Ends a transaction with `statement`, then gives its connection back, or (when that
   * failed, its state unknown) discards it. */
  async #close(client, statement) {
    try {
      await this.#query(client, statement);
    } catch (err) {
      giveBack(client, err);
      throw err;
    }
    giveBack(client);
  }

  /** The compare-and-set, on `db` (the pool, or a transaction's client). */
  async #write(db, key, write) {
    let done;
    const value = write.value === null || this.#seal === null ? write.value : await this.#seal.seal(key, write.value);
    const query = (statement) => (db === this.#pool ? this.#pooledWrite(key, statement, write.value === null) : this.#query(db, statement));
    if (write.value === null) {
      done = await query({ name: "idem_delete", text: Q.delete, values: [key, write.expect] });
    } else if (write.expect === null) {
      done = await query({
        name: "idem_insert",
        text: Q.insert,
        values: [key, write.version, bytes(value), Math.ceil(write.deadline), Math.ceil(write.expires)],
      });
    } else {
      done = await query({
        name: "idem_update",
        text: Q.update,
        values: [key, write.expect, write.version, bytes(value), Math.ceil(write.deadline), Math.ceil(write.expires)],
      });
    }
    return done.rowCount === 1;
  }

  /** A handler's completion with its transaction open: an answer whose response is stored
   * (`write.storesResponse`, the engine's word) commits with the handler's rows. Anything
   * else rolls the handler's rows back and is written alone: a handler that threw, a release
   * (such as a 5xx left for a retry), an outcome held as unknown (IDEM-STORE-7). A stored
   * response whose write loses its race leaves the transaction open for this attempt: its
   * next completion (made from the record as it then reads, after a write of its own whose
   * answer was lost) commits it, and the end of the attempt rolls it back. A response is
   * never stored without the rows it describes. */
  async #complete(open, attempt, key, write, outcome) {
    const { client } = open;
    if (!(write.storesResponse && outcome === "answered")) {
      // A ROLLBACK that fails (a dead connection) discards the connection, which rolls back
      // all the same; the key's own write still follows, or the key would stay held until its
      // lease ends.
      await this.#close(client, "ROLLBACK").catch(() => {});
      return this.#write(this.#pool, key, write);
    }
    let applied;
    try {
      applied = await this.#write(client, key, write);
    } catch (err) {
      // A connection that failed mid-transaction is not given back to the pool.
      giveBack(client, err);
      throw uncommitted(err);
    }
    if (!applied) {
      this.#open.set(attempt, open);
      return false;
    }
    try {
      await this.#close(client, "COMMIT");
    } catch (err) {
      throw uncommitted(err);
    }
    return true;
  }

  /**
   * Runs `fn(client)` in a transaction on a client of the pool, and commits it with the
   * completion of the request whose idempotency context is `context` (`idempotencyOf(request)`,
   * or the context `Idempotency#handle` passes): the handler's rows and the stored response
   * commit together, or neither does. If the lease was lost meanwhile (another attempt took
   * over), nothing the handler wrote commits. If `fn` throws, or the response is not kept,
   * it is rolled back. Resolves to what `fn` returned.
   */
  async transaction(context, fn) {
    const attempt = attemptOfContext(context);
    if (this.#open.has(attempt)) throw rangeError("IDEM-JS-1", "this request already has a transaction open");
    // The attempt's place is taken before anything is awaited, so that a second call of the
    // same request is refused instead of leaking a connection; it is handed over (`ready`)
    // once `fn` is done.
    const open = { client: null, ready: false };
    this.#open.set(attempt, open);
    try {
      // Both bounded as every call is (IDEM-STORE-10): a pool with no connection to spare,
      // or a server that does not answer, is a store failure, not a wait without end. Held
      // outside the pool, the client is this store's to watch from its checkout on: a
      // connection that dies meanwhile (a restart, a terminated backend, an
      // idle-in-transaction timeout) fails the statements that follow.
      open.client = await this.#checkout();
      await this.#query(open.client, "BEGIN");
      const result = await fn(open.client);
      // The request's completion or end came while `fn` ran: nothing of it commits.
      if (this.#open.get(attempt) !== open) throw rangeError("IDEM-LEASE-3", "the request was over before its transaction was done");
      open.ready = true;
      return result;
    } catch (err) {
      if (this.#open.get(attempt) === open) this.#open.delete(attempt);
      if (open.client !== null) await this.#close(open.client, "ROLLBACK").catch(() => {});
      throw err;
    }
  }

  /**
   * Expires what is due at `now`, at most `limit` records through the deadline index:
   * completed records whose response has expired become tombstones (410 for a retry), and
   * records whose key (and any live lease) has ended are deleted. Resolves to how many
   * changed. Run it every minute or so: until then, the engine reads expiry from each
   * record anyway, so a late sweep costs space, never correctness.
   */
  async sweep(now = Date.now(), limit = 1000) {
    // Bounded as every call of the store is (IDEM-STORE-10): a sweep never waits without end.
    const { rows } = await this.#query(this.#pool, { name: "idem_due", text: Q.due, values: [Math.floor(now), limit] });
    let changed = 0;
    for (const row of rows) {
      let write;
      try {
        const value = await openedRecord(this.#seal, row.key, new Uint8Array(row.value.buffer, row.value.byteOffset, row.value.byteLength));
        write = expire(now, value);
      } catch (err) {
        // Sealed with a key this store does not hold (IDEM-SEAL-3), or bytes that are not a
        // record this version reads (IDEM-REC-1: damaged, or a newer writer's format):
        // idem-core's rule for a record it cannot open. Thrown, one such record would stop the
        // expiry of every record due after it, at every sweep.
        if (err?.code !== "IDEM-SEAL-3" && err?.code !== "IDEM-REC-1") throw err;
        const due = unopenedDue(now, Number(row.expires));
        if (due === undefined) {
          if (await this.#write(this.#pool, row.key, { value: null, expect: row.version })) changed++;
        } else {
          await this.#query(this.#pool, { name: "idem_defer", text: Q.defer, values: [row.key, row.version, due] });
        }
        continue;
      }
      if (write === undefined) continue;
      write.expect = row.version;
      if (await this.#write(this.#pool, row.key, write)) changed++;
    }
    return changed;
  }
}
