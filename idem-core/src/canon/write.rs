//! The canonical writer: values, objects put in order, excluded fields skipped.

use super::*;

/// Canonicalises `body` into `out`; with `fields`, fills them with per-member digests when
/// the body is an object.
pub(crate) fn canonicalise(
    body: &[u8],
    patterns: &[Vec<String>],
    out: &mut Vec<u8>,
    fields: Option<&mut FieldDigests>,
) -> Result<()> {
    let mut c = Canon {
        s: Scan { b: body, i: 0 },
        out: Out {
            body,
            buf: out,
            run: 0..0,
        },
        // Room for the members of a few nested objects up front (each growth is an
        // allocation and a copy). Bodies without escapes whose objects are in order never use
        // the scratch.
        members: Vec::with_capacity(32),
        keys: Vec::new(),
        scratch: Vec::new(),
        patterns: patterns.iter().map(Vec::as_slice).collect(),
    };
    let roots = 0..c.patterns.len();
    c.value(0, roots, fields)?;
    c.s.end()?;
    c.out.flush();
    Ok(())
}

/// An object member written so far: its key, and where it is in `out` (`"key":value`) and
/// where its value starts.
struct Member {
    key: Key,
    /// The key's first eight bytes, big-endian, zero-padded: members whose prefixes differ
    /// are ordered by them as by their whole keys, without reading the keys.
    prefix: u64,
    span: Range<usize>,
    value: usize,
}

/// A key's first eight bytes as a big-endian number, zero-padded.
#[inline]
fn prefix_of(key: &[u8]) -> u64 {
    if let Some(first) = key.first_chunk::<8>() {
        return u64::from_be_bytes(*first);
    }
    let at = |i: usize| u64::from(key[i]) << (56 - 8 * i);
    match key.len() {
        0 => 0,
        // The first and last four bytes, overlapping: shared bytes land where they belong
        // in both, so or-ing them changes nothing.
        len @ 4..=7 => {
            let head = key.first_chunk::<4>().map_or(0, |b| u32::from_be_bytes(*b));
            let tail = key.last_chunk::<4>().map_or(0, |b| u32::from_be_bytes(*b));
            u64::from(head) << 32 | u64::from(tail) << (8 * (8 - len))
        }
        // One to three bytes: the first, the middle and the last (some of them the same).
        len => at(0) | at(len / 2) | at(len - 1),
    }
}

/// Objects of at most this many members are put in order by a permutation of their
/// numbers (see [`Canon::finish_object`]).
pub(super) const SMALL_OBJECT: usize = 16;

/// Where a member's (unescaped) key is: in the body, or in the keys buffer.
#[derive(Clone)]
enum Key {
    Body(Range<usize>),
    Unescaped(Range<usize>),
}

/// The canonical output: the bytes written, then a run of body bytes that the output
/// repeats as they stand, not copied yet. Each token the output takes unchanged from the
/// body extends the run when it follows it in the body, so that a body mostly in canonical
/// form (no whitespace, members in order) is copied in a few large pieces, not token by
/// token.
struct Out<'a, 'o> {
    body: &'a [u8],
    buf: &'o mut Vec<u8>,
    /// Body bytes that follow `buf` in the output.
    run: Range<usize>,
}

impl Out<'_, '_> {
    /// The output's length, the run included.
    #[inline]
    fn len(&self) -> usize {
        self.buf.len() + self.run.len()
    }

    /// Appends the body's bytes `from`.
    #[inline]
    fn copy(&mut self, from: Range<usize>) {
        if from.start != self.run.end {
            self.flush();
            self.run.start = from.start;
        }
        self.run.end = from.end;
    }

    /// Copies the run, so that `buf` holds the whole output.
    #[inline]
    fn flush(&mut self) {
        if !self.run.is_empty() {
            self.buf.extend_from_slice(&self.body[self.run.clone()]);
            self.run.start = self.run.end;
        }
    }

    /// Appends a string the body holds without escapes at `raw`, with its quotes.
    #[inline]
    fn quoted(&mut self, raw: Range<usize>) {
        self.copy(raw.start - 1..raw.end + 1);
    }

