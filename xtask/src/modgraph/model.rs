//! A crate's modules, from its root file along its `mod` declarations (so test-only
//! files are never read), and every path its sources name, resolved to the module it
//! lands in (through `use` bindings and re-exports).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::parse::{Parsed, RawPath, Start, UseLeaf, parse};

/// One reference from module `from` to module `to` (both absolute; `to` is the deepest
/// module the path goes through).
#[derive(Debug, Clone)]
pub(super) struct Ref {
    pub from: Vec<String>,
    pub to: Vec<String>,
    pub file: PathBuf,
    pub line: u32,
    /// The path as written (leading `crate`/`super`/`self` included).
    pub text: String,
}

/// A crate's module tree and references.
#[derive(Debug, Default)]
pub(super) struct CrateModel {
    /// Module path → the file it is written in.
    pub modules: BTreeMap<Vec<String>, PathBuf>,
    pub refs: Vec<Ref>,
}

/// Names a use binds at a module's top level: (module, name) → the path it stands for.
type Bindings = BTreeMap<(Vec<String>, String), RawPath>;

/// Reads the crate whose root file is `root` (`lib.rs` or `main.rs`).
pub(super) fn load(root: &Path) -> Result<CrateModel> {
    let mut modules = BTreeMap::new();
    let mut written = Vec::new();
    let mut queue = vec![(Vec::new(), root.to_path_buf())];
    while let Some((path, file)) = queue.pop() {
        let src = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let parsed = parse(&src, &path);
        modules.insert(path.clone(), file.clone());
        for m in &parsed.mods {
            if m.inline {
                modules.insert(m.path.clone(), file.clone());
            } else if let Some(f) = child_file(&file, &path, &m.path) {
                queue.push((m.path.clone(), f));
            }
        }
        written.push((file, parsed));
    }
    let mut binds = Bindings::new();
    for (_, p) in &written {
        for u in p.uses.iter().filter(|u| u.module_level) {
            if let Some(name) = &u.binds {
                binds.insert((u.path.scope.clone(), name.clone()), u.path.clone());
            }
        }
    }
    let r = Resolver {
        modules: modules.keys().cloned().collect(),
        binds,
    };
    let mut refs = method_refs(&written);
    for (file, p) in &written {
        let all = p.uses.iter().map(|u: &UseLeaf| &u.path).chain(&p.paths);
        for raw in all {
            if let Some(to) = r.resolve(raw).map(|abs| r.module_of(&abs, 0)) {
                refs.push(Ref {
                    from: raw.scope.clone(),
                    to,
                    file: file.clone(),
                    line: raw.line,
                    text: text(raw),
                });
            }
        }
    }
    Ok(CrateModel { modules, refs })
}

/// Calls of methods that an inherent `impl` block writes in another module than the
/// caller (a type's methods spread over modules): `self.name(` in an `impl T`,
/// `Self::name(` or `T::name(` in module C names the module M of `impl T { fn name }`.
fn method_refs(written: &[(PathBuf, Parsed)]) -> Vec<Ref> {
    // Two types of one name in different modules: such a method's home is unknown.
    let mut home: BTreeMap<(&str, &str), BTreeSet<&Vec<String>>> = BTreeMap::new();
    for m in written.iter().flat_map(|(_, p)| &p.methods) {
        let key = (m.ty.as_str(), m.name.as_str());
        home.entry(key).or_default().insert(&m.scope);
    }
    let mut refs = Vec::new();
    for (file, p) in written {
        for c in &p.calls {
            let homes = home.get(&(c.ty.as_str(), c.name.as_str()));
            let only = homes.filter(|h| h.len() == 1).and_then(|h| h.first());
            match only {
                Some(&m) if *m != c.scope => refs.push(Ref {
                    from: c.scope.clone(),
                    to: m.clone(),
                    file: file.clone(),
                    line: c.line,
                    text: format!("{}::{}()", c.ty, c.name),
                }),
                _ => {}
            }
        }
    }
    refs
}

/// The file of `mod name;` declared in `file` (module `file_mod`) at module `decl`
/// (deeper than `file_mod` when declared inside inline modules).
fn child_file(file: &Path, file_mod: &[String], decl: &[String]) -> Option<PathBuf> {
    let parent = file.parent()?;
    let stem = file.file_stem()?.to_str()?;
    let mut dir = if file_mod.is_empty() || stem == "mod" {
        parent.to_path_buf()
    } else {
        parent.join(stem)
    };
    for seg in &decl[file_mod.len()..decl.len() - 1] {
        dir.push(seg);
    }
    let name = decl.last()?;
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|f| f.is_file())
}

fn text(raw: &RawPath) -> String {
    let head = match raw.start {
        Start::Crate => vec!["crate".to_string()],
        Start::Up(0) => vec!["self".to_string()],
        Start::Up(n) => vec!["super".to_string(); n],
        Start::Bare => Vec::new(),
    };
    head.into_iter()
        .chain(raw.segs.iter().cloned())
        .collect::<Vec<_>>()
        .join("::")
}

