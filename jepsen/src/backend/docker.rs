//! Docker-compose backend: the repository's `docker-compose.yml` (three containers on the
//! `delayd` bridge network 172.30.77.0/24, HTTP published on 127.0.0.1:7771–7773) with the
//! harness's overrides from `jepsen/docker-compose.jepsen.yml` (no automatic restarts, the
//! test-only clock hook, a 2 s request timeout as in the local backend).
//!
//! Faults are plain docker operations (`kill`, `stop`, `pause`, `network disconnect`), except
//! partitions: the image is `FROM scratch`, so there is no `iptables` inside; the host's
//! binary runs in a container's network namespace through `nsenter` instead (root only).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::local::{cmd, command_line, run};
use super::{Backend, NodeInfo};

/// The image the compose file runs unless told otherwise; built by `scripts/docker-image.sh`,
/// never pulled.
pub const IMAGE: &str = "delayd:local";
/// The harness's compose override, relative to the repository root.
const OVERRIDE: &str = "jepsen/docker-compose.jepsen.yml";
/// Node ids; the compose file has exactly these three services.
const IDS: [u64; 3] = [1, 2, 3];
/// The compose network's name inside the compose file (docker prefixes the project).
const NETWORK: &str = "delayd";

/// A container's state as far as the nemesis cares.
#[derive(Clone, Copy, Debug)]
struct State {
    running: bool,
    paused: bool,
    /// Host pid of its init process; 0 when not running.
    pid: u32,
}

/// The three-node cluster of the top-level `docker-compose.yml`, run as compose project
/// `project`.
pub struct DockerBackend {
    repo_root: PathBuf,
    project: String,
    nodes: Vec<NodeInfo>,
    /// Container ids by index (`id - 1`), resolved once after `up`; they survive kill/start.
    containers: Vec<String>,
    /// The compose network's docker name (`<project>_delayd`), resolved after `up`.
    network: Option<String>,
    /// Whether start() ran since the last teardown, so Drop knows to clean up.
    started: bool,
    /// The image the nodes run (the override file reads it as `DELAYD_IMAGE`).
    image: String,
    /// The compose command: `docker compose` or `docker-compose` (see [`compose_command`]).
    compose_cmd: Vec<String>,
}

impl DockerBackend {
    /// A backend for the compose files under `repo_root`, run as compose project `project`
    /// (lowercase letters, digits, `-` and `_`). Fails if the `delayd:local` image is missing:
    /// nothing is ever pulled or built here.
    pub fn new(repo_root: PathBuf, project: String) -> anyhow::Result<Self> {
        Self::with_image(repo_root, project, IMAGE.to_string())
    }

    /// Like [`DockerBackend::new`], with the nodes running `image` instead of `delayd:local`
    /// (e.g. a tagged copy of one build, which a later `scripts/docker-image.sh` does not
    /// replace).
    pub fn with_image(repo_root: PathBuf, project: String, image: String) -> anyhow::Result<Self> {
        // docker-compose v1 silently normalises other names, and then the network and the
        // labels we look containers up by would not be called what we think.
        let valid = project
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if project.is_empty() || !valid {
            bail!("compose project name {project:?} must be lowercase letters, digits, - or _");
        }
        for f in ["docker-compose.yml", OVERRIDE] {
            let p = repo_root.join(f);
            if !p.is_file() {
                bail!(
                    "{} not found (is {} the repository root?)",
                    p.display(),
                    repo_root.display()
                );
            }
        }
        let compose_cmd = compose_command()?;
        if run(&mut cmd("docker", ["image", "inspect", "--format", "{{.Id}}", &image])).is_err() {
            bail!("docker image {image} not found: build it with scripts/docker-image.sh");
        }
        let nodes = IDS
            .iter()
            .map(|&id| NodeInfo {
                id,
                http: format!("http://127.0.0.1:777{id}"),
                grpc: format!("{}:7778", ip_of(id)),
            })
            .collect();
        Ok(DockerBackend {
            repo_root,
            project,
            nodes,
            containers: Vec::new(),
            network: None,
            started: false,
            image,
            compose_cmd,
        })
    }

