//! JSON string escapes (RFC 8259, section 7) as the canonicaliser's scanner decodes them.

/// The byte that a one-character escape stands for, given the character after the backslash
/// (`"`, `\`, `/`, `b`, `f`, `n`, `r`, `t`); `None` for `u`, whose four hex digits follow, and
/// for anything else, which is no escape.
pub(super) fn short(c: u8) -> Option<u8> {
    Some(match c {
        b'"' | b'\\' | b'/' => c,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

/// Whether `code` (of a `\uXXXX`) is a leading surrogate, which a trailing one must follow.
pub(super) fn leads(code: u32) -> bool {
    (0xD800..0xDC00).contains(&code)
}

/// The code point of the surrogate pair `high` (a leading surrogate), `low`; `None` when
/// `low` is not a trailing surrogate.
pub(super) fn pair(high: u32, low: u32) -> Option<u32> {
    (0xDC00..0xE000)
        .contains(&low)
        .then(|| 0x1_0000 + ((high - 0xD800) << 10 | (low - 0xDC00)))
}

#[cfg(test)]
mod tests {
    use super::{leads, pair, short};

    #[test]
    fn decodes_the_escapes_of_rfc_8259() {
        let decoded: alloc::vec::Vec<_> = b"\"\\/bfnrt".iter().map(|&c| short(c)).collect();
        let want = [b'"', b'\\', b'/', 0x08, 0x0c, b'\n', b'\r', b'\t'].map(Some);
        assert_eq!(decoded, want);
        assert_eq!(short(b'u'), None);
        assert_eq!(short(b'x'), None);
        // U+1F600 is D83D DE00.
        assert!(leads(0xD83D) && !leads(0xDE00) && !leads(0x0041));
        assert_eq!(pair(0xD83D, 0xDE00), Some(0x1F600));
        assert_eq!(pair(0xD83D, 0x0041), None);
        assert_eq!(pair(0xD83D, 0xD83D), None);
    }
}
