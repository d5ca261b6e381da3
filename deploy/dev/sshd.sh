#!/usr/bin/env bash
# Runs a private OpenSSH sshd on 127.0.0.1 for chpart's SFTP tests and local
# trials: its own host key, a per-directory client key, key-only login and the
# in-process SFTP server. Everything it makes lives in --dir, so several can run
# side by side on different ports without touching the system sshd. --listen
# ADDR puts it on another loopback address (any 127.x.y.z works on Linux), so
# each node of a test cluster can be a "host" of its own.
#
#   deploy/dev/sshd.sh start --dir DIR --port PORT [--listen ADDR] [--allow-user NAME ...]
#                        [--foreground [--stop-on-stdin-eof]]
#   deploy/dev/sshd.sh stop  --dir DIR
#
# start is idempotent: keys are made only when absent, and a daemon already
# running from DIR is left alone. --foreground execs sshd instead of detaching
# it, so a test harness owns the process (same pid) and can kill it even when
# a test panics. --stop-on-stdin-eof adds a watchdog that stops sshd when its
# stdin reaches EOF, so a harness holding the pipe leaves no daemon behind
# even if the whole test process is killed. Files written in DIR:
#   ssh_host_ed25519_key(.pub)  host key
#   client_key(.pub)            client key without passphrase (root or any
#                               allowed user logs in with it)
#   authorized_keys, known_hosts ("[ADDR]:PORT ssh-ed25519 ...", ADDR
#                               127.0.0.1 unless --listen),
#   sshd_config, sshd.pid, sshd.log
set -euo pipefail

SSHD=/usr/sbin/sshd

usage() {
    echo "usage: $0 start --dir DIR --port PORT [--listen ADDR] [--allow-user NAME ...] [--foreground [--stop-on-stdin-eof]]" >&2
    echo "       $0 stop --dir DIR" >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
dir=""
port=""
listen=127.0.0.1
foreground=0
stop_on_eof=0
allow_users=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --dir) dir=${2:?--dir needs a value}; shift 2 ;;
        --port) port=${2:?--port needs a value}; shift 2 ;;
        --listen) listen=${2:?--listen needs a value}; shift 2 ;;
        --allow-user) allow_users+=("${2:?--allow-user needs a value}"); shift 2 ;;
        --foreground) foreground=1; shift ;;
        --stop-on-stdin-eof) stop_on_eof=1; shift ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n $dir ]] || usage
if [[ $stop_on_eof == 1 && $foreground == 0 ]]; then
    echo "--stop-on-stdin-eof needs --foreground" >&2
    exit 2
fi

# sshd needs absolute paths: it re-executes itself per connection and resolves
# the config from there.
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pidfile=$dir/sshd.pid
log=$dir/sshd.log

running_pid() {
    [[ -f $pidfile ]] || return 1
    local pid
    pid=$(<"$pidfile")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

port_open() {
    (exec 3<>"/dev/tcp/$listen/$1") 2>/dev/null
}

stop() {
    local pid
    if ! pid=$(running_pid); then
        rm -f "$pidfile"
        echo "sshd in $dir is not running"
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    echo "sshd in $dir (pid $pid) stopped"
}

start() {
    [[ -n $port ]] || usage
    [[ $port =~ ^[0-9]+$ ]] || { echo "--port must be a number, got '$port'" >&2; exit 2; }
    if [[ ! -x $SSHD ]] || ! command -v ssh-keygen >/dev/null; then
        echo "sshd not found: run deploy/install.sh (installs openssh-server)" >&2
        exit 1
    fi
    if pid=$(running_pid); then
        if [[ $foreground == 1 ]]; then
            echo "sshd from $dir already runs as pid $pid; stop it before --foreground" >&2
            exit 1
        fi
        echo "sshd in $dir already running (pid $pid)"
        return 0
    fi

    # Allowed non-root users read authorized_keys as themselves (sshd drops to
    # the user to read it), so the directory must be traversable and the file
    # readable by them. Private keys stay 0600: only sshd and the client (root)
    # read them.
    chmod 0755 "$dir"
    if [[ ! -f $dir/ssh_host_ed25519_key ]]; then
        ssh-keygen -q -t ed25519 -N '' -C "chpart-test-host" -f "$dir/ssh_host_ed25519_key"
    fi
    if [[ ! -f $dir/client_key ]]; then
        ssh-keygen -q -t ed25519 -N '' -C "chpart-test-client" -f "$dir/client_key"
    fi
    install -m 0644 "$dir/client_key.pub" "$dir/authorized_keys"
    # The port may differ from an earlier start, so known_hosts and the config
    # are rewritten each time; the keys above are what must stay stable.
    printf '[%s]:%s %s\n' "$listen" "$port" "$(cut -d' ' -f1,2 "$dir/ssh_host_ed25519_key.pub")" \
        >"$dir/known_hosts"
    cat >"$dir/sshd_config" <<CONF
ListenAddress $listen
Port $port
HostKey $dir/ssh_host_ed25519_key
PidFile $pidfile
AuthorizedKeysFile $dir/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
AllowUsers root ${allow_users[*]}
LogLevel VERBOSE
CONF
    # Privilege separation directory; Debian creates it only via the service unit.
    mkdir -p -m 0755 /run/sshd
    "$SSHD" -t -f "$dir/sshd_config"

    if [[ $foreground == 1 ]]; then
        if [[ $stop_on_eof == 1 ]]; then
            # exec keeps this shell's pid, so $$ below is sshd's pid. A
            # background job would get /dev/null as stdin, hence fd 3.
            exec 3<&0
            ( while read -r _ <&3; do :; done; kill "$$" 2>/dev/null ) &
            exec 3<&-
        fi
        exec "$SSHD" -f "$dir/sshd_config" -D -e </dev/null
    fi

    rm -f "$pidfile"
    nohup "$SSHD" -f "$dir/sshd_config" -D -e >>"$log" 2>&1 </dev/null &
    local child=$!
    # sshd writes its pidfile only after it listens, so the pidfile plus an
    # accepted connection mean this daemon (not some other process) owns the port.
    for _ in $(seq 1 100); do
        if ! kill -0 "$child" 2>/dev/null; then
            break
        fi
        if [[ -f $pidfile ]] && port_open "$port"; then
            echo "sshd in $dir listening on $listen:$port (pid $child)"
            return 0
        fi
        sleep 0.1
    done
    echo "sshd in $dir did not come up on $listen:$port; last log lines:" >&2
    tail -n 20 "$log" >&2 || true
    kill "$child" 2>/dev/null || true
    exit 1
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
