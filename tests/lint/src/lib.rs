//! Checks of the workspace's own source, run by `cargo test`.
//!
//! [`import_cycles`]: files that import each other, directly or through others. Files of a
//! crate should depend on each other in one direction only, so each can be read (and
//! changed) knowing only what is below it. A file depends on another when it names an
//! item defined there: by a `use`, by a path in its code (`crate::x::y`, `super::z`), or by
//! a path inside a macro's tokens. Re-exports are followed to the file that defines the
//! item, so a `pub use` in a parent does not make every user of it depend on the parent.
//!
//! [`lock_closure`]: the packages a crate links (from `Cargo.lock`), so that a test can say
//! what a process must not link (the privileged node agent no signature verification).
//!
//! Hand-written on `syn` (the parser rustc's proc macros use): no maintained tool answers
//! this question for a whole workspace without building it (cargo-modules needs
//! rust-analyzer and minutes per crate).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module: a crate root and the path below it.
type ModKey = (usize, Vec<String>);

#[derive(Debug, Default)]
struct Module {
    file: usize,
    /// Items defined here (types, functions, constants, traits, macros, ...).
    items: HashSet<String>,
    /// Child modules.
    children: HashSet<String>,
    /// `use` declarations: (path, the name it binds; `None` for a glob).
    uses: Vec<(Vec<String>, Option<String>)>,
}

/// What the analysis found: files, and which file names which.
#[derive(Debug, Default)]
pub struct Graph {
    files: Vec<PathBuf>,
    modules: HashMap<ModKey, Module>,
    /// Paths named in each module's code: (module, path).
    references: Vec<(ModKey, Vec<String>)>,
    /// `(from, to)` file indices, with one path that makes the edge.
    edges: BTreeMap<(usize, usize), String>,
}

/// A circle of files: each imports the next, the last the first. Each entry is a file
/// (relative to the root given to [`import_cycles`]) and the path by which it imports the
/// next one.
pub type Cycle = Vec<(String, String)>;

/// Every circle of files importing each other among the crates at `crate_dirs` (their
/// `src/lib.rs`, `src/main.rs`, `src/bin/*`, `tests/*`, `benches/*` and `examples/*` roots
/// and every module below them), paths relative to `root`.
pub fn import_cycles(root: &Path, crate_dirs: &[PathBuf]) -> Result<Vec<Cycle>, String> {
    let mut graph = Graph::default();
    let mut krate = 0;
    for dir in crate_dirs {
        for entry in crate_roots(dir) {
            graph.load(krate, &entry, &[], true)?;
            krate += 1;
        }
    }
    graph.link();
    Ok(graph
        .cycles()
        .into_iter()
        .map(|cycle| {
            cycle
                .iter()
                .enumerate()
                .map(|(i, &file)| {
                    let next = cycle[(i + 1) % cycle.len()];
                    let shown = graph.files[file]
                        .strip_prefix(root)
                        .unwrap_or(&graph.files[file])
                        .display()
                        .to_string();
                    (shown, graph.edges[&(file, next)].clone())
                })
                .collect()
        })
        .collect())
}

/// The workspace members listed in `root`'s Cargo.toml (`members = [...]`).
pub fn workspace_members(root: &Path) -> Result<Vec<PathBuf>, String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| format!("{}: {e}", root.join("Cargo.toml").display()))?;
    let start = manifest
        .find("members")
        .and_then(|i| manifest[i..].find('[').map(|j| i + j + 1))
        .ok_or("no workspace members")?;
    let end = manifest[start..].find(']').ok_or("unterminated members")? + start;
    Ok(manifest[start..end]
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m))
        .collect())
}

