//! Reading a request's JSON body, bounded, into the route's typed request,
//! strictly: a field of the wrong type is a 400 that names it, whichever
//! API the route speaks.

use axum::body::Body;
use axum::http::StatusCode;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use tokio_stream::StreamExt;

use crate::error::{ApiError, Flavor};

/// The body of `req` as `T`: at most `limit` bytes (413 naming the limit),
/// JSON that fits `T` (400 saying where it does not).
pub(crate) async fn json<T: DeserializeOwned>(flavor: Flavor, body: Body, limit: usize) -> Result<T, ApiError> {
    parse(flavor, &bytes(flavor, body, limit).await?)
}

/// The body, at most `limit` bytes (413 naming the limit).
pub(crate) async fn bytes(flavor: Flavor, body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = || {
        ApiError::new(
            flavor,
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than revis serve's limit of {limit} bytes (max_body_bytes)"),
        )
    };
    let mut buf = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::new(flavor, StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

/// `body` as `T`: a 400 saying where it does not fit, naming the field
/// (`param`) when the body is JSON and a field of it is at fault.
pub(crate) fn parse<T: DeserializeOwned>(flavor: Flavor, body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let missing = e.to_string().starts_with("missing field");
        let field = if e.is_data() { field_at(body, e.line(), e.column(), missing) } else { String::new() };
        if field.is_empty() {
            ApiError::new(flavor, StatusCode::BAD_REQUEST, format!("the request body is not a valid request: {e}"))
        } else {
            ApiError::invalid(flavor, &field, format!("the request body is not a valid request: {field}: {e}"))
        }
    })
}

/// A string, or a list of `T`s (a content given as text or as parts). Read
/// as it comes, not tried one form after the other as `#[serde(untagged)]`
/// does, so a wrong type is found, and named, where it is.
#[derive(Debug)]
pub(crate) enum TextOr<T> {
    Text(String),
    List(Vec<T>),
}

/// A string, or an object `T` (a choice given as a word or spelled out);
/// read as [`TextOr`] is.
#[derive(Debug)]
pub(crate) enum WordOr<T> {
    Word(String),
    Object(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for TextOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Either::<Self>(PhantomData))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for WordOr<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Either::<Self>(PhantomData))
    }
}

/// The visitor of [`TextOr`] and [`WordOr`].
struct Either<V>(PhantomData<V>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Either<TextOr<T>> {
    type Value = TextOr<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or a list")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(TextOr::Text(s.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Vec::deserialize(SeqAccessDeserializer::new(seq)).map(TextOr::List)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Either<WordOr<T>> {
    type Value = WordOr<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or an object")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(WordOr::Word(s.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(WordOr::Object)
    }
}

/// Where a container of the body stands, as it is read up to a point.
enum Open {
    /// An object; its key, once read (until the next `,`).
    Object { key: Option<String>, in_value: bool },
    /// An array, at its `index`th element.
    Array { index: usize },
}

/// The field (`messages[1].content`, `temperature`) whose value `body`,
/// which is valid JSON up to there, was being read at `line` and `column`
/// (serde_json's position of a failure: 1-based lines, 0-based byte
/// columns); for a `missing` field, the object that lacks it. Empty at the
/// top level.
fn field_at(body: &[u8], line: usize, column: usize, missing: bool) -> String {
    let line_start =
        if line <= 1 { 0 } else { body.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(line - 2).map_or(body.len(), |(i, _)| i + 1) };
    let end = (line_start + column).min(body.len());
    let mut open: Vec<Open> = Vec::new();
    let mut i = 0;
    while i < end {
        match body[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < body.len() && body[i] != b'"' {
                    i += if body[i] == b'\\' { 2 } else { 1 };
                }
                if let Some(Open::Object { key, in_value: false }) = open.last_mut() {
                    *key = serde_json::from_slice(&body[start..(i + 1).min(body.len())]).ok();
                }
            }
            b'{' => open.push(Open::Object { key: None, in_value: false }),
            b'[' => open.push(Open::Array { index: 0 }),
            b'}' | b']' => {
                open.pop();
            }
            b':' => {
                if let Some(Open::Object { in_value, .. }) = open.last_mut() {
                    *in_value = true;
                }
            }
            b',' => match open.last_mut() {
                Some(Open::Object { key, in_value }) => (*key, *in_value) = (None, false),
                Some(Open::Array { index }) => *index += 1,
                None => {}
            },
            _ => {}
        }
        i += 1;
    }
    // A field missing is found at its object's end: what is amiss is the object.
    if missing && let Some(Open::Object { key, in_value }) = open.last_mut() {
        (*key, *in_value) = (None, false);
    }
    let mut field = String::new();
    for o in &open {
        match o {
            Open::Object { key: Some(k), in_value: true } => {
                if !field.is_empty() {
                    field.push('.');
                }
                field.push_str(k);
            }
            Open::Object { .. } => break,
            Open::Array { index } => field.push_str(&format!("[{index}]")),
        }
    }
    field
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // read by serde only
    struct Req {
        model: String,
        temperature: Option<f32>,
        #[serde(default)]
        messages: Vec<Msg>,
        input: Option<TextOr<Msg>>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // read by serde only
    struct Msg {
        role: String,
        content: Option<String>,
    }

    fn refused(body: &str) -> ApiError {
        parse::<Req>(Flavor::OpenAi, body.as_bytes()).unwrap_err()
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let e = refused(r#"{"model": "m", "temperature": "hot"}"#);
        assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, Some("temperature")));
        assert!(
            e.message.starts_with("the request body is not a valid request: temperature: invalid type: string \"hot\""),
            "{}",
            e.message
        );
        let e = refused("{\"model\": \"m\",\n \"messages\": [{\"role\": \"user\"}, {\"role\": \"user\", \"content\": 5}]}");
        assert_eq!(e.param.as_deref(), Some("messages[1].content"), "{}", e.message);
        let e = refused(r#"{"model": "m", "messages": [{"content": "x", "we\"ird": 1}]}"#);
        assert_eq!(e.param.as_deref(), Some("messages[0]"), "a missing field is its object's: {}", e.message);
        assert_eq!(refused(r#"{"model": 3}"#).param.as_deref(), Some("model"));
        let e = refused(r#"{"model": "m", "input": 3}"#);
        assert_eq!(e.param.as_deref(), Some("input"), "a string or a list: {}", e.message);
        assert!(e.message.ends_with("input: invalid type: integer `3`, expected a string or a list at line 1 column 25"), "{}", e.message);
        let e = refused(r#"{"model": "m", "input": [{"role": "user", "content": ["x"]}]}"#);
        assert_eq!(e.param.as_deref(), Some("input[0].content"), "{}", e.message);
    }

    #[test]
    fn what_is_not_json_or_lacks_a_top_level_field_names_none() {
        for body in [r#"{"model": "m", "temperature": }"#, r#"{"temperature": 1}"#, "[]", ""] {
            let e = refused(body);
            assert_eq!((e.status, e.param.as_deref()), (StatusCode::BAD_REQUEST, None), "{body}: {}", e.message);
            assert!(e.message.starts_with("the request body is not a valid request: "), "{}", e.message);
        }
    }
}
