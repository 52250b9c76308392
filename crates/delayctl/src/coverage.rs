//! Every route of the HTTP API has a delayctl command, or a stated reason not to.
//!
//! [`COVERED`] is the route each command calls, [`NOT_COVERED`] the routes left out on
//! purpose. The tests below read the server's routes from its OpenAPI document
//! (`crates/delayd-server/src/http/openapi.json`, which the server's tests hold equal to its
//! router) and fail when a route is in neither list — a new endpoint without a command — or when a list names a route the
//! server no longer has; they also check that each command exists and that the table in
//! `docs/delayctl.md` says the same as these lists.

/// `(method, route, command)`: the route each command calls (`peek` calls two: with a job
/// id, and without one).
pub const COVERED: &[(&str, &str, &str)] = &[
    ("GET", "/health", "health"),
    ("GET", "/ready", "ready"),
    ("GET", "/admin/cluster", "cluster status"),
    ("GET", "/admin/queues", "queues"),
    ("POST", "/admin/nodes", "cluster add"),
    ("POST", "/admin/nodes/{id}/promote", "cluster promote"),
    ("DELETE", "/admin/nodes/{id}", "cluster remove"),
    ("POST", "/admin/leader", "cluster transfer"),
    ("POST", "/admin/snapshot", "cluster snapshot"),
    ("GET", "/admin/snapshot", "snapshot save"),
    ("GET", "/admin/digest", "cluster digest"),
    ("POST", "/token/{ns}", "token create"),
    ("GET", "/token/{ns}", "token list"),
    ("DELETE", "/token/{ns}/{token}", "token delete"),
    ("PUT", "/api/{ns}/{q}", "publish"),
    ("GET", "/api/{ns}/{q}", "consume"),
    ("DELETE", "/api/{ns}/{q}", "destroy"),
    ("PUT", "/api/{ns}/{q}/bulk", "bulk"),
    ("GET", "/api/{ns}/{q}/job/{id}", "peek"),
    ("PUT", "/api/{ns}/{q}/job/{id}", "republish"),
    ("DELETE", "/api/{ns}/{q}/job/{id}", "ack"),
    ("PATCH", "/api/{ns}/{q}/job/{id}", "update"),
    ("PUT", "/api/{ns}/{q}/job/{id}/release", "release"),
    ("PUT", "/api/{ns}/{q}/job/{id}/touch", "touch"),
    ("PUT", "/api/{ns}/{q}/job/{id}/bury", "bury"),
    ("GET", "/api/{ns}/{q}/key/{key}", "key show"),
    ("DELETE", "/api/{ns}/{q}/key/{key}", "key cancel"),
    ("GET", "/api/{ns}/{q}/peek", "peek"),
    ("GET", "/api/{ns}/{q}/size", "size"),
    ("GET", "/api/{ns}/{q}/stats", "stats"),
    ("PUT", "/api/{ns}/{q}/pause", "pause"),
    ("DELETE", "/api/{ns}/{q}/pause", "resume"),
    ("GET", "/api/{ns}/{q}/deadletter", "deadletter head"),
    ("PUT", "/api/{ns}/{q}/deadletter", "deadletter respawn"),
    ("DELETE", "/api/{ns}/{q}/deadletter", "deadletter purge"),
    ("GET", "/api/{ns}/{q}/deadletter/size", "deadletter size"),
    ("GET", "/api/{ns}/{q}/deadletter/jobs", "deadletter peek"),
    ("PUT", "/api/{ns}/{q}/webhook", "webhook set"),
    ("GET", "/api/{ns}/{q}/webhook", "webhook show"),
    ("DELETE", "/api/{ns}/{q}/webhook", "webhook delete"),
    ("GET", "/api/{ns}/{q}/schedules", "schedule list"),
    ("PUT", "/api/{ns}/{q}/schedules/{name}", "schedule set"),
    ("GET", "/api/{ns}/{q}/schedules/{name}", "schedule show"),
    ("DELETE", "/api/{ns}/{q}/schedules/{name}", "schedule delete"),
];

/// `(method, route, why)`: the routes no command calls, on purpose.
pub const NOT_COVERED: &[(&str, &str, &str)] = &[
    ("GET", "/metrics", "Prometheus text for a scraper, not an action"),
    ("GET", "/openapi.json", "the API's machine-readable description, for tools"),
    ("GET", "/dashboard", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/app.js", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/style.css", "the web dashboard's files, for a browser"),
    ("GET", "/debug/clock", "test-only (`--debug-clock`), for the chaos harness"),
    ("PUT", "/debug/clock", "test-only (`--debug-clock`), for the chaos harness"),
];

