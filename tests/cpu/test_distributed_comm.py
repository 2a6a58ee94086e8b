"""distributed/comm.py without a GPU: the hop-by-hop measure of communication hidden under compute."""

from __future__ import annotations

import pytest

from flashkit.distributed.comm import StallTimedExchange, hidden_share


class _Event:
    """A recorded CUDA event at time t (ms): elapsed_time as torch.cuda.Event has it (end - start)."""

    def __init__(self, t: float):
        self.t = t

    def elapsed_time(self, end: "_Event") -> float:
        return end.t - self.t


def test_hidden_share_is_the_transfer_time_the_compute_did_not_wait_for():
    assert hidden_share([(2.0, 0.0), (2.0, 0.0)]) == 1.0          # every transfer under compute
    assert hidden_share([(2.0, 2.0)]) == 0.0                      # the compute waited the whole transfer
    assert hidden_share([(2.0, 0.5), (2.0, 0.0)]) == pytest.approx(1 - 0.5 / 4)
    assert hidden_share([(1.0, 3.0)]) == 0.0                      # a stall longer than the transfer clamps
    assert hidden_share([]) is None


def test_each_hop_reads_its_transfer_and_the_compute_streams_stall():
    ex = StallTimedExchange.__new__(StallTimedExchange)   # the events alone (recording them needs CUDA)
    ex.hops = [(_Event(0.0), _Event(1.5), _Event(2.0)),     # data there before the compute asked: no stall
               (_Event(5.0), _Event(7.0), _Event(6.25))]    # the compute stream waited 0.75 ms
    assert ex.hop_times_ms() == [(1.5, 0.0), (2.0, 0.75)]
    assert hidden_share(ex.hop_times_ms()) == pytest.approx(1 - 0.75 / 3.5)
