//! The transport's side of a cluster's identity (see `delayd-store`'s `identity.rs` for what
//! it is and who has one): every internal call carries this node's identity in
//! [`CLUSTER_ID_HEADER`], and [`Identity::admit`] decides whether a call's identity may be
//! served here.

use std::sync::{Arc, PoisonError, RwLock};

use delayd_store::ClusterIdStore;

/// Metadata key of the caller's cluster identity on `Raft` and `Internal` calls.
pub const CLUSTER_ID_HEADER: &str = "x-delayd-cluster-id";

/// This node's cluster identity, shared by the client and server sides of the transport.
#[derive(Clone, Default)]
pub struct Identity {
    id: Arc<RwLock<Option<String>>>,
    /// Where an identity taken from a leader is recorded; `None` in tests without a store.
    store: Option<ClusterIdStore>,
}

impl Identity {
    /// The identity recorded in `store`, if any.
    pub fn load(store: ClusterIdStore) -> Result<Identity, delayd_store::StoreError> {
        let id = store.get()?;
        Ok(Identity { id: Arc::new(RwLock::new(id)), store: Some(store) })
    }

    /// The node's identity now.
    pub fn get(&self) -> Option<String> {
        self.id.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether a call showing `shown` may be served: the same identity as this node's, or
    /// neither has one. A node without one that has not joined a cluster yet (`fresh`) takes
    /// the identity of the first caller showing one: a leader adding it as a learner.
    pub fn admit(&self, shown: Option<&str>, fresh: impl FnOnce() -> bool) -> Result<(), String> {
        let mine = self.get();
        match (mine.as_deref(), shown) {
            (None, None) => Ok(()),
            (Some(mine), Some(shown)) if mine == shown => Ok(()),
            (Some(mine), shown) => Err(format!(
                "the caller belongs to cluster {}, this node to cluster {mine}",
                shown.unwrap_or("<none>")
            )),
            (None, Some(shown)) if fresh() => self.adopt(shown),
            (None, Some(shown)) => Err(format!(
                "the caller belongs to cluster {shown}, this node to a cluster without an identity"
            )),
        }
    }

    fn adopt(&self, id: &str) -> Result<(), String> {
        let mut mine = self.id.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(mine) = mine.as_deref() {
            // Another call got here first.
            return if mine == id {
                Ok(())
            } else {
                Err(format!("this node is in cluster {mine}"))
            };
        }
        if let Some(store) = &self.store {
            store.set(id).map_err(|e| format!("cannot record the cluster identity: {e}"))?;
        }
        tracing::info!(cluster_id = id, "joined a cluster with an identity");
        *mine = Some(id.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(id: Option<&str>) -> Identity {
        Identity { id: Arc::new(RwLock::new(id.map(str::to_string))), store: None }
    }

    #[test]
    fn only_the_same_identity_is_served_and_a_fresh_node_takes_its_leaders() {
        let restored = with(Some("b"));
        assert!(restored.admit(Some("b"), || false).is_ok());
        assert!(restored.admit(Some("a"), || true).is_err(), "another restored cluster");
        assert!(restored.admit(None, || true).is_err(), "a node of the old cluster");

        let old = with(None);
        assert!(old.admit(None, || false).is_ok(), "clusters without an identity as before");
        assert!(old.admit(Some("b"), || false).is_err(), "a member refuses a restored leader");

        let joiner = with(None);
        assert!(joiner.admit(Some("b"), || true).is_ok());
        assert_eq!(joiner.get().as_deref(), Some("b"));
        assert!(joiner.admit(None, || true).is_err(), "then it is a member of b");
    }
}
