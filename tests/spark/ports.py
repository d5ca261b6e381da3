"""Ports for the servers the Spark tests start: ClickHouse, sshd, a standalone Spark cluster.

A port is taken below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), where
nothing binds port 0. Spark's JVMs (drivers, block managers, executors) bind ephemeral ports all
the time, so a port found free there and released could be taken by one of them before the server
that was meant to have it binds it. Under pytest-xdist (deploy/test.sh runs two workers) each
worker takes its ports from a slice of its own, so two workers never hand out the same port. A
process goes through its slice in order (thousands of ports: a run's tests take a few hundred) and
hands a port out only when binding it on the address succeeds (a port still held, or in TIME_WAIT,
by an earlier test is passed over)."""

import os
import socket
import threading

# The lowest port handed out: above the well-known and registered services that could listen here.
LOWEST = 20000


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _slice():
    """[first, end) of this process's ports: its xdist worker's share of [LOWEST, ephemeral low)."""
    end = _ephemeral_low()
    if end - LOWEST < 1000:
        raise RuntimeError(f"the ephemeral range starts at {end}: too few ports below it from {LOWEST}")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under xdist
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    if index >= count:
        raise RuntimeError(f"xdist worker {worker} of {count}: no slice of ports for it")
    size = (end - LOWEST) // count
    return LOWEST + index * size, LOWEST + (index + 1) * size


class Ports:
    """Hands out the ports of [first, end) in order, each one only if binding it on the address
    succeeds now; after `end`, from `first` again."""

    def __init__(self, first, end):
        self.first, self.end, self.next = first, end, first
        self.lock = threading.Lock()

    def take(self, address="127.0.0.1"):
        with self.lock:
            for _ in range(self.end - self.first):
                port = self.next
                self.next = self.first if port + 1 >= self.end else port + 1
                with socket.socket() as s:
                    try:
                        s.bind((address, port))
                    except OSError:
                        continue
                return port
        raise RuntimeError(f"no port in [{self.first}, {self.end}) binds on {address}")


_process = None


def free_port(address="127.0.0.1"):
    """The next TCP port of this process's slice that binds on `address` now."""
    global _process
    if _process is None:
        _process = Ports(*_slice())
    return _process.take(address)
