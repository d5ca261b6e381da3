"""Runs the ClickHouse 26.9 engine of PyPI `chdb-core` as an HTTP/TCP server on loopback.

chdb's `connect()` cannot listen, but its module-level `_chdb.query(sql, fmt, path=DIR)` runs
clickhouse-local's full LocalServer, which reads `config.xml` from the current directory and can
`SYSTEM START LISTEN HTTP/TCP`. The server then lives as long as one blocking query: a read of a
named pipe (`start`/`stop`) or of stdin (`serve --stop-on-stdin-eof`, used by the test harness so
that the server dies with the test process however it ends). This is undocumented chdb
behaviour: `start` waits for `/ping` and treats no answer as a failed start, and the project keeps
a smoke test of start, ping, stop and restart so a chdb upgrade that breaks it fails loudly.

    chdb_server.py start  --data DIR --run-dir RUN --http-port P --tcp-port Q [--user NAME]
                          [--listen-host ADDR] [--config-extra FILE]
    chdb_server.py stop   --run-dir RUN
    chdb_server.py status --run-dir RUN
    chdb_server.py serve  --data DIR --run-dir RUN --http-port P --tcp-port Q [--user NAME]
                          [--listen-host ADDR] [--config-extra FILE] [--stop-on-stdin-eof]

With --user the data and run directories are chowned to that user and the server drops to it
after loading the engine, so parts in detached/ must be owned by that user to attach (as with a
packaged clickhouse-server running as `clickhouse`).

--listen-host ADDR (default 127.0.0.1) is the one address the server listens on, pings and
port checks use. Any 127.x.y.z is a loopback address on Linux without setup, so several servers
can each be a "host" of their own (a test cluster: one address per shard). --config-extra FILE
is an XML fragment whose elements go inside `<clickhouse>` of the generated config.xml
(`<remote_servers>`, `<macros>`, `<storage_configuration>`, ...); the fragment may also be
wrapped in a `<clickhouse>` element itself. It is checked to be well-formed before the start,
and copied into config.xml at each start (this engine refuses SYSTEM RELOAD CONFIG: a config
change needs a restart).
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
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_HOST = "127.0.0.1"


# No proxy from the environment: the server is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ping(host, port, timeout=0.5):
    try:
        with _OPENER.open(f"http://{host}:{port}/ping", timeout=timeout) as r:
            return r.read().strip() == b"Ok."
    except OSError:
        return False


def port_in_use(host, port):
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def chown_tree(path, uid, gid):
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def read_config_extra(path):
    """The elements of the --config-extra fragment, as XML text; exits on a malformed file."""
    if not path:
        return ""
    try:
        with open(path) as f:
            text = f.read()
        root = ET.fromstring(f"<fragment>{text}</fragment>")
    except (OSError, ET.ParseError) as e:
        sys.exit(f"--config-extra {path}: {e}")
    elements = list(root)
    if len(elements) == 1 and elements[0].tag == "clickhouse":
        elements = list(elements[0])
    return "".join("  " + ET.tostring(e, encoding="unicode").strip() + "\n" for e in elements)


def write_config(run_dir, listen_host, http_port, tcp_port, extra=""):
    with open(os.path.join(run_dir, "config.xml"), "w") as f:
        f.write(
            "<clickhouse>\n"
            f"  <listen_host>{listen_host}</listen_host>\n"
            f"  <http_port>{http_port}</http_port>\n"
            f"  <tcp_port>{tcp_port}</tcp_port>\n"
            f"{extra}"
            "</clickhouse>\n"
        )


def serve(args):
    data, run_dir = os.path.abspath(args.data), os.path.abspath(args.run_dir)
    os.makedirs(data, exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)
    write_config(run_dir, args.listen_host, args.http_port, args.tcp_port, read_config_extra(args.config_extra))
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


def running(pid):
    """Whether process `pid` is running. One that has exited counts as gone before it is reaped:
    it holds no port, lock or file any more, and a server whose `start` has exited is reaped by
    whatever adopted it (init), which on the test machines takes 1.5-2 s after the exit."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def read_pid(run_dir):
    try:
        with open(os.path.join(run_dir, "server.pid")) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if running(pid) else None


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def start(args):
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    host = args.listen_host
    if read_pid(run_dir):
        if ping(host, args.http_port):
            print(f"already running (pid {read_pid(run_dir)}) on http port {args.http_port}")
            return 0
        sys.exit(f"a server from {run_dir} is running (pid {read_pid(run_dir)}) but does not answer /ping on {host}:{args.http_port}")
    for port in (args.http_port, args.tcp_port):
        if port_in_use(host, port):
            sys.exit(f"port {port} on {host} is already in use")
    read_config_extra(args.config_extra)  # fail here, not in the background server
    log_path = os.path.join(run_dir, "server.log")
    cmd = [sys.executable, os.path.abspath(__file__), "serve", "--data", args.data, "--run-dir", run_dir,
           "--http-port", str(args.http_port), "--tcp-port", str(args.tcp_port)]
    if args.user:
        cmd += ["--user", args.user]
    if host != DEFAULT_HOST:
        cmd += ["--listen-host", host]
    if args.config_extra:
        cmd += ["--config-extra", os.path.abspath(args.config_extra)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + args.timeout_secs
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with status {proc.returncode} before answering /ping; log {log_path}:\n{tail(log_path)}")
        if ping(host, args.http_port):
            print(f"ClickHouse 26.9 (chdb) listening on {host}: http {args.http_port}, tcp {args.tcp_port}; "
                  f"pid {proc.pid}; data {os.path.abspath(args.data)}")
            return 0
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"server did not answer /ping on {host}:{args.http_port} within {args.timeout_secs}s; log {log_path}:\n{tail(log_path)}")


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
        if not running(pid):
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
        s.add_argument("--listen-host", default=DEFAULT_HOST,
                       help="the address to listen on, e.g. 127.0.10.1 (default %(default)s)")
        s.add_argument("--config-extra", help="XML file whose elements go inside <clickhouse> of config.xml")
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
