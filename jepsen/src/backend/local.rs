//! Local-process backend: three `delayd` processes on this machine.
//!
//! Without network namespaces the nodes share loopback on free ports; they can be killed,
//! stopped and paused, but not partitioned. With namespaces (root only) every node gets its own
//! network namespace behind a veth pair on a private bridge, so a partition is an `iptables`
//! rule inside a node's namespace and a full disconnection is its host-side veth going down.
//!
//! ```text
//!   harness (root namespace) ── <tag>br 10.213.X.1/24 ──┬── <tag>h1 ═ <tag>n1 10.213.X.11  [ns <tag>-1]
//!                                                       ├── <tag>h2 ═ <tag>n2 10.213.X.12  [ns <tag>-2]
//!                                                       └── <tag>h3 ═ <tag>n3 10.213.X.13  [ns <tag>-3]
//! ```
//!
//! `X` is the first /24 of 10.213.0.0/16 no interface of the host uses when the backend is
//! created (usually 0), so concurrent runs each get their own.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::Rng;

use super::{Backend, NodeInfo};

/// Node ids; the cluster is always three nodes.
const IDS: [u64; 3] = [1, 2, 3];
/// The first two octets of the private /16 the namespaced runs take their /24 from. Chosen to
/// be unlikely on a developer machine or CI runner (Docker uses 172.17+/16, home routers
/// 192.168/16, cloud VPCs mostly 10.0–10.20). Each run takes a /24 of its own, so concurrent
/// runs (a test next to a long chaos run) do not clash.
const SUBNET_16: &str = "10.213";
/// Write timeout the nodes run with, so a node that cannot reach a quorum answers 503 well
/// before a client gives up on it (and the history records `Fail`, not `Unknown`).
const REQUEST_TIMEOUT_MS: &str = "2000";
/// How long [`Backend::stop`] waits after SIGTERM before it resorts to SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs `cmd` to completion and returns its stdout. A failure to run or a non-zero exit is an
/// error naming the command line and carrying its stderr, so a nemesis log says what broke.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let line = command_line(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot run `{line}`"))?;
    if !out.status.success() {
        bail!("`{line}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cmd` as a shell-like line, for error messages.
pub(crate) fn command_line(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        line.push(' ');
        line.push_str(&a.to_string_lossy());
    }
    line
}

/// Shorthand for a [`Command`] with arguments.
pub(crate) fn cmd<I, S>(program: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Whether this process runs as root (effective uid 0), read from `/proc/self/status` so no
/// libc call is needed.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|rest| {
                // Real, effective, saved, filesystem: the effective one decides permissions.
                rest.split_whitespace().nth(1).map(|euid| euid == "0")
            })
        })
        .unwrap_or(false)
}

/// Names of the network objects of one namespaced run. They all start with a run-unique tag
/// (`dj` + hex digits of the process id), so two runs, or the leftovers of a crashed one, never
/// collide; every interface name stays within Linux's 15-character limit.
#[derive(Clone, Debug)]
struct Net {
    tag: String,
    bridge: String,
    /// The first three octets of this run's /24, e.g. `10.213.0`.
    subnet: String,
    /// Whether start() inserted the FORWARD accept rule for the bridge (teardown deletes it).
    forward_rule: bool,
    /// Whether the bridge, namespaces and veths exist (start() built them).
    built: bool,
}

