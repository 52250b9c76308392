//! The store's error type and its mapping onto openraft's.

use delayd_core::KvError;

/// Everything that can go wrong below the state machine.
///
/// Apart from [`StoreError::Installing`] (a transient refusal to build a read view), every
/// variant means the node's storage cannot be trusted: handed to openraft it stops the node.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB reported an error.
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// A file operation (snapshots) failed.
    #[error("{context}: {source}")]
    Io {
        /// What the store was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Stored bytes that cannot be decoded, or a snapshot file that fails its checks.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A column family the store opened is missing from the handle.
    #[error("column family {0} is missing")]
    MissingColumnFamily(&'static str),
    /// The state machine failed to read or write its data.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A snapshot is being installed: the state is incomplete until it finishes. Retry later
    /// (or on another node).
    #[error("a snapshot is being installed; the state machine is not readable right now")]
    Installing,
    /// An offline operation (restore, recovery) refused its input; the message says why.
    #[error("{0}")]
    Refused(String),
    /// A blocking storage task panicked or was cancelled.
    #[error("storage task failed: {0}")]
    Task(String),
}

impl StoreError {
    /// Wraps an IO error with what the store was doing.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io { context: context.into(), source }
    }
}

impl From<StoreError> for std::io::Error {
    /// openraft 0.10 takes storage failures as `io::Error`; any of them stops the Raft node,
    /// so the message must say what failed.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io { context, source } => {
                std::io::Error::new(source.kind(), format!("{context}: {source}"))
            }
            e => std::io::Error::other(e.to_string()),
        }
    }
}
