//! Key parsing never panics, and what it accepts obeys the key rules.
#![no_main]
use idem_core::{parse_opaque_lenient, parse_opaque_strict, parse_uuid, MAX_KEY_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let strict = parse_opaque_strict(data);
    let lenient = parse_opaque_lenient(data);
    for key in [&strict, &lenient].into_iter().flatten() {
        assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
        assert!(key.bytes().all(|b| (0x20..=0x7e).contains(&b)));
        let _ = parse_uuid(key, None);
    }
    // Whatever strict mode accepts, lenient mode accepts identically.
    if let Ok(k) = &strict {
        assert_eq!(lenient.as_ref(), Ok(k));
    }
});
