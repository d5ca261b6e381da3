//! The chpart binary under test, as the benchmarks drive it: finding it, writing its configs,
//! and running `begin`, `build` and `commit` with the caller's `CHPART_*` variables removed,
//! so that the benchmark's own configs are what runs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use chpart_testenv::clickhouse::ClickHouse;
use chpart_testenv::sshd::Sshd;

use crate::measure::{self, Measured};

/// The chpart configurations of a run, one per transport. Both name the same server, staging
/// root, ledger and clickhouse-local; a load begun and built through one can be committed
/// through the other (nothing in the ledger or a manifest depends on the transport).
pub struct Configs {
    /// Plain filesystem calls: the server's data directory is on this machine.
    pub local: PathBuf,
    /// SFTP through the run's loopback sshd, as executors and drivers reach a real server.
    pub sftp: PathBuf,
    /// `[clickhouse_local] work_dir` of both: the parent of every build's local work dir.
    pub work: PathBuf,
}

impl Configs {
    /// Writes both configs into `root` (and chpart's work directory under it).
    pub fn write(
        root: &Path,
        server: &ClickHouse,
        sshd: &Sshd,
        clickhouse_local: &Path,
        staging: &Path,
    ) -> anyhow::Result<Configs> {
        let work = root.join("chpart-work");
        fs::create_dir_all(&work)?;
        let common = format!(
            "[clickhouse]\nurl = {}\nuser = \"default\"\nrequest_timeout_secs = 600\n\n\
             [clickhouse_local]\ncommand = {}\nwork_dir = {}\ntimeout_secs = 3600\n\n\
             [staging]\nroot = {}\n\n[ledger]\ndatabase = \"chpart\"\n",
            toml_str(&server.url()),
            toml_path(clickhouse_local)?,
            toml_path(&work)?,
            toml_path(staging)?,
        );
        let local = root.join("chpart-local.toml");
        fs::write(&local, format!("{common}\n[transport]\nkind = \"local\"\n"))?;
        let sftp = root.join("chpart-sftp.toml");
        fs::write(
            &sftp,
            format!(
                "{common}\n[transport]\nkind = \"sftp\"\n\n[ssh]\nhost = \"127.0.0.1\"\nport = {}\n\
                 user = \"root\"\nidentity_file = {}\nknown_hosts = {}\n",
                sshd.port,
                toml_path(&sshd.client_key)?,
                toml_path(&sshd.known_hosts)?,
            ),
        )?;
        Ok(Configs { local, sftp, work })
    }
}

