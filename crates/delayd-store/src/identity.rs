//! A cluster's identity: a string kept beside a node's Raft state that its peers must share.
//!
//! A cluster formed from scratch has none (nor had clusters before identities existed). A
//! restore or a recovery gives the new cluster one ([`derive`]): every node restored from one
//! backup file with one membership computes the same, and it differs from the old cluster's.
//! Nodes carry it on every internal call, and a node that has one refuses calls carrying
//! another or none; a node without one refuses calls that carry one, unless it has not joined
//! any cluster yet, in which case it takes the identity of the first leader that replicates to
//! it. So a node of the old cluster and a node of the restored one never exchange a Raft
//! message, even with the same addresses and the same cluster secret.

use std::collections::BTreeMap;
use std::sync::Arc;

use delayd_core::checksum::Fnv64;
use delayd_core::codec;

use crate::db::{self, meta_key, Db, CF_RAFT_META};
use crate::error::StoreError;

/// The identity of the cluster restored from a backup whose trailer checksum is `checksum`,
/// with the membership `members`.
pub(crate) fn derive(checksum: u64, members: &BTreeMap<u64, String>) -> String {
    let mut h = Fnv64::default();
    h.update(&checksum.to_be_bytes());
    for (id, addr) in members {
        h.update(&id.to_be_bytes());
        h.update(addr.as_bytes());
        h.update(&[0]);
    }
    format!("{:016x}", h.value())
}

/// Reads and records this node's cluster identity.
#[derive(Clone)]
pub struct ClusterIdStore {
    db: Arc<Db>,
}

impl ClusterIdStore {
    pub(crate) fn new(db: Arc<Db>) -> ClusterIdStore {
        ClusterIdStore { db }
    }

    /// The node's cluster identity, if it has one.
    pub fn get(&self) -> Result<Option<String>, StoreError> {
        db::get_decoded(&self.db, CF_RAFT_META, meta_key::CLUSTER_ID)
    }

    /// Records `id` as the node's cluster identity, durably.
    pub fn set(&self, id: &str) -> Result<(), StoreError> {
        let cf = db::cf(&self.db, CF_RAFT_META)?;
        self.db.put_cf_opt(cf, meta_key::CLUSTER_ID, codec::encode(&id), &db::synced())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_and_one_membership_give_one_identity() {
        let members = |a: &str| BTreeMap::from([(1, a.to_string()), (2, "b:2".to_string())]);
        assert_eq!(derive(7, &members("a:1")), derive(7, &members("a:1")), "every node agrees");
        assert_ne!(derive(7, &members("a:1")), derive(8, &members("a:1")), "another backup");
        assert_ne!(derive(7, &members("a:1")), derive(7, &members("c:1")), "another membership");
    }
}
