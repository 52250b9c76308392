//! openraft's storage conformance suite, run against the RocksDB store.

use delayd_store::{LogStore, StateMachineStore, Store, TypeConfig};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb, StorageError};
use tempfile::TempDir;

/// Opens a fresh store in a new temporary directory; the directory lives as long as the guard.
struct FreshStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for FreshStore {
    async fn build(
        &self,
    ) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
        let failed = |e: std::io::Error| {
            StorageError::from_io_error(ErrorSubject::Store, ErrorVerb::Write, e)
        };
        let dir = TempDir::new().map_err(failed)?;
        let (log, state) = Store::open(dir.path()).map_err(|e| failed(e.into()))?;
        Ok((dir, log, state))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite() {
    Suite::test_all(FreshStore).await.expect("storage suite");
}
