//! FNV-1a, 64 bit: the checksum of snapshot and backup files. Cheap, dependency-free and good
//! enough to detect accidental damage (a broken transfer, a torn write); not a defence against
//! deliberate tampering. Here so that the store, which writes and installs the files, and the
//! CLI, which verifies a backup it saved without linking the store, compute the same value.

/// A running FNV-1a 64 hash.
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    /// Adds `bytes` to the hash.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash of everything added so far.
    pub fn value(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_values() {
        // From the FNV reference test suite.
        assert_eq!(Fnv64::default().value(), 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv64::default();
        h.update(b"a");
        assert_eq!(h.value(), 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv64::default();
        h.update(b"foo");
        assert_eq!(h.value(), 0xdcb2_7518_fed9_d577);
    }
}
