//! TLS against real processes: a three-node cluster whose HTTP and gRPC ports speak TLS only
//! and whose nodes authenticate each other with certificates from one CA (docs/tls.md).
//!
//! One cluster serves every scenario, since starting one is the expensive part: HTTP and gRPC
//! clients that verify the node (and forwarding between nodes over mutual TLS), plain-text and untrusting
//! clients refused, a node with a certificate from another CA kept out although it knows the
//! admin token, and a certificate replaced under a running node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use delayd_tests::{eventually, free_port, s, Cluster, Server};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use serde_json::Value;

const ADMIN_TOKEN: &str = "tls-test-admin-token-0001";

/// A certificate authority that writes node certificates to files.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Ca { cert, key })
    }

    /// Writes the CA certificate to `path`.
    fn write(&self, path: &Path) -> Result<PathBuf> {
        std::fs::write(path, self.cert.pem())?;
        Ok(path.to_path_buf())
    }

    fn trust(&self) -> Result<reqwest::Certificate> {
        Ok(reqwest::Certificate::from_pem(self.cert.pem().as_bytes())?)
    }

    /// A node certificate for loopback (SANs 127.0.0.1 and localhost), good as a server and
    /// as a client certificate, written to `<stem>.pem` and `<stem>.key`; returns its DER.
    fn issue(&self, stem: &Path, serial: u64) -> Result<Vec<u8>> {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        params.distinguished_name.push(DnType::CommonName, "delayd node");
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        // Key first: a reload triggered between the two writes sees a new key with the old
        // certificate, refuses the pair and keeps the old one until the certificate follows.
        std::fs::write(stem.with_extension("key"), key.serialize_pem())?;
        std::fs::write(stem.with_extension("pem"), cert.pem())?;
        Ok(cert.der().to_vec())
    }
}

/// The flags of a node whose certificate is at `<stem>.pem` / `<stem>.key`.
fn tls_flags(stem: &Path, peer_ca: &Path) -> Vec<String> {
    vec![
        "--tls-cert-file".into(),
        stem.with_extension("pem").display().to_string(),
        "--tls-key-file".into(),
        stem.with_extension("key").display().to_string(),
        "--peer-ca-file".into(),
        peer_ca.display().to_string(),
        "--admin-token".into(),
        ADMIN_TOKEN.into(),
    ]
}

/// A client that trusts `ca`, reports the server's certificate, and never reuses a
/// connection (each request shows the certificate of a fresh handshake).
fn client(ca: &Ca) -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .add_root_certificate(ca.trust()?)
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?)
}

async fn json(req: reqwest::RequestBuilder) -> Result<(u16, Value)> {
    let resp = req.bearer_auth(ADMIN_TOKEN).send().await?;
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await?;
    Ok((status, if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? }))
}

/// The whole error chain of a failed request, for assertions on the cause.
fn chain(e: &reqwest::Error) -> String {
    let mut text = format!("{e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_over_mutual_tls() -> Result<()> {
    let pki = tempfile::tempdir()?;
    let ca = Ca::new("delayd test CA")?;
    let ca_file = ca.write(&pki.path().join("ca.pem"))?;
    let stems: Vec<PathBuf> = (1..=3).map(|i| pki.path().join(format!("node{i}"))).collect();
    for (i, stem) in stems.iter().enumerate() {
        ca.issue(stem, 100 + i as u64)?;
    }
    let cluster =
        Cluster::start_each_trusting(3, |i| tls_flags(&stems[i], &ca_file), Some(ca.trust()?))
            .await?;
    let leader = cluster.leader(Duration::from_secs(20)).await?;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let http = client(&ca)?;
    let url = |i: usize| cluster.nodes[i].url.clone();

    // A verifying client publishes through one follower and consumes through the other:
    // both are forwarded to the leader over mutual TLS.
    let (st, r) =
        json(http.put(format!("{}/api/t/q?delay=0&ttl=600&tries=1", url(followers[0]))).body("hi"))
            .await?;
    ensure!(st == 201, "publish through a follower: {st} {r}");
    let job_id = s(&r, "job_id")?;
    let (st, r) = json(http.get(format!("{}/api/t/q?timeout=5&ttr=60", url(followers[1])))).await?;
    ensure!(st == 200 && s(&r, "job_id")? == job_id, "consume through a follower: {st} {r}");

    // The gRPC client, given the CA, works through a follower's gRPC port too.
    let options = delayd_client::Options {
        token: Some(ADMIN_TOKEN.into()),
        tls: Some(delayd_client::tls_config(ca.cert.pem().as_bytes())?),
        ..delayd_client::Options::default()
    };
    let grpc =
        delayd_client::Client::connect_with(&[cluster.nodes[followers[0]].grpc.clone()], options)
            .await?;
    let published = grpc.publish("t", "g", b"over grpc".to_vec(), Default::default()).await?;
    let got = grpc.reserve("t", &["g"], 1, Some(60_000), Duration::from_secs(5)).await?;
    let got_id = got.first().and_then(|d| d.job.as_ref()).map(|j| j.job_id.clone());
    ensure!(got_id.as_deref() == Some(published.job_id.as_str()), "gRPC over TLS: {got_id:?}");

    // delayctl verifies the node with --ca-file, and refuses it without.
    let ctl = |ca_file: Option<&Path>| {
        let mut cmd = std::process::Command::new(delayd_tests::delayctl_bin()?);
        cmd.args(["--addr", &url(followers[0]), "--token", ADMIN_TOKEN, "cluster", "status"]);
        cmd.env_remove("DELAYCTL_CA_FILE").env_remove("DELAYD_ADDR").env_remove("DELAYD_TOKEN");
        if let Some(path) = ca_file {
            cmd.arg("--ca-file").arg(path);
        }
        Ok::<_, anyhow::Error>(cmd.output()?)
    };
    let out = ctl(Some(&ca_file))?;
    ensure!(out.status.success(), "delayctl --ca-file: {}", String::from_utf8_lossy(&out.stderr));
    let out = ctl(None)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && stderr.contains("UnknownIssuer"), "delayctl: {stderr}");

    // A plain-text client gets no answer on either port: the handshake fails.
    let plain = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let http_port = url(0).replace("https://", "http://");
    let e = plain.get(format!("{http_port}/health")).send().await.err().context("plain HTTP")?;
    ensure!(!e.is_timeout(), "plain HTTP should be refused, not left waiting: {}", chain(&e));
    let grpc = format!("http://{}/", cluster.nodes[0].grpc);
    ensure!(plain.get(grpc).send().await.is_err(), "plain text on the gRPC port was answered");

    // A client that does not trust the CA refuses the node's certificate.
    let untrusting = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let e = untrusting.get(format!("{}/health", url(0))).send().await.err().context("trusted")?;
    ensure!(chain(&e).contains("UnknownIssuer"), "not a verification failure: {}", chain(&e));

    outsider_is_kept_out(&cluster, leader, &ca, pki.path()).await?;
    reload_serves_the_new_certificate(&cluster, &ca, &stems).await
}

