"""All-reduce through memory the ranks of a node share, without copying through MPI.

* :mod:`.window`: MPI-3 shared windows handed out as torch tensors (:class:`~.window.NodeMemory`);
* :mod:`.sync`: how the ranks wait for each other there (counters, fences, bounded waits);
* :mod:`.reduce`: what one rank computes, its slice chunk by chunk;
* :mod:`.stages`: one call's way through the algorithm, a stage at a time;
* :mod:`.allreduce`: the algorithm that puts them together (:class:`~.allreduce.SharedAllreduce`): the calls
  in flight and when each takes its next stage.
"""