/// Every package `root` depends on, directly or not, as `Cargo.lock` at `lock` records
/// them (normal, build and dev dependencies alike: an over-approximation of what it links).
pub fn lock_closure(lock: &Path, root: &str) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(lock).map_err(|e| format!("{}: {e}", lock.display()))?;
    let mut deps: HashMap<String, Vec<String>> = HashMap::new();
    for package in text.split("[[package]]").skip(1) {
        let mut name = None;
        let mut list = Vec::new();
        let mut in_deps = false;
        for line in package.lines() {
            let line = line.trim();
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_string());
            } else if line.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && line.starts_with(']') {
                in_deps = false;
            } else if in_deps {
                // "name" or "name version" (when two versions are locked).
                let entry = line.trim_end_matches(',').trim_matches('"');
                list.push(entry.split(' ').next().unwrap_or(entry).to_string());
            }
        }
        if let Some(name) = name {
            deps.entry(name).or_default().extend(list);
        }
    }
    if !deps.contains_key(root) {
        return Err(format!("{root} is not in {}", lock.display()));
    }
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.to_string()];
    while let Some(next) = stack.pop() {
        for dep in deps.get(&next).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                stack.push(dep.clone());
            }
        }
    }
    Ok(seen)
}

fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|r| dir.join(r))
        .filter(|p| p.is_file())
        .collect();
    for sub in ["src/bin", "tests", "benches", "examples"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "rs"))
            .collect();
        found.sort();
        roots.extend(found);
    }
    roots
}

