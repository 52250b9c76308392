//! The deploy files under `deploy/`, checked for what makes them work rather than parse:
//!
//! - the Kubernetes StatefulSet (`deploy/kubernetes/delayd.yaml`): an odd number of voters
//!   started together, a headless service that publishes not-ready pods, node ids from the
//!   pod ordinals that match the peers list (the init container's script is run for each
//!   pod), ports and probes on delayd's real ports and endpoints, every setting a real one,
//!   credentials from the Secret's keys, a grace period longer than a drain;
//! - the systemd unit (`deploy/systemd/delayd.service`): real flags and variables, a stop
//!   timeout longer than a drain, not `Type=notify` (delayd does not notify), and no directive
//!   `systemd-analyze verify` rejects.
//!
//! Setting names are those `delayd --help` shows (flags and `DELAYD_*` variables, from clap,
//! the source of truth), and defaults are those of `delayd.example.toml`, which a unit test of
//! the binary keeps equal to the real ones.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use delayd_tests::delayd_bin;
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(repo().join(path)).with_context(|| format!("read {path}"))
}

// ---- delayd's settings ----

/// What `delayd --help` lists, and the defaults of `delayd.example.toml`.
struct Settings {
    flags: BTreeSet<String>,
    env: BTreeSet<String>,
    subcommands: BTreeSet<String>,
    defaults: BTreeMap<String, String>,
}

impl Settings {
    fn load() -> Result<Settings> {
        let out = Command::new(delayd_bin()?).arg("--help").output()?;
        ensure!(out.status.success(), "delayd --help failed");
        let help = String::from_utf8(out.stdout)?;
        let mut flags = BTreeSet::new();
        let mut env = BTreeSet::new();
        let mut subcommands = BTreeSet::new();
        let mut in_commands = false;
        for line in help.lines() {
            if line.starts_with("Commands:") {
                in_commands = true;
                continue;
            }
            if in_commands {
                match line.split_whitespace().next() {
                    Some(cmd) if line.starts_with("  ") => {
                        subcommands.insert(cmd.to_string());
                    }
                    _ => in_commands = false,
                }
            }
            for word in line.split_whitespace() {
                if let Some(flag) = word.strip_prefix("--") {
                    let flag = flag.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                    if !flag.is_empty() {
                        flags.insert(flag.to_string());
                    }
                }
            }
            let mut rest = line;
            while let Some(at) = rest.find("[env: ") {
                let var = &rest[at + 6..];
                let end = var.find(['=', ']']).context("unterminated [env: ...]")?;
                env.insert(var[..end].to_string());
                rest = &var[end..];
            }
        }
        // Every key of the example, set or commented out (`# key = value`).
        let mut defaults = BTreeMap::new();
        for line in read("delayd.example.toml")?.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some((key, value)) = line.split_once(" = ") {
                if key.chars().all(|c| c.is_ascii_lowercase() || c == '_') && !key.is_empty() {
                    defaults.insert(key.to_string(), value.trim().trim_matches('"').to_string());
                }
            }
        }
        let s = Settings { flags, env, subcommands, defaults };
        // The parse found what it must (not vacuous): both spellings of known settings.
        for (flag, var) in [("node-id", "DELAYD_NODE_ID"), ("peers", "DELAYD_PEERS")] {
            ensure!(s.flags.contains(flag) && s.env.contains(var), "delayd --help: no {flag}");
        }
        ensure!(s.subcommands.contains("probe"), "delayd --help lists no probe command");
        Ok(s)
    }

    /// The default of `key` in the example file, parsed.
    fn default<T: std::str::FromStr>(&self, key: &str) -> Result<T> {
        let v = self.defaults.get(key).with_context(|| format!("no default for {key}"))?;
        v.parse().map_err(|_| anyhow::anyhow!("the default of {key} ({v:?}) does not parse"))
    }

    /// Checks that `var` names a setting: a `DELAYD_*` variable delayd reads, or `RUST_LOG`.
    fn check_env(&self, var: &str) -> Result<()> {
        ensure!(self.env.contains(var), "{var} is not a variable delayd reads");
        Ok(())
    }

    /// Checks every `--flag` in `args`; returns the flags with their values.
    fn check_args(&self, args: &[String]) -> Result<BTreeMap<String, String>> {
        let mut seen = BTreeMap::new();
        let mut it = args.iter().peekable();
        while let Some(arg) = it.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                bail!("{arg:?}: only --flags are expected here");
            };
            let (flag, value) = match flag.split_once('=') {
                Some((f, v)) => (f.to_string(), v.to_string()),
                None => {
                    let value = it.next_if(|v| !v.starts_with("--")).cloned().unwrap_or_default();
                    (flag.to_string(), value)
                }
            };
            ensure!(self.flags.contains(&flag), "--{flag} is not a delayd flag");
            seen.insert(flag, value);
        }
        Ok(seen)
    }
}

