//! The JSON scanner behind fingerprints never panics, however deep or broken the body, with
//! or without excluded fields; and whitespace around an accepted body changes nothing.
#![no_main]
use idem_core::{FingerprintSpec, JsonMode, RequestParts};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, &[u8])| {
    let (choice, body) = input;
    let exclude: Vec<String> = ["a", "/b/*", "/*/0", "/c/d", "/*"]
        .iter()
        .enumerate()
        .filter(|(i, _)| choice & (1 << i) != 0)
        .map(|(_, p)| (*p).to_owned())
        .collect();
    let spec = FingerprintSpec {
        exclude,
        json: JsonMode::Always,
        max_body: usize::MAX,
        ..FingerprintSpec::default()
    };
    let parts = |body| RequestParts {
        method: "POST",
        target: "/orders",
        content_type: Some("application/json"),
        headers: &[],
        body,
    };
    let Ok(fp) = spec.fingerprint(&parts(body)) else {
        return;
    };
    let mut padded = b" \n\t".to_vec();
    padded.extend_from_slice(body);
    padded.extend_from_slice(b"\r\n ");
    let again = spec
        .fingerprint(&parts(&padded))
        .expect("whitespace around an accepted body is accepted");
    assert_eq!(fp.digest, again.digest);
    assert_eq!(fp.fields, again.fields);
});
