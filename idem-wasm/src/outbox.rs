//! The client's module has one entry point, [`call`]: an operation number and its arguments
//! as bytes in, its answer as bytes out ([`interop::call`] holds the operations and the
//! format). This file runs the operations on the core's outbox entry, which
//! `idempotentFetch` drives; the counter numbering's are in `sequence.rs`.
//!
//! JavaScript holds an entry as its persisted bytes: each operation reads it, calls the core,
//! and answers the entry's new bytes with what JavaScript reads of it (its *view*). Nothing
//! lives in the module between calls.
//!
//! It stays one file because it has one role, the dispatch of the outbox operations, one
//! short function each; a third of it is their tests against the core's own entries.

use crate::interop::{
    self, Answer, Args, ClientOp, ErrorParts, FetchOutcome, NextKind, OutboxState,
};
#[cfg(feature = "client-full")]
use crate::sequence;
use alloc::vec::Vec;
use idem_core::{KeyStatus, NextStep, OutboxEntry, RetryPolicy};

/// Runs operation `op` ([`ClientOp`]) on `input` (its arguments) and returns its answer: the
/// values the operation answers, or [`Wire::Error`](interop::Wire::Error) with the code and
/// the message of the `RangeError` JavaScript throws.
pub fn call(op: u32, input: &[u8]) -> Vec<u8> {
    let mut args = Args(input);
    let mut answer = Answer::default();
    let ran = match ClientOp::from_number(op) {
        Some(op) => run(op, &mut args, &mut answer),
        None => Err(unknown()),
    };
    match ran.and_then(|()| done(&args)) {
        Ok(()) => answer.0,
        Err(e) => Answer::error(&e),
    }
}

/// An operation this module does not have (`IDEM-JS-2`).
fn unknown() -> ErrorParts {
    ErrorParts::range(interop::CODE_WIRE, "unknown operation")
}

/// Refuses arguments left over: the JavaScript side encoded the call wrong.
fn done(args: &Args<'_>) -> Result<(), ErrorParts> {
    if args.is_empty() {
        Ok(())
    } else {
        Err(interop::malformed())
    }
}

fn run(op: ClientOp, a: &mut Args<'_>, out: &mut Answer) -> Result<(), ErrorParts> {
    match op {
        #[cfg(feature = "client-full")]
        ClientOp::Digest => {
            let (method, url, body) = (a.text()?, a.text()?, a.bytes()?);
            out.bytes(&idem_core::payload_digest(method, url, body));
        }
        ClientOp::PayloadMessage => {
            let (method, url, body) = (a.text()?, a.text()?, a.bytes()?);
            out.bytes(&idem_core::payload_message(method, url, body));
        }
        ClientOp::KeyV4 => {
            out.text(&idem_core::uuid_v4_key(random(a)?));
        }
        ClientOp::KeyV7 => {
            let now = interop::millis(a.number()?);
            let r: [u8; 10] = random(a)?;
            out.text(&idem_core::uuid_v7_key(now, r));
        }
        ClientOp::Create => {
            let (key, digest) = (a.text()?, digest32(a)?);
            policy(a)?;
            let entry = OutboxEntry::new(key, digest).map_err(|e| interop::client_error(&e))?;
            view(out, &entry);
        }
        ClientOp::Restore => {
            // The options are checked first, as for a new entry.
            let bytes = a.bytes()?;
            policy(a)?;
            view(out, &decode(bytes)?);
        }
        ClientOp::NextSend | ClientOp::NextAsk => {
            let (e, now) = (entry(a)?, interop::millis(a.number()?));
            let at = if op == ClientOp::NextSend {
                e.next_send(now)
            } else {
                e.next_ask(now)
            };
            out.opt_number(at.map(interop::to_ms));
        }
        ClientOp::CheckPayload => {
            let e = entry(a)?;
            e.check_payload(&digest32(a)?)
                .map_err(|e| interop::client_error(&e))?;
        }
        ClientOp::Send => {
            let (mut e, now) = (entry(a)?, interop::millis(a.number()?));
            e.send(now, &digest32(a)?)
                .map_err(|e| interop::client_error(&e))?;
            view(out, &e);
        }
        ClientOp::OnResponse | ClientOp::OnNetworkError | ClientOp::OnStatus => {
            let (mut e, policy) = (entry(a)?, policy(a)?);
            let now = interop::millis(a.number()?);
            let random = interop::u64_from_halves(a.number()? as u32, a.number()? as u32);
            let next = match op {
                ClientOp::OnResponse => {
                    let response = response(a)?;
                    e.on_result(&policy, now, random, Ok(&response))
                }
                ClientOp::OnNetworkError => {
                    let lost = if a.flag()? {
                        idem_core::NetworkError::Lost
                    } else {
                        idem_core::NetworkError::NotSent
                    };
                    e.on_result(&policy, now, random, Err(lost))
                }
                _ => {
                    let values = [a.opt_text()?, a.opt_text()?, a.opt_text()?, a.opt_text()?];
                    let found = KeyStatus::from_values(values);
                    let can_resend = a.flag()?;
                    e.on_status(&policy, now, random, found.as_ref(), can_resend)
                }
            }
            .map_err(|e| interop::client_error(&e))?;
            next_step(out, &next);
            view(out, &e);
        }
        ClientOp::MarkProcessed => {
            let mut e = entry(a)?;
            e.mark_processed().map_err(|e| interop::client_error(&e))?;
            view(out, &e);
        }
        ClientOp::StatusField => {
            out.text(&idem_core::StatusQuery::field(a.text()?, true));
        }
        #[cfg(feature = "client-full")]
        ClientOp::CounterNew
        | ClientOp::CounterRestore
        | ClientOp::CounterTake
        | ClientOp::CounterDone
        | ClientOp::CounterLowWater => sequence::run(op, a, out)?,
        ClientOp::Echo => {
            while !a.is_empty() {
                out.value(a.value()?);
            }
        }
        // The full module's own operations (`Digest`, the counter numbering), in the module a
        // browser page loads first: the page loads the full module for them (js/outbox.js,
        // `runFull`).
        #[cfg(not(feature = "client-full"))]
        _ => return Err(unknown()),
    }
    Ok(())
}

