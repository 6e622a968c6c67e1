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
