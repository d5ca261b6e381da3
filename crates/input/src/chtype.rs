//! ClickHouse column types, parsed from the strings `system.columns.type` prints.
//!
//! The schema check decides per column whether an Arrow type converts losslessly into the
//! target's ClickHouse type, and it must look inside wrappers (`Nullable`, `LowCardinality`)
//! and containers (`Array`, `Map`, `Tuple`) to do so. Comparing type *strings* cannot do that,
//! so the target table's types are parsed into [`ChType`] once. [`ChType`]'s `Display` prints
//! the canonical spelling `system.columns` uses (`Decimal32(2)` reads back as `Decimal(9, 2)`),
//! which is also what goes into clickhouse-local's `--structure`.
//!
//! Only the types chpart can fill from Parquet/Arrow are accepted. Anything else (`JSON`,
//! `Variant`, `Dynamic`, `Time`, `BFloat16`, aggregate function states, geo types) is an
//! [`TypeParseError`] naming the whole type string, so an unsupported table fails before any
//! rows are read instead of deep inside clickhouse-local. `SimpleAggregateFunction(f, T)` holds
//! plain `T` values and parses as `T`.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// One ClickHouse data type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ChType {
    /// `Int8`.
    Int8,
    /// `Int16`.
    Int16,
    /// `Int32`.
    Int32,
    /// `Int64`.
    Int64,
    /// `Int128`.
    Int128,
    /// `Int256`.
    Int256,
    /// `UInt8`.
    UInt8,
    /// `UInt16`.
    UInt16,
    /// `UInt32`.
    UInt32,
    /// `UInt64`.
    UInt64,
    /// `UInt128`.
    UInt128,
    /// `UInt256`.
    UInt256,
    /// `Float32`.
    Float32,
    /// `Float64`.
    Float64,
    /// `Decimal(P, S)`; `Decimal32(S)` and friends parse into this with their fixed precision.
    Decimal {
        /// Total digits, 1..=76.
        precision: u8,
        /// Digits after the point, 0..=precision.
        scale: u8,
    },
    /// `String` (arbitrary bytes).
    String,
    /// `FixedString(N)`: exactly N bytes.
    FixedString(u32),
    /// `Bool`.
    Bool,
    /// `Date`: days since 1970 as UInt16 (1970-01-01..2149-06-06).
    Date,
    /// `Date32`: days since 1970 as Int32 (1900-01-01..2299-12-31).
    Date32,
    /// `DateTime` / `DateTime('tz')`: seconds since 1970 as UInt32 (up to 2106-02-07).
    DateTime(Option<String>),
    /// `DateTime64(P)` / `DateTime64(P, 'tz')`: ticks of 10^-P s since 1970 as Int64.
    DateTime64 {
        /// Sub-second digits, 0..=9.
        precision: u8,
        /// Time zone, if the column declares one.
        tz: Option<String>,
    },
    /// `UUID`.
    Uuid,
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
    /// `Enum8('a' = 1, ...)`, elements in the order written.
    Enum8(Vec<(String, i8)>),
    /// `Enum16('a' = 1, ...)`, elements in the order written.
    Enum16(Vec<(String, i16)>),
    /// `LowCardinality(T)`.
    LowCardinality(Box<ChType>),
    /// `Nullable(T)`.
    Nullable(Box<ChType>),
    /// `Array(T)`.
    Array(Box<ChType>),
    /// `Map(K, V)`.
    Map(Box<ChType>, Box<ChType>),
    /// `Tuple(T1, T2)` (all names `None`) or `Tuple(a T1, b T2)` (all names `Some`).
    Tuple(Vec<TupleElement>),
}

/// One element of a [`ChType::Tuple`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TupleElement {
    /// The element's name in a named tuple.
    pub name: Option<String>,
    /// The element's type.
    pub ty: ChType,
}

