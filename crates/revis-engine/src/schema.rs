//! JSON schemas as llama.cpp's grammar converter can take them.
//!
//! A function's parameters are placed inside a larger schema (the call's
//! `{"name": ..., "arguments": ...}`), where a reference such as
//! `#/$defs/Address` (what Pydantic writes for a nested model) would point
//! at the wrong root, and llama.cpp refuses it ("ffi error -3").
//! [`inline_refs`] replaces each reference inside the schema by what it
//! points to, so any schema that does not refer to itself works as a
//! function's parameters; one that does, or refers outside itself, is
//! refused naming the reference.

use serde_json::{Map, Value as Json};

/// The most schema nodes inlining may make: references shared many times
/// over could otherwise grow a small schema without bound.
pub const MAX_INLINED_NODES: usize = 20_000;

/// `schema` with every local `$ref` (`#/...`) replaced by its target (the
/// keys beside a `$ref`, such as a description, kept over the target's),
/// and the root's `$defs` and `definitions` dropped once used.
pub fn inline_refs(schema: &Json) -> Result<Json, String> {
    if !has_ref(schema) {
        return Ok(schema.clone());
    }
    let mut nodes = 0;
    let mut out = walk(schema, schema, &mut Vec::new(), &mut nodes)?;
    if let Json::Object(o) = &mut out {
        o.remove("$defs");
        o.remove("definitions");
    }
    Ok(out)
}

fn has_ref(v: &Json) -> bool {
    match v {
        Json::Object(o) => o.get("$ref").is_some_and(Json::is_string) || o.values().any(has_ref),
        Json::Array(a) => a.iter().any(has_ref),
        _ => false,
    }
}

fn walk(node: &Json, root: &Json, path: &mut Vec<String>, nodes: &mut usize) -> Result<Json, String> {
    *nodes += 1;
    if *nodes > MAX_INLINED_NODES {
        return Err(format!("inlining its references makes more than {MAX_INLINED_NODES} schema nodes, the limit"));
    }
    match node {
        Json::Object(o) => {
            if let Some(Json::String(r)) = o.get("$ref") {
                if path.contains(r) {
                    return Err(format!("$ref {r:?} refers to itself, which revis cannot inline; write the schema without recursion"));
                }
                let target = target(root, r)?;
                path.push(r.clone());
                let mut inlined = walk(target, root, path, nodes)?;
                path.pop();
                if let Json::Object(t) = &mut inlined {
                    for (k, v) in o.iter().filter(|(k, _)| k.as_str() != "$ref") {
                        t.insert(k.clone(), walk(v, root, path, nodes)?);
                    }
                }
                return Ok(inlined);
            }
            let mut out = Map::with_capacity(o.len());
            for (k, v) in o {
                out.insert(k.clone(), walk(v, root, path, nodes)?);
            }
            Ok(Json::Object(out))
        }
        Json::Array(a) => a.iter().map(|v| walk(v, root, path, nodes)).collect::<Result<_, _>>().map(Json::Array),
        other => Ok(other.clone()),
    }
}

/// The most alternatives (`enum` values, `anyOf` and `oneOf` branches) a
/// request's schemas may hold together. Each one a grammar keeps open is
/// checked against the whole vocabulary at every token, on the tier's one
/// engine thread, so many of them slow every answer on that tier: 1,500
/// values sharing a long prefix made 30 tokens take 28 s instead of 0.7 s
/// (docs/RELIABILITY.md). The bounds are OpenAI's for structured outputs,
/// so a schema written for OpenAI passes.
pub const MAX_SCHEMA_ALTERNATIVES: usize = 1000;
/// An `enum` of more than [`ENUM_LONG`] values may hold at most this many
/// characters in all (OpenAI's bound too).
pub const MAX_LONG_ENUM_CHARS: usize = 15_000;
/// See [`MAX_LONG_ENUM_CHARS`].
pub const ENUM_LONG: usize = 250;

/// Counts the alternatives of `schema` into `count`, and refuses an `enum`
/// past [`MAX_LONG_ENUM_CHARS`] or a running count past
/// [`MAX_SCHEMA_ALTERNATIVES`]; `what` names the schema in the message.
pub fn count_alternatives(schema: &Json, what: &str, count: &mut usize) -> Result<(), String> {
    match schema {
        Json::Object(o) => {
            for (k, v) in o {
                if let (Json::Array(a), "enum" | "anyOf" | "oneOf") = (v, k.as_str()) {
                    *count += a.len();
                    if k == "enum" && a.len() > ENUM_LONG {
                        let chars: usize =
                            a.iter().map(|x| x.as_str().map_or_else(|| x.to_string().chars().count(), |t| t.chars().count())).sum();
                        if chars > MAX_LONG_ENUM_CHARS {
                            return Err(format!(
                                "{what} has an enum of {} values and {chars} characters; an enum of more than {ENUM_LONG} values \
                                 may hold at most {MAX_LONG_ENUM_CHARS} characters in all",
                                a.len()
                            ));
                        }
                    }
                    if *count > MAX_SCHEMA_ALTERNATIVES {
                        return Err(format!(
                            "{what} holds more than {MAX_SCHEMA_ALTERNATIVES} alternatives (enum values, anyOf and oneOf \
                             branches), the limit for a request's schemas together"
                        ));
                    }
                }
                count_alternatives(v, what, count)?;
            }
            Ok(())
        }
        Json::Array(a) => a.iter().try_for_each(|v| count_alternatives(v, what, count)),
        _ => Ok(()),
    }
}

