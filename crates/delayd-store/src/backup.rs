//! Backups, restores and quorum-loss recovery.
//!
//! A **backup** is a snapshot file in the format of `snapshot.rs` (header with the snapshot
//! meta, records, a checksummed trailer), written from one consistent RocksDB view by
//! [`StateReader::export`] straight into whatever writer the caller gives (the admin API
//! streams it to the operator): nothing is held in memory and nothing is left on the node.
//!
//! A **restore** ([`restore`]) builds a fresh data directory from such a file. It is the
//! store's own install path ([`Shared::load`](crate::state)), run offline, with one
//! difference: the membership. The file carries the old cluster's membership; a restore
//! replaces it with the one the operator gives, so the restored nodes form a *new* cluster:
//!
//! - the state machine holds the file's data with `last_applied` = the file's last log id
//!   (so applied indexes continue where the source was, and digests compare);
//! - the membership is the new one, stamped with that same log id (every node restored from
//!   the same file with the same members agrees on it, so they form one cluster without an
//!   `initialize`);
//! - the log is empty, purged up to that log id: nothing of the old cluster's log comes
//!   along, so no entry proposed by an old leader can be applied here;
//! - the vote is one term past the file's last log, so the first election of the new cluster
//!   starts above every log id it holds;
//! - the current snapshot is rebuilt from the loaded state, so a follower that later receives
//!   it gets a file whose header names the new membership.
//!
//! - the node gets the new cluster's identity (`identity.rs`): derived from the file's
//!   checksum and the new membership, so every node restored alike has the same one, and
//!   nodes of the old cluster and the new one refuse each other's Raft messages whatever
//!   their addresses and secrets.
//!
//! **Recovery** ([`recover`]) turns the data of the one surviving node of a cluster that lost
//! its quorum into a single-node cluster: it applies what the node's log holds beyond its
//! applied index (see [`Recovered`] for which entries), exports the result, moves the old
//! directory aside and restores the export in its place with this node as the only member.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use delayd_core::codec;
use openraft::{BasicNode, Membership};
use rocksdb::WriteBatch;

use crate::db::{self, meta_key, ReadView, CF_RAFT_META};
use crate::error::StoreError;
use crate::snapshot::{self, SnapshotDir, SnapshotReader, SnapshotRecord};
use crate::state::{view_meta, StateReader};
use crate::{LogId, NodeId, SnapshotMeta, Store, StoredMembership, Vote};