impl ChType {
    /// Whether NULL can be stored at this level: `Nullable(T)` or `LowCardinality(Nullable(T))`.
    pub fn is_nullable(&self) -> bool {
        match self {
            ChType::Nullable(_) => true,
            ChType::LowCardinality(inner) => inner.is_nullable(),
            _ => false,
        }
    }

    /// The type with `Nullable` and `LowCardinality` wrappers removed: what a value is stored as.
    pub fn storage(&self) -> &ChType {
        match self {
            ChType::Nullable(inner) | ChType::LowCardinality(inner) => inner.storage(),
            other => other,
        }
    }
}

/// A type string that is not a ClickHouse type chpart supports.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("cannot parse ClickHouse type {type_string:?}: {reason} at offset {offset}")]
pub struct TypeParseError {
    /// The whole string that was being parsed.
    pub type_string: String,
    /// Byte offset where parsing failed.
    pub offset: usize,
    /// What was wrong there.
    pub reason: String,
}

impl FromStr for ChType {
    type Err = TypeParseError;

    fn from_str(s: &str) -> Result<ChType, TypeParseError> {
        let mut parser = Parser { text: s, pos: 0 };
        let ty = parser.parse_type()?;
        parser.skip_ws();
        if parser.pos != s.len() {
            return Err(parser.error("unexpected text after the type"));
        }
        Ok(ty)
    }
}

