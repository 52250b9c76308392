//! `GET /openapi.json`: the HTTP API described in OpenAPI 3.1, for client generators and API
//! browsers.
//!
//! The document is a checked-in file (`openapi.json` beside this one), written by hand and
//! served as it is: no code generation, nothing computed per request. It is kept true by the
//! tests below, which hold it against the route table ([`super::routes`]): every route of the
//! router must be in the document with its method, and the document may name no route the
//! router lacks. Each operation also names its authorization scope (`x-delayd-scope`), which
//! `tests/openapi.rs` checks against a running node.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

/// The OpenAPI document, as checked in.
pub const DOCUMENT: &str = include_str!("openapi.json");

/// `GET /openapi.json`: the document, without a credential.
pub(crate) async fn serve() -> Response {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT).into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::super::{routes, Route, Verb};
    use super::DOCUMENT;
    use crate::config::Config;

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("openapi.json is JSON")
    }

    /// `(method, path)` of every operation the document describes.
    fn documented(doc: &Value) -> BTreeSet<(String, String)> {
        let paths = doc["paths"].as_object().expect("paths is an object");
        let mut ops = BTreeSet::new();
        for (path, item) in paths {
            let item = item.as_object().expect("a path item is an object");
            for verb in Verb::ALL {
                if item.contains_key(verb.openapi_name()) {
                    ops.insert((verb.openapi_name().to_string(), path.clone()));
                }
            }
        }
        ops
    }

    fn served(routes: &[Route]) -> BTreeSet<(String, String)> {
        routes.iter().map(|r| (r.verb.openapi_name().to_string(), r.path.to_string())).collect()
    }

    /// Every operation of the document: its path, method and object.
    fn operations(doc: &Value) -> Vec<(String, &'static str, &Value)> {
        let mut ops = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for verb in Verb::ALL {
                if let Some(op) = item.get(verb.openapi_name()) {
                    ops.push((path.clone(), verb.openapi_name(), op));
                }
            }
        }
        ops
    }

    /// Follows a local `$ref` (`#/components/...`); anything else is returned as it is.
    fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => {
                let pointer = r.strip_prefix('#').expect("only local references");
                doc.pointer(pointer).unwrap_or_else(|| panic!("{r} does not resolve"))
            }
            None => v,
        }
    }

    #[test]
    fn the_document_is_openapi_3() {
        let doc = document();
        let version = doc["openapi"].as_str().expect("an openapi version");
        assert!(version.starts_with("3."), "OpenAPI 3, not {version}");
        assert!(doc["info"]["title"].is_string(), "info.title");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"), "info.version");
        assert!(doc["paths"].is_object(), "paths");
        assert!(doc["components"]["securitySchemes"].is_object(), "security schemes");
    }

    #[test]
    fn every_route_is_documented_and_every_documented_route_exists() {
        let doc = document();
        let documented = documented(&doc);
        // The document describes a node with every optional route turned on.
        let all = Config { debug_clock: true, ..Config::default() };
        let served = served(&routes(&all));
        let undocumented: Vec<_> = served.difference(&documented).collect();
        assert!(undocumented.is_empty(), "routes missing from openapi.json: {undocumented:?}");
        let unserved: Vec<_> = documented.difference(&served).collect();
        assert!(unserved.is_empty(), "openapi.json names routes the router lacks: {unserved:?}");
        // Without the setting, only the debug routes go.
        let default = self::served(&routes(&Config::default()));
        let gone: Vec<_> = served.difference(&default).collect();
        assert!(!gone.is_empty() && gone.iter().all(|(_, p)| p.starts_with("/debug/")), "{gone:?}");
    }

    #[test]
    fn the_route_table_names_each_route_once() {
        let all = routes(&Config { debug_clock: true, ..Config::default() });
        assert_eq!(served(&all).len(), all.len(), "a route is given twice");
    }

    #[test]
    fn every_operation_is_complete() {
        let doc = document();
        let scopes = ["open", "namespace", "admin", "metrics"];
        let mut ids = BTreeSet::new();
        for (path, verb, op) in operations(&doc) {
            let what = format!("{verb} {path}");
            let id = op["operationId"].as_str().unwrap_or_else(|| panic!("{what}: operationId"));
            assert!(ids.insert(id.to_string()), "{what}: operationId {id} is used twice");
            assert!(op["summary"].is_string(), "{what}: summary");
            let responses = op["responses"].as_object().unwrap_or_else(|| panic!("{what}"));
            assert!(!responses.is_empty(), "{what}: no responses");
            for response in responses.values() {
                assert!(resolve(&doc, response)["description"].is_string(), "{what}: response");
            }
            // The scope, and the security requirement that goes with it.
            let scope = op["x-delayd-scope"].as_str().unwrap_or_else(|| panic!("{what}: scope"));
            assert!(scopes.contains(&scope), "{what}: unknown scope {scope}");
            let open = op.get("security").is_some_and(|s| s.as_array().is_some_and(Vec::is_empty));
            assert_eq!(open, scope == "open", "{what}: `security: []` marks exactly open routes");
            if scope != "open" {
                assert!(responses.contains_key("401"), "{what}: a credential can be refused");
            }
            // Path parameters: each template variable declared, and nothing more.
            let params: Vec<&Value> = op["parameters"]
                .as_array()
                .map(|ps| ps.iter().map(|p| resolve(&doc, p)).collect())
                .unwrap_or_default();
            let declared: BTreeSet<&str> = params
                .iter()
                .filter(|p| p["in"] == "path")
                .map(|p| p["name"].as_str().expect("a parameter's name"))
                .collect();
            let in_template: BTreeSet<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            assert_eq!(declared, in_template, "{what}: path parameters");
            for p in params {
                assert!(p["schema"].is_object(), "{what}: parameter {} has a schema", p["name"]);
            }
        }
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        fn walk(doc: &Value, v: &Value) {
            match v {
                Value::Object(map) => {
                    if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                        let pointer = r.strip_prefix('#').expect("only local references");
                        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
                    }
                    map.values().for_each(|v| walk(doc, v));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(doc, v)),
                _ => {}
            }
        }
        walk(&doc, &doc);
    }
}
