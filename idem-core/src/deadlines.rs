//! The deadline index of [`MemoryStore`](crate::MemoryStore): deadlines kept in a few
//! ordered queues, so that adding or taking one does not cost more as records accumulate.
//!
//! A store's deadlines arrive in a few streams that each only grow: every new record's
//! deadline is its write time plus a time-to-live, the same for the records of one policy,
//! and so is every tombstone's. Each stream gets a queue of its own, in which a deadline is
//! appended at the back and taken from the front, and the earliest deadline is the earliest
//! of the queues' fronts. A deadline goes into the queue whose last deadline is the latest
//! one not after it; one earlier than every queue's last opens a queue, up to [`RUNS`]
//! of them, and beyond that waits in a binary heap. So the usual store pays a push and a
//! pop on a ring buffer per deadline, where one heap over every record walks twenty levels
//! of 16 MiB at a million records; deadlines in no order at all cost what a heap costs.

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
        let mut best: Option<(usize, Due)> = None;
        for (i, run) in self.runs.iter().enumerate() {
            if let Some(&last) = run.back() {
                if last <= due && best.is_none_or(|(_, b)| last > b) {
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
                if best.is_none_or(|(_, b)| d < b) {
                    best = Some((Front::Run(i), d));
                }
            }
        }
        best
    }

    /// The earliest deadline.
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
    use alloc::collections::BTreeSet;
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
        assert_eq!(out.len(), 2_020);
        // Emptied queues are gone.
        assert!(d.runs.is_empty() && d.heap.is_empty());
        d.push(due(7, 3));
        assert_eq!(d.peek(), Some(due(7, 3)));
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A deadline `step` after the last of stream `stream` (0 to 2).
        Stream(usize, u64),
        Push(u64),
        Pop,
        Peek,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Streams that only grow, as a store's are; and deadlines in no order.
            4 => (0usize..3, 0u64..50).prop_map(|(s, step)| Op::Stream(s, step)),
            2 => (0u64..5_000).prop_map(Op::Push),
            1 => (0u64..(1 << 40)).prop_map(Op::Push),
            1 => Just(Op::Push(u64::MAX)),
            3 => Just(Op::Pop),
            1 => Just(Op::Peek),
        ]
    }

    proptest! {
        /// Against an ordered set: every pop and peek is the earliest deadline left.
        #[test]
        fn the_index_is_an_ordered_set(ops in proptest::collection::vec(op(), 0..300)) {
            let mut d = Deadlines::default();
            let mut model = BTreeSet::new();
            let mut streams = [0u64, 1_000, 2_000];
            for (i, op) in ops.into_iter().enumerate() {
                let pushed = match op {
                    Op::Stream(s, step) => {
                        streams[s] += step;
                        Some(streams[s])
                    }
                    Op::Push(at) => Some(at),
                    _ => None,
                };
                if let Some(at) = pushed {
                    d.push(due(at, i as u32));
                    model.insert((at, i as u32));
                }
                match op {
                    Op::Stream(..) | Op::Push(_) => {}
                    Op::Pop => {
                        let want = model.pop_first();
                        prop_assert_eq!(d.pop().map(|x| (x.at.0, x.slot)), want);
                    }
                    Op::Peek => {
                        let want = model.first().copied();
                        prop_assert_eq!(d.peek().map(|x| (x.at.0, x.slot)), want);
                    }
                }
                prop_assert_eq!(d.peek().map(|x| (x.at.0, x.slot)), model.first().copied());
            }
        }
    }
}
