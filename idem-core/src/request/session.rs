//! Opening a client's counter session (`IDEM-CTR-3`, `IDEM-CTR-5`) as an operation of the
//! machine: read the session record, write it open (or at its next epoch) with a
//! compare-and-set, and read again after a lost race.

use super::*;
use crate::counter::CounterError;

/// Where an opening stands.
#[derive(Debug)]
pub(super) struct Opening {
    scope: Scope,
    client: String,
    first_seq: u64,
    /// The epoch the write handed out opens.
    epoch: Option<u64>,
    /// Whether the read is handed out.
    reading: bool,
    rounds: usize,
}

impl Opening {
    /// The next step: the read, unless it (or the write) is out.
    pub(super) fn poll(&mut self) -> Step {
        if self.epoch.is_none() && !self.reading {
            self.reading = true;
            return Step::Load;
        }
        Step::Idle
    }
}

impl Policy {
    /// The machine that opens the counter session of `client` for `target`'s requests, its
    /// first number `first_seq`, or moves a live session to its next epoch (the old epoch's
    /// requests are refused from then on: `IDEM-CTR-3`, `IDEM-CTR-5`). `nonce` is random: a
    /// new session's epoch. It answers 201 with the session as JSON, `{"client", "epoch",
    /// "firstSeq"}`, the numbers as decimal text (they may not fit a JavaScript number).
    /// Refused at once with the core's problems: an empty principal (`IDEM-SCOPE-3`), a bad
    /// client id or first number (400 `malformed-key`, `IDEM-CTR-1`); a session that keeps
    /// changing under the opening is 409 with `Retry-After`. A policy whose keys are not
    /// counters answers 500: the host routed the endpoint to the wrong policy.
    pub fn open_session(
        &self,
        target: &Target<'_>,
        client: &str,
        first_seq: u64,
        nonce: u64,
    ) -> Request {
        let Rules::Counter(counters) = &self.rules else {
            return Request::answered(Reply::plain(
                Plain::Internal,
                "this endpoint's keys are not counters",
            ));
        };
        let scope = match self.scope(target.principal, target.method, target.route) {
            Ok(scope) => scope,
            Err(refusal) => return Request::refused(refusal),
        };
        let key = counters.session_key(&scope, client);
        let mut req = Request::with_rules(
            self.rules.clone(),
            key,
            Fingerprint::from_digest([0; 32]),
            Subject::Record,
            nonce,
        );
        req.operation = Operation::OpenSession;
        req.state = State::Opening(Box::new(Opening {
            scope,
            client: String::from(client),
            first_seq,
            epoch: None,
            reading: false,
            rounds: 0,
        }));
        req
    }

    /// [`Policy::open_session`] from the body of a session endpoint: `{"client": "…",
    /// "firstSeq": n}`, `firstSeq` a whole number or its decimal text, 0 when absent. A body
    /// that is not such an object is refused at once: 400 `about:blank`, or 400
    /// `malformed-key` (`IDEM-CTR-1`) for a first number that is not one.
    pub fn open_session_from(&self, target: &Target<'_>, body: &[u8], nonce: u64) -> Request {
        use crate::canon::{string_at, Found};
        let bad = || {
            Request::answered(Reply::plain(
                Plain::BadRequest,
                "send {\"client\": \"…\", \"firstSeq\": n}",
            ))
        };
        let Ok(Found::String(client)) = string_at(body, "/client") else {
            return bad();
        };
        let first_seq = match string_at(body, "/firstSeq") {
            Ok(Found::Missing) => Some(0),
            Ok(Found::Number(n) | Found::String(n)) => parse_decimal(&n, "firstSeq").ok(),
            Ok(Found::NotString | Found::Bool(_)) => None,
            Err(_) => return bad(),
        };
        match first_seq {
            Some(first_seq) => self.open_session(target, &client, first_seq, nonce),
            None => Request::refused(Refusal {
                requirement: "IDEM-CTR-1",
                ..Refusal::new(
                    Problem::MALFORMED_KEY,
                    "firstSeq must be a whole number, or its decimal text",
                )
            }),
        }
    }
}

impl Request {
    /// The session as read: write it open on top.
    pub(super) fn opening_read(&mut self, now: UnixMillis, record: Option<&Record>) {
        let (Rules::Counter(counters), State::Opening(o)) = (&self.rules, &mut self.state) else {
            return;
        };
        if !o.reading {
            return;
        }
        o.reading = false;
        match counters.open(now, &o.scope, &o.client, o.first_seq, record, self.nonce) {
            Ok(opened) => {
                o.epoch = Some(opened.epoch);
                self.write = Some(opened.write);
            }
            Err(e) => self.state = State::Answered(Answer::Refusal(Refusal::session(&e))),
        }
    }

    /// Whether the opening write was applied: the session, or another round.
    pub(super) fn opening_applied(&mut self, applied: Applied) {
        let State::Opening(o) = &mut self.state else {
            return;
        };
        let Some(epoch) = o.epoch.take() else {
            return;
        };
        if applied == Applied::Applied {
            let reply = session_document(&o.client, epoch, o.first_seq);
            self.state = State::Answered(Answer::Reply(reply));
            return;
        }
        // Another opening or a request of the client wrote the session first.
        o.rounds += 1;
        if o.rounds >= MAX_COMPLETION_ROUNDS {
            let refusal = Refusal::session(&CounterError::Contended);
            self.state = State::Answered(Answer::Refusal(refusal));
        }
    }
}

/// `{"client": …, "epoch": "…", "firstSeq": "…"}`, 201.
fn session_document(client: &str, epoch: u64, first_seq: u64) -> Reply {
    use crate::canon::{write_str, Decimal};
    let mut body = Vec::with_capacity(64 + client.len());
    body.extend_from_slice(b"{\"client\":");
    write_str(&mut body, client);
    body.extend_from_slice(b",\"epoch\":");
    write_str(&mut body, Decimal::new(epoch).as_str());
    body.extend_from_slice(b",\"firstSeq\":");
    write_str(&mut body, Decimal::new(first_seq).as_str());
    body.push(b'}');
    Reply::document(201, body)
}
