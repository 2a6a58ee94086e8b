"""Moving K/V shards around the ring: NCCL point-to-point on a communication stream, double-buffered.

Step s sends the shard this rank holds to rank + 1 and receives rank - 1's into the spare buffer, while
the compute stream works on the held one. Ordering, all on the GPU (the host never waits):
  comm waits for compute (the spare buffer's last reader, step s-1, is done; the held shard is ready);
  compute waits for comm's event before it reads the received shard at step s+1.
The backward will reuse this class to pass K/V forward and dK/dV (fp32) around in the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

_COMM_STREAMS: dict[int, Any] = {}


def comm_stream(device: Any):
    """One communication stream per device, kept across calls."""
    import torch
    index = device.index
    if index not in _COMM_STREAMS:
        _COMM_STREAMS[index] = torch.cuda.Stream(device=device)
    return _COMM_STREAMS[index]


class RingExchange:
    """Passes a tuple of tensors one hop around the ring each step (send to rank+1, receive from rank-1).

    compute=comm=None moves CPU tensors (a Gloo group, for the CPU tests) with the host waiting.
    """

    timing = False   # done events with timing (StallTimedExchange reads them)

    def __init__(self, group: Any, rank: int, world_size: int, compute: Any, comm: Any):
        import torch
        self._torch, self._dist = torch, torch.distributed
        self.group, self.rank, self.world_size = group, rank, world_size
        self.compute, self.comm = compute, comm
        self.next_peer = self._global((rank + 1) % world_size)
        self.prev_peer = self._global((rank - 1) % world_size)
        self._spare: list[tuple[Any, ...] | None] = [None, None]
        self._pending: tuple[tuple[Any, ...], Any] | None = None

    def start(self, held: Sequence[Any], step: int) -> None:
        """Post the sends of `held` and the receives of the next shard, on the comm stream."""
        torch, dist = self._torch, self._dist
        slot = step % 2
        if self._spare[slot] is None:   # allocated on the compute stream, which outlives every use
            self._spare[slot] = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in held)
        recv = self._spare[slot]
        if self.comm is None:   # CPU tensors (Gloo): the host waits in finish()
            self._pending = (recv, self._post(held, recv))
            return
        self.comm.wait_stream(self.compute)
        with torch.cuda.stream(self.comm):
            for work in self._post(held, recv):
                work.wait()   # the comm stream (not the host) waits for NCCL
            done = torch.cuda.Event(enable_timing=self.timing)
            done.record(self.comm)
        self._pending = (recv, done)

    def finish(self) -> tuple[Any, ...]:
        """The received shard, with the compute stream ordered after its arrival."""
        recv, done = self._pending
        if self.comm is None:
            for work in done:
                work.wait()
        else:
            self.compute.wait_event(done)
        self._pending = None
        return recv

    def _post(self, held: Sequence[Any], recv: Sequence[Any]) -> list:
        dist = self._dist
        ops = [dist.P2POp(dist.isend, t, self.next_peer, self.group) for t in held]
        ops += [dist.P2POp(dist.irecv, t, self.prev_peer, self.group) for t in recv]
        return dist.batch_isend_irecv(ops)

    def _global(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return self._dist.get_global_rank(self.group, group_rank)


class StallTimedExchange(RingExchange):
    """RingExchange that times, per hop, how long the compute stream waits for the transfer (CUDA only).

    Per hop three events: `begin` on the comm stream once it may start (after the compute stream's work before
    start()), `done` where the transfer completes, `ready` on the compute stream where finish() asks for the
    data (the step's blocks queued before it). transfer = done - begin; exposed = max(0, done - ready): the time
    the compute stream stalls on communication. hidden_share() = 1 - sum(exposed) / sum(transfer).
    """

    timing = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hops: list[tuple[Any, Any, Any]] = []   # (begin, done, ready) events
        self._begin: Any = None

    def start(self, held: Sequence[Any], step: int) -> None:
        torch = self._torch
        self.comm.wait_stream(self.compute)
        self._begin = torch.cuda.Event(enable_timing=True)
        self._begin.record(self.comm)
        super().start(held, step)

    def finish(self) -> tuple[Any, ...]:
        ready = self._torch.cuda.Event(enable_timing=True)
        ready.record(self.compute)
        self.hops.append((self._begin, self._pending[1], ready))
        return super().finish()

    def hop_times_ms(self) -> list[tuple[float, float]]:
        """(transfer, exposed) milliseconds of each hop; the device must have finished them (synchronize)."""
        return [(begin.elapsed_time(done), max(0.0, ready.elapsed_time(done))) for begin, done, ready in self.hops]


def hidden_share(hops: Sequence[tuple[float, float]]) -> float | None:
    """1 - sum(exposed) / sum(transfer) over (transfer, exposed) hops; None without a transfer."""
    transfer = sum(t for t, _ in hops)
    return None if transfer <= 0 else 1.0 - min(1.0, sum(e for _, e in hops) / transfer)


class LocalExchange:
    """No transfer: every step sees the shard already held (for timing the ring with communication off)."""

    def start(self, held: Sequence[Any], step: int) -> None:
        self._held = tuple(held)

    def finish(self) -> tuple[Any, ...]:
        return self._held
