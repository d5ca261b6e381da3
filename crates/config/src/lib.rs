//! chpart's configuration: a TOML file, a TOML document in `CHPART_CONFIG_TOML`,
//! `CHPART_<SECTION>_<KEY>` environment overrides (in that order of precedence, see
//! [`Resolved::load`]), and validation into a typed [`Config`] before any client is built.
//!
//! Every command (`begin`, `build`, `commit`, ...) reads the same config, so the executors and the
//! driver agree on where ClickHouse is, how to reach its filesystem and where the ledger lives.
//! On Spark the driver resolves it once (`chpart config`) and hands the document to the tasks
//! in `CHPART_CONFIG_TOML`, so executors need no file. Every source is parsed strictly (unknown keys are errors, so a typo never silently falls back to
//! a default); secrets are read from a file or an environment variable named in the config,
//! never from the command line, and never appear in `Debug` output or errors. The annotated
//! example is `deploy/chpart.example.toml`; a test keeps it loadable.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable read for the ClickHouse password when the config names no source.
pub const DEFAULT_PASSWORD_ENV: &str = "CHPART_CLICKHOUSE_PASSWORD";

/// The environment variable naming the config file (as `--config` does).
pub const CONFIG_FILE_ENV: &str = "CHPART_CONFIG";

/// The environment variable holding a whole config document (TOML), merged over the file. The
/// Spark integrations resolve the config once on the driver (`chpart config`) and hand the
/// result to every task in it, so executors need no config file.
pub const CONFIG_TOML_ENV: &str = "CHPART_CONFIG_TOML";

/// The keys without a default: some source must give each.
pub const REQUIRED: &[&str] = &[
    "clickhouse.url",
    "transport.kind",
    "clickhouse_local.command",
    "staging.root",
];

/// Names of keys that would hold a secret, as a regular expression (Java and Python syntax).
/// No config key holds one (a password is read from `clickhouse.password_file`, from the
/// variable `clickhouse.password_env` names, or from `CHPART_CLICKHOUSE_PASSWORD`), and the
/// Spark integrations refuse conf keys and options that match it: Spark shows both in its UI
/// and event log. The connector and `chpart_spark` carry copies; a test checks they are this.
pub const SECRET_KEY_PATTERN: &str =
    "(?i)secret|password(?!_file|_env)|token|access.?key|private.?key";

/// Where a secret goes instead of a config value, for error messages.
pub const SECRET_ALTERNATIVES: &str = "a password file (clickhouse.password_file = pw.txt; ship it to Spark executors with --files: a relative path resolves in the working directory of the process that reads it), an environment variable named by clickhouse.password_env (on Spark executors: spark.executorEnv.<NAME>), or CHPART_CLICKHOUSE_PASSWORD; SSH keys and known_hosts are files too (ssh.identity_file, ssh.known_hosts)";

/// Environment variables with the `CHPART_` prefix that are not config overrides.
const RESERVED_ENV: &[&str] = &[
    CONFIG_FILE_ENV,
    CONFIG_TOML_ENV,
    "CHPART_BIN",
    "CHPART_LOG",
    "CHPART_TEST_CRASH_AT",
    "CHPART_TEST_PAUSE_AT",
    "CHPART_TEST_PAUSE_DIR",
    "CHPART_TEST_CLOCK_SKEW_SECS",
    DEFAULT_PASSWORD_ENV,
];

