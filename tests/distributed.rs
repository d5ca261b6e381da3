//! Loads into a `Distributed` table over a cluster of real 26.9 servers (one per shard, each on a
//! loopback address of its own): every row lands on the shard ClickHouse's own INSERT would
//! send it to, exactly once, whatever happens to the driver, and nothing is left on any shard.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use chpart_testenv::cluster::Cluster;

use crate::build::{rows_select, write_rows, COLUMNS};
use crate::cli::{chpart, text};
use crate::disks::files_under;

/// The table columns' order-independent fingerprint: count and checksum.
pub(crate) fn fingerprint(table: &str) -> String {
    format!("SELECT count(), sum(cityHash64(ts, id, name, score)) FROM {table}")
}

/// Rows of Spark partition `p` (1000 each).
fn partition_rows(p: u32) -> String {
    rows_select(u64::from(p) * 1000, 1000)
}

/// A cluster with `db.local` on every shard, `db.events` (Distributed, sharded by `key`) on
/// shard 1, a twin pair (`db.twin_local`, `db.twin`) loaded by INSERT for comparison, and a
/// chpart config whose server is shard 1 (which also holds the ledger).
struct ClusterSetup {
    cluster: Cluster,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl ClusterSetup {
    fn new(name: &str, weights: &[u32], key: &str) -> ClusterSetup {
        ClusterSetup::with(Cluster::start(name, weights), key)
    }

    /// Like [`ClusterSetup::new`], with servers running as `clickhouse`, one sshd per node
    /// (its own address, port, host key and client key) and chpart reaching every shard's
    /// filesystem over SFTP as that user: `[ssh]` for the entry server, `[[hosts]]` for each.
    fn over_sftp(name: &str, weights: &[u32], key: &str) -> ClusterSetup {
        let s = ClusterSetup::with(
            Cluster::start_with_sshd(name, weights, Some("clickhouse")),
            key,
        );
        over_sftp_config(&s.cluster, &s.config);
        s
    }

    fn with(cluster: Cluster, key: &str) -> ClusterSetup {
        let name = cluster.name.clone();
        let engine = "ENGINE = MergeTree PARTITION BY toYYYYMM(ts) ORDER BY id";
        for node in &cluster.nodes {
            let ch = &node.server;
            ch.q("CREATE DATABASE db");
            ch.q(&format!("CREATE TABLE db.local ({COLUMNS}) {engine}"));
            ch.q(&format!("CREATE TABLE db.twin_local ({COLUMNS}) {engine}"));
            // Merges would change the parts a test counts; the rows are what is compared.
            ch.q("SYSTEM STOP MERGES db.local");
        }
        let entry = &cluster.nodes[0].server;
        entry.q(&format!(
            "CREATE TABLE db.events AS db.local ENGINE = Distributed({name}, db, local, {key})"
        ));
        entry.q(&format!(
            "CREATE TABLE db.twin AS db.twin_local ENGINE = Distributed({name}, db, twin_local, {key})"
        ));
        let dir = tempfile::tempdir().unwrap();
        let config = cluster_config(&cluster, dir.path(), 3, None);
        ClusterSetup {
            cluster,
            dir,
            config,
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        crate::cli::run_with(&self.config, args)
    }

    fn begin(&self, load: &str, extra: &[&str]) -> Output {
        let mut args = vec!["begin", "--table", "db.events", "--load", load];
        args.extend_from_slice(extra);
        self.run(&args)
    }

    /// Builds Spark partition `p` as `attempt`; the line it printed (its cluster manifest).
    fn build(&self, load: &str, attempt: &str, p: u32, input: &Path) -> Result<String, Output> {
        let out = chpart()
            .args(["build", "--config"])
            .arg(&self.config)
            .args(["--load", load, "--attempt", attempt, "--partition"])
            .arg(p.to_string())
            .arg("--input")
            .arg(input)
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(out);
        }
        let stdout = String::from_utf8(out.stdout).unwrap();
        Ok(stdout.lines().last().unwrap().to_owned())
    }

    /// Begins `load` and builds `partitions` Spark partitions, each by every one of `attempts`
    /// (all published); the printed lines per partition, in attempt order.
    fn build_load(
        &self,
        load: &str,
        begin: &[&str],
        partitions: u32,
        attempts: &[&str],
    ) -> Vec<Vec<String>> {
        let out = self.begin(load, begin);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        (0..partitions)
            .map(|p| {
                let input = write_rows(
                    self.dir.path(),
                    &format!("{load}-p{p}.parquet"),
                    &partition_rows(p),
                    "Parquet",
                );
                attempts
                    .iter()
                    .map(|a| {
                        let attempt = format!("{a}.{p}");
                        self.build(load, &attempt, p, &input)
                            .unwrap_or_else(|o| panic!("build {attempt}: {}", text(&o)))
                    })
                    .collect()
            })
            .collect()
    }

    fn winners(&self, name: &str, lines: &[&String]) -> PathBuf {
        let path = self.dir.path().join(name);
        let text: Vec<&str> = lines.iter().map(|l| l.as_str()).collect();
        std::fs::write(&path, text.join("\n") + "\n").unwrap();
        path
    }

    fn commit(
        &self,
        load: &str,
        winners: Option<&Path>,
        extra: &[&str],
        crash_at: Option<&str>,
    ) -> Output {
        let mut cmd = chpart();
        cmd.args(["commit", "--config"])
            .arg(&self.config)
            .args(["--load", load]);
        if let Some(w) = winners {
            cmd.arg("--winners").arg(w);
        }
        cmd.args(extra);
        if let Some(point) = crash_at {
            cmd.env("CHPART_TEST_CRASH_AT", point);
        }
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap()
    }

    /// Loads the twin through the Distributed engine itself, synchronously.
    fn insert_twin(&self, partitions: &[u32]) {
        let union: Vec<String> = partitions.iter().map(|p| partition_rows(*p)).collect();
        self.cluster.nodes[0].server.q(&format!(
            "INSERT INTO db.twin SELECT * FROM ({}) SETTINGS insert_distributed_sync = 1",
            union.join(" UNION ALL ")
        ));
    }

    /// Per shard: (the local table's fingerprint, the twin's).
    fn per_shard(&self) -> Vec<(String, String)> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                (
                    n.server.q(&fingerprint("db.local")),
                    n.server.q(&fingerprint("db.twin_local")),
                )
            })
            .collect()
    }

    /// `chpart gc`, then every shard's `db.local` emptied: the next load of a test goes into
    /// the same tables (and is compared with the same twin).
    fn gc_and_empty(&self) {
        let gc = self.run(&["gc"]);
        assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
        for node in &self.cluster.nodes {
            node.server.q("TRUNCATE TABLE db.local");
        }
    }

    /// Everything left in `db.local`'s detached/ on every shard, and every staged file.
    fn leftovers(&self) -> Vec<String> {
        leftovers(&self.cluster)
    }
}

