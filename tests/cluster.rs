//! Real-component tests of the test cluster and multi-disk servers chpart's distributed loads
//! run against (`chpart_testenv::cluster`, `ServerOptions::jbod`): several 26.9 servers form
//! one cluster (`system.clusters`, `Distributed` inserts reach the shards), and a server with
//! a JBOD storage policy has one `detached/` per disk. And the routing rule of
//! `chpart_core::routing`, evaluated by clickhouse-local, against where the cluster's own
//! `Distributed` INSERT put every row.

use std::collections::BTreeMap;

use chpart_core::{DistributedEngine, Routing, ShardWeight, ShardingKey};

use chpart_remote::{RemoteFs, SftpConfig, SftpFs};
use chpart_testenv::clickhouse::{ClickHouse, ServerOptions, JBOD_POLICY};
use chpart_testenv::cluster::{Addresses, Cluster, ClusterOptions};

/// Runs `sql` on every node of `cluster`.
fn on_all(cluster: &Cluster, sql: &str) {
    for node in &cluster.nodes {
        node.server.q(sql);
    }
}

/// Creates database `db` on every node with a MergeTree table `local (id UInt64, v String)`,
/// and on the first node a `Distributed` table `dist` over it with sharding key `key`.
fn create_sharded(cluster: &Cluster, db: &str, key: &str) {
    on_all(cluster, &format!("CREATE DATABASE {db}"));
    on_all(
        cluster,
        &format!("CREATE TABLE {db}.local (id UInt64, v String) ENGINE = MergeTree ORDER BY id"),
    );
    cluster.nodes[0].server.q(&format!(
        "CREATE TABLE {db}.dist AS {db}.local ENGINE = Distributed({}, {db}, local, {key})",
        cluster.name
    ));
}

/// Rows of `db.local` per shard: shard_num -> count.
fn counts_per_shard(cluster: &Cluster, db: &str) -> BTreeMap<u32, u64> {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let count = node
                .server
                .q(&format!("SELECT count() FROM {db}.local"))
                .trim()
                .parse()
                .unwrap();
            (node.shard_num, count)
        })
        .collect()
}

#[test]
fn every_node_lists_the_cluster_with_its_weights_and_itself_as_the_one_local_replica() {
    let cluster = Cluster::start("c3", &[1, 2, 3]);
    for node in &cluster.nodes {
        let rows = node.server.q(
            "SELECT shard_num, shard_weight, host_name, port, is_local FROM system.clusters \
             WHERE cluster = 'c3' ORDER BY shard_num",
        );
        let expected: String = cluster
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    n.shard_num,
                    n.weight,
                    n.address,
                    n.tcp_port(),
                    u8::from(n.shard_num == node.shard_num)
                )
            })
            .collect();
        assert_eq!(rows, expected, "system.clusters on {}", node.address);
        assert_eq!(
            node.server.q("SELECT getMacro('shard')").trim(),
            node.shard_num.to_string()
        );
    }
}

#[test]
fn distributed_insert_lands_on_the_shards_by_weight() {
    let cluster = Cluster::start("c3", &[1, 2, 3]);
    create_sharded(&cluster, "d", "id");
    // Key id, weights 1+2+3 = 6: slot id % 6 -> shard 1 (slot 0), 2 (1-2), 3 (3-5).
    cluster.nodes[0].server.q(
        "INSERT INTO d.dist SELECT number, toString(number) FROM numbers(600) \
         SETTINGS insert_distributed_sync = 1",
    );
    assert_eq!(
        counts_per_shard(&cluster, "d"),
        BTreeMap::from([(1, 100), (2, 200), (3, 300)])
    );
    assert_eq!(
        cluster.nodes[2]
            .server
            .q("SELECT countIf(id % 6 < 3) FROM d.local")
            .trim(),
        "0"
    );
    assert_eq!(
        cluster.nodes[0]
            .server
            .q("SELECT count() FROM d.dist")
            .trim(),
        "600"
    );
}

