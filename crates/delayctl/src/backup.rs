//! `delayctl snapshot save FILE`: a backup of the cluster's state, from its leader.
//!
//! The node asked answers with the file when it leads, or with a redirect to the leader,
//! which is followed once with the same credential. The file is written to `FILE.partial`
//! beside `FILE`, synced, read back and checked (its trailer's checksum over everything
//! before it, the format `crates/delayd-store/src/snapshot.rs` defines), and only then
//! renamed to `FILE`. `delayd restore` checks the whole structure again before it
//! uses it.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
// The snapshot format's trailer checksum, shared with the store through the pure core.
use delayd_core::checksum::{SnapshotChecksum, SnapshotStart};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::http::{self, Call, Client};

/// A backup written and verified.
pub struct Saved {
    /// The file.
    pub path: PathBuf,
    /// The node that served it.
    pub node: String,
    /// The leader's headers: applied index and term, digest.
    pub headers: Value,
    /// Its size in bytes.
    pub bytes: u64,
    /// The checksum in its trailer, verified.
    pub checksum: u64,
}

/// Streams a backup into `path`; see the module docs. With `digest`, the leader also reports
/// the digest of the state it saved (one more pass over its data).
pub async fn save(client: &Client, path: &Path, digest: bool) -> Result<Saved> {
    // No limit on the whole transfer (it is as long as the state is large); each read of the
    // stream has the per-request timeout instead.
    let call = Call::new(Method::GET, &["admin", "snapshot"])
        .param("digest", digest.then_some("true"))
        .wait(Duration::from_secs(7 * 24 * 3600));
    let (mut node, mut resp) = client.open(&call).await?;
    if resp.status() == StatusCode::TEMPORARY_REDIRECT {
        let reply = http::read(resp).await?;
        let Some(leader) = reply.body["leader_http"].as_str() else {
            bail!("{}; its address is unknown", http::message(&reply.body));
        };
        let asked = node.scheme().to_string();
        node = http::parse_addr(leader).map_err(anyhow::Error::msg)?;
        // The leader speaks what the node asked speaks: every node has TLS on, or none.
        node.set_scheme(&asked).map_err(|()| anyhow::anyhow!("cannot use {asked} for {node}"))?;
        resp = client.open_at(&node, &call).await?;
    }
    if !resp.status().is_success() {
        let status = resp.status();
        let reply = http::read(resp).await?;
        bail!("{status} from {node}: {}", http::message(&reply.body));
    }
    let header =
        |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let index = header("x-delayd-applied-index");
    let headers = json!({
        "applied_index": index.as_deref().and_then(|i| i.parse::<u64>().ok()),
        "applied_term": header("x-delayd-applied-term").and_then(|t| t.parse::<u64>().ok()),
        "digest": header("x-delayd-digest"),
        "digest_entries": header("x-delayd-digest-entries").and_then(|e| e.parse::<u64>().ok()),
    });
    ensure!(index.is_some(), "{node} sent no applied index: not a delayd backup");

    let partial = partial_path(path)?;
    let written = write_stream(&mut resp, &partial, client.timeout()).await;
    let verified = written.and_then(|bytes| Ok((bytes, verify(&partial)?)));
    let (bytes, checksum) = match verified {
        Ok(v) => v,
        Err(e) => {
            // Never leave a file that could be mistaken for a backup.
            let _ = fs::remove_file(&partial);
            return Err(e);
        }
    };
    fs::rename(&partial, path)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    Ok(Saved {
        path: path.to_path_buf(),
        node: node.as_str().trim_end_matches('/').to_string(),
        headers,
        bytes,
        checksum,
    })
}

/// `FILE.partial` beside `FILE`.
fn partial_path(path: &Path) -> Result<PathBuf> {
    let name =
        path.file_name().with_context(|| format!("{} is not a file name", path.display()))?;
    let mut name = name.to_os_string();
    name.push(".partial");
    Ok(path.with_file_name(name))
}

/// Writes the body to a new file at `path` and syncs it; returns its size.
async fn write_stream(
    resp: &mut reqwest::Response,
    path: &Path,
    patience: Duration,
) -> Result<u64> {
    let mut file =
        File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut bytes = 0u64;
    loop {
        let chunk = tokio::time::timeout(patience, resp.chunk())
            .await
            .with_context(|| format!("the server sent nothing for {patience:?}"))?
            .context("the transfer broke off")?;
        let Some(chunk) = chunk else { break };
        file.write_all(&chunk).with_context(|| format!("cannot write {}", path.display()))?;
        bytes += chunk.len() as u64;
    }
    file.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
    Ok(bytes)
}

/// Reads the file back and checks its magic and its trailer checksum; returns the checksum.
fn verify(path: &Path) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.metadata()?.len();
    ensure!(len >= 8 + 1 + 1 + 8 + 8, "the backup is truncated ({len} bytes)");
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut start = [0u8; 9];
    r.read_exact(&mut start)?;
    // The format byte after the magic says which checksum the trailer holds.
    let mut hash = match SnapshotChecksum::for_file_start(&start) {
        Ok(hash) => hash,
        Err(SnapshotStart::NotASnapshot) => bail!("the answer is not a delayd snapshot"),
        Err(SnapshotStart::UnknownFormat(format)) => {
            bail!("the backup is in snapshot format {format}, which this delayctl does not know")
        }
    };
    let mut remaining = len - 9 - 8;
    let mut buf = vec![0u8; 1 << 20];
    while remaining > 0 {
        let n = usize::try_from(remaining.min(buf.len() as u64)).unwrap_or(buf.len());
        r.read_exact(&mut buf[..n])?;
        hash.update(&buf[..n]);
        remaining -= n as u64;
    }
    let mut trailer = [0u8; 8];
    r.read_exact(&mut trailer)?;
    let checksum = u64::from_be_bytes(trailer);
    ensure!(
        checksum == hash.value(),
        "checksum mismatch: the file says {checksum:016x}, its content hashes to {:016x}",
        hash.value()
    );
    Ok(checksum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use delayd_core::checksum::SNAPSHOT_MAGIC as MAGIC;

    fn file_with(content: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("b.snap");
        let mut hash = SnapshotChecksum::for_format(content[8]).expect("a known format");
        hash.update(content);
        let mut bytes = content.to_vec();
        bytes.extend_from_slice(&hash.value().to_be_bytes());
        fs::write(&path, bytes).expect("write");
        (dir, path)
    }

    #[test]
    fn verify_checks_magic_and_checksum() {
        for format in [1, 2] {
            verify_checks_magic_and_checksum_of(format);
        }
    }

    /// Format 1 (FNV-1a) and format 2 (CRC-32) backups are each checked by their checksum.
    fn verify_checks_magic_and_checksum_of(format: u8) {
        let mut content = MAGIC.to_vec();
        content.extend_from_slice(&[format, 2, 3, 4, 5, 6, 7, 8, 9, 0xff]);
        let (_dir, path) = file_with(&content);
        assert!(verify(&path).is_ok());
        let mut bytes = fs::read(&path).expect("read");
        bytes[10] ^= 1;
        fs::write(&path, &bytes).expect("write");
        let err = verify(&path).expect_err("damaged").to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        fs::write(&path, &bytes[..12]).expect("write");
        assert!(verify(&path).is_err());
        bytes[8] = 9;
        fs::write(&path, &bytes).expect("write");
        let err = verify(&path).expect_err("unknown format").to_string();
        assert!(err.contains("snapshot format 9"), "{err}");
    }
}
