//! The deadline index of [`MemoryStore`](crate::MemoryStore): deadlines kept in a few
//! ordered queues, so that for the usual store adding or taking one does not cost more as
//! records accumulate.
//!
//! A store's deadlines arrive in a few streams that each only grow: under one policy, a
//! claim's key expires at its write time plus the key's time-to-live, a response at its
//! write time plus the response's, and a tombstone when its claim's key does (written
//! later, so a stream of its own). Each stream takes a queue, in which a deadline is
//! appended at the back and taken from the front, and the earliest deadline is the earliest
//! of the queues' fronts. A deadline goes into the queue whose last deadline is the latest
//! one not after it (deadlines of the same millisecond share a queue, whatever their order);
//! one earlier than every queue's last opens a queue, up to [`RUNS`] of them, and beyond
//! that waits in a binary heap. So a store with two or three policies pays a push
//! and a pop on a ring buffer, plus a look at each queue's end, per deadline, where one heap
//! over every record walked twenty levels of 16 MiB at a million records. Deadlines that
//! fit no queue, from more streams or in no order, cost what a heap costs.

use crate::time::UnixMillis;
use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;

/// The most queues kept; a deadline that fits none of them goes to the heap.
const RUNS: usize = 8;

/// One deadline: when, and the slot and generation of the record it was set for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Due {
    /// When the record is due.
    pub at: UnixMillis,
    /// The record's slot.
    pub slot: u32,
    /// The slot's generation when the deadline was set.
    pub generation: u32,
}

/// Deadlines, earliest first (see the module's documentation).
#[derive(Default)]
pub(crate) struct Deadlines {
    /// Queues of deadlines, each in order, none empty.
    runs: Vec<VecDeque<Due>>,
    /// Deadlines that came in no queue's order.
    heap: BinaryHeap<Reverse<Due>>,
}

/// Where the earliest deadline is.
#[derive(Clone, Copy)]
enum Front {
    Run(usize),
    Heap,
}

impl Deadlines {
    /// Adds a deadline.
    pub(crate) fn push(&mut self, due: Due) {
        // Only the time orders the queues: deadlines of one millisecond may come in any
        // order of slots (freed slots are reused last first).
        let mut best: Option<(usize, UnixMillis)> = None;
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(last) = run.back().map(|d| d.at) {
                if last <= due.at && best.is_none_or(|(_, b)| last > b) {
                    best = Some((i, last));
                }
            }
        }
        match best {
            Some((i, _)) => self.runs[i].push_back(due),
            None if self.runs.len() < RUNS => self.runs.push(VecDeque::from([due])),
            None => self.heap.push(Reverse(due)),
        }
    }

    fn front_at(&self) -> Option<(Front, Due)> {
        let mut best = self.heap.peek().map(|Reverse(d)| (Front::Heap, *d));
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(&d) = run.front() {
                if best.is_none_or(|(_, b)| d.at < b.at) {
                    best = Some((Front::Run(i), d));
                }
            }
        }
        best
    }

    /// An earliest deadline (of those due at the same time, any).
    pub(crate) fn peek(&self) -> Option<Due> {
        self.front_at().map(|(_, d)| d)
    }

    /// Removes the earliest deadline.
    pub(crate) fn pop(&mut self) -> Option<Due> {
        let (at, due) = self.front_at()?;
        match at {
            Front::Heap => {
                self.heap.pop();
            }
            Front::Run(i) => {
                self.runs[i].pop_front();
                if self.runs[i].is_empty() {
                    self.runs.swap_remove(i);
                }
            }
        }
        Some(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use proptest::prelude::*;

    fn due(at: u64, slot: u32) -> Due {
        Due {
            at: UnixMillis(at),
            slot,
            generation: 0,
        }
    }

    #[test]
    fn streams_get_queues_of_their_own_and_the_rest_a_heap() {
        let mut d = Deadlines::default();
        // Two streams taking turns: two queues, whatever their lengths.
        for i in 0..1_000 {
            d.push(due(10_000 + i, 0));
            d.push(due(500 + i, 1));
        }
        assert_eq!(d.runs.len(), 2);
        assert!(d.heap.is_empty());
        // Many deadlines of one millisecond, their slots falling (freed slots are reused last
        // first): they stay in their stream's queue.
        for slot in (0..100).rev() {
            d.push(due(11_000, slot));
        }
        assert_eq!(d.runs.len(), 2);
        assert!(d.heap.is_empty());
        // Deadlines each earlier than the last: one queue each up to the limit, then the heap.
        for i in 0..20 {
            d.push(due(100 - i, 2));
        }
        assert_eq!(d.runs.len(), RUNS);
        assert_eq!(d.heap.len(), 20 - (RUNS - 2));
        let mut out = Vec::new();
        while let Some(x) = d.pop() {
            out.push(x.at.0);
        }
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(out, sorted);
        assert_eq!(out.len(), 2_120);
        // Emptied queues are gone.
        assert!(d.runs.is_empty() && d.heap.is_empty());
        d.push(due(7, 3));
        assert_eq!(d.peek(), Some(due(7, 3)));
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A deadline `step` after the last of stream `stream` (0 to 2).
        Stream(usize, u64),
        /// A deadline at this time.
        Push(u64),
        /// The earliest taken out.
        Pop,
        /// Nothing: only the front is looked at, as after every step.
        Peek,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Streams that only grow, as a store's are (often by nothing: one millisecond);
            // and deadlines in no order.
            4 => (0usize..3, prop_oneof![Just(0u64), 0u64..50])
                .prop_map(|(s, step)| Op::Stream(s, step)),
            2 => (0u64..5_000).prop_map(Op::Push),
            1 => (0u64..(1 << 40)).prop_map(Op::Push),
            1 => Just(Op::Push(u64::MAX)),
            3 => Just(Op::Pop),
            1 => Just(Op::Peek),
        ]
    }

    proptest! {
        /// Against a multiset: every pop and peek is one of the earliest deadlines left. Slots
        /// and generations repeat, and fall within a millisecond, as a store's do.
        #[test]
        fn the_index_is_an_ordered_multiset(
            ops in proptest::collection::vec((op(), 0u32..6, 0u32..2), 0..300),
        ) {
            let mut d = Deadlines::default();
            let mut model: BTreeMap<Due, usize> = BTreeMap::new();
            let mut streams = [0u64, 1_000, 2_000];
            for (op, slot, generation) in ops {
                let pushed = match op {
                    Op::Stream(s, step) => {
                        streams[s] += step;
                        Some(streams[s])
                    }
                    Op::Push(at) => Some(at),
                    _ => None,
                };
                if let Some(at) = pushed {
                    let due = Due { at: UnixMillis(at), slot, generation };
                    d.push(due);
                    *model.entry(due).or_default() += 1;
                }
                if let Op::Pop = op {
                    let got = d.pop();
                    prop_assert_eq!(got.map(|x| x.at), model.keys().next().map(|x| x.at));
                    if let Some(got) = got {
                        let left = model.get_mut(&got);
                        prop_assert!(left.is_some(), "{:?} was never pushed", got);
                        let left = left.unwrap();
                        *left -= 1;
                        if *left == 0 {
                            model.remove(&got);
                        }
                    }
                }
                let front = d.peek();
                prop_assert_eq!(front.map(|x| x.at), model.keys().next().map(|x| x.at));
                if let Some(front) = front {
                    prop_assert!(model.contains_key(&front));
                }
            }
        }
    }
}