/// Everything left in `db`'s detached/ on every shard of `cluster`, and every file staged
/// under a shard's `chpart-staging`.
pub(crate) fn leftovers(cluster: &Cluster) -> Vec<String> {
    let mut left = Vec::new();
    for node in &cluster.nodes {
        let detached = node
            .server
            .q("SELECT name FROM system.detached_parts WHERE database = 'db' ORDER BY name");
        left.extend(
            detached
                .lines()
                .map(|l| format!("shard {}: detached {l}", node.shard_num)),
        );
        let staging = node.data_dir().join("chpart-staging");
        left.extend(
            files_under(&staging)
                .into_iter()
                .map(|path| format!("shard {}: staged {path}", node.shard_num)),
        );
    }
    left
}

/// A chpart config for `cluster` in `dir` (`chpart.toml`; builds work in `dir/work`): shard 1
/// is the server and holds the ledger, every host stages next to its own data (on a real
/// cluster: its own filesystem), transport local, retries for `deadline_secs`. With `urls`, each
/// shard is reached at its entry there (e.g. a fault proxy's) instead of its own port.
pub(crate) fn cluster_config(
    cluster: &Cluster,
    dir: &Path,
    deadline_secs: u64,
    urls: Option<&[String]>,
) -> PathBuf {
    let entry = &cluster.nodes[0].server;
    let url_of = |i: usize| urls.map(|u| u[i].clone());
    let mut text = format!(
        "[clickhouse]\nurl = \"{url}\"\nrequest_timeout_secs = 60\n\
         [transport]\nkind = \"local\"\n\
         [clickhouse_local]\ncommand = \"{local}\"\nwork_dir = \"{work}\"\n\
         [staging]\nroot = \"{staging}\"\n\
         [ledger]\ndatabase = \"chpart_ledger\"\n\
         [retry]\ndeadline_secs = {deadline_secs}\n",
        url = url_of(0).unwrap_or_else(|| entry.url()),
        local = chpart_testenv::clickhouse_local().display(),
        work = dir.join("work").display(),
        staging = entry.data_dir.join("chpart-staging").display(),
    );
    for (i, node) in cluster.nodes.iter().enumerate() {
        text.push_str(&format!("[[hosts]]\nname = \"{}\"\n", node.address));
        if let Some(url) = url_of(i) {
            text.push_str(&format!("url = \"{url}\"\n"));
        }
        text.push_str(&format!(
            "staging_root = \"{}\"\n",
            node.data_dir().join("chpart-staging").display()
        ));
    }
    let config = dir.join("chpart.toml");
    std::fs::write(&config, text).unwrap();
    config
}

/// Rewrites `config` (a [`cluster_config`] of `cluster`, started with an sshd per node and
/// servers running as `clickhouse`) to reach every shard's filesystem over SFTP as that user:
/// `[ssh]` for the entry server, `[[hosts]]` for each (its own address, port, host key and
/// client key).
pub(crate) fn over_sftp_config(cluster: &Cluster, config: &Path) {
    let first = cluster.nodes[0].sshd.as_ref().unwrap();
    let mut text = std::fs::read_to_string(config)
        .unwrap()
        .replace("kind = \"local\"", "kind = \"sftp\"");
    text.push_str(&format!(
        "[ssh]\nhost = \"{}\"\nport = {}\nuser = \"clickhouse\"\nidentity_file = \"{}\"\nknown_hosts = \"{}\"\n",
        first.host,
        first.port,
        first.client_key.display(),
        first.known_hosts.display()
    ));
    let hosts: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| {
            let sshd = node.sshd.as_ref().unwrap();
            format!(
                "[[hosts]]\nname = \"{}\"\nstaging_root = \"{}\"\nssh_port = {}\nidentity_file = \"{}\"\nknown_hosts = \"{}\"\n",
                node.address,
                node.data_dir().join("chpart-staging").display(),
                sshd.port,
                sshd.client_key.display(),
                sshd.known_hosts.display()
            )
        })
        .collect();
    // The [[hosts]] written for the local transport are replaced by these.
    let start = text.find("[[hosts]]").unwrap();
    let ssh = text.find("[ssh]").unwrap();
    text = format!("{}{}{}", &text[..start], &text[ssh..], hosts.concat());
    std::fs::write(config, text).unwrap();
}