    /// The whole output, for bytes that are not the body's.
    #[inline]
    fn bytes(&mut self) -> &mut Vec<u8> {
        self.flush();
        self.buf
    }
}

struct Canon<'a, 'o, 'p> {
    s: Scan<'a>,
    out: Out<'a, 'o>,
    /// The members of every object being written, innermost last.
    members: Vec<Member>,
    /// Unescaped keys of those members.
    keys: Vec<u8>,
    /// One buffer for three uses that never overlap: the current string, unescaped; an
    /// object's members while they are put in order; the containers of a skipped value. Its
    /// first use makes room for the body's length, so that it grows once at most.
    scratch: Vec<u8>,
    /// Exclusion patterns: the roots, then what remains of each that matches the path so far,
    /// one range per level.
    patterns: Vec<&'p [String]>,
}

fn key_bytes<'k>(body: &'k [u8], keys: &'k [u8], key: &Key) -> &'k [u8] {
    match key {
        Key::Body(r) => &body[r.clone()],
        Key::Unescaped(r) => &keys[r.clone()],
    }
}

impl Canon<'_, '_, '_> {
    /// One value, written canonically. Inlined where values are read, so that a string, a
    /// number or a literal costs no call; objects and arrays are the calls (outside
    /// WebAssembly, see [`Scan::string`]).
    #[cfg_attr(not(target_arch = "wasm32"), inline(always))]
    fn value(
        &mut self,
        depth: usize,
        patterns: Range<usize>,
        fields: Option<&mut FieldDigests>,
    ) -> Result<()> {
        self.s.ws();
        match self.s.peek() {
            Some(b'{') => self.object(depth + 1, patterns, fields),
            Some(b'[') => self.array(depth + 1, patterns),
            Some(b'"') => self.string(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => {
                if let Some(end) = self.s.canonical_number() {
                    self.out.copy(self.s.i..end);
                    self.s.i = end;
                    return Ok(());
                }
                match self.s.number()? {
                    Number::U64(v) => write_int(self.out.bytes(), v, false),
                    Number::I64(v) => write_int(self.out.bytes(), v.unsigned_abs(), v < 0),
                    Number::F64(v) => write_f64(self.out.bytes(), v),
                }
                Ok(())
            }
            _ => self.s.fail(),
        }
    }

    /// A string, written canonically: as it stands when it has no escapes.
    #[inline]
    fn string(&mut self) -> Result<()> {
        match self.s.string(&mut self.scratch)? {
            Text::Raw(raw) => self.out.quoted(raw),
            Text::Unescaped => write_bytes(self.out.bytes(), &self.scratch),
        }
        Ok(())
    }

    /// `true`, `false` or `null`.
    fn literal(&mut self, word: &[u8]) -> Result<()> {
        let at = self.s.i;
        self.s.literal(word)?;
        self.out.copy(at..self.s.i);
        Ok(())
    }

    /// The byte just scanned, which the output repeats.
    #[inline]
    fn keep_last(&mut self) {
        self.out.copy(self.s.i - 1..self.s.i);
    }

    /// The patterns that continue below `token` (pushed as a new range), and whether one of
    /// them ends there (the value at `token` is excluded).
    fn descend(
        &mut self,
        patterns: Range<usize>,
        key: Option<&Key>,
        index: usize,
    ) -> (Range<usize>, bool) {
        let start = self.patterns.len();
        let mut excluded = false;
        for p in patterns {
            let Some((first, rest)) = self.patterns[p].split_first() else {
                continue;
            };
            let hit = first == "*"
                || match key {
                    Some(key) => first.as_bytes() == key_bytes(self.s.b, &self.keys, key),
                    // Array elements: by index (or an empty token).
                    None => first.is_empty() || first.parse::<usize>() == Ok(index),
                };
            if hit {
                if rest.is_empty() {
                    excluded = true;
                } else {
                    self.patterns.push(rest);
                }
            }
        }
        (start..self.patterns.len(), excluded)
    }

    #[cfg_attr(not(target_arch = "wasm32"), inline(never))]
    fn array(&mut self, depth: usize, patterns: Range<usize>) -> Result<()> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        self.keep_last();
        self.s.ws();
        if self.s.peek() == Some(b']') {
            self.s.i += 1;
            self.keep_last();
            return Ok(());
        }
        let mut written = false;
        let mut index = 0;
        // Where the comma before this element is.
        let mut comma = 0;
        loop {
            let mark = self.patterns.len();
            let (child, excluded) = if patterns.is_empty() {
                (mark..mark, false)
            } else {
                self.descend(patterns.clone(), None, index)
            };
            index += 1;
            if excluded {
                self.s.skip_value(&mut self.scratch)?;
            } else {
                if written {
                    self.out.copy(comma..comma + 1);
                }
                written = true;
                self.value(depth, child.clone(), None)?;
            }
            self.patterns.truncate(mark);
            self.s.ws();
            match self.s.peek() {
                Some(b',') => {
                    comma = self.s.i;
                    self.s.i += 1;
                }
                Some(b']') => {
                    self.s.i += 1;
                    self.keep_last();
                    return Ok(());
                }
                _ => return self.s.fail(),
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), inline(never))]
    fn object(
        &mut self,
        depth: usize,
        patterns: Range<usize>,
        fields: Option<&mut FieldDigests>,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        self.keep_last();
        let start = self.out.len();
        let first_member = self.members.len();
        let first_key = self.keys.len();
        self.s.ws();
        if self.s.peek() == Some(b'}') {
            self.s.i += 1;
            self.keep_last();
            return Ok(());
        }
        // Where the comma before this member is.
        let mut comma = 0;
        loop {
            self.s.ws();
            if self.s.peek() != Some(b'"') {
                return self.s.fail();
            }
            let key = match self.s.string(&mut self.scratch)? {
                Text::Raw(raw) => Key::Body(raw),
                Text::Unescaped => {
                    let at = self.keys.len();
                    self.keys.extend_from_slice(&self.scratch);
                    Key::Unescaped(at..self.keys.len())
                }
            };
            self.s.expect(b':')?;
            let colon = self.s.i - 1;
            let mark = self.patterns.len();
            let (child, excluded) = if patterns.is_empty() {
                (mark..mark, false)
            } else {
                self.descend(patterns.clone(), Some(&key), 0)
            };
            if excluded {
                self.s.skip_value(&mut self.scratch)?;
            } else {
                // Written in place, `"key":value`, in the order of the body.
                if self.members.len() > first_member {
                    self.out.copy(comma..comma + 1);
                }
                let at = self.out.len();
                match &key {
                    Key::Body(raw) => self.out.quoted(raw.clone()),
                    Key::Unescaped(r) => write_bytes(self.out.bytes(), &self.keys[r.clone()]),
                }
                self.out.copy(colon..colon + 1);
                let value = self.out.len();
                self.value(depth, child.clone(), None)?;
                let prefix = prefix_of(key_bytes(self.s.b, &self.keys, &key));
                self.members.push(Member {
                    key,
                    prefix,
                    span: at..self.out.len(),
                    value,
                });
            }
            self.patterns.truncate(mark);
            self.s.ws();
            match self.s.peek() {
                Some(b',') => {
                    comma = self.s.i;
                    self.s.i += 1;
                }
                Some(b'}') => {
                    self.s.i += 1;
                    break;
                }
                _ => return self.s.fail(),
            }
        }
        self.finish_object(start, first_member, first_key, fields);
        self.keep_last();
        Ok(())
    }

    /// Puts the members written since `start` in order: sorted by the UTF-8 bytes of their
    /// names; of duplicate names the last one wins, as in serde_json. Members already in
    /// order (names strictly ascending) stay where they were written. The closing brace is
    /// the caller's.
    fn finish_object(
        &mut self,
        start: usize,
        first_member: usize,
        first_key: usize,
        mut fields: Option<&mut FieldDigests>,
    ) {
        let Canon {
            s,
            out,
            members,
            keys,
            scratch,
            ..
        } = self;
        let body = s.b;
        let name = |m: &Member| key_bytes(body, keys, &m.key);
        let members = &mut members[first_member..];
        let sorted = members
            .windows(2)
            .all(|w| order(body, keys, &w[0], &w[1]).is_lt());
        if sorted && fields.is_none() {
            // Nothing to read or move.
            self.members.truncate(first_member);
            self.keys.truncate(first_key);
            return;
        }
        let out = out.bytes();
        if let Some(fields) = fields.as_deref_mut() {
            let name_bytes = members.iter().map(|m| name(m).len()).sum();
            fields.reserve(members.len(), name_bytes);
        }
        if sorted {
            if let Some(fields) = fields {
                for m in members.iter() {
                    push_field(fields, name(m), &out[m.value..m.span.end]);
                }
            }
        } else {
            // The order of a small object is found as a permutation, by an insertion sort of
            // member numbers (moving a byte, not a member); a larger one's members are
            // sorted. Both are stable, so that of equal names the last one is last.
            let mut perm = [0u8; SMALL_OBJECT];
            let small = members.len() <= SMALL_OBJECT;
            if small {
                for i in 0..members.len() {
                    let mut j = i;
                    while j > 0
                        && order(body, keys, &members[perm[j - 1] as usize], &members[i]).is_gt()
                    {
                        perm[j] = perm[j - 1];
                        j -= 1;
                    }
                    perm[j] = i as u8;
                }
            } else {
                members.sort_by(|a, b| order(body, keys, a, b));
            }
            let members = &*members;
            let nth = |k: usize| {
                if small {
                    &members[perm[k] as usize]
                } else {
                    &members[k]
                }
            };
            let scratch = room(scratch, body.len());
            scratch.clear();
            scratch.extend_from_slice(&out[start..]);
            out.truncate(start);
            let mut wrote = false;
            for i in 0..members.len() {
                let m = nth(i);
                // Equal names are neighbours now: of those, the last one is written.
                if i + 1 < members.len() && {
                    let next = nth(i + 1);
                    next.prefix == m.prefix && name(next) == name(m)
                } {
                    continue;
                }
                if wrote {
                    out.push(b',');
                }
                wrote = true;
                out.extend_from_slice(&scratch[m.span.start - start..m.span.end - start]);
                if let Some(fields) = fields.as_deref_mut() {
                    let value = &scratch[m.value - start..m.span.end - start];
                    push_field(fields, name(m), value);
                }
            }
        }
        self.members.truncate(first_member);
        self.keys.truncate(first_key);
    }
}

