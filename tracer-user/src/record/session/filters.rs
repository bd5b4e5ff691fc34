//! In-kernel filters from the user's side: the `tracer record` / `tracer filter`
//! options, and writing them into the eBPF maps (`tracer_common::filter` has the
//! layout and the double-buffering rule).

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData},
};
use clap::Args;
use serde::{Deserialize, Serialize};
use tracer_common::{
    duration::{call_site_key, call_sites},
    ebpf::{MAP_CALL_SITES, MAP_FILTER, MAP_FILTER_ACTIVE, MAP_FILTER_IDS, MAP_FILTER_SITES},
    filter::{
        COMM_LEN, F_CGROUP, F_COMM, F_DURATION, F_PID, F_SAMPLE, F_SITES, F_TID, F_UID, F_VALUE,
        FilterConfig, ID_PID, ID_TID, MAX_COMMS, id_key, site_key,
    },
    meta::TimeMode,
};

use crate::record::session::binaries::Instrumented;

/// What passes the in-kernel filters (every option given must hold).
#[derive(Args, Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FilterSpec {
    /// Only records of sites in functions matching this glob (repeatable).
    #[arg(long = "functions", value_name = "GLOB")]
    #[serde(default)]
    pub functions: Vec<String>,
    /// Only records of this process (repeatable).
    #[arg(long = "filter-pid", value_name = "PID")]
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Only records of this thread (repeatable).
    #[arg(long = "filter-tid", value_name = "TID")]
    #[serde(default)]
    pub tids: Vec<u32>,
    /// Only records of threads running as this (real) uid.
    #[arg(long = "filter-uid", value_name = "UID")]
    #[serde(default)]
    pub uid: Option<u32>,
    /// Only records of threads in this cgroup (v2): a path under /sys/fs/cgroup or an id.
    #[arg(long = "filter-cgroup", value_name = "PATH|ID")]
    #[serde(default)]
    pub cgroup: Option<String>,
    /// Only records of threads with this name (`comm`; `prefix*` matches a prefix;
    /// repeatable, at most 4).
    #[arg(long = "filter-comm", value_name = "NAME")]
    #[serde(default)]
    pub comms: Vec<String>,
    /// Only records whose value is N, or in N..M (inclusive; decimal or 0x hex).
    #[arg(long = "filter-value", value_name = "N[..M]")]
    #[serde(default)]
    pub value: Option<String>,
    /// Keep one record in N.
    #[arg(long = "sample", value_name = "N")]
    #[serde(default)]
    pub sample: Option<u64>,
    /// Keep a call's entry and exit only when the call took at least this long (10us,
    /// 1.5ms, 500ns; 0 keeps every call), decided as the kernel drains the buffers.
    #[arg(long = "min-duration", value_name = "TIME")]
    #[serde(default)]
    pub min_duration: Option<String>,
}

impl FilterSpec {
    pub fn is_empty(&self) -> bool {
        *self == FilterSpec::default()
    }

    /// `--min-duration` in ns.
    pub fn min_duration_ns(&self) -> Result<Option<u64>> {
        self.min_duration
            .as_deref()
            .map(parse_duration_ns)
            .transpose()
    }

