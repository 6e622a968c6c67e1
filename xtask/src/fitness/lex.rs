//! Just enough lexing for the checks: comments and literals blanked, tokens,
//! test items removed.

use std::collections::BTreeSet;

/// Source with comments, string and character literals blanked (newlines
/// kept, so line counts hold).
pub fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if let Some(len) = raw_string(rest) {
            out.push('"');
            blank(&mut out, &rest[1..len - 1]);
            out.push('"');
            i += len;
        } else if rest[0] == b'"' || rest.starts_with(b"b\"") {
            let start = if rest[0] == b'b' { 1 } else { 0 };
            let mut j = start + 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            out.push('"');
            blank(&mut out, &rest[1..end - 1]);
            out.push('"');
            i += end;
        } else if rest[0] == b'\'' {
            // A character literal ('a', '\n', '\u{..}'), or a lifetime.
            let len = if rest.len() > 2 && rest[1] == b'\\' {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            match len {
                Some(len) => {
                    blank(&mut out, &rest[..len]);
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br#"…"#`) at the start of `s`.
fn raw_string(s: &[u8]) -> Option<usize> {
    let start = if s.starts_with(b"br") {
        2
    } else if s.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = s[start..].iter().take_while(|&&c| c == b'#').count();
    if s.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
    let body = start + hashes + 1;
    let end = s[body..].windows(close.len()).position(|w| w == close.as_slice())?;
    Some(body + end + close.len())
}

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    PathSep,
    Punct(char),
}

pub fn tokens(code: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_alphabetic() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if d.is_alphanumeric() || d == '_' {
                    end = j + d.len_utf8();
                    chars.next();
                } else {
                    break;
                }
            }
            let word = &code[i..end];
            out.push(Tok::Ident(word.strip_prefix("r#").unwrap_or(word).to_owned()));
        } else if c.is_ascii_digit() {
            while chars.peek().is_some_and(|&(_, d)| d.is_alphanumeric() || d == '_' || d == '.') {
                chars.next();
            }
        } else if c == ':' && chars.peek().is_some_and(|&(_, d)| d == ':') {
            chars.next();
            out.push(Tok::PathSep);
        } else if !c.is_whitespace() {
            out.push(Tok::Punct(c));
        }
    }
    out
}

/// `code` (already stripped) without the items under `#[cfg(test)]`, and the
/// names of the child modules declared under it (`#[cfg(test)] mod tests;`).
pub fn without_tests(code: &str) -> (String, BTreeSet<String>) {
    let mut out = code.to_owned();
    let mut test_mods = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = out[from..].find("#[cfg(test)]") {
        let start = from + found;
        let bytes = out.as_bytes();
        let mut j = start + "#[cfg(test)]".len();
        // Further attributes, then the item up to its `;` or its closing brace.
        let mut depth = 0usize;
        let mut end = out.len();
        let mut k = j;
        while k < bytes.len() {
            match bytes[k] {
                b'#' if depth == 0 && bytes.get(k + 1) == Some(&b'[') => {
                    let close = out[k..].find(']').map_or(out.len(), |p| k + p + 1);
                    k = close;
                    continue;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
            k += 1;
        }
        let item = &out[j..end];
        let toks = tokens(item);
        if let [Tok::Ident(m), Tok::Ident(name), Tok::Punct(';'), ..] = toks.as_slice()
            && m == "mod"
        {
            test_mods.insert(name.clone());
        } else if let [Tok::Ident(p), Tok::Ident(m), Tok::Ident(name), Tok::Punct(';'), ..] = toks.as_slice()
            && p.starts_with("pub")
            && m == "mod"
        {
            test_mods.insert(name.clone());
        }
        j = start;
        let blanked: String = out[j..end].chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect();
        out.replace_range(j..end, &blanked);
        from = j + blanked.len();
    }
    (out, test_mods)
}
