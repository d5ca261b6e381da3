//! chpart's integration tests: one binary (ripgrep-style), one module per area. Each test that
//! needs a real component (ClickHouse 26.9 engine, clickhouse-local, sshd) starts or shares it
//! through `chpart-testenv` and fails loudly when it is not installed.

mod build;
mod cleanup;
mod cli;
mod clock;
mod cluster;
mod commit;
mod crash;
mod crash_cluster;
mod disk_full;
mod disks;
mod distributed;
mod engines;
mod events;
mod faults;
mod grants;
mod launcher;
mod load;
mod overwrite;
mod recover;
mod replace;
mod s3;
mod smoke;
mod soak;
mod ssh;