/// What a verified snapshot file holds.
#[derive(Clone, Debug)]
pub struct SnapshotSummary {
    /// The last applied log id and the membership of the cluster it was taken from.
    pub meta: SnapshotMeta,
    /// How many records (keys) of application data it holds.
    pub records: u64,
    /// The checksum in its trailer (by its format: CRC-32 or FNV-1a 64), which matched its
    /// content.
    pub checksum: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl SnapshotSummary {
    /// The index of the last entry applied to the state the file holds.
    pub fn applied_index(&self) -> Option<u64> {
        self.meta.last_log_id.map(|l| l.index)
    }
}

/// Reads a whole snapshot file, checking its structure, record count and checksum.
pub fn verify_file(path: &Path) -> Result<SnapshotSummary, StoreError> {
    let file =
        File::open(path).map_err(|e| StoreError::io(format!("open {}", path.display()), e))?;
    let bytes =
        file.metadata().map_err(|e| StoreError::io(format!("stat {}", path.display()), e))?.len();
    let (meta, mut reader) = SnapshotReader::new(file)?;
    while reader.next_record()?.is_some() {}
    let (records, checksum) =
        reader.summary().ok_or_else(|| StoreError::Corrupt("snapshot: no trailer".into()))?;
    Ok(SnapshotSummary { meta, records, checksum, bytes })
}

impl StateReader {
    /// Writes a snapshot of the state as of now to `out`, from one consistent view: the
    /// backup the admin API streams. `started` gets the snapshot's meta and the view before
    /// the first byte is written (the API sends the meta as headers, and may digest the view). Blocking; refused with
    /// [`StoreError::Installing`] while a snapshot install has the state half-written.
    ///
    /// The format is written to `out` in chunks of 256 KiB.
    pub fn export(
        &self,
        out: impl Write,
        started: impl FnOnce(&SnapshotMeta, &ReadView<'_>),
    ) -> Result<SnapshotMeta, StoreError> {
        let view = self.shared.try_view()?;
        let meta = view_meta(&view)?;
        started(&meta, &view);
        snapshot::write_to(out, &meta, &view)?;
        Ok(meta)
    }
}

/// What [`restore`] built.
#[derive(Clone, Debug)]
pub struct Restored {
    /// The file it was built from.
    pub source: SnapshotSummary,
    /// The membership the restored node starts with.
    pub members: BTreeMap<NodeId, String>,
    /// The term of the vote it starts with; its first election is for a later term.
    pub term: u64,
    /// The new cluster's identity: the same on every node restored from one file with one
    /// membership, and different from the old cluster's (see `identity.rs`).
    pub cluster_id: String,
}

/// Builds a new data directory at `data_dir` for node `node_id` of a new cluster of
/// `members` (id → gRPC address) from the snapshot file `from`; see the module docs.
///
/// Refuses a `data_dir` that exists and is not empty, a `members` without `node_id`, and a
/// file that fails its checks (before anything is written). Blocking.
pub fn restore(
    from: &Path,
    data_dir: &Path,
    node_id: NodeId,
    members: &BTreeMap<NodeId, String>,
) -> Result<Restored, StoreError> {
    ensure_empty(data_dir)?;
    if !members.contains_key(&node_id) {
        let ids: Vec<&NodeId> = members.keys().collect();
        return Err(StoreError::Refused(format!(
            "node {node_id} is not one of the members {ids:?}: every restored node must be a member"
        )));
    }
    if node_id == 0 || members.contains_key(&0) {
        return Err(StoreError::Refused("node ids start at 1".into()));
    }
    let source = verify_file(from)?;
    let Some(last) = source.meta.last_log_id else {
        return Err(StoreError::Refused(format!(
            "{} holds a state to which nothing was ever applied: there is nothing to restore",
            from.display()
        )));
    };

    let (log, sm) = Store::open(data_dir)?;
    let shared = &sm.shared;
    // A copy: the operator's file stays where it is, and the directory owns its own.
    let n = shared.next_file();
    let tmp = shared.dir.tmp_path(n);
    let copied = fs::copy(from, &tmp)
        .and_then(|_| File::open(&tmp)?.sync_all())
        .map_err(|e| StoreError::io(format!("copy {} to {}", from.display(), tmp.display()), e));
    copied?;
    let name = SnapshotDir::snap_name(n);
    shared.dir.rename(&tmp, &name)?;

    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let nodes: BTreeMap<NodeId, BasicNode> =
        members.iter().map(|(id, addr)| (*id, BasicNode::new(addr.clone()))).collect();
    let membership = Membership::new(vec![voters], nodes)
        .map_err(|e| StoreError::Refused(format!("invalid membership: {e}")))?;
    let membership = StoredMembership::new(Some(last), membership);
    let meta = SnapshotMeta { last_log_id: Some(last), last_membership: membership };
    shared.load(&SnapshotRecord { file: name, meta })?;
    // The copied file's header still names the old membership, and a follower receiving it
    // would refuse it as inconsistent: build the current snapshot again from what was loaded.
    // It has the same last log id, so it replaces the copy.
    shared.build()?;

    // An empty log that starts after the snapshot, a known commit there, and a vote one term
    // past the snapshot's last log: openraft requires a leader's entries to sort after
    // every log id it holds, so the first election must be for a later term than `last`'s.
    let term = last.committed_leader_id().term + 1;
    log.start_after(last, Vote::new(term, node_id))?;
    let mut batch = WriteBatch::default();
    let raft_meta = db::cf(&shared.db, CF_RAFT_META)?;
    let cluster_id = crate::identity::derive(source.checksum, members);
    batch.put_cf(raft_meta, meta_key::CLUSTER_ID, codec::encode(&cluster_id));
    shared.db.write_opt(batch, &db::synced())?;
    drop((log, sm));
    Ok(Restored { source, members: members.clone(), term, cluster_id })
}

/// Refuses a directory that exists and holds anything.
fn ensure_empty(data_dir: &Path) -> Result<(), StoreError> {
    match fs::read_dir(data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(StoreError::Refused(format!(
                    "the data directory {} is not empty: a restore builds a new one (give an \
                     empty or missing directory)",
                    data_dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(format!("list {}", data_dir.display()), e)),
    }
}

/// Which log entries [`recover`] applies beyond the node's applied index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// Every entry in the log: what this node would commit had it won an election (Raft's
    /// rule: a new leader commits its whole log). Keeps every write it holds, acknowledged or
    /// not. The default.
    Keep,
    /// Only entries up to the commit index this node knew of, as etcd's
    /// `--force-new-cluster` does. The commit index is learned a heartbeat late, so this may
    /// drop the newest acknowledged writes.
    DiscardUncommitted,
}

/// What [`recover`] did.
#[derive(Clone, Debug)]
pub struct Recovered {
    /// The applied index the node had.
    pub applied_before: Option<u64>,
    /// The commit index it knew of.
    pub committed: Option<u64>,
    /// The last index in its log.
    pub last_log_index: Option<u64>,
    /// The applied index of the recovered state.
    pub applied_index: Option<u64>,
    /// Entries of the log left unapplied ([`Tail::DiscardUncommitted`]).
    pub discarded: u64,
    /// The node's gRPC address in its new single-node membership.
    pub addr: String,
    /// The new cluster's identity (see `identity.rs`).
    pub cluster_id: String,
    /// Where the old directory was moved (kept for inspection; delete it when done).
    pub previous: PathBuf,
}

/// Entries applied per read of the log during recovery.
const RECOVER_CHUNK: u64 = 1024;

/// Turns the data in `data_dir` (a stopped node) into a single-node cluster of `node_id` with
/// the state this node holds: its applied state plus its log entries as `tail` says. The node
/// keeps its address in the old membership unless `addr` is given. The old directory is moved
/// to `<data_dir>.pre-recover-<unix seconds>`, and files beside the data (the generated admin
/// token) are copied from it. Blocking.
pub fn recover(
    data_dir: &Path,
    node_id: NodeId,
    addr: Option<String>,
    tail: Tail,
) -> Result<Recovered, StoreError> {
    if !data_dir.join("db").is_dir() {
        return Err(StoreError::Refused(format!("no delayd data in {}", data_dir.display())));
    }
    let export = sibling(data_dir, "recover.snap")?;
    snapshot::remove_if_exists(&export)?;

    let (applied_before, committed, last_log_index, upto, addr) = {
        let (log, sm) = Store::open(data_dir)?;
        let shared = &sm.shared;
        let (applied_before, _) = shared.applied_state()?;
        let committed: Option<LogId> = log.committed();
        let last_log_index = log.last_entry_index();
        let upto = match tail {
            Tail::Keep => last_log_index,
            Tail::DiscardUncommitted => committed.map(|c| c.index).min(last_log_index),
        };
        let mut next = applied_before.map_or(0, |l| l.index + 1);
        while let Some(upto) = upto.filter(|u| next <= *u) {
            let end = upto.min(next.saturating_add(RECOVER_CHUNK - 1));
            let entries = log.read_range(next, end + 1)?;
            if entries.first().map(|e| e.log_id.index) != Some(next)
                || entries.len() as u64 != end + 1 - next
            {
                return Err(StoreError::Corrupt(format!(
                    "the log has a gap between {next} and {end}: cannot recover past it"
                )));
            }
            shared.apply(&entries)?;
            next = end + 1;
        }
        let (_, membership) = shared.applied_state()?;
        let addr = match addr {
            Some(a) => a,
            None => membership
                .membership()
                .get_node(&node_id)
                .map(|n| n.addr.clone())
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    StoreError::Refused(format!(
                        "node {node_id} is not in this data's membership ({}): check the node \
                         id, or give its address",
                        membership.membership()
                    ))
                })?,
        };
        let file = File::create(&export)
            .map_err(|e| StoreError::io(format!("create {}", export.display()), e))?;
        let view = shared.try_view()?;
        // `write_to` buffers: the file needs no writer of its own in between.
        snapshot::write_to(&file, &view_meta(&view)?, &view)?;
        drop(view);
        file.sync_all().map_err(|e| StoreError::io(format!("write {}", export.display()), e))?;
        drop((log, sm));
        (applied_before.map(|l| l.index), committed.map(|c| c.index), last_log_index, upto, addr)
    };

    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let previous = sibling(data_dir, &format!("pre-recover-{secs}"))?;
    fs::rename(data_dir, &previous).map_err(|e| {
        StoreError::io(format!("move {} to {}", data_dir.display(), previous.display()), e)
    })?;
    let restored = restore(&export, data_dir, node_id, &BTreeMap::from([(node_id, addr.clone())]))?;
    copy_other_files(&previous, data_dir)?;
    snapshot::remove_if_exists(&export)?;
    let applied_index = restored.source.applied_index();
    let discarded = match (last_log_index, upto) {
        (Some(last), Some(upto)) => last.saturating_sub(upto),
        (Some(last), None) => last + 1,
        _ => 0,
    };
    Ok(Recovered {
        applied_before,
        committed,
        last_log_index,
        applied_index,
        discarded,
        addr,
        cluster_id: restored.cluster_id,
        previous,
    })
}

/// `<dir>.<suffix>` beside `dir`.
fn sibling(dir: &Path, suffix: &str) -> Result<PathBuf, StoreError> {
    let name = dir.file_name().ok_or_else(|| {
        StoreError::Refused(format!("{} does not name a directory", dir.display()))
    })?;
    let mut name = name.to_os_string();
    name.push(format!(".{suffix}"));
    Ok(dir.with_file_name(name))
}

/// Copies the plain files of `from` other than the store's own (the admin token a node
/// generated lives there by default) into `to`.
fn copy_other_files(from: &Path, to: &Path) -> Result<(), StoreError> {
    let ctx = |what: &Path| format!("copy {} into {}", what.display(), to.display());
    for entry in fs::read_dir(from).map_err(|e| StoreError::io(ctx(from), e))? {
        let entry = entry.map_err(|e| StoreError::io(ctx(from), e))?;
        let path = entry.path();
        if path.is_file() {
            fs::copy(&path, to.join(entry.file_name()))
                .map_err(|e| StoreError::io(ctx(&path), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io;

    use futures::StreamExt;
    use openraft::storage::{
        EntryResponder, RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftStateMachine,
    };
    use openraft::testing::{blank_ent, log_id};

    use super::*;
    use crate::{LogStore, StateMachineStore, TypeConfig};
    use delayd_core::{Cf, KvRead};

    type Dump = Vec<(Cf, Vec<u8>, Vec<u8>)>;

    /// Every application record (the store's reserved keys left out).
    fn dump(sm: &StateMachineStore) -> Dump {
        let view = sm.read_view().expect("view");
        let mut out = Vec::new();
        for cf in Cf::ALL {
            view.scan(cf, b"", b"", &mut |k, v| {
                if !(cf == Cf::Meta && k.starts_with(b"raft/")) {
                    out.push((cf, k.to_vec(), v.to_vec()));
                }
                true
            })
            .expect("scan");
        }
        out
    }

    async fn apply(sm: &mut StateMachineStore, entries: Vec<crate::LogEntry>) {
        let items: Vec<Result<EntryResponder<TypeConfig>, io::Error>> =
            entries.into_iter().map(|e| Ok((e, None))).collect();
        RaftStateMachine::apply(sm, futures::stream::iter(items).boxed()).await.expect("apply");
    }

    /// A store with data, applied up to (3, node 2, index 2), membership {1, 2, 3}.
    async fn source(dir: &Path) -> (LogStore, StateMachineStore) {
        let (log, mut sm) = Store::open(dir).expect("open");
        let db = &sm.shared.db;
        db.put_cf(db::cf(db, Cf::Jobs.name()).expect("cf"), b"job-1", b"one").expect("put");
        db.put_cf(db::cf(db, Cf::Meta.name()).expect("cf"), b"clock", b"42").expect("put");
        let nodes: BTreeMap<NodeId, BasicNode> =
            [(1, "a:1"), (2, "b:2"), (3, "c:3")].map(|(id, a)| (id, BasicNode::new(a))).into();
        let membership = Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes).expect("valid");
        let first = openraft::Entry {
            log_id: log_id::<TypeConfig>(3, 2, 1),
            payload: openraft::EntryPayload::Membership(membership),
        };
        apply(&mut sm, vec![first, blank_ent::<TypeConfig>(3, 2, 2)]).await;
        (log, sm)
    }

    fn export(sm: &StateMachineStore, path: &Path) -> SnapshotMeta {
        let file = File::create(path).expect("create");
        sm.reader().export(&file, |_, _| {}).expect("export")
    }

    #[tokio::test]
    async fn a_restore_holds_the_data_under_a_new_membership_and_a_fresh_log() {
        let dir = tempfile::tempdir().expect("dir");
        let (_log, sm) = source(&dir.path().join("src")).await;
        let file = dir.path().join("b.snap");
        let meta = export(&sm, &file);
        assert_eq!(meta.last_log_id, Some(log_id::<TypeConfig>(3, 2, 2)));
        assert_eq!(verify_file(&file).expect("verify").records, 2);

        let members = BTreeMap::from([(1, "a:1".to_string()), (5, "e:5".to_string())]);
        let target = dir.path().join("new");
        let restored = restore(&file, &target, 5, &members).expect("restore");
        assert_eq!(restored.term, 4);

        let (mut log, mut new) = Store::open(&target).expect("reopen");
        assert_eq!(dump(&new), dump(&sm));
        let (applied, membership) = new.applied_state().await.expect("state");
        assert_eq!(applied, meta.last_log_id);
        assert_eq!(membership.log_id(), &meta.last_log_id);
        assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), [1, 5]);
        assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(4, 5)));
        let state = log.get_log_state().await.expect("log state");
        assert_eq!((state.last_purged_log_id, state.last_log_id), (applied, applied));
        assert!(log.try_get_log_entries(..).await.expect("entries").is_empty());
        // The current snapshot is a file whose own header names the new membership.
        let current = new.get_current_snapshot().await.expect("current").expect("some");
        assert_eq!(current.meta.last_membership, membership);
        let record = lock_current(&new);
        let in_file = verify_file(&new.shared.dir.path(&record)).expect("verify");
        assert_eq!(in_file.meta, current.meta);
    }