fn toml_str(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

fn toml_path(path: &Path) -> anyhow::Result<String> {
    let text = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(toml_str(text))
}

/// The chpart binary under test.
pub struct Chpart {
    exe: PathBuf,
}

impl Chpart {
    /// Finds chpart (`explicit`, else `chpart` next to this executable) and checks that it has
    /// each of `subcommands`; `fallback` ends the error messages (what to do instead).
    pub fn find(
        explicit: Option<&Path>,
        subcommands: &[&str],
        fallback: &str,
    ) -> anyhow::Result<Chpart> {
        let exe = match explicit {
            Some(path) => path.to_path_buf(),
            None => std::env::current_exe()?
                .parent()
                .context("this executable has no directory")?
                .join("chpart"),
        };
        if !exe.exists() {
            bail!(
                "chpart not found at {}: build it with `cargo build --release` (it lands next to \
                 chpart-bench), pass --chpart PATH{fallback}",
                exe.display()
            );
        }
        let chpart = Chpart { exe };
        for sub in subcommands {
            let out = chpart
                .command()
                .args([sub, "--help"])
                .output()
                .with_context(|| format!("run {} {sub} --help", chpart.exe.display()))?;
            if !out.status.success() {
                bail!(
                    "{} has no `{sub}` subcommand yet (`chpart {sub} --help` failed: {}). This \
                     benchmark drives `chpart {}`; rebuild chpart once they exist{fallback}.",
                    chpart.exe.display(),
                    measure::tail(&out.stderr, 3).trim(),
                    subcommands.join("`, `chpart "),
                );
            }
        }
        Ok(chpart)
    }

    /// A chpart command with no `CHPART_*` variables from the caller's environment: they
    /// override config keys, and the benchmark's configs must be what runs.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        // Plain log lines: timings are read from them.
        cmd.env("NO_COLOR", "1");
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("CHPART_") {
                cmd.env_remove(key);
            }
        }
        cmd
    }

    /// `chpart <args[0]> --config <config> <args[1..]>`, measured and checked (an error names
    /// the command, its exit status and the tail of its stderr).
    pub fn run(&self, config: &Path, args: &[&str]) -> anyhow::Result<Measured> {
        let mut cmd = self.command();
        cmd.arg(args[0])
            .arg("--config")
            .arg(config)
            .args(&args[1..]);
        let run = measure::run(&mut cmd)?;
        run.check()?;
        Ok(run)
    }

    /// `chpart begin` of `load` into `table` (`db.table`), with `--visibility` if given.
    pub fn begin(
        &self,
        config: &Path,
        table: &str,
        load: &str,
        visibility: Option<&str>,
    ) -> anyhow::Result<Measured> {
        let mut cmd = self.command();
        cmd.arg("begin")
            .arg("--config")
            .arg(config)
            .args(["--table", table, "--load", load, "--json"]);
        if let Some(visibility) = visibility {
            cmd.args(["--visibility", visibility]);
        }
        let run = measure::run(&mut cmd)?;
        run.check()?;
        Ok(run)
    }

    /// `chpart build` of Spark partition `partition` as `attempt`; returns the run and the
    /// manifest it printed.
    pub fn build(
        &self,
        config: &Path,
        load: &str,
        partition: u32,
        attempt: &str,
        inputs: &[PathBuf],
        merge: bool,
    ) -> anyhow::Result<(Measured, ManifestSummary)> {
        let mut cmd = self.build_command(config, load, partition, attempt);
        for input in inputs {
            cmd.arg("--input").arg(input);
        }
        if merge {
            cmd.arg("--merge");
        }
        Self::built(measure::run(&mut cmd)?)
    }

    /// `chpart build --input -` fed the Arrow IPC stream file `stream` through a pipe on its
    /// stdin, as a Spark task feeds it, with `[clickhouse_local] spool_chunk_mib` set to
    /// `spool_chunk_mib` (None: chpart's default). Its log includes the debug line that counts
    /// the spooled chunks ([`spooled_chunks`]).
    pub fn build_stream(
        &self,
        config: &Path,
        load: &str,
        partition: u32,
        attempt: &str,
        stream: &Path,
        spool_chunk_mib: Option<u64>,
    ) -> anyhow::Result<(Measured, ManifestSummary)> {
        let mut cmd = self.build_command(config, load, partition, attempt);
        cmd.args(["--input", "-"])
            .env("CHPART_LOG", "info,chpart_protocol::build=debug");
        if let Some(mib) = spool_chunk_mib {
            cmd.env("CHPART_CLICKHOUSE_LOCAL_SPOOL_CHUNK_MIB", mib.to_string());
        }
        Self::built(measure::run_fed(&mut cmd, Some(stream))?)
    }

    fn build_command(&self, config: &Path, load: &str, partition: u32, attempt: &str) -> Command {
        let mut cmd = self.command();
        cmd.arg("build").arg("--config").arg(config).args([
            "--load",
            load,
            "--partition",
            &partition.to_string(),
            "--attempt",
            attempt,
        ]);
        cmd
    }

    /// A finished build, checked, with the manifest it printed.
    fn built(run: Measured) -> anyhow::Result<(Measured, ManifestSummary)> {
        run.check()?;
        let summary = ManifestSummary::parse(&run.stdout_text())
            .with_context(|| format!("the manifest printed by {}", run.described))?;
        Ok((run, summary))
    }

    /// The `chpart commit` command of `load` with the winners in `winners` (JSON lines), every
    /// Spark partition `0..partitions` required, `--visibility` checked, summary as JSON.
    pub fn commit_command(
        &self,
        config: &Path,
        load: &str,
        winners: &Path,
        partitions: u32,
        visibility: &str,
    ) -> Command {
        let mut cmd = self.command();
        cmd.arg("commit")
            .arg("--config")
            .arg(config)
            .args(["--load", load, "--winners"])
            .arg(winners)
            .args([
                "--partitions",
                &partitions.to_string(),
                "--visibility",
                visibility,
                "--json",
            ]);
        cmd
    }
}