/// How many shadow tables of `db.local` the server holds (one per open load of it).
fn shadow_tables(server: &chpart_testenv::clickhouse::ClickHouse) -> String {
    server.q(
        "SELECT count() FROM system.tables WHERE database = 'db' AND name LIKE 'local__chpart_%'",
    )
}

fn assert_exactly_once_as_routed(s: &ClusterSetup, what: &str) {
    for (i, (loaded, twin)) in s.per_shard().into_iter().enumerate() {
        assert_eq!(
            loaded,
            twin,
            "{what}: shard {} differs from the INSERT twin",
            i + 1
        );
    }
}

#[test]
fn a_distributed_table_loads_exactly_once_routed_as_clickhouse_routes() {
    // A signed key of 64 bits (`toInt32(id) - 1500` is Int64): read as unsigned, % 6.
    let s = ClusterSetup::new("dist_load", &[1, 2, 3], "toInt32(id) - 1500");
    let begin = s.begin("dl-1", &["--json"]);
    assert_eq!(begin.status.code(), Some(0), "{}", text(&begin));
    let spec: serde_json::Value = serde_json::from_slice(&begin.stdout).unwrap();
    let shards = spec["cluster"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 3, "{spec}");
    assert_eq!(spec["cluster"]["key_type"], "Int64", "{spec}");
    for (i, node) in s.cluster.nodes.iter().enumerate() {
        assert_eq!(shards[i]["host"], node.address.to_string());
        assert_eq!(shards[i]["weight"], node.weight);
        // Each shard got its own sub-load with its own shadow of db.local.
        let shadows = shadow_tables(&node.server);
        assert_eq!(shadows, "1\n", "shard {}", node.shard_num);
    }
    // Three Spark partitions, each built by a loser and a winner, both published on every shard.
    let built = s.build_load("dl-1", &[], 3, &["app-a", "app-b"]);
    let file = s.winners("w.jsonl", &[&built[0][1], &built[1][0], &built[2][1]]);
    let out = s.commit("dl-1", Some(&file), &["--partitions", "3", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["rows"], 3000, "{summary}");
    s.insert_twin(&[0, 1, 2]);
    assert_exactly_once_as_routed(&s, "after commit");
    let total: u64 = s
        .cluster
        .nodes
        .iter()
        .map(|n| {
            n.server
                .q("SELECT count() FROM db.local")
                .trim()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert_eq!(total, 3000);
    // Every shard got rows (weights 1/2/3 of 3000 rows with this key: none is empty).
    for node in &s.cluster.nodes {
        assert_ne!(
            node.server.q("SELECT count() FROM db.local"),
            "0\n",
            "shard {}",
            node.shard_num
        );
    }
    // status shows the shards; gc leaves nothing on any shard; a second commit changes nothing.
    let status = s.run(&["status", "--load", "dl-1", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(
        status[0]["shards"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
    assert!(
        status[0]["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "committed"),
        "{status}"
    );
    // What gc still has to remove of a cluster load is its shards': the losers, the shadows.
    let pending = status[0]["gc_pending"].as_array().unwrap();
    assert!(
        pending.iter().any(|r| r["kind"] == "shadow_table"),
        "{status}"
    );
    assert!(pending.iter().any(|r| r["kind"] == "staging"), "{status}");
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    let status = s.run(&["status", "--load", "dl-1", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status[0]["gc_pending"], serde_json::json!([]), "{status}");
    let again = s.commit("dl-1", Some(&file), &["--partitions", "3"], None);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert_exactly_once_as_routed(&s, "after a second commit");
}

#[test]
fn a_distributed_table_loads_exactly_once_over_sftp_to_every_shard() {
    let s = ClusterSetup::over_sftp("dist_sftp", &[2, 1, 1], "toInt16(id) * -7");
    let built = s.build_load("ds-1", &[], 2, &["app-a", "app-b"]);
    let file = s.winners("w.jsonl", &[&built[0][0], &built[1][1]]);
    let out = s.commit("ds-1", Some(&file), &["--partitions", "2"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    s.insert_twin(&[0, 1]);
    assert_exactly_once_as_routed(&s, "over sftp");
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn a_cluster_commit_killed_at_any_step_resumes_exactly_once() {
    let s = ClusterSetup::new("dist_crash", &[1, 2, 3], "cityHash64(id)");
    s.insert_twin(&[0, 1]);
    let points = [
        "after-plan:2",
        "after-cluster-decision",
        "before-attach:2",
        "after-attach:4",
        "before-publish:3",
        "after-publish:2",
        "before-commit:2",
        "before-cluster-commit",
    ];
    for (i, point) in points.iter().enumerate() {
        let load = format!("dc-{i}");
        let built = s.build_load(&load, &[], 2, &["app-a", "app-b"]);
        let file = s.winners(&format!("w{i}.jsonl"), &[&built[0][1], &built[1][0]]);
        let out = s.commit(&load, Some(&file), &["--partitions", "2"], Some(point));
        assert_eq!(
            out.status.code(),
            None,
            "{point}: the commit was to be killed: {}",
            text(&out)
        );
        // Resumed without the winners file, as another machine would.
        let out = s.commit(&load, None, &[], None);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{point}: resume failed: {}",
            text(&out)
        );
        assert_exactly_once_as_routed(&s, point);
        s.gc_and_empty();
    }
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn an_unreachable_shard_stops_begin_and_commit_before_anything_is_visible() {
    let mut s = ClusterSetup::new("dist_down", &[1, 1, 1], "id");
    // At begin: shard 3 down. Nothing is created on any shard.
    s.cluster.nodes[2].server.stop();
    let out = s.begin("dd-1", &[]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("shard 3"), "{}", text(&out));
    for node in &s.cluster.nodes[..2] {
        assert_eq!(
            shadow_tables(&node.server),
            "0\n",
            "no shadow on shard {}",
            node.shard_num
        );
    }
    s.cluster.nodes[2].server.start_again();
    // At commit: shard 2 down after the builds. Nothing becomes visible on any shard; abort
    // (once it is back) cleans every shard.
    let built = s.build_load("dd-2", &[], 2, &["app-a"]);
    let file = s.winners("w.jsonl", &[&built[0][0], &built[1][0]]);
    s.cluster.nodes[1].server.stop();
    let out = s.commit("dd-2", Some(&file), &["--partitions", "2"], None);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("shard 2"), "{}", text(&out));
    for node in [&s.cluster.nodes[0], &s.cluster.nodes[2]] {
        assert_eq!(
            node.server.q("SELECT count() FROM db.local"),
            "0\n",
            "shard {}",
            node.shard_num
        );
    }
    s.cluster.nodes[1].server.start_again();
    let out = s.run(&["abort", "--load", "dd-2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for node in &s.cluster.nodes {
        assert_eq!(node.server.q("SELECT count() FROM db.local"), "0\n");
    }
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn plan_shows_the_topology_and_names_a_host_that_does_not_answer() {
    let mut s = ClusterSetup::new("dist_plan", &[1, 2, 3], "toInt32(id) - 1500");
    let out = s.run(&["plan", "--table", "db.events", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["cluster"], "dist_plan", "{plan}");
    assert_eq!(plan["key_type"], "Int64", "{plan}");
    // The shards' local table's keys (what the Spark connector's layout asks for).
    assert_eq!(plan["partition_key"], "toYYYYMM(ts)", "{plan}");
    assert_eq!(plan["sorting_key"], "id", "{plan}");
    assert_eq!(
        plan["routing"],
        "multiIf(reinterpretAsUInt64(toInt32(id) - 1500) % 6 < 1, 1, reinterpretAsUInt64(toInt32(id) - 1500) % 6 < 3, 2, 3)",
        "{plan}"
    );
    let hosts = plan["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 3);
    for (host, node) in hosts.iter().zip(&s.cluster.nodes) {
        assert_eq!(host["host"], node.address.to_string(), "{plan}");
        assert_eq!(host["weight"], node.weight, "{plan}");
        assert_eq!(host["filesystem_reachable"], true, "{plan}");
        assert_eq!(host["problems"], serde_json::json!([]), "{plan}");
        let staging = host["disks"][0]["staging_root"].as_str().unwrap();
        assert_eq!(
            staging,
            node.data_dir().join("chpart-staging").to_str().unwrap(),
            "[[hosts]] staging roots: {plan}"
        );
    }
    // Nothing was written: no ledger, no shadow.
    for node in &s.cluster.nodes {
        assert_eq!(
            node.server
                .q("SELECT count() FROM system.tables WHERE name LIKE '%chpart%'"),
            "0\n"
        );
    }
    // The keys alone (what the Spark connector asks on every write): the same keys, no host.
    let out = s.run(&["plan", "--table", "db.events", "--json", "--keys"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let keys: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(keys["cluster"], "dist_plan", "{keys}");
    assert_eq!(keys["partition_key"], "toYYYYMM(ts)", "{keys}");
    assert_eq!(keys["columns"][0]["name"], "ts", "{keys}");
    assert!(keys["timezone"].is_string(), "{keys}");
    assert_eq!(keys["sorting_key"], "id", "{keys}");
    assert_eq!(keys["hosts"], serde_json::json!([]), "{keys}");
    // A shard down: exit 3, the shard named; the text form says so too.
    s.cluster.nodes[1].server.stop();
    let out = s.run(&["plan", "--table", "db.events"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("shard 2 weight 2"), "{shown}");
    assert!(shown.contains("PROBLEM"), "{shown}");
    // The keys still come from a shard that answers.
    let out = s.run(&["plan", "--table", "db.events", "--keys"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("PARTITION BY toYYYYMM(ts), ORDER BY id"),
        "{}",
        text(&out)
    );
}

#[test]
fn two_cluster_commits_at_once_settle_on_one_plan_and_load_once() {
    let s = ClusterSetup::new("dist_race", &[1, 1, 1], "cityHash64(id)");
    s.insert_twin(&[0, 1]);
    for round in 0..2 {
        // Same winners (a driver and its retry) in round 0, other winners (a zombie driver and
        // its replacement) in round 1.
        let load = format!("dr-{round}");
        let built = s.build_load(&load, &[], 2, &["app-a", "app-b"]);
        let first = s.winners(&format!("w{round}a.jsonl"), &[&built[0][0], &built[1][0]]);
        let second = if round == 0 {
            first.clone()
        } else {
            s.winners(&format!("w{round}b.jsonl"), &[&built[0][1], &built[1][1]])
        };
        let spawn = |winners: &Path| {
            chpart()
                .args(["commit", "--config"])
                .arg(&s.config)
                .args(["--load", &load, "--partitions", "2", "--winners"])
                .arg(winners)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(&first), spawn(&second));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let codes = [a.status.code(), b.status.code()];
        if round == 0 {
            assert_eq!(codes, [Some(0), Some(0)], "{}\n{}", text(&a), text(&b));
        } else {
            let mut sorted = codes;
            sorted.sort();
            assert_eq!(sorted, [Some(0), Some(4)], "{}\n{}", text(&a), text(&b));
            let loser = if codes[0] == Some(4) { &a } else { &b };
            assert!(text(loser).contains("other winners"), "{}", text(loser));
        }
        assert_exactly_once_as_routed(&s, &format!("round {round}"));
        s.gc_and_empty();
    }
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

#[test]
fn a_build_that_fails_on_one_shard_leaves_nothing_on_any_shard() {
    let s = ClusterSetup::new("dist_undo", &[1, 1, 1], "id");
    let out = s.begin("du-1", &["--visibility", "part"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let input = write_rows(s.dir.path(), "p0.parquet", &partition_rows(0), "Parquet");
    // Shard 3's detached/ is not the server user's: its publish fails after shards 1 and 2
    // (built in parallel) may have published theirs.
    let node = &s.cluster.nodes[2];
    let table = node.server.q(
        "SELECT arrayJoin(data_paths) FROM system.tables WHERE database = 'db' AND name = 'local'",
    );
    let detached = Path::new(table.trim()).join("detached");
    let (uid, gid) = chpart_testenv::os_user_ids("chpart-test");
    std::os::unix::fs::chown(&detached, Some(uid), Some(gid)).unwrap();
    let out = s.build("du-1", "app-a.0", 0, &input).unwrap_err();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("shard 3"), "{}", text(&out));
    std::os::unix::fs::chown(&detached, Some(0), Some(0)).unwrap();
    assert_eq!(
        s.leftovers(),
        Vec::<String>::new(),
        "what the attempt published on shards 1 and 2 was undone, its staging removed"
    );
    // The same attempt's retry (a new attempt id) then loads exactly once.
    let line = s.build("du-1", "app-a.1", 0, &input).unwrap();
    let file = s.winners("w.jsonl", &[&line]);
    let out = s.commit("du-1", Some(&file), &["--partitions", "1"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    s.insert_twin(&[0]);
    assert_exactly_once_as_routed(&s, "after the retry");
}

#[test]
fn readers_of_the_distributed_table_never_see_a_row_twice_or_rows_go_away_during_a_commit() {
    let s = ClusterSetup::new("dist_read", &[1, 2, 3], "toInt32(id) - 1500");
    let built = s.build_load("rd-1", &[], 4, &["app-a"]);
    let lines: Vec<&String> = built.iter().map(|b| &b[0]).collect();
    let file = s.winners("w.jsonl", &lines);
    let entry = &s.cluster.nodes[0].server;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut seen = Vec::new();
            loop {
                let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                let row = entry.q("SELECT count(), uniqExact(id) FROM db.events");
                let mut fields = row.split_whitespace().map(|f| f.parse::<u64>().unwrap());
                seen.push((fields.next().unwrap(), fields.next().unwrap()));
                if done {
                    return seen;
                }
            }
        });
        let out = s.commit("rd-1", Some(&file), &["--partitions", "4"], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap()
    });
    let mut last = 0;
    for (count, unique) in &seen {
        assert_eq!(count, unique, "a row seen twice: {seen:?}");
        assert!(*count <= 4000, "more rows than the load: {seen:?}");
        assert!(*count >= last, "rows went away: {seen:?}");
        last = *count;
    }
    assert_eq!(last, 4000, "the last read sees the whole load: {seen:?}");
    assert!(
        seen.len() > 2,
        "the reader read during the commit: {seen:?}"
    );
}

/// `chpart load` into a Distributed table loads every shard as ClickHouse routes the rows,
/// and a run stopped between the shards' commits is finished by the same command.
#[test]
fn chpart_load_into_a_distributed_table_loads_every_shard_exactly_once() {
    let s = ClusterSetup::new("dist_cli_load", &[1, 2, 3], "id");
    s.insert_twin(&[0, 1, 2]);
    let files: Vec<PathBuf> = (0..3)
        .map(|p| {
            write_rows(
                s.dir.path(),
                &format!("in-{p}.parquet"),
                &partition_rows(p),
                "Parquet",
            )
        })
        .collect();
    let run = |crash_at: Option<&str>| {
        let mut cmd = chpart();
        cmd.args(["load", "--config"]).arg(&s.config).args([
            "--table",
            "db.events",
            "--load",
            "dcl-1",
            "--jobs",
            "2",
            "--json",
        ]);
        for f in &files {
            cmd.arg("--input").arg(f);
        }
        if let Some(point) = crash_at {
            cmd.env("CHPART_TEST_CRASH_AT", point);
        }
        cmd.output().unwrap()
    };
    let out = run(Some("before-cluster-commit"));
    assert!(
        text(&out).contains("CHPART_TEST_CRASH_AT=before-cluster-commit"),
        "the run was to stop there: {}",
        text(&out)
    );
    let out = run(None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(summary["rows"], 3000, "{summary}");
    assert_exactly_once_as_routed(&s, "chpart load, stopped before the cluster commit");
    assert_eq!(s.leftovers(), Vec::<String>::new());
    for node in &s.cluster.nodes {
        assert_eq!(shadow_tables(&node.server).trim(), "0");
    }
    // A reload of the same months from one file: `--mode replace` leaves that file's rows only.
    let out = chpart()
        .args(["load", "--config"])
        .arg(&s.config)
        .args([
            "--table",
            "db.events",
            "--load",
            "dcl-2",
            "--mode",
            "replace",
            "--input",
        ])
        .arg(&files[0])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for node in &s.cluster.nodes {
        node.server.q("TRUNCATE TABLE db.twin_local");
    }
    s.insert_twin(&[0]);
    assert_exactly_once_as_routed(&s, "chpart load --mode replace");
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// Replace (reloads of history) into a Distributed table
// ---------------------------------------------------------------------------------------------
//
// The sharding key is `id` over weights 1/2/3, so `id % 6` picks the shard: 0 shard 1, 1-2
// shard 2, 3-5 shard 3. The rows are chosen so that a partition the load replaces holds old
// rows on a shard that none of the new rows of that partition go to: the replace must empty
// it there too, as an INSERT twin that never had those rows shows.

/// A row select with the test's columns: `ts` from `start` plus `number % span` hours, `id` as
/// given (an expression of `number`), `n` rows, named `name`.
fn rows(start: &str, span: u32, id: &str, n: u32, name: &str) -> String {
    format!(
        "SELECT toDateTime('{start}', 'UTC') + toIntervalHour(number % {span}) AS ts, toUInt64({id}) AS id, \
         '{name}' AS name, if(number % 4 = 0, NULL, number / 3) AS score FROM numbers({n})"
    )
}

/// New rows of Spark partition 0: January 2026, on every shard.
fn new_january() -> String {
    rows("2026-01-05 00:00:00", 200, "number", 1200, "new")
}

/// New rows of Spark partition 1: February 2026, on shard 1 only (`id % 6 = 0`).
fn new_february() -> String {
    rows(
        "2026-02-03 00:00:00",
        100,
        "6 * (number + 20000)",
        500,
        "new",
    )
}

/// Old rows: January 2026 on every shard and February 2026 on shard 3 only (both replaced),
/// December 2025 on every shard (kept). Into the target and, what a replace keeps, the twin.
fn old_rows(s: &ClusterSetup) {
    let entry = &s.cluster.nodes[0].server;
    let replaced = [
        rows("2026-01-10 00:00:00", 100, "900000 + number", 600, "old"),
        rows(
            "2026-02-01 00:00:00",
            100,
            "6 * (number + 200000) + 3",
            300,
            "old",
        ),
    ];
    let kept = rows("2025-12-01 00:00:00", 300, "700000 + number", 300, "old");
    for select in replaced.iter().chain([&kept]) {
        entry.q(&format!(
            "INSERT INTO db.events {select} SETTINGS insert_distributed_sync = 1"
        ));
    }
    entry.q(&format!(
        "INSERT INTO db.twin {kept} SETTINGS insert_distributed_sync = 1"
    ));
}

impl ClusterSetup {
    /// Builds Spark partitions 0 (January, every shard) and 1 (February, shard 1 only) of the
    /// replace load `load`, each by `attempts`, with `extra` build flags; the printed lines.
    fn build_replace(&self, load: &str, attempts: &[&str], extra: &[&str]) -> Vec<Vec<String>> {
        let out = self.begin(load, &["--mode", "replace"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        [new_january(), new_february()]
            .iter()
            .enumerate()
            .map(|(p, select)| {
                let input = write_rows(
                    self.dir.path(),
                    &format!("{load}-p{p}.parquet"),
                    select,
                    "Parquet",
                );
                attempts
                    .iter()
                    .map(|a| {
                        let attempt = format!("{a}.{p}");
                        let out = chpart()
                            .args(["build", "--config"])
                            .arg(&self.config)
                            .args(["--load", load, "--attempt", &attempt, "--partition"])
                            .arg(p.to_string())
                            .arg("--input")
                            .arg(&input)
                            .args(extra)
                            .output()
                            .unwrap();
                        assert!(out.status.success(), "build {attempt}: {}", text(&out));
                        let stdout = String::from_utf8(out.stdout).unwrap();
                        stdout.lines().last().unwrap().to_owned()
                    })
                    .collect()
            })
            .collect()
    }

    /// Empties both tables on every shard and loads the old rows again.
    fn reset_replace(&self) {
        for node in &self.cluster.nodes {
            node.server.q("TRUNCATE TABLE db.local");
            node.server.q("TRUNCATE TABLE db.twin_local");
        }
        old_rows(self);
        let entry = &self.cluster.nodes[0].server;
        entry.q(&format!(
            "INSERT INTO db.twin {} UNION ALL {} SETTINGS insert_distributed_sync = 1",
            new_january(),
            new_february()
        ));
    }

    /// Rows of `db.local` per shard in partition `yyyymm`: (old, new).
    fn old_and_new(&self, yyyymm: u32) -> Vec<(u64, u64)> {
        self.cluster
            .nodes
            .iter()
            .map(|n| {
                let row = n.server.q(&format!(
                    "SELECT countIf(name = 'old'), countIf(name = 'new') FROM db.local WHERE toYYYYMM(ts) = {yyyymm}"
                ));
                let mut f = row.split_whitespace().map(|x| x.parse::<u64>().unwrap());
                (f.next().unwrap(), f.next().unwrap())
            })
            .collect()
    }
}

#[test]
fn a_replace_load_into_a_distributed_table_replaces_the_same_partitions_on_every_shard() {
    let s = ClusterSetup::new("dist_replace", &[1, 2, 3], "id");
    s.reset_replace();
    // Old February rows are on shard 3 only; the new ones will go to shard 1 only.
    assert_eq!(s.old_and_new(202602), [(0, 0), (0, 0), (300, 0)]);
    // Each Spark partition by a loser and a winner, merged into one part per partition and
    // shard (`--merge`).
    let built = s.build_replace("dr-1", &["app-a", "app-b"], &["--merge"]);
    let file = s.winners("w.jsonl", &[&built[0][1], &built[1][0]]);
    let out = s.commit("dr-1", Some(&file), &["--partitions", "2", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["rows"], 1700, "{summary}");
    assert_eq!(summary["mode"], "replace", "{summary}");
    assert_exactly_once_as_routed(&s, "after the replace");
    // February replaced on every shard: shard 3's old rows are gone though no new row went
    // there; December kept everywhere.
    assert_eq!(s.old_and_new(202602), [(0, 500), (0, 0), (0, 0)]);
    assert!(s
        .old_and_new(202601)
        .iter()
        .all(|(old, new)| *old == 0 && *new > 0));
    assert!(s
        .old_and_new(202512)
        .iter()
        .all(|(old, new)| *old > 0 && *new == 0));
    // --merge: one active part per shard and partition of the load.
    for node in &s.cluster.nodes {
        let parts = node.server.q(
            "SELECT partition_id, count() FROM system.parts WHERE database = 'db' AND table = 'local' AND active AND partition_id >= '202601' GROUP BY partition_id HAVING count() > 1",
        );
        assert_eq!(parts, "", "shard {}: more than one part", node.shard_num);
    }
    // A second commit changes nothing; gc leaves nothing on any shard.
    let again = s.commit("dr-1", Some(&file), &["--partitions", "2"], None);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert_exactly_once_as_routed(&s, "after a second commit");
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    for node in &s.cluster.nodes {
        assert_eq!(shadow_tables(&node.server).trim(), "0");
    }
}

#[test]
fn a_second_replace_load_of_a_distributed_table_cannot_begin_while_one_is_open() {
    let s = ClusterSetup::new("dist_replace_busy", &[1, 1], "id");
    let out = s.begin("drb-1", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = s.begin("drb-2", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("load drb-1 is open in replace mode"),
        "the refusal names the open load: {}",
        text(&out)
    );
    // Nothing of the refused load was created on any shard.
    for node in &s.cluster.nodes {
        assert_eq!(
            shadow_tables(&node.server).trim(),
            "1",
            "shard {}",
            node.shard_num
        );
    }
    let out = s.begin("drb-3", &["--mode", "replace", "--visibility", "part"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(
        text(&out).contains("needs --visibility partition"),
        "{}",
        text(&out)
    );
    let abort = s.run(&["abort", "--load", "drb-1"]);
    assert_eq!(abort.status.code(), Some(0), "{}", text(&abort));
    let out = s.begin("drb-2", &["--mode", "replace"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_replace_commit_into_a_distributed_table_killed_at_any_step_resumes_exactly_once() {
    let s = ClusterSetup::new("dist_replace_crash", &[1, 2, 3], "id");
    let points = [
        "after-plan:2",
        "after-cluster-decision",
        "before-attach:2",
        "after-attach:3",
        "before-publish:1",
        "before-publish:4",
        "after-publish:1",
        "after-publish:3",
        "after-publish:5",
        "before-commit:2",
        "before-cluster-commit",
    ];
    for (i, point) in points.iter().enumerate() {
        s.reset_replace();
        let load = format!("drc-{i}");
        let built = s.build_replace(&load, &["app-a", "app-b"], &[]);
        let file = s.winners(&format!("w{i}.jsonl"), &[&built[0][1], &built[1][0]]);
        let out = s.commit(&load, Some(&file), &["--partitions", "2"], Some(point));
        assert_eq!(
            out.status.code(),
            None,
            "{point}: the commit was to be killed: {}",
            text(&out)
        );
        // Replaced or not, each shard's partition is all old or all new.
        for (shard, (old, new)) in s.old_and_new(202601).into_iter().enumerate() {
            assert!(
                old == 0 || new == 0,
                "{point}: shard {} mixes: {old} old, {new} new",
                shard + 1
            );
        }
        // Resumed without the winners file, as another machine would.
        let out = s.commit(&load, None, &[], None);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{point}: resume failed: {}",
            text(&out)
        );
        assert_exactly_once_as_routed(&s, point);
        assert_eq!(s.old_and_new(202602), [(0, 500), (0, 0), (0, 0)], "{point}");
        let gc = s.run(&["gc"]);
        assert_eq!(gc.status.code(), Some(0), "{point}: {}", text(&gc));
    }
    assert_eq!(s.leftovers(), Vec::<String>::new());
}

/// A reader of each shard never sees a replaced partition half old, half new, nor old again
/// once new: each shard swaps it in one REPLACE. Across shards there is no transaction: the
/// test prints how long January was new on one shard and still old on another (the window the
/// docs quote).
#[test]
fn readers_of_each_shard_see_a_replaced_partition_all_old_or_all_new() {
    let s = ClusterSetup::new("dist_replace_read", &[1, 2, 3], "id");
    s.reset_replace();
    let built = s.build_replace("drr-1", &["app-a"], &[]);
    let file = s.winners("w.jsonl", &[&built[0][0], &built[1][0]]);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|scope| {
        let readers: Vec<_> = s
            .cluster
            .nodes
            .iter()
            .map(|node| {
                let stop = &stop;
                scope.spawn(move || {
                    let mut seen = Vec::new();
                    loop {
                        let done = stop.load(std::sync::atomic::Ordering::SeqCst);
                        let asked = std::time::Instant::now();
                        let row = node.server.q(
                            "SELECT toYYYYMM(ts) AS m, countIf(name = 'old'), countIf(name = 'new'), count(), uniqExact(id) FROM db.local GROUP BY m ORDER BY m",
                        );
                        seen.push((node.shard_num, row, asked, std::time::Instant::now()));
                        if done {
                            return seen;
                        }
                    }
                })
            })
            .collect();
        let out = s.commit("drr-1", Some(&file), &["--partitions", "2"], None);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        readers
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    // Per shard: the last read that still saw old January rows and the first that saw new ones:
    // the swap happened after the former was asked and before the latter was answered.
    let mut last_old = std::collections::BTreeMap::new();
    let mut first_new = std::collections::BTreeMap::new();
    for (shard, rows, asked, answered) in &seen {
        for line in rows.lines() {
            let f: Vec<u64> = line
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            let (month, old, new, count, unique) = (f[0], f[1], f[2], f[3], f[4]);
            assert!(
                old == 0 || new == 0,
                "shard {shard}: month {month} mixes old and new: {line}"
            );
            assert_eq!(count, unique, "shard {shard}: a row seen twice: {line}");
            if month == 202601 && old > 0 {
                assert!(
                    !first_new.contains_key(shard),
                    "shard {shard}: January old again after new"
                );
                last_old.insert(*shard, *asked);
            }
            if month == 202601 && new > 0 {
                first_new.entry(*shard).or_insert(*answered);
            }
        }
    }
    assert!(
        seen.len() > 6,
        "the readers read during the commit: {}",
        seen.len()
    );
    assert_exactly_once_as_routed(&s, "after the replace");
    // The window: from the first shard's swap to the last shard's, each known to within its
    // reader's poll: (last old read asked, first new read answered).
    let swaps: Vec<(u32, std::time::Instant, std::time::Instant)> = first_new
        .iter()
        .map(|(shard, new)| (*shard, *last_old.get(shard).unwrap_or(new), *new))
        .collect();
    assert_eq!(
        swaps.len(),
        3,
        "every shard's January was seen new: {first_new:?}"
    );
    let earliest = swaps.iter().map(|(_, old, _)| *old).min().unwrap();
    let latest = swaps.iter().map(|(_, _, new)| *new).max().unwrap();
    let first = swaps.iter().map(|(_, _, new)| *new).min().unwrap();
    let last = swaps.iter().map(|(_, old, _)| *old).max().unwrap();
    eprintln!(
        "replace window across shards: January new on one shard and still old on another for {:.0} ms at most ({:.0} ms at least); reads per shard {}",
        latest.duration_since(earliest).as_secs_f64() * 1000.0,
        last.saturating_duration_since(first).as_secs_f64() * 1000.0,
        seen.len() / 3
    );
}

/// `--mode overwrite` of a Distributed table swaps each shard's local table for its shadow: the
/// new rows are each shard's only rows, a shard that gets none of them ends up empty, and gc
/// leaves no table of the load on any shard.
#[test]
fn an_overwrite_of_a_distributed_table_swaps_every_shards_table() {
    let s = ClusterSetup::new("dist_overwrite", &[1, 2, 3], "id");
    s.reset_replace();
    for node in &s.cluster.nodes {
        node.server.q("TRUNCATE TABLE db.twin_local");
    }
    // Only February's new rows, which all go to shard 1.
    let out = s.begin("dow-1", &["--mode", "overwrite"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let input = write_rows(s.dir.path(), "dow-p0.parquet", &new_february(), "Parquet");
    let line = s
        .build("dow-1", "app-a.0", 0, &input)
        .unwrap_or_else(|o| panic!("{}", text(&o)));
    let file = s.winners("w.jsonl", &[&line]);
    let out = s.commit("dow-1", Some(&file), &["--partitions", "1"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    s.cluster.nodes[0].server.q(&format!(
        "INSERT INTO db.twin {} SETTINGS insert_distributed_sync = 1",
        new_february()
    ));
    assert_exactly_once_as_routed(&s, "after the overwrite");
    let counts: Vec<String> = s
        .cluster
        .nodes
        .iter()
        .map(|n| n.server.q("SELECT count() FROM db.local").trim().to_owned())
        .collect();
    assert_eq!(counts, ["500", "0", "0"], "only the new rows, on shard 1");
    let gc = s.run(&["gc"]);
    assert_eq!(gc.status.code(), Some(0), "{}", text(&gc));
    assert_eq!(s.leftovers(), Vec::<String>::new());
    for node in &s.cluster.nodes {
        assert_eq!(
            shadow_tables(&node.server).trim(),
            "0",
            "shard {}",
            node.shard_num
        );
    }
    assert_exactly_once_as_routed(&s, "after gc");
}
