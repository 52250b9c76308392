//! The transport's side of a cluster's identity (see `delayd-store`'s `identity.rs` for what
//! it is and who has one): every internal call carries this node's identity in
//! [`CLUSTER_ID_HEADER`], and [`Identity::admit`] decides whether a call's identity may be
//! served here.

use std::sync::{Arc, PoisonError, RwLock};

use delayd_store::ClusterIdStore;
use tonic::metadata::{Ascii, MetadataValue};

/// Metadata key of the caller's cluster identity on `Raft` and `Internal` calls.
pub const CLUSTER_ID_HEADER: &str = "x-delayd-cluster-id";

/// This node's cluster identity, shared by the client and server sides of the transport.
/// Every Raft message passes through it, so reading it allocates nothing: the identity is
/// kept with its header value ready to send.
#[derive(Clone, Default)]
pub struct Identity {
    id: Arc<RwLock<Option<Known>>>,
    /// Where an identity taken from a leader is recorded; `None` in tests without a store.
    store: Option<ClusterIdStore>,
}

/// An identity and the same as a header value.
struct Known {
    id: String,
    header: MetadataValue<Ascii>,
}

impl Known {
    fn new(id: String) -> Result<Known, String> {
        let header = MetadataValue::try_from(id.as_str())
            .map_err(|_| format!("cluster identity {id:?} is not a header value"))?;
        Ok(Known { id, header })
    }
}

impl Identity {
    /// The identity recorded in `store`, if any.
    pub fn load(store: ClusterIdStore) -> Result<Identity, delayd_store::StoreError> {
        let known = match store.get()? {
            Some(id) => Some(Known::new(id).map_err(delayd_store::StoreError::Corrupt)?),
            None => None,
        };
        Ok(Identity { id: Arc::new(RwLock::new(known)), store: Some(store) })
    }

    /// The node's identity now.
    pub fn get(&self) -> Option<String> {
        self.read().as_ref().map(|k| k.id.clone())
    }

    /// The node's identity as the header value every outgoing call carries.
    pub fn header(&self) -> Option<MetadataValue<Ascii>> {
        self.read().as_ref().map(|k| k.header.clone())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<Known>> {
        self.id.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call showing `shown` may be served: the same identity as this node's, or
    /// neither has one. A node without one that has not joined a cluster yet (`fresh`) takes
    /// the identity of the first caller showing one: a leader adding it as a learner.
    pub fn admit(&self, shown: Option<&str>, fresh: impl FnOnce() -> bool) -> Result<(), String> {
        match (self.read().as_ref().map(|k| k.id.as_str()), shown) {
            (None, None) => return Ok(()),
            (Some(mine), Some(shown)) if mine == shown => return Ok(()),
            (Some(mine), shown) => {
                return Err(format!(
                    "the caller belongs to cluster {}, this node to cluster {mine}",
                    shown.unwrap_or("<none>")
                ))
            }
            (None, Some(_)) => {}
        }
        match shown {
            Some(shown) if fresh() => self.adopt(shown),
            shown => Err(format!(
                "the caller belongs to cluster {}, this node to a cluster without an identity",
                shown.unwrap_or("<none>")
            )),
        }
    }

    fn adopt(&self, id: &str) -> Result<(), String> {
        let mut mine = self.id.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(mine) = mine.as_ref() {
            // Another call got here first.
            return match mine.id == id {
                true => Ok(()),
                false => Err(format!("this node is in cluster {}", mine.id)),
            };
        }
        let known = Known::new(id.to_string())?;
        if let Some(store) = &self.store {
            store.set(id).map_err(|e| format!("cannot record the cluster identity: {e}"))?;
        }
        tracing::info!(cluster_id = id, "joined a cluster with an identity");
        *mine = Some(known);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(id: Option<&str>) -> Identity {
        let known = id.map(|id| Known::new(id.to_string()).expect("ascii"));
        Identity { id: Arc::new(RwLock::new(known)), store: None }
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