/// The number of spooled chunks from the debug line of an Arrow stream build's log
/// (`built from N spooled chunk(s) of at most about M MiB`); None if the log has no such line.
pub fn spooled_chunks(log: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains("spooled chunk(s)"))?;
    line.split_once("built from ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the benchmarks read from an attempt manifest.
#[derive(Debug, PartialEq, Eq)]
pub struct ManifestSummary {
    /// Parts in the manifest.
    pub parts: usize,
    /// Rows in all of them.
    pub rows: u64,
    /// Bytes of all files of all parts.
    pub bytes: u64,
    /// The manifest itself, one JSON line: what `collect()` hands `chpart commit`.
    pub line: String,
}

impl ManifestSummary {
    /// Reads the manifest line `chpart build` prints (the last non-empty line of stdout).
    pub fn parse(stdout: &str) -> anyhow::Result<ManifestSummary> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("chpart build printed no manifest")?;
        let manifest: serde_json::Value = serde_json::from_str(line).context("not JSON")?;
        // A build into a Distributed table prints a cluster manifest: one manifest per shard
        // under `shards` (`{"shards":[{"shard":1,"manifest":{"parts":[..]}}, ..]}`).
        let parts: Vec<&serde_json::Value> = match manifest["shards"].as_array() {
            Some(shards) => shards
                .iter()
                .map(|s| {
                    s["manifest"]["parts"]
                        .as_array()
                        .context("a shard without `parts`")
                })
                .collect::<anyhow::Result<Vec<_>>>()?
                .into_iter()
                .flatten()
                .collect(),
            None => manifest["parts"]
                .as_array()
                .context("no `parts` array")?
                .iter()
                .collect(),
        };
        let field = |part: &serde_json::Value, name: &str| {
            part[name]
                .as_u64()
                .with_context(|| format!("a part without a numeric `{name}`"))
        };
        let mut summary = ManifestSummary {
            parts: parts.len(),
            rows: 0,
            bytes: 0,
            line: line.trim().to_owned(),
        };
        for part in parts {
            summary.rows += field(part, "rows")?;
            // Every file chpart moved, as scp's figure counts them; bytes_on_disk leaves out a
            // few small ones.
            summary.bytes += match part["files"].as_array() {
                Some(files) => files
                    .iter()
                    .map(|f| field(f, "size"))
                    .sum::<anyhow::Result<u64>>()?,
                None => field(part, "bytes_on_disk")?,
            };
        }
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spooled_chunks_are_read_from_the_debug_line() {
        let log = "2026-12-02T23:00:00Z DEBUG built from 5 spooled chunk(s) of at most about \
                   256 MiB\n2026-12-02T23:00:01Z  INFO published 10 part(s)\n";
        assert_eq!(spooled_chunks(log), Some(5));
        assert_eq!(spooled_chunks("INFO published 10 part(s)"), None);
    }

    #[test]
    fn the_manifest_summary_adds_up_the_parts() {
        let manifest = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fixtures/manifests/valid/multi_partition.json"),
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        let one_line = serde_json::to_string(&value).unwrap();
        let stdout = format!("log line on stdout\n{one_line}\n\n");
        let summary = ManifestSummary::parse(&stdout).unwrap();
        let parts = value["parts"].as_array().unwrap();
        assert_eq!(summary.parts, parts.len());
        assert_eq!(
            summary.rows,
            parts
                .iter()
                .map(|p| p["rows"].as_u64().unwrap())
                .sum::<u64>()
        );
        assert_eq!(summary.line, one_line);
        // A cluster manifest (a build into a Distributed table) counts every shard's parts.
        let cluster = serde_json::json!({
            "format": "chpart-cluster-manifest",
            "shards": [{"shard": 1, "manifest": value}, {"shard": 2, "manifest": value}],
        });
        let both = ManifestSummary::parse(&cluster.to_string()).unwrap();
        assert_eq!(both.parts, 2 * summary.parts);
        assert_eq!(both.rows, 2 * summary.rows);
        assert!(ManifestSummary::parse("{\"shards\": [{\"shard\": 1}]}").is_err());
        assert!(ManifestSummary::parse("").is_err());
        assert!(ManifestSummary::parse("{\"parts\": [{\"rows\": 1}]}").is_err());
    }
}
