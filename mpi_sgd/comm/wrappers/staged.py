"""GPU tensors through an MPI library that cannot read device memory: stage through pinned host copies.

:class:`StagedComm` wraps the mpi4py communicator when CUDA is present but the MPI library is not
CUDA-aware (:func:`mpi_sgd.comm.gpu.cuda_aware`). For every GPU tensor a call is given, it copies
the tensor into a pinned host buffer and waits for that copy (and every kernel queued before it)
to finish, lets the wrapped communicator work on the host copy, and copies what MPI wrote back to
the device; a non-blocking call copies back when it is waited on. CPU tensors and numpy arrays
pass straight through. This costs two PCIe copies per call; a CUDA-aware MPI (or NCCL) avoids them.

:class:`DeviceStagedComm` is the mirror image, for NCCL, which reduces only device memory: host
tensors and numpy arrays (the small control messages of the trainer and the checks: epoch
statistics, replica checksums, flags) go to the GPU and back. Gradients already live there.
"""

from __future__ import annotations

import numpy as np
import torch

from ..base import Request
from ..gpu import HostBuffers
from .wrapper import CommWrapper


def _on_gpu(buf) -> bool:
    return isinstance(buf, torch.Tensor) and buf.is_cuda


class StagedComm(CommWrapper):
    """``inner`` (a host-memory communicator) taking GPU tensors through pinned host copies."""

    def __init__(self, inner, buffers: HostBuffers | None = None):
        super().__init__(inner)
        self.buffers = buffers or HostBuffers()

    def _rewrap(self, inner):
        part = self._rebuild(inner)
        part.buffers = self.buffers  # one pool of (pinned) host memory per process, not one per part
        return part

    def _in(self, buf):
        """(what the inner communicator gets, the host copy to bring back or None)."""
        if not _on_gpu(buf):
            return buf, None
        host = self.buffers.stage_in(buf)
        return host.view(buf.shape), host

    def _out(self, host, buf, write_back: bool = True) -> None:
        if host is None:
            return
        if write_back:
            self.buffers.stage_out(host, buf)
        else:
            self.buffers.give(host)

    # -- point to point -------------------------------------------------------------------
    def send(self, buf, dest, tag=0):
        h, host = self._in(buf)
        self.inner.send(h, dest, tag)
        self._out(host, buf, write_back=False)

    def recv(self, buf, source, tag=0):
        h, host = self._in(buf)
        self.inner.recv(h, source, tag)
        self._out(host, buf)
        return buf

    def isend(self, buf, dest, tag=0):
        h, host = self._in(buf)
        req = self.inner.isend(h, dest, tag)
        return self._later(req, host, buf, write_back=False)

    def irecv(self, buf, source, tag=0):
        h, host = self._in(buf)
        return self._later(self.inner.irecv(h, source, tag), host, buf)

    def _later(self, req, host, buf, write_back: bool = True) -> Request:
        if host is None:
            return req
        return Request(req, Request.wait, Request.test, lambda: self._out(host, buf, write_back), keep=host)

    # -- collectives: in place, or into a receive buffer ----------------------------------
    def allreduce(self, buf, op="sum"):
        h, host = self._in(buf)
        self.inner.allreduce(h, op)
        self._out(host, buf)
        return buf

    def iallreduce(self, buf, op="sum"):
        h, host = self._in(buf)
        return self._later(self.inner.iallreduce(h, op), host, buf)

    def broadcast(self, buf, root=0):
        h, host = self._in(buf)
        self.inner.broadcast(h, root)
        self._out(host, buf)
        return buf

    def reduce(self, buf, op="sum", root=0):
        h, host = self._in(buf)
        self.inner.reduce(h, op, root)
        self._out(host, buf, write_back=self.rank == root)
        return buf

    def _two(self, call, sendbuf, recvbuf, *args):
        s, shost = self._in(sendbuf)
        r, rhost = self._in(recvbuf) if recvbuf is not None else (None, None)
        call(s, r, *args)
        self._out(shost, sendbuf, write_back=False)
        self._out(rhost, recvbuf)
        return recvbuf

    def gather(self, sendbuf, recvbuf=None, root=0):
        return self._two(self.inner.gather, sendbuf, recvbuf, root)

    def allgather(self, sendbuf, recvbuf):
        return self._two(self.inner.allgather, sendbuf, recvbuf)

    def scatter(self, sendbuf, recvbuf, root=0):
        s, shost = self._in(sendbuf) if sendbuf is not None else (None, None)
        r, rhost = self._in(recvbuf)
        self.inner.scatter(s, r, root)
        self._out(shost, sendbuf, write_back=False)
        self._out(rhost, recvbuf)
        return recvbuf

    def reduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        return self._two(self.inner.reduce_scatter, sendbuf, recvbuf, counts, op)

    def _two_later(self, call, sendbuf, recvbuf, *args) -> Request:
        s, shost = self._in(sendbuf)
        r, rhost = self._in(recvbuf)
        req = call(s, r, *args)
        if shost is None and rhost is None:
            return req

        def finish():
            self._out(shost, sendbuf, write_back=False)
            self._out(rhost, recvbuf)

        return Request(req, Request.wait, Request.test, finish, keep=(shost, rhost))

    def ireduce_scatter(self, sendbuf, recvbuf, counts=None, op="sum"):
        return self._two_later(self.inner.ireduce_scatter, sendbuf, recvbuf, counts, op)

    def iallgather(self, sendbuf, recvbuf):
        return self._two_later(self.inner.iallgather, sendbuf, recvbuf)


class DeviceStagedComm(StagedComm):
    """``inner`` (a device-memory communicator: NCCL) taking host tensors and numpy arrays too."""

    def __init__(self, inner, device: torch.device):
        super().__init__(inner, buffers=None)
        self.device = device

    def _in(self, buf):
        if isinstance(buf, np.ndarray):
            buf = torch.from_numpy(buf)
        if not isinstance(buf, torch.Tensor) or buf.device == self.device:
            return buf, None
        moved = buf.to(self.device)
        return moved, moved

    def _out(self, moved, buf, write_back: bool = True) -> None:
        if moved is not None and write_back:
            out = torch.from_numpy(buf) if isinstance(buf, np.ndarray) else buf
            out.copy_(moved)  # a device-to-host copy waits for the collective that wrote ``moved``
