"""The connector's Arrow stream into chpart's stdin (deploy/spark/connector ArrowPipe: the task's
thread converts rows while a writer thread of its own writes the previous batch), driven by the
test program java/ArrowPipeContract.java through a slow or failing channel into a file, read back
with Arrow's own reader:

1. every row arrives, in order, with its values, and the end-of-stream marker only after end();
2. drained and closed without end(): every row, and no marker (what a killed or denied attempt
   leaves in chpart's stdin, which chpart then refuses);
3. a failing channel: send()/drain() throw its error, no write is tried after the failed one, and
   close() stops the writer thread.
"""

import os
import subprocess

import pytest

from conftest import pyspark_jars


def run_contract(connector_jar, test_classes, mode, path, batches, rows):
    cp = os.pathsep.join([test_classes, connector_jar, os.path.join(pyspark_jars(), "*")])
    # What Spark's launcher gives its JVMs for Arrow's off-heap buffers.
    opens = ["--add-opens=java.base/java.nio=ALL-UNNAMED", "-Dio.netty.tryReflectionSetAccessible=true"]
    return subprocess.run(["java", *opens, "-cp", cp, "chpart.spark.ArrowPipeContract", mode, str(path), str(batches),
                           str(rows)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode,batches,rows,expected", [
    ("order", 60, 1000, "ok 60 batches of 1000 rows in order, then the marker"),
    ("order", 1, 1, "ok 1 batches of 1 rows in order, then the marker"),
    ("order", 0, 0, "ok 0 batches of 0 rows in order, then the marker"),
    ("no-marker", 5, 500, "ok 5 batches drained, no marker"),
    ("failure", 100, 1000, "ok failed after"),
])
def test_arrow_pipe_contract(connector_jar, test_classes, tmp_path, mode, batches, rows, expected):
    ran = run_contract(connector_jar, test_classes, mode, tmp_path / "stream.arrows", batches, rows)
    assert ran.returncode == 0 and ran.stdout.startswith(expected), (ran.returncode, ran.stdout, ran.stderr)
