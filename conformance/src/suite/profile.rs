//! How a server is graded: [`Profile`], the level of each requirement and the status codes
//! it is expected to use.

use serde::Serialize;

/// How a server is graded: the level of each requirement, and the status codes (and replay
/// marker) it is expected to use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// `ietf`, `idem`, `stripe`, or the codes as given.
    pub name: String,
    /// Whose levels grade the requirements: a miss of a MUST fails, of a SHOULD is
    /// non-strict, of a MAY is an accepted outcome.
    pub levels: idem_spec::Profile,
    /// Whether requests without a key must be refused.
    pub keys_required: bool,
    /// Status for a missing, empty, oversized or malformed key.
    pub bad_key: u16,
    /// Status for a duplicate of a request still in progress.
    pub conflict: u16,
    /// Status for a key reused with a different payload.
    pub mismatch: u16,
    /// The header (name, value) expected on replays, if any.
    pub replay_marker: Option<(String, String)>,
}

impl Profile {
    /// draft-07's levels and codes (400/409/422), keys required, `Idempotent-Replayed:
    /// true` on replays (a SHOULD of the idem spec).
    pub fn ietf() -> Profile {
        Profile {
            name: "ietf".into(),
            levels: idem_spec::Profile::Ietf,
            keys_required: true,
            bad_key: 400,
            conflict: 409,
            mismatch: 422,
            replay_marker: Some(("idempotent-replayed".into(), "true".into())),
        }
    }

    /// idem's own levels, stricter than the draft (the 255-character limit, visible ASCII,
    /// one key line, `Retry-After`, headers replayed byte for byte, 5xx never replayed),
    /// with the IETF codes.
    pub fn idem() -> Profile {
        Profile {
            name: "idem".into(),
            levels: idem_spec::Profile::Idem,
            ..Profile::ietf()
        }
    }

    /// Stripe's behaviour: keys optional, 400 for bad keys and for a changed payload, 409
    /// while in progress, `Idempotent-Replayed: true` on replays, stored 5xx accepted.
    pub fn stripe() -> Profile {
        Profile {
            name: "stripe".into(),
            levels: idem_spec::Profile::Stripe,
            keys_required: false,
            bad_key: 400,
            conflict: 409,
            mismatch: 400,
            replay_marker: Some(("idempotent-replayed".into(), "true".into())),
        }
    }

    /// `ietf`, `idem`, `stripe`, or three codes `BAD_KEY/CONFLICT/MISMATCH` (for example
    /// `400/409/400`) on top of the IETF profile and its levels.
    pub fn parse(s: &str) -> Result<Profile, String> {
        match s {
            "ietf" => return Ok(Profile::ietf()),
            "idem" => return Ok(Profile::idem()),
            "stripe" => return Ok(Profile::stripe()),
            _ => {}
        }
        let codes: Vec<u16> = s
            .split('/')
            .map(|c| {
                c.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|c| (100..600).contains(c))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| profile_error(s))?;
        let [bad_key, conflict, mismatch] = codes[..] else {
            return Err(profile_error(s));
        };
        Ok(Profile {
            name: s.to_owned(),
            bad_key,
            conflict,
            mismatch,
            ..Profile::ietf()
        })
    }
}

fn profile_error(s: &str) -> String {
    format!("unknown profile {s:?}: use ietf, idem, stripe, or BAD_KEY/CONFLICT/MISMATCH codes such as 400/409/422")
}
