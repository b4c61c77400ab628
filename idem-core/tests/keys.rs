//! Key parsing: the IETF sf-string, Stripe-style bare keys and UUIDs.
use idem_core::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, Scope, UuidVersion,
    MAX_KEY_LEN,
};

fn strict(s: &str) -> Result<String, KeyError> {
    parse_opaque_strict(s.as_bytes())
}

#[test]
fn strict_accepts_sf_strings() {
    // IDEM-KEY-1 IDEM-KEY-2
    assert_eq!(
        strict(r#""8e03978e-40d5-43e8-bc93-6894a57f9324""#).unwrap(),
        "8e03978e-40d5-43e8-bc93-6894a57f9324"
    );
    assert_eq!(
        strict(r#"  "a b"  "#).unwrap(),
        "a b",
        "SP around the item and inside strings is allowed"
    );
    assert_eq!(
        strict(r#""q\"uote\\d""#).unwrap(),
        r#"q"uote\d"#,
        "escapes are decoded"
    );
    assert_eq!(
        strict(r#""k";a=1;b;c="x";d=?0;e=:aGk=:;f=-1.5;g=tok/en"#).unwrap(),
        "k",
        "parameters are parsed and ignored"
    );
    assert_eq!(strict(r#""k"; a=1"#).unwrap(), "k", "SP after ; is allowed");
    let max = format!("\"{}\"", "x".repeat(MAX_KEY_LEN));
    assert_eq!(strict(&max).unwrap().len(), MAX_KEY_LEN);
}

#[test]
fn strict_refuses_everything_else() {
    // IDEM-KEY-1 IDEM-KEY-2 IDEM-KEY-5 IDEM-KEY-6
    assert_eq!(strict(""), Err(KeyError::Empty));
    assert_eq!(strict("   "), Err(KeyError::Empty));
    assert_eq!(strict(r#""""#), Err(KeyError::Empty));
    assert_eq!(
        strict(&format!("\"{}\"", "x".repeat(256))),
        Err(KeyError::TooLong { len: 256 })
    );
    assert!(matches!(
        strict(&format!("\"{}\"", "x".repeat(10_000))),
        Err(KeyError::TooLong { .. })
    ));
    assert_eq!(
        strict("abc"),
        Err(KeyError::NotString),
        "a token is not a String in strict mode"
    );
    assert_eq!(strict("123"), Err(KeyError::NotString));
    assert_eq!(strict("?1"), Err(KeyError::NotString));
    assert_eq!(strict(":aGk=:"), Err(KeyError::NotString));
    assert_eq!(
        strict("\"a\tb\""),
        Err(KeyError::InvalidByte { at: 2, byte: b'\t' }),
        "control characters"
    );
    assert_eq!(
        strict("\"a\x7fb\""),
        Err(KeyError::InvalidByte { at: 2, byte: 0x7f })
    );
    assert_eq!(
        strict("\"caf\u{e9}\""),
        Err(KeyError::InvalidByte { at: 4, byte: 0xc3 }),
        "non-ASCII"
    );
    assert_eq!(
        strict(r#""a\nb""#),
        Err(KeyError::BadEscape { at: 2 }),
        "only \\\" and \\\\ escape"
    );
    assert_eq!(strict(r#""abc"#), Err(KeyError::Unterminated));
    assert_eq!(strict(r#""abc\"#), Err(KeyError::Unterminated));
    assert_eq!(
        strict(r#""a", "b""#),
        Err(KeyError::List),
        "lists are refused"
    );
    assert_eq!(strict(r#""a","b""#), Err(KeyError::List));
    assert_eq!(strict(r#""a" x"#), Err(KeyError::TrailingData { at: 4 }));
    assert_eq!(strict(r#""a";"#), Err(KeyError::BadParameter { at: 4 }));
    assert_eq!(
        strict(r#""a";A=1"#),
        Err(KeyError::BadParameter { at: 4 }),
        "keys are lowercase"
    );
    assert_eq!(strict(r#""a";b="#), Err(KeyError::BadParameter { at: 4 }));
    assert_eq!(
        strict(r#""a";b=1.2345"#),
        Err(KeyError::BadParameter { at: 4 })
    );
    assert_eq!(
        strict(r#""a";b=:**:"#),
        Err(KeyError::BadParameter { at: 4 })
    );
    assert_eq!(
        strict("a=1, b=2"),
        Err(KeyError::NotString),
        "a dictionary is not a String item"
    );
    assert_eq!(
        strict("(\"a\" \"b\")"),
        Err(KeyError::InvalidByte { at: 0, byte: b'(' }),
        "inner lists are refused"
    );
}

#[test]
fn lenient_also_accepts_bare_keys() {
    // IDEM-KEY-2
    assert_eq!(
        parse_opaque_lenient(b"req_8e03978e").unwrap(),
        "req_8e03978e"
    );
    assert_eq!(parse_opaque_lenient(b"  abc:/+=  ").unwrap(), "abc:/+=");
    assert_eq!(parse_opaque_lenient(br#""quoted""#).unwrap(), "quoted");
    assert_eq!(parse_opaque_lenient(b""), Err(KeyError::Empty));
    assert_eq!(
        parse_opaque_lenient(b"a b"),
        Err(KeyError::InvalidByte { at: 1, byte: b' ' })
    );
    assert_eq!(parse_opaque_lenient(b"a,b"), Err(KeyError::List));
    assert_eq!(
        parse_opaque_lenient(b"a\"b"),
        Err(KeyError::InvalidByte { at: 1, byte: b'"' })
    );
    assert_eq!(
        parse_opaque_lenient("k\u{e9}".as_bytes()),
        Err(KeyError::InvalidByte { at: 1, byte: 0xc3 })
    );
    assert_eq!(
        parse_opaque_lenient(b"k\x00"),
        Err(KeyError::InvalidByte { at: 1, byte: 0 })
    );
    assert_eq!(
        parse_opaque_lenient("x".repeat(256).as_bytes()),
        Err(KeyError::TooLong { len: 256 })
    );
    assert_eq!(
        parse_opaque_lenient(br#""bad\x""#),
        Err(KeyError::BadEscape { at: 4 })
    );
}

#[test]
fn uuids() {
    // IDEM-KEY-4
    let v4 = "8E03978E-40D5-43E8-BC93-6894A57F9324";
    assert_eq!(
        parse_uuid(v4, None).unwrap(),
        v4.to_ascii_lowercase(),
        "compared case-insensitively"
    );
    assert_eq!(
        parse_uuid(v4, Some(UuidVersion::V4)).unwrap(),
        v4.to_ascii_lowercase()
    );
    assert_eq!(
        parse_uuid(v4, Some(UuidVersion::V7)),
        Err(KeyError::WrongUuidVersion {
            expected: UuidVersion::V7,
            found: 4
        })
    );
    let v7 = "01890a5d-ac96-774b-bcce-b302099a8057";
    assert!(parse_uuid(v7, Some(UuidVersion::V7)).is_ok());
    for bad in [
        "",
        "8e03978e40d543e8bc936894a57f9324",
        "{8e03978e-40d5-43e8-bc93-6894a57f9324}",
        "urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
        "8e03978e-40d5-43e8-bc93-6894a57f932g",
        "8e03978e-40d5-43e8-bc93_6894a57f9324",
    ] {
        assert_eq!(parse_uuid(bad, None), Err(KeyError::NotUuid), "{bad}");
    }
}

#[test]
fn errors_explain_themselves() {
    // IDEM-KEY-1
    let e = strict(r#""a\qb""#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid escape at offset 2: only \\\" and \\\\ are allowed"
    );
    assert!(KeyError::TooLong { len: 300 }.to_string().contains("300"));
}

/// Stores key their records by the scope's text, so its form is a storage format: each part
/// length-prefixed in decimal (IDEM-SCOPE-1).
#[test]
fn scopes_keep_their_stored_form() {
    assert_eq!(
        Scope::new("alice", "POST", "/orders").as_str(),
        "5:alice4:POST7:/orders"
    );
    assert_eq!(Scope::new("", "PUT", "/").as_str(), "0:3:PUT1:/");
    let long = "p".repeat(1234);
    assert_eq!(
        Scope::new(&long, "POST", "/x").as_str(),
        format!("1234:{long}4:POST2:/x")
    );
    // The length prefix keeps triples apart that concatenate alike.
    assert_ne!(Scope::new("a", "bc", "d"), Scope::new("ab", "c", "d"));
}
