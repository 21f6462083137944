//! Reading JSON (`canal stat --json`, `iperf3 -J`) with serde_json: dotted-path lookups
//! and the text a person would write for a value in a switch.

pub(crate) use serde_json::Value as Json;

pub(crate) fn parse(s: &str) -> Result<Json, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

/// Follows a dotted path of object keys, e.g. `"daemon.pid"`.
pub(crate) fn get<'a>(v: &'a Json, path: &str) -> Option<&'a Json> {
    path.split('.')
        .try_fold(v, |cur, k| cur.as_object()?.get(k))
}

/// The value as text as a person would write it in a switch (`"poll"`, `3`, `true`).
pub(crate) fn as_text(v: &Json) -> String {
    match v {
        Json::Null => "null".into(),
        Json::Bool(b) => b.to_string(),
        Json::Number(n) => n.as_f64().map_or_else(|| n.to_string(), |f| format!("{f}")),
        Json::String(s) => s.clone(),
        Json::Array(a) => a.iter().map(as_text).collect::<Vec<_>>().join(","),
        Json::Object(_) => "{...}".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_canal_stat_shape() {
        let j = parse(
            r#"{"daemon":{"pid":42,"socket":"/tmp/c.sock","config":{"notify":"poll","disable":["batch"]}},
               "guests":[{"id":1,"comm":"x\"y","sockets":[]}], "f": -1.5e3, "t": true, "n": null}"#,
        )
        .unwrap();
        assert_eq!(get(&j, "daemon.pid").and_then(Json::as_f64), Some(42.0));
        assert_eq!(as_text(get(&j, "daemon.config.notify").unwrap()), "poll");
        assert_eq!(as_text(get(&j, "daemon.config.disable").unwrap()), "batch");
        assert_eq!(get(&j, "f").and_then(Json::as_f64), Some(-1500.0));
        assert_eq!(as_text(get(&j, "daemon.pid").unwrap()), "42");
        assert!(get(&j, "daemon.nope").is_none());
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["{", "[1,", "{\"a\" 1}", "nul", "\"abc", "{} x"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
