"""Runs the ClickHouse 26.9 engine of PyPI `chdb-core` as an HTTP/TCP server on loopback.

chdb's `connect()` cannot listen, but its module-level `_chdb.query(sql, fmt, path=DIR)` runs
clickhouse-local's full LocalServer, which reads `config.xml` from the current directory and can
`SYSTEM START LISTEN HTTP/TCP`. The server then lives as long as one blocking query: a read of a
named pipe (`start`/`stop`) or of stdin (`serve --stop-on-stdin-eof`, used by the test harness so
that the server dies with the test process however it ends). This is undocumented chdb
behaviour: `start` waits for `/ping` and treats no answer as a failed start, and the project keeps
a smoke test of start, ping, stop and restart so a chdb upgrade that breaks it fails loudly.

    chdb_server.py start  --data DIR --run-dir RUN --http-port P --tcp-port Q [--user NAME]
    chdb_server.py stop   --run-dir RUN
    chdb_server.py status --run-dir RUN
    chdb_server.py serve  --data DIR --run-dir RUN --http-port P --tcp-port Q [--user NAME] [--stop-on-stdin-eof]

With --user the data and run directories are chowned to that user and the server drops to it
after loading the engine, so parts in detached/ must be owned by that user to attach (as with a
packaged clickhouse-server running as `clickhouse`).
"""

import argparse
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def ping(port, timeout=0.5):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=timeout) as r:
            return r.read().strip() == b"Ok."
    except OSError:
        return False


def port_in_use(port):
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def chown_tree(path, uid, gid):
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def write_config(run_dir, http_port, tcp_port):
    with open(os.path.join(run_dir, "config.xml"), "w") as f:
        f.write(
            "<clickhouse>\n"
            "  <listen_host>127.0.0.1</listen_host>\n"
            f"  <http_port>{http_port}</http_port>\n"
            f"  <tcp_port>{tcp_port}</tcp_port>\n"
            "</clickhouse>\n"
        )


def serve(args):
    data, run_dir = os.path.abspath(args.data), os.path.abspath(args.run_dir)
    os.makedirs(data, exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)
    write_config(run_dir, args.http_port, args.tcp_port)
    block_on = "/dev/stdin" if args.stop_on_stdin_eof else os.path.join(run_dir, "stop.fifo")
    if not args.stop_on_stdin_eof and not os.path.exists(block_on):
        os.mkfifo(block_on, 0o600)
    # Load the engine while still root: after the drop below the user may not be able to read
    # the virtual environment (e.g. a project checked out under /root).
    import chdb._chdb as engine

    if args.user:
        user = pwd.getpwnam(args.user)
        for path in (data, run_dir):
            chown_tree(path, user.pw_uid, user.pw_gid)
        if args.stop_on_stdin_eof:
            # The server reopens /dev/stdin after the drop; the pipe must be the user's to open.
            os.fchown(0, user.pw_uid, user.pw_gid)
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
        os.environ["HOME"] = data
    os.chdir(run_dir)
    with open(os.path.join(run_dir, "server.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    sql = (
        "SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; "
        f"SELECT count() FROM file('{block_on}', 'LineAsString')"
    )
    try:
        engine.query(sql, "TabSeparated", path=data)
    finally:
        try:
            os.unlink(os.path.join(run_dir, "server.pid"))
        except OSError:
            pass
    print("chdb server stopped", file=sys.stderr)
    return 0


def read_pid(run_dir):
    try:
        with open(os.path.join(run_dir, "server.pid")) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def start(args):
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    if read_pid(run_dir):
        if ping(args.http_port):
            print(f"already running (pid {read_pid(run_dir)}) on http port {args.http_port}")
            return 0
        sys.exit(f"a server from {run_dir} is running (pid {read_pid(run_dir)}) but does not answer /ping on port {args.http_port}")
    for port in (args.http_port, args.tcp_port):
        if port_in_use(port):
            sys.exit(f"port {port} on 127.0.0.1 is already in use")
    log_path = os.path.join(run_dir, "server.log")
    cmd = [sys.executable, os.path.abspath(__file__), "serve", "--data", args.data, "--run-dir", run_dir,
           "--http-port", str(args.http_port), "--tcp-port", str(args.tcp_port)]
    if args.user:
        cmd += ["--user", args.user]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + args.timeout_secs
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with status {proc.returncode} before answering /ping; log {log_path}:\n{tail(log_path)}")
        if ping(args.http_port):
            print(f"ClickHouse 26.9 (chdb) listening on 127.0.0.1: http {args.http_port}, tcp {args.tcp_port}; "
                  f"pid {proc.pid}; data {os.path.abspath(args.data)}")
            return 0
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"server did not answer /ping on 127.0.0.1:{args.http_port} within {args.timeout_secs}s; log {log_path}:\n{tail(log_path)}")


def stop(args):
    run_dir = os.path.abspath(args.run_dir)
    pid = read_pid(run_dir)
    if pid is None:
        print("not running")
        return 0
    try:  # a line then EOF on the pipe ends the blocking query: a clean shutdown
        fd = os.open(os.path.join(run_dir, "stop.fifo"), os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"stop\n")
        os.close(fd)
    except OSError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout_secs
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            print(f"stopped (pid {pid})")
            return 0
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    print(f"killed (pid {pid}) after {args.timeout_secs}s")
    return 0


def status(args):
    pid = read_pid(os.path.abspath(args.run_dir))
    print(f"running (pid {pid})" if pid else "not running")
    return 0 if pid else 3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("start", "serve"):
        s = sub.add_parser(name)
        s.add_argument("--data", required=True, help="data directory (metadata/, store/)")
        s.add_argument("--run-dir", required=True, help="directory for config.xml, pid file, log, stop pipe")
        s.add_argument("--http-port", type=int, required=True)
        s.add_argument("--tcp-port", type=int, required=True)
        s.add_argument("--user", help="run as this OS user (owns the data directory)")
        if name == "start":
            s.add_argument("--timeout-secs", type=float, default=60)
        else:
            s.add_argument("--stop-on-stdin-eof", action="store_true")
    for name in ("stop", "status"):
        s = sub.add_parser(name)
        s.add_argument("--run-dir", required=True)
        s.add_argument("--timeout-secs", type=float, default=30)
    args = p.parse_args()
    return {"start": start, "serve": serve, "stop": stop, "status": status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