    /// The configuration entry (without the site and id sets); `tsc_hz` converts
    /// `--min-duration` into cycle-counter ticks.
    fn config(&self, tsc_hz: f64) -> Result<FilterConfig> {
        let mut c = FilterConfig::default();
        if let Some(ns) = self.min_duration_ns()? {
            c.flags |= F_DURATION;
            c.min_duration = (ns as f64 * tsc_hz / 1e9).ceil() as u64;
        }
        if !self.functions.is_empty() {
            c.flags |= F_SITES;
        }
        if !self.pids.is_empty() {
            c.flags |= F_PID;
        }
        if !self.tids.is_empty() {
            c.flags |= F_TID;
        }
        if let Some(uid) = self.uid {
            c.flags |= F_UID;
            c.uid = uid;
        }
        if let Some(cg) = &self.cgroup {
            c.flags |= F_CGROUP;
            c.cgroup = cgroup_id(cg)?;
        }
        if !self.comms.is_empty() {
            if self.comms.len() > MAX_COMMS {
                bail!("--filter-comm: at most {MAX_COMMS} names");
            }
            c.flags |= F_COMM;
            c.ncomm = self.comms.len() as u32;
            for (i, name) in self.comms.iter().enumerate() {
                let (bytes, len) = match name.strip_suffix('*') {
                    Some(prefix) => (prefix.as_bytes(), prefix.len()),
                    // The kernel keeps at most 15 bytes and a NUL: compare through it.
                    None => (name.as_bytes(), (name.len() + 1).min(COMM_LEN)),
                };
                if bytes.len() >= COMM_LEN {
                    bail!(
                        "--filter-comm {name:?}: thread names are at most {} bytes",
                        COMM_LEN - 1
                    );
                }
                c.set_comm(i, bytes, len);
            }
        }
        if let Some(v) = &self.value {
            let (lo, hi) = parse_range(v).with_context(|| format!("--filter-value {v:?}"))?;
            c.flags |= F_VALUE;
            c.value_min = lo;
            c.value_max = hi;
        }
        if let Some(n) = self.sample {
            if n == 0 {
                bail!("--sample 0: give N >= 1 (keep one record in N)");
            }
            c.flags |= F_SAMPLE;
            c.sample = n;
        }
        Ok(c)
    }

    /// Check everything that can be checked without the binaries.
    pub fn validate(&self) -> Result<()> {
        self.config(1e9)?;
        for g in &self.functions {
            glob::Pattern::new(g).with_context(|| format!("--functions {g:?}"))?;
        }
        Ok(())
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "none (every record passes)".into();
        }
        let mut parts = Vec::new();
        if !self.functions.is_empty() {
            parts.push(format!("functions {}", self.functions.join(",")));
        }
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        if !self.pids.is_empty() {
            parts.push(format!("pid {}", ids(&self.pids)));
        }
        if !self.tids.is_empty() {
            parts.push(format!("tid {}", ids(&self.tids)));
        }
        if let Some(u) = self.uid {
            parts.push(format!("uid {u}"));
        }
        if let Some(c) = &self.cgroup {
            parts.push(format!("cgroup {c}"));
        }
        if !self.comms.is_empty() {
            parts.push(format!("comm {}", self.comms.join(",")));
        }
        if let Some(v) = &self.value {
            parts.push(format!("value {v}"));
        }
        if let Some(n) = self.sample {
            parts.push(format!("1 in {n}"));
        }
        if let Some(d) = &self.min_duration {
            parts.push(format!("calls of at least {d}"));
        }
        parts.join(", ")
    }
}

fn parse_u64(s: &str) -> Result<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<i64>().map(|v| v as u64).or_else(|_| s.parse()),
    }
    .with_context(|| format!("{s:?} is not a number"))
}

/// A duration with its unit (`10us`, `1.5ms`, `500ns`, `2s`), or `0`, in ns.
fn parse_duration_ns(s: &str) -> Result<u64> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let (num, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n, *scale)))
        .with_context(|| format!("--min-duration {s:?}: give a unit: 10us, 1.5ms, 500ns, 2s"))?;
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..1e12).contains(&(v * scale)) => Ok((v * scale) as u64),
        _ => bail!("--min-duration {s:?}: expected a duration such as 10us, 1.5ms, 500ns"),
    }
}

fn parse_range(s: &str) -> Result<(u64, u64)> {
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (parse_u64(a)?, parse_u64(b)?),
        None => {
            let v = parse_u64(s)?;
            (v, v)
        }
    };
    if lo > hi {
        bail!("empty range: {lo} > {hi}");
    }
    Ok((lo, hi))
}