/// A configuration problem; the message names the file, key or environment variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A source is not valid TOML, or the merged config does not match the schema.
    #[error("{origin}: {message}")]
    Parse {
        /// The source, e.g. `config file /etc/chpart.toml`.
        origin: String,
        /// The parser's message (line, column, key).
        message: String,
    },
    /// A source names a section or key that the schema does not have.
    #[error("{origin}: {key} is not a chpart setting (the valid keys here are: {valid})")]
    UnknownKey {
        /// The source.
        origin: String,
        /// The key, dotted (`clickhouse.urll`).
        key: String,
        /// The keys valid in its place.
        valid: String,
    },
    /// A source names a key that looks like a secret.
    #[error("{origin}: {key} looks like a secret, and chpart takes no secret as a config value (configs are printed, handed to tasks and shown by Spark); use {SECRET_ALTERNATIVES}")]
    SecretKey {
        /// The source.
        origin: String,
        /// The key, dotted.
        key: String,
    },
    /// No source gives some required keys.
    #[error("no config gives {keys} ({sources}): give them in a config file (--config FILE, or the file named by CHPART_CONFIG), in a TOML document in the environment variable CHPART_CONFIG_TOML, or as CHPART_<SECTION>_<KEY> environment variables ({example})")]
    Missing {
        /// The missing keys, dotted, comma-separated.
        keys: String,
        /// Their environment variables.
        example: String,
        /// Which sources were read.
        sources: String,
    },
    /// A `CHPART_*` variable that names no config key.
    #[error("environment variable {var} is not a chpart setting (overrides are CHPART_<SECTION>_<KEY>, sections: {sections})")]
    UnknownOverride {
        /// The variable.
        var: String,
        /// The known sections.
        sections: String,
    },
    /// A `CHPART_<SECTION>_<KEY>` variable whose section exists but has no such key.
    #[error("environment variable {var} overrides {section}.{key}, which is not a chpart setting (the keys of [{section}] are: {keys})")]
    UnknownOverrideKey {
        /// The variable.
        var: String,
        /// The section it names.
        section: &'static str,
        /// The key it names (lowercase).
        key: String,
        /// The section's keys.
        keys: String,
    },
    /// A value that parses but cannot work.
    #[error("config {key}: {message}")]
    Invalid {
        /// The key, e.g. `ssh.port`.
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A secret could not be read from its source.
    #[error("config {key}: cannot read the secret from {source_name}: {message}")]
    Secret {
        /// The key, e.g. `clickhouse.password_file`.
        key: String,
        /// The file or variable it names (never its content).
        source_name: String,
        /// Why.
        message: String,
    },
}

/// A secret value; `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for handing to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

mod schema;
pub use schema::{
    RawClickHouse, RawClickHouseLocal, RawConfig, RawHost, RawLedger, RawRetry, RawSsh, RawStaging,
    RawTransport, TransportKind,
};

// ---------------------------------------------------------------------------------------------
// The validated value.
// ---------------------------------------------------------------------------------------------

/// A validated configuration. Holding one means every value was checked.
#[derive(Debug, Clone)]
pub struct Config {
    /// ClickHouse endpoint and credentials.
    pub clickhouse: ClickHouseSettings,
    /// How parts reach the server's filesystem.
    pub transport: Transport,
    /// The clickhouse-local used to build parts.
    pub clickhouse_local: ClickHouseLocalSettings,
    /// Absolute POSIX path of the staging root on the server's filesystem, no trailing slash.
    pub staging_root: String,
    /// Staging roots by disk name for tables on several disks (same form as `staging_root`).
    pub staging_disk_roots: Vec<(String, String)>,
    /// Per-host settings, by host name (`[[hosts]]`).
    pub hosts: BTreeMap<String, HostSettings>,
    /// Database of the ledger table.
    pub ledger_database: String,
    /// How long a step that may be repeated is retried after transient faults.
    pub retry_deadline: Duration,
}

/// Validated `[[hosts]]` entry: what is set for one host (unset: the defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSettings {
    /// HTTP endpoint.
    pub url: Option<String>,
    /// SSH host.
    pub ssh_host: Option<String>,
    /// SSH port.
    pub ssh_port: Option<u16>,
    /// Private key file.
    pub identity_file: Option<PathBuf>,
    /// known_hosts file.
    pub known_hosts: Option<PathBuf>,
    /// Staging root (absolute, no trailing slash).
    pub staging_root: Option<String>,
}

/// Validated `[clickhouse]`.
#[derive(Debug, Clone)]
pub struct ClickHouseSettings {
    /// HTTP endpoint.
    pub url: String,
    /// User.
    pub user: String,
    /// Password, if any.
    pub password: Option<Secret>,
    /// Statement timeout.
    pub request_timeout: Duration,
    /// Name recorded in manifests.
    pub host_name: String,
}

/// Validated transport.
#[derive(Debug, Clone)]
pub enum Transport {
    /// The server's filesystem is this machine's.
    Local,
    /// SFTP to the server's host.
    Sftp(SshSettings),
}

/// Validated `[ssh]`.
#[derive(Debug, Clone)]
pub struct SshSettings {
    /// Host.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Login user.
    pub user: String,
    /// Private key file, if not the agent.
    pub identity_file: Option<PathBuf>,
    /// Use the SSH agent.
    pub use_agent: bool,
    /// known_hosts file.
    pub known_hosts: PathBuf,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// SFTP write size in bytes.
    pub write_buffer_bytes: usize,
    /// Parallel upload connections.
    pub upload_connections: usize,
    /// Parallel verification connections of `commit`.
    pub verify_connections: usize,
}

