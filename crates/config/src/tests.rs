use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const MINIMAL_LOCAL: &str = r#"
[clickhouse]
url = "http://127.0.0.1:8123"
[transport]
kind = "local"
[clickhouse_local]
command = "clickhouse-local"
[staging]
root = "/var/lib/clickhouse/chpart-staging/"
"#;

fn load(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_toml(text, Path::new("test.toml"), env(vars))
}

#[test]
fn the_shipped_example_loads() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/chpart.example.toml"
    ))
    .unwrap();
    let password = dir.path().join("pw");
    std::fs::write(&password, "s3cret\n").unwrap();
    let text = example.replace(
        "/etc/chpart/clickhouse-password",
        password.to_str().unwrap(),
    );
    let config = load(&text, &[]).unwrap();
    assert_eq!(
        config.clickhouse.password.as_ref().map(Secret::expose),
        Some("s3cret")
    );
    assert_eq!(config.clickhouse.host_name, "ch-1.example.internal");
    let Transport::Sftp(ssh) = &config.transport else {
        panic!("example uses sftp")
    };
    assert_eq!((ssh.port, ssh.write_buffer_bytes), (22, 256 * 1024));
    assert_eq!(config.staging_root, "/var/lib/clickhouse/chpart-staging");
    assert!(
        !format!("{config:?}").contains("s3cret"),
        "Debug output shows the password"
    );
}

#[test]
fn defaults_apply_and_paths_are_normalised() {
    let config = load(MINIMAL_LOCAL, &[]).unwrap();
    assert_eq!(config.clickhouse.user, "default");
    assert_eq!(config.clickhouse.request_timeout, Duration::from_secs(300));
    assert_eq!(config.clickhouse.host_name, "127.0.0.1");
    assert!(config.clickhouse.password.is_none());
    assert_eq!(config.ledger_database, "chpart");
    assert_eq!(config.staging_root, "/var/lib/clickhouse/chpart-staging");
    assert!(matches!(config.transport, Transport::Local));
    assert!(!config.clickhouse_local.merge_split_partitions);
}

