//! Quoting for the SQL chpart generates, in one place for every crate: identifiers (any name:
//! dots, spaces, backquotes) and string literals (any text, and any path's bytes), each
//! escaped so that ClickHouse reads back exactly the value quoted.

use std::ffi::OsStr;

/// `db.table` quoted for SQL.
pub fn quote_table(database: &str, table: &str) -> String {
    format!("{}.{}", quote_ident(database), quote_ident(table))
}

/// A backquoted identifier for any name (dots, spaces, backquotes included).
pub fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('`');
    for c in name.chars() {
        match c {
            '`' => out.push_str("\\`"),
            '\\' => out.push_str("\\\\"),
            _ => out.push(c),
        }
    }
    out.push('`');
    out
}

/// A single-quoted string literal for `text`.
pub fn quote_str(text: &str) -> String {
    quote_bytes(text.as_bytes())
}

/// A single-quoted string literal for arbitrary bytes: a path need not be UTF-8, and
/// ClickHouse reads `\xHH` escapes in literals, so every path can be spelled exactly.
pub fn quote_os(text: &OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    quote_bytes(text.as_bytes())
}

fn quote_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('\'');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\0' => out.push_str("\\0"),
                _ => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out.push('\'');
    out
}