/// A response as `OnResponse` passes it: status, `Retry-After` seconds, the problem `type`
/// (if the body was `application/problem+json`), and whether it is a replay
/// (`Idempotent-Replayed: true`).
fn response(a: &mut Args<'_>) -> Result<idem_core::ClientResponse, ErrorParts> {
    let status = a.number()? as u16;
    let retry_after_secs = a
        .opt_number()?
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(|s| s as u64);
    let problem_type = a.opt_text()?;
    let replayed = a.flag()?;
    // An idem problem type says more than the replay's mark: a replayed 410
    // response-not-stored is an answer forgotten.
    let answer = match problem_type.map_or(
        idem_core::KeyAnswer::Unspecified,
        idem_core::KeyAnswer::from_problem_type,
    ) {
        idem_core::KeyAnswer::Unspecified if replayed => idem_core::KeyAnswer::Replayed,
        answer => answer,
    };
    Ok(idem_core::ClientResponse {
        status,
        retry_after_secs,
        answer,
    })
}

/// An entry's bytes, decoded (`IDEM-CLIENT-6` for bytes that are not an entry).
fn entry(a: &mut Args<'_>) -> Result<OutboxEntry, ErrorParts> {
    decode(a.bytes()?)
}

fn decode(bytes: &[u8]) -> Result<OutboxEntry, ErrorParts> {
    idem_core::decode_entry(bytes).map_err(|e| interop::entry_decode_error(&e))
}

/// The retry policy from its four options (`IDEM-JS-1` for a value that is not a whole number
/// in range; the JavaScript side passes any value that is not a number as `NaN`).
fn policy(a: &mut Args<'_>) -> Result<RetryPolicy, ErrorParts> {
    interop::retry_policy(&interop::RetryOptions {
        base: a.opt_number()?,
        cap: a.opt_number()?,
        max_attempts: a.opt_number()?,
        deadline: a.opt_number()?,
    })
}

/// A payload digest: its 32 bytes come from js/outbox.js, so another length is a malformed
/// call (`IDEM-JS-2`).
fn digest32(a: &mut Args<'_>) -> Result<[u8; 32], ErrorParts> {
    a.bytes()?.try_into().map_err(|_| interop::malformed())
}

/// The first `N` bytes of a random value (from js/client.js's `crypto.getRandomValues`;
/// fewer are a malformed call, `IDEM-JS-2`).
fn random<const N: usize>(a: &mut Args<'_>) -> Result<[u8; N], ErrorParts> {
    a.bytes()?
        .get(..N)
        .and_then(|r| r.try_into().ok())
        .ok_or_else(interop::malformed)
}

/// An entry's view: its bytes, key, state, outcome, attempts and last status.
fn view(out: &mut Answer, e: &OutboxEntry) {
    let state = e.state();
    out.bytes(&idem_core::encode_entry(e))
        .text(e.key())
        .number(f64::from(OutboxState::of(&state) as u8))
        .opt_number(FetchOutcome::of_state(&state).map(|o| f64::from(o as u8)))
        .number(f64::from(e.attempts()))
        .opt_number(e.last_status().map(f64::from));
}