    /// The compose project name.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// `docker compose -p <project> -f docker-compose.yml -f <override> <args>` (or
    /// `docker-compose ...`) in the repository root.
    fn compose<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let (program, first) = self
            .compose_cmd
            .split_first()
            .map_or(("docker-compose", &[][..]), |(p, a)| (p.as_str(), a));
        let mut c = cmd(program, first);
        c.args(["-p", &self.project, "-f", "docker-compose.yml", "-f", OVERRIDE]);
        c.args(args).current_dir(&self.repo_root);
        // The compose file requires an admin token; the override turns authentication off
        // (DELAYD_DEV), so any valid one will do.
        c.env("DELAYD_ADMIN_TOKEN", "jepsen-admin-token-not-used");
        c.env("DELAYD_IMAGE", &self.image);
        c
    }

    /// Node `node`'s container id: cached after start(), else asked from compose (a backend
    /// used without start(), e.g. to tear down leftovers).
    fn container(&self, node: u64) -> anyhow::Result<String> {
        let i = index(node)?;
        if let Some(id) = self.containers.get(i) {
            return Ok(id.clone());
        }
        // `-a`: Compose v2 leaves stopped containers out otherwise (v1 lists them anyway).
        let out = run(&mut self.compose(["ps", "-a", "-q", &format!("delayd{node}")]))?;
        match out.split_whitespace().next() {
            Some(id) => Ok(id.to_string()),
            None => bail!("no container for delayd{node} in compose project {}", self.project),
        }
    }

    /// The docker name of the compose network, found by compose's labels rather than guessed.
    fn network(&self) -> anyhow::Result<String> {
        if let Some(n) = &self.network {
            return Ok(n.clone());
        }
        let out = run(&mut cmd(
            "docker",
            [
                "network",
                "ls",
                "--filter",
                &format!("label=com.docker.compose.project={}", self.project),
                "--filter",
                &format!("label=com.docker.compose.network={NETWORK}"),
                "--format",
                "{{.Name}}",
            ],
        ))?;
        match out.split_whitespace().next() {
            Some(n) => Ok(n.to_string()),
            None => bail!("no network {NETWORK} of compose project {}", self.project),
        }
    }

    fn state(&self, container: &str) -> anyhow::Result<State> {
        let out = run(&mut cmd(
            "docker",
            ["inspect", "-f", "{{.State.Running}} {{.State.Paused}} {{.State.Pid}}", container],
        ))?;
        let mut f = out.split_whitespace();
        let (Some(running), Some(paused), Some(pid)) = (f.next(), f.next(), f.next()) else {
            bail!("unexpected `docker inspect` state of {container}: {out:?}");
        };
        Ok(State {
            running: running == "true",
            paused: paused == "true",
            pid: pid.parse().with_context(|| format!("bad pid {pid:?} of {container}"))?,
        })
    }

    /// Whether `container` is attached to `network`.
    fn connected(&self, container: &str, network: &str) -> anyhow::Result<bool> {
        let out = run(&mut cmd(
            "docker",
            ["inspect", "-f", "{{json .NetworkSettings.Networks}}", container],
        ))?;
        let nets: serde_json::Value = serde_json::from_str(out.trim())
            .with_context(|| format!("bad network list of {container}: {out:?}"))?;
        Ok(nets.get(network).is_some())
    }

    /// Waits (bounded) until `container` no longer runs.
    fn wait_exited(&self, container: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while self.state(container)?.running {
            if Instant::now() > deadline {
                bail!("container {container} still runs {within:?} after being stopped");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Runs `iptables <args>` inside the network namespace of the process `pid`.
    fn iptables_in(&self, pid: u32, args: &[&str]) -> anyhow::Result<()> {
        let mut c = cmd("nsenter", ["-t", &pid.to_string(), "-n", "iptables", "-w", "5"]);
        c.args(args);
        run(&mut c)?;
        Ok(())
    }

    /// Unpauses every paused container of the project: compose cannot stop a paused one.
    fn unpause_all(&self) -> anyhow::Result<()> {
        let out = run(&mut cmd(
            "docker",
            [
                "ps",
                "-q",
                "--filter",
                &format!("label=com.docker.compose.project={}", self.project),
                "--filter",
                "status=paused",
            ],
        ))?;
        for id in out.split_whitespace() {
            run(&mut cmd("docker", ["unpause", id]))?;
        }
        Ok(())
    }
}

/// The compose command, chosen as `scripts/compose.sh` chooses it: `$DELAYD_COMPOSE` if set
/// (split on whitespace), else Compose v2 (`docker compose`) when the plugin answers, else
/// the standalone v1 `docker-compose`.
fn compose_command() -> anyhow::Result<Vec<String>> {
    if let Some(chosen) = std::env::var("DELAYD_COMPOSE").ok().filter(|c| !c.trim().is_empty()) {
        return Ok(chosen.split_whitespace().map(str::to_string).collect());
    }
    if run(&mut cmd("docker", ["compose", "version"])).is_ok() {
        return Ok(vec!["docker".into(), "compose".into()]);
    }
    run(&mut cmd("docker-compose", ["version", "--short"]))
        .context("the docker backend needs `docker compose` (v2) or `docker-compose` (v1)")?;
    Ok(vec!["docker-compose".into()])
}

/// `id - 1`, checked.
fn index(node: u64) -> anyhow::Result<usize> {
    IDS.iter().position(|&id| id == node).with_context(|| format!("no node {node}"))
}

/// Node `id`'s fixed address on the compose network.
fn ip_of(id: u64) -> String {
    format!("172.30.77.1{id}")
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    fn start(&mut self) -> anyhow::Result<()> {
        // Leftovers of an earlier run of this project (containers, volumes = data) go first,
        // so the cluster founds itself from empty data directories.
        self.teardown()?;
        self.started = true;
        // --no-build: the image exists (new() checked) and must never be built or pulled here.
        run(&mut self.compose(["up", "-d", "--no-build"]))?;
        let mut containers = Vec::new();
        for id in IDS {
            containers.push(self.container(id)?);
        }
        self.containers = containers;
        self.network = Some(self.network()?);
        Ok(())
    }

    fn kill(&self, node: u64) -> anyhow::Result<()> {
        let c = self.container(node)?;
        if !self.state(&c)?.running {
            return Ok(());
        }
        run(&mut cmd("docker", ["kill", "-s", "KILL", &c]))?;
        // `docker kill` returns once the signal is sent; "killed" means gone.
        self.wait_exited(&c, Duration::from_secs(10))
    }

    fn restart(&self, node: u64) -> anyhow::Result<()> {
        let c = self.container(node)?;
        if self.state(&c)?.running {
            return Ok(());
        }
        run(&mut cmd("docker", ["start", &c]))?;
        Ok(())
    }

    fn stop(&self, node: u64) -> anyhow::Result<()> {
        let c = self.container(node)?;
        let st = self.state(&c)?;
        if !st.running {
            return Ok(());
        }
        if st.paused {
            // A frozen process cannot handle SIGTERM; docker refuses to stop it anyway.
            run(&mut cmd("docker", ["unpause", &c]))?;
        }
        run(&mut cmd("docker", ["stop", "-t", "10", &c]))?;
        Ok(())
    }

    fn pause(&self, node: u64) -> anyhow::Result<()> {
        let c = self.container(node)?;
        let st = self.state(&c)?;
        if !st.running {
            bail!("cannot pause node {node}: its container is not running");
        }
        if !st.paused {
            run(&mut cmd("docker", ["pause", &c]))?;
        }
        Ok(())
    }

    fn resume(&self, node: u64) -> anyhow::Result<()> {
        let c = self.container(node)?;
        let st = self.state(&c)?;
        if st.running && st.paused {
            run(&mut cmd("docker", ["unpause", &c]))?;
        }
        Ok(())
    }

    fn can_partition(&self) -> bool {
        true
    }

    /// Rules go into both nodes' namespaces, though either side's alone drops both
    /// directions: a node that is down gets none (it has no namespace), and the cut still
    /// holds through its peer's rules. Only a pair with both nodes down is an error. A
    /// restarted container comes back with a fresh namespace, without rules.
    fn cut(&self, pairs: &[(u64, u64)]) -> anyhow::Result<()> {
        for &(a, b) in pairs {
            let mut applied = false;
            for (me, other) in [(a, b), (b, a)] {
                let c = self.container(me)?;
                let st = self.state(&c)?;
                if !st.running || st.pid == 0 {
                    continue;
                }
                let ip = ip_of(other);
                self.iptables_in(st.pid, &["-A", "INPUT", "-s", &ip, "-j", "DROP"])?;
                self.iptables_in(st.pid, &["-A", "OUTPUT", "-d", &ip, "-j", "DROP"])?;
                applied = true;
            }
            if !applied {
                bail!("cannot cut {a} from {b}: neither container is running");
            }
        }
        Ok(())
    }

    fn can_disconnect(&self) -> bool {
        true
    }

    fn disconnect(&self, node: u64) -> anyhow::Result<()> {
        let (c, net) = (self.container(node)?, self.network()?);
        if self.connected(&c, &net)? {
            run(&mut cmd("docker", ["network", "disconnect", &net, &c]))?;
        }
        Ok(())
    }

    fn heal(&self) -> anyhow::Result<()> {
        let net = self.network()?;
        for id in IDS {
            let c = self.container(id)?;
            if !self.connected(&c, &net)? {
                // The same address again: peers and the membership know the node by it, and
                // the published port forwards to it. The service name comes back as an alias,
                // as compose had set it, for anyone resolving `delayd<N>`.
                let (ip, alias) = (ip_of(id), format!("delayd{id}"));
                run(&mut cmd(
                    "docker",
                    ["network", "connect", "--ip", &ip, "--alias", &alias, &net, &c],
                ))?;
            }
            let st = self.state(&c)?;
            if st.running && st.pid != 0 {
                self.iptables_in(st.pid, &["-F", "INPUT"])?;
                self.iptables_in(st.pid, &["-F", "OUTPUT"])?;
            }
        }
        Ok(())
    }

    fn collect_logs(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for id in IDS {
            let c = self.container(id)?;
            let path = dir.join(format!("node-{id}.log"));
            let out =
                File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
            let err = out.try_clone().context("cannot duplicate the log file handle")?;
            // The container's stdout and stderr into one file, in docker's order (delayd logs
            // to stderr; stdout should stay empty).
            let mut c = cmd("docker", ["logs", &c]);
            c.stdin(Stdio::null()).stdout(out).stderr(err);
            let status =
                c.status().with_context(|| format!("cannot run `{}`", command_line(&c)))?;
            if !status.success() {
                // Its error message went into the file; that is the only copy.
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                bail!("`{}` failed ({status}): {}", command_line(&c), text.trim());
            }
        }
        Ok(())
    }

    fn teardown(&mut self) -> anyhow::Result<()> {
        // Compose cannot stop a paused container; best effort, `down` reports what is left.
        let _ = self.unpause_all();
        run(&mut self.compose(["down", "-v", "--remove-orphans", "-t", "10"]))?;
        self.containers.clear();
        self.network = None;
        self.started = false;
        Ok(())
    }
}

impl Drop for DockerBackend {
    /// Best-effort teardown of a started cluster, so a panicking test or harness does not
    /// leave containers (which hold the fixed ports and subnet) behind.
    fn drop(&mut self) {
        if self.started {
            let _ = self.teardown();
        }
    }
}
