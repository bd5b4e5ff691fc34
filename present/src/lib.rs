//! What the rewriter and the tracer show people, shared so that neither binary's
//! reader depends on the other: [`progress`] bars for long jobs (terminal only, after a
//! delay) and [`demangle`]d symbol names.
//!
//! ```
//! let mut bar = present::progress::Bar::new(3, "{msg} [{bar:40}] {pos}/{len}", "reading".into());
//! for i in 1..=3 {
//!     bar.set_position(i);
//! }
//! bar.finish();
//! assert_eq!(present::demangle("_ZN3foo3barEv").as_deref(), Some("foo::bar()"));
//! assert_eq!(present::demangle("main"), None);
//! ```

pub mod demangle;
pub mod progress;

pub use demangle::demangle;
