"""Real-Spark failure scenarios for chpart_spark (tests/spark/test_spark_failures.py).

- `probe`: a recording stand-in for the chpart binary (every call with its exit code and
  times; an optional action right before `chpart commit`), the oracle for late writers.
- `faults`: what runs inside Spark tasks to force a failure deterministically (marker files
  created with O_EXCL, never sleeps as the mechanism): zombie stragglers that delete shuffle
  files, a task that waits to lose its executor, a straggler that waits for its speculative copy.
- `eventlog`: Spark's event log read as the oracle that the failure really happened.
- `cluster`: a standalone Spark cluster (Master + two Workers on 127.0.0.2/127.0.0.3).
- `run_job.py`: the Spark driver of each scenario, run by the tests as its own process.
"""
