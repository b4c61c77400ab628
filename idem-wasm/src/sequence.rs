//! The client's counter numbering: the operations of [`call`](crate::call) on idem-core's
//! `CounterSequence`, for counter keys. JavaScript holds a numbering as its persisted bytes;
//! numbers cross as decimal text: they may not fit a JavaScript number.

use crate::interop::{self, Answer, Args, ClientOp, ErrorParts};
use idem_core::CounterSequence;

/// Runs a counter operation ([`ClientOp::CounterNew`] to [`ClientOp::CounterLowWater`]).
pub(crate) fn run(op: ClientOp, a: &mut Args<'_>, out: &mut Answer) -> Result<(), ErrorParts> {
    if op == ClientOp::CounterNew {
        // `client` in session `epoch`, `bits` wide, from `firstSeq` (`IDEM-CTR-1`).
        let client = a.text()?;
        let epoch = interop::decimal("epoch", a.text()?)?;
        let bits = a.number()? as u8;
        let first = interop::decimal("firstSeq", a.text()?)?;
        let s = CounterSequence::new(client, epoch, bits, first)
            .map_err(|e| interop::sequence_error(&e))?;
        numbering(out, &s);
        return Ok(());
    }
    let mut s = CounterSequence::from_bytes(a.bytes()?)
        .ok_or_else(|| ErrorParts::range(interop::CODE_WIRE, "malformed counter sequence"))?;
    match op {
        ClientOp::CounterTake => {
            let seq = s.take().ok_or_else(|| {
                ErrorParts::range(
                    "IDEM-CTR-11",
                    "every counter number is in use: the oldest open request must be answered or reconciled first",
                )
            })?;
            out.bytes(&s.to_bytes()).text(&s.key(seq));
        }
        ClientOp::CounterDone => {
            s.done(interop::decimal("seq", a.text()?)?);
            out.bytes(&s.to_bytes());
        }
        ClientOp::CounterLowWater => {
            out.text(&interop::decimal_text(s.low_water()))
                .number(s.open().len() as f64);
        }
        _ => numbering(out, &s),
    }
    Ok(())
}

/// A numbering as JavaScript holds it: its bytes and its session epoch.
fn numbering(out: &mut Answer, s: &CounterSequence) {
    out.bytes(&s.to_bytes())
        .text(&interop::decimal_text(s.epoch()));
}
