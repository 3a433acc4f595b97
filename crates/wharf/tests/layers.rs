//! The core's modules depend on each other in one direction only: no module imports one
//! that imports it back. This reads the crate's sources (test code excluded: tests may use
//! anything) and fails with the cycle it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A top-level module of the crate, named as in `lib.rs`.
type Module = String;

/// What each module refers to through `crate::…` paths.
fn graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let lib = parse(&src.join("lib.rs"));
    let modules: BTreeSet<Module> = lib
        .items
        .iter()
        .filter_map(|item| match item {
            // A module written inline in `lib.rs` is part of the root, which may use anything.
            syn::Item::Mod(m) if m.content.is_none() && !is_test_only(&m.attrs) => {
                Some(m.ident.to_string())
            }
            _ => None,
        })
        .collect();
    // What the root re-exports, by the module that defines it: `crate::Context` is the
    // `context` module's.
    let mut reexports = BTreeMap::new();
    for item in &lib.items {
        if let syn::Item::Use(u) = item {
            collect_reexports(&u.tree, None, &modules, &mut reexports);
        }
    }
    let mut graph = BTreeMap::new();
    for module in &modules {
        let mut refs = Refs {
            modules: &modules,
            reexports: &reexports,
            found: BTreeSet::new(),
        };
        for file in files_of(src, module) {
            refs.visit_file(&parse(&file));
        }
        refs.found.remove(module);
        graph.insert(module.clone(), refs.found);
    }
    graph
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files of `module`: `module.rs`, or everything under `module/`.
fn files_of(src: &Path, module: &str) -> Vec<PathBuf> {
    let single = src.join(format!("{module}.rs"));
    if single.exists() {
        return vec![single];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

fn collect_reexports(
    tree: &syn::UseTree,
    module: Option<&str>,
    modules: &BTreeSet<Module>,
    out: &mut BTreeMap<String, Module>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            let name = p.ident.to_string();
            let module = module.or(modules.contains(&name).then_some(name.as_str()));
            collect_reexports(&p.tree, module, modules, out);
        }
        syn::UseTree::Name(n) => {
            if let Some(m) = module {
                out.insert(n.ident.to_string(), m.to_owned());
            }
        }
        syn::UseTree::Rename(r) => {
            if let Some(m) = module {
                out.insert(r.rename.to_string(), m.to_owned());
            }
        }
        syn::UseTree::Group(g) => {
            for t in &g.items {
                collect_reexports(t, module, modules, out);
            }
        }
        syn::UseTree::Glob(_) => {}
    }
}

struct Refs<'a> {
    modules: &'a BTreeSet<Module>,
    reexports: &'a BTreeMap<String, Module>,
    found: BTreeSet<Module>,
}

impl Refs<'_> {
    /// Records what `crate::name` refers to.
    fn crate_item(&mut self, name: &str) {
        if self.modules.contains(name) {
            self.found.insert(name.to_owned());
        } else if let Some(m) = self.reexports.get(name) {
            self.found.insert(m.clone());
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree, after_crate: bool) {
        match tree {
            syn::UseTree::Path(p) if after_crate => self.crate_item(&p.ident.to_string()),
            syn::UseTree::Path(p) => self.use_tree(&p.tree, p.ident == "crate"),
            syn::UseTree::Name(n) if after_crate => self.crate_item(&n.ident.to_string()),
            syn::UseTree::Rename(r) if after_crate => self.crate_item(&r.ident.to_string()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, after_crate);
                }
            }
            _ => {}
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_only(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !is_test_only(&i.attrs) {
            syn::visit::visit_item_impl(self, i);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_test_only(&u.attrs) {
            self.use_tree(&u.tree, false);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if segments.next().is_some_and(|s| s.ident == "crate") {
            if let Some(next) = segments.next() {
                self.crate_item(&next.ident.to_string());
            }
        }
        syn::visit::visit_path(self, path);
    }
}

/// A cycle through `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn walk(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        path: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = path.iter().position(|m| m == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = walk(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| walk(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_core_modules_depend_on_each_other_in_one_direction() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.len() > 20, "the modules were found: {graph:?}");
    // The check sees edges: the transport contract sits above the dispatcher.
    assert!(graph["admission"].contains("dispatch"), "{graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between the core's modules: {}",
            cycle.join(" → ")
        );
    }
}