impl Net {
    /// Node `id`'s address.
    fn ip(&self, id: u64) -> String {
        format!("{}.1{id}", self.subnet)
    }
    /// The bridge's address: the nodes' gateway and the harness's side.
    fn gateway(&self) -> String {
        format!("{}.1", self.subnet)
    }
    fn ns(&self, id: u64) -> String {
        format!("{}-{id}", self.tag)
    }
    fn host_veth(&self, id: u64) -> String {
        format!("{}h{id}", self.tag)
    }
    fn node_veth(&self, id: u64) -> String {
        format!("{}n{id}", self.tag)
    }
    /// The FORWARD rule that lets bridged frames between the node veths through. It is needed
    /// whenever `br_netfilter` is loaded (bridged IPv4 then traverses iptables) and the FORWARD
    /// policy is DROP — exactly what Docker sets up on any host that runs it.
    fn forward_rule_args(&self, op: &str) -> Vec<String> {
        let mut a = vec!["-w".to_string(), "5".into(), op.into(), "FORWARD".into()];
        if op == "-I" {
            a.push("1".into());
        }
        a.extend(
            ["-i", &self.bridge, "-o", &self.bridge, "-j", "ACCEPT"].iter().map(|s| s.to_string()),
        );
        a
    }
}

/// How one node is launched, the same every time it (re)starts.
#[derive(Clone, Debug)]
struct Spec {
    id: u64,
    /// Its namespace, when namespaced.
    ns: Option<String>,
    http_addr: String,
    args: Vec<String>,
    data_dir: PathBuf,
    log: PathBuf,
}

/// Three `delayd` processes on this machine, optionally each in its own network namespace
/// (see the module docs).
pub struct LocalBackend {
    bin: PathBuf,
    work_dir: PathBuf,
    nodes: Vec<NodeInfo>,
    specs: Vec<Spec>,
    net: Option<Net>,
    /// The running process of each node, by index (`id - 1`). `None` once it was killed or
    /// stopped and reaped. A `Child` is never reaped behind our back, so its pid cannot be
    /// reused while we still hold it — signalling it with `kill <pid>` is safe.
    procs: Vec<Mutex<Option<Child>>>,
}

impl LocalBackend {
    /// A backend running `bin` with its data directories (`node-<id>/`) and logs
    /// (`node-<id>.log`) under `work_dir`. With `netns` (root only, see
    /// [`LocalBackend::netns_available`]) each node gets its own network namespace on a
    /// private bridge and the backend can partition; without, the nodes share loopback on free
    /// ports picked now. Nothing is started until [`Backend::start`].
    pub fn new(bin: PathBuf, work_dir: PathBuf, netns: bool) -> anyhow::Result<Self> {
        if !bin.is_file() {
            bail!("delayd binary not found at {} (build it: cargo build -p delayd)", bin.display());
        }
        std::fs::create_dir_all(&work_dir)
            .with_context(|| format!("cannot create {}", work_dir.display()))?;
        let work_dir = work_dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", work_dir.display()))?;

        let net = if netns {
            if !Self::netns_available() {
                bail!(
                    "network namespaces need root and a working `ip netns` (iproute2); \
                     run as root or without netns"
                );
            }
            run(&mut cmd("iptables", ["-V"]))
                .context("partitions need iptables on PATH (iptables-nft or legacy)")?;
            let tag = unique_tag()?;
            let subnet = free_subnet()?;
            Some(Net { bridge: format!("{tag}br"), tag, subnet, forward_rule: false, built: false })
        } else {
            None
        };

        let addrs: Vec<(String, String)> = match &net {
            Some(net) => IDS
                .iter()
                .map(|&id| (format!("{}:7777", net.ip(id)), format!("{}:7778", net.ip(id))))
                .collect(),
            None => {
                let ports = free_ports(6)?;
                ports
                    .chunks(2)
                    .map(|p| (format!("127.0.0.1:{}", p[0]), format!("127.0.0.1:{}", p[1])))
                    .collect()
            }
        };
        let peers = IDS
            .iter()
            .zip(&addrs)
            .map(|(id, (_, grpc))| format!("{id}={grpc}"))
            .collect::<Vec<_>>()
            .join(",");

        let mut nodes = Vec::new();
        let mut specs = Vec::new();
        for (id, (http, grpc)) in IDS.iter().copied().zip(addrs) {
            let data_dir = work_dir.join(format!("node-{id}"));
            let args = vec![
                "--node-id".to_string(),
                id.to_string(),
                "--data-dir".into(),
                data_dir.display().to_string(),
                "--http-addr".into(),
                http.clone(),
                "--grpc-addr".into(),
                grpc.clone(),
                "--advertise-addr".into(),
                grpc.clone(),
                "--peers".into(),
                peers.clone(),
                "--request-timeout-ms".into(),
                REQUEST_TIMEOUT_MS.into(),
            ];
            nodes.push(NodeInfo { id, http: format!("http://{http}"), grpc });
            specs.push(Spec {
                id,
                ns: net.as_ref().map(|n| n.ns(id)),
                http_addr: http,
                args,
                data_dir,
                log: work_dir.join(format!("node-{id}.log")),
            });
        }
        Ok(LocalBackend {
            bin,
            work_dir,
            nodes,
            specs,
            net,
            procs: IDS.iter().map(|_| Mutex::new(None)).collect(),
        })
    }

