"""A three-shard ClickHouse cluster for the Spark tests (the Python twin of the Rust tests'
`chpart_testenv::cluster::Cluster`, see crates/testenv/src/cluster.rs and tests/distributed.rs).

Three 26.9 servers (deploy/dev/clickhouse-server), each on a loopback address of its own that
ClickHouse counts as the machine itself (127.0.1.1, 127.1.0.1, 127.1.1.1: each node sees
exactly itself as `is_local`, as a production host does), with distinct HTTP and TCP ports
that are free on their address (tests/spark/ports.py). Every config.xml carries the same
`<remote_servers>` block (cluster `CLUSTER`, shard weights 1, 2, 3, each shard one replica naming
its node's address and *TCP* port) and the node's own `<macros>`. Parallel tests (Rust, or another
xdist worker) may use the same addresses with other ports: only the ports must be free.

`three_shard_cluster` (a fixture) starts them, creates `db` with the local table on every node
and the Distributed table on node 1, writes a chpart config (server = node 1, local transport,
one `[[hosts]]` per node naming its address and its staging root next to its data), and stops
every server at teardown.
"""

import json
import os
import subprocess
import time

import pytest

from conftest import ROOT, ClickHouse, _fail, write_config
from ports import free_port
from datasets import COLUMNS, create_table_sql

CLUSTER = "spark_shards"
ADDRESSES = ("127.0.1.1", "127.1.0.1", "127.1.1.1")
WEIGHTS = (1, 2, 3)
# A signed key (Int64): ClickHouse routes by its value read as UInt64, not by a signed modulo.
SHARDING_KEY = "id - 20000"
LOCAL_TABLE = "db.events_local"
TABLE = "db.events"
TWIN_LOCAL_TABLE = "db.twin_local"
TWIN_TABLE = "db.twin"


