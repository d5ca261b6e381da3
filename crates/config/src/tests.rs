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
            "unknown field `databse`",
        ),
        (
            "missing section",
            MINIMAL_LOCAL.replace(
                "[staging]\nroot = \"/var/lib/clickhouse/chpart-staging/\"",
                "",
            ),
            vec![],
            "missing field `staging`",
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
