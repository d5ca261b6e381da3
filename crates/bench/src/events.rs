//! The benchmark's table: one hour of web/app events, as Arrow batches and as ClickHouse DDL.
//!
//! chpart's executor cost is dominated by what clickhouse-local does per column type, so the
//! input must exercise the types real event tables have, not a few integers: a
//! `LowCardinality(String)` key column, free-text URLs, a `FixedString`, a mostly-NULL decimal,
//! arrays, maps, nullable strings and integers. The value distributions matter as much, because
//! they decide how well the columns compress and therefore how many bytes get uploaded: user ids
//! follow a Zipf law, a user keeps the same country and session for the hour, timestamps arrive
//! nearly in order, and optional fields are absent most of the time. A row is about 119 bytes
//! as ClickHouse 26.9 stores it uncompressed (`system.parts.data_uncompressed_bytes`) and 111 in
//! Arrow. Of the 119, about 30 are the UInt64 length that 26.x writes for every string value
//! into a separate `.size` stream; counted as older versions count them (a varint per string),
//! a row is about 92 bytes, the size of typical event tables. Every column has values, so no
//! choice of distribution brings 26.9's figure far below 100 short of emptying arrays and maps.
//!
//! [`EventGen`] produces the rows batch by batch from one [`Rng`] stream, so a given seed, row
//! count and hour give the same rows however they are later split into batches or files.

use std::fmt::Write as _;
use std::sync::Arc;

use arrow_array::builder::{
    Decimal128Builder, FixedSizeBinaryBuilder, ListBuilder, MapBuilder, StringBuilder,
    TimestampMicrosecondBuilder, UInt32Builder, UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};

use crate::rng::{mix64, Rng, Weights};

/// The ClickHouse table the generated Parquet files fill, column for column.
pub fn ddl(table: &str) -> String {
    ddl_partitioned(table, "toYYYYMMDD(ts)")
}

/// [`ddl`] with another partition key (an expression of the columns), e.g. one that cuts an
/// hour into many partitions, so that a small input makes many parts.
pub fn ddl_partitioned(table: &str, partition_by: &str) -> String {
    format!(
        "CREATE TABLE {table} (ts DateTime64(3, 'UTC'), user_id UInt64, event LowCardinality(String), \
         url String, country FixedString(2), revenue Nullable(Decimal(18, 4)), tags Array(String), \
         props Map(String, String), session_id Nullable(String), duration_ms Nullable(UInt32)) \
         ENGINE = MergeTree PARTITION BY {partition_by} ORDER BY (event, user_id, ts)"
    )
}

/// Whether `name` is usable unquoted as `db.table` or `table` in the statements the benchmark
/// writes; anything else would need quoting rules the benchmark has no reason to carry.
pub fn valid_table_name(name: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with(|c: char| c.is_ascii_digit())
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match name.split_once('.') {
        Some((db, table)) => part(db) && part(table),
        None => part(name),
    }
}

/// The Arrow schema of the generated batches. Nullability mirrors the DDL: chpart's schema check
/// treats a nullable Arrow field headed for a non-`Nullable` column as something to verify row
/// by row, which a clean input should not need.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("user_id", DataType::UInt64, false),
        Field::new("event", DataType::Utf8, false),
        Field::new("url", DataType::Utf8, false),
        Field::new("country", DataType::FixedSizeBinary(2), false),
        Field::new("revenue", DataType::Decimal128(18, 4), true),
        Field::new("tags", DataType::List(tag_field()), false),
        Field::new("props", props_type(), false),
        Field::new("session_id", DataType::Utf8, true),
        Field::new("duration_ms", DataType::UInt32, true),
    ]))
}

fn tag_field() -> Arc<Field> {
    Arc::new(Field::new("item", DataType::Utf8, false))
}

fn props_key_field() -> Arc<Field> {
    Arc::new(Field::new("keys", DataType::Utf8, false))
}

fn props_value_field() -> Arc<Field> {
    Arc::new(Field::new("values", DataType::Utf8, false))
}

fn props_type() -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![props_key_field(), props_value_field()])),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

