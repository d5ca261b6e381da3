//! ClickHouse versions, compared the way part compatibility needs.
//!
//! A part written by a newer clickhouse-local may use a format an older server cannot read
//! (26.9 parts do not attach to 18.16), while the server reads what older versions wrote. So
//! the one rule is: the clickhouse-local that builds a load's parts must be no newer than the
//! server the load began on. Versions are dotted numbers (`26.9.2.1`); a field may carry a
//! suffix (`26.9.2.1-testing`), which does not count.

use std::cmp::Ordering;

/// Why a clickhouse-local may not build for a server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// clickhouse-local is newer than the server.
    #[error("clickhouse-local {local} is newer than the ClickHouse server {server}: parts it builds may not attach there; build with a clickhouse-local of version {server} or older (clickhouse_local.command)")]
    LocalNewer {
        /// clickhouse-local's version.
        local: String,
        /// The server's version.
        server: String,
    },
    /// A version that is not a dotted number.
    #[error("cannot compare ClickHouse versions: {value:?} ({what}) is not a dotted version number such as 26.9.2.1")]
    Unparsable {
        /// Whose version.
        what: &'static str,
        /// The text.
        value: String,
    },
}

/// The numeric fields of `version` (`26.9.2.1` -> `[26, 9, 2, 1]`), each field's leading
/// digits; `None` unless every field starts with a digit.
fn fields(version: &str) -> Option<Vec<u64>> {
    version
        .trim()
        .split('.')
        .map(|field| {
            let digits: String = field.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Orders two versions field by field; missing trailing fields count as 0 (`26.9` = `26.9.0.0`).
fn compare(a: &[u64], b: &[u64]) -> Ordering {
    let len = a.len().max(b.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..len)
        .map(|i| at(a, i).cmp(&at(b, i)))
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// Ok when clickhouse-local `local` may build parts for server `server` (same or older).
pub fn check_local_not_newer(local: &str, server: &str) -> Result<(), VersionError> {
    let parse = |what, value: &str| {
        fields(value).ok_or_else(|| VersionError::Unparsable {
            what,
            value: value.to_owned(),
        })
    };
    let (l, s) = (parse("clickhouse-local", local)?, parse("server", server)?);
    match compare(&l, &s) {
        Ordering::Greater => Err(VersionError::LocalNewer {
            local: local.to_owned(),
            server: server.to_owned(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_versions_against_the_server() {
        let newer = |l: &str, s: &str| {
            Err(VersionError::LocalNewer {
                local: l.into(),
                server: s.into(),
            })
        };
        let rows: &[(&str, &str, Result<(), VersionError>)] = &[
            ("26.9.2.1", "26.9.2.1", Ok(())),
            ("26.8.5.3", "26.9.2.1", Ok(())),
            ("25.12.1.1", "26.9.2.1", Ok(())),
            ("26.9", "26.9.2.1", Ok(())),
            ("26.9.2.1-testing", "26.9.2.1", Ok(())),
            ("26.9.2.2", "26.9.2.1", newer("26.9.2.2", "26.9.2.1")),
            ("26.10.1.5", "26.9.2.1", newer("26.10.1.5", "26.9.2.1")),
            ("27.1.1.1", "26.12.9.9", newer("27.1.1.1", "26.12.9.9")),
            ("26.9.2.1.1", "26.9.2.1", newer("26.9.2.1.1", "26.9.2.1")),
            ("26.9.2.1", "26.9.2.1.0", Ok(())),
        ];
        for (local, server, want) in rows {
            assert_eq!(
                &check_local_not_newer(local, server),
                want,
                "{local} vs {server}"
            );
        }
        let err = check_local_not_newer("x.1", "26.9").unwrap_err();
        assert!(
            matches!(
                err,
                VersionError::Unparsable {
                    what: "clickhouse-local",
                    ..
                }
            ),
            "{err}"
        );
        let err = check_local_not_newer("26.9", "").unwrap_err();
        assert!(
            matches!(err, VersionError::Unparsable { what: "server", .. }),
            "{err}"
        );
        let message = newer("26.10.1.5", "26.9.2.1").unwrap_err().to_string();
        assert!(
            message.contains("26.10.1.5") && message.contains("26.9.2.1"),
            "{message}"
        );
    }
}