/// A node with a certificate from another CA, which knows the admin token, is added as a
/// learner: the cluster cannot verify it, so it is never reached and never replicates. A node
/// with a certificate from the cluster's CA, added the same way, is the control: it catches up.
async fn outsider_is_kept_out(cluster: &Cluster, leader: usize, ca: &Ca, pki: &Path) -> Result<()> {
    let other = Ca::new("another CA")?;
    let outsider_stem = pki.join("outsider");
    other.issue(&outsider_stem, 7)?;
    let other_ca = other.write(&pki.join("other-ca.pem"))?;
    let outsider = Server::spawn_trusting(
        4,
        &cluster.dir.path().join("node4"),
        free_port()?,
        free_port()?,
        [vec!["--join".to_string()], tls_flags(&outsider_stem, &other_ca)].concat(),
        Some(other.trust()?),
    )
    .await?;
    let insider_stem = pki.join("insider");
    ca.issue(&insider_stem, 8)?;
    let insider = Server::spawn_trusting(
        5,
        &cluster.dir.path().join("node5"),
        free_port()?,
        free_port()?,
        [vec!["--join".to_string()], tls_flags(&insider_stem, &pki.join("ca.pem"))].concat(),
        Some(ca.trust()?),
    )
    .await?;

    let http = client(ca)?;
    let base = &cluster.nodes[leader].url;
    // Blocking until the learner catches up: the outsider's call cannot succeed, but its
    // membership entry is committed first.
    let _ = json(http.post(format!("{base}/admin/nodes?id=4&addr={}", outsider.grpc))).await?;
    let (st, r) = json(http.post(format!("{base}/admin/nodes?id=5&addr={}", insider.grpc))).await?;
    ensure!(st == 200, "adding the insider: {st} {r}");

    let view = eventually(Duration::from_secs(20), || async {
        let (st, v) = json(http.get(format!("{base}/admin/cluster"))).await?;
        ensure!(st == 200, "cluster view: {st} {v}");
        let node =
            |id: u64| v["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == id)).cloned();
        let (Some(out), Some(ins)) = (node(4), node(5)) else { return Ok(None) };
        let caught_up = ins["matched_index"].as_u64().is_some_and(|m| m > 0);
        Ok((out["reachable"] == false && caught_up).then_some((out, ins)))
    })
    .await
    .context("the insider never caught up, or the outsider was reachable")?;
    let (out, ins) = view;
    ensure!(out["matched_index"].is_null(), "the outsider replicated: {out}");
    let why = out["error"].as_str().unwrap_or_default();
    ensure!(why.contains("certificate") || why.contains("UnknownIssuer"), "{out}");
    ensure!(ins["role"] == "learner" && ins["reachable"] == true, "{ins}");

    // The outsider's own view: it never received an entry.
    let outsider_http = outsider.client_builder().timeout(Duration::from_secs(5)).build()?;
    let (st, h) = json(outsider_http.get(format!("{}/health", outsider.url))).await?;
    ensure!(st == 200 && h["last_applied"].as_u64().unwrap_or(0) == 0, "outsider: {h}");
    Ok(())
}

/// A node's certificate files are replaced and the node gets SIGHUP: new connections are
/// served the new certificate, and the cluster keeps working over it.
async fn reload_serves_the_new_certificate(
    cluster: &Cluster,
    ca: &Ca,
    stems: &[PathBuf],
) -> Result<()> {
    let http = client(ca)?;
    let served = |url: String| {
        let http = http.clone();
        async move {
            let resp = http.get(format!("{url}/health")).send().await?;
            let info = resp.extensions().get::<reqwest::tls::TlsInfo>().context("no TLS info")?;
            Ok::<_, anyhow::Error>(info.peer_certificate().map(<[u8]>::to_vec))
        }
    };
    let node = &cluster.nodes[0];
    let before = served(node.url.clone()).await?;
    let new_der = ca.issue(&stems[0], 200)?;
    ensure!(before.as_deref() != Some(&new_der[..]), "the new certificate is new");
    node.signal("HUP")?;
    eventually(Duration::from_secs(10), || async {
        Ok((served(node.url.clone()).await?.as_deref() == Some(&new_der[..])).then_some(()))
    })
    .await
    .context("the reloaded certificate was never served")?;
    let (st, h) = json(http.get(format!("{}/health", node.url))).await?;
    ensure!(st == 200 && h["leader"].is_u64(), "after the reload: {h}");
    Ok(())
}
