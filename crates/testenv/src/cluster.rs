//! A ClickHouse cluster for tests: one server per shard, each on a loopback address of its own.
//!
//! chpart must find, for a Distributed table, every shard's server, its data paths and which
//! rows belong where. A test twin of such a cluster is a handful of 26.9 servers
//! ([`ClickHouse`]) whose config.xml all carry the same `<remote_servers>` block (the cluster
//! named by the test, one `<shard>` per server with its `<weight>`, one `<replica>` naming the
//! server's address and *TCP* port) plus their own `<macros><shard>N</shard></macros>`.
//! `system.clusters` on every node then lists the cluster and `Distributed` tables route rows
//! to the shards' local tables, as on a real cluster.
//!
//! Addresses ([`Addresses`]). ClickHouse decides that a replica is the server itself
//! (`system.clusters.is_local`) when the replica's address is local and its port is the
//! server's own TCP port; but it treats only 127.0.0.1 and the Debian-style
//! `127.{0,1}.{0,1}.{0,1}` as local loopback addresses: other 127.x.y.z "are used in tests to
//! emulate distributed queries across localhost" (ClickHouse's `isLocalAddress`), and on this
//! engine they stay remote even when added to `lo`. So:
//! - [`Addresses::SelfLocal`] (the default) puts the nodes on those local aliases: each node
//!   sees exactly itself as `is_local`, as a production host does. At most seven nodes.
//! - [`Addresses::Private24`] draws a random `127.a.b.0/24` per cluster (`.1`, `.2`, ... per
//!   node): no address is shared with any other test, any number of nodes, but every replica
//!   is remote to every node (`is_local` = 0 everywhere; a node's own shard is written over TCP).
//!
//! In both, the nodes' TCP ports are distinct (see [`crate::free_port_on`]), the servers start in
//! parallel (about a second each) and stop when the cluster is dropped or the test process
//! dies (their stdin pipe closes).

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Mutex;

use crate::clickhouse::{ClickHouse, ServerOptions};
use crate::free_port_on;
use crate::sshd::Sshd;

/// The loopback aliases ClickHouse counts as the machine itself, 127.0.0.1 last (other tests'
/// servers use it).
const SELF_LOCAL: [Ipv4Addr; 7] = [
    Ipv4Addr::new(127, 0, 1, 1),
    Ipv4Addr::new(127, 1, 0, 1),
    Ipv4Addr::new(127, 1, 1, 1),
    Ipv4Addr::new(127, 0, 1, 0),
    Ipv4Addr::new(127, 1, 0, 0),
    Ipv4Addr::new(127, 1, 1, 0),
    Ipv4Addr::LOCALHOST,
];

/// Starts of a whole cluster tried before a node that does not come up fails the test.
pub const CLUSTER_START_ATTEMPTS: u32 = 3;

/// Which loopback addresses the nodes get (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Addresses {
    /// Distinct aliases that ClickHouse counts as local: correct `is_local`, at most 7 nodes.
    #[default]
    SelfLocal,
    /// A random `127.a.b.0/24` of the cluster's own: nothing shared, `is_local` = 0 everywhere.
    Private24,
}

/// How to start a [`Cluster`].
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// The nodes' addresses.
    pub addresses: Addresses,
    /// OS user every server runs as (needs root), e.g. `clickhouse`; with `sshd` that user may
    /// log in too.
    pub user: Option<String>,
    /// Also start one sshd per node, listening on the node's address.
    pub sshd: bool,
    /// Give every node the storage policy `jbod` of two more local disks
    /// ([`ServerOptions::jbod`]).
    pub jbod: bool,
}

/// One shard's server.
pub struct Node {
    /// The shard's number in `system.clusters` (1-based, config order).
    pub shard_num: u32,
    /// The shard's `<weight>`.
    pub weight: u32,
    /// The node's loopback address: its "host".
    pub address: Ipv4Addr,
    /// The server (its HTTP client, ports, data directory).
    pub server: ClickHouse,
    /// The node's sshd on [`Node::address`], when the cluster was started with one.
    pub sshd: Option<Sshd>,
}

impl Node {
    /// HTTP port on [`Node::address`].
    pub fn http_port(&self) -> u16 {
        self.server.http_port
    }

