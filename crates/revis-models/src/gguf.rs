//! Reads the metadata section of a GGUF file (version 2 and 3) for the sampling a model publishes.
//!
//! Only the key-value header is read, never the tensors: the keys come one
//! after another, and values that are not wanted are skipped (arrays of fixed
//! size by seeking, string arrays by their lengths), so even a tokenizer of
//! 250,000 entries costs a few megabytes of reading. Written here rather than
//! taken from a crate because the GGUF readers on crates.io come with a tensor
//! library; this is the header alone, with limits on every count a hostile
//! file could inflate.
//!
//! The keys are llama.cpp's `general.sampling.*` (`temp`, `top_k`, `top_p`,
//! `min_p`, `penalty_repeat`, `penalty_last_n`), which `convert_hf_to_gguf.py`
//! writes from a model's generation_config.json.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

use crate::sampling::SamplingDefaults;

const MAGIC: &[u8; 4] = b"GGUF";
/// More keys than any real model has (a few dozen); a file claiming more is not read.
const MAX_KEYS: u64 = 1 << 16;
/// Longest key or string value read into memory.
const MAX_STRING: u64 = 1 << 20;

/// Value types, as numbered by the GGUF specification.
mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// A scalar value or a string; arrays are not read.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Int(i64),
    Float(f64),
    Text(String),
    Other,
}

impl Value {
    fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::Float(f) => Some(f as f32),
            Value::Int(i) => Some(i as f32),
            Value::Text(_) | Value::Other => None,
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }

    fn as_u32(&self) -> Option<u32> {
        match *self {
            Value::Int(i) => u32::try_from(i).ok(),
            Value::Float(f) if f >= 0.0 && f.fract() == 0.0 && f <= u32::MAX as f64 => Some(f as u32),
            _ => None,
        }
    }
}

/// Reads the key-value header of the GGUF file at `path`, giving each key
/// for which `wanted` holds, with its value, to `found`; every other value
/// is stepped over unread.
fn walk(path: &Path, wanted: impl Fn(&str) -> bool, mut found: impl FnMut(&str, Value)) -> io::Result<()> {
    let mut r = BufReader::with_capacity(64 * 1024, File::open(path)?);
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid("not a GGUF file"));
    }
    let version = read_u32(&mut r)?;
    if !(2..=3).contains(&version) {
        return Err(invalid(format!("GGUF version {version}; versions 2 and 3 are read")));
    }
    let _tensors = read_u64(&mut r)?;
    let keys = read_u64(&mut r)?;
    if keys > MAX_KEYS {
        return Err(invalid(format!("{keys} metadata keys is more than {MAX_KEYS}")));
    }
    for _ in 0..keys {
        let key = read_string(&mut r)?;
        let kind = read_u32(&mut r)?;
        if wanted(&key) {
            let value = scalar(&mut r, kind)?;
            found(&key, value);
        } else {
            skip(&mut r, kind)?;
        }
    }
    Ok(())
}

/// The `general.sampling.*` values of the GGUF file at `path` (none set when it publishes none).
pub(crate) fn sampling(path: &Path) -> io::Result<SamplingDefaults> {
    let mut out = SamplingDefaults::NONE;
    walk(
        path,
        |key| key.starts_with("general.sampling."),
        |key, value| match key.trim_start_matches("general.sampling.") {
            "temp" => out.temperature = value.as_f32(),
            "top_k" => out.top_k = value.as_u32(),
            "top_p" => out.top_p = value.as_f32(),
            "min_p" => out.min_p = value.as_f32(),
            "penalty_repeat" => out.repeat_penalty = value.as_f32(),
            "penalty_last_n" => out.repeat_last_n = value.as_u32(),
            _ => {}
        },
    )?;
    Ok(out)
}

/// What a model's context costs and how long it was trained for, from its
/// GGUF header (llama.cpp's `<architecture>.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// `context_length`: the longest context the model was trained on.
    pub trained_context: u32,
    /// Bytes of KV cache one token of context takes, keys and values in
    /// f16 (llama.cpp's default): layers × KV heads × (key + value length) × 2.
    pub kv_bytes_per_token: u64,
}