/// Members in the order of their names' bytes. Prefixes that differ order keys as their
/// whole bytes do; a tie (a shared first eight bytes, or shorter keys that differ only by
/// trailing NULs) goes to the full comparison.
#[inline]
fn order(body: &[u8], keys: &[u8], a: &Member, b: &Member) -> core::cmp::Ordering {
    a.prefix
        .cmp(&b.prefix)
        .then_with(|| key_bytes(body, keys, &a.key).cmp(key_bytes(body, keys, &b.key)))
}

/// A top-level member's digest: XXH3-64 over its canonical value.
fn push_field(fields: &mut FieldDigests, name: &[u8], value: &[u8]) {
    // Checked to be UTF-8 when it was scanned.
    fields.push_utf8(name, xxhash_rust::xxh3::xxh3_64(value));
}

#[cfg(test)]
mod prefix_tests {
    use super::prefix_of;

    #[test]
    fn a_prefix_is_the_first_eight_bytes_big_endian_zero_padded() {
        let bytes: alloc::vec::Vec<u8> = (1..=12u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 0..=bytes.len() {
            let key = &bytes[..len];
            let mut padded = [0u8; 8];
            let n = len.min(8);
            padded[..n].copy_from_slice(&key[..n]);
            assert_eq!(prefix_of(key), u64::from_be_bytes(padded), "{len} bytes");
        }
    }
}