/// Validated `[clickhouse_local]`.
#[derive(Debug, Clone)]
pub struct ClickHouseLocalSettings {
    /// The program (the command's first word).
    pub command: PathBuf,
    /// Arguments before each run's own (the command's other words), e.g. `local` of
    /// `clickhouse local`.
    pub args: Vec<String>,
    /// Parent of per-attempt work directories.
    pub work_dir: PathBuf,
    /// Timeout of one run.
    pub timeout: Duration,
    /// Bound of one spooled chunk of an Arrow stream input, in bytes.
    pub spool_chunk_bytes: u64,
    /// Merge each partition a build wrote as several parts into one before shipping.
    pub merge_split_partitions: bool,
}

/// The config sections, for `CHPART_<SECTION>_<KEY>` overrides. Longest first so that
/// `CHPART_CLICKHOUSE_LOCAL_COMMAND` is `clickhouse_local.command`, not `clickhouse.local_command`.
const SECTIONS: &[&str] = &[
    "clickhouse_local",
    "clickhouse",
    "transport",
    "staging",
    "ledger",
    "retry",
    "ssh",
];

impl Config {
    /// The config from its sources (see [`Resolved::load`]), validated.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Resolved::load(file, env).map(|r| r.config)
    }

    /// The config from `text` as if it were the file `path` (only used in messages), with the
    /// overrides in `env`.
    pub fn from_toml(
        text: &str,
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let layer = Layer::parse(text, format!("config file {}", path.display()))?;
        resolve(vec![layer], &env).map(|r| r.config)
    }
}

/// A config resolved from its sources: the validated value, and the document it was built from
/// (every key with its default filled in), which is what `chpart config` prints and what the
/// Spark integrations hand to their tasks in [`CONFIG_TOML_ENV`]. The document holds no secret:
/// the schema has no key for one (only `password_file` and `password_env`, which name where the
/// password is), and relative paths in it stay relative, so that they resolve in the working
/// directory of whichever process reads the document.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The validated config.
    pub config: Config,
    /// The merged document.
    pub document: RawConfig,
    /// Where it came from, lowest precedence first, e.g. `config file /etc/chpart.toml`.
    pub sources: Vec<String>,
}

impl Resolved {
    /// Builds the config from, lowest precedence first:
    ///
    /// 1. the config file `file` (`--config`, or `CHPART_CONFIG`), if given;
    /// 2. the TOML document in the environment variable [`CONFIG_TOML_ENV`], if set: its keys
    ///    win over the file's (tables merge key by key; `[[hosts]]` is replaced whole);
    /// 3. `CHPART_<SECTION>_<KEY>` variables.
    ///
    /// Then validates it. Each source is checked on its own first, so an unknown key names the
    /// source it came from; a key that looks like a secret is refused with where a secret goes.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Resolved, ConfigError> {
        let env: BTreeMap<String, String> = env.into_iter().collect();
        let mut layers = Vec::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.into(),
                source,
            })?;
            layers.push(Layer::parse(
                &text,
                format!("config file {}", path.display()),
            )?);
        }
        if let Some(text) = env.get(CONFIG_TOML_ENV) {
            layers.push(Layer::parse(
                text,
                format!("environment variable {CONFIG_TOML_ENV}"),
            )?);
        }
        resolve(layers, &env)
    }

    /// The document as TOML (what [`CONFIG_TOML_ENV`] takes).
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.document).expect("a validated config serializes as TOML")
    }
}

/// One source of config keys, parsed.
struct Layer {
    origin: String,
    table: toml::Table,
}

impl Layer {
    fn parse(text: &str, origin: String) -> Result<Layer, ConfigError> {
        let table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                origin: origin.clone(),
                message: e.to_string(),
            })?;
        check_keys(&table, &origin)?;
        Ok(Layer { origin, table })
    }
}

