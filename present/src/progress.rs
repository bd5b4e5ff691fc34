//! Progress bars for long jobs (rewriting a big binary; the tracer reading a big
//! trace): drawn on stderr only when it is a terminal, and only once the job has run
//! for [`SHOW_AFTER`] (`UTRACE_PROGRESS_AFTER_MS` overrides it), so short jobs and
//! scripts see nothing.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub const SHOW_AFTER: Duration = Duration::from_millis(700);

/// A bar that appears after [`SHOW_AFTER`], on a terminal only.
pub struct Bar {
    bar: ProgressBar,
    start: Instant,
    after: Duration,
    /// Drawn (Some(true)), waiting (Some(false)), or never: not a terminal (None).
    shown: Option<bool>,
}

impl Bar {
    /// `template`: an indicatif template, e.g. "{msg} [{bar:40}] {pos}/{len}".
    pub fn new(total: u64, template: &str, message: String) -> Bar {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(message);
        let after = std::env::var("UTRACE_PROGRESS_AFTER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SHOW_AFTER, Duration::from_millis);
        Bar {
            bar,
            start: Instant::now(),
            after,
            shown: std::io::stderr().is_terminal().then_some(false),
        }
    }

    fn maybe_show(&mut self) {
        if self.shown == Some(false) && self.start.elapsed() >= self.after {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = Some(true);
        }
    }

    pub fn set_position(&mut self, pos: u64) {
        self.maybe_show();
        self.bar.set_position(pos);
    }

    /// A new stage: its length and message.
    pub fn stage(&mut self, total: u64, message: &'static str) {
        self.bar.set_length(total);
        self.bar.set_message(message);
        self.set_position(0);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
