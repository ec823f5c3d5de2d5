//! `GET /openapi.json`: the API's OpenAPI 3.1 description, written by hand
//! in `openapi.json` beside this file, with the caller aliases this API was
//! built with added to every operation that names a caller.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::caller::Aliases;
use super::Api;

/// The document as written, checked against the route table by a test.
const WRITTEN: &str = include_str!("openapi.json");

/// The document served: the written one, with a query parameter for each
/// of `aliases` beside `ip` and `route`.
pub(super) fn document_with(aliases: &Aliases) -> String {
    let mut doc: Value = serde_json::from_str(WRITTEN).expect("openapi.json is JSON");
    for (name, header) in aliases.iter() {
        let id = format!("alias.{name}");
        // `get_mut`, never `doc[..] = `: indexing a `Value` mutably inserts
        // a `null` where a key is missing (issue 45: `"parameters": null`
        // on every path without parameters, which no validator accepts).
        if let Some(parameters) = doc
            .pointer_mut("/components/parameters")
            .and_then(Value::as_object_mut)
        {
            parameters.insert(
                id.clone(),
                json!({
                    "name": name,
                    "in": "query",
                    "required": false,
                    "description": format!("The caller's {header} header (the same as header.{header})"),
                    "schema": { "type": "string" },
                }),
            );
        }
        let reference = json!({ "$ref": format!("#/components/parameters/{id}") });
        let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
            continue;
        };
        for item in paths.values_mut() {
            let Some(parameters) = item.get_mut("parameters").and_then(Value::as_array_mut) else {
                continue;
            };
            if parameters
                .iter()
                .any(|p| p["$ref"] == "#/components/parameters/ip")
            {
                parameters.push(reference.clone());
            }
        }
    }
    doc.to_string()
}

/// The handler: the document this API was built with.
pub(super) async fn document(State(api): State<Api>) -> Response {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        api.openapi.clone(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::admin::routes;

    /// Every (method, path) the written document describes.
    fn documented() -> BTreeSet<(String, String)> {
        let doc: Value = serde_json::from_str(WRITTEN).unwrap();
        let mut out = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in ["get", "put", "post", "delete", "patch", "head", "options"] {
                if item.get(method).is_some() {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn every_route_is_documented_and_every_documented_route_is_served() {
        let served: BTreeSet<(String, String)> = routes::table()
            .iter()
            .map(|r| (r.method.to_string(), r.path.to_owned()))
            .collect();
        assert_eq!(served, documented());
    }

    /// Issue 45: the module's route table left out `/limit` and `/cap`.
    #[test]
    fn the_rustdoc_route_table_names_every_route() {
        let rows: Vec<&str> = include_str!("mod.rs")
            .lines()
            .filter(|l| l.starts_with("//! | `"))
            .collect();
        for route in routes::table() {
            let (method, path) = (format!("`{}", route.method), route.path);
            let named = rows.iter().any(|row| {
                let cell = row.split(" | ").nth(1).unwrap_or("");
                (cell.contains(&format!("{path}`")) || cell.contains(&format!("{path}?")))
                    && (cell.contains(&method) || cell.contains(&format!("{} ", route.method)))
            });
            assert!(
                named,
                "{} {path} is not in admin/mod.rs's route table",
                route.method
            );
        }
    }

    #[test]
    fn the_document_is_openapi_3_1_and_every_reference_resolves() {
        let doc: Value = serde_json::from_str(WRITTEN).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let text = WRITTEN;
        let mut rest = text;
        while let Some(at) = rest.find("\"#/components/") {
            let tail = &rest[at + 2..];
            let end = tail.find('"').unwrap();
            let pointer = &tail[..end];
            assert!(doc.pointer(pointer).is_some(), "{pointer} resolves");
            rest = &tail[end..];
        }
    }

    /// Issue 45: with an alias, every path without parameters got
    /// `"parameters": null`.
    #[test]
    fn an_alias_adds_no_null_anywhere() {
        let mut aliases = Aliases::default();
        aliases.add("api_key", "x-api-key");
        fn nulls(at: &str, value: &Value, out: &mut Vec<String>) {
            match value {
                Value::Null => out.push(at.to_owned()),
                Value::Array(items) => {
                    for (i, v) in items.iter().enumerate() {
                        nulls(&format!("{at}/{i}"), v, out);
                    }
                }
                Value::Object(fields) => {
                    for (k, v) in fields {
                        nulls(&format!("{at}/{k}"), v, out);
                    }
                }
                _ => {}
            }
        }
        let doc: Value = serde_json::from_str(&document_with(&aliases)).unwrap();
        let mut found = Vec::new();
        nulls("", &doc, &mut found);
        assert!(found.is_empty(), "nulls at {found:?}");
        assert!(doc["paths"]["/policies"].get("parameters").is_none());
    }

    #[test]
    fn aliases_are_parameters_of_every_operation_that_names_a_caller() {
        let mut aliases = Aliases::default();
        aliases.add("api_key", "x-api-key");
        let doc: Value = serde_json::from_str(&document_with(&aliases)).unwrap();
        let alias = json!({ "$ref": "#/components/parameters/alias.api_key" });
        for path in [
            "/policies/{policy}/overrides/caller",
            "/policies/{policy}/peek",
        ] {
            let parameters = doc["paths"][path]["parameters"].as_array().unwrap();
            assert!(parameters.contains(&alias), "{path}");
        }
        let policy = doc["paths"]["/policies/{policy}"]["parameters"]
            .as_array()
            .unwrap();
        assert!(!policy.contains(&alias));
        assert_eq!(
            doc["components"]["parameters"]["alias.api_key"]["name"],
            "api_key"
        );
    }
}
