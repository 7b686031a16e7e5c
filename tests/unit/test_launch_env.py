"""Jobs started from inside a job: the enclosing job's rank variables dropped, the MPI's own start
switches kept (Open MPI starts nothing as root or oversubscribed without them)."""

from __future__ import annotations

from mpi_sgd import launch


def test_rank_variables_go_and_start_switches_stay(monkeypatch):
    job = {"PMI_RANK": "1", "PMI_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1", "HYDRA_CONTROL": "x"}
    kept = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "HYDRA_LAUNCHER_EXEC": "ssh"}
    kept |= {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMP_NUM_THREADS": "1"}
    # Open MPI's launcher sets these per rank; the user's MCA parameters (transports) must stay.
    job |= {"OMPI_MCA_ess_base_jobid": "7", "OMPI_MCA_orte_hnp_uri": "x", "OMPI_MCA_pmix": "x"}
    job |= {"OMPI_UNIVERSE_SIZE": "2"}
    job |= {"OMPI_FIRST_RANKS": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMIX_NAMESPACE": "p", "PMI_FD": "3"}
    kept |= {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_rmaps_base_oversubscribe": "1", "PRTE_MCA_plm": "ssh"}
    for k, v in {**job, **kept}.items():
        monkeypatch.setenv(k, v)
    env = launch.standalone_env()
    assert not set(job) & set(env)
    assert {k: env[k] for k in kept} == kept
    cmd, env2 = launch.mpiexec_command(2, "-c", "pass")
    assert env2 == env and cmd[cmd.index("-n") + 1] == "2"  # the job gets the same environment