/// A next step: its kind, outcome, stored status and give-up reason.
fn next_step(out: &mut Answer, next: &NextStep) {
    let (status, reason) = match *next {
        NextStep::Executed { status } => (status, None),
        NextStep::Failed { reason } | NextStep::Undetermined { reason } => {
            (None, Some(interop::give_up_name(reason)))
        }
        _ => (None, None),
    };
    out.number(f64::from(NextKind::of(next) as u8))
        .opt_number(FetchOutcome::of_next(next).map(|o| f64::from(o as u8)))
        .opt_number(status.map(f64::from))
        .opt_text(reason);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interop::Value;

    /// Calls `op` with `args` and reads the answer back.
    fn call_with(op: ClientOp, args: &[Value<'_>]) -> Vec<u8> {
        let mut input = Answer::default();
        for v in args {
            input.value(*v);
        }
        call(op as u32, &input.0)
    }

    fn values(answer: &[u8]) -> Vec<Value<'_>> {
        let mut r = Args(answer);
        let mut out = Vec::new();
        while !r.is_empty() {
            out.push(r.value().unwrap());
        }
        out
    }

    fn error_code(answer: &[u8]) -> &str {
        assert_eq!(answer[0], interop::Wire::Error as u8);
        match values(&answer[1..])[0] {
            Value::Text(code) => code,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_entry_is_created_sent_answered_and_processed_through_its_bytes() {
        let digest = call_with(
            ClientOp::Digest,
            &[Value::Text("POST"), Value::Text("/o"), Value::Bytes(b"{}")],
        );
        let Value::Bytes(digest) = values(&digest)[0] else {
            panic!()
        };
        let absent = [Value::Absent; 4];
        let mut args = alloc::vec![Value::Text("k1"), Value::Bytes(digest)];
        args.extend(absent);
        let created = call_with(ClientOp::Create, &args);
        let v = values(&created);
        assert_eq!(v[1], Value::Text("k1"));
        assert_eq!(v[2], Value::Number(OutboxState::Created as u8 as f64));
        assert_eq!(
            (v[3], v[4], v[5]),
            (Value::Absent, Value::Number(0.0), Value::Absent)
        );
        let Value::Bytes(entry) = v[0] else { panic!() };
        let sent = call_with(
            ClientOp::Send,
            &[
                Value::Bytes(entry),
                Value::Number(1000.0),
                Value::Bytes(digest),
            ],
        );
        let Value::Bytes(entry) = values(&sent)[0] else {
            panic!()
        };
        let mut args = alloc::vec![Value::Bytes(entry)];
        args.extend(absent);
        args.extend([
            Value::Number(1001.0),
            Value::Number(1.0),
            Value::Number(2.0),
            Value::Number(201.0),
            Value::Absent,
            Value::Absent,
            Value::Number(0.0),
        ]);
        let answered = call_with(ClientOp::OnResponse, &args);
        let v = values(&answered);
        assert_eq!(v[0], Value::Number(NextKind::Complete as u8 as f64));
        assert_eq!(v[1], Value::Number(FetchOutcome::Completed as u8 as f64));
        assert_eq!(v[6], Value::Number(OutboxState::Answered as u8 as f64));
        assert_eq!((v[8], v[9]), (Value::Number(1.0), Value::Number(201.0)));
        // A changed payload is refused with the core's requirement.
        let Value::Bytes(entry) = v[4] else { panic!() };
        let other = [7u8; 32];
        let refused = call_with(
            ClientOp::CheckPayload,
            &[Value::Bytes(entry), Value::Bytes(&other)],
        );
        assert_eq!(error_code(&refused), "IDEM-CLIENT-1");
        let processed = call_with(ClientOp::MarkProcessed, &[Value::Bytes(entry)]);
        assert_eq!(
            values(&processed)[2],
            Value::Number(OutboxState::Processed as u8 as f64)
        );
    }

    #[test]
    fn bad_calls_are_refused() {
        assert_eq!(error_code(&call(99, &[])), "IDEM-JS-2");
        // Arguments left over, and arguments missing.
        assert_eq!(
            error_code(&call_with(
                ClientOp::StatusField,
                &[Value::Text("POST"), Value::Absent]
            )),
            "IDEM-JS-2"
        );
        assert_eq!(error_code(&call_with(ClientOp::Digest, &[])), "IDEM-JS-2");
        // Random values and digests of another length than JavaScript draws and hashes.
        let short = call_with(ClientOp::KeyV4, &[Value::Bytes(&[1; 15])]);
        assert_eq!(error_code(&short), "IDEM-JS-2");
        let digest = call_with(
            ClientOp::Create,
            &[
                Value::Text("k"),
                Value::Bytes(&[0; 31]),
                Value::Absent,
                Value::Absent,
                Value::Absent,
                Value::Absent,
            ],
        );
        assert_eq!(error_code(&digest), "IDEM-JS-2");
        let restore = call_with(
            ClientOp::Restore,
            &[
                Value::Bytes(b"xx"),
                Value::Absent,
                Value::Absent,
                Value::Absent,
                Value::Absent,
            ],
        );
        assert_eq!(error_code(&restore), "IDEM-CLIENT-6");
        let bad_policy = call_with(
            ClientOp::Create,
            &[
                Value::Text("k"),
                Value::Bytes(&[0; 32]),
                Value::Number(f64::NAN),
                Value::Absent,
                Value::Absent,
                Value::Absent,
            ],
        );
        assert_eq!(error_code(&bad_policy), "IDEM-JS-1");
    }
}
