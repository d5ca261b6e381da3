"""Running the `chpart` binary and turning its exit status into exceptions."""

import collections
import json
import os
import re
import shutil
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


def resolve_binary(chpart):
    """An absolute path for a path-like `chpart` (tasks run in other working directories);
    a bare name is looked up on PATH here, and kept as a name if not found (executors may
    have it on their PATH even if the driver does not)."""
    if os.sep in chpart:
        return os.path.abspath(chpart)
    found = shutil.which(chpart)
    return found or chpart


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


def run(chpart, command, args, config, extra_env=None, context="", timeout=None):
    """Runs `chpart <command> --config <config> <args...>`; returns (stdout, stderr).
    Raises ChpartError on a non-zero exit."""
    argv = [chpart, command, "--config", str(config), *[str(a) for a in args]]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=child_env(extra_env), timeout=timeout)
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