/// A setting of one key: its value from an environment variable, else its default.
fn setting(env: &BTreeMap<String, String>, s: &Settings, key: &str) -> Result<String> {
    let var = format!("DELAYD_{}", key.to_ascii_uppercase());
    match env.get(&var) {
        Some(v) => Ok(v.clone()),
        None => s.default::<String>(key),
    }
}

/// The port of a `host:port` address.
fn port(addr: &str) -> Result<i64> {
    let (_, p) = addr.rsplit_once(':').with_context(|| format!("{addr} has no port"))?;
    p.parse().with_context(|| format!("bad port in {addr}"))
}

/// A duration setting in ms from `env` or the defaults.
fn millis(env: &BTreeMap<String, String>, s: &Settings, key: &str) -> Result<i64> {
    setting(env, s, key)?.parse().with_context(|| format!("{key} is not a number"))
}

// ---- Kubernetes ----

fn str_of<'y>(y: &'y Yaml, what: &str) -> Result<&'y str> {
    y.as_str().with_context(|| format!("{what} is not a string: {y:?}"))
}

fn int_of(y: &Yaml, what: &str) -> Result<i64> {
    y.as_i64().with_context(|| format!("{what} is not an integer: {y:?}"))
}

fn list_of<'y>(y: &'y Yaml, what: &str) -> Result<&'y Vec<Yaml>> {
    y.as_vec().with_context(|| format!("{what} is not a list: {y:?}"))
}

/// The string map at `y` (labels, selectors).
fn labels(y: &Yaml, what: &str) -> Result<BTreeMap<String, String>> {
    let map = y.as_hash().with_context(|| format!("{what} is not a map: {y:?}"))?;
    map.iter()
        .map(|(k, v)| Ok((str_of(k, what)?.to_string(), str_of(v, what)?.to_string())))
        .collect()
}

/// Whether every label of `selector` is in `labels` with the same value.
fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The documents of a YAML file, by `kind/name`.
fn manifests(path: &str) -> Result<BTreeMap<String, Yaml>> {
    let docs = YamlLoader::load_from_str(&read(path)?).with_context(|| format!("{path}: YAML"))?;
    let mut out = BTreeMap::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        let key =
            format!("{}/{}", str_of(&d["kind"], "kind")?, str_of(&d["metadata"]["name"], "name")?);
        ensure!(out.insert(key.clone(), d).is_none(), "{path}: {key} twice");
    }
    Ok(out)
}

/// The named container or init container of a pod spec.
fn container<'y>(pod: &'y Yaml, list: &str, name: &str) -> Result<&'y Yaml> {
    list_of(&pod[list], list)?
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .with_context(|| format!("no {list} entry named {name}"))
}

