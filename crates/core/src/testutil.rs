//! Helpers shared by the scenario-table tests.

use std::fmt::{Debug, Display};

/// Checks one row of a scenario table whose expectation is either success or an error whose
/// message contains `want`'s text. Returns the value on expected success, for further checks.
pub(crate) fn expect_row<T: Debug, E: Display>(
    row: &str,
    got: Result<T, E>,
    want: Result<(), &str>,
) -> Option<T> {
    match (got, want) {
        (Ok(value), Ok(())) => Some(value),
        (Err(e), Err(want)) => {
            let msg = e.to_string();
            assert!(msg.contains(want), "{row}: error {msg:?} lacks {want:?}");
            None
        }
        (Ok(value), Err(want)) => panic!("{row}: accepted as {value:?}, expected error {want:?}"),
        (Err(e), Ok(())) => panic!("{row}: rejected: {e}"),
    }
}
