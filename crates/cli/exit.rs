//! Exit codes, documented in docs/cli.md and in `chpart --help`. Spark (or any runner) decides
//! from them whether retrying a task can help.

use std::process::ExitCode;

use chpart_protocol::FailureKind;

/// Success.
pub const OK: u8 = 0;
/// Usage or configuration error (clap uses 2 for usage errors too).
pub const USAGE: u8 = 2;
/// Retryable failure: network, server busy, timeouts. Retrying the task may succeed.
pub const RETRYABLE: u8 = 3;
/// Permanent failure: bad input, schema mismatch, refused request. Retrying cannot help.
pub const PERMANENT: u8 = 4;
/// The load is no longer open (committed or aborted): this attempt was fenced off.
pub const FENCED: u8 = 5;

/// What each failure's exit code means: the one home of these texts. The PySpark package
/// (`chpart_spark/_cli.py`, `EXIT_MEANINGS`) and the JVM connector (`ChpartException.java`,
/// `EXIT_MEANINGS`) keep copies, which a test here holds equal to this table.
pub const MEANINGS: &[(u8, &str)] = &[
    (USAGE, "usage or configuration error"),
    (RETRYABLE, "retryable failure"),
    (PERMANENT, "permanent failure"),
    (
        FENCED,
        "the load is no longer open: this attempt was fenced",
    ),
];

/// The text for `--help`.
pub fn help() -> String {
    let codes: Vec<String> = MEANINGS
        .iter()
        .map(|(code, meaning)| format!("{code} {meaning}"))
        .collect();
    format!(
        "Exit codes: 0 done; {}. Retrying can help only after 3.",
        codes.join("; ")
    )
}

/// An error with what it means for the caller.
pub struct Failure {
    pub kind: FailureKind,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn new(kind: FailureKind, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            kind,
            error: error.into(),
        }
    }
}

/// The error and its causes joined by `: `, each said once. Many errors embed their cause in
/// their own message (thiserror's `{source}`, `{0}` of a `#[from]`) and also expose it as
/// `source()`; anyhow's `{:#}` would then print it again. A cause whose text is already part of
/// the message before it adds nothing and is skipped (its own causes are still judged).
pub fn render(error: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut parent: Option<String> = None;
    for cause in error.chain() {
        let text = cause.to_string();
        let repeated = parent.as_deref().is_some_and(|p| p.contains(&text));
        if !repeated {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        parent = Some(text);
    }
    out
}

pub trait ExitCodeOf {
    fn exit_code(self) -> ExitCode;
}

impl ExitCodeOf for FailureKind {
    fn exit_code(self) -> ExitCode {
        ExitCode::from(match self {
            FailureKind::Usage => USAGE,
            FailureKind::Retryable => RETRYABLE,
            FailureKind::Permanent => PERMANENT,
            FailureKind::Fenced => FENCED,
        })
    }
}

pub fn ok() -> ExitCode {
    ExitCode::from(OK)
}

#[cfg(test)]
mod tests {
    use super::render;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("Corrupt footer")]
        Footer,
        #[error("connection refused")]
        Refused,
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        /// Embeds its cause and exposes it.
        #[error("reading a.parquet: {0}")]
        Embeds(#[source] Inner),
        /// Exposes its cause only.
        #[error("reading b.parquet")]
        Exposes(#[source] Inner),
        /// Embeds a cause that embeds its own.
        #[error("request to 127.0.0.1:9: {0}")]
        Twice(#[source] Box<Outer>),
    }

    #[test]
    fn each_cause_is_said_once() {
        let rows: Vec<(&str, anyhow::Error, &str)> = vec![
            (
                "embedded cause",
                anyhow::Error::new(Outer::Embeds(Inner::Footer)).context("load l"),
                "load l: reading a.parquet: Corrupt footer",
            ),
            (
                "exposed cause",
                anyhow::Error::new(Outer::Exposes(Inner::Footer)).context("load l"),
                "load l: reading b.parquet: Corrupt footer",
            ),
            (
                "embedded two levels deep",
                anyhow::Error::new(Outer::Twice(Box::new(Outer::Embeds(Inner::Refused)))),
                "request to 127.0.0.1:9: reading a.parquet: connection refused",
            ),
            (
                "an embedded parent over an exposing child",
                anyhow::Error::new(Outer::Twice(Box::new(Outer::Exposes(Inner::Refused)))),
                "request to 127.0.0.1:9: reading b.parquet: connection refused",
            ),
            (
                "plain context chain",
                anyhow::anyhow!("root").context("middle").context("top"),
                "top: middle: root",
            ),
        ];
        for (case, error, want) in rows {
            assert_eq!(render(&error), want, "{case}");
        }
    }

    /// `(code, meaning)` pairs of a copy: each line holding a code among 2..=5 and a quoted
    /// text, as Python (`2: "text",`) and Java (`2, "text",`) write them.
    fn copied(source: &str) -> Vec<(u8, String)> {
        source
            .lines()
            .filter_map(|line| {
                let line = line.trim();
                let code: u8 = line.get(..1)?.parse().ok()?;
                let rest = line[1..].trim_start_matches([':', ',', ' ']);
                let text = rest.strip_prefix('"')?.split('"').next()?;
                (2..=5).contains(&code).then(|| (code, text.to_owned()))
            })
            .collect()
    }

    #[test]
    fn the_python_and_java_copies_of_the_exit_codes_are_these() {
        let want: Vec<(u8, String)> = super::MEANINGS
            .iter()
            .map(|(c, t)| (*c, (*t).to_owned()))
            .collect();
        let python = include_str!("../../deploy/spark/chpart_spark/_cli.py");
        let java = include_str!(
            "../../deploy/spark/connector/src/main/java/chpart/spark/ChpartException.java"
        );
        assert_eq!(copied(python), want, "chpart_spark/_cli.py EXIT_MEANINGS");
        assert_eq!(copied(java), want, "ChpartException.java EXIT_MEANINGS");
        // The exit code table of docs/cli.md lists the same codes.
        let readme = include_str!("../../docs/cli.md");
        for (code, _) in super::MEANINGS {
            assert!(
                readme.contains(&format!("\n| {code} | ")),
                "docs/cli.md's exit code table lacks {code}"
            );
        }
    }
}
