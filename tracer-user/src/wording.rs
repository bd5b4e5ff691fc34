//! How counts read in what both the session's summary and the report print, so that
//! the two say the same and the session need not use the views.

/// "1 program", "2 programs".
pub(crate) fn programs(n: u64) -> String {
    if n == 1 {
        "1 program".into()
    } else {
        format!("{n} programs")
    }
}