class Node(ClickHouse):
    """One shard's server: a ClickHouse listening on its own loopback address."""

    def __init__(self, base, shard_num, weight, address):
        super().__init__(base)
        self.shard_num = shard_num
        self.weight = weight
        self.address = address
        self.http_port = free_port(address)
        self.tcp_port = free_port(address)
        self.url = f"http://{address}:{self.http_port}"
        self.config_extra = base / "config-extra.xml"

    def restart(self):
        """Starts the (stopped) server again on its address and ports, with its data."""
        out = subprocess.run(self.start_command(), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            _fail(f"restarting shard {self.shard_num}: {out.stdout}\n{out.stderr}")

    def start_command(self):
        return [str(ROOT / "deploy" / "dev" / "clickhouse-server"), "start", "--data", str(self.data_dir), "--run-dir",
                str(self.run_dir), "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port),
                "--listen-host", self.address, "--config-extra", str(self.config_extra)]


def remote_servers_xml(name, nodes):
    """The `<remote_servers>` block every node shares (as testenv's `remote_servers_xml`)."""
    shards = "".join(
        f"<shard><weight>{n.weight}</weight><internal_replication>false</internal_replication>"
        f"<replica><host>{n.address}</host><port>{n.tcp_port}</port></replica></shard>"
        for n in nodes)
    return f"<remote_servers><{name}>{shards}</{name}></remote_servers>\n"


class Cluster:
    """Running servers forming the ClickHouse cluster `name`; `nodes[i].shard_num == i + 1`."""

    def __init__(self, base, name=CLUSTER, addresses=ADDRESSES, weights=WEIGHTS):
        self.name = name
        self.nodes = [Node(base / f"shard{i + 1}", i + 1, w, a)
                      for i, (a, w) in enumerate(zip(addresses, weights))]
        self.config = None

    @property
    def entry(self):
        return self.nodes[0]

    def start(self):
        """Starts every node at once (each about a second); fails naming the node that did not."""
        remote = remote_servers_xml(self.name, self.nodes)
        procs = []
        for node in self.nodes:
            node.run_dir.mkdir(parents=True, exist_ok=True)
            node.config_extra.write_text(f"{remote}<macros><shard>{node.shard_num}</shard></macros>\n")
            procs.append((node, subprocess.Popen(node.start_command(), stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)))
        failures = []
        for node, proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                failures.append(f"shard {node.shard_num} on {node.address} ({proc.returncode}): {out}")
        if failures:
            self.stop()
            _fail("deploy/dev/clickhouse-server start failed:\n" + "\n".join(failures))
        # Every node sees the whole cluster, and itself (only) as local.
        for node in self.nodes:
            rows = node.rows(f"SELECT shard_num, shard_weight, host_address, port, is_local FROM system.clusters "
                             f"WHERE cluster = '{self.name}' ORDER BY shard_num")
            expected = [{"shard_num": n.shard_num, "shard_weight": n.weight, "host_address": n.address,
                         "port": n.tcp_port, "is_local": int(n is node)} for n in self.nodes]
            assert rows == expected, f"system.clusters on shard {node.shard_num}: {rows}"

    def stop(self):
        procs = [subprocess.Popen([str(ROOT / "deploy" / "dev" / "clickhouse-server"), "stop", "--run-dir",
                                   str(n.run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for n in self.nodes]
        for p in procs:
            p.wait(timeout=120)

    def create_tables(self):
        """`db` with the local table and its twin on every node; the Distributed tables on node 1."""
        for node in self.nodes:
            node.query("CREATE DATABASE db")
            node.query(create_table_sql(LOCAL_TABLE))
            node.query(create_table_sql(TWIN_LOCAL_TABLE))
        local, twin_local = LOCAL_TABLE.split(".")[1], TWIN_LOCAL_TABLE.split(".")[1]
        self.entry.query(f"CREATE TABLE {TABLE} AS {LOCAL_TABLE} "
                         f"ENGINE = Distributed({self.name}, db, {local}, {SHARDING_KEY})")
        self.entry.query(f"CREATE TABLE {TWIN_TABLE} AS {TWIN_LOCAL_TABLE} "
                         f"ENGINE = Distributed({self.name}, db, {twin_local}, {SHARDING_KEY})")

    def write_config(self, path, work_dir):
        """chpart's config: node 1 is the server (and holds the ledger); every host stages next
        to its own data, as on a real cluster where each host has its own filesystem."""
        write_config(path, self.entry, work_dir)
        text = path.read_text()
        for node in self.nodes:
            text += f'[[hosts]]\nname = "{node.address}"\nstaging_root = "{node.staging_root}"\n'
        path.write_text(text)
        self.config = str(path)
        return self.config

    def node(self, shard_num):
        [node] = [n for n in self.nodes if n.shard_num == shard_num]
        return node

    def plan(self, chpart, table=TABLE):
        """`chpart plan --table <table> --json`: the topology a load would use (exit 0: ready)."""
        out = subprocess.run([chpart, "plan", "--config", self.config, "--table", table, "--json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"chpart plan exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        return json.loads(out.stdout.strip().splitlines()[-1])

    @staticmethod
    def sub_load(load, shard_num):
        """The sub-load `begin` opens on shard `shard_num` for the cluster load `load`."""
        return f"{load}.shard{shard_num}"

    def staged_manifest(self, load, shard_num, attempt):
        """The manifest an attempt of cluster load `load` staged on shard `shard_num`'s host:
        `<that host's staging_root>/<load>.shard<N>/<attempt>/manifest.json` (the shard's entry
        of the cluster manifest the build printed)."""
        path = os.path.join(str(self.node(shard_num).staging_root), self.sub_load(load, shard_num), attempt,
                            "manifest.json")
        with open(path) as f:
            return json.load(f)

    def detached(self, shard_num, database="db"):
        """{part name: table} of every detached part of `database` on the shard (the local table
        and the sub-load's shadow table)."""
        return {r["name"]: r["table"] for r in self.node(shard_num).rows(
            f"SELECT table, name FROM system.detached_parts WHERE database = '{database}'")}

    def shadow_tables(self, shard_num, database="db"):
        return [r["name"] for r in self.node(shard_num).rows(
            f"SELECT name FROM system.tables WHERE database = '{database}' AND name LIKE '%\\_\\_chpart\\_%'")]

    def staged_files(self, shard_num):
        """Every file under the shard's host's staging root (any load)."""
        root = str(self.node(shard_num).staging_root)
        return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]

    def fingerprint(self, shard_num, table):
        """Order-independent fingerprint of a shard's table: count and sum of row hashes."""
        return self.node(shard_num).scalar(
            f"SELECT count(), sum(cityHash64({', '.join(COLUMNS)})) FROM {table}")


@pytest.fixture
def three_shard_cluster(tmp_path):
    """Three servers (shards of weight 1, 2, 3 on 127.0.1.1, 127.1.0.1, 127.1.1.1) with
    `db.events_local` and `db.twin_local` on each, `db.events` and `db.twin` (Distributed, key
    `id - 20000`) on shard 1, and `cluster.config`: a chpart config for them."""
    cluster = Cluster(tmp_path / "cluster")
    started = time.monotonic()
    try:
        cluster.start()
        print(f"cluster {cluster.name}: 3 servers up in {time.monotonic() - started:.1f}s")
        cluster.create_tables()
        work = tmp_path / "work"
        work.mkdir()
        cluster.write_config(tmp_path / "chpart.toml", work)
        yield cluster
    finally:
        cluster.stop()