#[test]
fn private_addresses_are_distinct_hosts_that_are_all_remote() {
    let options = ClusterOptions {
        addresses: Addresses::Private24,
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start_with("p2", &[1, 1], &options);
    let (a, b) = (cluster.nodes[0].address, cluster.nodes[1].address);
    assert_eq!(a.octets()[..3], b.octets()[..3], "one /24 per cluster");
    assert_ne!(a, b);
    assert_eq!(
        cluster.nodes[1].server.q(
            "SELECT groupArray(host_name), sum(is_local) FROM system.clusters WHERE cluster = 'p2'"
        ),
        format!("['{a}','{b}']\t0\n")
    );
    // Every shard, the entry node's own included, is written over TCP; the rows still land.
    create_sharded(&cluster, "d", "id");
    cluster.nodes[0].server.q(
        "INSERT INTO d.dist SELECT number, '' FROM numbers(100) SETTINGS insert_distributed_sync = 1",
    );
    assert_eq!(
        counts_per_shard(&cluster, "d"),
        BTreeMap::from([(1, 50), (2, 50)])
    );
}

#[test]
fn each_node_has_an_sshd_on_its_own_address_for_the_servers_user() {
    // As in production: the servers run as `clickhouse`, who uploads over SFTP.
    chpart_testenv::sshd::ensure_system_user("clickhouse");
    let cluster = Cluster::start_with_sshd("s2", &[1, 1], Some("clickhouse"));
    for node in &cluster.nodes {
        let sshd = node.sshd.as_ref().expect("started with sshd");
        assert_eq!(sshd.host, node.address);
        let mut cfg = SftpConfig::new(
            node.address.to_string(),
            sshd.port,
            "clickhouse",
            &sshd.known_hosts,
        );
        cfg.identity_file = Some(sshd.client_key.clone());
        let fs = SftpFs::connect(&cfg)
            .unwrap_or_else(|e| panic!("sftp to {}: {e}\n{}", node.address, sshd.log()));
        // The node's table directories are reachable on its host.
        node.server.q("CREATE DATABASE IF NOT EXISTS s");
        node.server
            .q("CREATE TABLE IF NOT EXISTS s.t (id UInt64) ENGINE = MergeTree ORDER BY id");
        let path = node
            .server
            .q("SELECT data_paths[1] FROM system.tables WHERE database = 's' AND name = 't'");
        let names: Vec<String> = fs
            .list_dir(path.trim())
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(names.iter().any(|n| n == "detached"), "{path}: {names:?}");
        // ... and writable by the server's user, as uploads into detached/ need.
        let detached = chpart_remote::join(path.trim(), "detached");
        fs.create_dir(&chpart_remote::join(&detached, "probe"))
            .unwrap_or_else(|e| panic!("mkdir in {detached} as clickhouse: {e}"));
        // A host key is listed for this node's address only.
        let known = std::fs::read_to_string(&sshd.known_hosts).unwrap();
        assert!(known.starts_with(&format!("[{}]:{} ", node.address, sshd.port)));
    }
}

#[test]
fn jbod_server_has_a_detached_dir_on_each_disk() {
    let ch = ClickHouse::start_with(ServerOptions {
        jbod: true,
        user: Some("clickhouse".into()),
        ..ServerOptions::default()
    });
    assert_eq!(ch.disks.len(), 2);
    ch.q("CREATE DATABASE j");
    ch.q(&format!(
        "CREATE TABLE j.t (id UInt64) ENGINE = MergeTree ORDER BY id \
         SETTINGS storage_policy = '{JBOD_POLICY}'"
    ));
    let paths: Vec<String> = ch
        .q("SELECT arrayJoin(data_paths) FROM system.tables WHERE database = 'j' AND name = 't'")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    for (path, disk) in paths.iter().zip(&ch.disks) {
        assert!(
            path.starts_with(disk.to_str().unwrap()),
            "{path} not on {}",
            disk.display()
        );
        assert!(
            std::path::Path::new(path).join("detached").is_dir(),
            "{path}detached/"
        );
    }
    // Both disks take parts (round-robin), and the server (as `clickhouse`) can write them.
    for i in 0..4 {
        ch.q(&format!("INSERT INTO j.t VALUES ({i})"));
    }
    assert_eq!(
        ch.q(
            "SELECT arraySort(groupUniqArray(disk_name)) FROM system.parts \
              WHERE database = 'j' AND table = 't'"
        )
        .trim(),
        "['d1','d2']"
    );
}

#[test]
fn daemon_start_listens_on_the_given_host_with_the_extra_config() {
    let dir = chpart_testenv::scratch_dir("listen-host");
    let host = std::net::Ipv4Addr::new(127, 1, 1, 0);
    let (http, tcp) = (
        chpart_testenv::free_port_on(host),
        chpart_testenv::free_port_on(host),
    );
    let script = chpart_testenv::deploy_script("clickhouse-server");
    let run = dir.path().join("run");
    let extra = dir.path().join("extra.xml");
    let start = |extra_xml: &str| {
        std::fs::write(&extra, extra_xml).unwrap();
        std::process::Command::new(&script)
            .arg("start")
            .arg("--data")
            .arg(dir.path().join("data"))
            .arg("--run-dir")
            .arg(&run)
            .args(["--http-port", &http.to_string()])
            .args(["--tcp-port", &tcp.to_string()])
            .args(["--listen-host", &host.to_string()])
            .arg("--config-extra")
            .arg(&extra)
            .output()
            .unwrap()
    };
    let out = start("<macros><shard>7</shard></macros");
    assert!(
        !out.status.success(),
        "a malformed fragment must refuse the start"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config-extra"));

    // The daemon outlives this process unless stopped: stop it even when an assertion fails.
    struct Stop<'a>(&'a std::path::Path, &'a std::path::Path);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new(self.0)
                .args(["stop", "--run-dir"])
                .arg(self.1)
                .output();
        }
    }
    let out = start("<clickhouse><macros><shard>7</shard></macros></clickhouse>");
    let stop = Stop(&script, &run);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("listening on {host}")), "{text}");
    let macro_value = http_get(host, http, "/?query=SELECT%20getMacro('shard')");
    drop(stop);
    assert!(macro_value.ends_with("\r\n\r\n7\n"), "{macro_value}");
}

