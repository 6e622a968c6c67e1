//! SHA-256 helpers: hashing files and writers, and checking hex digests.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Size of the buffers used to stream files and bodies.
pub(crate) const BUF_SIZE: usize = 256 * 1024;

/// Returns `s` as a lowercase 64-digit hex SHA-256, or `None` if it is not one.
pub(crate) fn normalize_sha256(s: &str) -> Option<String> {
    let s = s.trim();
    (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_ascii_lowercase())
}

/// Whether two hex digests name the same hash (case-insensitive).
pub(crate) fn same_digest(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

/// Feeds the first `len` bytes of `path` (or all of it when `len` is `None`) into `hasher`.
pub(crate) fn hash_prefix(path: &Path, len: Option<u64>, hasher: &mut Sha256) -> io::Result<u64> {
    let file = File::open(path)?;
    let mut reader: Box<dyn Read> = match len {
        Some(len) => Box::new(file.take(len)),
        None => Box::new(file),
    };
    let mut buf = vec![0u8; BUF_SIZE];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}

/// The lowercase hex SHA-256 of a whole file.
pub(crate) fn sha256_file(path: &Path) -> io::Result<String> {
    let mut hasher = Sha256::new();
    hash_prefix(path, None, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter { inner, hasher: Sha256::new(), written: 0 }
    }

    /// Flushes and returns the inner writer, the hex digest and the byte count.
    pub(crate) fn finish(mut self) -> io::Result<(W, String, u64)> {
        self.inner.flush()?;
        Ok((self.inner, hex::encode(self.hasher.finalize()), self.written))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn normalize_accepts_only_64_hex_digits() {
        let upper = EMPTY.to_ascii_uppercase();
        assert_eq!(normalize_sha256(&format!(" {upper}\n")).as_deref(), Some(EMPTY));
        assert_eq!(normalize_sha256(&EMPTY[..63]), None);
        assert_eq!(normalize_sha256(&format!("{}g", &EMPTY[..63])), None);
        assert_eq!(normalize_sha256(""), None);
    }

    #[test]
    fn same_digest_ignores_case() {
        assert!(same_digest(EMPTY, &EMPTY.to_ascii_uppercase()));
        assert!(!same_digest(EMPTY, &EMPTY.replace('e', "f")));
    }

    #[test]
    fn file_and_writer_hashes_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&path).unwrap(), want);

        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"ab").unwrap();
        w.write_all(b"c").unwrap();
        let (inner, digest, n) = w.finish().unwrap();
        assert_eq!((inner.as_slice(), digest.as_str(), n), (&b"abc"[..], want, 3));

        let mut hasher = Sha256::new();
        assert_eq!(hash_prefix(&path, Some(2), &mut hasher).unwrap(), 2);
        hasher.update(b"c");
        assert_eq!(hex::encode(hasher.finalize()), want);
        assert_eq!(sha256_file(Path::new("/nonexistent/revis")).map_err(|e| e.kind()), Err(io::ErrorKind::NotFound));
    }
}
