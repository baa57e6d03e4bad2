//! The engine's modules import each other without a circle: every module of
//! `src/engine/` names only modules below it, so each can be read (and
//! changed) knowing only what is under it. A shard's field types live below
//! the shard (`objects`, `journal`, `fetch`, `trail`, `controls`); the
//! modules that add methods to the shard (`handshake`, `working`,
//! `reconcile`) and its drivers (`driver`, `startup`, `turn_on`) above it.
//!
//! The check reads the sources: a module's edges are the engine items it
//! names through `super::`, `crate::engine::` or the crate root's
//! re-exports of engine items, in `use` declarations and in paths alike,
//! outside comments, string literals and `#[cfg(test)]` modules (tests may
//! name anything). A name re-exported by `engine/mod.rs` counts as the
//! module it comes from. A folder module (`driver/`) is one node; its files'
//! references to each other are its own business.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One token of Rust source, as far as paths are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// An identifier or keyword.
    Ident(String),
    /// `::`.
    PathSep,
    /// Any other punctuation character.
    Punct(char),
}

/// The tokens of `source`, without comments, string and character
/// literals, and numbers.
fn tokens(source: &str) -> Vec<Token> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1, 0);
        } else if c == 'r' && matches!(next, Some('"') | Some('#')) && raw_string_at(&chars, i) {
            let mut hashes = 0;
            i += 1;
            while chars[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i = skip_string(&chars, i + 1, hashes);
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && next == Some(':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

/// Whether `r` at `i` opens a raw string (`r"`, `r#"`), not an identifier.
fn raw_string_at(chars: &[char], i: usize) -> bool {
    let before_ok = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    let mut j = i + 1;
    while j < chars.len() && chars[j] == '#' {
        j += 1;
    }
    before_ok && chars.get(j) == Some(&'"')
}

/// The index after the string that starts at `i` (after its opening
/// quote), closed by a quote and `hashes` hash signs.
fn skip_string(chars: &[char], mut i: usize, hashes: usize) -> usize {
    while i < chars.len() {
        if hashes == 0 && chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

fn ident(t: Option<&Token>) -> Option<&str> {
    match t {
        Some(Token::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The index after the item that starts at `i` (an item ends at its first
/// `;` outside brackets, or with its first brace block).
fn item_end(tokens: &[Token], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < tokens.len() {
        match tokens[i] {
            Token::Punct('{') | Token::Punct('(') | Token::Punct('[') => depth += 1,
            Token::Punct(')') | Token::Punct(']') => depth = depth.saturating_sub(1),
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            Token::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// `tokens` without the modules compiled only for tests (`#[cfg(test)]`,
/// `#[cfg(all(test, ...))]` before a `mod`).
fn without_test_modules(tokens: &[Token]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == Token::Punct('#') && tokens.get(i + 1) == Some(&Token::Punct('[')) {
            let close = item_end_bracket(tokens, i + 1);
            let attribute = &tokens[i + 2..close];
            let test_cfg = ident(attribute.first()) == Some("cfg")
                && attribute.iter().any(|t| ident(Some(t)) == Some("test"));
            let mut after = close + 1;
            while ident(tokens.get(after)) == Some("pub") {
                after += 1;
                if tokens.get(after) == Some(&Token::Punct('(')) {
                    after = item_end_bracket(tokens, after) + 1;
                }
            }
            if test_cfg && ident(tokens.get(after)) == Some("mod") {
                i = item_end(tokens, after);
                continue;
            }
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// The index of the bracket closing the one at `open`.
fn item_end_bracket(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t {
            Token::Punct('(') | Token::Punct('[') | Token::Punct('{') => depth += 1,
            Token::Punct(')') | Token::Punct(']') | Token::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// A path found in the source: its segments, and the name it binds when it
/// is a `use` leaf renamed with `as`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Found {
    segments: Vec<String>,
    alias: Option<String>,
}

/// Every path that starts with `super::` or `crate::` (a `use` tree is
/// expanded into its leaves: `super::{a::B, C}` gives `super::a::B` and
/// `super::C`).
fn paths(tokens: &[Token]) -> Vec<Found> {
    let mut found = Vec::new();
    let mut i = 0;
    while i + 1 < tokens.len() {
        let starts = matches!(ident(tokens.get(i)), Some("super") | Some("crate"))
            && tokens[i + 1] == Token::PathSep
            && (i == 0 || tokens[i - 1] != Token::PathSep);
        if starts {
            i = use_tree(tokens, i, Vec::new(), &mut found);
        } else {
            i += 1;
        }
    }
    found
}

/// Reads the use tree (or path) at `i` under `prefix` into `found`;
/// returns the index after it.
fn use_tree(tokens: &[Token], mut i: usize, prefix: Vec<String>, found: &mut Vec<Found>) -> usize {
    match tokens.get(i) {
        Some(Token::Punct('{')) => {
            i += 1;
            while i < tokens.len() && tokens[i] != Token::Punct('}') {
                i = use_tree(tokens, i, prefix.clone(), found);
                if tokens.get(i) == Some(&Token::Punct(',')) {
                    i += 1;
                }
            }
            i + 1
        }
        Some(Token::Punct('*')) => {
            let mut segments = prefix;
            segments.push("*".to_owned());
            found.push(Found {
                segments,
                alias: None,
            });
            i + 1
        }
        Some(Token::Ident(name)) => {
            let mut segments = prefix;
            segments.push(name.clone());
            i += 1;
            if tokens.get(i) == Some(&Token::PathSep) {
                return use_tree(tokens, i + 1, segments, found);
            }
            let mut alias = None;
            if ident(tokens.get(i)) == Some("as") {
                alias = ident(tokens.get(i + 1)).map(str::to_owned);
                i += 2;
            }
            found.push(Found { segments, alias });
            i
        }
        _ => i + 1,
    }
}

/// The modules `source` declares with `mod name;` (not those compiled only
/// for tests).
fn declared_modules(source: &str) -> Vec<String> {
    let tokens = without_test_modules(&tokens(source));
    tokens
        .windows(3)
        .filter_map(|w| match w {
            [Token::Ident(m), Token::Ident(name), Token::Punct(';')] if m == "mod" => {
                Some(name.clone())
            }
            _ => None,
        })
        .collect()
}

/// One module's reference to another: where it is and what it names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Reference {
    file: String,
    path: String,
}

/// The engine's module graph: for each module, the modules it names, each
/// with the references that make the edge.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<Reference>>>;

/// The graph of the engine whose files `files` holds (path relative to
/// `src/` → text): `lib.rs`, `engine/mod.rs` and the module files it
/// declares.
fn engine_graph(files: &BTreeMap<String, String>) -> Graph {
    let read = |path: &str| files.get(path).map(String::as_str);
    let engine = read("engine/mod.rs").expect("engine/mod.rs is among the files");
    // Each node's files, with how many `super::` reach the engine from them.
    let mut nodes: BTreeMap<String, Vec<(String, usize)>> = BTreeMap::new();
    for name in declared_modules(engine) {
        let flat = format!("engine/{name}.rs");
        let folder = format!("engine/{name}/mod.rs");
        let mut members = Vec::new();
        if let Some(text) = read(&flat).or_else(|| read(&folder)) {
            let own = if read(&flat).is_some() { flat } else { folder };
            for child in declared_modules(text) {
                for candidate in [
                    format!("engine/{name}/{child}.rs"),
                    format!("engine/{name}/{child}/mod.rs"),
                ] {
                    if read(&candidate).is_some() {
                        members.push((candidate, 2));
                    }
                }
            }
            members.insert(0, (own, 1));
        }
        nodes.insert(name, members);
    }
    // What engine/mod.rs re-exports: name → the module it comes from.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    for found in paths(&use_trees(engine)) {
        if let Some(module) = found.segments.get(1).filter(|m| nodes.contains_key(*m)) {
            let name = found
                .alias
                .clone()
                .or_else(|| found.segments.last().cloned());
            if let Some(name) = name {
                reexports.insert(name, module.clone());
            }
        }
    }
    // What the crate root re-exports from the engine: its name at the root
    // → its path in the engine.
    let root_exports: BTreeMap<String, Vec<String>> = read("lib.rs")
        .map(|lib| {
            paths(&use_trees(lib))
                .into_iter()
                .filter(|f| f.segments.get(1).map(String::as_str) == Some("engine"))
                .filter_map(|f| {
                    let name = f.alias.or_else(|| f.segments.last().cloned())?;
                    Some((name, f.segments[2..].to_vec()))
                })
                .collect()
        })
        .unwrap_or_default();

    let mut graph = Graph::new();
    for (node, members) in &nodes {
        let edges = graph.entry(node.clone()).or_default();
        for (file, depth) in members {
            let text = read(file).expect("listed above");
            let tokens = without_test_modules(&tokens(text));
            for found in paths(&tokens) {
                let segments = &found.segments;
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let in_engine: Vec<String> = if supers > 0 {
                    if supers != *depth {
                        continue;
                    }
                    segments[supers..].to_vec()
                } else if segments.get(1).map(String::as_str) == Some("engine") {
                    segments[2..].to_vec()
                } else if let Some(inner) = segments.get(1).and_then(|s| root_exports.get(s)) {
                    inner.iter().chain(&segments[2..]).cloned().collect()
                } else {
                    continue;
                };
                let Some(first) = in_engine.first() else {
                    continue;
                };
                let target = if nodes.contains_key(first) {
                    Some(first.clone())
                } else {
                    reexports.get(first).cloned()
                };
                if let Some(target) = target.filter(|t| t != node) {
                    edges.entry(target).or_default().insert(Reference {
                        file: file.clone(),
                        path: segments.join("::"),
                    });
                }
            }
        }
    }
    graph
}

/// `source` tokenised, keeping only its `use` declarations' trees, each
/// rooted at `crate::` (`pub use engine::X` and `pub use crate::engine::X`
/// both become `crate::engine::X`), for [`paths`] to expand.
fn use_trees(source: &str) -> Vec<Token> {
    let tokens = without_test_modules(&tokens(source));
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if ident(tokens.get(i)) == Some("use") {
            let end = item_end(&tokens, i);
            let mut tree = &tokens[i + 1..end];
            if ident(tree.first()) == Some("crate") && tree.get(1) == Some(&Token::PathSep) {
                tree = &tree[2..];
            }
            out.push(Token::Ident("crate".to_owned()));
            out.push(Token::PathSep);
            out.extend_from_slice(tree);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// The strongly connected components of `graph` with more than one module
/// (Tarjan's algorithm), each sorted, in the order of their first module.
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found.sort();
    s.found
}

/// The circles of `graph` in words: each with the references inside it.
fn describe(graph: &Graph, circles: &[Vec<String>]) -> String {
    let mut text = String::new();
    for circle in circles {
        text.push_str(&format!("import circle [{}]:\n", circle.join(", ")));
        for from in circle {
            for (to, references) in &graph[from] {
                if circle.contains(to) {
                    for r in references {
                        text.push_str(&format!("  {from} -> {to}: {} names {}\n", r.file, r.path));
                    }
                }
            }
        }
    }
    text
}

/// The core crate's `lib.rs` and every file under `src/engine/`.
fn engine_sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut pending = vec![src.join("engine")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/engine is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&src).expect("under src");
                let key = relative.to_string_lossy().replace('\\', "/");
                files.insert(
                    key,
                    std::fs::read_to_string(&path).expect("a readable file"),
                );
            }
        }
    }
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs is readable");
    files.insert("lib.rs".to_owned(), lib);
    files
}

#[test]
fn the_engine_has_no_import_circle() {
    let graph = engine_graph(&engine_sources());
    let found = circles(&graph);
    assert!(found.is_empty(), "{}", describe(&graph, &found));
    // The graph was read at all: the shard names the modules below it.
    let shard: Vec<&str> = graph["shard"].keys().map(String::as_str).collect();
    assert_eq!(
        shard,
        ["budget", "context", "controls", "fetch", "journal", "objects", "receipt", "trail"]
    );
}

fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect()
}

#[test]
fn a_circle_through_a_reexport_a_folder_module_and_a_root_path_is_named() {
    let files = sources(&[
        ("lib.rs", "pub mod engine;\npub use engine::{Ring as Circle, Shard};"),
        (
            "engine/mod.rs",
            "mod a;\nmod b;\nmod c;\nmod d;\npub use a::{Shard, Other};\npub use b::Ring;",
        ),
        ("engine/a.rs", "use super::c::Leaf; pub struct Shard { r: crate::Circle }"),
        ("engine/b/mod.rs", "mod inner;\n#[cfg(test)]\nmod tests;\npub struct Ring;"),
        ("engine/b/inner.rs", "use super::super::{d::X, Shard as S};"),
        ("engine/b/tests.rs", "use crate::engine::c::Leaf;"),
        (
            "engine/c.rs",
            "// use super::a::Shard;\nconst T: &str = \"super::a::Shard\";\n\
             #[cfg(all(test, not(loom)))]\nmod tests { use super::super::a::Shard; }\npub struct Leaf;",
        ),
        ("engine/d.rs", "pub struct X; fn f<'a>(x: &'a str) -> char { 'a' }"),
    ]);
    let graph = engine_graph(&files);
    let found = circles(&graph);
    assert_eq!(found, [vec!["a".to_owned(), "b".to_owned()]]);
    assert_eq!(
        describe(&graph, &found),
        "import circle [a, b]:\n  a -> b: engine/a.rs names crate::Circle\n  \
         b -> a: engine/b/inner.rs names super::super::Shard\n"
    );
    // Comments, strings and test modules name nothing; `c` and `d` are leaves.
    assert!(graph["c"].is_empty());
    assert!(graph["d"].is_empty());
    assert_eq!(graph["a"].keys().collect::<Vec<_>>(), ["b", "c"]);
}