/// Recursive descent over the type string; `pos` is a byte offset into `text`.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn error(&self, reason: impl Into<String>) -> TypeParseError {
        TypeParseError {
            type_string: self.text.to_owned(),
            offset: self.pos,
            reason: reason.into(),
        }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    /// Consumes `c` (after whitespace) if it is next; reports whether it was.
    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), TypeParseError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error(format!("expected {c:?}")))
        }
    }

    /// A bare identifier (`[A-Za-z_][A-Za-z0-9_]*`), or `None` without consuming anything.
    fn identifier(&mut self) -> Option<&'a str> {
        self.skip_ws();
        let rest = self.rest();
        let first = rest.chars().next()?;
        if !(first.is_ascii_alphabetic() || first == '_') {
            return None;
        }
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        self.pos += len;
        Some(&rest[..len])
    }

    fn number<T: FromStr>(&mut self, what: &str) -> Result<T, TypeParseError> {
        self.skip_ws();
        let rest = self.rest();
        let sign = usize::from(rest.starts_with('-'));
        let digits = rest[sign..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - sign);
        if digits == 0 {
            return Err(self.error(format!("expected {what}")));
        }
        let value = rest[..sign + digits]
            .parse()
            .map_err(|_| self.error(format!("{what} out of range")))?;
        self.pos += sign + digits;
        Ok(value)
    }

    /// A quoted string with ClickHouse escapes (`\'`, `\\`, `\n`, `\t`, ..., doubled quote).
    fn quoted(&mut self, quote: char) -> Result<String, TypeParseError> {
        self.skip_ws();
        if self.peek() != Some(quote) {
            return Err(self.error(format!("expected a {quote}-quoted string")));
        }
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                self.pos = start;
                return Err(self.error("unterminated quoted string"));
            };
            self.pos += c.len_utf8();
            if c == quote {
                if self.peek() == Some(quote) {
                    self.pos += 1;
                    out.push(quote);
                    continue;
                }
                return Ok(out);
            }
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some(escaped) = self.peek() else {
                continue;
            };
            self.pos += escaped.len_utf8();
            out.push(match escaped {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                'b' => '\u{8}',
                'f' => '\u{c}',
                other => other,
            });
        }
    }

    fn parse_type(&mut self) -> Result<ChType, TypeParseError> {
        self.skip_ws();
        let start = self.pos;
        let Some(name) = self.identifier() else {
            return Err(self.error("expected a type name"));
        };
        let simple = match name {
            "Int8" => Some(ChType::Int8),
            "Int16" => Some(ChType::Int16),
            "Int32" => Some(ChType::Int32),
            "Int64" => Some(ChType::Int64),
            "Int128" => Some(ChType::Int128),
            "Int256" => Some(ChType::Int256),
            "UInt8" => Some(ChType::UInt8),
            "UInt16" => Some(ChType::UInt16),
            "UInt32" => Some(ChType::UInt32),
            "UInt64" => Some(ChType::UInt64),
            "UInt128" => Some(ChType::UInt128),
            "UInt256" => Some(ChType::UInt256),
            "Float32" => Some(ChType::Float32),
            "Float64" => Some(ChType::Float64),
            "String" => Some(ChType::String),
            "Bool" => Some(ChType::Bool),
            "Date" => Some(ChType::Date),
            "Date32" => Some(ChType::Date32),
            "UUID" => Some(ChType::Uuid),
            "IPv4" => Some(ChType::Ipv4),
            "IPv6" => Some(ChType::Ipv6),
            _ => None,
        };
        if let Some(ty) = simple {
            return Ok(ty);
        }
        let ty = match name {
            "DateTime" => {
                let tz = if self.eat('(') {
                    let tz = self.quoted('\'')?;
                    self.expect(')')?;
                    Some(tz)
                } else {
                    None
                };
                ChType::DateTime(tz)
            }
            "Decimal" => {
                self.expect('(')?;
                let precision = self.number::<u8>("a decimal precision")?;
                let scale = if self.eat(',') {
                    self.number::<u8>("a decimal scale")?
                } else {
                    0
                };
                self.expect(')')?;
                self.decimal(precision, scale)?
            }
            "Decimal32" | "Decimal64" | "Decimal128" | "Decimal256" => {
                let precision = match name {
                    "Decimal32" => 9,
                    "Decimal64" => 18,
                    "Decimal128" => 38,
                    _ => 76,
                };
                self.expect('(')?;
                let scale = self.number::<u8>("a decimal scale")?;
                self.expect(')')?;
                self.decimal(precision, scale)?
            }
            "FixedString" => {
                self.expect('(')?;
                let n = self.number::<u32>("a FixedString length")?;
                if n == 0 {
                    return Err(self.error("FixedString length must be positive"));
                }
                self.expect(')')?;
                ChType::FixedString(n)
            }
            "DateTime64" => {
                self.expect('(')?;
                let precision = self.number::<u8>("a DateTime64 precision")?;
                if precision > 9 {
                    return Err(self.error(format!("DateTime64 precision {precision} is above 9")));
                }
                let tz = if self.eat(',') {
                    Some(self.quoted('\'')?)
                } else {
                    None
                };
                self.expect(')')?;
                ChType::DateTime64 { precision, tz }
            }
            "Enum8" => ChType::Enum8(self.enum_elements(name)?),
            "Enum16" => ChType::Enum16(self.enum_elements(name)?),
            "LowCardinality" => ChType::LowCardinality(Box::new(self.one_argument()?)),
            "Nullable" => ChType::Nullable(Box::new(self.one_argument()?)),
            "Array" => ChType::Array(Box::new(self.one_argument()?)),
            "Map" => {
                self.expect('(')?;
                let key = self.parse_type()?;
                self.expect(',')?;
                let value = self.parse_type()?;
                self.expect(')')?;
                ChType::Map(Box::new(key), Box::new(value))
            }
            "Tuple" => self.tuple()?,
            // Stored and read as its argument type: the column keeps the value as it is, the
            // engine (AggregatingMergeTree) applies the function when it merges rows. Unlike
            // `AggregateFunction(...)` states, an input column of that type can carry it.
            "SimpleAggregateFunction" => {
                self.expect('(')?;
                self.skip_ws();
                if self.identifier().is_none() {
                    return Err(self.error("expected an aggregate function name"));
                }
                self.expect(',')?;
                let inner = self.parse_type()?;
                self.expect(')')?;
                inner
            }
            _ => {
                self.pos = start;
                return Err(self.error(format!("unknown or unsupported type {name:?}")));
            }
        };
        Ok(ty)
    }

    fn decimal(&self, precision: u8, scale: u8) -> Result<ChType, TypeParseError> {
        if !(1..=76).contains(&precision) {
            return Err(self.error(format!("decimal precision {precision} is outside 1..=76")));
        }
        if scale > precision {
            return Err(self.error(format!(
                "decimal scale {scale} exceeds precision {precision}"
            )));
        }
        Ok(ChType::Decimal { precision, scale })
    }

    fn one_argument(&mut self) -> Result<ChType, TypeParseError> {
        self.expect('(')?;
        let inner = self.parse_type()?;
        self.expect(')')?;
        Ok(inner)
    }

    fn enum_elements<V>(&mut self, kind: &str) -> Result<Vec<(String, V)>, TypeParseError>
    where
        V: FromStr + PartialEq + Copy,
    {
        self.expect('(')?;
        let mut elements: Vec<(String, V)> = Vec::new();
        loop {
            let name = self.quoted('\'')?;
            self.expect('=')?;
            let value = self.number::<V>(&format!("an {kind} value"))?;
            if elements.iter().any(|(n, v)| *n == name || *v == value) {
                return Err(self.error(format!("duplicate {kind} element {name:?}")));
            }
            elements.push((name, value));
            if !self.eat(',') {
                break;
            }
        }
        self.expect(')')?;
        Ok(elements)
    }

    /// `Tuple(T, ...)` or `Tuple(name T, ...)`; ClickHouse does not allow mixing the two.
    fn tuple(&mut self) -> Result<ChType, TypeParseError> {
        self.expect('(')?;
        let mut elements = Vec::new();
        loop {
            let element = self.tuple_element()?;
            if let Some(first) = elements.first() {
                let first: &TupleElement = first;
                if first.name.is_some() != element.name.is_some() {
                    return Err(self.error("tuple mixes named and unnamed elements"));
                }
            }
            elements.push(element);
            if !self.eat(',') {
                break;
            }
        }
        self.expect(')')?;
        Ok(ChType::Tuple(elements))
    }

    /// An element is named when a name (bare or backquoted) is followed by a type rather
    /// than by `,`, `)` or `(`: `Tuple(a UInt8)` vs `Tuple(UInt8)` vs `Tuple(Array(UInt8))`.
    fn tuple_element(&mut self) -> Result<TupleElement, TypeParseError> {
        self.skip_ws();
        if self.peek() == Some('`') {
            let name = self.quoted('`')?;
            return Ok(TupleElement {
                name: Some(name),
                ty: self.parse_type()?,
            });
        }
        let start = self.pos;
        let Some(word) = self.identifier() else {
            return Err(self.error("expected a tuple element"));
        };
        self.skip_ws();
        match self.peek() {
            Some(',' | ')' | '(') | None => {
                self.pos = start;
                Ok(TupleElement {
                    name: None,
                    ty: self.parse_type()?,
                })
            }
            Some(_) => Ok(TupleElement {
                name: Some(word.to_owned()),
                ty: self.parse_type()?,
            }),
        }
    }
}