/// Event names and their relative frequencies: views dominate, money events are rare.
const EVENTS: [(&str, u64); 12] = [
    ("page_view", 38),
    ("click", 18),
    ("scroll", 10),
    ("search", 7),
    ("view_item", 7),
    ("error", 5),
    ("add_to_cart", 4),
    ("login", 3),
    ("share", 3),
    ("purchase", 2),
    ("logout", 2),
    ("signup", 1),
];

/// Countries by share of traffic; a user's country is fixed (a hash of the user).
const COUNTRIES: [(&[u8; 2], u64); 20] = [
    (b"US", 30),
    (b"DE", 8),
    (b"GB", 8),
    (b"IN", 8),
    (b"FR", 6),
    (b"BR", 6),
    (b"JP", 5),
    (b"CA", 4),
    (b"MX", 3),
    (b"NL", 3),
    (b"ES", 3),
    (b"IT", 3),
    (b"PL", 2),
    (b"SE", 2),
    (b"AU", 2),
    (b"KR", 2),
    (b"TR", 2),
    (b"ID", 2),
    (b"CN", 1),
    (b"ZA", 1),
];

const CATEGORIES: [&str; 12] = [
    "shoes", "shirts", "jackets", "bags", "watches", "toys", "books", "garden", "kitchen",
    "phones", "laptops", "audio",
];

const WORDS: [&str; 16] = [
    "red", "winter", "sale", "leather", "wireless", "kids", "running", "vintage", "cotton", "gift",
    "black", "organic", "mini", "pro", "travel", "classic",
];

const TAGS: [&str; 20] = [
    "mobile",
    "desktop",
    "tablet",
    "ios",
    "android",
    "web",
    "promo",
    "returning",
    "new_user",
    "ab_a",
    "ab_b",
    "beta",
    "vip",
    "organic",
    "paid",
    "email",
    "social",
    "guest",
    "sale",
    "app",
];

/// Map keys, each with the values it takes.
const PROPS: [(&str, &[&str]); 8] = [
    (
        "utm_source",
        &["google", "facebook", "newsletter", "twitter", "bing"],
    ),
    ("utm_medium", &["cpc", "email", "social", "organic"]),
    (
        "utm_campaign",
        &["bf2026", "winter_sale", "retarget", "brand"],
    ),
    ("ref", &["home", "search", "email", "push"]),
    ("variant", &["a", "b", "control"]),
    ("lang", &["en", "de", "fr", "es", "pt", "ja"]),
    ("screen", &["1920x1080", "390x844", "1440x900", "412x915"]),
    ("exp", &["e101", "e102", "e117", "e230"]),
];

/// Users and products the ids are drawn from (Zipf over ranks).
const USERS: u64 = 1 << 24;
const PRODUCTS: u64 = 200_000;

/// Mixed into a user's rank before hashing it to a country, so the country does not follow
/// from the same bits as anything else derived from the rank ("country" in ASCII).
const COUNTRY_SALT: u64 = 0x0063_6f75_6e74_7279;

const HOUR_US: i64 = 3_600_000_000;
/// How far an event's timestamp strays from perfect arrival order, either way.
const JITTER_US: i64 = 2_000_000;

/// Produces the events of one hour as Arrow record batches.
pub struct EventGen {
    rng: Rng,
    session_salt: u64,
    hour_start_us: i64,
    rows_total: u64,
    next_row: u64,
    events: Weights,
    countries: Weights,
    tag_count: Weights,
    prop_count: Weights,
    page_kind: Weights,
    text: String,
}

impl EventGen {
    /// A generator of `rows_total` events of the hour starting at `hour_start_secs` (Unix
    /// seconds, UTC), fully determined by `seed`.
    pub fn new(seed: u64, hour_start_secs: i64, rows_total: u64) -> EventGen {
        let weights = |w: &[u64]| Weights::new(w);
        EventGen {
            rng: Rng::new(seed),
            session_salt: mix64(seed ^ hour_start_secs as u64),
            hour_start_us: hour_start_secs * 1_000_000,
            rows_total,
            next_row: 0,
            events: weights(&EVENTS.map(|e| e.1)),
            countries: weights(&COUNTRIES.map(|c| c.1)),
            tag_count: weights(&[55, 25, 12, 6, 2]),
            prop_count: weights(&[62, 25, 10, 3]),
            // "/", product, category, search, blog: the pages that views and clicks land on.
            page_kind: weights(&[10, 45, 20, 10, 15]),
            text: String::with_capacity(64),
        }
    }

