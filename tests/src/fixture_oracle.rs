//! What the `matrix.c` and `app_so.c` fixtures do, computed independently of any build:
//! the one oracle that `matrix.rs`, `shared_lib.rs` and `aarch64.rs` check runs against.

/// `fixtures/matrix.c`: a main thread and one worker.
pub mod matrix {
    /// The fixture's functions the tests follow.
    pub const FOLLOWED: [&str; 5] = ["main", "fx_leaf", "fx_mid", "fx_fib", "fx_worker"];
    pub const WORKER_ARG: u64 = 1_000_000;

    fn leaf(x: u64) -> u64 {
        x * 3 + 1
    }

    fn fib(n: u64) -> u64 {
        if n < 2 { n } else { fib(n - 1) + fib(n - 2) }
    }

    fn fib_preorder(n: u64, out: &mut Vec<(String, u64)>) {
        out.push(("fx_fib".into(), n));
        if n >= 2 {
            fib_preorder(n - 1, out);
            fib_preorder(n - 2, out);
        }
    }

    /// Entries of the followed functions on the main thread, in order.
    pub fn expected_main_thread() -> Vec<(String, u64)> {
        let mut v = vec![("main".to_string(), 1)];
        for i in 0..1000 {
            v.push(("fx_mid".into(), i));
            v.push(("fx_leaf".into(), i + 1));
            v.push(("fx_leaf".into(), i + 2));
        }
        fib_preorder(12, &mut v);
        v
    }

    /// Entries of the followed functions on the worker thread, in order.
    pub fn expected_worker_thread() -> Vec<(String, u64)> {
        let mut v = vec![("fx_worker".to_string(), WORKER_ARG)];
        v.extend((0..100).map(|i| ("fx_leaf".to_string(), WORKER_ARG + i)));
        v
    }

    /// (stdout, exit code) of the fixture.
    pub fn expected_output() -> (String, i32) {
        let mut r: u64 = (0..1000).map(|i| leaf(i + 1) + leaf(i + 2)).sum();
        r += fib(12);
        r += (0..100).map(|i| leaf(WORKER_ARG + i)).sum::<u64>();
        (format!("matrix r={r} argc=1\n"), (r % 97) as i32 + 1)
    }
}

/// `fixtures/app_so.c` with `fixtures/libfx.c` as its shared library.
pub mod app_so {
    use std::path::{Path, PathBuf};

    use crate::compile::compile;
    use crate::paths::fixture;

    /// The program's followed functions.
    pub const APP_FNS: [&str; 2] = ["main", "fx_app"];
    /// The library's followed functions.
    pub const LIB_FNS: [&str; 2] = ["fxlib_square", "fxlib_sum"];

    /// Entries of the followed functions, in order.
    pub fn expected() -> Vec<(String, u64)> {
        let mut v = vec![("main".to_string(), 1)];
        for i in 0..50 {
            v.push(("fx_app".into(), i));
            v.push(("fxlib_square".into(), i));
        }
        v.push(("fxlib_sum".into(), 200));
        v.extend((0..200).map(|i| ("fxlib_square".to_string(), i)));
        v
    }

    /// (stdout, exit code) of the program.
    pub fn expected_output() -> (String, i32) {
        let r: u64 =
            (0..50u64).map(|i| i * i + 1).sum::<u64>() + (0..200u64).map(|i| i * i).sum::<u64>();
        (format!("app_so r={r}\n"), (r % 89) as i32 + 1)
    }

    /// `DIR/libfx.so` and `DIR/app` (linked to it) compiled by `cc` with `flags`.
    pub fn build(cc: &str, flags: &[&str], dir: &Path) -> (PathBuf, PathBuf) {
        let (lib, app) = (dir.join("libfx.so"), dir.join("app"));
        let mut f = flags.to_vec();
        f.extend(["-shared", "-fPIC"]);
        compile(cc, &[fixture("libfx.c")], &f, &lib);
        let ldir = format!("-L{}", dir.display());
        let mut f = flags.to_vec();
        f.extend([ldir.as_str(), "-lfx"]);
        compile(cc, &[fixture("app_so.c")], &f, &app);
        (lib, app)
    }
}
