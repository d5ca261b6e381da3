//! Least-privilege SSH (README, "Least-privilege SSH"): chpart needs nothing of the server's
//! SSH daemon but SFTP, so its key is installed with `restrict,command="internal-sftp"`; and
//! it can authenticate with the keys of a running ssh-agent instead of a key file. Both against
//! the real OpenSSH sshd, ssh and ssh-agent, through the `chpart` binary.

use std::path::Path;
use std::process::{Command, Output};

use chpart_testenv::clickhouse::shared;
use chpart_testenv::sshd::{SshAgent, Sshd};

use crate::build::{manifest_of, rows_select, write_rows, Setup};
use crate::cli::{chpart, text};

/// How `[ssh]` authenticates.
enum Auth<'a> {
    /// `identity_file = <key>`.
    KeyFile(&'a Path),
    /// `use_agent = true` and no identity file.
    Agent,
}

/// Switches `s`'s config to the SFTP transport through `sshd` as root.
fn over_sftp(s: &Setup, sshd: &Sshd, auth: Auth) {
    let mut config = std::fs::read_to_string(&s.config).unwrap();
    config = config.replace("kind = \"local\"", "kind = \"sftp\"");
    let credentials = match auth {
        Auth::KeyFile(key) => format!("identity_file = \"{}\"\n", key.display()),
        Auth::Agent => "use_agent = true\n".to_owned(),
    };
    config.push_str(&format!(
        "[ssh]\nhost = \"127.0.0.1\"\nport = {}\nuser = \"root\"\n{credentials}known_hosts = \"{}\"\nconnect_timeout_secs = 5\n",
        sshd.port,
        sshd.known_hosts.display()
    ));
    std::fs::write(&s.config, config).unwrap();
}

/// `chpart <args[0]> --config <s's config> <args[1..]>` with `SSH_AUTH_SOCK` set to `agent`
/// (or removed): what reaches the child is exactly what the test says.
fn run(s: &Setup, agent: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = chpart();
    cmd.arg(args[0])
        .arg("--config")
        .arg(&s.config)
        .args(&args[1..]);
    with_agent(&mut cmd, agent);
    cmd.output().unwrap()
}

fn with_agent(cmd: &mut Command, agent: Option<&Path>) {
    match agent {
        Some(socket) => cmd.env("SSH_AUTH_SOCK", socket),
        None => cmd.env_remove("SSH_AUTH_SOCK"),
    };
}

