//! Calls of interpreted programs from their USDT probes (Python's `function__entry` /
//! `function__return(filename, funcname, lineno)`, `probes::known`): the strings behind
//! the probes' pointer arguments, learned per process from string sections, and the
//! call each probe opens or closes, for `calls`.
//!
//! A probe's arguments 3.. are in the records after its first (`FLAG_USDT_MORE`), so a
//! call is known at the record that completes the arguments it needs; it takes the
//! first record's time. A pointer no string section named in its process (a uprobe
//! site, `--user`, a string the ring had no room for) is shown as `<unread 0x…>`, one
//! that could not be read as `<unreadable 0x…>`, one that held no string when drained
//! (empty, not UTF-8: freed memory) as `<stale 0x…>`; never another process's string.
//! A pointer whose string changed while a buffer was being written (freed and reused:
//! `STRING_CHANGED`) names that buffer's records by its newer string; such changes are
//! counted ([`StringStats`]) and reported.
//!
//! Call probes (`function__entry` / `function__return`) become calls named
//! `file:function:line` (`Event::lang`). The strings come from the drains
//! (`tracer-ebpf/src/strings.rs`) through string sections; readers intern them per process.

use std::{collections::HashMap, rc::Rc};

use tracer_common::{
    FLAG_USDT_INDEX_SHIFT, FLAG_USDT_MORE, Record, STRING_CHANGED, STRING_TRUNCATED,
    STRING_UNREADABLE,
};

use crate::{probes::CallProbe, tracefile::StringAt};

/// A call of the interpreted program that a record opens or closes. `file` and
/// `function` are string ids ([`Lang::text`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LangCall {
    pub entry: bool,
    pub file: u32,
    pub function: u32,
    pub line: u32,
    /// The probe's time (its first record's).
    pub time_ns: u64,
}

/// What the string sections of a trace said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct StringStats {
    /// String sections (a pointer named, or named again).
    pub sent: u64,
    /// Sent again because the bytes at the pointer changed (freed and reused while
    /// recorded; the records of the drain that saw the change get the newer string).
    pub changed: u64,
    /// Empty or not UTF-8: freed memory when drained (`<stale 0x…>`).
    pub stale: u64,
    /// Could not be read (`<unreadable 0x…>`).
    pub unreadable: u64,
}

/// A call probe's first record, waiting for the records with its other arguments.
struct Pending {
    site: u32,
    probe: CallProbe,
    args: [u64; 8],
    time_ns: u64,
}

/// The strings of a trace (per process) and the call probes under way (per thread).
#[derive(Default)]
pub(crate) struct Lang {
    /// (pid, pointer) → string id.
    at: HashMap<(u32, u64), u32>,
    pub stats: StringStats,
    /// String id → text; one id per distinct text.
    texts: Vec<Rc<str>>,
    ids: HashMap<Rc<str>, u32>,
    /// Ids of `<stale 0x…>` texts.
    stale: std::collections::HashSet<u32>,
    pending: HashMap<(u32, u32), Pending>,
}

impl Lang {
    /// A string section: from here on `s.ptr` in process `s.pid` means its text.
    pub(crate) fn learn(&mut self, s: StringAt) {
        let st = &mut self.stats;
        st.sent += 1;
        st.changed += u64::from(s.status & STRING_CHANGED != 0);
        let text = match s.status & !STRING_CHANGED {
            STRING_UNREADABLE => {
                st.unreadable += 1;
                format!("<unreadable {:#x}>", s.ptr)
            }
            // Freed memory: no name and no file is empty or not UTF-8.
            _ if s.text.is_empty() || s.text.contains(char::REPLACEMENT_CHARACTER) => {
                st.stale += 1;
                let id = self.intern(&format!("<stale {:#x}>", s.ptr));
                self.stale.insert(id);
                self.at.insert((s.pid, s.ptr), id);
                return;
            }
            STRING_TRUNCATED => format!("{}…", s.text),
            _ => s.text,
        };
        let id = self.intern(&text);
        self.at.insert((s.pid, s.ptr), id);
    }

    /// The text of string id `id`.
    pub(crate) fn text(&self, id: u32) -> &str {
        self.texts.get(id as usize).map_or("?", |t| t)
    }

    fn intern(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let t: Rc<str> = Rc::from(text);
        let id = self.texts.len() as u32;
        self.texts.push(t.clone());
        self.ids.insert(t, id);
        id
    }

    /// The string id of pointer `ptr` in process `pid`.
    fn string(&mut self, pid: u32, ptr: u64) -> u32 {
        match self.at.get(&(pid, ptr)) {
            Some(&id) => id,
            None => self.intern(&format!("<unread {ptr:#x}>")),
        }
    }