    /// Rows not yet produced.
    pub fn remaining(&self) -> u64 {
        self.rows_total - self.next_row
    }

    /// The next `min(n, remaining)` rows.
    pub fn next_batch(&mut self, n: usize) -> RecordBatch {
        let n = n.min(usize::try_from(self.remaining()).unwrap_or(usize::MAX));
        let mut b = Builders::new(n);
        for _ in 0..n {
            self.row(&mut b);
            self.next_row += 1;
        }
        b.finish()
    }

    fn row(&mut self, b: &mut Builders) {
        let rng = &mut self.rng;
        // Events are logged roughly in arrival order: spread evenly over the hour, each moved by
        // a couple of seconds of jitter, kept inside the hour, in whole milliseconds (the
        // column is DateTime64(3): no value changes on the way in).
        let even = (i128::from(self.next_row) * i128::from(HOUR_US)
            / i128::from(self.rows_total.max(1))) as i64;
        let jitter = rng.below(2 * JITTER_US as u64) as i64 - JITTER_US;
        let offset = (even + jitter).clamp(0, HOUR_US - 1) / 1000 * 1000;
        b.ts.append_value(self.hour_start_us + offset);

        let rank = rng.zipf(USERS);
        // An odd multiplier permutes 0..2^24, so popular users get scattered, plausible ids.
        b.user_id
            .append_value(1_000_000 + (rank.wrapping_mul(0x9e37_79b1) & (USERS - 1)));

        let event = rng.weighted(&self.events);
        let name = EVENTS[event].0;
        b.event.append_value(name);

        self.text.clear();
        write_url(&mut self.text, name, rng, &self.page_kind);
        b.url.append_value(&self.text);

        let country = COUNTRIES[self.countries.pick(mix64(rank ^ COUNTRY_SALT))].0;
        b.country
            .append_value(country)
            .expect("country codes are 2 bytes");

        // Money only on purchases (always) and carts (half the time); prices are log-uniform
        // between 2 and 1000 in whole cents, scaled to Decimal(18, 4).
        let priced = match name {
            "purchase" => true,
            "add_to_cart" => rng.chance(0.5),
            _ => false,
        };
        if priced {
            let cents = (rng.unit() * (1000f64 / 2.0).ln()).exp() * 200.0;
            b.revenue.append_value(cents as i128 * 100);
        } else {
            b.revenue.append_null();
        }

        let mut seen = 0u32;
        for _ in 0..rng.weighted(&self.tag_count) {
            let tag = distinct(rng, TAGS.len(), &mut seen);
            b.tags.values().append_value(TAGS[tag]);
        }
        b.tags.append(true);

        let mut seen = 0u32;
        for _ in 0..rng.weighted(&self.prop_count) {
            let (key, values) = PROPS[distinct(rng, PROPS.len(), &mut seen)];
            b.props.keys().append_value(key);
            b.props
                .values()
                .append_value(values[rng.below(values.len() as u64) as usize]);
        }
        b.props
            .append(true)
            .expect("keys and values are appended in pairs");

        // Server-side events (errors) and clients that refused the cookie carry no session; a
        // user keeps one session for the hour.
        if name == "error" || rng.chance(0.12) {
            b.session_id.append_null();
        } else {
            self.text.clear();
            write!(self.text, "{:016x}", mix64(rank ^ self.session_salt)).expect("write to String");
            b.session_id.append_value(&self.text);
        }

        // Durations exist for events that measure time on a page; log-uniform 50 ms .. 2 min.
        if matches!(name, "page_view" | "scroll" | "view_item") {
            let ms = (rng.unit() * (120_000f64 / 50.0).ln()).exp() * 50.0;
            b.duration_ms.append_value(ms as u32);
        } else {
            b.duration_ms.append_null();
        }
    }
}