/// The server's OpenAPI document. delayd-server's own tests hold it equal to the router in
/// both directions, so every route of the server is in it and nothing else is.
const OPENAPI: &str = include_str!("../../delayd-server/src/http/openapi.json");

/// The reference page, whose table must match the lists above.
const DOCS: &str = include_str!("../../../docs/delayctl.md");

/// The HTTP methods an OpenAPI path item may hold, lowercase as the document spells them.
const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options", "trace"];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    use super::*;

    type Route = (String, String);

    fn listed(list: &[(&str, &str, &str)]) -> BTreeSet<Route> {
        list.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect()
    }

    /// Every route of the server, from its OpenAPI document.
    fn server_routes() -> Result<BTreeSet<Route>, String> {
        let doc: serde_json::Value =
            serde_json::from_str(OPENAPI).map_err(|e| format!("openapi.json: {e}"))?;
        let paths = doc["paths"].as_object().ok_or("openapi.json has no `paths` object")?;
        let mut routes = BTreeSet::new();
        for (path, item) in paths {
            let item = item.as_object().ok_or_else(|| format!("{path}: not an object"))?;
            for method in item.keys().filter(|m| METHODS.contains(&m.as_str())) {
                routes.insert((method.to_uppercase(), path.clone()));
            }
        }
        if routes.len() < 20 {
            return Err(format!("only {} routes read: has the document moved?", routes.len()));
        }
        Ok(routes)
    }

    #[test]
    fn every_route_has_a_command_or_a_reason() -> Result<(), String> {
        let server = server_routes()?;
        let covered = listed(COVERED);
        let excluded = listed(NOT_COVERED);
        let both: Vec<_> = covered.intersection(&excluded).collect();
        assert!(both.is_empty(), "both covered and not: {both:?}");
        let known: BTreeSet<Route> = covered.union(&excluded).cloned().collect();
        let missing: Vec<_> = server.difference(&known).collect();
        assert!(
            missing.is_empty(),
            "routes with no delayctl command: {missing:?} — add a command and list it in \
             COVERED (and docs/delayctl.md), or list it in NOT_COVERED with the reason"
        );
        let stale: Vec<_> = known.difference(&server).collect();
        assert!(stale.is_empty(), "listed but not in the server's router: {stale:?}");
        Ok(())
    }

    #[test]
    fn every_covering_command_exists() {
        let cli = crate::cli::Cli::command();
        for (method, path, command) in COVERED {
            let mut cmd = &cli;
            for word in command.split(' ') {
                match cmd.find_subcommand(word) {
                    Some(sub) => cmd = sub,
                    None => panic!("{method} {path}: no command `delayctl {command}`"),
                }
            }
        }
    }

    /// The table rows of `docs/delayctl.md`: `| `METHOD` | `/route` | what |`.
    fn doc_rows() -> Vec<(String, String, String)> {
        DOCS.lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.trim().strip_prefix('|')?.split('|').collect();
                let [method, path, what, ..] = cells.as_slice() else { return None };
                let method = method.trim().strip_prefix('`')?.strip_suffix('`')?;
                let path = path.trim().strip_prefix('`')?.strip_suffix('`')?;
                METHODS
                    .contains(&method.to_lowercase().as_str())
                    .then(|| (method.to_string(), path.to_string(), what.trim().to_string()))
            })
            .collect()
    }

    #[test]
    fn the_reference_page_maps_every_route() {
        let rows = doc_rows();
        for (method, path, command) in COVERED {
            let want = format!("`delayctl {command}`");
            assert!(
                rows.iter().any(|(m, p, what)| m == method && p == path && *what == want),
                "docs/delayctl.md has no row `| `{method}` | `{path}` | {want} |`"
            );
        }
        for (method, path, _) in NOT_COVERED {
            assert!(
                rows.iter()
                    .any(|(m, p, what)| m == method && p == path && what.starts_with("none")),
                "docs/delayctl.md has no row `| `{method}` | `{path}` | none: <why> |`"
            );
        }
        assert_eq!(rows.len(), COVERED.len() + NOT_COVERED.len(), "extra rows: {rows:?}");
    }
}