impl Graph {
    /// Parse `path` as module `module` of crate `krate`, and the modules it declares.
    fn load(
        &mut self,
        krate: usize,
        path: &Path,
        module: &[String],
        is_root: bool,
    ) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = self.files.len();
        self.files.push(path.to_path_buf());
        // Where `mod x;` of this file looks for x: beside a root or a mod.rs, else in a
        // directory named after the file.
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some(n) if is_root || n == "mod.rs" => path.parent().unwrap_or(path).to_path_buf(),
            _ => path.with_extension(""),
        };
        self.module(krate, path, &dir, module, file, &parsed.items)
    }

    fn module(
        &mut self,
        krate: usize,
        path: &Path,
        dir: &Path,
        module: &[String],
        file: usize,
        items: &[syn::Item],
    ) -> Result<(), String> {
        let key = (krate, module.to_vec());
        self.modules.entry(key.clone()).or_default().file = file;
        let mut collector = Collector::default();
        for item in items {
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    self.modules
                        .entry(key.clone())
                        .or_default()
                        .children
                        .insert(name.clone());
                    let child = [module.to_vec(), vec![name.clone()]].concat();
                    if let Some((_, inner)) = &m.content {
                        self.module(krate, path, &dir.join(&name), &child, file, inner)?;
                    } else {
                        let target = path_attribute(&m.attrs)
                            .map(|p| path.parent().unwrap_or(path).join(p))
                            .or_else(|| {
                                [
                                    dir.join(format!("{name}.rs")),
                                    dir.join(&name).join("mod.rs"),
                                ]
                                .into_iter()
                                .find(|p| p.is_file())
                            });
                        if let Some(target) = target {
                            self.load(krate, &target, &child, false)?;
                        }
                    }
                }
                syn::Item::Use(u) => {
                    collector.visit_item_use(u);
                    flatten_use(&u.tree, &mut Vec::new(), &mut collector.uses);
                }
                other => {
                    if let Some(name) = item_name(other) {
                        collector.items.insert(name);
                    }
                    collector.visit_item(other);
                }
            }
        }
        let entry = self.modules.entry(key.clone()).or_default();
        entry.items.extend(collector.items);
        entry.uses.extend(collector.uses);
        self.references
            .extend(collector.paths.into_iter().map(|p| (key.clone(), p)));
        Ok(())
    }

    /// Resolve every reference to the file that defines what it names.
    fn link(&mut self) {
        let references = std::mem::take(&mut self.references);
        for (key, path) in &references {
            let from = self.modules[key].file;
            if let Some(to) = self.resolve(key, path, 0)
                && to != from
            {
                self.edges
                    .entry((from, to))
                    .or_insert_with(|| path.join("::"));
            }
        }
        // A `use` is a reference too (re-exports included).
        let uses: Vec<(ModKey, Vec<String>)> = self
            .modules
            .iter()
            .flat_map(|(k, m)| m.uses.iter().map(move |(p, _)| (k.clone(), p.clone())))
            .collect();
        for (key, path) in uses {
            let from = self.modules[&key].file;
            if let Some(to) = self.resolve(&key, &path, 0)
                && to != from
            {
                self.edges
                    .entry((from, to))
                    .or_insert_with(|| path.join("::"));
            }
        }
    }

    /// The file defining what `path` names, seen from module `key` (`None`: outside the
    /// crate, or not found).
    fn resolve(&self, key: &ModKey, path: &[String], depth: usize) -> Option<usize> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let (krate, here) = key;
        let (mut module, rest): (Vec<String>, &[String]) = match path[0].as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (here.clone(), &path[1..]),
            "super" => {
                let mut module = here.clone();
                let mut rest = path;
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
                (module, rest)
            }
            first => {
                let current = self.modules.get(key)?;
                if current.children.contains(first) {
                    (here.clone(), path)
                } else if current.items.contains(first) {
                    return Some(current.file);
                } else {
                    let (used, _) = current
                        .uses
                        .iter()
                        .find(|(p, name)| name.as_deref() == Some(first) && !p.is_empty())?;
                    let full: Vec<String> = used.iter().chain(&path[1..]).cloned().collect();
                    return self.resolve(key, &full, depth + 1);
                }
            }
        };
        let mut rest = rest;
        while let Some(next) = rest.first()
            && self
                .modules
                .get(&(*krate, module.clone()))
                .is_some_and(|m| m.children.contains(next))
        {
            module.push(next.clone());
            rest = &rest[1..];
        }
        let target_key = (*krate, module);
        let target = self.modules.get(&target_key)?;
        let Some(name) = rest.first() else {
            return Some(target.file);
        };
        if target.items.contains(name) {
            return Some(target.file);
        }
        for (used, bound) in &target.uses {
            if bound.as_deref() == Some(name.as_str()) && !used.is_empty() {
                let full: Vec<String> = used.iter().chain(&rest[1..]).cloned().collect();
                if let Some(file) = self.resolve(&target_key, &full, depth + 1) {
                    return Some(file);
                }
            }
        }
        for (used, bound) in &target.uses {
            if bound.is_none() {
                let full: Vec<String> = used.iter().chain(rest).cloned().collect();
                if let Some(file) = self.resolve(&target_key, &full, depth + 1) {
                    return Some(file);
                }
            }
        }
        Some(target.file)
    }

    /// Strongly connected groups of more than one file (Tarjan), each in a circular order.
    fn cycles(&self) -> Vec<Vec<usize>> {
        let mut next: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &(from, to) in self.edges.keys() {
            next.entry(from).or_default().push(to);
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: HashMap::new(),
            low: HashMap::new(),
            stack: Vec::new(),
            on_stack: HashSet::new(),
            counter: 0,
            groups: Vec::new(),
        };
        for file in 0..self.files.len() {
            if !tarjan.index.contains_key(&file) {
                tarjan.connect(file);
            }
        }
        tarjan
            .groups
            .into_iter()
            .filter(|g| g.len() > 1)
            .map(|group| circle(&next, &group.into_iter().collect()))
            .collect()
    }
}

/// A circle through `group` (strongly connected): from its smallest file, following edges
/// inside the group until a file repeats.
fn circle(next: &BTreeMap<usize, Vec<usize>>, group: &BTreeSet<usize>) -> Vec<usize> {
    let Some(&start) = group.first() else {
        return Vec::new();
    };
    // Breadth-first from `start` back to `start`, inside the group: the shortest circle.
    let mut parent: HashMap<usize, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(file) = queue.pop_front() {
        for &to in next.get(&file).into_iter().flatten() {
            if !group.contains(&to) {
                continue;
            }
            if to == start {
                let mut path = vec![file];
                let mut at = file;
                while at != start {
                    at = parent[&at];
                    path.push(at);
                }
                path.reverse();
                return path;
            }
            if to != start && !parent.contains_key(&to) {
                parent.insert(to, file);
                queue.push_back(to);
            }
        }
    }
    group.iter().copied().collect()
}