/// An index in `0..n` not yet in `seen` (a bit set), which it is then added to; `n <= 32` and
/// fewer than `n` indices are ever taken, so the retry loop ends quickly.
fn distinct(rng: &mut Rng, n: usize, seen: &mut u32) -> usize {
    loop {
        let i = rng.below(n as u64) as usize;
        if *seen & (1 << i) == 0 {
            *seen |= 1 << i;
            return i;
        }
    }
}

fn write_url(out: &mut String, event: &str, rng: &mut Rng, page_kind: &Weights) {
    let product = |rng: &mut Rng| rng.zipf(PRODUCTS);
    let word = |rng: &mut Rng| WORDS[rng.below(WORDS.len() as u64) as usize];
    let result = match event {
        "search" => write!(out, "/search?q={}&page={}", word(rng), 1 + rng.below(5)),
        "view_item" | "add_to_cart" => write!(out, "/product/{}", product(rng)),
        "purchase" => write!(out, "/checkout/{}/done", 10_000_000 + rng.below(90_000_000)),
        "share" => write!(out, "/product/{}/share", product(rng)),
        "error" => write!(out, "/api/v2/items/{}", product(rng)),
        "login" | "logout" | "signup" => write!(out, "/account/{event}"),
        _ => match rng.weighted(page_kind) {
            0 => write!(out, "/"),
            1 => write!(out, "/product/{}", product(rng)),
            2 => write!(
                out,
                "/c/{}?page={}",
                CATEGORIES[rng.below(CATEGORIES.len() as u64) as usize],
                1 + rng.below(3)
            ),
            3 => write!(out, "/search?q={}", word(rng)),
            _ => write!(out, "/blog/{}-{}", word(rng), word(rng)),
        },
    };
    result.expect("write to String");
}

struct Builders {
    ts: TimestampMicrosecondBuilder,
    user_id: UInt64Builder,
    event: StringBuilder,
    url: StringBuilder,
    country: FixedSizeBinaryBuilder,
    revenue: Decimal128Builder,
    tags: ListBuilder<StringBuilder>,
    props: MapBuilder<StringBuilder, StringBuilder>,
    session_id: StringBuilder,
    duration_ms: UInt32Builder,
}

impl Builders {
    /// Builders sized for `n` rows, so a batch is built without reallocating.
    fn new(n: usize) -> Builders {
        Builders {
            ts: TimestampMicrosecondBuilder::with_capacity(n).with_timezone("UTC"),
            user_id: UInt64Builder::with_capacity(n),
            event: StringBuilder::with_capacity(n, n * 10),
            url: StringBuilder::with_capacity(n, n * 20),
            country: FixedSizeBinaryBuilder::with_capacity(n, 2),
            revenue: Decimal128Builder::with_capacity(n)
                .with_precision_and_scale(18, 4)
                .expect("Decimal(18, 4) is valid"),
            tags: ListBuilder::with_capacity(StringBuilder::with_capacity(n, n * 8), n)
                .with_field(tag_field()),
            props: MapBuilder::with_capacity(
                None,
                StringBuilder::with_capacity(n, n * 6),
                StringBuilder::with_capacity(n, n * 4),
                n,
            )
            .with_keys_field(props_key_field())
            .with_values_field(props_value_field()),
            session_id: StringBuilder::with_capacity(n, n * 16),
            duration_ms: UInt32Builder::with_capacity(n),
        }
    }

