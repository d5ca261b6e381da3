"""What runs in place of the real `chpart` for `chpart commit` while a mutant is active
(TEST CODE: mutation testing of the exactly-once protocol; stdlib only, started with -S).

The driver's `chpart_spark.writer._commit` is patched (see __init__.py) to run this stand-in
instead of the real binary, directly or behind the recording probe of the failure scenarios
(TESTPROBE_REAL points here then, so the probe's `before_commit` action, e.g. releasing a
zombie, still happens first). Every command other than `commit` is passed to the real binary
unchanged. For `commit`:

- the selection mutants (highest-attempt, latest-manifest, all-published) list the manifests
  on disk at that moment, `<staging root>/<load>/<attempt>/manifest.json`, replace the winners
  file's content by their selection and then exec the real `chpart commit` with the same argv;
- naive-attach never runs `chpart commit`: it sends `ALTER TABLE <publish table> ATTACH PART`
  for every part of every manifest on disk that still waits in that table's detached/, then
  (visibility partition) moves every partition of the shadow table into the target (MOVE
  PARTITION for append, REPLACE PARTITION for replace), and prints a summary made of what
  collect() returned (the winners file), as a pipeline that trusts Spark's counts does.

Environment: TESTMUTANT_NAME (the mutant), TESTMUTANT_REAL (the real chpart binary),
TESTMUTANT_LOG (optional: a file to which each decision is appended as one JSON line).
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

NAMES = ("highest-attempt", "latest-manifest", "all-published", "naive-attach")
SELECTIONS = ("highest-attempt", "latest-manifest", "all-published")


def _arg(argv, name):
    for i, a in enumerate(argv[:-1]):
        if a == name:
            return argv[i + 1]
    return None


def log_event(record):
    path = os.environ.get("TESTMUTANT_LOG")
    if not path:
        return
    record = {"time": time.time(), "pid": os.getpid(), "mutant": os.environ.get("TESTMUTANT_NAME"), **record}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def load_dir(manifest_lines, config=None, load=None):
    """`<staging root>/<load>`: the parent of any manifest's staging_dir, else from the config."""
    for line in manifest_lines:
        staging = json.loads(line).get("target", {}).get("staging_dir")
        if staging:
            return os.path.dirname(staging.rstrip("/"))
    import tomllib

    with open(config, "rb") as f:
        return os.path.join(tomllib.load(f)["staging"]["root"], load)


def on_disk(directory):
    """Every completed attempt of the load: [(manifest JSON line, parsed, mtime_ns)], oldest first."""
    out = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in names:
        path = os.path.join(directory, name, "manifest.json")
        try:
            with open(path) as f:
                text = f.read().strip()
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            continue
        out.append((text, json.loads(text), mtime))
    out.sort(key=lambda t: (t[2], t[1]["attempt"]["id"]))
    return out


def select(mutant, directory):
    """The mutant's winners (manifest JSON lines) from what is on disk under `directory`."""
    found = on_disk(directory)
    if mutant == "all-published":
        return [text for text, m, _ in sorted(found, key=lambda t: (t[1]["attempt"]["partition"], t[2]))]
    best = {}
    for text, m, mtime in found:
        a = m["attempt"]
        number = a.get("attempt_number")
        if mutant == "highest-attempt":
            key = (-1 if number is None else number, mtime)
        elif mutant == "latest-manifest":
            key = (mtime,)
        else:
            raise ValueError(f"not a selection mutant: {mutant}")
        p = a["partition"]
        if p not in best or key >= best[p][0]:
            best[p] = (key, text)
    return [best[p][1] for p in sorted(best)]


def load_of(lines):
    return json.loads(lines[0]).get("load") if lines else None


def describe(lines):
    out = []
    for line in lines:
        a = json.loads(line)["attempt"]
        out.append([a["partition"], a["id"], a.get("attempt_number"), a.get("stage")])
    return out


def write_lines(path, lines):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".mutant-winners-", dir=directory)
    with os.fdopen(fd, "w") as f:
        for line in lines:
            f.write(line.strip() + "\n")
    os.replace(tmp, path)


def read_lines(path):
    with open(path) as f:
        return [line for line in f.read().splitlines() if line.strip()]


# --- naive-attach --------------------------------------------------------------------------

def _quote(name):
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _table(db_dot_table):
    db, table = db_dot_table.split(".", 1)
    return f"{_quote(db)}.{_quote(table)}"


def _literal(value):
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


class Server:
    def __init__(self, url):
        self.url = url.rstrip("/")

    def query(self, sql):
        request = urllib.request.Request(self.url + "/", data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"ClickHouse error for {sql!r}: {e.read().decode(errors='replace')}") from None

    def column(self, sql):
        return [line for line in self.query(sql + " FORMAT TSV").splitlines() if line]


