//! Every route of the HTTP API has a delayctl command, or a stated reason not to.
//!
//! [`COVERED`] is the route each command calls, [`NOT_COVERED`] the routes left out on
//! purpose. The tests below read the route table from the server's source
//! (`crates/delayd-server/src/http/mod.rs` and the routers it merges) and fail when a route
//! is in neither list — a new endpoint without a command — or when a list names a route the
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
    ("GET", "/dashboard", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/app.js", "the web dashboard's files, for a browser"),
    ("GET", "/dashboard/style.css", "the web dashboard's files, for a browser"),
    ("GET", "/debug/clock", "test-only (`--debug-clock`), for the chaos harness"),
    ("PUT", "/debug/clock", "test-only (`--debug-clock`), for the chaos harness"),
];

/// The server's route table and the routers it merges, as source text.
const ROUTER_SOURCES: &[(&str, &str)] = &[
    ("http/mod.rs", include_str!("../../delayd-server/src/http/mod.rs")),
    ("http/dashboard.rs", include_str!("../../delayd-server/src/http/dashboard.rs")),
];

/// What `mod.rs` may merge: the routers whose source [`ROUTER_SOURCES`] holds.
const MERGED: &[&str] = &["dashboard::routes()"];

/// The reference page, whose table must match the lists above.
const DOCS: &str = include_str!("../../../docs/delayctl.md");

/// A token of Rust source, as far as reading route tables needs.
#[derive(Debug, PartialEq)]
enum Token {
    Str(String),
    Ident(String),
    Punct(char),
}

/// Splits Rust source into string literals, identifiers and punctuation, leaving out
/// comments, whitespace and character literals.
fn lex(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
        } else if c == '"' {
            let mut text = String::new();
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if let Some(&ch) = chars.get(i) {
                    text.push(ch);
                }
                i += 1;
            }
            i += 1;
            tokens.push(Token::Str(text));
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // A character literal such as '(' must not count as a parenthesis.
            i += 3;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

/// The axum method routers a route can be made of.
const METHODS: &[&str] = &["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/// What a router's source declares: its `(method, route)` pairs, and what it merges or nests
/// (`dashboard::routes()`), which the caller must read too.
#[derive(Debug, Default)]
struct RouteTable {
    routes: Vec<(String, String)>,
    merged: Vec<String>,
}

/// Reads every `.route("/path", get(..).put(..))` of `source`; refuses what it cannot read
/// (a route without a method it knows, `any`, `on`, `route_service`), so that a change of
/// style fails the test rather than hiding a route.
fn route_table(source: &str) -> Result<RouteTable, String> {
    let tokens = lex(source);
    let mut table = RouteTable::default();
    let mut i = 0;
    while i + 2 < tokens.len() {
        let (Token::Punct('.'), Token::Ident(call), Token::Punct('(')) =
            (&tokens[i], &tokens[i + 1], &tokens[i + 2])
        else {
            i += 1;
            continue;
        };
        match call.as_str() {
            "route" => {}
            "merge" | "nest" | "nest_service" => {
                let (text, end) = until_close(&tokens, i + 3);
                table.merged.push(text);
                i = end;
                continue;
            }
            "route_service" | "route_layer" => {
                return Err(format!(".{call}(...) is not read by this test: teach it"));
            }
            _ => {
                i += 1;
                continue;
            }
        }
        let Some(Token::Str(path)) = tokens.get(i + 3) else {
            return Err(format!(
                "a .route( whose path is not a string literal: {:?}",
                &tokens[i..]
            ));
        };
        let mut depth = 1;
        let mut j = i + 4;
        let mut methods = Vec::new();
        while j < tokens.len() && depth > 0 {
            match &tokens[j] {
                Token::Punct('(') => depth += 1,
                Token::Punct(')') => depth -= 1,
                Token::Ident(name)
                    if depth == 1 && tokens.get(j + 1) == Some(&Token::Punct('(')) =>
                {
                    if METHODS.contains(&name.as_str()) {
                        methods.push(name.to_uppercase());
                    } else if matches!(name.as_str(), "any" | "on" | "any_service" | "on_service") {
                        return Err(format!("route {path}: {name}(...) is not read by this test"));
                    }
                }
                _ => {}
            }
            j += 1;
        }
        if methods.is_empty() {
            return Err(format!("route {path}: no method found"));
        }
        table.routes.extend(methods.into_iter().map(|m| (m, path.clone())));
        i = j;
    }
    Ok(table)
}

/// The tokens from `start` to the parenthesis that closes the one before it, as compact
/// text (`dashboard::routes()`), and the index after it.
fn until_close(tokens: &[Token], start: usize) -> (String, usize) {
    let mut depth = 1;
    let mut text = String::new();
    let mut j = start;
    while j < tokens.len() {
        match &tokens[j] {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            break;
        }
        match &tokens[j] {
            Token::Str(s) => text.push_str(&format!("{s:?}")),
            Token::Ident(s) => text.push_str(s),
            Token::Punct(c) => text.push(*c),
        }
        j += 1;
    }
    (text, j + 1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::CommandFactory;

    use super::*;

    type Route = (String, String);

    fn listed(list: &[(&str, &str, &str)]) -> BTreeSet<Route> {
        list.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect()
    }

    /// Every route of the server, from its source.
    fn server_routes() -> Result<BTreeSet<Route>, String> {
        let mut routes = BTreeSet::new();
        for (file, source) in ROUTER_SOURCES {
            let table = route_table(source).map_err(|e| format!("{file}: {e}"))?;
            for merged in &table.merged {
                if !MERGED.contains(&merged.as_str()) {
                    return Err(format!(
                        "{file} merges or nests {merged}, whose routes this test does not read: \
                         add its source to ROUTER_SOURCES and MERGED"
                    ));
                }
            }
            routes.extend(table.routes);
        }
        if routes.len() < 20 {
            return Err(format!("only {} routes read: has the route table moved?", routes.len()));
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

    #[test]
    fn the_reader_finds_routes_however_they_are_written() -> Result<(), String> {
        let source = r#"
            // .route("/commented", get(x))
            Router::new()
                .route("/a", get(h::a).put(h::b)) /* .route("/b", get(x)) */
                .route(
                    "/c/{id}",
                    delete(|| async { f("(", ')') }).patch(h::c),
                )
                .route("/d", put(h::d).layer(limit))
                .merge(other::routes())
        "#;
        let table = route_table(source)?;
        let want: Vec<(String, String)> = [
            ("GET", "/a"),
            ("PUT", "/a"),
            ("DELETE", "/c/{id}"),
            ("PATCH", "/c/{id}"),
            ("PUT", "/d"),
        ]
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
        assert_eq!(table.routes, want);
        assert_eq!(table.merged, ["other::routes()"]);
        assert!(route_table(r#".route("/x", any(h))"#).is_err());
        assert!(route_table(r#".route("/x", h)"#).is_err());
        assert!(route_table(r#".route_service("/x", s)"#).is_err());
        Ok(())
    }
}
