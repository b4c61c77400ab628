//! The client's module as JavaScript instantiates it: three exports and the memory, with no
//! imports and no generated glue (`js/client-module.js` is the other end).
//!
//! * `alloc(len) → at`: room for a call's input of `len` bytes, which JavaScript writes at `at`.
//! * `call(op, at, len) → answer`: runs operation `op` ([`ClientOp`](crate::interop::ClientOp))
//!   on the input at `at` (taken back, and freed), and answers where its answer is: a `u32`
//!   byte length, little-endian, then the answer's bytes (the values of
//!   [`interop::call`](crate::interop::call)).
//! * `free(answer, len)`: frees an answer of `len` bytes, its length included, once
//!   JavaScript has copied it.
//!
//! One function with bytes in and bytes out needs nothing of wasm-bindgen's glue, whose
//! loader, memory helpers and text decoding were a third of what a page loaded for the API.
//! On other targets the functions are ordinary ones (their names are not exported, so that
//! they cannot clash with the C library's `free`).
#![allow(unsafe_code)]

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::mem::ManuallyDrop;

/// Room for `len` bytes of input: a vector's buffer of exactly that capacity, which
/// [`call`] takes back.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub extern "C" fn alloc(len: usize) -> *mut u8 {
    // `with_capacity` allocates exactly `len` bytes (documented for `Vec<u8>`).
    ManuallyDrop::new(Vec::<u8>::with_capacity(len)).as_mut_ptr()
}

/// Runs operation `op` on the `len` bytes at `at`, and answers where the length-prefixed
/// answer is.
///
/// # Safety
///
/// `at` is what [`alloc()`] answered for `len`, each returned once, its `len` bytes written.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub unsafe extern "C" fn call(op: u32, at: *mut u8, len: usize) -> *mut u8 {
    // SAFETY: `alloc` made this buffer with capacity `len`, and the caller wrote its bytes.
    let input = unsafe { Vec::from_raw_parts(at, len, len) };
    let answer = crate::outbox::call(op, &input);
    drop(input);
    let mut framed = Vec::with_capacity(4 + answer.len());
    framed.extend_from_slice(&(answer.len() as u32).to_le_bytes());
    framed.extend_from_slice(&answer);
    Box::into_raw(framed.into_boxed_slice()).cast()
}

/// Frees an answer of `len` bytes (its length prefix included).
///
/// # Safety
///
/// `answer` is what [`call`] answered, freed once, and `len` its length prefix plus 4.
#[cfg_attr(target_arch = "wasm32", no_mangle)]
pub unsafe extern "C" fn free(answer: *mut u8, len: usize) {
    // SAFETY: `call` made this boxed slice of `len` bytes.
    drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(answer, len)) });
}