/// The raw response to `GET path` on `host:port`.
fn http_get(host: std::net::Ipv4Addr, port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect((host, port)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// The routing of the Distributed table `db.dist`, read from the server the way chpart must:
/// engine arguments from `engine_full`, shards and weights from `system.clusters`, the key's
/// result type from ClickHouse itself.
fn routing_of(entry: &ClickHouse, db: &str, dist: &str) -> Routing {
    let engine_full = entry.q(&format!(
        "SELECT engine_full FROM system.tables WHERE database = '{db}' AND name = '{dist}' \
         FORMAT TSVRaw"
    ));
    let engine = DistributedEngine::parse(engine_full.trim()).unwrap();
    let shards = entry
        .q(&format!(
            "SELECT shard_num, shard_weight FROM system.clusters WHERE cluster = '{}' \
             ORDER BY shard_num",
            engine.cluster
        ))
        .lines()
        .map(|line| {
            let (shard_num, weight) = line.split_once('\t').unwrap();
            ShardWeight {
                shard_num: shard_num.parse().unwrap(),
                weight: weight.parse().unwrap(),
            }
        })
        .collect();
    let key = engine.sharding_key.map(|sql| {
        let described = entry.q(&format!(
            "DESCRIBE (SELECT {sql} AS key FROM `{}`.`{}`)",
            engine.database, engine.table
        ));
        let type_name = described.split('\t').nth(1).unwrap().to_owned();
        ShardingKey { sql, type_name }
    });
    Routing { key, shards }
}

/// Every row of `db.local` on every shard as TSV `id, v, shard_num it landed on`.
fn landed_rows(cluster: &Cluster, db: &str, local: &str) -> String {
    cluster
        .nodes
        .iter()
        .map(|node| {
            node.server.q(&format!(
                "SELECT id, v, {} FROM {db}.{local} ORDER BY id",
                node.shard_num
            ))
        })
        .collect()
}

/// Evaluates `slot_sql` with clickhouse-local over `rows` (TSV `id, v, landed`): the number of
/// rows and of rows whose computed shard is the one they landed on.
fn computed_vs_landed(slot_sql: &str, rows: &str) -> (u64, u64) {
    let work = tempfile::tempdir().unwrap();
    let text = chpart_testenv::clickhouse_local_over(
        work.path(),
        "id UInt64, v String, landed UInt32",
        "TabSeparated",
        rows.as_bytes(),
        &format!("SELECT count(), countIf(({slot_sql}) = landed) FROM input"),
    );
    let (total, matched) = text.trim().split_once('\t').unwrap();
    (total.parse().unwrap(), matched.parse().unwrap())
}

/// Loads `rows` rows through a Distributed table over `cluster` for each key, then checks that
/// the routing SQL puts every row on the shard it landed on.
fn assert_routing_matches_the_server(cluster: &Cluster, keys: &[(&str, &str)], rows: u64) {
    let entry = &cluster.nodes[0].server;
    on_all(cluster, "CREATE DATABASE r");
    for (i, (key, expected_type)) in keys.iter().enumerate() {
        on_all(
            cluster,
            &format!(
                "CREATE TABLE r.local{i} (id UInt64, v String) ENGINE = MergeTree ORDER BY id"
            ),
        );
        entry.q(&format!(
            "CREATE TABLE r.dist{i} AS r.local{i} \
             ENGINE = Distributed('{}', 'r', 'local{i}', {key})",
            cluster.name
        ));
        entry.q(&format!(
            "INSERT INTO r.dist{i} SELECT number, toString(number) FROM numbers({rows}) \
             SETTINGS insert_distributed_sync = 1"
        ));
        let routing = routing_of(entry, "r", &format!("dist{i}"));
        let key_type = &routing.key.as_ref().unwrap().type_name;
        assert_eq!(key_type, expected_type, "type of {key}");
        let slot_sql = routing.slot_sql().unwrap();
        let landed = landed_rows(cluster, "r", &format!("local{i}"));
        assert_eq!(
            computed_vs_landed(&slot_sql, &landed),
            (rows, rows),
            "key {key} ({key_type}), weights {:?}: rows total vs on the computed shard; SQL {slot_sql}",
            routing.shards
        );
        // The check can fail: every shard that may receive rows did, the others none.
        let counts = counts_per_shard_of(cluster, &format!("r.local{i}"));
        for node in &cluster.nodes {
            assert_eq!(
                counts[&node.shard_num] > 0,
                node.weight > 0,
                "key {key}: rows per shard {counts:?}"
            );
        }
    }
}

/// Rows of `table` per shard: shard_num -> count.
fn counts_per_shard_of(cluster: &Cluster, table: &str) -> BTreeMap<u32, u64> {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let count = node.server.q(&format!("SELECT count() FROM {table}"));
            (node.shard_num, count.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn routing_sql_puts_every_row_where_the_distributed_insert_put_it() {
    let cluster = Cluster::start("r3", &[1, 2, 3]);
    assert_routing_matches_the_server(
        &cluster,
        &[
            // Signed, and wider than its column: toInt32(...) - 500 is Int64.
            ("toInt32(id) - 500", "Int64"),
            ("cityHash64(id)", "UInt64"),
            // The result type, not the column's: Int16 * Int8 is Int32.
            ("toInt16(id) * -7", "Int32"),
            // Narrow signed keys: read as UInt8 / UInt16.
            ("toInt8(id * 37)", "Int8"),
            ("toInt16(toInt32(id) - 600)", "Int16"),
            (
                "toLowCardinality(toUInt32(id * 7))",
                "LowCardinality(UInt32)",
            ),
        ],
        1200,
    );
}

#[test]
fn routing_sql_gives_a_weight_zero_shard_nothing() {
    let cluster = Cluster::start("w0", &[2, 0, 3]);
    assert_routing_matches_the_server(
        &cluster,
        &[
            ("toInt32(id) - 500", "Int64"),
            ("intHash32(id)", "UInt32"),
            ("cityHash64(id)", "UInt64"),
        ],
        1000,
    );
}
