//! Progress of a long job on stderr: a bar on a terminal; otherwise (a log
//! file, a test) a line at every tenth of the way, so that a run of minutes
//! is never silent.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

pub struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    unit: String,
    total: u64,
    /// The next tenth to report without a terminal.
    next_tenth: u64,
}

impl Progress {
    /// Progress through `total` `unit`s (e.g. "positions").
    pub fn new(label: &str, unit: &str, total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{label} {{bar:40}} {{pos}}/{{len}} {unit} [{{elapsed}}, ETA {{eta}}]"
                ))
                .expect("the template is valid"),
            );
            bar
        });
        Progress {
            bar,
            label: label.to_string(),
            unit: unit.to_string(),
            total,
            next_tenth: 1,
        }
    }

    pub fn set(&mut self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            return;
        }
        let total = self.total.max(1);
        if done * 10 >= self.next_tenth * total {
            eprintln!("{}: {done}/{} {}", self.label, self.total, self.unit);
            self.next_tenth = done * 10 / total + 1;
        }
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