/// A cgroup v2 id: the inode number of its directory (what
/// bpf_get_current_cgroup_id returns), or the number given. A path is taken as it
/// is when it names a cgroup2 directory, else relative to the cgroup2 mount (as
/// `/proc/PID/cgroup` writes it: `0::/system.slice/x.service`; on hybrid systems the
/// mount is `/sys/fs/cgroup/unified`).
fn cgroup_id(s: &str) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    if let Ok(id) = s.parse::<u64>() {
        return Ok(id);
    }
    let is_cgroup2 = |p: &str| {
        std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 2 && f[2] == "cgroup2" && p.starts_with(f[1])
            })
        })
    };
    let path = if s.starts_with('/') && Path::new(s).is_dir() && is_cgroup2(s) {
        s.to_string()
    } else {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let root = mounts
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.len() > 2 && f[2] == "cgroup2")
            .map(|f| f[1].to_string())
            .context("--filter-cgroup: no cgroup2 file system is mounted")?;
        format!("{root}/{}", s.trim_start_matches('/'))
    };
    let md = std::fs::metadata(&path).with_context(|| format!("--filter-cgroup: {path}"))?;
    Ok(md.ino())
}

/// The filter maps of a session, and what is in force.
pub struct Filters {
    config: Array<MapData, FilterConfig>,
    active: Array<MapData, u32>,
    ids: HashMap<MapData, u64, u8>,
    sites: HashMap<MapData, [u64; 2], u64>,
    generation: u32,
    spec: FilterSpec,
    /// Sites matched per binary, for the summary.
    matched: BTreeMap<u64, usize>,
    /// The duration filter's call sites; `None`: the session was loaded without
    /// `--min-duration` (its maps have no room).
    call_sites: Option<HashMap<MapData, [u64; 2], u64>>,
    /// Binaries whose call sites are in `call_sites`.
    judged: std::collections::BTreeSet<u64>,
    /// Cycle-counter ticks per second (`--min-duration` is given in ns).
    tsc_hz: f64,
    /// A filter was put in force (the session's first is `record`'s options).
    set_once: bool,
}

/// A binary the duration filter cannot judge (its records carry no clock at calls).
#[derive(Debug, thiserror::Error)]
#[error(
    "{path}: --min-duration needs the cycle counter in every record, and this binary was \
     rewritten with --time {mode}: rewrite it with --time record"
)]
pub struct NoCallTimes {
    pub path: String,
    pub mode: &'static str,
}

