//! A crate's modules (files), what each names of the others, and the
//! circles in that graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::lex::{Tok, strip, tokens, without_tests};
use super::tree::rel;

type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    code: String,
    children: BTreeSet<String>,
}

pub struct ModuleTree {
    modules: BTreeMap<ModPath, Module>,
}

impl ModuleTree {
    /// Every non-test module of a crate's library and binaries, from `src/`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let mut tree = ModuleTree { modules: BTreeMap::new() };
        let src = dir.join("src");
        let mut roots = Vec::new();
        for name in ["lib.rs", "main.rs"] {
            if src.join(name).exists() {
                roots.push((vec![name.trim_end_matches(".rs").to_owned()], src.join(name)));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            for bin in bins.filter_map(|e| e.ok().map(|e| e.path())) {
                if bin.extension().is_some_and(|e| e == "rs") {
                    let stem = bin.file_stem().unwrap_or_default().to_string_lossy().into_owned();
                    roots.push((vec![format!("bin:{stem}")], bin));
                }
            }
        }
        // tests/ keeps its end-to-end suite under e2e/.
        if dir.join("e2e/main.rs").exists() {
            roots.push((vec!["e2e".to_owned()], dir.join("e2e/main.rs")));
        }
        for (path, file) in roots {
            tree.load(path, file)?;
        }
        Ok(tree)
    }

    fn load(&mut self, path: ModPath, file: PathBuf) -> anyhow::Result<()> {
        let src = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let (code, test_mods) = without_tests(&strip(&src));
        let toks = tokens(&code);
        let mut children = BTreeSet::new();
        for w in toks.windows(3) {
            if let [Tok::Ident(m), Tok::Ident(name), Tok::Punct(';')] = w
                && m == "mod"
                && !test_mods.contains(name)
            {
                children.insert(name.clone());
            }
        }
        let is_dir_owner = matches!(file.file_name().and_then(|n| n.to_str()), Some("lib.rs" | "main.rs" | "mod.rs"))
            || path.len() == 1 && path[0].starts_with("bin:")
            || path == ["e2e"];
        let base = if is_dir_owner { file.parent().expect("a file has a folder").to_path_buf() } else { file.with_extension("") };
        let mut found = BTreeSet::new();
        for child in &children {
            let flat = base.join(format!("{child}.rs"));
            let nested = base.join(child).join("mod.rs");
            let child_file = if flat.exists() {
                flat
            } else if nested.exists() {
                nested
            } else {
                continue; // generated code (include!), or a module of another cfg
            };
            let mut child_path = path.clone();
            child_path.push(child.clone());
            self.load(child_path, child_file)?;
            found.insert(child.clone());
        }
        self.modules.insert(path, Module { file, code, children: found });
        Ok(())
    }

    pub fn describe(&self, m: &ModPath, root: &Path) -> String {
        rel(root, &self.modules[m].file)
    }

    /// Each file's non-test lines (blank lines and comment-only lines count:
    /// they are read too).
    pub fn sizes(&self) -> Vec<(PathBuf, usize)> {
        self.modules
            .values()
            .map(|m| {
                let lines = m.code.lines().collect::<Vec<_>>();
                let last = lines.iter().rposition(|l| !l.trim().is_empty()).map_or(0, |p| p + 1);
                // Blanked test items leave empty lines: count only up to the
                // last line of code, less runs of 3+ blank lines they leave.
                let mut count = 0;
                let mut blank_run = 0;
                for l in &lines[..last] {
                    if l.trim().is_empty() {
                        blank_run += 1;
                    } else {
                        if blank_run < 3 {
                            count += blank_run;
                        }
                        blank_run = 0;
                        count += 1;
                    }
                }
                (m.file.clone(), count)
            })
            .collect()
    }

