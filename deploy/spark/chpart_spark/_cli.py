"""Running the `chpart` binary and turning its exit status into exceptions."""

import collections
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import threading

#: What the documented exit codes mean (README "Exit codes").
EXIT_MEANINGS = {
    2: "usage or configuration error",
    3: "retryable failure",
    4: "permanent failure",
    5: "the load is no longer open: this attempt was fenced",
}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
STDERR_TAIL_LINES = 40


class ChpartError(RuntimeError):
    """A `chpart` command exited with a non-zero status.

    Attributes: ``command`` (``build``, ``commit``, ...), ``exit_code`` (negative: killed by
    that signal), ``stderr_tail`` (the last lines chpart wrote to stderr), ``argv``.
    The message names the command, the exit code and its meaning, and the stderr tail, so a
    failed Spark task shows it in the driver's exception and in the Spark UI.
    """

    def __init__(self, command, exit_code, stderr_tail, argv=(), context=""):
        self.command = command
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail
        self.argv = list(argv)
        self.context = context
        super().__init__(self._message())

    @property
    def retryable(self):
        """True for exit code 3 (network, server busy, timeouts): retrying may help."""
        return self.exit_code == 3

    @property
    def fenced(self):
        """True for exit code 5: the load is committed or aborted."""
        return self.exit_code == 5

    def _message(self):
        if self.exit_code is not None and self.exit_code < 0:
            meaning = f"killed by signal {-self.exit_code}"
        else:
            meaning = EXIT_MEANINGS.get(self.exit_code, "unexpected exit code")
        where = f" ({self.context})" if self.context else ""
        tail = self.stderr_tail.rstrip() or "(no stderr output)"
        return f"chpart {self.command}{where} exited with code {self.exit_code} ({meaning}); stderr tail:\n{tail}"

    def __reduce__(self):  # picklable with its fields (e.g. across processes)
        return (self.__class__, (self.command, self.exit_code, self.stderr_tail, self.argv, self.context))


class CommitError(ChpartError):
    """`chpart commit` failed. The winners file is kept at ``winners_path``: re-running the
    commit (``chpart commit ... --winners <winners_path>``, or `write()` with the same
    ``winners_path``) finishes the load exactly once. The load is *not* aborted: a commit
    may already have made rows visible, and it is resumable."""

    def __init__(self, command, exit_code, stderr_tail, argv=(), context="", winners_path=None, resume_hint=""):
        self.winners_path = winners_path
        self.resume_hint = resume_hint
        super().__init__(command, exit_code, stderr_tail, argv, context)

    def _message(self):
        text = super()._message()
        if self.winners_path:
            text += (f"\nThe winners are kept in {self.winners_path}; finish the load with:\n  {self.resume_hint}"
                     "\n(once `chpart status --load` shows its plan, `chpart commit --load` alone finishes it on any"
                     " machine, without the file)")
        return text

    def __reduce__(self):
        return (
            self.__class__,
            (self.command, self.exit_code, self.stderr_tail, self.argv, self.context, self.winners_path, self.resume_hint),
        )


#: The chpart binary a chpart_spark wheel carries (deploy/spark/build-wheel.sh puts the portable
#: build there, with its sha256 in `chpart.sha256` beside it); an editable install from a
#: checkout has none.
PACKAGE_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "chpart")
_checked = {}  # (path, size, mtime) -> sha256 of a package binary this process has hashed


def resolve_binary(chpart=None):
    """The chpart to run: ``chpart`` if given, else $CHPART_BIN, else the package's own binary
    (`PACKAGE_BINARY`, when this install carries one), else `chpart` on PATH: the same order as
    the JVM connector's (its option `chpart`, $CHPART_BIN, the jar's binary, PATH).

    A path-like name becomes absolute (tasks run in other working directories); a bare name is
    looked up on PATH here, and kept as a name if not found (executors may have it on their
    PATH even if the driver does not)."""
    named = str(chpart) if chpart else os.environ.get("CHPART_BIN")
    if not named:
        if os.path.exists(PACKAGE_BINARY):
            return PACKAGE_BINARY
        named = "chpart"
    if os.sep in named:
        return os.path.abspath(named)
    found = shutil.which(named)
    return found or named


def package_binary_sha256():
    """The sha256 recorded for the package's binary when the wheel was built, or None."""
    try:
        with open(PACKAGE_BINARY + ".sha256") as f:
            return f.read().strip().lower()
    except FileNotFoundError:
        return None