/// The core's layers, from the bottom, as ARCHITECTURE.md draws them: a module may use its
/// own layer's modules (without a cycle) and those of the layers below, never one above.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves",
        &[
            "principal",
            "bus",
            "fair_share",
            "metrics",
            "schema",
            "uri_template",
            "deadline",
            "store",
            "mutation",
            "session",
        ],
    ),
    (
        "errors and keys",
        &[
            "error", "meta", "keyset", "cursor", "limits", "mrtr", "config", "keys",
        ],
    ),
    (
        "the request",
        &["request", "handler", "reply", "progress", "trace"],
    ),
    ("running state", &["runtime", "context"]),
    (
        "definitions",
        &["handle_args", "tool", "prompt", "resource", "registry"],
    ),
    (
        "running a request",
        &[
            "access",
            "driver",
            "methods",
            "middleware",
            "dispatch",
            "listen",
        ],
    ),
    (
        "the contract",
        &["admission", "legacy", "server", "testing"],
    ),
];

/// Every import of `graph` that points to a higher layer, and every module `LAYERS` leaves
/// out or names twice.
fn layer_violations(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let mut layer_of = BTreeMap::new();
    let mut problems = Vec::new();
    for (at, (_, modules)) in LAYERS.iter().enumerate() {
        for module in *modules {
            if layer_of.insert(*module, at).is_some() {
                problems.push(format!("`{module}` is in two layers"));
            }
        }
    }
    for (module, uses) in graph {
        let Some(&from) = layer_of.get(module.as_str()) else {
            problems.push(format!("`{module}` is in no layer"));
            continue;
        };
        for used in uses {
            match layer_of.get(used.as_str()) {
                Some(&to) if to > from => problems.push(format!(
                    "`{module}` ({}) uses `{used}`, which is above it ({})",
                    LAYERS[from].0, LAYERS[to].0
                )),
                _ => {}
            }
        }
    }
    for module in layer_of.keys() {
        if !graph.contains_key(*module) {
            problems.push(format!(
                "`{module}` is in a layer but not a module of the crate"
            ));
        }
    }
    problems
}

#[test]
fn the_core_modules_sit_in_the_layers_the_architecture_names() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = layer_violations(&graph(&src));
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn an_import_up_the_layers_is_named() {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = LAYERS
        .iter()
        .flat_map(|(_, modules)| modules.iter())
        .map(|m| (m.to_string(), BTreeSet::new()))
        .collect();
    assert!(layer_violations(&graph).is_empty());
    graph.get_mut("keys").unwrap().insert("request".into());
    graph.insert("extra".into(), BTreeSet::new());
    assert_eq!(
        layer_violations(&graph),
        [
            "`extra` is in no layer",
            "`keys` (errors and keys) uses `request`, which is above it (the request)",
        ]
    );
}

#[test]
fn a_cycle_is_found_and_named() {
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")];
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from.into()).or_default().insert(to.into());
        graph.entry(to.into()).or_default();
    }
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    graph.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&graph), None);
}

/// The same rule for every library crate of the workspace: a transport, store or app crate
/// is read top-down too.
#[test]
fn every_library_crate_depends_on_itself_in_one_direction() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = Vec::new();
    let mut cycles = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap_or_else(|e| panic!("{}: {e}", crates.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    dirs.sort();
    for dir in dirs {
        let src = dir.join("src");
        if !src.join("lib.rs").exists() {
            continue;
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        if let Some(cycle) = find_cycle(&graph(&src)) {
            cycles.push(format!("{name}: {}", cycle.join(" → ")));
        }
        checked.push(name);
    }
    assert!(
        checked.iter().any(|c| c == "wharf-http"),
        "the crates were found: {checked:?}"
    );
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}
