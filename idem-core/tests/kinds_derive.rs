//! Derived keys and sub-keys.
use idem_core::*;
use proptest::prelude::*;

fn fp(spec: &FingerprintSpec, body: &str) -> Fingerprint {
    spec.fingerprint(&RequestParts {
        method: "PUT",
        target: "/profile",
        content_type: Some("application/json"),
        headers: &[],
        body: body.as_bytes(),
    })
    .unwrap()
}

#[test]
fn derived_keys_follow_scope_operation_and_payload_only() {
    // IDEM-DERIVE-1
    let spec = FingerprintSpec {
        exclude: vec!["sent_at".into(), "/meta/nonce".into()],
        ..FingerprintSpec::default()
    };
    let scope = Scope::new("alice", "PUT", "/profile");
    let a = fp(
        &spec,
        r#"{"name":"Ann","sent_at":1,"meta":{"nonce":"x","v":1}}"#,
    );
    let a_retry = fp(
        &spec,
        r#"{ "meta": {"v": 1, "nonce": "y"}, "sent_at": 2, "name": "Ann" }"#,
    );
    let b = fp(
        &spec,
        r#"{"name":"Bob","sent_at":1,"meta":{"nonce":"x","v":1}}"#,
    );
    let key = derive_key(&scope, "set-profile", &a);
    assert!(key.starts_with(DERIVED_PREFIX));
    assert_eq!(key.len(), DERIVED_PREFIX.len() + 64);
    assert_eq!(
        derive_key(&scope, "set-profile", &a_retry),
        key,
        "volatile fields excluded"
    );
    assert_ne!(derive_key(&scope, "set-profile", &b), key);
    assert_ne!(derive_key(&scope, "set-avatar", &a), key);
    assert_ne!(
        derive_key(&Scope::new("bob", "PUT", "/profile"), "set-profile", &a),
        key
    );
    // Length prefixes: moving a boundary between parts changes the key.
    assert_ne!(
        derive_key(&Scope::custom("ab"), "c", &a),
        derive_key(&Scope::custom("a"), "bc", &a)
    );
    assert_eq!(
        parse_opaque_strict(format!("\"{key}\"").as_bytes()).unwrap(),
        key
    );
}

#[test]
fn sub_keys_are_deterministic_distinct_and_valid() {
    // IDEM-DERIVE-2
    let parent = "order-7f3a";
    let charge = sub_key(parent, "charge card").unwrap();
    assert!(charge.starts_with("charge_card."));
    assert_eq!(sub_key(parent, "charge card").unwrap(), charge);
    assert_ne!(sub_key(parent, "ship").unwrap(), charge);
    assert_ne!(sub_key("order-7f3b", "charge card").unwrap(), charge);
    // Pairs that concatenate alike still differ.
    assert_ne!(sub_key("a.b", "c").unwrap(), sub_key("a", "b.c").unwrap());
    assert_ne!(sub_key("a", "bc").unwrap(), sub_key("ab", "c").unwrap());
    // Steps that sanitise to the same label still differ.
    assert_ne!(
        sub_key(parent, "a b").unwrap(),
        sub_key(parent, "a_b").unwrap()
    );
    // Sub-keys of sub-keys, for calls further down.
    let nested = sub_key(&charge, "refund").unwrap();
    assert_ne!(nested, charge);
    // Long and odd inputs stay short and valid.
    let long = sub_key(&"p".repeat(10_000), &"é\"\\, ;".repeat(1000)).unwrap();
    assert!(long.len() <= 97);
    assert_eq!(parse_opaque_lenient(long.as_bytes()).unwrap(), long);
}

#[test]
fn empty_parts_are_refused() {
    // IDEM-DERIVE-3
    assert_eq!(sub_key("", "step"), Err(DeriveError::EmptyParent));
    assert_eq!(sub_key("parent", ""), Err(DeriveError::EmptyStep));
    assert!(!DeriveError::EmptyStep.to_string().is_empty());
}

proptest! {
    #[test]
    fn any_sub_key_is_a_valid_key(parent in "\\PC{1,300}", step in "\\PC{1,300}", step2 in "\\PC{1,30}") {
        // IDEM-DERIVE-2
        let k = sub_key(&parent, &step).unwrap();
        prop_assert!(k.len() <= MAX_KEY_LEN);
        prop_assert!(k.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
        prop_assert_eq!(parse_opaque_strict(format!("\"{k}\"").as_bytes()).unwrap(), k.clone());
        prop_assert_eq!(parse_opaque_lenient(k.as_bytes()).unwrap(), k.clone());
        prop_assert_eq!(sub_key(&parent, &step).unwrap(), k.clone());
        if step2 != step {
            prop_assert_ne!(sub_key(&parent, &step2).unwrap(), k);
        }
    }
}
