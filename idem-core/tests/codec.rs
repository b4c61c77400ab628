//! The record codec: round trips, and every kind of bad input.
use idem_core::*;
use std::sync::Arc;

fn sample() -> Vec<Record> {
    let fp = FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/x?y=1",
            content_type: Some("application/json"),
            headers: &[],
            body: br#"{"amount":5,"to":"bob"}"#,
        })
        .unwrap();
    let base = Record {
        version: u64::MAX - 1,
        fence: 3,
        fingerprint: fp,
        created: UnixMillis(1_700_000_000_000),
        key_expires: UnixMillis(1_700_600_000_000),
        state: RecordState::InFlight {
            lease_expires: UnixMillis(1_700_000_060_000),
        },
    };
    let completed = Record {
        state: RecordState::Completed {
            response: Arc::new(StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: (0..=255u8).collect(),
            }),
            response_expires: UnixMillis(1_700_086_400_000),
        },
        ..base.clone()
    };
    vec![
        base.clone(),
        completed,
        Record {
            state: RecordState::Tombstone,
            ..base.clone()
        },
        Record {
            state: RecordState::OutcomeUnknown {
                since: UnixMillis(5),
            },
            ..base.clone()
        },
        Record {
            state: RecordState::Settled,
            ..base
        },
    ]
}

#[test]
fn round_trip() {
    // IDEM-REC-1
    for r in sample() {
        let bytes = encode_record(&r);
        assert_eq!(&bytes[..3], b"iR\x01");
        assert_eq!(decode_record(&bytes).unwrap(), r);
    }
}

#[test]
fn compact() {
    // IDEM-REC-1: a tombstone with a small fingerprint stays well under 100 bytes.
    let t = &sample()[2];
    let len = encode_record(t).len();
    assert!(len < 100, "{len} bytes");
}

#[test]
fn every_truncation_is_an_error() {
    // IDEM-REC-1
    for r in sample() {
        let bytes = encode_record(&r);
        for cut in 0..bytes.len() {
            let err = decode_record(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(
                    err,
                    DecodeError::Truncated | DecodeError::Malformed | DecodeError::Invalid(_)
                ),
                "cut at {cut}: {err:?}"
            );
        }
    }
}

#[test]
fn foreign_wrong_version_trailing_and_oversized() {
    // IDEM-REC-1
    let good = encode_record(&sample()[1]);
    assert_eq!(decode_record(b""), Err(DecodeError::Truncated));
    assert_eq!(
        decode_record(b"{\"json\":true}"),
        Err(DecodeError::NotARecord)
    );
    assert_eq!(decode_record(b"\x89PNG\r\n"), Err(DecodeError::NotARecord));
    let mut v2 = good.clone();
    v2[2] = 2;
    assert_eq!(decode_record(&v2), Err(DecodeError::UnsupportedVersion(2)));
    let mut v0 = good.clone();
    v0[2] = 0;
    assert_eq!(decode_record(&v0), Err(DecodeError::UnsupportedVersion(0)));
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"xx");
    assert_eq!(decode_record(&trailing), Err(DecodeError::TrailingBytes(2)));
    let huge = vec![0u8; MAX_RECORD_BYTES + 1];
    assert_eq!(
        decode_record(&huge),
        Err(DecodeError::TooLarge {
            len: MAX_RECORD_BYTES + 1
        })
    );
    // A length prefix that claims far more than the input holds.
    let mut lying = b"iR\x01".to_vec();
    lying.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(decode_record(&lying).is_err());
}

#[test]
fn broken_invariants_are_refused() {
    // IDEM-REC-1
    let mut r = sample()[1].clone();
    if let RecordState::Completed { response, .. } = &mut r.state {
        Arc::make_mut(response).status = 700;
    }
    assert_eq!(
        decode_record(&encode_record(&r)),
        Err(DecodeError::Invalid("response status outside 100-599"))
    );
    let mut r = sample()[0].clone();
    let mut reversed: Vec<(String, u64)> = r
        .fingerprint
        .fields
        .iter()
        .map(|(name, digest)| (name.to_owned(), digest))
        .collect();
    reversed.reverse();
    r.fingerprint.fields = reversed.iter().map(|(n, d)| (n.as_str(), *d)).collect();
    assert!(r.fingerprint.fields.len() > 1);
    assert!(matches!(
        decode_record(&encode_record(&r)),
        Err(DecodeError::Invalid(_))
    ));
    let mut r = sample()[0].clone();
    r.key_expires = UnixMillis(0);
    assert!(matches!(
        decode_record(&encode_record(&r)),
        Err(DecodeError::Invalid(_))
    ));
}

#[test]
fn flipped_bytes_never_panic() {
    // IDEM-REC-1: every single-byte corruption decodes to an error or to some valid record.
    for r in sample() {
        let bytes = encode_record(&r);
        for i in 0..bytes.len() {
            for x in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                let _ = decode_record(&b);
            }
        }
    }
}