    fn lock_current(sm: &StateMachineStore) -> String {
        let snapshot: Option<SnapshotRecord> =
            db::get_decoded(&sm.shared.db, CF_RAFT_META, meta_key::SNAPSHOT).expect("get");
        snapshot.expect("a current snapshot").file
    }

    #[tokio::test]
    async fn a_restore_refuses_used_directories_foreign_ids_and_damaged_files() {
        let dir = tempfile::tempdir().expect("dir");
        let (_log, sm) = source(&dir.path().join("src")).await;
        let file = dir.path().join("b.snap");
        export(&sm, &file);
        let one = BTreeMap::from([(1, "a:1".to_string())]);
        let err = |r: Result<Restored, StoreError>| r.expect_err("refused").to_string();

        assert!(err(restore(&file, &dir.path().join("src"), 1, &one)).contains("is not empty"));
        let target = dir.path().join("new");
        assert!(err(restore(&file, &target, 2, &one)).contains("node 2 is not one of"));
        let mut bytes = fs::read(&file).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&file, &bytes).expect("write");
        assert!(err(restore(&file, &target, 1, &one)).contains("checksum mismatch"));
        fs::write(&file, &bytes[..bytes.len() / 2]).expect("write");
        assert!(err(restore(&file, &target, 1, &one)).contains("truncated"));
        assert!(!target.exists(), "a refused restore creates nothing");
    }

    #[tokio::test]
    async fn recovery_applies_the_log_the_survivor_holds_and_keeps_the_old_data() {
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("node2");
        {
            let (mut log, mut sm) = source(&data).await;
            // Entries 3..=5 in the log; 3 known committed, none applied.
            log.blocking_append((3..=5).map(|i| blank_ent::<TypeConfig>(3, 2, i)))
                .await
                .expect("append");
            log.save_committed(Some(log_id::<TypeConfig>(3, 2, 3))).await.expect("commit");
            let (applied, _) = sm.applied_state().await.expect("state");
            assert_eq!(applied.map(|l| l.index), Some(2));
            fs::write(data.join("admin-token"), "0123456789abcdef\n").expect("token");
        }
        let copy = dir.path().join("copy");
        crate::test_entries::copy_tree(&data, &copy);

        let r = recover(&data, 2, None, Tail::Keep).expect("recover");
        assert_eq!((r.applied_before, r.committed, r.last_log_index), (Some(2), Some(3), Some(5)));
        assert_eq!((r.applied_index, r.discarded, r.addr.as_str()), (Some(5), 0, "b:2"));
        assert!(r.previous.join("db").is_dir());
        assert!(data.join("admin-token").is_file());
        let (_log, mut sm) = Store::open(&data).expect("open");
        let (applied, membership) = sm.applied_state().await.expect("state");
        assert_eq!(applied.map(|l| l.index), Some(5));
        assert_eq!(membership.membership().voter_ids().collect::<Vec<_>>(), [2]);
        drop((_log, sm));

        let r = recover(&copy, 2, Some("x:9".into()), Tail::DiscardUncommitted).expect("recover");
        assert_eq!((r.applied_index, r.discarded, r.addr.as_str()), (Some(3), 2, "x:9"));
        assert!(recover(&dir.path().join("none"), 2, None, Tail::Keep).is_err());
    }
}