    /// The module a path names an item of, resolved from `from`, with the
    /// names `from` imported as modules.
    fn resolve(&self, from: &ModPath, aliases: &BTreeMap<String, ModPath>, segs: &[String]) -> Option<(ModPath, Option<String>)> {
        let root = vec![from[0].clone()];
        let mut at: ModPath;
        let mut rest = segs;
        match segs.first()?.as_str() {
            "crate" => {
                at = root;
                rest = &segs[1..];
            }
            "self" => {
                at = from.clone();
                rest = &segs[1..];
            }
            "super" => {
                at = from.clone();
                while rest.first().is_some_and(|s| s == "super") {
                    if at.len() > 1 {
                        at.pop();
                    }
                    rest = &rest[1..];
                }
            }
            first => {
                if self.modules.get(from).is_some_and(|m| m.children.contains(first)) {
                    at = from.clone();
                } else if let Some(target) = aliases.get(first) {
                    at = target.clone();
                    rest = &segs[1..];
                } else {
                    return None;
                }
            }
        }
        while let Some(seg) = rest.first() {
            if self.modules.get(&at).is_some_and(|m| m.children.contains(seg)) {
                at.push(seg.clone());
                rest = &rest[1..];
            } else {
                break;
            }
        }
        // (module, the item of it named, if not the module itself)
        Some((at, rest.first().cloned()))
    }

    /// The `use` statements of a module: each path with the name it binds
    /// and whether it is public (a re-export).
    fn uses(toks: &[Tok]) -> Vec<(Vec<String>, String, bool)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            if toks[i] == Tok::Ident("use".into()) && (i == 0 || !matches!(toks[i - 1], Tok::PathSep)) {
                let public = i > 0 && (matches!(&toks[i - 1], Tok::Ident(p) if p == "pub") || toks[i - 1] == Tok::Punct(')'));
                let end = toks[i..].iter().position(|t| *t == Tok::Punct(';')).map_or(toks.len(), |p| i + p);
                out.extend(expand_use(&toks[i + 1..end]).into_iter().map(|(segs, alias)| (segs, alias, public)));
                i = end;
            }
            i += 1;
        }
        out
    }

    /// Each module's re-exports: the name it makes public, and the module
    /// and item it comes from.
    fn reexports(&self) -> BTreeMap<ModPath, BTreeMap<String, (ModPath, String)>> {
        let mut out: BTreeMap<ModPath, BTreeMap<String, (ModPath, String)>> = BTreeMap::new();
        for (path, module) in &self.modules {
            for (segs, alias, public) in Self::uses(&tokens(&module.code)) {
                if public
                    && let Some((m, Some(item))) = self.resolve(path, &BTreeMap::new(), &segs)
                    && item != "*"
                {
                    out.entry(path.clone()).or_default().insert(alias, (m, item));
                }
            }
        }
        out
    }

    /// Who depends on whom. A re-export (`pub use`) is a doorway, not a
    /// use: a path through one counts for the module that defines the item,
    /// and the re-export itself makes no edge.
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let reexports = self.reexports();
        let owner = |mut m: ModPath, mut item: String| -> ModPath {
            for _ in 0..8 {
                match reexports.get(&m).and_then(|r| r.get(&item)) {
                    Some((m2, item2)) if *m2 != m || *item2 != item => {
                        (m, item) = (m2.clone(), item2.clone());
                    }
                    _ => break,
                }
            }
            m
        };
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (path, module) in &self.modules {
            let toks = tokens(&module.code);
            let mut aliases = BTreeMap::new();
            let mut named = Vec::new();
            // `use` trees first: they also say which names are modules.
            for (segs, alias, public) in Self::uses(&toks) {
                match self.resolve(path, &aliases, &segs) {
                    Some((_, Some(_))) if public => {}
                    Some((m, Some(item))) if item == "*" => named.push(m),
                    Some((m, Some(item))) => named.push(owner(m, item)),
                    Some((m, None)) => {
                        aliases.insert(alias, m);
                    }
                    None => {}
                }
            }
            // Then every other path in the code.
            let mut i = 0;
            while i < toks.len() {
                let starts = matches!(toks[i], Tok::Ident(_)) && (i == 0 || toks[i - 1] != Tok::PathSep);
                if starts && toks[i] != Tok::Ident("use".into()) && toks[i] != Tok::Ident("mod".into()) {
                    let mut segs = Vec::new();
                    let mut j = i;
                    while let Some(Tok::Ident(s)) = toks.get(j) {
                        segs.push(s.clone());
                        if toks.get(j + 1) == Some(&Tok::PathSep) {
                            j += 2;
                        } else {
                            break;
                        }
                    }
                    if segs.len() > 1
                        && let Some((m, Some(item))) = self.resolve(path, &aliases, &segs)
                    {
                        named.push(owner(m, item));
                    }
                    i = j + 1;
                } else if toks[i] == Tok::Ident("use".into()) {
                    i += toks[i..].iter().position(|t| *t == Tok::Punct(';')).unwrap_or(toks.len() - i);
                } else {
                    i += 1;
                }
            }
            let out = edges.entry(path.clone()).or_default();
            for m in named {
                if &m != path {
                    out.insert(m);
                }
            }
        }
        edges
    }

    /// The import graph's strongly connected parts of more than one module,
    /// each with one cycle through them.
    pub fn cycles(&self) -> Vec<(Vec<ModPath>, Vec<ModPath>)> {
        let edges = self.edges();
        let mut out = Vec::new();
        for mut scc in strongly_connected(&edges) {
            if scc.len() > 1 {
                scc.sort();
                let cycle = cycle_in(&edges, &scc);
                out.push((scc, cycle));
            }
        }
        out
    }
}