struct Tarjan<'a> {
    next: &'a BTreeMap<usize, Vec<usize>>,
    index: HashMap<usize, usize>,
    low: HashMap<usize, usize>,
    stack: Vec<usize>,
    on_stack: HashSet<usize>,
    counter: usize,
    groups: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn connect(&mut self, v: usize) {
        self.index.insert(v, self.counter);
        self.low.insert(v, self.counter);
        self.counter += 1;
        self.stack.push(v);
        self.on_stack.insert(v);
        for &w in self.next.get(&v).into_iter().flatten() {
            if !self.index.contains_key(&w) {
                self.connect(w);
                let low = self.low[&v].min(self.low[&w]);
                self.low.insert(v, low);
            } else if self.on_stack.contains(&w) {
                let low = self.low[&v].min(self.index[&w]);
                self.low.insert(v, low);
            }
        }
        if self.low[&v] == self.index[&v] {
            let mut group = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack.remove(&w);
                group.push(w);
                if w == v {
                    break;
                }
            }
            self.groups.push(group);
        }
    }
}

fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| {
        let syn::Meta::NameValue(nv) = &a.meta else {
            return None;
        };
        if !nv.path.is_ident("path") {
            return None;
        }
        match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        }
    })
}

fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Every path of a use tree, with the name it binds (`None` for a glob); `self` in a group
/// names the group's own path.
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                out.push((prefix.clone(), prefix.last().cloned()));
            } else {
                out.push(([prefix.clone(), vec![name.clone()]].concat(), Some(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let name = r.ident.to_string();
            let path = if name == "self" {
                prefix.clone()
            } else {
                [prefix.clone(), vec![name]].concat()
            };
            out.push((path, Some(r.rename.to_string())));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten_use(t, prefix, out);
            }
        }
    }
}

