"""Mutants of chpart's exactly-once logic, for proving that the Spark end-to-end tests catch a
broken protocol (TEST CODE; see README.md here).

`CHPART_TEST_MUTANT=<name>` selects one. tests/spark/conftest.py calls `activate_from_env()`
when it is imported, which happens in every Spark *driver* process of the tests: the pytest
process itself (test_spark_load.py) and the driver processes it starts (driver_job.py and
failure_jobs/run_job.py import conftest). Executors are never touched.

The variable is removed from the environment at once and passed on to child processes as
TESTMUTANT_NAME instead: chpart refuses any CHPART_* variable it does not know, so leaving it
would make every chpart command fail with a configuration error rather than run the mutant.

What is patched, in chpart_spark.writer only (production code is not changed):

- `_write_winners(path, manifests)`: for the selection mutants, the manifests collect()
  returned are replaced by a selection made from the manifests on disk
  (`<staging root>/<load>/<attempt>/manifest.json`) when the winners file is written;
- `_commit(...)`: `chpart commit` runs through mutants/shim.py, which makes the selection
  again from what is on disk when the commit really starts (after the failure scenarios'
  probe released a late zombie, as a pipeline listing staging/detached at commit time would
  see it), or, for naive-attach, attaches every published part itself instead of running
  `chpart commit`.

Mutants:
  highest-attempt  per Spark partition, the manifest with the highest attempt.attempt_number,
                   ties broken by the most recently written manifest.json
  latest-manifest  per Spark partition, the most recently written manifest.json
  all-published    every manifest published for the load (several per partition)
  naive-attach     no winner logic, no ledger: ATTACH PART for every part on disk, then move the
                   shadow's partitions into the target (the seed post-mortem pipeline)
"""

import os
import sys

import chpart_spark.writer as writer

from . import shim

ENV = "CHPART_TEST_MUTANT"
ENV_CHILD = "TESTMUTANT_NAME"
NAMES = shim.NAMES
HERE = os.path.dirname(os.path.abspath(__file__))
_active = None
_shim_path = None


def _launcher():
    """An executable that runs shim.main with this interpreter (written once per process)."""
    global _shim_path
    if _shim_path is None:
        import atexit
        import shutil
        import tempfile

        directory = tempfile.mkdtemp(prefix="chpart-mutant-")
        atexit.register(shutil.rmtree, directory, True)
        path = os.path.join(directory, "chpart-mutant-shim")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable} -S\n"
                    "import sys\n"
                    f"sys.path.insert(0, {HERE!r})\n"
                    "import shim\n"
                    "sys.exit(shim.main(sys.argv[1:]))\n")
        os.chmod(path, 0o755)
        _shim_path = path
    return _shim_path


def _mutated_write_winners(original):
    def write_winners(path, manifests):
        collected = [line.strip() for line in manifests]
        if _active in shim.SELECTIONS:
            chosen = shim.select(_active, shim.load_dir(collected))
            shim.log_event({"event": "write-winners-selection", "load": shim.load_of(collected), "before": shim.describe(collected),
                            "after": shim.describe(chosen), "changed": chosen != collected})
            manifests = chosen
        return original(path, manifests)

    return write_winners


def _mutated_commit(original):
    def commit(*, chpart, extra_env, **kwargs):
        env = dict(extra_env or {})
        probe_real = "TESTPROBE_REAL"  # failure_jobs/probe.py: the probe runs this binary
        if probe_real in env:
            env["TESTMUTANT_REAL"] = env[probe_real]
            env[probe_real] = _launcher()
        else:
            env["TESTMUTANT_REAL"] = chpart
            chpart = _launcher()
        return original(chpart=chpart, extra_env=env, **kwargs)

    return commit


def activate(name):
    """Patches chpart_spark.writer in this process for mutant `name`."""
    global _active
    if name not in NAMES:
        raise ValueError(f"{ENV}={name!r}: unknown mutant; known: {', '.join(NAMES)}")
    if _active == name:
        return
    if _active is not None:
        raise RuntimeError(f"mutant {_active} is already active")
    _active = name
    os.environ[ENV_CHILD] = name
    writer._write_winners = _mutated_write_winners(writer._write_winners)
    writer._commit = _mutated_commit(writer._commit)
    shim.log_event({"event": "activated", "argv": sys.argv[:2]})
    print(f"chpart mutant {name} active in pid {os.getpid()} ({' '.join(sys.argv[:1])})", file=sys.stderr)


def activate_from_env():
    """Activates the mutant named by CHPART_TEST_MUTANT (or TESTMUTANT_NAME, set for child
    processes), after removing CHPART_TEST_MUTANT from the environment (see the module doc)."""
    name = os.environ.pop(ENV, None) or os.environ.get(ENV_CHILD)
    if name:
        activate(name)
    return name
