//! Errors from the ClickHouse server, classified for the protocol.
//!
//! The server reports failures as `Code: N. DB::Exception: ... (NAME)`. We keep N and NAME and
//! classify by code, never by blanket retry: a transient code (server busy, network, timeout)
//! may be retried with backoff; a permanent one (bad SQL, missing part, access denied) may not;
//! and the outcome of a non-idempotent statement (ATTACH) after a transport failure is
//! [`ErrorClass::Unknown`]: the caller must observe the server before deciding anything.

/// What a caller may do after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The statement did not take effect and may be retried after a backoff.
    Transient,
    /// Retrying cannot help; the error must reach an operator.
    Permanent,
    /// The statement may or may not have taken effect: reconcile from what exists.
    Unknown,
}

/// An error talking to ClickHouse. Every variant names the endpoint and the statement.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The server answered with an exception.
    #[error("ClickHouse at {endpoint}: Code: {code}{}. {message} (while running: {statement})", name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Server {
        /// Endpoint URL (no credentials).
        endpoint: String,
        /// The server's error code, e.g. 233 for BAD_DATA_PART_NAME / part not found.
        code: u32,
        /// The code's name, e.g. `BAD_DATA_PART_NAME`, when the message carries it.
        name: Option<String>,
        /// The server's message.
        message: String,
        /// A short form of the statement.
        statement: String,
    },
    /// The server could not be reached, or the connection broke, or it timed out.
    #[error("ClickHouse at {endpoint} is unreachable or timed out: {detail} (while running: {statement})")]
    Transport {
        /// Endpoint URL (no credentials).
        endpoint: String,
        /// What went wrong.
        detail: String,
        /// A short form of the statement.
        statement: String,
    },
    /// The answer did not have the expected shape (a client/server version mismatch).
    #[error("ClickHouse at {endpoint}: unexpected answer: {detail} (while running: {statement})")]
    Protocol {
        /// Endpoint URL (no credentials).
        endpoint: String,
        /// What went wrong.
        detail: String,
        /// A short form of the statement.
        statement: String,
    },
}

