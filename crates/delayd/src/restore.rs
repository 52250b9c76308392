//! `delayd restore` and `delayd recover`: offline operations on a data directory, run while
//! no node uses it. The work is the store's (`delayd_store::restore`, `delayd_store::recover`);
//! this module parses the flags and reports what was done. `docs/backup.md` is the runbook.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use delayd_server::config::parse_members;
use delayd_store::Tail;

/// Build a new data directory from a backup (`delayctl snapshot save`): the same jobs and
/// state, as a new cluster of `--peers` (or of this node alone).
///
/// Restore every node of the new cluster from the same file with the same `--peers`, each
/// with its own `--node-id` and an empty `--data-dir`, then start them with those peers.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// The new data directory; must be missing or empty.
    #[arg(long)]
    data_dir: PathBuf,
    /// This node's id in the new cluster.
    #[arg(long)]
    node_id: u64,
    /// The new cluster's members as `id=host:port,...` (gRPC addresses), the same on every
    /// restored node [default: this node alone, at --advertise-addr].
    #[arg(long)]
    peers: Option<String>,
    /// Without --peers: the gRPC address this node will listen on, as for `delayd`.
    #[arg(long, default_value = "0.0.0.0:7778")]
    grpc_addr: SocketAddr,
    /// Without --peers: the gRPC address peers will reach it at, as for `delayd` [default:
    /// grpc_addr, loopback if unspecified].
    #[arg(long)]
    advertise_addr: Option<String>,
}

/// Turn a surviving node's data into a single-node cluster after its cluster lost quorum for
/// good. Stop the node first. Other nodes are then added back empty with `delayctl cluster
/// add` / `promote`. See docs/backup.md before you use it: it can lose writes.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The stopped node's data directory; the old one is kept beside it.
    #[arg(long)]
    data_dir: PathBuf,
    /// The node's id.
    #[arg(long)]
    node_id: u64,
    /// The node's gRPC address in the new cluster [default: its address in the old one].
    #[arg(long)]
    advertise_addr: Option<String>,
    /// Apply only the entries this node knew to be committed, as etcd's --force-new-cluster
    /// does, rather than its whole log [default: the whole log].
    #[arg(long)]
    discard_uncommitted: bool,
}

/// Runs `delayd restore`.
pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let members = match &args.peers {
        Some(peers) => parse_members(peers).map_err(|e| anyhow::anyhow!("--peers: {e}"))?,
        None => BTreeMap::from([(args.node_id, advertised(args.grpc_addr, args.advertise_addr))]),
    };
    if members.is_empty() {
        bail!("--peers lists no member");
    }
    let restored = delayd_store::restore(&args.from, &args.data_dir, args.node_id, &members)
        .with_context(|| {
            format!("cannot restore {} into {}", args.from.display(), args.data_dir.display())
        })?;
    let s = &restored.source;
    println!("restored {} into {}", args.from.display(), args.data_dir.display());
    println!("applied_index  {}", show(s.applied_index()));
    println!("records        {}", s.records);
    println!("bytes          {}", s.bytes);
    println!("checksum       {:016x}", s.checksum);
    println!("old members    {}", s.meta.last_membership.membership());
    println!("new members    {}", show_members(&restored.members));
    println!("cluster_id     {}", restored.cluster_id);
    println!("node_id        {}", args.node_id);
    Ok(())
}

/// Runs `delayd recover`.
pub fn recover(args: RecoverArgs) -> anyhow::Result<()> {
    let tail = if args.discard_uncommitted { Tail::DiscardUncommitted } else { Tail::Keep };
    let r = delayd_store::recover(&args.data_dir, args.node_id, args.advertise_addr, tail)
        .with_context(|| format!("cannot recover {}", args.data_dir.display()))?;
    println!("recovered {} as a single-node cluster", args.data_dir.display());
    println!("node_id          {}", args.node_id);
    println!("grpc             {}", r.addr);
    println!("applied_before   {}", show(r.applied_before));
    println!("committed_known  {}", show(r.committed));
    println!("last_log_index   {}", show(r.last_log_index));
    println!("applied_index    {}", show(r.applied_index));
    println!("discarded        {}", r.discarded);
    println!("previous data    {}", r.previous.display());
    println!("cluster_id       {}", r.cluster_id);
    Ok(())
}

/// The address a node listening on `grpc_addr` advertises, as `delayd` computes it.
fn advertised(grpc_addr: SocketAddr, advertise_addr: Option<String>) -> String {
    delayd_raft::config::advertised(grpc_addr, advertise_addr.as_deref())
}

fn show(index: Option<u64>) -> String {
    index.map_or_else(|| "-".into(), |i| i.to_string())
}

fn show_members(members: &BTreeMap<u64, String>) -> String {
    let list: Vec<String> = members.iter().map(|(id, a)| format!("{id}={a}")).collect();
    list.join(",")
}
