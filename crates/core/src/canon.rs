//! Canonical, unambiguous byte encodings fed to SHA-256.
//!
//! Part names and table fingerprints are digests of several fields. Concatenating fields would
//! let different tuples encode to the same bytes (`"a.b" + "c"` vs `"a" + "b.c"`), so every
//! variable-length field is written as its length (u64, big-endian) followed by its bytes, and
//! every digest starts with a domain tag so two kinds of digest can never be confused.

use sha2::{Digest, Sha256};

/// A SHA-256 over a sequence of self-delimiting fields.
pub(crate) struct Canon(Sha256);

impl Canon {
    /// Starts a digest whose first field is `domain` (e.g. `"chpart-part-name-v1"`).
    pub(crate) fn new(domain: &str) -> Self {
        let mut canon = Canon(Sha256::new());
        canon.str(domain);
        canon
    }

    /// Appends a variable-length field.
    pub(crate) fn str(&mut self, value: &str) -> &mut Self {
        self.u64(value.len() as u64);
        self.0.update(value.as_bytes());
        self
    }

    /// Appends a fixed-width integer field (always 8 bytes, so it needs no length prefix).
    pub(crate) fn u64(&mut self, value: u64) -> &mut Self {
        self.0.update(value.to_be_bytes());
        self
    }

    pub(crate) fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// True when `s` is exactly `len` lowercase hex digits: the one spelling chpart writes, so that
/// digests compare as strings.
pub(crate) fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_boundaries_change_the_digest() {
        let split = |fields: &[&str]| {
            let mut c = Canon::new("test");
            for f in fields {
                c.str(f);
            }
            c.finish()
        };
        assert_ne!(split(&["a.b", "c"]), split(&["a", "b.c"]));
        assert_ne!(split(&["ab"]), split(&["a", "b"]));
        assert_ne!(split(&["", "a"]), split(&["a", ""]));
        assert_eq!(split(&["a", "b"]), split(&["a", "b"]));
    }

    #[test]
    fn lower_hex() {
        let rows = [
            ("exact", "0123456789abcdef", 16, true),
            ("uppercase", "0123456789ABCDEF", 16, false),
            ("short", "abc", 4, false),
            ("long", "abcde", 4, false),
            ("non-hex", "abcg", 4, false),
            ("empty ok at len 0", "", 0, true),
        ];
        for (name, s, len, expected) in rows {
            assert_eq!(is_lower_hex(s, len), expected, "{name}");
        }
    }
}
