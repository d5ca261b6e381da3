//! Just enough ClickHouse SQL lexing and quoting for chpart's generated statements.
//!
//! [`crate::ddl`] edits a table's `create_table_query` without a full SQL parser; what it needs
//! is to know, for every byte, whether it is inside a string literal, a quoted identifier or a
//! bracket, because that is where the words it looks for (`TTL`, `SETTINGS`, `TO DISK`) do
//! *not* count. [`crate::parts`] needs quoting that round-trips any name or path.

pub use chpart_core::sql::{quote_ident, quote_os, quote_str};

/// What a token is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A bare word: keyword or unquoted identifier.
    Word,
    /// A `` `quoted` `` or `"quoted"` identifier.
    Quoted,
    /// A `'string literal'`.
    Str,
    /// A numeric literal.
    Number,
    /// `(`, `[` or `{`.
    Open,
    /// `)`, `]` or `}`.
    Close,
    /// `,`.
    Comma,
    /// Any other single character (operators, `.`, `=`, `;`).
    Punct,
}

/// One token: its kind, byte range in the text, and bracket depth (an opening bracket has the
/// depth outside it, the tokens inside are one deeper, the closing bracket is back outside).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub kind: Kind,
    pub start: usize,
    pub end: usize,
    pub depth: u32,
}

/// Why text could not be split into tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LexError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub problem: &'static str,
}

/// Splits ClickHouse SQL into tokens, skipping whitespace and comments. String literals and
/// quoted identifiers honour both backslash escapes and doubled quotes, as ClickHouse does.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, LexError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut stack: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        let depth = stack.len() as u32;
        let kind = match b {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => {
                i += 1;
                continue;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = text[i..].find('\n').map_or(bytes.len(), |n| i + n + 1);
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").ok_or(LexError {
                    offset: i,
                    problem: "unterminated /* comment",
                })?;
                i = i + 2 + end + 2;
                continue;
            }
            b'\'' | b'`' | b'"' => {
                i = quoted_end(bytes, i).ok_or(LexError {
                    offset: start,
                    problem: if b == b'\'' {
                        "unterminated string literal"
                    } else {
                        "unterminated quoted identifier"
                    },
                })?;
                if b == b'\'' {
                    Kind::Str
                } else {
                    Kind::Quoted
                }
            }
            b'(' | b'[' | b'{' => {
                stack.push(b);
                i += 1;
                Kind::Open
            }
            b')' | b']' | b'}' => {
                let open = match b {
                    b')' => b'(',
                    b']' => b'[',
                    _ => b'{',
                };
                if stack.pop() != Some(open) {
                    return Err(LexError {
                        offset: i,
                        problem: "unbalanced closing bracket",
                    });
                }
                i += 1;
                tokens.push(Token {
                    kind: Kind::Close,
                    start,
                    end: i,
                    depth: stack.len() as u32,
                });
                continue;
            }
            b',' => {
                i += 1;
                Kind::Comma
            }
            b'0'..=b'9' => {
                while i < bytes.len() {
                    let c = bytes[i];
                    let exponent_sign = (c == b'+' || c == b'-')
                        && matches!(bytes[i - 1], b'e' | b'E')
                        && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                Kind::Number
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric()
                        || bytes[i] == b'_'
                        || bytes[i] == b'$'
                        || bytes[i] >= 0x80)
                {
                    i += 1;
                }
                Kind::Word
            }
            _ => {
                i += 1;
                Kind::Punct
            }
        };
        tokens.push(Token {
            kind,
            start,
            end: i,
            depth,
        });
    }
    if !stack.is_empty() {
        return Err(LexError {
            offset: bytes.len(),
            problem: "unclosed bracket at the end",
        });
    }
    Ok(tokens)
}

/// End (exclusive) of the quoted token starting at `start`, or None if unterminated.
fn quoted_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            c if c == quote => {
                if bytes.get(i + 1) == Some(&quote) {
                    i += 2;
                } else {
                    return Some(i + 1);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The value of a quoted identifier or string literal token's text (quotes removed, escapes
/// resolved; unknown escapes keep the escaped character, as ClickHouse does).
pub(crate) fn unquote(token_text: &str) -> String {
    let inner = &token_text[1..token_text.len() - 1];
    let quote = token_text.as_bytes()[0] as char;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('r') => out.push('\r'),
                Some('0') => out.push('\0'),
                Some(other) => out.push(other),
                None => {}
            }
        } else if c == quote && chars.peek() == Some(&quote) {
            chars.next();
            out.push(quote);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn kinds(text: &str) -> Vec<(Kind, &str, u32)> {
        lex(text)
            .unwrap()
            .into_iter()
            .map(|t| (t.kind, &text[t.start..t.end], t.depth))
            .collect()
    }

    #[test]
    fn lexes_quotes_brackets_and_comments() {
        use Kind::*;
        type Lexed<'a> = Vec<(Kind, &'a str, u32)>;
        let cases: &[(&str, Lexed)] = &[
            (
                "a 'x''y' `b\\`c`",
                vec![(Word, "a", 0), (Str, "'x''y'", 0), (Quoted, "`b\\`c`", 0)],
            ),
            (
                "f(a, [1])",
                vec![
                    (Word, "f", 0),
                    (Open, "(", 0),
                    (Word, "a", 1),
                    (Comma, ",", 1),
                    (Open, "[", 1),
                    (Number, "1", 2),
                    (Close, "]", 1),
                    (Close, ")", 0),
                ],
            ),
            ("'it\\'s (' x", vec![(Str, "'it\\'s ('", 0), (Word, "x", 0)]),
            (
                "1e-5 -- c\n/* d */ \"q\"",
                vec![(Number, "1e-5", 0), (Quoted, "\"q\"", 0)],
            ),
            (
                "x>=2",
                vec![
                    (Word, "x", 0),
                    (Punct, ">", 0),
                    (Punct, "=", 0),
                    (Number, "2", 0),
                ],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(&kinds(text), want, "{text}");
        }
    }

    #[test]
    fn lex_errors() {
        let cases = [
            ("'abc", "unterminated string literal"),
            ("`abc", "unterminated quoted identifier"),
            ("f(a", "unclosed bracket at the end"),
            ("f(a]", "unbalanced closing bracket"),
            ("/* x", "unterminated /* comment"),
        ];
        for (text, problem) in cases {
            assert_eq!(lex(text).unwrap_err().problem, problem, "{text}");
        }
    }

    #[test]
    fn quoting_round_trips() {
        let cases = [
            ("plain", "`plain`", "'plain'"),
            ("my db.x", "`my db.x`", "'my db.x'"),
            ("a`b\\c", "`a\\`b\\\\c`", "'a`b\\\\c'"),
            ("it's\n", "`it's\n`", "'it\\'s\\n'"),
        ];
        for (text, ident, literal) in cases {
            assert_eq!(quote_ident(text), ident);
            assert_eq!(quote_str(text), literal);
            assert_eq!(unquote(&quote_ident(text)), text);
            assert_eq!(unquote(&quote_str(text)), text);
        }
        use std::os::unix::ffi::OsStrExt;
        assert_eq!(quote_os(OsStr::from_bytes(b"/d/\xff'x")), "'/d/\\xFF\\'x'");
    }
}
