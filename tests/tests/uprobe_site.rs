//! A function whose first bytes hold a branch target (fixtures/uprobe_site.c, fx_spin:
//! the loop label at offset 3) cannot take a 5-byte jump: the rewriter must make it a
//! uprobe site, and the trace must still hold exactly its records, in order relative to
//! the inline records of the same thread.

use std::collections::HashSet;
use std::process::Command;

use tests::*;

fn expected() -> Vec<(String, u64)> {
    let mut v = Vec::new();
    for i in 0..2000u64 {
        v.push(("fx_inline".to_string(), i));
        v.push(("fx_spin".to_string(), i % 37 + 1));
        v.push(("fx_inline".to_string(), 1_000_000 + i));
    }
    v
}

fn expected_stdout() -> String {
    let r: u64 = (0..2000u64).map(|i| (i & 7) + ((1_000_000 + i) & 7)).sum();
    format!("uprobe_site r={r}\n")
}

const FOLLOWED: [&str; 2] = ["fx_inline", "fx_spin"];

fn check(functions: &[&str], tag: &str) {
    let tmp = TempDir::new(tag);
    let orig = tmp.join("uprobe_site");
    compile("gcc", &[fixture("uprobe_site.c")], &["-O2", "-g"], &orig);
    let o = run(&mut Command::new(&orig), RUN_TIMEOUT);
    assert_eq!(
        (o.stdout_str(), o.status()),
        (expected_stdout(), 0),
        "original: {}",
        o.describe()
    );
    let probes: Vec<_> = FOLLOWED.iter().map(|f| (orig.as_path(), *f)).collect();
    let (_, events) = oracle::run_with_probes(&probes, &mut Command::new(&orig), RUN_TIMEOUT);
    let seq: Vec<(String, u64)> = events.iter().map(|e| (e.symbol.clone(), e.value)).collect();
    assert_seq_eq(
        &seq,
        &expected(),
        "FIXTURE CHECK (kernel uprobes on the original build)",
    );

    let traced = tmp.join("uprobe_site.traced");
    let (_, counts, meta) = rewrite(&orig, Some(&traced), functions);
    let mode = |n: &str| {
        meta.sites
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("no site {n}"))
            .mode
    };
    assert_eq!(
        mode("fx_spin"),
        SiteMode::Uprobe,
        "fx_spin has a branch target in its first 5 bytes"
    );
    assert_eq!(mode("fx_inline"), SiteMode::Inline);
    if functions.is_empty() {
        assert!(counts.uprobe >= 1 && counts.inline >= 2, "{counts:?}");
    } else {
        assert_eq!(
            counts,
            SiteCounts {
                total: 2,
                inline: 1,
                uprobe: 1,
                untraced: 0
            },
            "only the functions matching {functions:?}"
        );
        let names: HashSet<&str> = meta.sites.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, FOLLOWED.into_iter().collect(), "sites");
    }

    let t = run(&mut Command::new(&traced), RUN_TIMEOUT);
    assert_eq!(
        (t.stdout_str(), t.status()),
        (o.stdout_str(), 0),
        "rewritten: {}",
        t.describe()
    );
    let trace = tmp.join("uprobe_site.utrace");
    let r = tracer_record(&trace, &traced, &[], &[]);
    assert_eq!(
        (r.stdout_str(), r.status()),
        (o.stdout_str(), 0),
        "under tracer record: {}",
        r.describe()
    );

    let recs = dump(&trace);
    check_sites_valid(&recs, &[&meta]);
    let followed: Vec<&Rec> = recs
        .iter()
        .filter(|r| FOLLOWED.contains(&&*r.symbol))
        .collect();
    if !functions.is_empty() {
        assert_eq!(
            followed.len(),
            recs.len(),
            "records of functions that are not sites"
        );
    }
    let threads = by_tid(followed.iter().copied());
    assert_eq!(threads.len(), 1, "one thread");
    assert_eq!(threads[0].0, followed[0].pid, "the main thread");
    let seq: Vec<(String, u64)> = followed
        .iter()
        .map(|r| (r.symbol.to_string(), r.value))
        .collect();
    assert_seq_eq(
        &seq,
        &expected(),
        "trace: inline and uprobe records of the main thread",
    );
    let mut spin_aux = HashSet::new();
    for r in &followed {
        let up = &*r.symbol == "fx_spin";
        assert_eq!(r.flags & FLAG_UPROBE != 0, up, "FLAG_UPROBE of {r:?}");
        assert_eq!(r.flags & FLAG_KTIME != 0, up, "FLAG_KTIME of {r:?}");
        if up {
            spin_aux.insert(r.aux);
        }
    }
    assert_eq!(
        spin_aux.len(),
        1,
        "fx_spin is called from one place: return addresses {spin_aux:x?}"
    );
    let rep = report(&trace);
    assert_eq!(rep.dropped, 0, "dropped records");
    assert_eq!(
        (rep.count_of("fx_spin"), rep.count_of("fx_inline")),
        (2000, 4000),
        "report counts"
    );
    check_report_matches_dump(&rep, &recs);
}

#[test]
fn uprobe_site_only_selected_functions() {
    check(&["fx_spin", "fx_inl*"], "uprobe-selected");
}

#[test]
fn uprobe_site_all_functions() {
    check(&[], "uprobe-all");
}

/// The report names each uprobe site with the reason `rewriter -v` gave for it and the
/// records it delivered (fx_spin: called 2000 times, the kernel-uprobe oracle above).
#[test]
fn uprobe_site_reason_in_report() {
    let tmp = TempDir::new("uprobe-reason");
    let orig = tmp.join("uprobe_site");
    compile("gcc", &[fixture("uprobe_site.c")], &["-O2", "-g"], &orig);
    let traced = tmp.join("uprobe_site.traced");
    let v = rewriter(&[
        orig.as_os_str(),
        "-o".as_ref(),
        traced.as_os_str(),
        "--functions".as_ref(),
        "fx_spin".as_ref(),
        "--functions".as_ref(),
        "fx_inline".as_ref(),
        "-v".as_ref(),
    ])
    .ok();
    let prefix = "  uprobe site fx_spin (entry at ";
    let line = v
        .stdout_str()
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("rewriter -v names no uprobe site fx_spin: {}", v.describe()));
    let why = line.split_once("): ").map(|(_, w)| w.to_string()).unwrap();
    let trace = tmp.join("uprobe_site.utrace");
    let r = tracer_record(&trace, &traced, &[], &[]);
    assert_eq!(r.status(), 0, "under tracer record: {}", r.describe());
    let json = report_json(&trace);
    let sites = json["uprobe_sites"].as_array().expect("uprobe_sites");
    let got: Vec<(&str, &str, &str, u64)> = sites
        .iter()
        .map(|s| {
            (
                s["function"].as_str().unwrap(),
                s["kind"].as_str().unwrap(),
                s["reason"].as_str().unwrap(),
                s["records"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![("fx_spin", "entry", why.as_str(), 2000)],
        "{line}"
    );
    let text = run(
        Command::new(tracer_bin()).arg("report").arg(&trace),
        TRACE_TIMEOUT,
    )
    .ok();
    let shown = "2000  fx_spin (entry, uprobe_site.traced site ";
    assert!(
        text.stdout_str()
            .lines()
            .any(|l| l.contains(shown) && l.ends_with(&why)),
        "the text report names the site and its reason: {}",
        text.describe()
    );
}
