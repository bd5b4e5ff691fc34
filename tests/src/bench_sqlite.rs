//! The bench's sqlite3 CLI (sqlite 3.40.1 from Debian's orig tarball, gcc -O2 -g, with
//! symbols), built and cached by `cargo xtask sqlite3` (also run by `cargo xtask test`,
//! which passes its path in [`BENCH_SQLITE3_ENV`]), and a small SQL workload for it.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::paths::workspace_root;

/// Environment variable: the path of the bench's sqlite3 (set by `cargo xtask test`).
pub const BENCH_SQLITE3_ENV: &str = "UTRACE_BENCH_SQLITE3";

/// The bench's sqlite3: [`BENCH_SQLITE3_ENV`], else where `cargo xtask sqlite3` caches
/// it. None (after `skip::require` allowed it) when it is not there: a test fails
/// otherwise, naming `cargo xtask sqlite3`.
pub fn bench_sqlite3(what: &str) -> Option<PathBuf> {
    let path = match std::env::var_os(BENCH_SQLITE3_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            let target = match std::env::var_os("CARGO_TARGET_DIR") {
                Some(d) if !d.is_empty() => workspace_root().join(d),
                _ => workspace_root().join("target"),
            };
            target.join("xtask/bench-real/sqlite3")
        }
    };
    let what = format!(
        "{what} (build it with `cargo xtask sqlite3`: {})",
        path.display()
    );
    crate::skip::require("bench-sqlite3", path.is_file(), &what).then_some(path)
}

/// `rows` single-row INSERTs (each its own transaction) into two tables, two indexes,
/// a join, GROUP BY, UPDATE and DELETE on `:memory:` (the shape of the bench's own
/// workload, `xtask/src/bench/real/sqlite.rs`); it prints a few lines.
pub fn sqlite_script(rows: u64) -> String {
    let mut s = String::from(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c REAL);\n\
         CREATE TABLE u(id INTEGER PRIMARY KEY, t_id INTEGER, v TEXT);\n",
    );
    for i in 0..rows {
        let _ = writeln!(
            s,
            "INSERT INTO t VALUES({i}, {}, 'name-{i}', {}.5);",
            i * 7919 % 1000,
            i % 977
        );
        if i % 4 == 0 {
            let _ = writeln!(s, "INSERT INTO u VALUES({i}, {}, 'v{i}');", (i * 31) % rows);
        }
    }
    s.push_str(
        "CREATE INDEX t_a ON t(a);\n\
         CREATE INDEX u_t ON u(t_id);\n\
         SELECT a, count(*), sum(c) FROM t GROUP BY a ORDER BY a LIMIT 3;\n\
         SELECT count(*), sum(t.a) FROM t JOIN u ON u.t_id = t.id WHERE t.a < 100;\n\
         UPDATE t SET c = c + 1 WHERE a % 3 = 0;\n\
         DELETE FROM t WHERE a % 5 = 0;\n\
         SELECT count(*), sum(a), sum(c) FROM t;\n",
    );
    s
}