/// The items, uses and paths of one module's own items (not its inline submodules,
/// which are modules of their own).
#[derive(Default)]
struct Collector {
    items: HashSet<String>,
    uses: Vec<(Vec<String>, Option<String>)>,
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {
        // An inline module in a function body or block: not followed.
    }

    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {
        // Collected by `flatten_use`.
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.paths.push(segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        macro_paths(mac.tokens.clone(), &mut self.paths);
    }
}

/// Paths (`a::b::c`) in a macro's tokens, which syn leaves unparsed.
fn macro_paths(tokens: proc_macro2::TokenStream, out: &mut Vec<Vec<String>>) {
    use proc_macro2::TokenTree;
    let mut current: Vec<String> = Vec::new();
    let mut colons = 0;
    let flush = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if current.len() > 1 {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for token in tokens {
        match token {
            TokenTree::Ident(i) => {
                if colons != 2 {
                    flush(&mut current, out);
                }
                current.push(i.to_string());
                colons = 0;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && !current.is_empty() => {
                colons += 1;
            }
            TokenTree::Group(g) => {
                flush(&mut current, out);
                colons = 0;
                macro_paths(g.stream(), out);
            }
            _ => {
                flush(&mut current, out);
                colons = 0;
            }
        }
    }
    flush(&mut current, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::write(dir.join("Cargo.toml"), "[workspace]\nmembers = [\"a\"]\n").unwrap();
        for (path, text) in files {
            let path = dir.join("a").join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    fn cycles_of(files: &[(&str, &str)]) -> Vec<Cycle> {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), files);
        let members = workspace_members(dir.path()).unwrap();
        import_cycles(dir.path(), &members).unwrap()
    }

    #[test]
    fn two_files_naming_each_other_are_a_circle() {
        let found = cycles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "pub struct A;\npub fn f() -> crate::b::B { crate::b::B }\n",
            ),
            (
                "src/b.rs",
                "use crate::a::A;\npub struct B;\nfn g(_: A) {}\n",
            ),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        let files: BTreeSet<&str> = found[0].iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(files, BTreeSet::from(["a/src/a.rs", "a/src/b.rs"]));
        assert!(
            found[0].iter().any(|(_, path)| path == "crate::b::B"),
            "{found:?}"
        );
    }

    #[test]
    fn one_direction_and_re_exports_are_no_circle() {
        // lib.rs re-exports from b; a uses the re-export; b uses a: the re-export is
        // followed to b, and nothing names lib.rs's own items.
        let found = cycles_of(&[
            ("src/lib.rs", "pub mod a;\npub mod b;\npub use b::B;\n"),
            ("src/a.rs", "pub struct A;\n"),
            ("src/b.rs", "use crate::a::A;\npub struct B(pub A);\n"),
            ("src/c.rs", "fn unused() {}\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_child_naming_its_parent_which_names_it_is_a_circle_and_macros_count() {
        let found = cycles_of(&[
            ("src/lib.rs", "mod parent;\n"),
            (
                "src/parent/mod.rs",
                "mod child;\npub const X: u8 = 1;\npub fn f() { child::g(); }\n",
            ),
            (
                "src/parent/child.rs",
                "pub fn g() { assert_eq!(super::X, 1); }\n",
            ),
        ]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].iter().any(|(_, path)| path == "super::X"),
            "a path inside a macro is a reference: {found:?}"
        );
    }

    #[test]
    fn inline_test_modules_resolve_super_to_their_file() {
        let found = cycles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "pub fn f() {}\n#[cfg(test)]\nmod tests { use super::*; fn t() { f(); crate::b::g(); } }\n",
            ),
            ("src/b.rs", "pub fn g() { crate::a::f(); }\n"),
        ]);
        // a's tests name b, b names a: a circle (tests are code too).
        assert_eq!(found.len(), 1, "{found:?}");
    }

    /// Each kernel-cache process links what it runs: the privileged node agent no
    /// signature verification (sigstore and its TUF, X.509 and protobuf stacks), the pod
    /// webhook neither that nor GPU detection.
    #[test]
    fn the_node_agent_links_no_signature_verification() {
        let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
        let agent = lock_closure(&lock, "kubeairunway-kernelcache-agent").unwrap();
        assert!(
            agent.contains("kubeairunway-kernelcache-artifact"),
            "{agent:?}"
        );
        assert!(!agent.contains("sigstore"), "the agent links sigstore");
        assert!(!agent.contains("kubeairunway-kernelcache-signing"));
        let webhook = lock_closure(&lock, "kubeairunway-kernelcache-webhook").unwrap();
        assert!(!webhook.contains("sigstore") && !webhook.contains("nvml-wrapper"));
        let controller = lock_closure(&lock, "kubeairunway-kernelcache-controller").unwrap();
        assert!(
            controller.contains("sigstore"),
            "the check can see sigstore"
        );
        assert!(lock_closure(&lock, "no-such-crate").is_err());
    }

    /// The workspace: no file imports one that imports it back.
    #[test]
    fn the_workspace_has_no_circle_of_files() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let root = root.canonicalize().unwrap();
        let members = workspace_members(&root).unwrap();
        assert!(members.len() > 10, "{members:?}");
        let found = import_cycles(&root, &members).unwrap();
        let shown: Vec<String> = found
            .iter()
            .map(|cycle| {
                cycle
                    .iter()
                    .map(|(file, path)| format!("  {file} names {path}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        assert!(
            found.is_empty(),
            "{} circle(s) of files importing each other:\n{}",
            found.len(),
            shown.join("\n\n")
        );
    }
}
