//! openraft's storage conformance suite, run against the RocksDB store.

use delayd_store::{LogStore, StateMachineStore, Store, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{StorageError, StorageIOError};
use tempfile::TempDir;

/// Opens a fresh store in a new temporary directory; the directory lives as long as the guard.
struct FreshStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FreshStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let (log, state) = Store::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
        Ok((dir, log, state))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(FreshStore).expect("storage suite");
}
