"""A standalone Spark cluster on this machine for the speculation scenario: a Master on
127.0.0.1 and two Workers (one core each) on the hosts 127.0.0.2 and 127.0.0.3, so that Spark
sees two hosts (it never runs a speculative copy on its original's host, which is why
speculation never fires in local or local-cluster mode). Everything (logs, worker dirs,
executors' local dirs) lives under one temp directory; `stop()` kills every process it started
(each in its own process group, executors included)."""

import json
import os
import signal
import subprocess
import time
import urllib.request

from ports import free_port


def spark_home():
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


class StandaloneCluster:
    WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")

    def __init__(self, base, worker_memory="1536m"):
        self.base = str(base)
        self.home = spark_home()
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.master_port}"
        self.worker_memory = worker_memory
        self.procs = []
        self.log_dir = os.path.join(self.base, "logs")
        self.env = dict(os.environ)
        self.env.update({
            "SPARK_HOME": self.home,
            "SPARK_LOG_DIR": self.log_dir,
            "SPARK_LOCAL_DIRS": os.path.join(self.base, "local"),
            "SPARK_WORKER_DIR": os.path.join(self.base, "work"),
            "SPARK_CONF_DIR": os.path.join(self.base, "conf"),  # empty: no site config
            "SPARK_NO_DAEMONIZE": "1",
        })
        for key in ("SPARK_LOG_DIR", "SPARK_LOCAL_DIRS", "SPARK_WORKER_DIR", "SPARK_CONF_DIR"):
            os.makedirs(self.env[key], exist_ok=True)

    def _start(self, name, argv):
        log = open(os.path.join(self.log_dir, f"{name}.log"), "wb")
        proc = subprocess.Popen([os.path.join(self.home, "bin", "spark-class")] + argv, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def start(self, timeout=90):
        """Starts the Master, then (once it answers, so that no Worker has to wait for its
        registration retry) the Workers; returns when the Master lists both Workers ALIVE."""
        deadline = time.monotonic() + timeout
        self._start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)])
        self._wait(lambda: self.status() is not None, deadline, "the Master to answer")
        for i, host in enumerate(self.WORKER_HOSTS):
            work = os.path.join(self.env["SPARK_WORKER_DIR"], f"worker{i}")
            os.makedirs(work, exist_ok=True)
            self._start(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                                       "--port", str(free_port(host)), "--webui-port", str(free_port()),
                                       "--cores", "1", "--memory", self.worker_memory, "--work-dir", work, self.url])
        self._wait(lambda: len(self.workers()) == len(self.WORKER_HOSTS), deadline, "both Workers to be ALIVE")
        return self

    def _wait(self, predicate, deadline, what):
        while not predicate():
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"the standalone cluster's {name} exited ({proc.returncode}):\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standalone cluster timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.1)

    def status(self):
        """The Master's JSON status page, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def workers(self):
        """The hosts of the Workers the Master lists ALIVE."""
        return sorted(w.get("host") for w in (self.status() or {}).get("workers", []) if w.get("state") == "ALIVE")

    def logs(self, tail=3000):
        out = []
        for name, _ in self.procs:
            try:
                with open(os.path.join(self.log_dir, f"{name}.log"), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-tail:]}")
            except OSError:
                pass
        return "\n".join(out)

    def stop(self):
        """SIGTERM, then SIGKILL, to every process group it started (workers' executors are in
        their worker's group)."""
        for _, proc in reversed(self.procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