    /// Whether the namespaced mode can work here: running as root, `ip` on PATH, and
    /// `ip netns add` succeeding (containers without CAP_SYS_ADMIN are root yet cannot).
    pub fn netns_available() -> bool {
        if !is_root() || run(&mut cmd("ip", ["-V"])).is_err() {
            return false;
        }
        let probe = format!("djprobe{:x}", std::process::id());
        let ok = run(&mut cmd("ip", ["netns", "add", &probe])).is_ok();
        if ok {
            // Best effort: a probe namespace left behind is harmless and named after us.
            let _ = run(&mut cmd("ip", ["netns", "del", &probe]));
        }
        ok
    }

    /// The pid of node `node`'s process while it runs (with namespaces this is delayd itself:
    /// `ip netns exec` execs it in place).
    pub fn pid(&self, node: u64) -> Option<u32> {
        let mut slot = self.slot(node).ok()?;
        running(&mut slot).map(|c| c.id())
    }

    /// The run-unique prefix of the namespaces and interfaces, when namespaced.
    pub fn netns_tag(&self) -> Option<&str> {
        self.net.as_ref().map(|n| n.tag.as_str())
    }

    /// The directory holding the data directories and logs.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    fn spec(&self, node: u64) -> anyhow::Result<&Spec> {
        self.specs.iter().find(|s| s.id == node).with_context(|| format!("no node {node}"))
    }

    fn slot(&self, node: u64) -> anyhow::Result<MutexGuard<'_, Option<Child>>> {
        let i = IDS.iter().position(|&id| id == node).with_context(|| format!("no node {node}"))?;
        // A panic while holding the lock leaves the Child itself intact; keep using it.
        Ok(self.procs[i].lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn net(&self, what: &str) -> anyhow::Result<&Net> {
        self.net.as_ref().with_context(|| {
            format!("{what} needs the namespaced local backend (root + network namespaces)")
        })
    }

    /// Launches node `spec` with its output appended to its log.
    fn spawn(&self, spec: &Spec) -> anyhow::Result<Child> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("cannot open {}", spec.log.display()))?;
        let log2 = log.try_clone().context("cannot duplicate the log file handle")?;
        let mut c = match &spec.ns {
            // `ip netns exec` execs the program after entering the namespace, so the child
            // we hold is delayd itself and signals reach it directly.
            Some(ns) => {
                let mut c = cmd("ip", ["netns", "exec", ns]);
                c.arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        c.args(&spec.args)
            // The test-only clock hook; clap reads the flag's env var, and until the binary
            // knows the flag an unknown variable is harmless (the flag itself would be fatal).
            .env("DELAYD_DEBUG_CLOCK", "1")
            // The harness tests the queue's guarantees; authentication is off.
            .env("DELAYD_DEV", "1")
            .env("RUST_LOG", "info,openraft=warn")
            // A joining node starts empty; ours found the cluster, whatever the caller's env.
            .env_remove("DELAYD_JOIN")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        c.spawn().with_context(|| format!("cannot start node {}: `{}`", spec.id, command_line(&c)))
    }

    /// Waits (bounded) until every node accepts TCP on its HTTP address, so start() returns
    /// with processes that really run; a node that exits instead is an error with its log's
    /// tail (a bad flag, a port in use).
    fn wait_listening(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        for spec in &self.specs {
            let addr: SocketAddr = spec.http_addr.parse().context("bad HTTP address")?;
            loop {
                {
                    let mut slot = self.slot(spec.id)?;
                    if running(&mut slot).is_none() {
                        bail!(
                            "node {} exited right after starting; its log ends:\n{}",
                            spec.id,
                            log_tail(&spec.log)
                        );
                    }
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("node {} does not listen on {} after 20 s", spec.id, spec.http_addr);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Builds the bridge, the namespaces and the veth pairs (see the module docs).
    fn build_net(&mut self) -> anyhow::Result<()> {
        let Some(net) = self.net.as_mut() else { return Ok(()) };
        // Mark first: a half-built network must still be torn down.
        net.built = true;
        let net = net.clone();
        let br = net.bridge.as_str();
        run(&mut cmd("ip", ["link", "add", br, "type", "bridge"]))?;
        run(&mut cmd("ip", ["addr", "add", &format!("{}/24", net.gateway()), "dev", br]))?;
        run(&mut cmd("ip", ["link", "set", br, "up"]))?;
        for id in IDS {
            let (ns, h, n) = (net.ns(id), net.host_veth(id), net.node_veth(id));
            run(&mut cmd("ip", ["netns", "add", &ns]))?;
            run(&mut cmd("ip", ["link", "add", &h, "type", "veth", "peer", "name", &n]))?;
            run(&mut cmd("ip", ["link", "set", &n, "netns", &ns]))?;
            run(&mut cmd("ip", ["link", "set", &h, "master", br]))?;
            run(&mut cmd("ip", ["link", "set", &h, "up"]))?;
            run(&mut cmd(
                "ip",
                ["-n", &ns, "addr", "add", &format!("{}/24", net.ip(id)), "dev", &n],
            ))?;
            run(&mut cmd("ip", ["-n", &ns, "link", "set", &n, "up"]))?;
            run(&mut cmd("ip", ["-n", &ns, "link", "set", "lo", "up"]))?;
            run(&mut cmd("ip", ["-n", &ns, "route", "add", "default", "via", &net.gateway()]))?;
        }
        run(&mut cmd("iptables", net.forward_rule_args("-I")))
            .context("cannot let bridged traffic between the nodes through FORWARD")?;
        if let Some(n) = self.net.as_mut() {
            n.forward_rule = true;
        }
        Ok(())
    }

    /// Removes whatever of the network exists; every step is attempted, the first failure is
    /// returned.
    fn destroy_net(&mut self) -> anyhow::Result<()> {
        let Some(net) = self.net.as_mut() else { return Ok(()) };
        let mut first_err: Option<anyhow::Error> = None;
        let mut note = |r: anyhow::Result<()>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        if net.forward_rule {
            // Delete every copy, in case start() ran more than once without a teardown.
            while run(&mut cmd("iptables", net.forward_rule_args("-C"))).is_ok() {
                let r = run(&mut cmd("iptables", net.forward_rule_args("-D"))).map(drop);
                let failed = r.is_err();
                note(r);
                if failed {
                    break;
                }
            }
            net.forward_rule = false;
        }
        if net.built {
            let existing = run(&mut cmd("ip", ["netns", "list"])).unwrap_or_default();
            for id in IDS {
                let ns = net.ns(id);
                // Deleting the namespace destroys the node end of the veth, and with it the
                // host end; the explicit delete below covers a namespace-less half-built pair.
                if existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())) {
                    note(run(&mut cmd("ip", ["netns", "del", &ns])).map(drop));
                }
                note(del_link(&net.host_veth(id)));
            }
            note(del_link(&net.bridge));
            net.built = false;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends `signal` (a `kill` signal name) to node `node` if it runs, and returns its pid;
    /// `None` if it does not run.
    fn signal(&self, node: u64, signal: &str) -> anyhow::Result<Option<u32>> {
        let mut slot = self.slot(node)?;
        match running(&mut slot) {
            Some(child) => {
                let pid = child.id();
                run(&mut cmd("kill", [format!("-{signal}"), pid.to_string()]))?;
                Ok(Some(pid))
            }
            None => Ok(None),
        }
    }
}

/// Waits until every thread of `pid` is stopped (state `T` or `t` in its
/// `/proc/<pid>/task/<tid>/stat`), at most `within`.
fn wait_stopped(pid: u32, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let mut running = 0;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            // A thread that exits between the listing and the read is not running.
            let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else { continue };
            if !matches!(thread_state(&stat), Some('T' | 't')) {
                running += 1;
            }
        }
        if running == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{running} thread(s) still not stopped after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state letter of a `/proc/.../stat` line: the first field after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn thread_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The child in `slot` if it still runs; reaps and clears it if it exited.
fn running(slot: &mut Option<Child>) -> Option<&mut Child> {
    let exited = match slot.as_mut() {
        None => return None,
        Some(child) => !matches!(child.try_wait(), Ok(None)),
    };
    if exited {
        *slot = None;
    }
    slot.as_mut()
}

/// SIGKILLs and reaps `child` (a no-op if it already exited).
fn kill_child(child: &mut Child) -> anyhow::Result<()> {
    // Fails only if the child was already reaped, which `running` rules out; wait regardless.
    let _ = child.kill();
    child.wait().with_context(|| format!("cannot reap pid {}", child.id()))?;
    Ok(())
}

fn link_exists(name: &str) -> bool {
    run(&mut cmd("ip", ["link", "show", "dev", name])).is_ok()
}

/// Deletes a link if it exists. Deleting a namespace takes its veth pair with it, but the
/// kernel does that asynchronously: a link seen a moment ago may be gone by the time it is
/// deleted, which is what was wanted, so only a link still there after a failure is an error.
fn del_link(name: &str) -> anyhow::Result<()> {
    if !link_exists(name) {
        return Ok(());
    }
    match run(&mut cmd("ip", ["link", "del", name])) {
        Err(_) if !link_exists(name) => Ok(()),
        r => r.map(drop),
    }
}

/// The last lines of a log, for errors about a node that died.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Fails if an interface of this host already has an address in `subnet` (three octets):
/// the routes would clash and the harness would talk to the wrong network.
fn subnet_free(subnet: &str) -> anyhow::Result<()> {
    let addrs = run(&mut cmd("ip", ["-o", "-4", "addr", "show"]))?;
    let prefix = format!("inet {subnet}.");
    if let Some(line) = addrs.lines().find(|l| l.contains(&prefix)) {
        let dev = line.split_whitespace().nth(1).unwrap_or("?");
        bail!(
            "{subnet}.0/24 is already in use on interface {dev}: another chaos run, or the \
             leftovers of a crashed one (then remove it with `ip link del {dev}` and its \
             namespaces, see `ip netns list`)"
        );
    }
    Ok(())
}

/// The first three octets of a /24 in 10.213.0.0/16 that no interface here uses. Two backends
/// created at the same moment (before either built its bridge) would pick the same one, so the
/// search starts at 0 only for the first backend of a process and is offset for later ones.
fn free_subnet() -> anyhow::Result<String> {
    static INSTANCE: AtomicU32 = AtomicU32::new(0);
    let start = INSTANCE.fetch_add(1, Ordering::Relaxed) * 16;
    let addrs = run(&mut cmd("ip", ["-o", "-4", "addr", "show"]))?;
    for i in 0..256 {
        let subnet = format!("{SUBNET_16}.{}", (start + i) % 256);
        if !addrs.contains(&format!("inet {subnet}.")) {
            return Ok(subnet);
        }
    }
    bail!("every /24 of {SUBNET_16}.0.0/16 is in use on this host (leftovers? see `ip -4 addr`)")
}

/// A tag no interface or namespace on this host uses yet: `dj` + the low 16 bits of our pid in
/// hex, and a counter digit for a second backend in the same process.
fn unique_tag() -> anyhow::Result<String> {
    static INSTANCE: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id() & 0xffff;
    let namespaces = run(&mut cmd("ip", ["netns", "list"]))?;
    for _ in 0..64 {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let tag = if n == 0 { format!("dj{pid:04x}") } else { format!("dj{pid:04x}{}", n % 10) };
        let taken = link_exists(&format!("{tag}br"))
            || IDS.iter().any(|id| link_exists(&format!("{tag}h{id}")))
            || namespaces.lines().any(|l| l.starts_with(&format!("{tag}-")));
        if !taken {
            return Ok(tag);
        }
    }
    bail!("no free name for the network namespaces (too many dj{pid:04x}* leftovers?)")
}

/// `n` distinct loopback ports that are free now, from below Linux's ephemeral range (32768+)
/// so the kernel does not hand one to an outgoing connection before the node binds it.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut rng = rand::rng();
    let mut ports = Vec::with_capacity(n);
    for _ in 0..10_000 {
        if ports.len() == n {
            break;
        }
        let p: u16 = rng.random_range(20_000..32_000);
        if !ports.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok() {
            ports.push(p);
        }
    }
    if ports.len() < n {
        bail!("cannot find {n} free loopback ports in 20000..32000");
    }
    Ok(ports)
}

impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    fn start(&mut self) -> anyhow::Result<()> {
        // Whatever an earlier start left behind (processes, network) goes first.
        self.teardown()?;
        if let Some(net) = &self.net {
            // The nodes' addresses were fixed by new(); if another run took the subnet since,
            // say so rather than fight over it.
            subnet_free(&net.subnet)?;
            self.build_net()?;
        }
        for spec in &self.specs {
            // Empty data directories: a run always founds a new cluster.
            if spec.data_dir.exists() {
                std::fs::remove_dir_all(&spec.data_dir)
                    .with_context(|| format!("cannot remove {}", spec.data_dir.display()))?;
            }
            std::fs::create_dir_all(&spec.data_dir)
                .with_context(|| format!("cannot create {}", spec.data_dir.display()))?;
            // One log per node per run; restarts append to it.
            File::create(&spec.log)
                .with_context(|| format!("cannot create {}", spec.log.display()))?;
        }
        for spec in &self.specs {
            let child = self.spawn(spec)?;
            *self.slot(spec.id)? = Some(child);
        }
        self.wait_listening()
    }

    fn kill(&self, node: u64) -> anyhow::Result<()> {
        let mut slot = self.slot(node)?;
        if let Some(mut child) = slot.take() {
            kill_child(&mut child)?;
        }
        Ok(())
    }

    fn restart(&self, node: u64) -> anyhow::Result<()> {
        let spec = self.spec(node)?;
        let mut slot = self.slot(node)?;
        if running(&mut slot).is_none() {
            *slot = Some(self.spawn(spec)?);
        }
        Ok(())
    }

    fn stop(&self, node: u64) -> anyhow::Result<()> {
        let mut slot = self.slot(node)?;
        let Some(child) = running(&mut slot) else { return Ok(()) };
        let pid = child.id().to_string();
        run(&mut cmd("kill", ["-TERM", &pid]))?;
        // A paused node would sit on the SIGTERM until resumed.
        run(&mut cmd("kill", ["-CONT", &pid]))?;
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if running(&mut slot).is_none() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(mut child) = slot.take() {
            kill_child(&mut child)?;
        }
        Ok(())
    }

    fn pause(&self, node: u64) -> anyhow::Result<()> {
        let Some(pid) = self.signal(node, "STOP")? else {
            bail!("cannot pause node {node}: it is not running");
        };
        // `kill` returns once the signal is queued; the threads stop when one of them takes
        // it, and on a loaded machine the others can serve requests meanwhile. Paused means
        // every thread stopped.
        wait_stopped(pid, Duration::from_secs(5))
            .with_context(|| format!("pausing node {node} (pid {pid})"))
    }

    fn resume(&self, node: u64) -> anyhow::Result<()> {
        // Not running: nothing to resume (a killed node restarts unpaused).
        self.signal(node, "CONT")?;
        Ok(())
    }

    fn can_partition(&self) -> bool {
        self.net.is_some()
    }

    fn cut(&self, pairs: &[(u64, u64)]) -> anyhow::Result<()> {
        let net = self.net("a partition")?;
        for &(a, b) in pairs {
            // Rules on both sides; either side's alone already drops both directions.
            for (me, other) in [(a, b), (b, a)] {
                self.spec(me)?;
                self.spec(other)?;
                let (ns, ip) = (net.ns(me), net.ip(other));
                for (chain, dir) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
                    run(&mut cmd(
                        "ip",
                        [
                            "netns", "exec", &ns, "iptables", "-w", "5", "-A", chain, dir, &ip,
                            "-j", "DROP",
                        ],
                    ))?;
                }
            }
        }
        Ok(())
    }

    fn can_disconnect(&self) -> bool {
        self.net.is_some()
    }

    fn disconnect(&self, node: u64) -> anyhow::Result<()> {
        let net = self.net("disconnecting a node")?;
        self.spec(node)?;
        run(&mut cmd("ip", ["link", "set", &net.host_veth(node), "down"]))?;
        Ok(())
    }

    fn heal(&self) -> anyhow::Result<()> {
        let Some(net) = self.net.as_ref() else {
            // Nothing can have been cut without namespaces.
            return Ok(());
        };
        for id in IDS {
            run(&mut cmd("ip", ["link", "set", &net.host_veth(id), "up"]))?;
            for chain in ["INPUT", "OUTPUT"] {
                run(&mut cmd(
                    "ip",
                    ["netns", "exec", &net.ns(id), "iptables", "-w", "5", "-F", chain],
                ))?;
            }
        }
        Ok(())
    }

    fn collect_logs(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for spec in &self.specs {
            let to = dir.join(format!("node-{}.log", spec.id));
            // Collecting into the work dir itself: the logs are already there.
            if to.canonicalize().ok().as_deref() == Some(spec.log.as_path()) {
                continue;
            }
            std::fs::copy(&spec.log, &to).with_context(|| {
                format!("cannot copy {} to {}", spec.log.display(), to.display())
            })?;
        }
        Ok(())
    }

    fn teardown(&mut self) -> anyhow::Result<()> {
        let mut first_err: Option<anyhow::Error> = None;
        for id in IDS {
            let r = self.slot(id).and_then(|mut slot| match slot.take() {
                // SIGKILL works on a stopped process too; no need to resume it first.
                Some(mut child) => kill_child(&mut child),
                None => Ok(()),
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        if let Err(e) = self.destroy_net() {
            first_err.get_or_insert(e);
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for LocalBackend {
    /// Best-effort teardown, so a panicking test or harness never leaves processes,
    /// namespaces, interfaces or firewall rules behind.
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_follows_the_command_name_whatever_it_holds() {
        assert_eq!(thread_state("42 (delayd) S 1 42"), Some('S'));
        assert_eq!(thread_state("42 (tokio-rt (x) y) T 1 42"), Some('T'));
        assert_eq!(thread_state("42 (delayd"), None);
    }

    #[test]
    fn a_stopped_process_is_seen_stopped_and_a_running_one_is_not() -> anyhow::Result<()> {
        let mut child = Command::new("sleep").arg("30").spawn()?;
        let pid = child.id();
        let running = wait_stopped(pid, Duration::from_millis(20));
        run(&mut cmd("kill", ["-STOP".to_string(), pid.to_string()]))?;
        let stopped = wait_stopped(pid, Duration::from_secs(5));
        kill_child(&mut child)?;
        assert!(running.is_err(), "a sleeping process is not stopped");
        stopped
    }
}
