"""ports.py: two xdist workers never hand out the same port, none in the kernel's ephemeral range
(where Spark's JVMs bind port 0), and a port that is bound now is passed over. Pure: no Spark,
no server."""

import socket

import pytest

import ports


def slice_of(monkeypatch, worker, count):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    return ports._slice()


def test_each_worker_has_a_slice_of_its_own_below_the_ephemeral_range(monkeypatch):
    low = ports._ephemeral_low()
    for count in (1, 2, 3, 8):
        slices = [slice_of(monkeypatch, f"gw{i}", count) for i in range(count)]
        for (first, end), (next_first, _) in zip(slices, slices[1:]):
            assert first < end <= next_first, slices
        assert slices[0][0] == ports.LOWEST and slices[-1][1] <= low, (slices, low)
    with pytest.raises(RuntimeError, match="no slice"):
        slice_of(monkeypatch, "gw2", 2)


def test_without_xdist_the_process_takes_the_whole_range(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert ports._slice() == (ports.LOWEST, ports._ephemeral_low())


def test_ports_are_handed_out_in_turn_passing_over_a_bound_one():
    first = ports.free_port()  # binds now; the three after it are checked as they are taken
    taker = ports.Ports(first, first + 3)
    with socket.socket() as held:
        held.bind(("127.0.0.1", first + 1))
        held.listen()
        assert [taker.take(), taker.take(), taker.take()] == [first, first + 2, first]
        only_held = ports.Ports(first + 1, first + 2)
        with pytest.raises(RuntimeError, match=f"no port in \\[{first + 1}, {first + 2}\\)"):
            only_held.take()
