//! Real packet loss on loopback TCP ports, for tests of lossy networks.
//!
//! This machine's kernel has no `netem` qdisc (`tc qdisc add ... netem` answers "Specified
//! qdisc kind is unknown"), but netfilter's `statistic` match drops a random share of packets:
//! [`PacketLoss`] adds `iptables` rules that drop that share of the TCP packets to and from
//! each given port on `lo`, so the kernel's TCP retransmits, backs off and, when a SYN or a
//! handshake packet is lost, delays connects by whole seconds, as on a lossy link. Only the
//! given ports are touched: give a server of the test's own, not one other tests share.
//!
//! Needs root and `iptables` (`deploy/install.sh` installs it); a missing one is a panic that
//! names the fix. Every rule carries the comment `chpart-test-loss-<pid>` and is removed when
//! the handle drops; rules a killed test process left are removed by the next [`PacketLoss::start`].

use std::process::Command;

use crate::INSTALL_HINT;

const CHAIN: &str = "OUTPUT";
const TAG: &str = "chpart-test-loss-";

/// Drops a random share of the packets to and from some loopback TCP ports while it lives.
pub struct PacketLoss {
    /// Each rule's specification after the chain name, as added.
    rules: Vec<Vec<String>>,
    comment: String,
}

impl PacketLoss {
    /// Drops `percent` of the packets (1-100; 100 cuts the host off: connections hang, as
    /// behind a dead link, rather than being refused) to and from each of `ports` on `lo`, in
    /// both directions, from now until the handle drops.
    pub fn start(ports: &[u16], percent: u32) -> PacketLoss {
        assert!((1..=100).contains(&percent), "loss of {percent}%");
        remove_stale_rules();
        let comment = format!("{TAG}{}", std::process::id());
        let probability = format!("{:.2}", f64::from(percent) / 100.0);
        let mut loss = PacketLoss {
            rules: Vec::new(),
            comment,
        };
        for port in ports {
            for direction in ["--dport", "--sport"] {
                let port = port.to_string();
                let mut rule = vec!["-o", "lo", "-p", "tcp", direction, &port];
                if percent < 100 {
                    rule.extend(["-m", "statistic", "--mode", "random"]);
                    rule.extend(["--probability", &probability]);
                }
                rule.extend(["-m", "comment", "--comment", &loss.comment, "-j", "DROP"]);
                let rule: Vec<String> = rule.iter().map(|s| s.to_string()).collect();
                iptables(&["-A", CHAIN], &rule);
                loss.rules.push(rule);
            }
        }
        loss
    }

    /// Packets dropped so far by this handle's rules (the kernel's counters).
    pub fn dropped(&self) -> u64 {
        iptables(&["-L", CHAIN, "-v", "-n", "-x"], &[])
            .lines()
            .filter(|line| line.contains(&self.comment))
            .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for PacketLoss {
    fn drop(&mut self) {
        for rule in std::mem::take(&mut self.rules) {
            // Best effort: a failure here must not hide the test's own panic.
            let _ = run(&["-D", CHAIN], &rule);
        }
    }
}

/// Deletes the rules of test processes that no longer run.
fn remove_stale_rules() {
    for line in iptables(&["-S", CHAIN], &[]).lines() {
        let Some(pid) = line
            .split_once(TAG)
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
        else {
            continue;
        };
        if std::path::Path::new("/proc").join(pid).exists() {
            continue;
        }
        // `-S` prints `-A OUTPUT <spec>`; the same spec deletes it.
        let spec: Vec<String> = line
            .split_whitespace()
            .skip(2)
            .map(|s| s.trim_matches('"').to_owned())
            .collect();
        let _ = run(&["-D", CHAIN], &spec);
    }
}

fn iptables(head: &[&str], rule: &[String]) -> String {
    match run(head, rule) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

/// `iptables -w <head> <rule>`: its stdout, or an error naming the command and its stderr.
fn run(head: &[&str], rule: &[String]) -> Result<String, String> {
    let mut cmd = Command::new("iptables");
    // -w: wait for the xtables lock (tests run in parallel).
    cmd.arg("-w").args(head).args(rule);
    let described = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| {
        format!("{described}: {e}: iptables is needed for packet loss (package iptables, as root): {INSTALL_HINT}")
    })?;
    if !out.status.success() {
        return Err(format!(
            "{described} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