#[test]
fn environment_overrides_keys_of_every_section() {
    let config = load(
        MINIMAL_LOCAL,
        &[
            ("CHPART_CLICKHOUSE_URL", "http://ch-9:8123"),
            (
                "CHPART_CLICKHOUSE_LOCAL_COMMAND",
                "/opt/ch/clickhouse-local",
            ),
            ("CHPART_CLICKHOUSE_REQUEST_TIMEOUT_SECS", "7"),
            ("CHPART_LEDGER_DATABASE", "loads"),
            ("CHPART_CLICKHOUSE_PASSWORD", "from-env"),
            ("CHPART_CLICKHOUSE_LOCAL_MERGE_SPLIT_PARTITIONS", "true"),
            ("CHPART_CONFIG", "/ignored/reserved.toml"),
            ("UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(config.clickhouse.url, "http://ch-9:8123");
    assert_eq!(
        config.clickhouse_local.command,
        PathBuf::from("/opt/ch/clickhouse-local")
    );
    assert_eq!(config.clickhouse.request_timeout, Duration::from_secs(7));
    assert_eq!(config.ledger_database, "loads");
    assert!(config.clickhouse_local.merge_split_partitions);
    assert_eq!(
        config.clickhouse.password.as_ref().map(Secret::expose),
        Some("from-env")
    );
}

#[test]
fn rejections_name_the_key_or_variable() {
    let sftp_without_ssh = MINIMAL_LOCAL.replace("kind = \"local\"", "kind = \"sftp\"");
    /// (case, config text, environment, expected message part)
    type Row<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str);
    let rows: Vec<Row> = vec![
        (
            "unknown key",
            format!("{MINIMAL_LOCAL}\n[ledger]\ndatabse = \"x\"\n"),
            vec![],
            "config file test.toml: ledger.databse is not a chpart setting (the valid keys here are: database)",
        ),
        (
            "missing section",
            MINIMAL_LOCAL.replace(
                "[staging]\nroot = \"/var/lib/clickhouse/chpart-staging/\"",
                "",
            ),
            vec![],
            "no config gives staging.root (read: config file test.toml): give them in a config file (--config FILE, or the file named by CHPART_CONFIG), in a TOML document in the environment variable CHPART_CONFIG_TOML, or as CHPART_<SECTION>_<KEY> environment variables (CHPART_STAGING_ROOT)",
        ),
        (
            "typo in an override",
            MINIMAL_LOCAL.into(),
            vec![("CHPART_SSSH_HOST", "x")],
            "CHPART_SSSH_HOST is not a chpart setting",
        ),
        (
            "override of an unknown key",
            MINIMAL_LOCAL.into(),
            vec![("CHPART_SSH_HOSTNAME", "x")],
            "environment variable CHPART_SSH_HOSTNAME overrides ssh.hostname, which is not a chpart setting (the keys of [ssh] are: host, port, user,",
        ),
        (
            "override of an unknown key, config without that section",
            MINIMAL_LOCAL.into(),
            vec![("CHPART_LEDGER_DATABSE", "x")],
            "CHPART_LEDGER_DATABSE overrides ledger.databse, which is not a chpart setting (the keys of [ledger] are: database)",
        ),
        (
            "relative staging root",
            MINIMAL_LOCAL.replace("/var/lib/clickhouse/chpart-staging/", "staging"),
            vec![],
            "staging.root: \"staging\" must be an absolute path",
        ),
        (
            "dot-dot staging root",
            MINIMAL_LOCAL.replace("chpart-staging/", "../etc"),
            vec![],
            "staging.root",
        ),
        (
            "sftp without [ssh]",
            sftp_without_ssh,
            vec![],
            "needs an [ssh] section",
        ),
        (
            "url with credentials",
            MINIMAL_LOCAL.replace("http://127.0.0.1", "http://u:pw@127.0.0.1"),
            vec![],
            "must not carry credentials",
        ),
        (
            "not a url",
            MINIMAL_LOCAL.replace("http://127.0.0.1:8123", "127.0.0.1:8123"),
            vec![],
            "clickhouse.url",
        ),
        (
            "zero timeout",
            MINIMAL_LOCAL.into(),
            vec![("CHPART_CLICKHOUSE_REQUEST_TIMEOUT_SECS", "0")],
            "request_timeout_secs: must be at least 1",
        ),
        (
            "bad ledger database",
            MINIMAL_LOCAL.into(),
            vec![("CHPART_LEDGER_DATABASE", "a-b")],
            "ledger.database",
        ),
        (
            "named password variable unset",
            MINIMAL_LOCAL.replace("[transport]", "password_env = \"NOPE_PW\"\n[transport]"),
            vec![],
            "environment variable NOPE_PW",
        ),
        (
            "missing password file",
            MINIMAL_LOCAL.replace(
                "[transport]",
                "password_file = \"/nonexistent/pw\"\n[transport]",
            ),
            vec![],
            "/nonexistent/pw",
        ),
        ("not toml", "[clickhouse\nurl=".into(), vec![], "test.toml"),
    ];
    for (name, text, vars, want) in rows {
        let err = load(&text, &vars)
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(err.to_string().contains(want), "{name}: {err}");
    }
}

#[test]
fn ssh_section_validation() {
    let base = MINIMAL_LOCAL.replace("kind = \"local\"", "kind = \"sftp\"");
    let with_ssh = |ssh: &str| {
        format!("{base}\n[ssh]\nhost = \"h\"\nuser = \"clickhouse\"\nknown_hosts = \"/k\"\n{ssh}\n")
    };
    let config = load(&with_ssh("identity_file = \"/id\"\nport = 2222"), &[]).unwrap();
    let Transport::Sftp(ssh) = config.transport else {
        panic!()
    };
    assert_eq!(
        (ssh.host.as_str(), ssh.port, ssh.connect_timeout),
        ("h", 2222, Duration::from_secs(15))
    );
    let err = load(&with_ssh(""), &[]).unwrap_err();
    assert!(
        err.to_string().contains("set identity_file or use_agent"),
        "{err}"
    );
    let err = load(&with_ssh("use_agent = true\nwrite_buffer_kib = 1"), &[]).unwrap_err();
    assert!(err.to_string().contains("ssh.write_buffer_kib"), "{err}");
    for (line, key) in [
        ("upload_connections = 0", "ssh.upload_connections"),
        ("verify_connections = 0", "ssh.verify_connections"),
        ("verify_connections = 17", "ssh.verify_connections"),
    ] {
        let err = load(&with_ssh(&format!("use_agent = true\n{line}")), &[]).unwrap_err();
        assert!(err.to_string().contains(key), "{line}: {err}");
    }
}

/// Resolves from an optional file (written to a temp dir) and `vars` as the whole environment.
fn resolve(file: Option<&str>, vars: &[(&str, &str)]) -> Result<Resolved, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chpart.toml");
    if let Some(text) = file {
        std::fs::write(&path, text).unwrap();
    }
    Resolved::load(file.map(|_| path.as_path()), env(vars))
}

#[test]
fn sources_merge_file_then_toml_document_then_variables() {
    let document = "[clickhouse]\nurl = \"http://from-document:8123\"\nuser = \"doc\"\n[ledger]\ndatabase = \"doc_ledger\"\n";
    /// (case, file, environment, expected url, user, ledger database)
    type Row<'a> = (
        &'a str,
        Option<&'a str>,
        Vec<(&'a str, &'a str)>,
        &'a str,
        &'a str,
        &'a str,
    );
    let rows: Vec<Row> = vec![
        (
            "file alone",
            Some(MINIMAL_LOCAL),
            vec![],
            "http://127.0.0.1:8123",
            "default",
            "chpart",
        ),
        (
            "document over file, key by key",
            Some(MINIMAL_LOCAL),
            vec![("CHPART_CONFIG_TOML", document)],
            "http://from-document:8123",
            "doc",
            "doc_ledger",
        ),
        (
            "variable over document over file",
            Some(MINIMAL_LOCAL),
            vec![
                ("CHPART_CONFIG_TOML", document),
                ("CHPART_CLICKHOUSE_USER", "var"),
            ],
            "http://from-document:8123",
            "var",
            "doc_ledger",
        ),
        (
            "document alone, no file",
            None,
            vec![("CHPART_CONFIG_TOML", MINIMAL_LOCAL)],
            "http://127.0.0.1:8123",
            "default",
            "chpart",
        ),
        (
            "variables alone",
            None,
            vec![
                ("CHPART_CLICKHOUSE_URL", "http://vars:8123"),
                ("CHPART_TRANSPORT_KIND", "local"),
                ("CHPART_CLICKHOUSE_LOCAL_COMMAND", "clickhouse-local"),
                ("CHPART_STAGING_ROOT", "/s"),
            ],
            "http://vars:8123",
            "default",
            "chpart",
        ),
    ];
    for (name, file, vars, url, user, ledger) in rows {
        let resolved = resolve(file, &vars).unwrap_or_else(|e| panic!("{name}: {e}"));
        let c = &resolved.config;
        assert_eq!(
            (
                c.clickhouse.url.as_str(),
                c.clickhouse.user.as_str(),
                c.ledger_database.as_str()
            ),
            (url, user, ledger),
            "{name}"
        );
    }
}