/// Writes `s` in single quotes with the escapes ClickHouse itself prints (`\'`, `\\`).
pub(crate) fn write_quoted(f: &mut fmt::Formatter<'_>, s: &str, quote: char) -> fmt::Result {
    use fmt::Write;
    f.write_char(quote)?;
    for c in s.chars() {
        match c {
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\t' => f.write_str("\\t")?,
            '\r' => f.write_str("\\r")?,
            '\0' => f.write_str("\\0")?,
            c if c == quote => {
                f.write_char('\\')?;
                f.write_char(c)?;
            }
            c => f.write_char(c)?,
        }
    }
    f.write_char(quote)
}

/// A column or tuple element name as ClickHouse SQL: bare when it is a plain identifier,
/// otherwise backquoted.
pub(crate) struct SqlName<'a>(pub &'a str);

impl fmt::Display for SqlName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plain = self
            .0
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && self
                .0
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if plain {
            f.write_str(self.0)
        } else {
            write_quoted(f, self.0, '`')
        }
    }
}

/// A column name, always backquoted: safe next to any keyword in `--structure` and SQL.
pub(crate) struct Backquoted<'a>(pub &'a str);

impl fmt::Display for Backquoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, self.0, '`')
    }
}

impl fmt::Display for ChType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let simple = match self {
            ChType::Int8 => "Int8",
            ChType::Int16 => "Int16",
            ChType::Int32 => "Int32",
            ChType::Int64 => "Int64",
            ChType::Int128 => "Int128",
            ChType::Int256 => "Int256",
            ChType::UInt8 => "UInt8",
            ChType::UInt16 => "UInt16",
            ChType::UInt32 => "UInt32",
            ChType::UInt64 => "UInt64",
            ChType::UInt128 => "UInt128",
            ChType::UInt256 => "UInt256",
            ChType::Float32 => "Float32",
            ChType::Float64 => "Float64",
            ChType::String => "String",
            ChType::Bool => "Bool",
            ChType::Date => "Date",
            ChType::Date32 => "Date32",
            ChType::Uuid => "UUID",
            ChType::Ipv4 => "IPv4",
            ChType::Ipv6 => "IPv6",
            ChType::DateTime(None) => "DateTime",
            _ => "",
        };
        if !simple.is_empty() {
            return f.write_str(simple);
        }
        match self {
            ChType::Decimal { precision, scale } => write!(f, "Decimal({precision}, {scale})"),
            ChType::FixedString(n) => write!(f, "FixedString({n})"),
            ChType::DateTime(Some(tz)) => {
                f.write_str("DateTime(")?;
                write_quoted(f, tz, '\'')?;
                f.write_str(")")
            }
            ChType::DateTime64 { precision, tz } => {
                write!(f, "DateTime64({precision}")?;
                if let Some(tz) = tz {
                    f.write_str(", ")?;
                    write_quoted(f, tz, '\'')?;
                }
                f.write_str(")")
            }
            ChType::Enum8(elements) => write_enum(f, "Enum8", elements),
            ChType::Enum16(elements) => write_enum(f, "Enum16", elements),
            ChType::LowCardinality(inner) => write!(f, "LowCardinality({inner})"),
            ChType::Nullable(inner) => write!(f, "Nullable({inner})"),
            ChType::Array(inner) => write!(f, "Array({inner})"),
            ChType::Map(key, value) => write!(f, "Map({key}, {value})"),
            ChType::Tuple(elements) => {
                f.write_str("Tuple(")?;
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if let Some(name) = &element.name {
                        write!(f, "{} ", SqlName(name))?;
                    }
                    write!(f, "{}", element.ty)?;
                }
                f.write_str(")")
            }
            _ => unreachable!("simple types are written above"),
        }
    }
}

