//! What a command shows and leaves behind about its steps: the step events of the protocol
//! (`chpart_core::events`, one `tracing` event per step) become JSON lines (`--events`), a
//! Prometheus text file (`--metrics-file`, written when the command ends) and a progress bar on
//! a terminal. Logs stay on stderr as before; with a bar shown, they are printed above it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use chpart_core::events::{FIELDS, OK, RETRYING, TARGET};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Where the step events go for one command.
pub struct Reporting {
    /// The load the command works on, for events that do not name one (retries).
    load: Mutex<String>,
    events: Option<Mutex<Box<dyn Write + Send>>>,
    metrics: Option<(PathBuf, Mutex<Metrics>)>,
    progress: Option<ProgressBar>,
    /// `chpart load` is building: the bar counts its builds, not one build's parts.
    many_builds: std::sync::atomic::AtomicBool,
}

/// Sums of the step events, by (step, outcome).
#[derive(Default)]
struct Metrics {
    steps: BTreeMap<(String, String), StepSums>,
    loads: Vec<String>,
}

#[derive(Default, Clone, Copy)]
struct StepSums {
    count: u64,
    seconds: f64,
    rows: u64,
    bytes: u64,
    parts: u64,
    attempts: u64,
}

impl Reporting {
    /// Events to `events` (a file, or `-` for stderr), metrics to `metrics`, and a progress bar
    /// when stderr is a terminal that events are not written to.
    pub fn new(events: Option<&Path>, metrics: Option<&Path>) -> Result<Reporting, String> {
        let to_stderr = events.is_some_and(|p| p.as_os_str() == "-");
        let events = match events {
            None => None,
            Some(_) if to_stderr => Some(Mutex::new(Box::new(std::io::stderr()) as Box<_>)),
            Some(path) => Some(Mutex::new(Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("--events {}: {e}", path.display()))?,
            ) as Box<_>)),
        };
        let progress = (!to_stderr && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::hidden();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar
        });
        Ok(Reporting {
            load: Mutex::new(String::new()),
            events,
            metrics: metrics.map(|p| (p.to_owned(), Mutex::new(Metrics::default()))),
            progress,
            many_builds: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The load events without one are about.
    pub fn set_load(&self, load: &str) {
        *self.load.lock().unwrap_or_else(|p| p.into_inner()) = load.to_owned();
    }

    /// The progress bar, if one is shown (logs are printed above it).
    pub fn progress(&self) -> Option<&ProgressBar> {
        self.progress.as_ref()
    }

    /// Ends the command: clears the bar and writes the metrics file (temp file, then rename),
    /// with `chpart_success` 1 or 0.
    pub fn finish(&self, command: &str, success: bool) -> Result<(), String> {
        if let Some(bar) = &self.progress {
            bar.finish_and_clear();
        }
        if let Some(events) = &self.events {
            let _ = events.lock().unwrap_or_else(|p| p.into_inner()).flush();
        }
        let Some((path, metrics)) = &self.metrics else {
            return Ok(());
        };
        let metrics = metrics.lock().unwrap_or_else(|p| p.into_inner());
        let load = self.load.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let text = metrics.render(command, &load, success);
        let mut tmp = path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| format!("--metrics-file {}: {e}", path.display()))
    }

    fn on_step(&self, mut fields: Map<String, Value>) {
        if fields
            .get("load")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            let load = self.load.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if !load.is_empty() {
                fields.insert("load".into(), Value::from(load));
            }
        }
        let text = |k: &str| {
            fields
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let number = |k: &str| fields.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (step, outcome) = (text("step"), text("outcome"));
        if let Some((_, metrics)) = &self.metrics {
            let mut m = metrics.lock().unwrap_or_else(|p| p.into_inner());
            let load = text("load");
            if !load.is_empty() && !m.loads.contains(&load) {
                m.loads.push(load);
            }
            let sums = m.steps.entry((step.clone(), outcome.clone())).or_default();
            sums.count += 1;
            sums.seconds += fields
                .get("duration_ms")
                .and_then(Value::as_f64)
                .unwrap_or(0.0)
                / 1e3;
            sums.rows += number("rows");
            sums.bytes += number("bytes");
            sums.parts += number("parts");
            sums.attempts += number("attempts");
        }
        if let Some(bar) = &self.progress {
            self.show(bar, &step, &outcome, &fields);
        }
        if let Some(events) = &self.events {
            let line = serde_json::to_string(&Value::Object(fields)).expect("JSON serializes");
            let mut out = events.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(out, "{line}");
        }
    }

    /// Moves the bar: builds count parts uploaded, `chpart load` its builds, commits parts
    /// attached.
    fn show(&self, bar: &ProgressBar, step: &str, outcome: &str, fields: &Map<String, Value>) {
        use std::sync::atomic::Ordering;
        let number = |k: &str| fields.get(k).and_then(Value::as_u64).unwrap_or(0);
        if step.starts_with("build.") && self.many_builds.load(Ordering::Relaxed) {
            return;
        }
        if outcome == RETRYING {
            bar.set_message(format!(
                "retrying: {}",
                fields.get("error").and_then(Value::as_str).unwrap_or("")
            ));
            return;
        }
        if outcome != OK {
            return;
        }
        match step {
            "load.plan" => {
                self.many_builds.store(true, Ordering::Relaxed);
                let (builds, pending) = (number("parts"), number("attempts"));
                bar.set_prefix("load: building");
                bar.set_length(builds);
                bar.set_position(builds - pending.min(builds));
                bar.set_message(format!("{builds} build(s)"));
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.tick();
            }
            "load.build" => {
                bar.inc(1);
                bar.set_message(format!("{} rows built", number("rows")));
            }
            "build.read" => {
                bar.set_prefix("build: uploading parts");
                bar.set_length(number("parts"));
                bar.set_position(0);
                bar.set_message(format!("{} rows built", number("rows")));
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.tick();
            }
            "build.upload" => {
                bar.inc(1);
                bar.set_message(format!("{:.1} MB uploaded", number("bytes") as f64 / 1e6));
            }
            "build.publish" => bar.set_prefix("build: published"),
            "commit.plan" => {
                bar.set_prefix("commit: attaching parts");
                bar.set_length(number("parts"));
                bar.set_position(0);
                bar.set_message(format!("{} rows", number("rows")));
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.tick();
            }
            "commit.attach_part" => bar.inc(1),
            "commit.publish_partition" => {
                bar.set_prefix("commit: publishing partitions");
                bar.set_message(format!(
                    "partition {} visible",
                    fields
                        .get("partition")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ));
            }
            _ => {}
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition of the sums.
    fn render(&self, command: &str, load: &str, success: bool) -> String {
        let label = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let load = if load.is_empty() {
            self.loads.first().cloned().unwrap_or_default()
        } else {
            load.to_owned()
        };
        let base = format!("load=\"{}\",command=\"{}\"", label(&load), label(command));
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, value) in rows {
                out.push_str(&format!("{name}{{{base}{labels}}} {value}\n"));
            }
        };
        let per_step = |f: &dyn Fn(&StepSums) -> String, with_outcome: bool| {
            let mut rows: Vec<(String, String)> = Vec::new();
            let mut merged: BTreeMap<String, StepSums> = BTreeMap::new();
            for ((step, outcome), sums) in &self.steps {
                if with_outcome {
                    rows.push((
                        format!(",step=\"{}\",outcome=\"{}\"", label(step), label(outcome)),
                        f(sums),
                    ));
                } else {
                    let m = merged.entry(step.clone()).or_default();
                    m.count += sums.count;
                    m.seconds += sums.seconds;
                    m.rows += sums.rows;
                    m.bytes += sums.bytes;
                    m.parts += sums.parts;
                    m.attempts += sums.attempts;
                }
            }
            rows.extend(
                merged
                    .iter()
                    .map(|(step, sums)| (format!(",step=\"{}\"", label(step)), f(sums))),
            );
            rows
        };
        family(
            "chpart_success",
            "gauge",
            "1 if the command succeeded, 0 if it failed.",
            vec![(String::new(), u8::from(success).to_string())],
        );
        family(
            "chpart_finished_timestamp_seconds",
            "gauge",
            "When the command ended (Unix time).",
            vec![(String::new(), format!("{:.3}", unix_ms() as f64 / 1e3))],
        );
        family(
            "chpart_steps_total",
            "counter",
            "Steps that ended (retry: transient faults retried), by step and outcome.",
            per_step(&|s| s.count.to_string(), true),
        );
        family(
            "chpart_step_seconds_total",
            "counter",
            "Seconds spent in each step (for retries: the waits before them).",
            per_step(&|s| format!("{:.6}", s.seconds), false),
        );
        family(
            "chpart_rows_total",
            "counter",
            "Rows each step handled (the whole build or commit: the load's rows).",
            per_step(&|s| s.rows.to_string(), false),
        );
        family(
            "chpart_bytes_total",
            "counter",
            "Bytes each step handled (uploads: bytes sent).",
            per_step(&|s| s.bytes.to_string(), false),
        );
        family(
            "chpart_parts_total",
            "counter",
            "Parts each step handled.",
            per_step(&|s| s.parts.to_string(), false),
        );
        family(
            "chpart_attempts_total",
            "counter",
            "Attempts each step handled (a commit: its winning attempts).",
            per_step(&|s| s.attempts.to_string(), false),
        );
        out
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The `tracing` layer that hands step events to a [`Reporting`].
pub struct StepLayer(pub Arc<Reporting>);

impl<S: Subscriber> Layer<S> for StepLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        // The documented order, empty and zero fields left out (load, step, outcome and
        // duration_ms always present).
        let mut line = Map::new();
        line.insert("ts_ms".into(), Value::from(unix_ms()));
        for name in FIELDS {
            let Some(value) = fields.0.remove(*name) else {
                continue;
            };
            let always = matches!(*name, "load" | "step" | "outcome" | "duration_ms");
            let empty = match &value {
                Value::String(s) => s.is_empty(),
                Value::Number(n) => n.as_f64() == Some(0.0),
                _ => false,
            };
            if always || !empty {
                line.insert((*name).into(), value);
            }
        }
        self.0.on_step(line);
    }
}

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        let rounded = (value * 1000.0).round() / 1000.0;
        self.0.insert(field.name().into(), Value::from(rounded));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::from(format!("{value:?}")));
    }
}

/// Stderr for logs, printed above the progress bar while one is shown.
#[derive(Clone)]
pub struct LogWriter(pub Option<ProgressBar>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &self.0 {
            Some(bar) if !bar.is_hidden() => bar.suspend(|| std::io::stderr().write_all(buf))?,
            _ => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
