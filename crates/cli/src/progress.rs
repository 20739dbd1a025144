//! Progress on stderr for commands that may run long: a spinner while one request is planned,
//! a bar over sizes or placements whose finished rows are printed above it as they come, so an
//! interrupted run keeps what it found. indicatif draws only when stderr is a terminal.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner with `msg` and the elapsed time, ticking until it is dropped or finished.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.set_message(msg.into());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar over `len` steps named `msg`.
pub fn bar(len: u64, msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg.into());
    pb
}