fn write_enum<V: fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    kind: &str,
    elements: &[(String, V)],
) -> fmt::Result {
    write!(f, "{kind}(")?;
    for (i, (name, value)) in elements.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write_quoted(f, name, '\'')?;
        write!(f, " = {value}")?;
    }
    f.write_str(")")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ChType {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn b(t: ChType) -> Box<ChType> {
        Box::new(t)
    }

    #[test]
    fn canonical_strings_parse_and_round_trip() {
        // (system.columns spelling, parsed value); Display must give back the same string.
        let named = |n: &str, ty| TupleElement {
            name: Some(n.into()),
            ty,
        };
        let unnamed = |ty| TupleElement { name: None, ty };
        let rows: Vec<(&str, ChType)> = vec![
            ("Int8", ChType::Int8),
            ("Int16", ChType::Int16),
            ("Int32", ChType::Int32),
            ("Int64", ChType::Int64),
            ("Int128", ChType::Int128),
            ("Int256", ChType::Int256),
            ("UInt8", ChType::UInt8),
            ("UInt16", ChType::UInt16),
            ("UInt32", ChType::UInt32),
            ("UInt64", ChType::UInt64),
            ("UInt128", ChType::UInt128),
            ("UInt256", ChType::UInt256),
            ("Float32", ChType::Float32),
            ("Float64", ChType::Float64),
            (
                "Decimal(9, 2)",
                ChType::Decimal {
                    precision: 9,
                    scale: 2,
                },
            ),
            (
                "Decimal(76, 76)",
                ChType::Decimal {
                    precision: 76,
                    scale: 76,
                },
            ),
            (
                "Decimal(1, 0)",
                ChType::Decimal {
                    precision: 1,
                    scale: 0,
                },
            ),
            ("String", ChType::String),
            ("FixedString(16)", ChType::FixedString(16)),
            ("Bool", ChType::Bool),
            ("Date", ChType::Date),
            ("Date32", ChType::Date32),
            ("DateTime", ChType::DateTime(None)),
            ("DateTime('UTC')", ChType::DateTime(Some("UTC".into()))),
            (
                "DateTime64(3)",
                ChType::DateTime64 {
                    precision: 3,
                    tz: None,
                },
            ),
            (
                "DateTime64(9, 'America/New_York')",
                ChType::DateTime64 {
                    precision: 9,
                    tz: Some("America/New_York".into()),
                },
            ),
            ("UUID", ChType::Uuid),
            ("IPv4", ChType::Ipv4),
            ("IPv6", ChType::Ipv6),
            (
                r"Enum8('b\'c' = -2, 'a' = 1, 'x\\y' = 3)",
                ChType::Enum8(vec![
                    ("b'c".into(), -2),
                    ("a".into(), 1),
                    ("x\\y".into(), 3),
                ]),
            ),
            (
                "Enum8('lo' = -128, 'hi' = 127)",
                ChType::Enum8(vec![("lo".into(), -128), ("hi".into(), 127)]),
            ),
            (
                "Enum16('q' = 1000, 'é = ü' = -32768)",
                ChType::Enum16(vec![("q".into(), 1000), ("é = ü".into(), -32768)]),
            ),
            (
                "LowCardinality(String)",
                ChType::LowCardinality(b(ChType::String)),
            ),
            (
                "LowCardinality(Nullable(String))",
                ChType::LowCardinality(b(ChType::Nullable(b(ChType::String)))),
            ),
            ("Nullable(Int32)", ChType::Nullable(b(ChType::Int32))),
            (
                "Array(Array(UInt8))",
                ChType::Array(b(ChType::Array(b(ChType::UInt8)))),
            ),
            (
                "Map(String, Array(Nullable(Int8)))",
                ChType::Map(
                    b(ChType::String),
                    b(ChType::Array(b(ChType::Nullable(b(ChType::Int8))))),
                ),
            ),
            (
                "Tuple(UInt8, String)",
                ChType::Tuple(vec![unnamed(ChType::UInt8), unnamed(ChType::String)]),
            ),
            (
                "Tuple(a UInt8, `b c` String)",
                ChType::Tuple(vec![
                    named("a", ChType::UInt8),
                    named("b c", ChType::String),
                ]),
            ),
            (
                "Tuple(a Tuple(x Int8), b Array(Tuple(DateTime64(6, 'UTC'), Decimal(38, 10))))",
                ChType::Tuple(vec![
                    named("a", ChType::Tuple(vec![named("x", ChType::Int8)])),
                    named(
                        "b",
                        ChType::Array(b(ChType::Tuple(vec![
                            unnamed(ChType::DateTime64 {
                                precision: 6,
                                tz: Some("UTC".into()),
                            }),
                            unnamed(ChType::Decimal {
                                precision: 38,
                                scale: 10,
                            }),
                        ]))),
                    ),
                ]),
            ),
            // A tuple element may be named like a type.
            (
                "Tuple(String String, Date Date)",
                ChType::Tuple(vec![
                    named("String", ChType::String),
                    named("Date", ChType::Date),
                ]),
            ),
        ];
        for (text, expected) in rows {
            let parsed = parse(text);
            assert_eq!(parsed, expected, "{text}");
            assert_eq!(parsed.to_string(), text, "round trip of {text}");
        }
    }

    #[test]
    fn aliases_and_whitespace_parse_to_canonical() {
        // (input, canonical Display)
        let rows = [
            ("Decimal32(2)", "Decimal(9, 2)"),
            ("Decimal64(4)", "Decimal(18, 4)"),
            ("Decimal128(0)", "Decimal(38, 0)"),
            ("Decimal256(10)", "Decimal(76, 10)"),
            ("Decimal(10)", "Decimal(10, 0)"),
            ("  Array( Nullable( Int8 ) )  ", "Array(Nullable(Int8))"),
            (
                "Tuple(\n    a UInt8,\n    b String)",
                "Tuple(a UInt8, b String)",
            ),
            ("Enum8('a'=1,'b'=2)", "Enum8('a' = 1, 'b' = 2)"),
            ("Enum8('it''s' = 1)", r"Enum8('it\'s' = 1)"),
            ("DateTime64(3,'UTC')", "DateTime64(3, 'UTC')"),
            (
                "Map(LowCardinality(String),UInt64)",
                "Map(LowCardinality(String), UInt64)",
            ),
            ("Tuple(`a` Int8)", "Tuple(a Int8)"),
            ("SimpleAggregateFunction(max, UInt64)", "UInt64"),
            (
                "SimpleAggregateFunction(groupArrayArray, Array(String))",
                "Array(String)",
            ),
        ];
        for (input, canonical) in rows {
            assert_eq!(parse(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn bad_type_strings_are_errors_naming_the_string() {
        // (input, expected substring of the message besides the quoted input)
        let rows = [
            ("JSON", "unsupported type \"JSON\""),
            ("Variant(Int8, String)", "unsupported type \"Variant\""),
            ("Array(Object('json'))", "unsupported type \"Object\""),
            ("BFloat16", "unsupported type \"BFloat16\""),
            ("Time", "unsupported type \"Time\""),
            (
                "AggregateFunction(sum, UInt64)",
                "unsupported type \"AggregateFunction\"",
            ),
            (
                "SimpleAggregateFunction(, UInt64)",
                "expected an aggregate function name",
            ),
            ("int", "unsupported type \"int\""),
            ("", "expected a type name"),
            ("Array(Int8", "expected ')'"),
            ("Int8)", "unexpected text after the type"),
            ("Decimal(77, 2)", "precision 77 is outside 1..=76"),
            ("Decimal(5, 6)", "scale 6 exceeds precision 5"),
            ("DateTime64(10)", "precision 10 is above 9"),
            ("FixedString(0)", "length must be positive"),
            ("FixedString(x)", "expected a FixedString length"),
            ("Enum8('a' = 128)", "Enum8 value out of range"),
            ("Enum8('a' = 1, 'a' = 2)", "duplicate Enum8 element \"a\""),
            ("Enum8('a = 1)", "unterminated quoted string"),
            ("DateTime(UTC)", "expected a '-quoted string"),
            ("Tuple(a Int8, String)", "mixes named and unnamed"),
            ("Map(String)", "expected ','"),
        ];
        for (input, needle) in rows {
            let err = input.parse::<ChType>().expect_err(input).to_string();
            assert!(err.contains(&format!("{input:?}")), "{input}: {err}");
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    #[test]
    fn nullability_and_storage_see_through_wrappers() {
        let rows = [
            ("Int8", false, "Int8"),
            ("Nullable(Int8)", true, "Int8"),
            ("LowCardinality(String)", false, "String"),
            ("LowCardinality(Nullable(String))", true, "String"),
            ("Array(Nullable(Int8))", false, "Array(Nullable(Int8))"),
        ];
        for (text, nullable, storage) in rows {
            let ty = parse(text);
            assert_eq!(ty.is_nullable(), nullable, "{text}");
            assert_eq!(ty.storage().to_string(), storage, "{text}");
        }
    }
}