/// A container's `env` as name → literal value (`valueFrom` entries map to "").
fn env_of(c: &Yaml) -> Result<Vec<(String, String, bool)>> {
    let mut out = Vec::new();
    for e in list_of(&c["env"], "env")? {
        let name = str_of(&e["name"], "env name")?.to_string();
        let from_field = !e["valueFrom"].is_badvalue();
        let value = e["value"].as_str().unwrap_or_default().to_string();
        out.push((name, value, from_field));
    }
    Ok(out)
}

/// Kubernetes' `$(VAR)` expansion of `value` with `vars`.
fn expand(value: &str, vars: &BTreeMap<&str, String>) -> String {
    vars.iter().fold(value.to_string(), |v, (k, x)| v.replace(&format!("$({k})"), x))
}

/// The named container port of `c`.
fn container_port(c: &Yaml, name: &str) -> Result<i64> {
    let ports = list_of(&c["ports"], "ports")?;
    let p = ports.iter().find(|p| p["name"].as_str() == Some(name));
    int_of(&p.with_context(|| format!("no container port named {name}"))?["containerPort"], name)
}

/// A service port's target, resolved against the container's named ports.
fn target_port(service_port: &Yaml, c: &Yaml) -> Result<i64> {
    let target = &service_port["targetPort"];
    match (target.as_str(), target.as_i64()) {
        (Some(name), _) => container_port(c, name),
        (None, Some(n)) => Ok(n),
        _ => int_of(&service_port["port"], "port"),
    }
}

