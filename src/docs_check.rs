//! Docs that cannot drift: the map in docs/architecture.md names every folder of `src/`
//! and every file at its top, each folder's module doc (`//!` of its `mod.rs`, or of the
//! `x.rs` beside a folder `x/`) names every file and folder in it or declares it with a
//! `///` doc (what rustdoc shows as the folder's map), and the README's
//! command table names every subcommand of `drivelet` and `kubectl drivelet`.
//! Test files (`tests.rs`, `*_tests.rs`) are left out: their names say what they are.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The `//!` lines at the top of a Rust file, joined.
fn module_doc(p: &Path) -> String {
    read(p)
        .lines()
        .map(str::trim_start)
        .take_while(|l| l.starts_with("//!") || l.starts_with("#!") || l.is_empty())
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_test_file(name: &str) -> bool {
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Every entry of `dir` that the docs must name: `.rs` files (not `mod.rs`, not tests)
/// and folders, with their names as written in a doc (`x.rs`, `x/`).
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display())) {
        let e = e.expect("a directory entry");
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            out.push((format!("{name}/"), path));
        } else if name.ends_with(".rs") && name != "mod.rs" && !is_test_file(&name) {
            out.push((name, path));
        }
    }
    out.sort();
    out
}

fn folders(dir: &Path, out: &mut Vec<PathBuf>) {
    for (name, path) in entries(dir) {
        if name.ends_with('/') {
            out.push(path.clone());
            folders(&path, out);
        }
    }
}

/// Whether `module`'s text declares `mod <stem>;` with a `///` doc above it (attributes
/// between are fine): a file described where it is declared, as rustdoc shows it.
fn declared_with_doc(module: &str, stem: &str) -> bool {
    let lines: Vec<&str> = module.lines().map(str::trim).collect();
    lines.iter().enumerate().any(|(i, l)| {
        let decl = l.split_whitespace().skip_while(|w| w.starts_with("pub")).collect::<Vec<_>>();
        decl.first() == Some(&"mod")
            && decl.get(1).map(|n| n.trim_end_matches(';')) == Some(stem)
            && lines[..i].iter().rev().find(|p| !p.starts_with("#[")).is_some_and(|p| p.starts_with("///"))
    })
}

/// A name counts as mentioned when the doc has it as written, or, for `x.rs` beside a
/// folder `x/` (or the reverse), the other spelling.
fn mentions(doc: &str, name: &str) -> bool {
    let other = match name.strip_suffix(".rs") {
        Some(stem) => format!("{stem}/"),
        None => format!("{}.rs", name.trim_end_matches('/')),
    };
    doc.contains(name) || doc.contains(&other)
}

#[test]
fn the_architecture_page_names_every_folder_and_top_level_file_of_src() {
    let doc = read(&root().join("docs/architecture.md"));
    let src = root().join("src");
    let mut missing = Vec::new();
    for (name, _) in entries(&src) {
        let top_file = name.ends_with(".rs") && !["lib.rs", "main.rs"].contains(&name.as_str());
        if top_file && !doc.contains(&format!("src/{name}")) {
            missing.push(format!("src/{name}"));
        }
    }
    let mut all = Vec::new();
    folders(&src, &mut all);
    for f in all {
        let rel = format!("{}/", f.strip_prefix(root()).expect("under the root").display());
        if !doc.contains(&rel) {
            missing.push(rel);
        }
    }
    assert!(missing.is_empty(), "docs/architecture.md does not name {missing:?}");
}

#[test]
fn every_folders_module_doc_names_every_file_in_it() {
    let mut all = Vec::new();
    folders(&root().join("src"), &mut all);
    let mut missing = Vec::new();
    for dir in all {
        let beside = dir.with_extension("rs");
        let module = if dir.join("mod.rs").exists() { dir.join("mod.rs") } else { beside };
        let doc = module_doc(&module);
        let text = read(&module);
        for (name, _) in entries(&dir) {
            let stem = name.trim_end_matches('/').trim_end_matches(".rs");
            if !mentions(&doc, &name) && !declared_with_doc(&text, stem) {
                missing.push(format!("{} does not name {name}", module.strip_prefix(root()).expect("under the root").display()));
            }
        }
    }
    assert!(missing.is_empty(), "module docs miss files:\n{}", missing.join("\n"));
}

/// docs/testing.md's numbered list of journeys has one item per journey of the suite's
/// table, and names every file of `tests/e2e/` and every module of the integration
/// binary.
#[test]
fn the_testing_page_lists_every_journey_and_names_every_test_file() {
    let doc = read(&root().join("docs/testing.md"));
    let suite = read(&root().join("tests/e2e/main.rs"));
    let count: usize = suite
        .split("let journeys: [(&str, fn(&mut Ctx) -> Check); ")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("tests/e2e/main.rs declares `let journeys: [(&str, fn(&mut Ctx) -> Check); N]`");
    let list = doc.split("and walks the journeys").nth(1).expect("docs/testing.md has the list of journeys");
    let items = (1..=count + 1).take_while(|i| list.contains(&format!("\n{i}. "))).count();
    assert_eq!(items, count, "docs/testing.md lists {items} journeys, the suite runs {count}");
    let mut missing = Vec::new();
    for (name, _) in entries(&root().join("tests/e2e")) {
        if name.ends_with(".rs") && !doc.contains(&format!("tests/e2e/{name}")) && name != "main.rs" {
            missing.push(format!("tests/e2e/{name}"));
        }
    }
    for (name, _) in entries(&root().join("tests/integration")) {
        let module = name.trim_end_matches('/').trim_end_matches(".rs");
        if !["main", "common"].contains(&module) && !doc.contains(&format!("`{module}`")) && !doc.contains(&format!("tests/integration/{name}")) {
            missing.push(format!("tests/integration/{name}"));
        }
    }
    assert!(missing.is_empty(), "docs/testing.md does not name {missing:?}");
}
