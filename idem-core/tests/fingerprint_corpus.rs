//! Recorded fingerprints (IDEM-FP-3): the digests a running service stored must keep
//! matching, whatever parses the body. Each body's fingerprint, with its exclusions, was
//! recorded once; a change to the canonical form shows up here as a changed digest.

use idem_core::{FingerprintSpec, RequestParts};

/// (body, excluded pointers).
const CORPUS: &[(&str, &[&str])] = &[
    (r#"{"amount":4200,"currency":"eur"}"#, &[]),
    (r#"{ "currency" : "eur" , "amount" : 4200 }"#, &[]),
    ("\t\r\n{\"b\":[1,2,{\"z\":null,\"a\":true}],\"a\":false}\n", &[]),
    (r#"{"a":1,"a":2,"b":{"x":1,"x":[3]}}"#, &[]),
    (r#"{"name":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t \u0001 \u001f \u007f","é":"ü"}"#, &[]),
    (r#"{"\u0061":1,"a\u0000b":2,"\"":3,"\\":4,"~":5,"":6}"#, &[]),
    (r#"["z","a",["b"],{}, [], "" ]"#, &[]),
    (r#""just a string""#, &[]),
    ("true", &[]),
    ("null", &[]),
    (" 42 ", &[]),
    ("-0", &[]),
    ("[0,-0,1,-1,18446744073709551615,18446744073709551616,-9223372036854775808,-9223372036854775809]", &[]),
    ("[1.0,1.5,-2.25,0.1,0.2,0.30000000000000004,1e3,1E3,1e+3,1e-3,2.5e-7,123.456e2]", &[]),
    ("[1e20,1e21,1e22,1e23,9007199254740992,9007199254740993,9007199254740991.0,4503599627370496.5]", &[]),
    ("[1e300,1.7976931348623157e308,5e-324,2.2250738585072014e-308,1e-400,0e999999999999,1e-999999999999]", &[]),
    ("[3.141592653589793238462643383279,0.000000000000000000000000000001234567890123456789012345,123456789012345678901234567890.5]", &[]),
    ("[12345678901234567890123,1234567890123456789.25e-5,0.1e1,100e-2,-0.0,-1.25e-10]", &[]),
    ("[9.999999999999999e22,1.0000000000000001e23,7.2057594037927933e16,2.4703282292062328e-324]", &[]),
    (r#"{"id":"ord_1","ts":"2026-11-23T10:00:00Z","items":[{"sku":"a","n":1,"at":5},{"sku":"b","n":2,"at":6}]}"#, &["ts"]),
    (r#"{"id":"ord_1","ts":"2026-11-23T10:00:00Z","items":[{"sku":"a","n":1,"at":5},{"sku":"b","n":2,"at":6}]}"#, &["/items/*/at"]),
    (r#"{"id":"ord_1","meta":{"trace":"x","keep":1},"items":[{"at":5},{"at":6}]}"#, &["/meta/trace", "/items/1"]),
    (r#"{"a/b":1,"m~n":2,"c":3}"#, &["/a~1b", "/m~0n"]),
    (r#"{"a":1,"b":2}"#, &["/*"]),
    (r#"{"deep":[[[[[[[[[[{"k":[1,{"v":"w"}]}]]]]]]]]]]}"#, &[]),
    (r#"{"nested":{"z":{"y":{"x":[{"b":1,"a":2}]}}},"arr":[{"d":4,"c":3}]}"#, &["/nested/z/y/x/0/a"]),
];

/// What each body of [`CORPUS`] fingerprinted to when it was recorded: the digest, then
/// each top-level member's digest (XXH3-64; diagnostic only, IDEM-FP-4).
const RECORDED: &[&str] = &[
    r#"8cd9534c1079838755643d12e297d455f718c6a24b30579e0a8e933dae84fc24 "amount"=24e20a6fc2de5149 "currency"=340df0f4268c51d4"#,
    r#"8cd9534c1079838755643d12e297d455f718c6a24b30579e0a8e933dae84fc24 "amount"=24e20a6fc2de5149 "currency"=340df0f4268c51d4"#,
    r#"6675ac97aca5ab18062eda98cbf4b50f92537dc2778faa70a4b2826181ad82d3 "a"=43e71bbe0316e682 "b"=70d5e02b686318c8"#,
    r#"133dd3e2ff46afb7d6c0940f078ac60aab6d3b872cec0d94863039d13652ce40 "a"=fb95a7322f5da314 "b"=e1d15d66860734d6"#,
    r#"eceee42cd5f66d0f8c0e8d7ee361b6482ffeaa5e82ee74721f60dd5810b6bc4b "name"=4be1099f649b12e7 "é"=20faa667d932bec7"#,
    r#"4142ff80f89de747ffc631f8faa4dc7584c5ff543630d41cc8022c219ecab6a5 ""=b564a48862bc4a0d "\""=7324dc1e7e9474f0 "\\"=e28911027fcf803f "a"=65cd25028f98f158 "a\0b"=fb95a7322f5da314 "~"=dedb980100c87e72"#,
    r#"e74f140e81998329ba16e81b4ee944ed030eb06e88a36bafff36baf3f84aa6ed"#,
    r#"c5df6e75b414a73c5aad2a45190f98686de25140d2ed9bfdd1a8f3adbaa15bad"#,
    r#"ab393b77e0e9df76d281938bfc7d523419739333dee48aa7202b7288ab2c3208"#,
    r#"9e4061455a8cfba7659ad567c427e674bb723be31631d58ef5ee8f9823539d93"#,
    r#"a16d03b52e9857b3405c25fdff64552aa5328743c396bf48d01b98e136a3ce1b"#,
    r#"007490b8e8add18c991e92d9a6d82cbb56af85d8928507cc274a459e73fff0cb"#,
    r#"73017671fd152fd3768dab341cd8d67397eaeecd2a5209a39afa31786f0d3e62"#,
    r#"837b1e87bb5a3af9b57db6fc91b5287be1723bd9d27ca7e262f8d254b3e1e79e"#,
    r#"2586b01d047899762ac6a7ae3f7ab86e0f0e5a7d2f644a3318a79aa6a46a3b03"#,
    r#"d87976a12e16458b330588ce24a6597c41f470160fa37b787b95483b54fac021"#,
    r#"70a8bb8a743dd2d918538fbe173144f22baa353657006ed190eb7903d4811005"#,
    r#"047d1a0843541f97e587c1b3a4325f02837ed96f42a62ca644bfa7b4a9fa52bb"#,
    r#"e62b0766e8908cc13278c729dd9280777d3fc5bf4ded993fbb5e9ed715941525"#,
    r#"d25d9bc7db2b1c0194853292ad2144f5588e4b0e118aae8b9534951e8e1f6281 "id"=28f09c685913b3da "items"=c0110b5a7d0e24fd"#,
    r#"1b9418e57ff5a813d3084cd12ea72a06d2dbf4ff9489bdb3706c809bf885893e "id"=28f09c685913b3da "items"=a1fdf24da994810a "ts"=a5b7b0a92fdf6b52"#,
    r#"7fd44d0e3c242968c11011773c36837ac0e1624c897e3ccda7b8c237c0f37e76 "id"=28f09c685913b3da "items"=94ac26b303508655 "meta"=69b423c21156284b"#,
    r#"a3c84ffeb4fd5faa0407b009b092411dc0824591116465c6ee7fc5545d729208 "c"=7324dc1e7e9474f0"#,
    r#"592a21e607b283edd0e2c12944cde3fcd9201d7946e6a8f83d9a5199b5a1b4be"#,
    r#"87f8f103b9b7d7b241ad06ffaa621ec8c368c98a9839206a4ab84e23cf8728c3 "deep"=601611a8bee1d623"#,
    r#"7225d40ffb8ba106640920b6eb0758f7d88632dbb852c93fe66fad328b69306c "arr"=b8d5d829013e1969 "nested"=4409682df205bc78"#,
];

fn fingerprint(body: &str, exclude: &[&str]) -> String {
    let spec = FingerprintSpec {
        exclude: exclude.iter().map(|s| (*s).to_owned()).collect(),
        ..FingerprintSpec::default()
    };
    let fp = spec
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/orders",
            content_type: Some("application/json"),
            headers: &[],
            body: body.as_bytes(),
        })
        .unwrap_or_else(|e| panic!("{body}: {e}"));
    let mut s: String = fp.digest.iter().map(|b| format!("{b:02x}")).collect();
    for (name, digest) in fp.fields.iter() {
        s.push_str(&format!(" {name:?}={digest:016x}"));
    }
    s
}

#[test]
fn recorded_fingerprints_keep_matching() {
    assert_eq!(CORPUS.len(), RECORDED.len());
    for ((body, exclude), want) in CORPUS.iter().zip(RECORDED) {
        assert_eq!(
            fingerprint(body, exclude),
            *want,
            "{body} without {exclude:?}"
        );
    }
}
