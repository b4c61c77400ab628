//! The module's memory grows in large steps.
//!
//! The allocator asks for memory in 64 KiB pages, as little as each allocation needs, and
//! V8 (Node, Deno, Workers) runs a garbage collection of the JavaScript heap each time a
//! WebAssembly memory grows: a MemoryStore that gains a record every request grew the memory
//! every few hundred requests, and the collections came to a fifth of the time of a fresh
//! request at 200,000 records (`node bench/growing.mjs`). So when the memory has grown, the
//! module takes an eighth of its size more at once, by allocating a block of that size and
//! freeing it again: the allocator keeps the freed block (its memory is never given back)
//! and serves the next allocations from it. The number of growths becomes logarithmic in
//! the memory's size, for at most an eighth of it unused.

use core::sync::atomic::{AtomicUsize, Ordering};

/// The smallest step, in bytes.
const MIN_STEP: usize = 1 << 20;

/// The memory's size in bytes when it was last looked at.
static SEEN: AtomicUsize = AtomicUsize::new(0);

/// The memory's size in bytes.
fn size() -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::memory_size(0) * 65_536
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}

/// Called after work that may have grown the memory (each write to the in-module store, by
/// `Records::write`): if it grew since the last call, reserves the next step.
pub fn keep() {
    let now = size();
    if now == SEEN.load(Ordering::Relaxed) {
        return;
    }
    let block: alloc::vec::Vec<u8> = alloc::vec::Vec::with_capacity((now / 8).max(MIN_STEP));
    // The block must really be allocated, not optimised away with its free.
    core::hint::black_box(block.as_ptr());
    drop(block);
    SEEN.store(size(), Ordering::Relaxed);
}