def naive_commit(real, argv):
    """Attach every published part of the load (no winners, no ledger); see the module doc."""
    import tomllib

    config, load, winners_path = _arg(argv, "--config"), _arg(argv, "--load"), _arg(argv, "--winners")
    with open(config, "rb") as f:
        server = Server(tomllib.load(f)["clickhouse"]["url"])
    status = subprocess.run([real, "status", "--config", config, "--load", load, "--json"], capture_output=True,
                            text=True, env={**os.environ, "NO_COLOR": "1"})
    if status.returncode != 0:
        sys.stderr.write(status.stderr)
        return status.returncode
    [entry] = [e for e in json.loads(status.stdout.strip().splitlines()[-1]) if e.get("load") == load]
    target, mode = entry["table"], entry.get("mode") or "append"
    collected = read_lines(winners_path)
    found = on_disk(load_dir(collected, config, load))

    crash = os.environ.get("CHPART_TEST_CRASH_AT", "")
    crash_after = None
    if crash.startswith("after-attach"):
        crash_after = int(crash.split(":", 1)[1]) if ":" in crash else 1

    attached, publish_tables = [], []
    for _, m, _ in found:
        db, table = m["target"]["database"], m["target"]["table"]
        publish = f"{db}.{table}"
        if publish not in publish_tables:
            publish_tables.append(publish)
        waiting = set(server.column(
            f"SELECT name FROM system.detached_parts WHERE database = {_literal(db)} AND table = {_literal(table)}"))
        for part in m["parts"]:
            if part["name"] not in waiting:
                continue
            server.query(f"ALTER TABLE {_table(publish)} ATTACH PART {_literal(part['name'])}")
            attached.append([m["attempt"]["partition"], m["attempt"]["id"], part["name"]])
            log_event({"event": "naive-attach", "table": publish, "part": part["name"], "attempt": m["attempt"]["id"]})
            if crash_after is not None and len(attached) == crash_after:
                # The fault the test injects into `chpart commit` (CHPART_TEST_CRASH_AT), at the
                # same point: the driver dies right after its N-th ATTACH returned.
                sys.stderr.write(f"chpart-mutant naive-attach: CHPART_TEST_CRASH_AT={crash}: aborting here "
                                 "(test fault injection)\n")
                sys.stderr.flush()
                os.abort()
    moved = []
    for publish in publish_tables:
        if publish == target:
            continue
        db, table = publish.split(".", 1)
        ids = server.column(f"SELECT DISTINCT partition_id FROM system.parts WHERE database = {_literal(db)} "
                            f"AND table = {_literal(table)} AND active ORDER BY partition_id")
        for pid in ids:
            if mode == "replace":
                server.query(f"ALTER TABLE {_table(target)} REPLACE PARTITION ID {_literal(pid)} FROM {_table(publish)}")
            else:
                server.query(f"ALTER TABLE {_table(publish)} MOVE PARTITION ID {_literal(pid)} TO TABLE {_table(target)}")
            moved.append(pid)
    manifests = [json.loads(line) for line in collected]
    summary = {
        "load": load, "table": target, "mode": mode, "visibility": entry.get("visibility"),
        "partitions": len(moved) if moved else len({p["partition_id"] for m in manifests for p in m["parts"]}),
        "parts": sum(len(m["parts"]) for m in manifests),
        "rows": sum(p["rows"] for m in manifests for p in m["parts"]),
        "winners": [[m["attempt"]["partition"], m["attempt"]["id"]] for m in manifests],
    }
    log_event({"event": "naive-commit", "load": load, "attached": attached, "moved_partitions": moved,
               "collected": describe(collected), "on_disk": describe([t for t, _, _ in found])})
    print(json.dumps(summary))
    return 0


def main(argv):
    real = os.environ["TESTMUTANT_REAL"]
    mutant = os.environ["TESTMUTANT_NAME"]
    if not argv or argv[0] != "commit":
        os.execv(real, [real] + list(argv))
    if mutant == "naive-attach":
        return naive_commit(real, argv)
    winners_path = _arg(argv, "--winners")
    collected = read_lines(winners_path)
    chosen = select(mutant, load_dir(collected, _arg(argv, "--config"), _arg(argv, "--load")))
    write_lines(winners_path, chosen)
    log_event({"event": "commit-selection", "load": _arg(argv, "--load"), "before": describe(collected),
               "after": describe(chosen), "changed": [l.strip() for l in collected] != chosen})
    sys.stderr.write(f"chpart-mutant {mutant}: winners file {winners_path} rewritten from disk: "
                     f"{[(p, a) for p, a, _, _ in describe(chosen)]}\n")
    sys.stderr.flush()
    os.execv(real, [real] + list(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