    /// Record `rec` of thread (pid, tid), of a site that is call probe `probe` (None:
    /// any other site): the call it completes, if any.
    pub(crate) fn step(
        &mut self,
        (pid, tid): (u32, u32),
        probe: Option<CallProbe>,
        rec: &Record,
        time_ns: u64,
    ) -> Option<LangCall> {
        if rec.flags & FLAG_USDT_MORE != 0 {
            let k = ((rec.flags >> FLAG_USDT_INDEX_SHIFT) & 0xff) as usize;
            let p = self.pending.get_mut(&(pid, tid))?;
            if p.site != rec.site || 2 * k + 3 >= p.args.len() {
                return None;
            }
            p.args[2 * k + 2] = rec.value;
            p.args[2 * k + 3] = rec.aux;
            if 2 * k + 4 < needed(&p.probe) {
                return None;
            }
            let p = self.pending.remove(&(pid, tid))?;
            return Some(self.call(pid, &p));
        }
        let Some(probe) = probe else {
            self.other_record((pid, tid));
            return None;
        };
        let mut args = [0; 8];
        args[0] = rec.value;
        args[1] = rec.aux;
        let p = Pending {
            site: rec.site,
            probe,
            args,
            time_ns,
        };
        if needed(&probe) <= 2 {
            return Some(self.call(pid, &p));
        }
        self.pending.insert((pid, tid), p);
        None
    }

    fn stale_id(&mut self, ptr: u64) -> u32 {
        let id = self.intern(&format!("<stale {ptr:#x}>"));
        self.stale.insert(id);
        id
    }

    /// Thread (pid, tid) recorded at a site that is no call probe: a probe's records
    /// are contiguous, so one still waiting lost the others.
    #[inline]
    pub(crate) fn other_record(&mut self, thread: (u32, u32)) {
        if !self.pending.is_empty() {
            self.pending.remove(&thread);
        }
    }

    fn call(&mut self, pid: u32, p: &Pending) -> LangCall {
        let arg = |n: u8| {
            p.args
                .get(usize::from(n).wrapping_sub(1))
                .copied()
                .unwrap_or(0)
        };
        let (file_ptr, function_ptr) = (arg(p.probe.file), arg(p.probe.function));
        let (mut file, mut function) = (self.string(pid, file_ptr), self.string(pid, function_ptr));
        // Both name one code object: when one was freed, the other is no better.
        if self.stale.contains(&file) || self.stale.contains(&function) {
            file = self.stale_id(file_ptr);
            function = self.stale_id(function_ptr);
        }
        LangCall {
            entry: p.probe.entry,
            file,
            function,
            // Line numbers are 32-bit (`-4@%eax`): sign-extended in the record.
            line: arg(p.probe.line) as u32,
            time_ns: p.time_ns,
        }
    }
}

/// Arguments a call probe needs (the highest it reads).
fn needed(p: &CallProbe) -> usize {
    usize::from(p.file.max(p.function).max(p.line))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::STRING_OK;

    const ENTRY: CallProbe = CallProbe {
        entry: true,
        file: 1,
        function: 2,
        line: 3,
    };

    fn rec(site: u32, flags: u32, value: u64, aux: u64) -> Record {
        Record {
            site,
            flags,
            time: 0,
            value,
            aux,
        }
    }

    #[test]
    fn a_call_completes_at_its_last_argument_with_the_first_records_time() {
        let mut l = Lang::default();
        let string = |ptr, status, text: &str| StringAt {
            pid: 1,
            tid: 1,
            ptr,
            status,
            drain_time: 50,
            text: text.into(),
        };
        l.learn(string(0x10, STRING_OK, "a.py"));
        l.learn(string(0x20, STRING_OK, "f"));
        assert_eq!(
            l.step((1, 1), Some(ENTRY), &rec(5, 0, 0x10, 0x20), 100),
            None
        );
        let c = l
            .step((1, 1), None, &rec(5, FLAG_USDT_MORE, 7, 0), 999)
            .unwrap();
        assert_eq!(
            (l.text(c.file), l.text(c.function), c.line, c.time_ns),
            ("a.py", "f", 7, 100)
        );
        // Another process's pointer is not named by this one's strings.
        l.step((2, 2), Some(ENTRY), &rec(5, 0, 0x10, 0x30), 0);
        let c = l
            .step((2, 2), None, &rec(5, FLAG_USDT_MORE, 1, 0), 0)
            .unwrap();
        assert_eq!(l.text(c.file), "<unread 0x10>");
        // A MORE record without its first record opens nothing.
        assert_eq!(l.step((3, 3), None, &rec(5, FLAG_USDT_MORE, 1, 0), 0), None);
        // A changed string names the records from its drain on; freed memory is stale.
        l.learn(string(0x20, STRING_OK | STRING_CHANGED, "g"));
        l.learn(string(0x30, STRING_OK, ""));
        let call = |l: &mut Lang, func| {
            l.step((1, 1), Some(ENTRY), &rec(5, 0, 0x10, func), 0);
            let c = l
                .step((1, 1), None, &rec(5, FLAG_USDT_MORE, 1, 0), 0)
                .unwrap();
            l.text(c.function).to_string()
        };
        assert_eq!(call(&mut l, 0x20), "g");
        assert_eq!(call(&mut l, 0x30), "<stale 0x30>");
        // The file of a stale function is no better.
        let c = {
            l.step((1, 1), Some(ENTRY), &rec(5, 0, 0x10, 0x30), 0);
            l.step((1, 1), None, &rec(5, FLAG_USDT_MORE, 1, 0), 0)
                .unwrap()
        };
        assert_eq!(l.text(c.file), "<stale 0x10>");
        assert_eq!(
            l.stats,
            StringStats {
                sent: 4,
                changed: 1,
                stale: 1,
                unreadable: 0
            }
        );
    }
}