/// The [`Shape`] of the GGUF model at `path`.
pub fn shape(path: &Path) -> io::Result<Shape> {
    // The architecture names the other keys, and need not come first: keep
    // every `<word>.<key>` that could be one, then pick the architecture's.
    const KEYS: [&str; 7] = [
        "context_length",
        "block_count",
        "embedding_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
    ];
    let mut arch = None;
    let mut seen: Vec<(String, Value)> = Vec::new();
    walk(
        path,
        |key| key == "general.architecture" || key.split_once('.').is_some_and(|(_, k)| KEYS.contains(&k)),
        |key, value| match (key, value) {
            ("general.architecture", Value::Text(a)) => arch = Some(a),
            (_, v) => seen.push((key.to_owned(), v)),
        },
    )?;
    let arch = arch.ok_or_else(|| invalid("no general.architecture"))?;
    let get = |k: &str| {
        seen.iter()
            .find(|(key, _)| key.strip_prefix(arch.as_str()).and_then(|r| r.strip_prefix('.')) == Some(k))
            .and_then(|(_, v)| v.as_u64())
    };
    let need = |k: &str| get(k).filter(|v| *v > 0).ok_or_else(|| invalid(format!("no {arch}.{k}")));
    let trained_context = u32::try_from(need("context_length")?).unwrap_or(u32::MAX);
    let layers = need("block_count")?;
    let heads = need("attention.head_count")?;
    // Without its own key, a head is the embedding shared among the heads,
    // and there are as many KV heads as heads (no grouped-query attention).
    let kv_heads = get("attention.head_count_kv").filter(|v| *v > 0).unwrap_or(heads);
    let head = || need("embedding_length").map(|e| e / heads);
    let key = match get("attention.key_length") {
        Some(k) if k > 0 => k,
        _ => head()?,
    };
    let value = match get("attention.value_length") {
        Some(v) if v > 0 => v,
        _ => key,
    };
    let kv_bytes_per_token = layers.saturating_mul(kv_heads).saturating_mul(key + value).saturating_mul(2);
    Ok(Shape { trained_context, kv_bytes_per_token })
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_string(r: &mut impl Read) -> io::Result<String> {
    let len = read_u64(r)?;
    if len > MAX_STRING {
        return Err(invalid(format!("a string of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The size of a value of a fixed-size type, or None for strings and arrays.
fn fixed_size(kind: u32) -> Option<u64> {
    match kind {
        ty::U8 | ty::I8 | ty::BOOL => Some(1),
        ty::U16 | ty::I16 => Some(2),
        ty::U32 | ty::I32 | ty::F32 => Some(4),
        ty::U64 | ty::I64 | ty::F64 => Some(8),
        _ => None,
    }
}

fn scalar<R: Read + Seek>(r: &mut R, kind: u32) -> io::Result<Value> {
    let mut b = [0u8; 8];
    let v = match kind {
        ty::U8 | ty::BOOL => {
            r.read_exact(&mut b[..1])?;
            Value::Int(b[0].into())
        }
        ty::I8 => {
            r.read_exact(&mut b[..1])?;
            Value::Int((b[0] as i8).into())
        }
        ty::U16 => {
            r.read_exact(&mut b[..2])?;
            Value::Int(u16::from_le_bytes([b[0], b[1]]).into())
        }
        ty::I16 => {
            r.read_exact(&mut b[..2])?;
            Value::Int(i16::from_le_bytes([b[0], b[1]]).into())
        }
        ty::U32 => Value::Int(read_u32(r)?.into()),
        ty::I32 => Value::Int((read_u32(r)? as i32).into()),
        ty::F32 => Value::Float(f32::from_bits(read_u32(r)?).into()),
        ty::U64 => Value::Int(i64::try_from(read_u64(r)?).unwrap_or(i64::MAX)),
        ty::I64 => Value::Int(read_u64(r)? as i64),
        ty::F64 => Value::Float(f64::from_bits(read_u64(r)?)),
        ty::STRING => Value::Text(read_string(r)?),
        other => {
            skip(r, other)?;
            Value::Other
        }
    };
    Ok(v)
}

/// Steps over one value of type `kind`.
fn skip<R: Read + Seek>(r: &mut R, kind: u32) -> io::Result<()> {
    if let Some(n) = fixed_size(kind) {
        return r.seek_relative(n as i64);
    }
    match kind {
        ty::STRING => skip_string(r),
        ty::ARRAY => {
            let elem = read_u32(r)?;
            let count = read_u64(r)?;
            if let Some(n) = fixed_size(elem) {
                let bytes = count.checked_mul(n).filter(|b| *b <= i64::MAX as u64).ok_or_else(|| invalid("an array too large"))?;
                return r.seek_relative(bytes as i64);
            }
            match elem {
                ty::STRING => (0..count).try_for_each(|_| skip_string(r)),
                _ => Err(invalid(format!("an array of type {elem}"))),
            }
        }
        other => Err(invalid(format!("unknown value type {other}"))),
    }
}

fn skip_string<R: Read + Seek>(r: &mut R) -> io::Result<()> {
    let len = read_u64(r)?;
    if len > i64::MAX as u64 {
        return Err(invalid("a string too large"));
    }
    r.seek_relative(len as i64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GGUF header with `kvs` (key, type, little-endian value bytes) and no tensors.
    pub(crate) fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (key, kind, value) in kvs {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(kind.to_le_bytes());
            out.extend(value);
        }
        out
    }

    fn string(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    fn check(bytes: &[u8]) -> io::Result<SamplingDefaults> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        sampling(&path)
    }

    #[test]
    fn reads_the_sampling_keys_past_everything_else() {
        let mut tokens = ty::STRING.to_le_bytes().to_vec();
        tokens.extend(3u64.to_le_bytes());
        for t in ["<s>", "hello", "world"] {
            tokens.extend(string(t));
        }
        let mut scores = ty::F32.to_le_bytes().to_vec();
        scores.extend(2u64.to_le_bytes());
        scores.extend([0u8; 8]);
        let bytes = header(&[
            ("general.architecture", ty::STRING, string("qwen2")),
            ("tokenizer.ggml.tokens", ty::ARRAY, tokens),
            ("tokenizer.ggml.scores", ty::ARRAY, scores),
            ("general.sampling.temp", ty::F32, 0.6f32.to_le_bytes().to_vec()),
            ("qwen2.block_count", ty::U32, 28u32.to_le_bytes().to_vec()),
            ("general.sampling.top_k", ty::I32, 20i32.to_le_bytes().to_vec()),
            ("general.sampling.top_p", ty::F64, 0.95f64.to_le_bytes().to_vec()),
            ("general.sampling.sequence", ty::STRING, string("top_k;top_p;temp")),
            ("general.sampling.penalty_last_n", ty::U64, 64u64.to_le_bytes().to_vec()),
            ("general.file_type", ty::U32, 15u32.to_le_bytes().to_vec()),
        ]);
        let got = check(&bytes).unwrap();
        assert_eq!(
            got,
            SamplingDefaults {
                temperature: Some(0.6),
                top_k: Some(20),
                top_p: Some(0.95),
                repeat_last_n: Some(64),
                ..SamplingDefaults::NONE
            }
        );
    }

    fn u32v(v: u32) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    fn shape_of(bytes: &[u8]) -> io::Result<Shape> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).unwrap();
        shape(&path)
    }

    #[test]
    fn a_models_shape_is_read_from_its_architectures_keys_wherever_they_are() {
        // SmolLM2-135M's numbers, the architecture named last, and another
        // architecture's keys that must not be taken for its own.
        let smol = header(&[
            ("llama.context_length", ty::U32, u32v(8192)),
            ("llama.block_count", ty::U32, u32v(30)),
            ("gemma3.block_count", ty::U32, u32v(99)),
            ("llama.embedding_length", ty::U32, u32v(576)),
            ("llama.attention.head_count", ty::U32, u32v(9)),
            ("llama.attention.head_count_kv", ty::U32, u32v(3)),
            ("general.architecture", ty::STRING, string("llama")),
        ]);
        assert_eq!(shape_of(&smol).unwrap(), Shape { trained_context: 8192, kv_bytes_per_token: 30 * 3 * (64 + 64) * 2 });
        // Gemma 3 270M: heads of their own length, one KV head.
        let gemma = header(&[
            ("general.architecture", ty::STRING, string("gemma3")),
            ("gemma3.context_length", ty::U32, u32v(32768)),
            ("gemma3.block_count", ty::U32, u32v(18)),
            ("gemma3.embedding_length", ty::U32, u32v(640)),
            ("gemma3.attention.head_count", ty::U32, u32v(4)),
            ("gemma3.attention.head_count_kv", ty::U32, u32v(1)),
            ("gemma3.attention.key_length", ty::U32, u32v(256)),
            ("gemma3.attention.value_length", ty::U32, u32v(256)),
        ]);
        assert_eq!(shape_of(&gemma).unwrap(), Shape { trained_context: 32768, kv_bytes_per_token: 18 * 512 * 2 });
        let err = shape_of(&header(&[("general.architecture", ty::STRING, string("llama"))])).unwrap_err();
        assert!(err.to_string().contains("no llama.context_length"), "{err}");
        assert!(shape_of(&header(&[])).unwrap_err().to_string().contains("no general.architecture"));
    }

    #[test]
    fn what_is_not_gguf_is_refused_not_misread() {
        assert_eq!(check(b"").unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert!(check(b"GGML\x03\0\0\0").unwrap_err().to_string().contains("not a GGUF file"));
        let mut v1 = header(&[]);
        v1[4] = 1;
        assert!(check(&v1).unwrap_err().to_string().contains("GGUF version 1"));
        let mut many = header(&[]);
        many[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check(&many).unwrap_err().to_string().contains("metadata keys"));
        // A file cut inside its header: an error, not a guess.
        let whole = header(&[("general.sampling.temp", ty::F32, 0.6f32.to_le_bytes().to_vec())]);
        assert!(check(&whole[..whole.len() - 2]).is_err());
        assert_eq!(check(&header(&[])).unwrap(), SamplingDefaults::NONE, "no keys: nothing published");
    }
}