/// `use` tree tokens (after `use`, before `;`) as full paths, each with the
/// name it binds.
fn expand_use(toks: &[Tok]) -> Vec<(Vec<String>, String)> {
    fn walk(toks: &[Tok], prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
        // Split at top-level commas.
        let mut depth = 0;
        let mut start = 0;
        let mut parts = Vec::new();
        for (i, t) in toks.iter().enumerate() {
            match t {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    parts.push(&toks[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&toks[start..]);
        for part in parts {
            let mut segs = prefix.to_vec();
            let mut i = 0;
            let mut alias = None;
            while i < part.len() {
                match &part[i] {
                    Tok::Ident(s) if s == "as" => {
                        if let Some(Tok::Ident(a)) = part.get(i + 1) {
                            alias = Some(a.clone());
                        }
                        break;
                    }
                    Tok::Ident(s) if s == "pub" && segs.len() == prefix.len() => {
                        // `pub use`, `pub(crate) use`: skip the visibility.
                        i += 1;
                        if part.get(i) == Some(&Tok::Punct('(')) {
                            i += part[i..].iter().position(|t| *t == Tok::Punct(')')).unwrap_or(0) + 1;
                        }
                        continue;
                    }
                    Tok::Ident(s) => segs.push(s.clone()),
                    Tok::Punct('*') => segs.push("*".into()),
                    Tok::Punct('{') => {
                        let close = part.len() - 1 - part.iter().rev().position(|t| *t == Tok::Punct('}')).unwrap_or(0);
                        walk(&part[i + 1..close], &segs, out);
                        segs.clear();
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
            if segs.len() > prefix.len() || segs.last().is_some_and(|s| s == "self") {
                if segs.last().is_some_and(|s| s == "self") {
                    segs.pop();
                }
                let name = alias.unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
                if !segs.is_empty() {
                    out.push((segs, name));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(toks, &[], &mut out);
    out
}

fn strongly_connected(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Tarjan's algorithm, iteratively small enough to recurse: module trees are shallow.
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a ModPath) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.edges.get(v) {
            for w in ws {
                let Some((w, _)) = s.edges.get_key_value(w) else { continue };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let mut s = State { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on: BTreeSet::new(), out: Vec::new() };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// One shortest cycle through the first module of a strongly connected part.
fn cycle_in(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>, scc: &[ModPath]) -> Vec<ModPath> {
    let inside: BTreeSet<&ModPath> = scc.iter().collect();
    let start = scc.iter().min().expect("not empty");
    let mut prev: BTreeMap<&ModPath, &ModPath> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten().filter(|w| inside.contains(w)) {
            if w == start {
                let mut path = vec![v.clone()];
                let mut at = v;
                while at != start {
                    at = prev[at];
                    path.push(at.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    scc.to_vec()
}

#[cfg(test)]
mod tests {
    use super::super::architecture::{as_name, as_path, quoted_code};
    use super::super::lex::strip;
    use super::*;

    fn tree(files: &[(&str, &str)]) -> (tempdir::Dir, ModuleTree) {
        let dir = tempdir::Dir::new();
        for (name, text) in files {
            let p = dir.0.join("src").join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let t = ModuleTree::read(&dir.0).unwrap();
        (dir, t)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!("xtask-fitness-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn names(t: &ModuleTree) -> Vec<Vec<String>> {
        t.cycles().into_iter().map(|(_, c)| c.into_iter().map(|m| m.join("::")).collect()).collect()
    }

    #[test]
    fn a_two_file_circle_is_found_and_a_one_way_use_is_not() {
        let (_d, t) = tree(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("a.rs", "use crate::b::Thing;\npub struct Other;\n"),
            ("b.rs", "pub struct Thing;\nimpl From<crate::a::Other> for Thing { fn from(_: crate::a::Other) -> Self { Thing } }\n"),
            ("c.rs", "use crate::{a::Other, b::{self, Thing}};\nfn f() -> b::Thing { Thing }\n"),
        ]);
        assert_eq!(names(&t), vec![vec!["lib::a", "lib::b", "lib::a"]]);
    }

    #[test]
    fn a_reexport_is_a_doorway_but_a_parent_using_its_child_that_uses_it_is_a_circle() {
        let (_d, t) = tree(&[
            ("lib.rs", "mod room;\nmod other;\npub use room::Part;\n"),
            ("room/mod.rs", "mod part;\npub use part::Part;\npub struct Shared;\nfn f() -> part::Part { todo!() }\n"),
            ("room/part.rs", "use super::Shared;\npub struct Part(Shared);\n"),
            ("other.rs", "use crate::Part;\n"),
        ]);
        assert_eq!(names(&t), vec![vec!["lib::room", "lib::room::part", "lib::room"]]);
        let edges = t.edges();
        let other = vec!["lib".to_owned(), "other".to_owned()];
        let part = vec!["lib".to_owned(), "room".to_owned(), "part".to_owned()];
        assert_eq!(edges[&other], BTreeSet::from([part]), "a path through re-exports counts for the module that defines the item");
        assert!(edges[&vec!["lib".to_owned()]].is_empty());
    }

    #[test]
    fn test_code_comments_and_strings_make_no_edge() {
        let (_d, t) = tree(&[
            ("lib.rs", "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n"),
            ("a.rs", "pub struct A;\n// crate::b::B\nconst S: &str = \"crate::b::B\";\n#[cfg(test)]\nmod tests { use crate::b::B; }\n"),
            ("b.rs", "pub struct B(crate::a::A);\n"),
            ("tests.rs", "use crate::a::A; use crate::b::B;\n"),
        ]);
        assert!(names(&t).is_empty(), "{:?}", names(&t));
        assert!(!t.modules.contains_key(&vec!["lib".to_owned(), "tests".to_owned()]));
    }

    #[test]
    fn test_items_do_not_count_against_the_budget() {
        let body = "fn f() {}\n".repeat(5);
        let tests = format!("#[cfg(test)]\nmod tests {{\n{}}}\n", "fn t() {}\n".repeat(50));
        let (_d, t) = tree(&[("lib.rs", &format!("{body}{tests}"))]);
        assert_eq!(t.sizes()[0].1, 5);
    }

    #[test]
    fn architecture_quotes_are_read_as_paths_or_names() {
        assert_eq!(as_path("crates/revis-http/src/lib.rs"), Some("crates/revis-http/src/lib.rs"));
        assert_eq!(as_path("revis chat --verbose"), None);
        assert_eq!(as_path("revis-rpc/1"), None);
        assert_eq!(as_path("turn.rs"), Some("turn.rs"));
        assert_eq!(as_name("revis_models::choose"), Some("choose"));
        assert_eq!(as_name("KEEP_DECODE"), Some("KEEP_DECODE"));
        assert_eq!(as_name("Chat"), Some("Chat"));
        assert_eq!(as_name("revisd"), None);
        assert_eq!(quoted_code("a `x` b `y::Z` c `wrapped\nname`\n```\n`no`\n```\n"), vec!["x", "y::Z", "wrapped name"]);
    }

    #[test]
    fn strings_lifetimes_and_raw_strings_are_stripped_without_losing_lines() {
        let src = "fn f<'a>(x: &'a str) -> char { let _ = r#\"crate::b\"#; let _ = \"a\\\"b\"; '\\n' }\n// c\nx";
        let s = strip(src);
        assert_eq!(s.lines().count(), src.lines().count());
        assert!(!s.contains("crate::b") && s.contains("'a"));
    }
}