def checked_package_binary(expected_sha256=None, context=""):
    """`PACKAGE_BINARY` after checking that its sha256 is the one recorded in the wheel (and
    ``expected_sha256``, the driver's, when given: an executor must run the driver's binary).
    Hashed once per process while the file's size and modification time stay the same. A
    ChpartError (exit 127) naming the host and the path otherwise."""
    host = socket.gethostname()
    recorded = package_binary_sha256()
    if recorded is None or not os.path.exists(PACKAGE_BINARY):
        raise ChpartError("build", 127, f"the driver runs chpart_spark's own chpart binary (sha256 {expected_sha256}), "
                          f"but chpart_spark on host {host} ({PACKAGE_BINARY}) carries none: install the same "
                          "chpart_spark wheel there (or ship its venv with --archives), or pass chpart=",
                          [PACKAGE_BINARY], context)
    if expected_sha256 is not None and recorded != expected_sha256:
        raise ChpartError("build", 127, f"chpart_spark on host {host} carries another chpart binary (sha256 {recorded}) "
                          f"than the driver's (sha256 {expected_sha256}): install the driver's chpart_spark there",
                          [PACKAGE_BINARY], context)
    st = os.stat(PACKAGE_BINARY)
    key = (PACKAGE_BINARY, st.st_size, st.st_mtime_ns)
    actual = _checked.get(key)
    if actual is None:
        digest = hashlib.sha256()
        with open(PACKAGE_BINARY, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        actual = digest.hexdigest()
        _checked[key] = actual
    if actual != recorded:
        raise ChpartError("build", 127, f"{PACKAGE_BINARY} on host {host} has sha256 {actual}, the wheel recorded "
                          f"{recorded}: the file was changed after it was installed; reinstall chpart_spark",
                          [PACKAGE_BINARY], context)
    return PACKAGE_BINARY


def child_env(extra_env):
    env = dict(os.environ)
    env["NO_COLOR"] = "1"  # plain log lines on stderr (they end up in exception messages)
    if extra_env:
        env.update({str(k): str(v) for k, v in extra_env.items()})
    return env


class StderrTail:
    """Drains a pipe on a thread (so the child never blocks on a full pipe) and keeps the
    last lines, without terminal escapes."""

    def __init__(self, pipe, lines=STDERR_TAIL_LINES):
        self._lines = collections.deque(maxlen=lines)
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe):
        for raw in iter(pipe.readline, b""):
            self._lines.append(_ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n"))
        pipe.close()

    def text(self, join_timeout=10):
        self._thread.join(join_timeout)
        return "\n".join(self._lines)


class StdoutCollector:
    def __init__(self, pipe):
        self._chunks = []
        self._thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self._thread.start()

    def _drain(self, pipe):
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            self._chunks.append(chunk)
        pipe.close()

    def text(self, join_timeout=10):
        self._thread.join(join_timeout)
        return b"".join(self._chunks).decode("utf-8", "replace")


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


#: chpart's SECRET_KEY_PATTERN (crates/config): names of keys that would hold a secret. A test
#: keeps this copy equal to it.
SECRET_KEY_PATTERN = r"(?i)secret|password(?!_file|_env)|token|access.?key|private.?key"
_SECRET = re.compile(SECRET_KEY_PATTERN)

#: Where secrets go instead of Spark conf or options (which Spark shows in its UI and event log).
SECRET_ALTERNATIVES = (
    "Spark shows conf and options in its UI and event log, so chpart takes no secret there. Give the password as a "
    "file shipped with --files (clickhouse.password_file = pw.txt: a relative path resolves in each executor's "
    "working directory, and on the driver in its working directory or among SparkFiles), as an executor environment "
    "variable (spark.executorEnv.CH_PASSWORD=... and clickhouse.password_env = CH_PASSWORD; the driver needs it in "
    "its own environment too), or as CHPART_CLICKHOUSE_PASSWORD in the environment; SSH keys and known_hosts are "
    "files shipped with --files (ssh.identity_file, ssh.known_hosts)")

#: The variable every chpart run gets the resolved config document in.
CONFIG_TOML_ENV = "CHPART_CONFIG_TOML"
#: Spark conf keys of chpart config keys: spark.chpart.<section>.<key>.
CONF_PREFIX = "spark.chpart."
#: Keys naming a file that a task reads from its working directory when relative.
FILE_KEYS = ("clickhouse.password_file", "ssh.identity_file", "ssh.known_hosts")


def looks_secret(key):
    return _SECRET.search(key) is not None


class Resolved:
    """A config resolved on the driver by `chpart config`: the TOML document every run gets in
    CHPART_CONFIG_TOML (no secret in it; relative paths kept), and the working directory of the
    driver's runs (`driver_dir`; tasks run in their own)."""

    def __init__(self, toml, driver_dir):
        self.toml = toml
        self.driver_dir = driver_dir

    def __repr__(self):
        return f"Resolved(driver_dir={self.driver_dir!r})"


def settings_toml(settings):
    """Dotted config keys as a TOML document (each segment quoted); a value that reads as an
    integer or a boolean is one, as chpart reads CHPART_<SECTION>_<KEY> variables."""
    def quote(text):
        return json.dumps(str(text), ensure_ascii=False)

    def value(v):
        v = str(v)
        if re.fullmatch(r"[+-]?[0-9]{1,18}", v) or v in ("true", "false"):
            return v
        return quote(v)

    return "".join(".".join(quote(seg) for seg in key.split(".")) + " = " + value(v) + "\n"
                   for key, v in sorted(settings.items()))


def driver_dir(settings):
    """The driver's working directory, unless a relative file key of `settings` is missing there
    and present among the files Spark fetched for the driver (SparkFiles, e.g. --files)."""
    cwd = os.getcwd()
    for key in FILE_KEYS:
        value = settings.get(key)
        if value is None or os.path.isabs(value) or os.path.exists(os.path.join(cwd, value)):
            continue
        try:
            from pyspark import SparkFiles
            root = SparkFiles.getRootDirectory()
        except Exception:  # no SparkContext: not in a Spark driver
            return cwd
        if root and os.path.exists(os.path.join(root, value)):
            return root
    return cwd


def resolve_config(chpart, config, settings, origins, extra_env=None):
    """Runs `chpart config --toml` on the driver with the config file `config` (or None) and the
    dotted `settings` (in CHPART_CONFIG_TOML, merged over the file); a Resolved. `origins` says
    where each setting was given, for the message when chpart refuses one."""
    where = driver_dir(settings)
    env = dict(extra_env or {})
    if settings:
        env[CONFIG_TOML_ENV] = settings_toml(settings)
    args = ["--toml"] + (["--config", str(config)] if config is not None else [])
    try:
        out, _ = run(chpart, "config", args, None, env, context="resolving the chpart config", cwd=where)
    except ChpartError as e:
        given = [f"{key} was given as {origin}" for key, origin in sorted(origins.items())
                 if re.search(r"(^|[\s(])" + re.escape(key) + r"([\s,)]|$)", e.stderr_tail)]
        e.stderr_tail += ("\n(config keys are Spark conf spark.chpart.<section>.<key> or write() options "
                          "{'<section>.<key>': ...})" + "".join("\n" + g for g in given))
        e.args = (e._message(),)
        raise
    return Resolved(out, where)


def run(chpart, command, args, config, extra_env=None, context="", timeout=None, cwd=None):
    """Runs `chpart <command> <args...>` with `config`: a Resolved (its document in
    CHPART_CONFIG_TOML, in its driver directory), a config file path (`--config`), or None;
    returns (stdout, stderr). Raises ChpartError on a non-zero exit."""
    env = child_env(extra_env)
    flag = []
    if isinstance(config, Resolved):
        env.pop("CHPART_CONFIG", None)
        env[CONFIG_TOML_ENV] = config.toml
        cwd = cwd or config.driver_dir
    elif config is not None:
        flag = ["--config", str(config)]
    argv = [chpart, command, *flag, *[str(a) for a in args]]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout, cwd=cwd)
    except FileNotFoundError as e:
        raise ChpartError(command, 127, f"cannot run {chpart!r}: {e}", argv, context) from None
    stderr = _ANSI.sub("", proc.stderr.decode("utf-8", "replace"))
    if proc.returncode != 0:
        tail = "\n".join(stderr.splitlines()[-STDERR_TAIL_LINES:])
        raise ChpartError(command, proc.returncode, tail, argv, context)
    return proc.stdout.decode("utf-8", "replace"), stderr


def run_json(chpart, command, args, config, extra_env=None, context="", timeout=None):
    """`run` with `--json`: the last stdout line parsed as JSON."""
    out, _ = run(chpart, command, [*args, "--json"], config, extra_env, context, timeout)
    line = last_line(out)
    try:
        return json.loads(line)
    except ValueError:
        raise ChpartError(command, 0, f"expected one JSON line on stdout, got: {out[-2000:]!r}", [], context) from None
