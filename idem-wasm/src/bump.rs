//! The client's allocator: it bumps, and starts over once nothing is allocated.
//!
//! Nothing lives in the client's module between calls (JavaScript holds an outbox entry as
//! its bytes, see [`exports`](crate::exports)): a call's input, its work and its answer are
//! all freed before the next call begins. So the allocator needs no free list: it hands out
//! memory from a cursor, counts the blocks that are live, and moves the cursor back to the
//! start of the heap when that count is zero. A call uses at most the memory its own
//! allocations add up to, and the memory stays at the size of the largest call.
//!
//! The heap is the memory above what the module had when it first allocated (its data and
//! its stack lie below); it grows with `memory.grow`. A call that traps (a bug: the panic
//! handler traps) leaves its blocks counted, and the cursor then never starts over: the
//! memory only grows from there, as a trapped module's state is not to be trusted anyway. The arithmetic is [`place`], tested
//! natively; `unsafe` is only the trait's own contract.
#![allow(unsafe_code)]

/// Where a block of `size` bytes aligned to `align` (a power of two) goes when the free
/// memory begins at `cursor`: its start and its end, or `None` past the address space.
pub fn place(cursor: usize, size: usize, align: usize) -> Option<(usize, usize)> {
    let at = cursor.checked_add(align - 1)? & !(align - 1);
    Some((at, at.checked_add(size)?))
}

#[cfg(target_arch = "wasm32")]
pub use wasm::Bump;

#[cfg(target_arch = "wasm32")]
mod wasm {
    use super::place;
    use core::alloc::{GlobalAlloc, Layout};
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    /// A WebAssembly page: the unit of `memory.grow`.
    const PAGE: usize = 65_536;

    /// The allocator. Its state is atomics only so that it can be a `static` without `unsafe`:
    /// the module has one thread, and each operation reads and writes them in turn.
    pub struct Bump {
        /// Where the heap begins (0 before the first allocation).
        start: AtomicUsize,
        /// Where the free memory begins.
        cursor: AtomicUsize,
        /// How many blocks are allocated and not yet freed.
        live: AtomicUsize,
    }

    impl Bump {
        /// An allocator that has not allocated yet.
        pub const fn new() -> Self {
            Bump {
                start: AtomicUsize::new(0),
                cursor: AtomicUsize::new(0),
                live: AtomicUsize::new(0),
            }
        }
    }

    impl Default for Bump {
        fn default() -> Self {
            Self::new()
        }
    }

    // SAFETY: a block is memory below the memory's size that no live block overlaps: the cursor
    // only moves forward while a block is live, and back to the start only when none is.
    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            use core::arch::wasm32::{memory_grow, memory_size};
            let mut start = self.start.load(Relaxed);
            if start == 0 {
                start = memory_size(0) * PAGE;
                self.start.store(start, Relaxed);
            }
            let cursor = if self.live.load(Relaxed) == 0 {
                start
            } else {
                self.cursor.load(Relaxed)
            };
            let Some((at, end)) = place(cursor, layout.size(), layout.align()) else {
                return core::ptr::null_mut();
            };
            let size = memory_size(0) * PAGE;
            if end > size && memory_grow(0, (end - size).div_ceil(PAGE)) == usize::MAX {
                return core::ptr::null_mut();
            }
            self.cursor.store(end, Relaxed);
            self.live.store(self.live.load(Relaxed) + 1, Relaxed);
            core::ptr::with_exposed_provenance_mut(at)
        }

        unsafe fn dealloc(&self, _: *mut u8, _: Layout) {
            self.live.store(self.live.load(Relaxed) - 1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::place;

    #[test]
    fn blocks_are_aligned_and_never_wrap() {
        assert_eq!(place(0, 10, 1), Some((0, 10)));
        assert_eq!(place(13, 10, 8), Some((16, 26)));
        assert_eq!(place(16, 0, 16), Some((16, 16)));
        assert_eq!(place(usize::MAX - 3, 1, 8), None);
        assert_eq!(place(usize::MAX - 7, 8, 8), None);
        assert_eq!(
            place(usize::MAX - 8, 8, 1),
            Some((usize::MAX - 8, usize::MAX))
        );
    }
}