impl Filters {
    /// Take the filter maps out of the loaded object.
    /// `durations`: the session was loaded for `--min-duration`.
    pub fn take(ebpf: &mut Ebpf, durations: bool) -> Result<Self> {
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("no {name} map in the eBPF object"))
        };
        let call_sites = if durations {
            Some(HashMap::try_from(take(MAP_CALL_SITES)?)?)
        } else {
            None
        };
        Ok(Filters {
            call_sites,
            judged: Default::default(),
            set_once: false,
            tsc_hz: if durations {
                crate::record::host::clock::calibrate(std::time::Duration::from_millis(20)).tsc_hz
            } else {
                1e9
            },
            config: Array::try_from(take(MAP_FILTER)?)?,
            active: Array::try_from(take(MAP_FILTER_ACTIVE)?)?,
            ids: HashMap::try_from(take(MAP_FILTER_IDS)?)?,
            sites: HashMap::try_from(take(MAP_FILTER_SITES)?)?,
            generation: 0,
            spec: FilterSpec::default(),
            matched: BTreeMap::new(),
        })
    }

    pub fn spec(&self) -> &FilterSpec {
        &self.spec
    }

    /// Put `spec` in force for `binaries`: fill the inactive generation, then flip.
    /// Returns the number of sites the function globs matched.
    pub fn set(&mut self, spec: &FilterSpec, binaries: &[&Instrumented]) -> Result<usize> {
        let mut config = spec.config(self.tsc_hz)?;
        if self.call_sites.is_some() && config.flags & F_DURATION == 0 {
            // A session started with --min-duration keeps its stacks going (threshold
            // 0: every call passes): entries held when the filter changed are written
            // before their exits, not lost.
            config.flags |= F_DURATION;
            config.min_duration = 0;
        }
        if config.flags & F_DURATION != 0 {
            if self.call_sites.is_none() {
                bail!(
                    "--min-duration: this session was started without it (start it with \
                     --min-duration to change the threshold while it runs)"
                );
            }
            for b in binaries {
                match self.judge_calls(b) {
                    Ok(()) => {}
                    // Said when the binary joined; refused only as the session starts.
                    Err(e) if e.is::<NoCallTimes>() && self.set_once => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let globs = spec
            .functions
            .iter()
            .map(|g| glob::Pattern::new(g).with_context(|| format!("--functions {g:?}")))
            .collect::<Result<Vec<_>>>()?;
        let next = self.generation ^ 1;
        self.clear_generation(next)?;
        self.matched.clear();
        let mut total = 0;
        if !globs.is_empty() {
            for b in binaries {
                total += self.add_sites(next, &globs, b)?;
            }
        }
        // Ids are not per generation: a drain between the two updates may use the new
        // set with the old configuration (only for that instant).
        let keys: Vec<u64> = self.ids.keys().filter_map(|k| k.ok()).collect();
        for k in keys {
            let _ = self.ids.remove(&k);
        }
        for &p in &spec.pids {
            self.ids.insert(id_key(ID_PID, p), 1, 0)?;
        }
        for &t in &spec.tids {
            self.ids.insert(id_key(ID_TID, t), 1, 0)?;
        }
        self.config.set(next, config, 0)?;
        self.active.set(0, next, 0)?;
        self.generation = next;
        self.set_once = true;
        // The old generation's site words stay until the next change: a drain that
        // took the old configuration just before the flip still finds them.
        self.spec = spec.clone();
        Ok(total)
    }

    /// A binary that joined the session: its sites under the filter in force.
    pub fn add_binary(&mut self, b: &Instrumented) -> Result<()> {
        if self.call_sites.is_some() {
            match self.judge_calls(b) {
                Ok(()) => {}
                // Its calls pass unjudged; the others' filter goes on.
                Err(e) if e.is::<NoCallTimes>() => log::warn!("{e:#}; its calls all pass"),
                Err(e) => return Err(e),
            }
        }
        if self.spec.functions.is_empty() {
            return Ok(());
        }
        let globs: Vec<glob::Pattern> = self
            .spec
            .functions
            .iter()
            .filter_map(|g| glob::Pattern::new(g).ok())
            .collect();
        self.add_sites(self.generation, &globs, b)?;
        Ok(())
    }

    fn add_sites(
        &mut self,
        generation: u32,
        globs: &[glob::Pattern],
        b: &Instrumented,
    ) -> Result<usize> {
        let mut words: BTreeMap<u32, u64> = BTreeMap::new();
        let mut n = 0;
        for s in &b.meta.sites {
            if globs.iter().any(|g| g.matches(&s.name)) {
                *words.entry(s.id / 64).or_default() |= 1 << (s.id % 64);
                n += 1;
            }
        }
        for (word, bits) in words {
            self.sites
                .insert(site_key(b.meta.binary_id, generation, word * 64), bits, 0)
                .with_context(|| {
                    format!(
                        "{}: the site filter map is full ({} words of 64 sites)",
                        b.path.display(),
                        tracer_common::ebpf::DEFAULT_FILTER_SITE_WORDS
                    )
                })?;
        }
        *self.matched.entry(b.meta.binary_id).or_default() += n;
        Ok(n)
    }

    /// Put `b`'s call sites in `CALL_SITES` (once per binary).
    fn judge_calls(&mut self, b: &Instrumented) -> Result<()> {
        let Some(map) = self.call_sites.as_mut() else {
            return Ok(());
        };
        if self.judged.contains(&b.meta.binary_id) {
            return Ok(());
        }
        if b.meta.time_mode != TimeMode::Record {
            return Err(NoCallTimes {
                path: b.path.display().to_string(),
                mode: b.meta.time_mode.name(),
            }
            .into());
        }
        for (site, info) in call_sites(&b.meta) {
            map.insert(call_site_key(b.meta.binary_id, site), info, 0)
                .with_context(|| {
                    format!(
                        "{}: the duration filter's call-site map is full",
                        b.path.display()
                    )
                })?;
        }
        self.judged.insert(b.meta.binary_id);
        Ok(())
    }

    fn clear_generation(&mut self, generation: u32) -> Result<()> {
        let stale: Vec<[u64; 2]> = self
            .sites
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| (k[1] >> 32) as u32 == generation)
            .collect();
        for k in stale {
            let _ = self.sites.remove(&k);
        }
        Ok(())
    }
}
