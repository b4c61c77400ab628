//! SHA-256 (FIPS 180-4) written for size: one loop over the 64 rounds of a block, nothing
//! unrolled. The client's payload digest ([`payload_digest`](crate::payload_digest)) hashes
//! with it, so that the client's WebAssembly module carries a few hundred bytes of hashing
//! instead of the `sha2` crate's unrolled rounds; the server's fingerprints, which hash every
//! request, keep `sha2`, which is faster. The digests are the same (tests hold them equal).

/// The round constants: the first 32 bits of the fractional parts of the cube roots of the
/// first 64 primes.
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// The initial hash value: the first 32 bits of the fractional parts of the square roots of
/// the first 8 primes.
const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// A SHA-256 computation: feed it with [`SmallSha256::update`], read the digest with
/// [`SmallSha256::finalize`].
#[derive(Clone)]
pub(crate) struct SmallSha256 {
    state: [u32; 8],
    block: [u8; 64],
    /// Bytes of `block` filled.
    used: usize,
    /// Bytes fed so far.
    len: u64,
}

impl SmallSha256 {
    /// A new computation.
    pub(crate) fn new() -> SmallSha256 {
        SmallSha256 {
            state: H0,
            block: [0; 64],
            used: 0,
            len: 0,
        }
    }

    /// Feeds `data`.
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.len = self.len.wrapping_add(data.len() as u64);
        for &b in data {
            self.block[self.used] = b;
            self.used += 1;
            if self.used == 64 {
                compress(&mut self.state, &self.block);
                self.used = 0;
            }
        }
    }

    /// The digest of what was fed: padded with a 1 bit, zeros and the length in bits.
    pub(crate) fn finalize(mut self) -> [u8; 32] {
        let bits = self.len.wrapping_mul(8);
        self.update(&[0x80]);
        while self.used != 56 {
            self.update(&[0]);
        }
        self.update(&bits.to_be_bytes());
        let mut out = [0u8; 32];
        for (o, s) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&s.to_be_bytes());
        }
        out
    }
}

/// One block into the state.
fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    let mut w = [0u32; 64];
    for (i, c) in block.chunks_exact(4).enumerate() {
        w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
    }
    for i in 16..64 {
        let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
        let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16]
            .wrapping_add(s0)
            .wrapping_add(w[i - 7])
            .wrapping_add(s1);
    }
    let mut v = *state;
    for (k, w) in K.iter().zip(w) {
        let [a, b, c, d, e, f, g, h] = v;
        let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
        let ch = (e & f) ^ (!e & g);
        let t1 = h
            .wrapping_add(s1)
            .wrapping_add(ch)
            .wrapping_add(*k)
            .wrapping_add(w);
        let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
        let maj = (a & b) ^ (a & c) ^ (b & c);
        v = [
            t1.wrapping_add(s0.wrapping_add(maj)),
            a,
            b,
            c,
            d.wrapping_add(t1),
            e,
            f,
            g,
        ];
    }
    for (s, x) in state.iter_mut().zip(v) {
        *s = s.wrapping_add(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec::Vec;
    use proptest::prelude::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn known_digests() {
        // FIPS 180-4's examples: "abc", and the two-block message.
        let hex = |d: [u8; 32]| {
            d.iter()
                .map(|b| alloc::format!("{b:02x}"))
                .collect::<String>()
        };
        let mut abc = SmallSha256::new();
        abc.update(b"abc");
        assert_eq!(
            hex(abc.finalize()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut two = SmallSha256::new();
        two.update(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
        assert_eq!(
            hex(two.finalize()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// The same digest as `sha2`'s, however the input is cut into updates.
        #[test]
        fn same_as_sha2(data in prop::collection::vec(any::<u8>(), 0..300), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4)) {
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
            at.sort_unstable();
            let mut small = SmallSha256::new();
            let mut from = 0;
            for to in at.into_iter().chain([data.len()]) {
                small.update(&data[from..to]);
                from = to;
            }
            let want: [u8; 32] = Sha256::digest(&data).into();
            prop_assert_eq!(small.finalize(), want);
        }
    }
}