impl ServerError {
    /// The server's `Code: N`, when the server answered.
    pub fn code(&self) -> Option<u32> {
        match self {
            ServerError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// How a caller may react; `idempotent` says whether re-running the statement is harmless.
    pub fn class(&self, idempotent: bool) -> ErrorClass {
        match self {
            ServerError::Server { code, .. } if is_transient_code(*code) => ErrorClass::Transient,
            ServerError::Server { .. } | ServerError::Protocol { .. } => ErrorClass::Permanent,
            ServerError::Transport { .. } if idempotent => ErrorClass::Transient,
            ServerError::Transport { .. } => ErrorClass::Unknown,
        }
    }
}

impl ServerError {
    /// This error with `note` added to what it says (e.g. how often it was retried).
    pub fn noted(self, note: &str) -> ServerError {
        match self {
            ServerError::Server {
                endpoint,
                code,
                name,
                message,
                statement,
            } => ServerError::Server {
                endpoint,
                code,
                name,
                message: format!("{message} [{note}]"),
                statement,
            },
            ServerError::Transport {
                endpoint,
                detail,
                statement,
            } => ServerError::Transport {
                endpoint,
                detail: format!("{detail} [{note}]"),
                statement,
            },
            ServerError::Protocol {
                endpoint,
                detail,
                statement,
            } => ServerError::Protocol {
                endpoint,
                detail: format!("{detail} [{note}]"),
                statement,
            },
        }
    }
}

/// The ClickHouse error codes chpart decides on, by their names in ClickHouse's
/// `ErrorCodes.cpp` (the name the server prints in parentheses after the message).
pub mod code {
    /// A table does not exist.
    pub const UNKNOWN_TABLE: u32 = 60;
    /// A database does not exist.
    pub const UNKNOWN_DATABASE: u32 = 81;
    /// A statement ran past its timeout.
    pub const TIMEOUT_EXCEEDED: u32 = 159;
    /// The server runs too many queries.
    pub const TOO_MANY_SIMULTANEOUS_QUERIES: u32 = 202;
    /// No free connection in a pool.
    pub const NO_FREE_CONNECTION: u32 = 203;
    /// A socket timed out.
    pub const SOCKET_TIMEOUT: u32 = 209;
    /// A network error.
    pub const NETWORK_ERROR: u32 = 210;
    /// A part name does not parse, or a detached part is not found (`ATTACH PART`, `DROP
    /// DETACHED PART` of a part that is gone).
    pub const BAD_DATA_PART_NAME: u32 = 233;
    /// The query was aborted.
    pub const ABORTED: u32 = 236;
    /// Out of memory.
    pub const MEMORY_LIMIT_EXCEEDED: u32 = 241;
    /// The table is read-only (a replica without its coordinator).
    pub const TABLE_IS_READ_ONLY: u32 = 242;
    /// Out of disk space.
    pub const NOT_ENOUGH_SPACE: u32 = 243;
    /// The partition has too many parts: inserts are throttled.
    pub const TOO_MANY_PARTS: u32 = 252;
    /// Too few live replicas.
    pub const TOO_FEW_LIVE_REPLICAS: u32 = 285;
    /// An insert's outcome is not known.
    pub const UNKNOWN_STATUS_OF_INSERT: u32 = 319;
    /// An operating system error.
    pub const SYSTEM_ERROR: u32 = 425;
    /// A lock wait was given up to avoid a deadlock.
    pub const DEADLOCK_AVOIDED: u32 = 473;
    /// The coordinator (Keeper) failed.
    pub const KEEPER_EXCEPTION: u32 = 999;
    /// A network library error.
    pub const POCO_EXCEPTION: u32 = 1000;
}

/// Server codes that mean "try again later", not "this statement is wrong".
pub fn is_transient_code(c: u32) -> bool {
    use code::*;
    matches!(
        c,
        TIMEOUT_EXCEEDED
            | TOO_MANY_SIMULTANEOUS_QUERIES
            | NO_FREE_CONNECTION
            | SOCKET_TIMEOUT
            | NETWORK_ERROR
            | ABORTED
            | MEMORY_LIMIT_EXCEEDED
            | TABLE_IS_READ_ONLY
            | TOO_MANY_PARTS
            | TOO_FEW_LIVE_REPLICAS
            | UNKNOWN_STATUS_OF_INSERT
            | SYSTEM_ERROR
            | DEADLOCK_AVOIDED
            | KEEPER_EXCEPTION
            | POCO_EXCEPTION
    )
}

/// Splits `Code: 233. DB::Exception: Detached part "x" not found. (BAD_DATA_PART_NAME) (version ...)`
/// into (233, Some("BAD_DATA_PART_NAME"), message).
pub fn parse_exception(text: &str) -> Option<(u32, Option<String>, String)> {
    let start = text.find("Code: ")?;
    let rest = &text[start + 6..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let code = digits.parse().ok()?;
    let message = rest[digits.len()..]
        .trim_start_matches('.')
        .trim()
        .trim_start_matches("DB::Exception:")
        .trim();
    let message = match message.find(" (version ") {
        Some(i) => &message[..i],
        None => message,
    };
    let name = message
        .rfind('(')
        .map(|i| &message[i + 1..])
        .and_then(|s| s.strip_suffix(')'))
        .filter(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
        })
        .map(str::to_owned);
    Some((code, name, message.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_exceptions() {
        let cases: &[(&str, u32, Option<&str>, &str)] = &[
            (
                "Code: 233. DB::Exception: Detached part \"x\" not found. (BAD_DATA_PART_NAME) (version 26.9.2.1)",
                233,
                Some("BAD_DATA_PART_NAME"),
                "Detached part \"x\" not found. (BAD_DATA_PART_NAME)",
            ),
            ("bad response: Code: 60. DB::Exception: Table d.t does not exist. (UNKNOWN_TABLE)", 60, Some("UNKNOWN_TABLE"), "Table d.t does not exist. (UNKNOWN_TABLE)"),
            ("Code: 1000. DB::Exception: Timeout", 1000, None, "Timeout"),
        ];
        for (text, code, name, message) in cases {
            let (c, n, m) = parse_exception(text).unwrap_or_else(|| panic!("no code in {text}"));
            assert_eq!(
                (c, n.as_deref(), m.as_str()),
                (*code, *name, *message),
                "{text}"
            );
        }
        assert_eq!(parse_exception("connection refused"), None);
    }

    #[test]
    fn classifies_by_code_and_idempotence() {
        let server = |code| ServerError::Server {
            endpoint: "e".into(),
            code,
            name: None,
            message: "m".into(),
            statement: "s".into(),
        };
        let transport = || ServerError::Transport {
            endpoint: "e".into(),
            detail: "d".into(),
            statement: "s".into(),
        };
        let rows: Vec<(&str, ServerError, bool, ErrorClass)> = vec![
            (
                "too many parts is transient",
                server(252),
                false,
                ErrorClass::Transient,
            ),
            (
                "part not found is permanent",
                server(233),
                false,
                ErrorClass::Permanent,
            ),
            (
                "syntax error is permanent",
                server(62),
                true,
                ErrorClass::Permanent,
            ),
            (
                "lost connection on a SELECT: retry",
                transport(),
                true,
                ErrorClass::Transient,
            ),
            (
                "lost connection on ATTACH: reconcile",
                transport(),
                false,
                ErrorClass::Unknown,
            ),
        ];
        for (name, err, idempotent, want) in rows {
            assert_eq!(err.class(idempotent), want, "{name}");
        }
    }
}
