//! The two rules over a crate's references: sibling modules of a folder form no cycle,
//! and no module names one of a later layer of the declared order.

use std::collections::BTreeMap;

use super::model::{CrateModel, Ref};

/// Sibling edges of one folder (module): (from child, to child) → the references.
pub(super) type Folder<'a> = BTreeMap<(String, String), Vec<&'a Ref>>;

/// Every folder's sibling edges: module A depends on sibling B when anything in A's
/// subtree names something in B's subtree. A module that the layer order splits (the
/// rewriter's `elf`: `elf::read` first, `elf::write` last) counts as its parts.
pub(super) fn sibling_edges<'a>(
    m: &'a CrateModel,
    layers: &[&[&str]],
) -> BTreeMap<Vec<String>, Folder<'a>> {
    let mut out: BTreeMap<Vec<String>, Folder<'_>> = BTreeMap::new();
    for r in &m.refs {
        let k = r.from.iter().zip(&r.to).take_while(|(a, b)| a == b).count();
        if k < r.from.len() && k < r.to.len() {
            let edge = (node(layers, &r.from, k), node(layers, &r.to, k));
            let folder = out.entry(r.from[..k].to_vec()).or_default();
            folder.entry(edge).or_default().push(r);
        }
    }
    out
}

/// `module`'s node among the children of its ancestor at depth `k`: the child, or the
/// longest layer entry below the child that holds `module`, as a path from the child.
fn node(layers: &[&[&str]], module: &[String], k: usize) -> String {
    let split = layers
        .iter()
        .flat_map(|l| l.iter())
        .map(|e| e.split("::").collect::<Vec<_>>())
        .filter(|e| e.len() > k + 1 && e.len() <= module.len())
        .filter(|e| e.iter().zip(module).all(|(a, b)| a == b))
        .max_by_key(Vec::len);
    match split {
        Some(e) => e[k..].join("::"),
        None => module[k].clone(),
    }
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
pub(super) fn cycles(folder: &Folder<'_>) -> Vec<Vec<String>> {
    let mut nodes: Vec<&String> = folder.keys().flat_map(|(a, b)| [a, b]).collect();
    nodes.sort();
    nodes.dedup();
    let index_of = |n: &String| nodes.binary_search(&n).expect("a node");
    let mut succ = vec![Vec::new(); nodes.len()];
    for (a, b) in folder.keys() {
        succ[index_of(a)].push(index_of(b));
    }
    let mut t = Tarjan {
        succ: &succ,
        index: vec![None; nodes.len()],
        low: vec![0; nodes.len()],
        stack: Vec::new(),
        on_stack: vec![false; nodes.len()],
        next: 0,
        out: Vec::new(),
    };
    for v in 0..nodes.len() {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    let mut sccs: Vec<Vec<String>> = t
        .out
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.into_iter().map(|i| nodes[i].clone()).collect();
            names.sort();
            names
        })
        .collect();
    sccs.sort();
    sccs
}

struct Tarjan<'a> {
    succ: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    stack: Vec<usize>,
    on_stack: Vec<bool>,
    next: usize,
    out: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.succ[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(iw) if self.on_stack[w] => self.low[v] = self.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            self.out.push(comp);
        }
    }
}

/// A reference from a layer to a later one.
pub(super) struct Breach<'a> {
    pub from_layer: usize,
    pub to_layer: usize,
    pub r: &'a Ref,
}

/// The layer of `module`: the index of the longest entry of `layers` that is a prefix
/// of it (`"isa::machine"` before `"isa"`).
pub(super) fn layer_of(layers: &[&[&str]], module: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for entry in layer.iter() {
            let e: Vec<&str> = entry.split("::").collect();
            let hit = e.len() <= module.len() && e.iter().zip(module).all(|(a, b)| a == b);
            if hit && best.is_none_or(|(len, _)| e.len() > len) {
                best = Some((e.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// References that break the order: a module may name its own layer and those before.
pub(super) fn breaches<'a>(m: &'a CrateModel, layers: &[&[&str]]) -> Vec<Breach<'a>> {
    m.refs
        .iter()
        .filter_map(|r| {
            let from_layer = layer_of(layers, &r.from)?;
            let to_layer = layer_of(layers, &r.to)?;
            (to_layer > from_layer).then_some(Breach {
                from_layer,
                to_layer,
                r,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn r(from: &str, to: &str) -> Ref {
        let p = |s: &str| {
            s.split("::")
                .filter(|x| !x.is_empty())
                .map(String::from)
                .collect()
        };
        Ref {
            from: p(from),
            to: p(to),
            file: PathBuf::from("f.rs"),
            line: 1,
            text: to.into(),
        }
    }

    #[test]
    fn edges_at_the_common_ancestor_and_cycles() {
        let m = CrateModel {
            modules: BTreeMap::new(),
            refs: vec![
                r("a::x", "b::y"),
                r("b", "c"),
                r("c::z", "a"),
                r("a::x", "a::w"),
                r("a", "a::w"),
                r("d", "a"),
            ],
        };
        let e = sibling_edges(&m, &[&["d::x"]]);
        let top: Vec<_> = e[&Vec::new()].keys().cloned().collect();
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            top,
            [
                pair("a", "b"),
                pair("b", "c"),
                pair("c", "a"),
                pair("d", "a")
            ]
        );
        assert_eq!(e[&vec!["a".to_string()]].len(), 1);
        assert_eq!(cycles(&e[&Vec::new()]), [vec!["a", "b", "c"]]);
    }

    #[test]
    fn a_module_split_by_the_layers_counts_as_its_parts() {
        let m = CrateModel {
            modules: BTreeMap::new(),
            refs: vec![
                r("elf::write", "emit"),
                r("emit", "elf::read::x"),
                r("elf", "emit"),
            ],
        };
        let layers: &[&[&str]] = &[&["elf::read"], &["emit"], &["elf::write"]];
        let e = sibling_edges(&m, layers);
        let top: Vec<_> = e[&Vec::new()].keys().cloned().collect();
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            top,
            [
                pair("elf", "emit"),
                pair("elf::write", "emit"),
                pair("emit", "elf::read")
            ]
        );
        assert!(cycles(&e[&Vec::new()]).is_empty());
    }

    #[test]
    fn layers_longest_prefix_and_order() {
        let layers: &[&[&str]] = &[
            &["isa::machine"],
            &["elf::read"],
            &["isa", "flow"],
            &["elf::write"],
        ];
        let m = CrateModel {
            modules: BTreeMap::new(),
            refs: vec![
                r("elf::read", "isa::machine"),
                r("elf::read", "isa"),
                r("elf::write", "flow::x"),
                r("isa::x86_64", "flow"),
                r("elf", "isa"),
            ],
        };
        let b = breaches(&m, layers);
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].from_layer, b[0].to_layer), (1, 2));
    }
}
