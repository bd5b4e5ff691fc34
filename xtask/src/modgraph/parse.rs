//! One file's tokens → the modules it declares and the paths it names: every `use` leaf
//! (grouped uses expanded) and every inline path starting `crate::`, `super::` or
//! `self::`, each with the module it is written in. Items under `#[cfg(test)]` are
//! skipped, so are their `mod x;` files.

use super::lex::{Tok, Token, tokens};

/// Where a path starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Start {
    Crate,
    /// `self::` (0), `super::` (1), `super::super::` (2), ...
    Up(usize),
    /// A plain name: a child module or an imported name of the scope, else another crate.
    Bare,
}

/// A path as written, in module `scope` (absolute, from the crate root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawPath {
    pub scope: Vec<String>,
    pub start: Start,
    pub segs: Vec<String>,
    pub line: u32,
}

/// A `use` leaf: the path and the name it binds in its scope (none for a glob).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UseLeaf {
    pub path: RawPath,
    pub binds: Option<String>,
    /// At the module's top level (visible to child modules), not inside a function.
    pub module_level: bool,
}

/// A `mod name;` or `mod name { ... }` declaration, not under `#[cfg(test)]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ModDecl {
    /// The declared module's absolute path.
    pub path: Vec<String>,
    /// `mod name { ... }` rather than a file.
    pub inline: bool,
}

/// A method of type `ty` in a module: defined, or called (`self.name(` in an `impl` of
/// the type, `Self::name(`, `Type::name(`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    pub scope: Vec<String>,
    pub ty: String,
    pub name: String,
    pub line: u32,
}

/// What one file holds.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub mods: Vec<ModDecl>,
    pub uses: Vec<UseLeaf>,
    pub paths: Vec<RawPath>,
    /// Functions of inherent `impl Type { ... }` blocks: a type's methods may be written
    /// in another module than the type, and called where no path names that module.
    pub methods: Vec<Named>,
    pub calls: Vec<Named>,
}

/// Parses `src`, the file of module `base`.
pub(super) fn parse(src: &str, base: &[String]) -> Parsed {
    let mut p = Parser {
        t: tokens(src),
        i: 0,
        depth: 0,
        scopes: vec![(0, base.to_vec())],
        impls: Vec::new(),
        out: Parsed::default(),
    };
    p.run();
    p.out
}

struct Parser {
    t: Vec<Token>,
    i: usize,
    /// Bracket depth: `(`, `[` and `{` all count.
    depth: usize,
    /// Open modules: the depth inside their braces and their path.
    scopes: Vec<(usize, Vec<String>)>,
    /// Open `impl` blocks: the depth inside their braces, whether inherent, the type.
    impls: Vec<(usize, bool, String)>,
    out: Parsed,
}

impl Parser {
    fn tok(&self, k: usize) -> Option<&Tok> {
        self.t.get(self.i + k).map(|t| &t.tok)
    }

    fn is_ident(&self, k: usize, w: &str) -> bool {
        matches!(self.tok(k), Some(Tok::Ident(s)) if s == w)
    }

    fn is_punct(&self, k: usize, c: char) -> bool {
        self.tok(k) == Some(&Tok::Punct(c))
    }