    /// Native TCP port on [`Node::address`] (the port `<remote_servers>` names).
    pub fn tcp_port(&self) -> u16 {
        self.server.tcp_port
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.server.data_dir
    }
}

/// Running servers forming the ClickHouse cluster [`Cluster::name`]; stopped on drop.
pub struct Cluster {
    /// The cluster's name in `<remote_servers>` (and `Distributed(name, ...)`).
    pub name: String,
    /// One node per shard, in config order (`nodes[i].shard_num == i + 1`).
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Starts one server per entry of `weights` (that shard's weight) on
    /// [`Addresses::SelfLocal`], as the test's own user, without sshd.
    pub fn start(name: &str, weights: &[u32]) -> Cluster {
        Cluster::start_with(name, weights, &ClusterOptions::default())
    }

    /// Like [`Cluster::start`], with one sshd per node on the node's address, servers running
    /// as `user` (which may then log in over SSH) when given.
    pub fn start_with_sshd(name: &str, weights: &[u32], user: Option<&str>) -> Cluster {
        let options = ClusterOptions {
            user: user.map(str::to_owned),
            sshd: true,
            ..ClusterOptions::default()
        };
        Cluster::start_with(name, weights, &options)
    }

    /// Starts the cluster `name` with one shard per entry of `weights`, the nodes in parallel.
    /// Panics (with the failing node's log) if any node does not come up; the others stop.
    ///
    /// The nodes' ports are fixed before any starts (every node's config names every TCP
    /// port), so a port another process binds in between (an outgoing connection's ephemeral
    /// port is enough) makes that node exit at once: the whole cluster is then started again
    /// on fresh ports, as [`ClickHouse::start`] does for one server, at most
    /// [`CLUSTER_START_ATTEMPTS`] times.
    pub fn start_with(name: &str, weights: &[u32], options: &ClusterOptions) -> Cluster {
        let mut attempt = 1;
        loop {
            match Cluster::try_start(name, weights, options) {
                Ok(cluster) => return cluster,
                Err(panic) if attempt < CLUSTER_START_ATTEMPTS => {
                    eprintln!(
                        "cluster {name}: a node did not start (attempt {attempt}); starting every node again on fresh ports"
                    );
                    drop(panic);
                    attempt += 1;
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    }

    fn try_start(
        name: &str,
        weights: &[u32],
        options: &ClusterOptions,
    ) -> Result<Cluster, Box<dyn std::any::Any + Send>> {
        assert!(!weights.is_empty(), "a cluster needs at least one shard");
        let addresses = node_addresses(options.addresses, weights.len());
        let specs: Vec<ShardSpec> = weights
            .iter()
            .zip(&addresses)
            .map(|(&weight, &address)| ShardSpec {
                address,
                tcp_port: free_port_on(address),
                weight,
            })
            .collect();
        let remote_servers = remote_servers_xml(name, &specs);
        let started: Vec<std::thread::Result<Node>> = std::thread::scope(|scope| {
            let handles: Vec<_> = specs
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    let shard_num = i as u32 + 1;
                    let server_options = ServerOptions {
                        listen_host: Some(spec.address),
                        ports: Some((free_port_on(spec.address), spec.tcp_port)),
                        config_extra: Some(format!(
                            "{remote_servers}<macros><shard>{shard_num}</shard></macros>\n"
                        )),
                        user: options.user.clone(),
                        jbod: options.jbod,
                        ..ServerOptions::default()
                    };
                    let (address, weight) = (spec.address, spec.weight);
                    scope.spawn(move || {
                        let server = ClickHouse::start_with(server_options);
                        let sshd = options.sshd.then(|| {
                            let users: Vec<&str> = options.user.as_deref().into_iter().collect();
                            Sshd::start_on(address, &users)
                        });
                        Node {
                            shard_num,
                            weight,
                            address,
                            server,
                            sshd,
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        let mut nodes = Vec::with_capacity(started.len());
        let mut failure = None;
        for result in started {
            match result {
                Ok(node) => nodes.push(node),
                Err(panic) => failure = failure.or(Some(panic)),
            }
        }
        if let Some(panic) = failure {
            drop(nodes);
            return Err(panic);
        }
        Ok(Cluster {
            name: name.to_owned(),
            nodes,
        })
    }

    /// The node of shard `shard_num` (1-based).
    pub fn node(&self, shard_num: u32) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.shard_num == shard_num)
            .unwrap_or_else(|| panic!("cluster {} has no shard {shard_num}", self.name))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Each server takes a moment to stop: stop them all at once.
        let nodes = std::mem::take(&mut self.nodes);
        std::thread::scope(|scope| {
            for node in nodes {
                scope.spawn(move || drop(node));
            }
        });
    }
}

/// What every node's `<remote_servers>` says about one shard.
struct ShardSpec {
    address: Ipv4Addr,
    tcp_port: u16,
    weight: u32,
}

/// The `<remote_servers>` block all nodes share: cluster `name`, one shard per spec in order.
fn remote_servers_xml(name: &str, shards: &[ShardSpec]) -> String {
    assert!(
        !name.is_empty()
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "cluster name {name:?} must be an identifier (it is an XML element name)"
    );
    let mut xml = format!("<remote_servers><{name}>");
    for shard in shards {
        xml.push_str(&format!(
            "<shard><weight>{}</weight><internal_replication>false</internal_replication>\
             <replica><host>{}</host><port>{}</port></replica></shard>",
            shard.weight, shard.address, shard.tcp_port
        ));
    }
    xml.push_str(&format!("</{name}></remote_servers>\n"));
    xml
}

/// `count` node addresses of the kind asked for.
fn node_addresses(kind: Addresses, count: usize) -> Vec<Ipv4Addr> {
    match kind {
        Addresses::SelfLocal => {
            assert!(
                count <= SELF_LOCAL.len(),
                "Addresses::SelfLocal has {} addresses for {count} nodes: use Addresses::Private24",
                SELF_LOCAL.len()
            );
            SELF_LOCAL[..count].to_vec()
        }
        Addresses::Private24 => {
            assert!(count <= 254, "a /24 holds at most 254 nodes, not {count}");
            let [a, b] = private_net();
            (1..=count as u8)
                .map(|host| Ipv4Addr::new(127, a, b, host))
                .collect()
        }
    }
}

/// The middle octets of a `127.a.b.0/24` no other cluster of this process has, drawn at random
/// so that parallel test processes almost never share one; `a` >= 2 keeps clear of
/// 127.0.0.1 and of [`SELF_LOCAL`].
fn private_net() -> [u8; 2] {
    static TAKEN: Mutex<Option<HashSet<[u8; 2]>>> = Mutex::new(None);
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let taken = taken.get_or_insert_with(HashSet::new);
    loop {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        let bits = hasher.finish();
        let net = [2 + (bits % 253) as u8, (bits >> 8) as u8];
        if taken.insert(net) {
            return net;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_servers_names_every_shard_in_order_with_weight_and_tcp_port() {
        let shards = [
            ShardSpec {
                address: Ipv4Addr::new(127, 0, 1, 1),
                tcp_port: 9001,
                weight: 1,
            },
            ShardSpec {
                address: Ipv4Addr::new(127, 1, 0, 1),
                tcp_port: 9002,
                weight: 0,
            },
        ];
        assert_eq!(
            remote_servers_xml("c1", &shards),
            "<remote_servers><c1>\
             <shard><weight>1</weight><internal_replication>false</internal_replication>\
             <replica><host>127.0.1.1</host><port>9001</port></replica></shard>\
             <shard><weight>0</weight><internal_replication>false</internal_replication>\
             <replica><host>127.1.0.1</host><port>9002</port></replica></shard>\
             </c1></remote_servers>\n"
        );
    }

    #[test]
    #[should_panic(expected = "must be an identifier")]
    fn cluster_name_must_be_an_xml_name() {
        remote_servers_xml("a<b", &[]);
    }

    #[test]
    fn addresses_are_distinct_and_private_nets_are_not_reused() {
        let local = node_addresses(Addresses::SelfLocal, 7);
        assert_eq!(local.iter().collect::<HashSet<_>>().len(), 7);
        let a = node_addresses(Addresses::Private24, 3);
        let b = node_addresses(Addresses::Private24, 3);
        assert_eq!(a[0].octets()[3], 1);
        assert_eq!(a[2].octets()[3], 3);
        assert_ne!(a[0].octets()[..3], b[0].octets()[..3]);
        assert!(a.iter().chain(&b).all(|ip| ip.octets()[1] >= 2));
    }
}
