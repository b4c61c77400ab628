//! Record decoding never panics; whatever decodes re-encodes to something that decodes equal.
#![no_main]
use idem_core::{decode_record, encode_record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = decode_record(data) {
        let again = decode_record(&encode_record(&record)).expect("re-encoded record decodes");
        assert_eq!(again, record);
    }
});
