//! `delayd probe`: asks a node whether it is ready and exits 0 when it is, 1 when it is not
//! (with the node's reason) or cannot be asked. It is the container image's health check: the
//! image holds nothing but the `delayd` binary, so there is no curl to call.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

/// Asks a node's `/ready` (or any URL) and exits 0 only on a 200 answer.
#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The URL to ask.
    #[arg(default_value = "http://127.0.0.1:7777/ready")]
    url: String,
    /// Give up after this many ms.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// PEM file of the CA that signed the node's certificate, for an https URL.
    #[arg(long, env = "DELAYD_PROBE_CA_FILE")]
    ca_file: Option<PathBuf>,
}

/// Runs the probe: `Ok` when the node answered 200, an error naming why not otherwise.
pub async fn run(args: ProbeArgs) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder().timeout(Duration::from_millis(args.timeout_ms));
    if let Some(path) = &args.ca_file {
        let pem = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("{} is not a PEM certificate", path.display()))?;
        client = client.add_root_certificate(ca);
    }
    let client = client.build().context("cannot build an HTTP client")?;
    let response =
        client.get(&args.url).send().await.with_context(|| format!("cannot ask {}", args.url))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("{} answered {status}: {}", args.url, body.trim());
    }
    println!("{}", body.trim());
    Ok(())
}