    fn ident(&self, k: usize) -> Option<&str> {
        match self.tok(k) {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn line(&self) -> u32 {
        self.t.get(self.i).map_or(0, |t| t.line)
    }

    fn scope(&self) -> &[String] {
        &self.scopes.last().expect("root scope").1
    }

    fn run(&mut self) {
        while self.i < self.t.len() {
            if self.cfg_test_attr() {
                self.i += 7;
                self.skip_item();
            } else if self.is_ident(0, "use") && !self.is_punct(1, '<') {
                self.i += 1;
                self.use_decl();
            } else if self.is_ident(0, "mod") && self.ident(1).is_some() {
                self.mod_decl();
            } else if self.path_start() {
                self.inline_path();
            } else if self.is_ident(0, "impl") && !self.is_punct(1, '(') {
                self.impl_block();
            } else if self.is_ident(0, "fn") && self.ident(1).is_some() {
                self.fn_def();
            } else if let Some((ty, name)) = self.call() {
                let call = self.named(ty, name);
                self.out.calls.push(call);
                self.i += 1;
            } else {
                self.bracket();
                self.i += 1;
            }
        }
    }

    /// Tracks bracket depth at the current token and closes modules.
    fn bracket(&mut self) {
        match self.tok(0) {
            Some(Tok::Punct('(' | '[' | '{')) => self.depth += 1,
            Some(Tok::Punct(')' | ']' | '}')) => {
                self.depth = self.depth.saturating_sub(1);
                while self.scopes.len() > 1 && self.depth < self.scopes.last().unwrap().0 {
                    self.scopes.pop();
                }
                while self.impls.last().is_some_and(|b| self.depth < b.0) {
                    self.impls.pop();
                }
            }
            _ => {}
        }
    }

    /// `#[cfg(test)]` at the current token.
    fn cfg_test_attr(&self) -> bool {
        self.is_punct(0, '#')
            && self.is_punct(1, '[')
            && self.is_ident(2, "cfg")
            && self.is_punct(3, '(')
            && self.is_ident(4, "test")
            && self.is_punct(5, ')')
            && self.is_punct(6, ']')
    }

    /// Skips the item after `#[cfg(test)]` (and any further attributes): up to its `;`
    /// or the end of its first top-level brace block.
    fn skip_item(&mut self) {
        let mut d = 0usize;
        while self.i < self.t.len() {
            match self.tok(0) {
                Some(Tok::Punct('(' | '[' | '{')) => d += 1,
                Some(Tok::Punct(')' | ']')) => d = d.saturating_sub(1),
                Some(Tok::Punct('}')) => {
                    d = d.saturating_sub(1);
                    if d == 0 {
                        self.i += 1;
                        return;
                    }
                }
                Some(Tok::Punct(';')) if d == 0 => {
                    self.i += 1;
                    return;
                }
                _ => {}
            }
            self.i += 1;
        }
    }

    fn named(&self, ty: String, name: String) -> Named {
        Named {
            scope: self.scope().to_vec(),
            ty,
            name,
            line: self.line(),
        }
    }

    /// `impl ... {`: inherent unless a `for` comes before its brace (`impl Trait for T`).
    /// `impl` in a type (`-> impl Iterator`, `x: impl Fn()`) is not an item: it follows
    /// no item boundary.
    fn impl_block(&mut self) {
        let prev = self.i.checked_sub(1).map(|j| &self.t[j].tok);
        let item = match prev {
            None | Some(Tok::Punct('}' | ';' | ']' | '{')) => true,
            Some(Tok::Ident(w)) => w == "unsafe",
            _ => false,
        };
        if !item {
            self.i += 1;
            return;
        }
        // The type: the last name outside `<...>` before `{` or `where`, after `for`
        // in a trait impl.
        let (mut k, mut d, mut angle) = (1, 0usize, 0usize);
        let (mut inherent, mut ty, mut in_where) = (true, String::new(), false);
        while let Some(t) = self.tok(k) {
            match t {
                Tok::Punct('{') if d == 0 => break,
                Tok::Punct('(' | '[') => d += 1,
                Tok::Punct(')' | ']') => d = d.saturating_sub(1),
                Tok::Punct('<') => angle += 1,
                Tok::Punct('>') => angle = angle.saturating_sub(1),
                Tok::Punct(';') if d == 0 => return self.i += k,
                Tok::Ident(w) if w == "for" && angle == 0 => inherent = false,
                Tok::Ident(w) if w == "where" && angle == 0 => in_where = true,
                Tok::Ident(w) if angle == 0 && d == 0 && !in_where && w != "dyn" => ty = w.clone(),
                _ => {}
            }
            k += 1;
        }
        self.i += k + 1;
        self.depth += 1;
        self.impls.push((self.depth, inherent, ty));
    }

    fn fn_def(&mut self) {
        let name = self.ident(1).unwrap_or_default().to_string();
        let in_impl = self.impls.last().filter(|b| b.0 == self.depth && b.1);
        if let Some(ty) = in_impl.map(|b| b.2.clone()) {
            let m = self.named(ty, name);
            self.out.methods.push(m);
        }
        self.i += 2;
    }

    /// A method call at the current token whose type is known: `self.name(` inside an
    /// `impl`, `Self::name(`, `Type::name(` (a capitalised name): (type, name).
    fn call(&self) -> Option<(String, String)> {
        let own = || self.impls.last().map(|b| b.2.clone());
        let ty = match self.tok(0)? {
            Tok::Ident(w) if w == "self" && self.is_punct(1, '.') => own()?,
            Tok::Ident(w) if w == "Self" && self.tok(1) == Some(&Tok::PathSep) => own()?,
            Tok::Ident(w)
                if w.starts_with(|c: char| c.is_ascii_uppercase())
                    && self.tok(1) == Some(&Tok::PathSep) =>
            {
                w.clone()
            }
            _ => return None,
        };
        let name = self.ident(2)?;
        let turbofish = self.tok(3) == Some(&Tok::PathSep) && self.is_punct(4, '<');
        (self.is_punct(3, '(') || turbofish).then(|| (ty, name.to_string()))
    }

    fn mod_decl(&mut self) {
        let name = self.ident(1).unwrap_or_default().to_string();
        let mut path = self.scope().to_vec();
        path.push(name);
        if self.is_punct(2, '{') {
            self.i += 3;
            self.depth += 1;
            self.out.mods.push(ModDecl {
                path: path.clone(),
                inline: true,
            });
            self.scopes.push((self.depth, path));
        } else {
            self.i += 2;
            if self.is_punct(0, ';') {
                self.out.mods.push(ModDecl {
                    path,
                    inline: false,
                });
            }
        }
    }

    /// The first segment of a path in code: `crate`, `super` or `self` before `::`,
    /// not continuing a path and not a visibility `pub(in crate::x)`.
    fn path_start(&self) -> bool {
        let first = matches!(self.ident(0), Some("crate" | "super" | "self"));
        if !first || self.tok(1) != Some(&Tok::PathSep) {
            return false;
        }
        let prev = |k: usize| {
            self.i
                .checked_sub(k)
                .and_then(|j| self.t.get(j))
                .map(|t| &t.tok)
        };
        let is_word = |k: usize, w: &str| matches!(prev(k), Some(Tok::Ident(s)) if s == w);
        let continues = prev(1) == Some(&Tok::PathSep);
        let vis_in = is_word(1, "in") && prev(2) == Some(&Tok::Punct('(')) && is_word(3, "pub");
        !continues && !vis_in
    }

    fn inline_path(&mut self) {
        let line = self.line();
        let mut segs = Vec::new();
        while let Some(s) = self.ident(0) {
            segs.push(s.to_string());
            self.i += 1;
            if self.tok(0) == Some(&Tok::PathSep) && self.ident(1).is_some() {
                self.i += 1;
            } else {
                break;
            }
        }
        let path = raw(self.scope().to_vec(), segs, line);
        self.out.paths.push(path);
    }

    /// After `use`: one tree up to `;`. A leading `::` names another crate.
    fn use_decl(&mut self) {
        let module_level = self.depth == self.scopes.last().map_or(0, |s| s.0);
        if self.tok(0) == Some(&Tok::PathSep) {
            while self.i < self.t.len() && !self.is_punct(0, ';') {
                self.i += 1;
            }
            return;
        }
        self.use_tree(&[], module_level);
        // Whatever the tree parser did not understand, up to the end of the item.
        while self.i < self.t.len() && !self.is_punct(0, ';') {
            self.i += 1;
        }
    }

    /// `a::b::{tree, ...}`, `a::b::*`, `a::b [as c]`, `{...}` or `*` after `prefix`.
    fn use_tree(&mut self, prefix: &[String], module_level: bool) {
        let line = self.line();
        let mut segs = prefix.to_vec();
        loop {
            if self.is_punct(0, '{') {
                self.i += 1;
                while self.i < self.t.len() && !self.is_punct(0, '}') {
                    self.use_tree(&segs, module_level);
                    if self.is_punct(0, ',') {
                        self.i += 1;
                    } else if !self.is_punct(0, '}') {
                        return;
                    }
                }
                self.i += 1;
                return;
            }
            if self.is_punct(0, '*') {
                self.i += 1;
                self.push_use(segs, None, line, module_level);
                return;
            }
            let Some(s) = self.ident(0) else { return };
            segs.push(s.to_string());
            self.i += 1;
            if self.tok(0) == Some(&Tok::PathSep) {
                self.i += 1;
                continue;
            }
            break;
        }
        let mut name = segs.last().cloned();
        if segs.last().is_some_and(|s| s == "self") {
            segs.pop();
            name = segs.last().cloned();
        }
        if self.is_ident(0, "as") {
            name = self.ident(1).map(str::to_string);
            self.i += 2;
        }
        let name = name.filter(|n| n != "_");
        self.push_use(segs, Some(name), line, module_level);
    }

    /// `binds`: `None` for a glob, `Some(None)` for a leaf bound to nothing (`as _`).
    fn push_use(&mut self, segs: Vec<String>, binds: Option<Option<String>>, line: u32, ml: bool) {
        if segs.is_empty() {
            return;
        }
        let path = raw(self.scope().to_vec(), segs, line);
        self.out.uses.push(UseLeaf {
            path,
            binds: binds.flatten(),
            module_level: ml,
        });
    }
}

/// Splits the leading `crate` / `self` / `super`s off `segs`.
fn raw(scope: Vec<String>, segs: Vec<String>, line: u32) -> RawPath {
    let mut rest = segs.as_slice();
    let start = match rest.first().map(String::as_str) {
        Some("crate") => {
            rest = &rest[1..];
            Start::Crate
        }
        Some("self" | "super") => {
            let mut up = 0;
            if rest[0] == "self" {
                rest = &rest[1..];
            }
            while rest.first().is_some_and(|s| s == "super") {
                up += 1;
                rest = &rest[1..];
            }
            Start::Up(up)
        }
        _ => Start::Bare,
    };
    RawPath {
        scope,
        start,
        segs: rest.to_vec(),
        line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn uses(p: &Parsed) -> Vec<(Start, String, Option<String>)> {
        p.uses
            .iter()
            .map(|u| {
                (
                    u.path.start.clone(),
                    u.path.segs.join("::"),
                    u.binds.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn grouped_uses_expand() {
        let p = parse("use crate::{a, b::{c, d as e, self}, f::*};", &[]);
        assert_eq!(
            uses(&p),
            [
                (Start::Crate, "a".into(), Some("a".into())),
                (Start::Crate, "b::c".into(), Some("c".into())),
                (Start::Crate, "b::d".into(), Some("e".into())),
                (Start::Crate, "b".into(), Some("b".into())),
                (Start::Crate, "f".into(), None),
            ]
        );
    }

    #[test]
    fn visibility_and_super_super() {
        let p = parse(
            "pub(crate) use super::super::x::Y;\npub(in crate::a) fn f() { self::g(); }",
            &s(&["a", "b", "c"]),
        );
        assert_eq!(uses(&p), [(Start::Up(2), "x::Y".into(), Some("Y".into()))]);
        assert_eq!(p.paths.len(), 1, "{:?}", p.paths);
        assert_eq!(p.paths[0].start, Start::Up(0));
        assert_eq!(p.paths[0].segs, s(&["g"]));
        assert_eq!(p.paths[0].line, 2);
    }

    #[test]
    fn nested_modules_scope_their_paths() {
        let src = "mod outer {\n    mod inner { fn f() { super::super::z::w(); } }\n    fn g() { crate::q::r(); }\n}\nmod file;\nfn h() { super::k(); }";
        let p = parse(src, &s(&["m"]));
        let mods: Vec<_> = p
            .mods
            .iter()
            .map(|m| (m.path.join("::"), m.inline))
            .collect();
        assert_eq!(
            mods,
            [
                ("m::outer".to_string(), true),
                ("m::outer::inner".to_string(), true),
                ("m::file".to_string(), false),
            ]
        );
        let paths: Vec<_> = p
            .paths
            .iter()
            .map(|r| (r.scope.join("::"), r.start.clone(), r.segs.join("::")))
            .collect();
        assert_eq!(
            paths,
            [
                ("m::outer::inner".into(), Start::Up(2), "z::w".into()),
                ("m::outer".into(), Start::Crate, "q::r".into()),
                ("m".into(), Start::Up(1), "k".into()),
            ]
        );
    }

    #[test]
    fn test_items_and_text_are_skipped() {
        let src = r###"
            #[cfg(test)]
            mod tests { use crate::a; fn t() { crate::b::c(); } }
            #[cfg(test)]
            #[allow(unused)]
            mod file_tests;
            #[cfg(test)]
            use crate::d;
            const S: &str = r#"crate::e " crate::f"#;
            // crate::g
            /* use crate::h; */
            fn f<'a>(x: &'a u8) -> char { let _ = crate::keep::it(); '{' }
        "###;
        let p = parse(src, &[]);
        assert!(p.mods.is_empty(), "{:?}", p.mods);
        assert!(p.uses.is_empty(), "{:?}", p.uses);
        assert_eq!(p.paths.len(), 1);
        assert_eq!(p.paths[0].segs, s(&["keep", "it"]));
    }

    #[test]
    fn inherent_methods_and_calls() {
        let src = "impl<'a> Live<'a> where T: X { fn seed(&self) { self.note(); Self::helper(1); } }\nimpl Tr for Other { fn tr(&self) { self.go(); } }\nfn free() -> impl Iterator<Item = u8> { fn inner() {} x.go::<u8>(); Live::new(); self.len() }";
        let p = parse(src, &s(&["m"]));
        let names = |v: &[Named]| {
            v.iter()
                .map(|n| format!("{}::{}", n.ty, n.name))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&p.methods), ["Live::seed"]);
        assert_eq!(
            names(&p.calls),
            ["Live::note", "Live::helper", "Other::go", "Live::new"]
        );
    }

    #[test]
    fn function_level_uses_bind_nothing_for_children() {
        let p = parse("use x::y;\nfn f() { use crate::z::w; }", &[]);
        assert_eq!(p.uses[0].path.start, Start::Bare);
        assert!(p.uses[0].module_level);
        assert!(!p.uses[1].module_level);
    }
}