#[test]
fn the_printed_document_round_trips_keeps_relative_paths_and_holds_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw.txt"), "s3cret-value\n").unwrap();
    let text = format!(
        "{}\n[ssh]\nhost = \"h\"\nuser = \"clickhouse\"\nidentity_file = \"id_ed25519\"\nknown_hosts = \"known_hosts\"\n",
        MINIMAL_LOCAL
            .replace("kind = \"local\"", "kind = \"sftp\"")
            .replace(
                "[transport]",
                &format!(
                    "password_file = \"{}\"\n[transport]",
                    dir.path().join("pw.txt").display()
                )
            )
            .replace("command = \"clickhouse-local\"", "command = \"ch/clickhouse local\"")
    );
    let first = resolve(Some(&text), &[]).unwrap();
    let toml = first.to_toml();
    assert!(!toml.contains("s3cret"), "{toml}");
    for kept in [
        "identity_file = \"id_ed25519\"",
        "known_hosts = \"known_hosts\"",
        "command = \"ch/clickhouse local\"",
        "user = \"default\"",
        "request_timeout_secs = 300",
    ] {
        assert!(toml.contains(kept), "{kept} not in\n{toml}");
    }
    // What the driver prints is what a task resolves alone, to the same config.
    let second = resolve(None, &[("CHPART_CONFIG_TOML", &toml)]).unwrap();
    assert_eq!(second.to_toml(), toml);
    let local = &second.config.clickhouse_local;
    assert_eq!(
        (local.command.as_path(), local.args.as_slice()),
        (Path::new("ch/clickhouse"), &["local".to_owned()][..])
    );
    assert_eq!(
        second
            .config
            .clickhouse
            .password
            .as_ref()
            .map(Secret::expose),
        Some("s3cret-value")
    );
}