/// What a local reference (`#` and a JSON pointer) points to.
fn target<'a>(root: &'a Json, r: &str) -> Result<&'a Json, String> {
    let Some(pointer) = r.strip_prefix('#') else {
        return Err(format!("$ref {r:?} points outside the schema; only references inside it (\"#/...\") can be followed"));
    };
    let pointer = percent_decoded(pointer);
    root.pointer(&pointer).ok_or_else(|| format!("$ref {r:?} points to nothing in the schema"))
}

/// A URI fragment's `%XX` escapes decoded (JSON pointers in `$ref` are URI fragments).
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What Pydantic writes for a model with a nested one.
    #[test]
    fn nested_models_are_inlined() {
        let s = json!({
            "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "type": "object",
            "properties": {
                "home": {"$ref": "#/$defs/Address", "description": "Where they live"},
                "past": {"type": "array", "items": {"$ref": "#/$defs/Address"}},
                "$ref": {"type": "string"}
            }
        });
        let address = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let mut home = address.clone();
        home["description"] = json!("Where they live");
        assert_eq!(
            inline_refs(&s).unwrap(),
            json!({"type": "object", "properties": {"home": home, "past": {"type": "array", "items": address}, "$ref": {"type": "string"}}})
        );
        let plain = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(inline_refs(&plain).unwrap(), plain);
        let old = json!({"definitions": {"A": {"type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/A"}}});
        assert_eq!(inline_refs(&old).unwrap(), json!({"properties": {"a": {"type": "integer"}}}));
        let escaped = json!({"$defs": {"a b": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/a%20b"}}});
        assert_eq!(inline_refs(&escaped).unwrap(), json!({"properties": {"x": {"type": "integer"}}}));
    }

    #[test]
    fn alternatives_are_bounded_as_openai_bounds_them() {
        let count = |s: &Json| {
            let mut n = 0;
            count_alternatives(s, "json_schema", &mut n).map(|()| n)
        };
        let values = |n: usize, len: usize| (0..n).map(|i| format!("{i:0len$}")).collect::<Vec<_>>();
        let country = json!({"properties": {"c": {"enum": values(250, 2)}, "d": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}});
        assert_eq!(count(&country), Ok(252));
        // 1,000 short values pass; one more alternative anywhere does not.
        assert_eq!(count(&json!({"enum": values(1000, 4)})), Ok(1000));
        let over = count(&json!({"enum": values(1000, 4), "oneOf": [{}]})).unwrap_err();
        assert!(over.contains("json_schema") && over.contains("1000"), "{over}");
        // Over 250 values, at most 15,000 characters: 300 of 51 fails, 300 of 50 passes.
        let long = count(&json!({"items": {"enum": values(300, 51)}})).unwrap_err();
        assert!(long.contains("300 values and 15300 characters") && long.contains("at most 15000"), "{long}");
        assert_eq!(count(&json!({"items": {"enum": values(300, 50)}})), Ok(300));
        // A property called "enum" is a name, not a keyword.
        assert_eq!(count(&json!({"properties": {"enum": {"type": "string"}}})), Ok(0));
    }

    #[test]
    fn what_cannot_be_inlined_is_refused_naming_the_reference() {
        let recursive =
            json!({"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}, "$ref": "#/$defs/Node"});
        assert!(inline_refs(&recursive).unwrap_err().contains("\"#/$defs/Node\" refers to itself"));
        let outside = json!({"properties": {"a": {"$ref": "https://example.com/a.json"}}});
        assert!(inline_refs(&outside).unwrap_err().contains("points outside the schema"));
        let missing = json!({"properties": {"a": {"$ref": "#/$defs/Nope"}}});
        assert!(inline_refs(&missing).unwrap_err().contains("points to nothing"));
        // Each level refers to the next twice: 2^20 copies, stopped at the limit.
        let mut defs = Map::new();
        for i in 0..20 {
            defs.insert(
                format!("L{i}"),
                json!({"type": "array", "items": [{"$ref": format!("#/$defs/L{}", i + 1)}, {"$ref": format!("#/$defs/L{}", i + 1)}]}),
            );
        }
        defs.insert("L20".into(), json!({"type": "integer"}));
        let wide = json!({"$defs": defs, "$ref": "#/$defs/L0"});
        assert!(inline_refs(&wide).unwrap_err().contains("the limit"));
    }
}
