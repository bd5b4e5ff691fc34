//! Offset of the thread pointer inside `task_struct`, from the kernel's BTF
//! (`/sys/kernel/btf/vmlinux`).
//!
//! aya-obj parses BTF but keeps struct members private, so this is a small reader of
//! the format (Documentation/bpf/btf.rst): it indexes the type section once and
//! resolves a member path such as `thread.fsbase`, looking through typedefs and
//! qualifiers and descending into anonymous struct/union members.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

pub(crate) const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// The member path of the thread pointer in `task_struct` for this machine.
pub(crate) fn thread_pointer_path() -> &'static [&'static str] {
    if cfg!(target_arch = "aarch64") {
        &["thread", "uw", "tp_value"]
    } else {
        &["thread", "fsbase"]
    }
}

/// Byte offset of the thread pointer in `task_struct`, from the running kernel's BTF.
pub(crate) fn thread_pointer_offset() -> Result<u64> {
    let path = Path::new(VMLINUX_BTF);
    let data = std::fs::read(path).with_context(|| {
        format!(
            "cannot read {} (kernel built without CONFIG_DEBUG_INFO_BTF?)",
            path.display()
        )
    })?;
    let btf = Btf::parse(&data).with_context(|| format!("cannot parse {}", path.display()))?;
    let members = thread_pointer_path();
    btf.member_offset("task_struct", members)
        .with_context(|| format!("{}: task_struct.{}", path.display(), members.join(".")))
}

/// The parsed type section: for every type id the position of its record, plus what
/// lookups need. Names stay in the string section (no per-type allocation: vmlinux
/// has ~100k types).
pub(crate) struct Btf {
    data: Vec<u8>,
    big_endian: bool,
    /// Byte range of the string section in `data`.
    strings: (usize, usize),
    /// Index = type id (0 is `void`, no record): offset of the type's record in `data`.
    types: Vec<usize>,
}

/// A decoded type record header.
struct TypeHeader {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
    /// Offset of the kind-specific data after the 12-byte header.
    extra: usize,
}

fn rd_u32(data: &[u8], pos: usize, big_endian: bool) -> Result<u32> {
    let b: [u8; 4] = data
        .get(pos..pos + 4)
        .context("BTF data truncated")?
        .try_into()?;
    Ok(if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    })
}

/// Bytes of kind-specific data after a type record's header.
fn extra_len(kind: u32, vlen: usize) -> usize {
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        _ => 0,
    }
}

