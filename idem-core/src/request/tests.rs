//! Unit tests of the request machine.
use super::Events;
use crate::Event;

#[test]
fn events_keep_the_latest_when_nobody_reads_them() {
    let mut e = Events::default();
    for ev in [
        Event::Executed,
        Event::Extended,
        Event::Extended,
        Event::Completed,
        Event::Replayed,
    ] {
        e.push(ev);
    }
    let drained: std::vec::Vec<Event> = core::iter::from_fn(|| e.pop()).collect();
    assert_eq!(
        drained,
        [
            Event::Extended,
            Event::Extended,
            Event::Completed,
            Event::Replayed
        ]
    );
    assert_eq!(e.pop(), None);
}
