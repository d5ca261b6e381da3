#!/usr/bin/env bash
# A journaled ext4 filesystem for the benchmarks' servers, on a loop device.
#
# This machine kind's root filesystem is ext4 *without a journal* (/proc/fs/jbd2 lists no
# journal for it). On such a filesystem the kernel refuses to reuse an inode deleted in the
# last few seconds and scans for one each time a file is created (find_inode_bit ->
# recently_deleted in the kernel's profile), so on a disk where tests create and delete many
# files, every statement that creates files on the server (MOVE PARTITION, INSERT, the
# ledger's INSERTs) pays several times what it pays on a journaled filesystem, the kind a
# ClickHouse data disk is. Benchmarks started with TMPDIR on this filesystem put their
# servers' data there:
#
#   dir="$(bash deploy/dev/bench-disk.sh start)"   # prints the mount point (default /mnt/chpart-bench)
#   TMPDIR="$dir" target/release/chpart-bench commit
#   bash deploy/dev/bench-disk.sh stop
#
#   deploy/dev/bench-disk.sh start [--dir DIR] [--image FILE] [--size SIZE]
#   deploy/dev/bench-disk.sh stop  [--dir DIR] [--image FILE]
#
# start is idempotent (a filesystem already mounted at DIR is left alone). The image is a
# sparse file (default /var/tmp/chpart-bench-ext4.img, 16G); stop unmounts and removes it.
# Needs root (mount -o loop).
set -euo pipefail

usage() {
    echo "usage: $0 start [--dir DIR] [--image FILE] [--size SIZE]" >&2
    echo "       $0 stop [--dir DIR] [--image FILE]" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
dir=/mnt/chpart-bench
image=/var/tmp/chpart-bench-ext4.img
size=16G
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir=$2; shift 2 ;;
        --image) image=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        *) usage ;;
    esac
done

case "$cmd" in
    start)
        if mountpoint -q "$dir"; then
            echo "$dir"
            exit 0
        fi
        [[ $(id -u) -eq 0 ]] || { echo "bench-disk: mounting a loop device needs root" >&2; exit 1; }
        mkdir -p "$dir" "$(dirname "$image")"
        if [[ ! -f "$image" ]]; then
            truncate -s "$size" "$image"
            # -O has_journal is mke2fs's default for ext4; said here because it is the point.
            mkfs.ext4 -q -O has_journal -E lazy_itable_init=0,lazy_journal_init=0 "$image"
        fi
        mount -o loop "$image" "$dir"
        # Servers may run as the clickhouse user; scratch directories are made under here.
        chmod 1777 "$dir"
        echo "$dir"
        ;;
    stop)
        if mountpoint -q "$dir"; then
            umount "$dir"
        fi
        rm -f "$image"
        ;;
    *) usage ;;
esac