fn resolve(layers: Vec<Layer>, env: &BTreeMap<String, String>) -> Result<Resolved, ConfigError> {
    let mut sources = Vec::new();
    let mut table = toml::Table::new();
    for layer in layers {
        merge(&mut table, layer.table);
        sources.push(layer.origin);
    }
    if apply_overrides(&mut table, env)? {
        sources.push("CHPART_<SECTION>_<KEY> environment variables".into());
    }
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|key| {
            let (section, key) = key.split_once('.').expect("section.key");
            !table
                .get(section)
                .and_then(toml::Value::as_table)
                .is_some_and(|t| t.contains_key(key))
        })
        .collect();
    if !missing.is_empty() {
        return Err(ConfigError::Missing {
            keys: missing.join(", "),
            example: missing
                .iter()
                .map(|k| format!("CHPART_{}", k.replace('.', "_").to_ascii_uppercase()))
                .collect::<Vec<_>>()
                .join(", "),
            sources: if sources.is_empty() {
                "none was given".into()
            } else {
                format!("read: {}", sources.join(", "))
            },
        });
    }
    let raw: RawConfig = table
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            origin: format!("the config from {}", sources.join(" + ")),
            message: e.to_string(),
        })?;
    let document = raw.clone();
    let config = raw.validate(env)?;
    Ok(Resolved {
        config,
        document,
        sources,
    })
}

/// Merges `over` into `base`: tables key by key, anything else (values, arrays) replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Refuses a source's unknown sections and keys, naming the source, the key and the valid
/// keys; a key that looks like a secret gets where secrets go instead.
fn check_keys(table: &toml::Table, origin: &str) -> Result<(), ConfigError> {
    let unknown = |key: String, valid: String| {
        if looks_like_secret(&key) {
            ConfigError::SecretKey {
                key,
                origin: origin.to_owned(),
            }
        } else {
            ConfigError::UnknownKey {
                key,
                origin: origin.to_owned(),
                valid,
            }
        }
    };
    let check = |prefix: &str, entries: &toml::Table, valid: &[&str]| {
        for key in entries.keys() {
            if !valid.contains(&key.as_str()) {
                return Err(unknown(format!("{prefix}.{key}"), valid.join(", ")));
            }
        }
        Ok(())
    };
    let sections = field_names::<RawConfig>();
    for (section, value) in table {
        if !sections.contains(&section.as_str()) {
            return Err(unknown(section.clone(), sections.join(", ")));
        }
        match (section.as_str(), value) {
            ("hosts", toml::Value::Array(hosts)) => {
                for host in hosts.iter().filter_map(toml::Value::as_table) {
                    check("hosts", host, field_names::<RawHost>())?;
                }
            }
            (section, toml::Value::Table(entries)) => {
                check(section, entries, section_keys(section))?;
            }
            // Wrong shapes are the schema's to report.
            _ => {}
        }
    }
    Ok(())
}

/// Whether a key's name says it holds a secret (a password, token, secret or private key), as
/// [`SECRET_KEY_PATTERN`] says: such a value must not be a config value.
pub fn looks_like_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let any_char_between = |a: &str, b: &str| {
        key.match_indices(a).any(|(i, _)| {
            let rest = &key[i + a.len()..];
            rest.starts_with(b)
                || rest
                    .char_indices()
                    .nth(1)
                    .is_some_and(|(j, _)| rest[j..].starts_with(b))
        })
    };
    key.contains("secret")
        || key.contains("token")
        || key.match_indices("password").any(|(i, _)| {
            let rest = &key[i + "password".len()..];
            !rest.starts_with("_file") && !rest.starts_with("_env")
        })
        || any_char_between("access", "key")
        || any_char_between("private", "key")
}

/// Applies the `CHPART_<SECTION>_<KEY>` variables of `env`; whether there was one.
fn apply_overrides(
    table: &mut toml::Table,
    env: &BTreeMap<String, String>,
) -> Result<bool, ConfigError> {
    let mut applied = false;
    for (var, value) in env {
        let Some(rest) = var.strip_prefix("CHPART_") else {
            continue;
        };
        if RESERVED_ENV.contains(&var.as_str()) {
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        let Some((section, key)) = SECTIONS
            .iter()
            .find_map(|s| {
                rest.strip_prefix(s)
                    .and_then(|k| k.strip_prefix('_'))
                    .map(|k| (*s, k))
            })
            .filter(|(_, k)| !k.is_empty())
        else {
            return Err(ConfigError::UnknownOverride {
                var: var.clone(),
                sections: SECTIONS.join(", "),
            });
        };
        let keys = section_keys(section);
        if !keys.contains(&key) {
            return Err(ConfigError::UnknownOverrideKey {
                var: var.clone(),
                section,
                key: key.to_owned(),
                keys: keys.join(", "),
            });
        }
        let entry = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(section_table) = entry else {
            return Err(ConfigError::Invalid {
                key: section.into(),
                message: "must be a table".into(),
            });
        };
        section_table.insert(key.to_owned(), override_value(value));
        applied = true;
    }
    Ok(applied)
}

/// The keys of a config section, as its struct's `Deserialize` lists them (so they cannot
/// drift from the schema).
fn section_keys(section: &str) -> &'static [&'static str] {
    match section {
        "clickhouse" => field_names::<RawClickHouse>(),
        "transport" => field_names::<RawTransport>(),
        "ssh" => field_names::<RawSsh>(),
        "clickhouse_local" => field_names::<RawClickHouseLocal>(),
        "staging" => field_names::<RawStaging>(),
        "ledger" => field_names::<RawLedger>(),
        "retry" => field_names::<RawRetry>(),
        _ => &[],
    }
}