#[test]
fn the_statefulset_forms_a_cluster_from_its_pods() -> Result<()> {
    let s = Settings::load()?;
    let m = manifests("deploy/kubernetes/delayd.yaml")?;
    let sts = m
        .iter()
        .find(|(k, _)| k.starts_with("StatefulSet/"))
        .map(|(_, v)| v)
        .context("no StatefulSet")?;
    let sts_name = str_of(&sts["metadata"]["name"], "name")?;
    let spec = &sts["spec"];
    let pod = &spec["template"]["spec"];
    let pod_labels = labels(&spec["template"]["metadata"]["labels"], "pod labels")?;

    // An odd number of voters, started all at once (one by one, each waiting to be ready,
    // the first would wait forever for a quorum).
    let replicas = int_of(&spec["replicas"], "replicas")?;
    ensure!(replicas >= 3 && replicas % 2 == 1, "replicas {replicas}: an odd number, 3 or more");
    ensure!(str_of(&spec["podManagementPolicy"], "podManagementPolicy")? == "Parallel");
    ensure!(selects(&labels(&spec["selector"]["matchLabels"], "selector")?, &pod_labels));
    // Spread over hosts: the anti-affinity term names these pods.
    let spread =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    let term = &list_of(spread, "podAntiAffinity")?[0]["podAffinityTerm"];
    ensure!(selects(&labels(&term["labelSelector"]["matchLabels"], "anti-affinity")?, &pod_labels));

    // The governing service is headless, in this file, and publishes pods before they are
    // ready (they must reach each other to become ready).
    let peers_service = str_of(&spec["serviceName"], "serviceName")?;
    let headless = m
        .get(&format!("Service/{peers_service}"))
        .with_context(|| format!("serviceName {peers_service} is not a Service of the file"))?;
    ensure!(str_of(&headless["spec"]["clusterIP"], "clusterIP")? == "None", "not headless");
    ensure!(headless["spec"]["publishNotReadyAddresses"].as_bool() == Some(true));
    ensure!(selects(&labels(&headless["spec"]["selector"], "selector")?, &pod_labels));

    // The container, its settings and its ports.
    let c = container(pod, "containers", "delayd")?;
    let command: Vec<String> = list_of(&c["command"], "command")?
        .iter()
        .map(|a| str_of(a, "command").map(str::to_string))
        .collect::<Result<_>>()?;
    ensure!(command == ["/delayd"], "the image's binary is /delayd, not {command:?}");
    let args: Vec<String> = list_of(&c["args"], "args")?
        .iter()
        .map(|a| str_of(a, "arg").map(str::to_string))
        .collect::<Result<_>>()?;
    let flags = s.check_args(&args)?;
    let env = env_of(c)?;
    let mut settings = BTreeMap::new();
    let mut vars: BTreeMap<&str, String> = BTreeMap::new();
    for (name, value, from_field) in &env {
        if name.starts_with("DELAYD_") || name == "RUST_LOG" {
            s.check_env(name)?;
            // Kubernetes expands only variables defined earlier in the list.
            for var in value.split("$(").skip(1).filter_map(|v| v.split_once(')')) {
                ensure!(vars.contains_key(var.0), "{name} uses $({}) before it is defined", var.0);
            }
            settings.insert(name.clone(), value.clone());
        } else {
            ensure!(*from_field, "{name}: a helper variable should come from the pod (fieldRef)");
            vars.insert(name.as_str(), String::new());
        }
    }
    for (key, port_name) in [("http_addr", "http"), ("grpc_addr", "grpc")] {
        let addr = setting(&settings, &s, key)?;
        ensure!(port(&addr)? == container_port(c, port_name)?, "{key} {addr} vs port {port_name}");
    }
    let grpc_port = container_port(c, "grpc")?;
    let headless_ports = list_of(&headless["spec"]["ports"], "ports")?;
    ensure!(
        headless_ports.iter().any(|p| target_port(p, c).ok() == Some(grpc_port)),
        "the headless service does not carry the gRPC port the peers replicate over"
    );
    // The client service (any other Service) selects the pods and reaches real ports.
    let clients: Vec<&Yaml> = m
        .iter()
        .filter(|(k, _)| k.starts_with("Service/") && *k != &format!("Service/{peers_service}"))
        .map(|(_, v)| v)
        .collect();
    ensure!(!clients.is_empty(), "no client service");
    let container_ports: BTreeSet<i64> =
        ["http", "grpc"].iter().map(|n| container_port(c, n)).collect::<Result<_>>()?;
    for svc in clients {
        ensure!(selects(&labels(&svc["spec"]["selector"], "selector")?, &pod_labels));
        for p in list_of(&svc["spec"]["ports"], "ports")? {
            ensure!(
                container_ports.contains(&target_port(p, c)?),
                "a service port reaches nothing"
            );
        }
    }

    // Probes: readiness on /ready, liveness on /health, on the HTTP port.
    for (probe, path) in [("readinessProbe", "/ready"), ("livenessProbe", "/health")] {
        let get = &c[probe]["httpGet"];
        ensure!(str_of(&get["path"], probe)? == path, "{probe} must ask {path}");
        let port = match (get["port"].as_str(), get["port"].as_i64()) {
            (Some(name), _) => container_port(c, name)?,
            (None, Some(n)) => n,
            _ => bail!("{probe} has no port"),
        };
        ensure!(port == container_port(c, "http")?, "{probe} is not on the HTTP port");
    }

    // Node ids: the init container's script, run for every pod name, writes a node_id that
    // the peers list names at this pod's address, and delayd reads the file it writes.
    let config_path = flags.get("config").context("no --config: where would node_id come from?")?;
    let config_dir = Path::new(config_path).parent().context("config path")?;
    let init = container(pod, "initContainers", "node-id")?;
    let script = str_of(&list_of(&init["command"], "command")?[2], "script")?;
    let mounted_at = |c: &Yaml, volume: &str| -> Result<String> {
        let mounts = list_of(&c["volumeMounts"], "volumeMounts")?;
        let m = mounts.iter().find(|m| m["name"].as_str() == Some(volume));
        Ok(str_of(&m.with_context(|| format!("{volume} not mounted"))?["mountPath"], "path")?
            .to_string())
    };
    let node_volume = list_of(&c["volumeMounts"], "volumeMounts")?
        .iter()
        .find(|m| m["mountPath"].as_str() == config_dir.to_str())
        .and_then(|m| m["name"].as_str())
        .context("the --config directory is no volume")?;
    ensure!(mounted_at(init, node_volume)? == config_dir.to_string_lossy());
    let peers = delayd_peers(&setting(&settings, &s, "peers")?)?;
    ensure!(
        peers.keys().copied().eq(1..=replicas as u64),
        "the peers list must name nodes 1..={replicas}: {peers:?}"
    );
    let work = tempfile::tempdir()?;
    for ordinal in 0..replicas {
        let pod_name = format!("{sts_name}-{ordinal}");
        let script = script.replace(&*config_dir.to_string_lossy(), &work.path().to_string_lossy());
        let out = Command::new("sh").arg("-c").arg(&script).env("POD_NAME", &pod_name).output()?;
        ensure!(out.status.success(), "the init script failed for {pod_name}: {out:?}");
        let written_path = work.path().join(Path::new(config_path).file_name().context("name")?);
        let written = std::fs::read_to_string(&written_path)?;
        let mut node_id = None;
        for line in written.lines().filter(|l| !l.trim().is_empty()) {
            let (key, value) = line.split_once(" = ").context("not `key = value`")?;
            ensure!(s.defaults.contains_key(key), "{key} in the node's file is no setting");
            if key == "node_id" {
                node_id = Some(value.trim().parse::<u64>()?);
            }
        }
        let id = node_id.with_context(|| format!("no node_id for {pod_name}: {written:?}"))?;
        ensure!(id == ordinal as u64 + 1, "{pod_name} gets node id {id}");
        let expected = format!("{pod_name}.{peers_service}:{grpc_port}");
        ensure!(peers[&id] == expected, "peer {id} is {}, not {expected}", peers[&id]);
        let vars = BTreeMap::from([("POD_NAME", pod_name.clone())]);
        let advertised = expand(&setting(&settings, &s, "advertise_addr")?, &vars);
        ensure!(advertised == expected, "{pod_name} advertises {advertised}, not {expected}");
    }

    // A stop drains before the kubelet kills.
    let grace = int_of(&pod["terminationGracePeriodSeconds"], "terminationGracePeriodSeconds")?;
    let stop_ms =
        millis(&settings, &s, "drain_timeout_ms")? + millis(&settings, &s, "transfer_timeout_ms")?;
    ensure!(grace * 1000 >= 2 * stop_ms, "grace {grace}s is too short for a {stop_ms} ms stop");

    // Data on the claim template's volume; the credentials from the Secret's keys.
    let data_volume =
        str_of(&list_of(&spec["volumeClaimTemplates"], "claims")?[0]["metadata"]["name"], "claim")?;
    ensure!(
        flags.get("data-dir") == Some(&mounted_at(c, data_volume)?),
        "data dir not on the claim"
    );
    let secret = manifests("deploy/kubernetes/credentials.example.yaml")?;
    let (secret_key, secret) = secret.iter().next().context("no Secret")?;
    let secret_name = str_of(&secret["metadata"]["name"], "name")?;
    let keys: BTreeSet<String> = labels(&secret["stringData"], "stringData")?.into_keys().collect();
    let header = read("deploy/kubernetes/delayd.yaml")?;
    let volumes = list_of(&pod["volumes"], "volumes")?;
    let secret_volume = volumes
        .iter()
        .find(|v| v["secret"]["secretName"].as_str() == Some(secret_name))
        .and_then(|v| v["name"].as_str())
        .with_context(|| format!("{secret_key} is not mounted"))?;
    let secret_dir = mounted_at(c, secret_volume)?;
    for key in ["admin_token_file", "cluster_secret_file"] {
        let file = setting(&settings, &s, key)?;
        let name = file
            .strip_prefix(&format!("{secret_dir}/"))
            .with_context(|| format!("{key} {file} is not in the Secret's mount"))?;
        ensure!(keys.contains(name), "{key}: the Secret has no key {name}");
        ensure!(
            header.contains(&format!("--from-literal={name}=")),
            "the header's command lacks {name}"
        );
    }
    ensure!(header.contains(&format!("create secret generic {secret_name}")));

    // The disruption budget keeps a quorum.
    let pdb = m.iter().find(|(k, _)| k.starts_with("PodDisruptionBudget/")).context("no PDB")?.1;
    let max_unavailable = int_of(&pdb["spec"]["maxUnavailable"], "maxUnavailable")?;
    ensure!(max_unavailable >= 1 && max_unavailable <= (replicas - 1) / 2);
    ensure!(selects(&labels(&pdb["spec"]["selector"]["matchLabels"], "selector")?, &pod_labels));
    Ok(())
}

