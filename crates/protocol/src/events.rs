//! Reporting steps: a [`Step`] is started when a step begins and reports one event (see
//! [`chpart_core::events`]) when it ends, with its duration and outcome.

use std::fmt::Display;
use std::time::Instant;

use chpart_core::events::{FAILED, OK, TARGET};

/// A step being timed; reports when [`Step::ok`] or [`Step::end`] is called (a step dropped
/// without either reports nothing: the command is ending another way).
#[must_use = "a step reports when it ends"]
pub struct Step {
    load: String,
    step: &'static str,
    attempt: String,
    shard: u32,
    part: String,
    partition: String,
    rows: u64,
    bytes: u64,
    parts: u64,
    attempts: u64,
    started: Instant,
}

impl Step {
    /// Step `step` of `load` starts now.
    pub fn start(load: impl Display, step: &'static str) -> Step {
        Step {
            load: load.to_string(),
            step,
            attempt: String::new(),
            shard: 0,
            part: String::new(),
            partition: String::new(),
            rows: 0,
            bytes: 0,
            parts: 0,
            attempts: 0,
            started: Instant::now(),
        }
    }

    /// The attempt it belongs to.
    pub fn attempt(mut self, attempt: impl Display) -> Step {
        self.attempt = attempt.to_string();
        self
    }

    /// The shard it runs on (cluster loads).
    pub fn shard(mut self, shard: Option<u32>) -> Step {
        self.shard = shard.unwrap_or(0);
        self
    }

    /// The part it is about.
    pub fn part(mut self, part: impl Display) -> Step {
        self.part = part.to_string();
        self
    }

    /// The table partition it is about.
    pub fn partition(mut self, partition: impl Display) -> Step {
        self.partition = partition.to_string();
        self
    }

    /// Rows, bytes, parts and attempts it handled.
    pub fn counts(mut self, rows: u64, bytes: u64, parts: u64, attempts: u64) -> Step {
        (self.rows, self.bytes, self.parts, self.attempts) = (rows, bytes, parts, attempts);
        self
    }

    /// Reports the step finished.
    pub fn ok(self) {
        self.report(OK, "");
    }

    /// Reports the step by its result, and passes the result on.
    pub fn end<T, E: Display>(self, result: Result<T, E>) -> Result<T, E> {
        match &result {
            Ok(_) => self.report(OK, ""),
            Err(e) => self.report(FAILED, &e.to_string()),
        }
        result
    }

    fn report(&self, outcome: &str, error: &str) {
        tracing::info!(
            target: TARGET,
            load = self.load.as_str(),
            attempt = self.attempt.as_str(),
            shard = self.shard,
            part = self.part.as_str(),
            partition = self.partition.as_str(),
            step = self.step,
            outcome,
            duration_ms = self.started.elapsed().as_secs_f64() * 1e3,
            rows = self.rows,
            bytes = self.bytes,
            parts = self.parts,
            attempts = self.attempts,
            error,
        );
    }
}