struct Resolver {
    modules: BTreeSet<Vec<String>>,
    binds: Bindings,
}

/// Re-exports followed at most this deep (a `use` cycle is an error rustc reports).
const MAX_HOPS: usize = 16;

impl Resolver {
    /// `raw` as an absolute path, or `None` when it names another crate.
    fn resolve(&self, raw: &RawPath) -> Option<Vec<String>> {
        self.resolve_at(raw, 0)
    }

    fn resolve_at(&self, raw: &RawPath, hops: usize) -> Option<Vec<String>> {
        let base = match raw.start {
            Start::Crate => Vec::new(),
            Start::Up(n) => raw.scope[..raw.scope.len().checked_sub(n)?].to_vec(),
            Start::Bare => {
                let first = raw.segs.first()?;
                let mut child = raw.scope.clone();
                child.push(first.clone());
                if self.modules.contains(&child) {
                    raw.scope.clone()
                } else {
                    let b = self.binds.get(&(raw.scope.clone(), first.clone()))?;
                    if hops >= MAX_HOPS || b == raw {
                        return None;
                    }
                    let mut abs = self.resolve_at(b, hops + 1)?;
                    abs.extend(raw.segs[1..].iter().cloned());
                    return Some(abs);
                }
            }
        };
        Some(base.into_iter().chain(raw.segs.iter().cloned()).collect())
    }

    /// The deepest module `abs` goes through, following names a module re-exports.
    fn module_of(&self, abs: &[String], hops: usize) -> Vec<String> {
        let mut cur = Vec::new();
        for (k, seg) in abs.iter().enumerate() {
            let mut next = cur.clone();
            next.push(seg.clone());
            if self.modules.contains(&next) {
                cur = next;
                continue;
            }
            let bound = self.binds.get(&(cur.clone(), seg.clone()));
            let target = bound.filter(|_| hops < MAX_HOPS);
            if let Some(mut t) = target.and_then(|b| self.resolve_at(b, hops + 1)) {
                t.extend(abs[k + 1..].iter().cloned());
                return self.module_of(&t, hops + 1);
            }
            break;
        }
        cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Vec<String> {
        v.split("::")
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// A crate written out in a scratch directory: (relative file, source).
    fn model(files: &[(&str, &str)]) -> CrateModel {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("modgraph-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (f, src) in files {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, src).unwrap();
        }
        let m = load(&dir.join("lib.rs")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        m
    }

    fn edges(m: &CrateModel) -> Vec<(String, String)> {
        m.refs
            .iter()
            .map(|r| (r.from.join("::"), r.to.join("::")))
            .collect()
    }

    #[test]
    fn files_re_exports_and_test_files() {
        let m = model(&[
            (
                "lib.rs",
                "mod a;\nmod b;\n#[cfg(test)]\nmod t;\npub use b::inner::Thing;",
            ),
            ("a.rs", "use crate::Thing;\nfn f() { crate::b::g(); }"),
            ("b/mod.rs", "pub mod inner;\nuse std::io;"),
            ("b/inner.rs", "pub struct Thing;\nuse super::super::a;"),
            ("t.rs", "use crate::a;"),
        ]);
        let mods: Vec<_> = m.modules.keys().map(|k| k.join("::")).collect();
        assert_eq!(mods, ["", "a", "b", "b::inner"]);
        let mut e = edges(&m);
        e.sort();
        assert_eq!(
            e,
            [
                ("".to_string(), "b::inner".to_string()),
                ("a".into(), "b".into()),
                ("a".into(), "b::inner".into()),
                ("b::inner".into(), "a".into()),
            ]
        );
        assert_eq!(
            m.refs.iter().find(|r| r.from == s("a")).unwrap().text,
            "crate::Thing"
        );
    }

    #[test]
    fn methods_written_in_another_module() {
        let m = model(&[
            ("lib.rs", "mod live;\nmod seed;"),
            (
                "live.rs",
                "pub struct Live;\nimpl Live { fn run(&self) { self.seed_table(); self.len(); } }",
            ),
            (
                "seed.rs",
                "use super::live::Live;\nimpl Live { fn seed_table(&self) {} }\nfn len() {}",
            ),
        ]);
        let mut e = edges(&m);
        e.sort();
        assert_eq!(
            e,
            [
                ("live".to_string(), "seed".to_string()),
                ("seed".into(), "live".into())
            ]
        );
    }

    #[test]
    fn inline_modules_and_their_files() {
        let m = model(&[
            (
                "lib.rs",
                "mod x { pub mod y; fn f() { super::z::g(); } }\nmod z;",
            ),
            ("x/y.rs", "use super::super::z::Q;"),
            ("z.rs", ""),
        ]);
        let mut e = edges(&m);
        e.sort();
        assert_eq!(
            e,
            [
                ("x".to_string(), "z".to_string()),
                ("x::y".into(), "z".into())
            ]
        );
    }
}
