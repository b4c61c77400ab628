//! Issuing a one-time token (`IDEM-TOKEN-1`) as an operation of the machine: the token's
//! record is written with a compare-and-set before the token is handed out.

use super::*;

/// A token whose write is out.
#[derive(Debug)]
pub(super) struct Issuing {
    token: String,
    expires: UnixMillis,
    /// How long it is valid from when it was issued.
    ttl: u64,
}

impl Policy {
    /// The machine that issues a one-time token for `target`'s requests at `now` from 128
    /// random bits (`IDEM-TOKEN-1`): it stores the token's record, then answers 201 with
    /// `{"expiresAt": ms, "token": "tok_…", "ttl": ms}`, never cached. An empty principal is
    /// refused (`IDEM-SCOPE-3`); a policy whose keys are not tokens answers 500, as for
    /// [`Policy::open_session`].
    pub fn issue_token(&self, target: &Target<'_>, now: UnixMillis, random: [u64; 2]) -> Request {
        let Rules::Token(tokens) = &self.rules else {
            return Request::answered(Reply::plain(
                Plain::Internal,
                "this endpoint's keys are not server-issued tokens",
            ));
        };
        let scope = match self.scope(target.principal, target.method, target.route) {
            Ok(scope) => scope,
            Err(refusal) => return Request::refused(refusal),
        };
        let issued = tokens.issue(now, &scope, random);
        let mut req = Request::with_rules(
            self.rules.clone(),
            issued.write.key.clone(),
            Fingerprint::from_digest([0; 32]),
            Subject::Record,
            random[0],
        );
        req.operation = Operation::IssueToken;
        req.state = State::Issuing(Box::new(Issuing {
            ttl: now.until(issued.expires),
            token: issued.token,
            expires: issued.expires,
        }));
        req.write = Some(issued.write);
        req
    }
}

impl Request {
    /// Whether the token's record was written: the token, or 503. A conflict means a record
    /// under the token already exists, which 128 random bits make a broken random source.
    pub(super) fn issuing_applied(&mut self, applied: Applied) {
        let State::Issuing(i) = &self.state else {
            return;
        };
        self.state = State::Answered(match applied {
            Applied::Applied => Answer::Reply(token_document(&i.token, i.expires, i.ttl)),
            Applied::Conflict => Answer::Refusal(Refusal::store(StoreFailure::Unavailable)),
        });
    }
}

/// `{"expiresAt": ms, "token": "tok_…", "ttl": ms}`, 201.
fn token_document(token: &str, expires: UnixMillis, ttl: u64) -> Reply {
    use crate::canon::{write_int, write_str};
    let mut body = Vec::with_capacity(128);
    body.extend_from_slice(b"{\"expiresAt\":");
    write_int(&mut body, expires.0, false);
    body.extend_from_slice(b",\"token\":");
    write_str(&mut body, token);
    body.extend_from_slice(b",\"ttl\":");
    write_int(&mut body, ttl, false);
    body.push(b'}');
    Reply::document(201, body)
}
