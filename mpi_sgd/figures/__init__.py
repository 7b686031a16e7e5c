"""The docs' figures, drawn by the project's own code from real runs.

One module per figure, each a pure function ``draw(record) -> matplotlib Figure`` from what a
run wrote (a benchmark's JSON, a Chrome trace, the ring's record), tested on small records:

* :mod:`.ring`: the ring all-reduce's steps, recorded from :func:`mpi_sgd.collectives.ring_allreduce`;
* :mod:`.timeline`: one bucketed training step from the trainer's ``--timeline`` trace;
* :mod:`.allreduce`: all-reduce time and bus bandwidth against size (``bench allreduce``, ``bench shm``);
* :mod:`.zero`: ZeRO's model-state memory per rank, measured beside the formula (``bench zero``);
* :mod:`.pipeline`: GPipe and 1F1B timelines and the bubble against (R-1)/(m+R-1) (``bench pipeline``);
* :mod:`.staleness`: the parameter server's staleness histograms (``bench async``);
* :mod:`.speedup`: speedup against R, the T_sync/T_comp model beside measurement (``bench validate``).

:mod:`.run` is ``mpi-sgd figures``: it runs the jobs, draws, and writes each figure with its
provenance (:mod:`.provenance`: command, machine, date, load).
"""