/// The field names a derived `Deserialize` struct passes to `deserialize_struct`: a
/// deserializer that records them there and then refuses to deserialize anything.
fn field_names<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Deserializer, Visitor};

    struct Names<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Names<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only structs have field names"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("field names recorded"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut fields));
    fields
}

/// An override's value: an integer or boolean when it reads as one, else a string.
fn override_value(value: &str) -> toml::Value {
    if let Ok(n) = value.parse::<i64>() {
        toml::Value::Integer(n)
    } else if let Ok(b) = value.parse::<bool>() {
        toml::Value::Boolean(b)
    } else {
        toml::Value::String(value.to_owned())
    }
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

fn positive_secs(key: &str, secs: u64) -> Result<Duration, ConfigError> {
    if secs == 0 {
        return Err(invalid(key, "must be at least 1 second"));
    }
    Ok(Duration::from_secs(secs))
}

/// A ClickHouse identifier chpart creates objects under: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 chars.
fn check_ident(key: &str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && !value.starts_with(|c: char| c.is_ascii_digit())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(invalid(key, format!("{value:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 64 characters)")))
    }
}

/// An absolute POSIX path without `.`/`..` components; returned without a trailing slash.
fn check_remote_path(key: &str, value: &str) -> Result<String, ConfigError> {
    if !value.starts_with('/') {
        return Err(invalid(key, format!("{value:?} must be an absolute path")));
    }
    if value.split('/').any(|c| c == "." || c == "..") || value.contains('\0') {
        return Err(invalid(
            key,
            format!("{value:?} must not contain '.' or '..' components"),
        ));
    }
    let trimmed = value.trim_end_matches('/');
    if trimmed.is_empty() {
        return Err(invalid(key, "must not be the filesystem root"));
    }
    Ok(trimmed.to_owned())
}

/// The host part of an `http://host:port/...` URL.
fn url_host(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split('/').next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split(']').next().map(|h| &h[1..])
    } else {
        host.split(':').next()
    };
    host.filter(|h| !h.is_empty())
}

fn read_secret(
    file: Option<&Path>,
    env_name: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<Option<Secret>, ConfigError> {
    if let Some(file) = file {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError::Secret {
            key: "clickhouse.password_file".into(),
            source_name: file.display().to_string(),
            message: e.to_string(),
        })?;
        return Ok(Some(Secret(text.trim_end_matches(['\n', '\r']).to_owned())));
    }
    let name = env_name.unwrap_or(DEFAULT_PASSWORD_ENV);
    match env.get(name) {
        Some(value) => Ok(Some(Secret(value.clone()))),
        None if env_name.is_some() => Err(ConfigError::Secret {
            key: "clickhouse.password_env".into(),
            source_name: format!("environment variable {name}"),
            message: "it is not set".into(),
        }),
        None => Ok(None),
    }
}

