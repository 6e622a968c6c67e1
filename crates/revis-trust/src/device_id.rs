//! `DeviceId`: SHA-256 of a certificate's DER, and its readable form.
//!
//! Form: the 32 bytes in base32 (RFC 4648 alphabet, upper case, no padding)
//! are 52 characters; each quarter of 13 gets one Luhn mod 32 check
//! character (56 in all), written as 8 groups of 7 joined by `-`:
//! `AAAAAAA-BBBBBBB-...`. Parsing ignores case, `-` and spaces, and rejects a
//! mistyped character (the check characters catch any single substitution
//! and most swaps of neighbours).

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::TrustError;

const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
/// Base32 characters in a digest (256 bits / 5, rounded up).
const DATA_CHARS: usize = 52;
/// Data characters per check character.
const CHUNK: usize = 13;
/// Characters in the readable form, without separators.
const CHARS: usize = DATA_CHARS + DATA_CHARS / CHUNK;
const GROUP: usize = 7;

/// A device's identity: SHA-256 of its certificate's DER.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId([u8; 32]);

impl DeviceId {
    /// The device ID of the certificate `der`.
    pub fn of_certificate(der: &[u8]) -> Self {
        Self(Sha256::digest(der).into())
    }

    /// From the raw digest.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'2'..=b'7' => Some(c - b'2' + 26),
        _ => None,
    }
}

/// Luhn mod 32 over `chunk` (already valid base32): the check character.
fn luhn32(chunk: &[u8]) -> u8 {
    let mut sum = 0u32;
    // From the rightmost character, doubling every other one starting there.
    for (i, &c) in chunk.iter().rev().enumerate() {
        let v = u32::from(value(c).expect("base32 character"));
        let addend = if i % 2 == 0 { v * 2 } else { v };
        sum += addend / 32 + addend % 32;
    }
    ALPHABET[((32 - sum % 32) % 32) as usize]
}

fn base32(bytes: &[u8; 32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(DATA_CHARS);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((acc >> bits) & 31) as usize]);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (5 - bits)) & 31) as usize]);
    }
    out
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = Vec::with_capacity(CHARS);
        for chunk in base32(&self.0).chunks(CHUNK) {
            chars.extend_from_slice(chunk);
            chars.push(luhn32(chunk));
        }
        for (i, group) in chars.chunks(GROUP).enumerate() {
            if i > 0 {
                f.write_str("-")?;
            }
            f.write_str(std::str::from_utf8(group).expect("ASCII"))?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceId({self})")
    }
}

impl FromStr for DeviceId {
    type Err = TrustError;

    fn from_str(s: &str) -> Result<Self, TrustError> {
        let chars: Vec<u8> = s.bytes().filter(|c| !matches!(c, b'-' | b' ')).map(|c| c.to_ascii_uppercase()).collect();
        if chars.len() != CHARS {
            return Err(TrustError::InvalidDeviceId("expected 56 characters (8 groups of 7)"));
        }
        if chars.iter().any(|&c| value(c).is_none()) {
            return Err(TrustError::InvalidDeviceId("only the letters A-Z and the digits 2-7 may appear"));
        }
        let mut data = Vec::with_capacity(DATA_CHARS);
        for chunk in chars.chunks(CHUNK + 1) {
            let (body, check) = chunk.split_at(CHUNK);
            if luhn32(body) != check[0] {
                return Err(TrustError::InvalidDeviceId("a check character does not match (mistyped?)"));
            }
            data.extend_from_slice(body);
        }
        let mut out = [0u8; 32];
        let (mut acc, mut bits, mut n) = (0u32, 0u32, 0usize);
        for &c in &data {
            acc = (acc << 5) | u32::from(value(c).expect("checked"));
            bits += 5;
            if bits >= 8 {
                bits -= 8;
                out[n] = (acc >> bits) as u8;
                n += 1;
            }
        }
        // 52 * 5 = 260 bits: the last 4 are padding and must be zero.
        if acc & ((1 << bits) - 1) != 0 {
            return Err(TrustError::InvalidDeviceId("trailing bits are not zero"));
        }
        Ok(Self(out))
    }
}

impl serde::Serialize for DeviceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