/// `begin`, two builds (one per Spark partition) over SFTP, `commit` and `gc` of `load`:
/// 30,000 rows exactly once in the target, nothing left in `detached/` or staging.
fn load_over_sftp(s: &Setup, agent: Option<&Path>, load: &str) {
    let begun = run(s, agent, &["begin", "--table", &s.table, "--load", load]);
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let mut lines = Vec::new();
    for (partition, (from, n)) in [(0u64, 10_000u64), (10_000, 20_000)].iter().enumerate() {
        let input = write_rows(
            s.dir.path(),
            &format!("{load}-{partition}.parquet"),
            &rows_select(*from, *n),
            "Parquet",
        );
        let mut cmd = s.build_cmd(load, &format!("app-{load}.{partition}"), partition as u32);
        cmd.arg("--input").arg(&input);
        with_agent(&mut cmd, agent);
        let built = cmd.output().unwrap();
        let manifest = manifest_of(built).unwrap_or_else(|o| panic!("build: {}", text(&o)));
        assert_eq!(manifest.total_rows(), *n);
        lines.push(manifest.to_json_line());
    }
    let winners = s.dir.path().join(format!("{load}.winners.jsonl"));
    std::fs::write(&winners, lines.join("\n") + "\n").unwrap();
    let committed = run(
        s,
        agent,
        &[
            "commit",
            "--load",
            load,
            "--winners",
            winners.to_str().unwrap(),
            "--partitions",
            "2",
        ],
    );
    assert_eq!(committed.status.code(), Some(0), "{}", text(&committed));
    assert_eq!(
        s.db.server
            .q(&format!("SELECT count(), uniqExact(id) FROM {}", s.table))
            .trim(),
        "30000\t30000"
    );
    let gc = run(s, agent, &["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert!(s.detached("events").is_empty());
    let staging = s.db.server.data_dir.join("chpart-staging").join(load);
    assert!(!staging.exists(), "{} is left", staging.display());
}

/// The deploy guide's `authorized_keys` line: a full load works through it (every step of
/// chpart's SFTP use: claims, uploads, renames into `detached/`, manifest, the commit's
/// verification and gc's removals), and the same key cannot run a shell or a command.
#[test]
fn a_load_goes_through_an_sftp_only_key_that_cannot_run_a_shell() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    let s = Setup::new(ch, "ssh_sftp_only");
    let marker = s.dir.path().join("touched-over-ssh");
    let touch = format!("touch {}", marker.display());

    // Control: with the plain line sshd.sh installs, this very ssh invocation runs commands,
    // so what follows fails because of the restriction, not because ssh did not get in.
    let plain = sshd.ssh("root", "echo pwned");
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("pwned"),
        "the unrestricted key runs commands: {plain:?}\nsshd log:\n{}",
        sshd.log()
    );

    let line = sshd.restrict_to_sftp();
    let restricted_from = std::fs::read_to_string(sshd.dir.join("sshd.log"))
        .unwrap()
        .len();
    assert!(
        line.starts_with("restrict,command=\"internal-sftp\" ssh-ed25519 AAAA"),
        "{line}"
    );
    for command in ["echo pwned", touch.as_str(), "/bin/sh -c 'echo pwned'"] {
        let out = sshd.ssh("root", command);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !said.contains("pwned"),
            "{command:?} ran through the SFTP-only key: {said}"
        );
        assert!(
            said.contains("This service allows sftp connections only."),
            "{command:?}: sshd did not refuse it as a non-SFTP session: {said}\nsshd log:\n{}",
            sshd.log()
        );
    }
    assert!(
        !marker.exists(),
        "the SFTP-only key created {}",
        marker.display()
    );
    // A login without a command asks for a shell: refused the same way; with a terminal
    // forced (-tt), `restrict` refuses the terminal too.
    for tty in ["-T", "-tt"] {
        let shell = Command::new("ssh")
            .arg("-i")
            .arg(&sshd.client_key)
            .args(["-p", &sshd.port.to_string(), tty])
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", sshd.known_hosts.display()))
            .args(["-o", "BatchMode=yes", "-o", "IdentityAgent=none"])
            .arg("root@127.0.0.1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let said = text(&shell);
        let refused = match tty {
            "-T" => said.contains("This service allows sftp connections only."),
            _ => said.contains("PTY allocation request failed"),
        };
        assert!(
            !shell.status.success() && refused,
            "a login ({tty}) was not refused: {shell:?}"
        );
    }
    over_sftp(&s, &sshd, Auth::KeyFile(&sshd.client_key));
    load_over_sftp(&s, None, "sftp-only-1");
    // Every login chpart made ran under the restricted line.
    let log = std::fs::read_to_string(sshd.dir.join("sshd.log")).unwrap();
    let log = &log[restricted_from..];
    let logins = log.matches("Accepted publickey for root").count();
    let forced = log
        .matches("forced-command (key-option) 'internal-sftp'")
        .count();
    assert!(
        logins > 5 && forced >= logins,
        "{logins} logins, {forced} under the forced command:\n{}",
        sshd.log()
    );
}

/// `use_agent = true` without an identity file: the key comes from a real ssh-agent through
/// `SSH_AUTH_SOCK`. An agent without the key is refused (so the agent is what authenticates),
/// one holding it loads exactly once, through the SFTP-only line.
#[test]
fn ssh_agent_authentication_loads_over_sftp() {
    let ch = shared();
    let sshd = Sshd::start(&[]);
    sshd.restrict_to_sftp();
    let s = Setup::new(ch, "ssh_agent");
    over_sftp(&s, &sshd, Auth::Agent);
    let config = std::fs::read_to_string(&s.config).unwrap();
    assert!(!config.contains("identity_file"), "{config}");

    let empty = SshAgent::start();
    assert!(empty.keys().is_empty());
    let begun = run(
        &s,
        Some(&empty.socket),
        &["begin", "--table", &s.table, "--load", "agent-0"],
    );
    assert_eq!(begun.status.code(), Some(0), "{}", text(&begun));
    let input = write_rows(
        s.dir.path(),
        "refused.parquet",
        &rows_select(0, 100),
        "Parquet",
    );
    let mut cmd = s.build_cmd("agent-0", "app-agent-0.0", 0);
    cmd.arg("--input").arg(&input);
    with_agent(&mut cmd, Some(&empty.socket));
    let refused = cmd.output().unwrap();
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));
    assert!(
        text(&refused).contains("ssh-agent"),
        "the refusal names the agent: {}",
        text(&refused)
    );

    let agent = SshAgent::start();
    agent.add(&sshd.client_key);
    assert_eq!(agent.keys().len(), 1);
    let aborted = run(&s, Some(&agent.socket), &["abort", "--load", "agent-0"]);
    assert_eq!(aborted.status.code(), Some(0), "{}", text(&aborted));
    load_over_sftp(&s, Some(&agent.socket), "agent-1");
}
