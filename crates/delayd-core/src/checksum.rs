//! Checksums of the files delayd writes: snapshots and backups (their format is in
//! `delayd-store`'s `snapshot.rs`) and the cluster identity. Here so that the store, which
//! writes and installs the files, and the CLI, which verifies a backup it saved without
//! linking the store, compute the same values. They detect accidental damage (a broken
//! transfer, a torn write); they are no defence against deliberate tampering.

/// What every snapshot file starts with; the format byte follows it.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"DLYDSNAP";

/// Why a file's first bytes do not start a snapshot this build can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotStart {
    /// The magic is not there.
    NotASnapshot,
    /// A format this build does not know.
    UnknownFormat(u8),
}

/// The snapshot format whose trailer checksum is FNV-1a 64: files written before format 2.
pub const SNAPSHOT_FORMAT_FNV: u8 = 1;

/// The snapshot format written now: the trailer checksum is CRC-32 (IEEE), zero-extended to
/// the trailer's 64 bits. FNV-1a hashes a byte at a time, a chain of multiplications the CPU
/// cannot overlap: the thread writing a snapshot spent some 40 % of its time in the writes it
/// was inlined into. CRC-32 runs on the CPU's carry-less multiply at several GB/s.
pub const SNAPSHOT_FORMAT: u8 = 2;

/// The running checksum of a snapshot file of a given format.
#[derive(Clone, Debug)]
pub enum SnapshotChecksum {
    /// Format 1.
    Fnv(Fnv64),
    /// Format 2.
    Crc32(crc32fast::Hasher),
}

impl SnapshotChecksum {
    /// The checksum of `format`, or `None` for a format this build does not know.
    pub fn for_format(format: u8) -> Option<Self> {
        match format {
            SNAPSHOT_FORMAT_FNV => Some(SnapshotChecksum::Fnv(Fnv64::default())),
            SNAPSHOT_FORMAT => Some(SnapshotChecksum::Crc32(crc32fast::Hasher::new())),
            _ => None,
        }
    }

    /// The checksum of the snapshot file whose first nine bytes (the magic, then the format)
    /// are `start`, with them already added: readers take those bytes before they know which
    /// checksum covers them.
    pub fn for_file_start(start: &[u8; 9]) -> Result<Self, SnapshotStart> {
        if &start[..8] != SNAPSHOT_MAGIC {
            return Err(SnapshotStart::NotASnapshot);
        }
        let mut hash = Self::for_format(start[8]).ok_or(SnapshotStart::UnknownFormat(start[8]))?;
        hash.update(start);
        Ok(hash)
    }

    /// Adds `bytes` to the checksum.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            SnapshotChecksum::Fnv(h) => h.update(bytes),
            SnapshotChecksum::Crc32(h) => h.update(bytes),
        }
    }

    /// The checksum of everything added so far, as the trailer holds it.
    pub fn value(&self) -> u64 {
        match self {
            SnapshotChecksum::Fnv(h) => h.value(),
            SnapshotChecksum::Crc32(h) => u64::from(h.clone().finalize()),
        }
    }
}

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
    fn each_snapshot_format_has_its_checksum() {
        let value = |format| {
            let mut h = SnapshotChecksum::for_format(format).expect("known format");
            h.update(b"123");
            h.update(b"456789");
            h.value()
        };
        // The CRC-32 (IEEE) check value, over the standard input split in two updates.
        assert_eq!(value(SNAPSHOT_FORMAT), 0xcbf4_3926);
        let mut fnv = Fnv64::default();
        fnv.update(b"123456789");
        assert_eq!(value(SNAPSHOT_FORMAT_FNV), fnv.value());
        assert!(SnapshotChecksum::for_format(0).is_none());
        assert!(SnapshotChecksum::for_format(3).is_none());
    }

    #[test]
    fn a_file_start_chooses_its_checksum_and_counts_in_it() {
        let mut start = [0u8; 9];
        start[..8].copy_from_slice(SNAPSHOT_MAGIC);
        start[8] = SNAPSHOT_FORMAT;
        let mut from_start = SnapshotChecksum::for_file_start(&start).expect("a snapshot");
        from_start.update(b"rest");
        let mut whole = SnapshotChecksum::for_format(SNAPSHOT_FORMAT).expect("known");
        whole.update(&start);
        whole.update(b"rest");
        assert_eq!(from_start.value(), whole.value());
        start[8] = 7;
        assert_eq!(
            SnapshotChecksum::for_file_start(&start).map(|h| h.value()),
            Err(SnapshotStart::UnknownFormat(7))
        );
        start[0] = b'X';
        assert_eq!(
            SnapshotChecksum::for_file_start(&start).map(|h| h.value()),
            Err(SnapshotStart::NotASnapshot)
        );
    }

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