impl Btf {
    pub(crate) fn parse(data: &[u8]) -> Result<Self> {
        ensure!(data.len() >= 24, "BTF header truncated");
        let big_endian = match (data[0], data[1]) {
            (0x9f, 0xeb) => false,
            (0xeb, 0x9f) => true,
            _ => bail!("not BTF (bad magic, expected {BTF_MAGIC:#x})"),
        };
        let word = |pos| rd_u32(data, pos, big_endian).map(|v| v as usize);
        let hdr_len = word(4)?;
        let (type_off, type_len) = (word(8)?, word(12)?);
        let (str_off, str_len) = (word(16)?, word(20)?);
        let range = |off: usize, len: usize, what: &str| {
            let start = hdr_len.checked_add(off);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(s), Some(e)) if e <= data.len() => Ok((s, e)),
                _ => bail!("BTF {what} section out of bounds"),
            }
        };
        let (tstart, tend) = range(type_off, type_len, "type")?;
        let strings = range(str_off, str_len, "string")?;
        let mut types = vec![0];
        let mut pos = tstart;
        while pos < tend {
            types.push(pos);
            let info = rd_u32(data, pos + 4, big_endian)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            pos += 12 + extra_len(kind, vlen);
            ensure!(pos <= tend, "BTF type {} truncated", types.len() - 1);
        }
        Ok(Btf {
            data: data.to_vec(),
            big_endian,
            strings,
            types,
        })
    }

    fn u32_at(&self, pos: usize) -> Result<u32> {
        rd_u32(&self.data, pos, self.big_endian)
    }

    fn header(&self, id: u32) -> Result<TypeHeader> {
        let pos = *self
            .types
            .get(id as usize)
            .filter(|&&p| p != 0)
            .with_context(|| format!("BTF type id {id} out of range"))?;
        let info = self.u32_at(pos + 4)?;
        Ok(TypeHeader {
            name_off: self.u32_at(pos)?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: self.u32_at(pos + 8)?,
            extra: pos + 12,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let (start, end) = self.strings;
        let s = self.data.get(start + off as usize..end).unwrap_or(&[]);
        &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]
    }

    /// Follow typedefs and qualifiers to a struct or union id.
    fn resolve_composite(&self, mut id: u32) -> Option<u32> {
        // Bounded: a malformed file could make a cycle.
        for _ in 0..32 {
            let h = self.header(id).ok()?;
            match h.kind {
                KIND_STRUCT | KIND_UNION => return Some(id),
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = h.size_or_type
                }
                _ => return None,
            }
        }
        None
    }

    /// Members of composite `id`: (name offset, type id, bit offset).
    fn members(&self, id: u32) -> Result<Vec<(u32, u32, u32)>> {
        let h = self.header(id)?;
        (0..h.vlen)
            .map(|i| {
                let p = h.extra + 12 * i;
                let off = self.u32_at(p + 8)?;
                // With kind_flag the top 8 bits are a bitfield size.
                let bits = if h.kind_flag { off & 0xff_ffff } else { off };
                Ok((self.u32_at(p)?, self.u32_at(p + 4)?, bits))
            })
            .collect()
    }

    /// Bit offset and type of member `name` of composite `id`, searching anonymous
    /// struct/union members too.
    fn find_member(&self, id: u32, name: &str, depth: u32) -> Result<Option<(u32, u32)>> {
        if depth > 8 {
            return Ok(None);
        }
        let members = self.members(id)?;
        if let Some(&(_, ty, off)) = members
            .iter()
            .find(|(n, _, _)| self.name(*n) == name.as_bytes())
        {
            return Ok(Some((off, ty)));
        }
        for &(n, ty, off) in &members {
            if !self.name(n).is_empty() {
                continue;
            }
            if let Some(inner) = self.resolve_composite(ty)
                && let Some((o, t)) = self.find_member(inner, name, depth + 1)?
            {
                return Ok(Some((off + o, t)));
            }
        }
        Ok(None)
    }

    /// Byte offset of `root.path[0].path[1]...`.
    pub(crate) fn member_offset(&self, root: &str, path: &[&str]) -> Result<u64> {
        // Forward declarations have no members; take the first full definition.
        let mut id = (1..self.types.len() as u32)
            .find(|&id| {
                self.header(id).is_ok_and(|h| {
                    h.kind == KIND_STRUCT && h.vlen > 0 && self.name(h.name_off) == root.as_bytes()
                })
            })
            .with_context(|| format!("no struct {root} in BTF"))?;
        let mut bits = 0u64;
        for (i, part) in path.iter().enumerate() {
            let (off, ty) = self
                .find_member(id, part, 0)?
                .with_context(|| format!("no member {part}"))?;
            bits += off as u64;
            if i + 1 < path.len() {
                id = self
                    .resolve_composite(ty)
                    .with_context(|| format!("member {part} is not a struct or union"))?;
            }
        }
        ensure!(bits.is_multiple_of(8), "member is a bitfield");
        Ok(bits / 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Build a little-endian BTF blob from (name, info, size_or_type, extra words).
    fn blob(types: &[(u32, u32, u32, Vec<u32>)], strings: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        for (name, info, sot, extra) in types {
            for w in [*name, *info, *sot].iter().chain(extra) {
                t.extend_from_slice(&w.to_le_bytes());
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            24u32,
            0,
            t.len() as u32,
            t.len() as u32,
            strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&t);
        out.extend_from_slice(strings);
        out
    }

    #[test]
    fn nested_member_through_typedef_and_anonymous_union() {
        // strings: 0 "", 1 "long", 6 "task_struct", 18 "thread", 25 "thread_struct",
        // 39 "fsbase", 46 "x", 48 "t"
        let strings = b"\0long\0task_struct\0thread\0thread_struct\0fsbase\0x\0t\0";
        let st = |vlen: u32| (KIND_STRUCT << 24) | vlen;
        let types = vec![
            // 1: long
            (1, KIND_INT << 24, 8, vec![64]),
            // 2: struct task_struct { long x @0; thread_struct_t thread @ 128 bytes }
            (6, st(2), 256, vec![46, 1, 0, 18, 5, 128 * 8]),
            // 3: struct thread_struct { long x @0; union { long fsbase @0 } @ 64 bits }
            (25, st(2), 16, vec![46, 1, 0, 0, 4, 64]),
            // 4: anonymous union { long fsbase }
            (0, (KIND_UNION << 24) | 1, 8, vec![39, 1, 0]),
            // 5: typedef t = const struct thread_struct
            (48, KIND_TYPEDEF << 24, 6, vec![]),
            // 6: const -> 3
            (0, KIND_CONST << 24, 3, vec![]),
        ];
        let btf = Btf::parse(&blob(&types, strings)).unwrap();
        assert_eq!(
            btf.member_offset("task_struct", &["thread", "fsbase"])
                .unwrap(),
            136
        );
        assert!(
            btf.member_offset("task_struct", &["thread", "nope"])
                .is_err()
        );
        assert!(btf.member_offset("nope", &["thread"]).is_err());
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Btf::parse(b"").is_err());
        assert!(Btf::parse(&[0u8; 64]).is_err());
        let mut b = blob(&[(0, (KIND_STRUCT << 24) | 5, 0, vec![])], b"\0");
        assert!(Btf::parse(&b).is_err());
        b.truncate(30);
        assert!(Btf::parse(&b).is_err());
    }

    #[test]
    fn running_kernel() {
        let off = thread_pointer_offset().unwrap();
        assert_eq!(off, bpftool_offset("task_struct", thread_pointer_path()));
    }

    /// The oracle: the member path's byte offset from `bpftool btf dump ... format raw`
    /// (lines `[ID] KIND 'name' ...` and, under a struct, `'member' type_id=T
    /// bits_offset=B`), following typedefs and qualifiers.
    fn bpftool_offset(root: &str, path: &[&str]) -> u64 {
        let out = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", VMLINUX_BTF, "format", "raw"])
            .output()
            .expect("bpftool (cargo xtask setup installs it)");
        let text = String::from_utf8(out.stdout).unwrap();
        // id -> (header line, member lines)
        let mut types: std::collections::HashMap<u64, (&str, Vec<&str>)> = Default::default();
        let mut current = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix('[') {
                let id: u64 = rest.split(']').next().unwrap().parse().unwrap();
                types.insert(id, (line, Vec::new()));
                current = Some(id);
            } else if let Some(id) = current {
                types.get_mut(&id).unwrap().1.push(line.trim());
            }
        }
        let field = |l: &str, key: &str| -> u64 {
            let v = l
                .split(key)
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            v.parse().unwrap()
        };
        let quoted = format!("STRUCT '{root}' ");
        let mut id = *types.iter().find(|(_, t)| t.0.contains(&quoted)).unwrap().0;
        let mut bits = 0;
        for name in path {
            while !types[&id].0.contains(" STRUCT ") && !types[&id].0.contains(" UNION ") {
                id = field(types[&id].0, "type_id=");
            }
            let member = format!("'{name}' ");
            let m = types[&id]
                .1
                .iter()
                .find(|l| l.starts_with(&member))
                .unwrap();
            bits += field(m, "bits_offset=");
            id = field(m, "type_id=");
        }
        bits / 8
    }
}