impl RawConfig {
    fn validate(self, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let ch = self.clickhouse;
        let host = url_host(&ch.url)
            .ok_or_else(|| {
                invalid(
                    "clickhouse.url",
                    format!("{:?} is not an http:// or https:// URL with a host", ch.url),
                )
            })?
            .to_owned();
        if ch.url.contains('@') {
            return Err(invalid(
                "clickhouse.url",
                "must not carry credentials; use clickhouse.user and password_file/password_env",
            ));
        }
        if ch.password_file.is_some() && ch.password_env.is_some() {
            return Err(invalid(
                "clickhouse.password_file",
                "set either password_file or password_env, not both",
            ));
        }
        let password = read_secret(ch.password_file.as_deref(), ch.password_env.as_deref(), env)?;
        let clickhouse = ClickHouseSettings {
            url: ch.url.trim_end_matches('/').to_owned(),
            user: ch.user,
            password,
            request_timeout: positive_secs(
                "clickhouse.request_timeout_secs",
                ch.request_timeout_secs,
            )?,
            host_name: ch.host_name.unwrap_or(host),
        };

        let transport = match (self.transport.kind, self.ssh) {
            (TransportKind::Local, _) => Transport::Local,
            (TransportKind::Sftp, None) => {
                return Err(invalid(
                    "ssh",
                    "transport.kind = \"sftp\" needs an [ssh] section",
                ))
            }
            (TransportKind::Sftp, Some(ssh)) => {
                if ssh.identity_file.is_none() && !ssh.use_agent {
                    return Err(invalid(
                        "ssh.identity_file",
                        "set identity_file or use_agent = true",
                    ));
                }
                if ssh.host.is_empty() {
                    return Err(invalid("ssh.host", "must not be empty"));
                }
                if ssh.port == 0 {
                    return Err(invalid("ssh.port", "must be 1-65535"));
                }
                if !(32..=16 * 1024).contains(&ssh.write_buffer_kib) {
                    return Err(invalid(
                        "ssh.write_buffer_kib",
                        "must be between 32 and 16384",
                    ));
                }
                if !(1..=16).contains(&ssh.upload_connections) {
                    return Err(invalid(
                        "ssh.upload_connections",
                        "must be between 1 and 16",
                    ));
                }
                if !(1..=16).contains(&ssh.verify_connections) {
                    return Err(invalid(
                        "ssh.verify_connections",
                        "must be between 1 and 16",
                    ));
                }
                Transport::Sftp(SshSettings {
                    host: ssh.host,
                    port: ssh.port,
                    user: ssh.user,
                    identity_file: ssh.identity_file,
                    use_agent: ssh.use_agent,
                    known_hosts: ssh.known_hosts,
                    connect_timeout: positive_secs(
                        "ssh.connect_timeout_secs",
                        ssh.connect_timeout_secs,
                    )?,
                    write_buffer_bytes: ssh.write_buffer_kib * 1024,
                    upload_connections: ssh.upload_connections,
                    verify_connections: ssh.verify_connections,
                })
            }
        };

        let local = self.clickhouse_local;
        let mut words = local.command.split_whitespace().map(str::to_owned);
        let Some(program) = words.next() else {
            return Err(invalid("clickhouse_local.command", "must not be empty"));
        };
        let clickhouse_local = ClickHouseLocalSettings {
            command: PathBuf::from(program),
            args: words.collect(),
            work_dir: local.work_dir.unwrap_or_else(std::env::temp_dir),
            timeout: positive_secs("clickhouse_local.timeout_secs", local.timeout_secs)?,
            spool_chunk_bytes: match local.spool_chunk_mib {
                mib @ 1..=1_048_576 => mib << 20,
                _ => {
                    return Err(invalid(
                        "clickhouse_local.spool_chunk_mib",
                        "must be 1 to 1048576 (MiB)",
                    ))
                }
            },
            merge_split_partitions: local.merge_split_partitions,
        };

        check_ident("ledger.database", &self.ledger.database)?;
        let mut hosts = BTreeMap::new();
        for host in self.hosts {
            let key = |k: &str| format!("hosts.{}.{k}", host.name);
            if host.name.trim().is_empty() {
                return Err(invalid("hosts.name", "must not be empty"));
            }
            if let Some(url) = &host.url {
                if url_host(url).is_none() {
                    return Err(invalid(
                        &key("url"),
                        format!("{url:?} is not an http:// or https:// URL with a host"),
                    ));
                }
            }
            let staging_root = match &host.staging_root {
                Some(root) => Some(check_remote_path(&key("staging_root"), root)?),
                None => None,
            };
            let settings = HostSettings {
                url: host.url,
                ssh_host: host.ssh_host,
                ssh_port: host.ssh_port,
                identity_file: host.identity_file,
                known_hosts: host.known_hosts,
                staging_root,
            };
            if hosts.insert(host.name.clone(), settings).is_some() {
                return Err(invalid(&format!("hosts.{}", host.name), "is listed twice"));
            }
        }
        Ok(Config {
            clickhouse,
            transport,
            clickhouse_local,
            staging_root: check_remote_path("staging.root", &self.staging.root)?,
            staging_disk_roots: self
                .staging
                .disk_roots
                .iter()
                .map(|(disk, root)| {
                    let key = format!("staging.disk_roots.{disk}");
                    Ok((disk.clone(), check_remote_path(&key, root)?))
                })
                .collect::<Result<_, ConfigError>>()?,
            ledger_database: self.ledger.database,
            hosts,
            retry_deadline: Duration::from_secs(self.retry.deadline_secs),
        })
    }
}

#[cfg(test)]
mod tests;