/// The `--peers` list, `id=host:port,...`.
fn delayd_peers(list: &str) -> Result<BTreeMap<u64, String>> {
    list.split(',')
        .map(|p| {
            let (id, addr) = p.trim().split_once('=').with_context(|| format!("peer {p}"))?;
            Ok((id.parse()?, addr.to_string()))
        })
        .collect()
}

// ---- systemd ----

/// The unit's `[Service]` directives, in order (a key may repeat).
fn service_section(unit: &str) -> Vec<(String, String)> {
    let mut section = "";
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if let (Some((k, v)), "[Service]") = (line.split_once('='), section) {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

#[test]
fn the_systemd_unit_runs_delayd_with_real_settings() -> Result<()> {
    let s = Settings::load()?;
    let unit = read("deploy/systemd/delayd.service")?;
    let service = service_section(&unit);
    let get = |key: &str| service.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());

    let exec = get("ExecStart").context("no ExecStart")?;
    let mut words = exec.split_whitespace().map(str::to_string);
    let bin = words.next().context("empty ExecStart")?;
    ensure!(bin.ends_with("/delayd") && bin.starts_with('/'), "ExecStart runs {bin}");
    let flags = s.check_args(&words.collect::<Vec<_>>())?;
    ensure!(flags.contains_key("config"), "ExecStart names no --config");
    let mut env = BTreeMap::new();
    for (_, assignment) in service.iter().filter(|(k, _)| k == "Environment") {
        let (var, value) = assignment.split_once('=').context("Environment=VAR=value")?;
        s.check_env(var)?;
        env.insert(var.to_string(), value.to_string());
    }
    ensure!(!env.contains_key("DELAYD_ADMIN_TOKEN"), "a credential in the unit, not in a file");

    // delayd does not notify systemd; runs unprivileged; stops before SIGKILL.
    let kind = get("Type").unwrap_or("simple");
    ensure!(kind == "simple" || kind == "exec", "Type={kind}: delayd speaks no sd_notify");
    ensure!(get("User").is_some_and(|u| u != "root"), "runs as root");
    let stop_s: i64 = get("TimeoutStopSec").context("no TimeoutStopSec")?.parse()?;
    let stop_ms = millis(&env, &s, "drain_timeout_ms")? + millis(&env, &s, "transfer_timeout_ms")?;
    ensure!(stop_s * 1000 >= 2 * stop_ms, "TimeoutStopSec={stop_s} is too short for {stop_ms} ms");
    let data_dir = flags.get("data-dir").context("no --data-dir")?;
    let state = get("StateDirectory").context("no StateDirectory")?;
    ensure!(*data_dir == format!("/var/lib/{state}"), "--data-dir is not the StateDirectory");

    // systemd's own check, where systemd is installed: no unknown or misspelled directive.
    // The binary's path is pointed at the real binary (the unit's is not installed here).
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not found: systemd's own check skipped");
        return Ok(());
    };
    ensure!(out.status.success(), "systemd-analyze --version failed");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("delayd.service");
    let real = delayd_bin()?.canonicalize()?;
    std::fs::write(&path, unit.replace(&bin, &real.to_string_lossy()))?;
    let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify: {stderr}");
    Ok(())
}