    fn finish(mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.user_id.finish()),
            Arc::new(self.event.finish()),
            Arc::new(self.url.finish()),
            Arc::new(self.country.finish()),
            Arc::new(self.revenue.finish()),
            Arc::new(self.tags.finish()),
            Arc::new(self.props.finish()),
            Arc::new(self.session_id.finish()),
            Arc::new(self.duration_ms.finish()),
        ];
        RecordBatch::try_new(schema(), columns).expect("the builders match schema()")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{TimestampMicrosecondType, UInt64Type};
    use arrow_array::Array;

    #[test]
    fn ddl_is_the_documented_statement() {
        assert_eq!(
            ddl("db.events"),
            "CREATE TABLE db.events (ts DateTime64(3, 'UTC'), user_id UInt64, event LowCardinality(String), \
             url String, country FixedString(2), revenue Nullable(Decimal(18, 4)), tags Array(String), \
             props Map(String, String), session_id Nullable(String), duration_ms Nullable(UInt32)) \
             ENGINE = MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY (event, user_id, ts)"
        );
    }

    #[test]
    fn table_names_are_checked() {
        for ok in ["db.events", "events", "_x.t_1"] {
            assert!(valid_table_name(ok), "{ok}");
        }
        for bad in ["", "db.", ".t", "1db.t", "db.t.x", "db.`t`", "db;drop"] {
            assert!(!valid_table_name(bad), "{bad}");
        }
    }

    #[test]
    fn batches_do_not_depend_on_how_rows_are_split() {
        let hour = 1_796_029_200; // 2026-11-30T09:00:00Z
        let whole = EventGen::new(5, hour, 1000).next_batch(1000);
        let mut split = EventGen::new(5, hour, 1000);
        let parts: Vec<RecordBatch> = [300, 1, 699, 10]
            .iter()
            .map(|&n| split.next_batch(n))
            .collect();
        assert_eq!(
            parts.iter().map(RecordBatch::num_rows).collect::<Vec<_>>(),
            [300, 1, 699, 0]
        );
        let joined = arrow_select_concat(&parts);
        assert_eq!(whole, joined);
        assert_ne!(
            whole,
            EventGen::new(6, hour, 1000).next_batch(1000),
            "the seed matters"
        );
    }

    #[test]
    fn values_stay_in_their_domains() {
        let hour = 1_796_029_200;
        let batch = EventGen::new(1, hour, 20_000).next_batch(20_000);
        assert_eq!(batch.schema(), schema());
        let ts = batch.column(0).as_primitive::<TimestampMicrosecondType>();
        assert!(ts
            .values()
            .iter()
            .all(|&t| (hour * 1_000_000..(hour + 3600) * 1_000_000).contains(&t) && t % 1000 == 0));
        let users = batch.column(1).as_primitive::<UInt64Type>();
        assert!(users
            .values()
            .iter()
            .all(|&u| (1_000_000..1_000_000 + USERS).contains(&u)));
        // Zipf: the busiest user (rank 1) makes about ln 2 / ln 2^24 = 4% of the events.
        let mut per_user = std::collections::HashMap::new();
        for &u in users.values().iter() {
            *per_user.entry(u).or_insert(0u32) += 1;
        }
        let busiest = per_user.values().max().copied().unwrap_or(0);
        assert!(
            (400..1300).contains(&busiest),
            "busiest user has {busiest} of 20000 events"
        );
        let revenue = batch.column(5);
        let priced = revenue.len() - revenue.null_count();
        assert!(
            (100..1000).contains(&priced),
            "{priced} priced rows of 20000"
        );
        let events = batch.column(2).as_string::<i32>();
        let distinct: std::collections::BTreeSet<&str> = events.iter().flatten().collect();
        assert_eq!(distinct.len(), EVENTS.len());
    }

    /// Concatenates batches with the generator's own schema (arrow-select is not a dependency
    /// for one test helper: the arrays are rebuilt through ArrayData).
    fn arrow_select_concat(batches: &[RecordBatch]) -> RecordBatch {
        let columns = (0..batches[0].num_columns())
            .map(|c| {
                let datas: Vec<arrow_data::ArrayData> =
                    batches.iter().map(|b| b.column(c).to_data()).collect();
                let refs: Vec<&arrow_data::ArrayData> = datas.iter().collect();
                let mut mutable = arrow_data::transform::MutableArrayData::new(refs, false, 0);
                for (i, d) in datas.iter().enumerate() {
                    mutable.try_extend(i, 0, d.len()).unwrap();
                }
                arrow_array::make_array(mutable.freeze())
            })
            .collect();
        RecordBatch::try_new(schema(), columns).unwrap()
    }
}