#[test]
fn missing_keys_name_every_way_to_give_them() {
    let err = resolve(None, &[("CHPART_CLICKHOUSE_URL", "http://x:8123")]).unwrap_err();
    let message = err.to_string();
    for part in [
        "no config gives transport.kind, clickhouse_local.command, staging.root",
        "read: CHPART_<SECTION>_<KEY> environment variables",
        "--config FILE",
        "CHPART_CONFIG_TOML",
        "CHPART_TRANSPORT_KIND, CHPART_CLICKHOUSE_LOCAL_COMMAND, CHPART_STAGING_ROOT",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    let err = resolve(None, &[]).unwrap_err();
    assert!(err.to_string().contains("(none was given)"), "{err}");
}

#[test]
fn every_required_key_is_required_by_the_schema() {
    // REQUIRED is a copy of what the schema cannot default: each missing key alone is refused,
    // and nothing else is needed.
    let full: toml::Table = MINIMAL_LOCAL.parse().unwrap();
    for key in REQUIRED {
        let (section, name) = key.split_once('.').unwrap();
        let mut table = full.clone();
        table[section].as_table_mut().unwrap().remove(name);
        assert!(
            table.try_into::<RawConfig>().is_err(),
            "{key} has a default"
        );
    }
    let mut table = toml::Table::new();
    for key in REQUIRED {
        let (section, name) = key.split_once('.').unwrap();
        let value = full[section][name].clone();
        table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap()
            .insert(name.into(), value);
    }
    table.try_into::<RawConfig>().unwrap();
}

#[test]
fn secret_looking_keys_are_refused_with_where_secrets_go() {
    // (case, source text put in CHPART_CONFIG_TOML, expected key)
    let rows = [
        (
            "password",
            "[clickhouse]\npassword = \"x\"\n",
            "clickhouse.password",
        ),
        (
            "private key",
            "[ssh]\nprivate_key = \"x\"\n",
            "ssh.private_key",
        ),
        ("token section", "[token]\nx = 1\n", "token"),
        (
            "host password",
            "[[hosts]]\nname = \"h\"\npassword = \"x\"\n",
            "hosts.password",
        ),
    ];
    for (name, text, key) in rows {
        let err = resolve(Some(MINIMAL_LOCAL), &[("CHPART_CONFIG_TOML", text)]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "environment variable CHPART_CONFIG_TOML: {key} looks like a secret"
            )),
            "{name}: {message}"
        );
        for alternative in [
            "clickhouse.password_file",
            "--files",
            "clickhouse.password_env",
            "spark.executorEnv",
            "CHPART_CLICKHOUSE_PASSWORD",
        ] {
            assert!(
                message.contains(alternative),
                "{name}: {alternative}: {message}"
            );
        }
        assert!(!message.contains("\"x\""), "{name}: {message}");
    }
}

#[test]
fn secret_key_names_match_the_documented_pattern() {
    // (key, looks like a secret): the rows a reader of SECRET_KEY_PATTERN expects.
    let rows = [
        ("clickhouse.password", true),
        ("clickhouse.PASSWORD", true),
        ("clickhouse.password_file", false),
        ("clickhouse.password_env", false),
        ("s3.secret_access_key", true),
        ("s3.access_key", true),
        ("s3.accesskey", true),
        ("s3.access.key", true),
        ("ssh.private_key", true),
        ("ssh.privatekey", true),
        ("api.token", true),
        ("ssh.identity_file", false),
        ("ssh.known_hosts", false),
        ("clickhouse.user", false),
        ("clickhouse_local.command", false),
        ("staging.root", false),
    ];
    for (key, secret) in rows {
        assert_eq!(looks_like_secret(key), secret, "{key}");
    }
    // No key of the schema looks like one.
    for section in field_names::<RawConfig>() {
        for key in section_keys(section) {
            assert!(
                !looks_like_secret(&format!("{section}.{key}")),
                "{section}.{key}"
            );
        }
    }
}

#[test]
fn the_spark_integrations_carry_the_secret_pattern() {
    // One home per fact: the connector and chpart_spark refuse secret-looking conf keys with
    // copies of SECRET_KEY_PATTERN; they must be this one.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/spark/");
    for (file, quoted) in [
        (
            "connector/src/main/java/chpart/spark/ChpartConfig.java",
            format!("\"{}\"", SECRET_KEY_PATTERN),
        ),
        (
            "chpart_spark/_cli.py",
            format!("r\"{}\"", SECRET_KEY_PATTERN),
        ),
    ] {
        let text = std::fs::read_to_string(format!("{root}{file}")).unwrap();
        assert!(text.contains(&quoted), "{file} does not hold {quoted}");
    }
}

#[test]
fn a_command_with_arguments_is_split_into_program_and_arguments() {
    let config = load(
        MINIMAL_LOCAL,
        &[(
            "CHPART_CLICKHOUSE_LOCAL_COMMAND",
            "  ch/clickhouse   local ",
        )],
    )
    .unwrap();
    assert_eq!(
        config.clickhouse_local.command,
        PathBuf::from("ch/clickhouse")
    );
    assert_eq!(config.clickhouse_local.args, vec!["local".to_owned()]);
    let err = load(MINIMAL_LOCAL, &[("CHPART_CLICKHOUSE_LOCAL_COMMAND", " ")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("clickhouse_local.command: must not be empty"),
        "{err}"
    );
}
