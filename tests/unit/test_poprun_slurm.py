"""A Slurm job's allocation as poprun's host source: its variables in, hosts and plan out.

Every test is an environment dict: what salloc, sbatch and srun export (as seen on the test
cluster, ``tests/slurm``), no cluster needed.
"""

from __future__ import annotations

from typing import Any

import pytest

from poprun.config import run_config as cfg
from poprun.errors import PoprunError
from poprun.plan.compact import instance_values, plan_launch
from poprun.plan.hosts import HostSource, JobHosts, WithinAllocation, host_source
from poprun.plan.mpirun import INSTANCE_WRAPPER, build_argv
from poprun.plan.slurm import (
    RAS_MCA,
    STEP_MCA,
    parse_counts,
    parse_node_list,
    read_allocation,
)
from poprun.plan.topology import plan, render

pytestmark = pytest.mark.unit

BASE = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
#: ``salloc -N2 --ntasks-per-node=2`` (and an sbatch script with the same options).
SALLOC = {
    **BASE,
    "SLURM_JOB_ID": "17",
    "SLURM_JOBID": "17",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
}
#: ... and poprun started inside it by ``srun -N1 -n1``: the step's view overwrites some.
SRUN_STEP = {
    **SALLOC,
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1",
    "SLURM_NTASKS": "1",
    "SLURM_NNODES": "1",
    "SLURMD_NODENAME": "n1",
}


def _config(environ: dict[str, str], **cli: Any) -> cfg.RunConfig:
    return cfg.build(cli, ("/bin/true",), environ)


# --- node lists and tasks per node ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nodes"),
    [
        ("n1", ("n1",)),
        ("n[1-2]", ("n1", "n2")),
        ("n[1-3,7],gpu-[01-02]", ("n1", "n2", "n3", "n7", "gpu-01", "gpu-02")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("a,b.example.org", ("a", "b.example.org")),
    ],
)
def test_compressed_node_lists_expand(text: str, nodes: tuple[str, ...]) -> None:
    assert parse_node_list(text) == nodes


@pytest.mark.parametrize("text", ["n[1-", "n[2-1]", "n]1["])
def test_a_garbled_node_list_is_named(text: str) -> None:
    with pytest.raises(PoprunError, match="is not a Slurm node list") as caught:
        parse_node_list(text, "SLURM_JOB_NODELIST")
    assert str(caught.value).startswith(f"SLURM_JOB_NODELIST={text}: ")


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("4", (4,)),
        ("2(x2)", (2, 2)),
        ("2(x3),1", (2, 2, 2, 1)),
        ("1,3(x2),2", (1, 3, 3, 2)),
    ],
)
def test_tasks_per_node_expand(text: str, counts: tuple[int, ...]) -> None:
    assert parse_counts(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x2", "2(x0)", "2,,1", "-1", "2(x3"])
def test_garbled_tasks_per_node_are_refused(text: str) -> None:
    with pytest.raises(PoprunError, match="SLURM_TASKS_PER_NODE="):
        parse_counts(text)


# --- reading the allocation ----------------------------------------------------------------


def test_outside_a_job_there_is_no_allocation() -> None:
    assert read_allocation(BASE) is None
    assert host_source({}, read_allocation(BASE)) is None


def test_salloc_and_sbatch_read_the_job_tasks() -> None:
    allocation = read_allocation(SALLOC)
    assert allocation is not None
    assert (allocation.job_id, allocation.nodes, allocation.tasks) == ("17", ("n1", "n2"), (2, 2))
    assert allocation.tasks_variable == "SLURM_TASKS_PER_NODE" and not allocation.in_step
    assert allocation.total_tasks == 4


def test_older_slurm_spellings_are_read() -> None:
    env = {**BASE, "SLURM_JOBID": "5", "SLURM_NODELIST": "c[1-3]", "SLURM_TASKS_PER_NODE": "2,1,1"}
    allocation = read_allocation(env)
    assert allocation is not None
    assert (allocation.nodes, allocation.tasks, allocation.node_variable) == (
        ("c1", "c2", "c3"),
        (2, 1, 1),
        "SLURM_NODELIST",
    )


def test_inside_an_srun_step_the_whole_job_is_read_not_the_step() -> None:
    """srun overwrites SLURM_TASKS_PER_NODE with the step's "1": the job's CPUs per node
    divided by the CPUs per task count instead (what Open MPI reads there too)."""
    allocation = read_allocation(SRUN_STEP)
    assert allocation is not None and allocation.in_step
    assert allocation.nodes == ("n1", "n2") and allocation.tasks == (2, 2)
    assert allocation.tasks_variable == "SLURM_JOB_CPUS_PER_NODE"
    with_cpus = read_allocation(
        {**SRUN_STEP, "SLURM_JOB_CPUS_PER_NODE": "8,4", "SLURM_CPUS_PER_TASK": "2"}
    )
    assert with_cpus is not None and with_cpus.tasks == (4, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""},
            "SLURM_JOB_ID=17: is set but SLURM_JOB_NODELIST is not",
        ),
        (
            {"SLURM_TASKS_PER_NODE": "2(x3)"},
            "SLURM_TASKS_PER_NODE=2(x3): gives counts for 3 node(s) but "
            "SLURM_JOB_NODELIST=n[1-2] lists 2",
        ),
        ({"SLURM_TASKS_PER_NODE": "two"}, "SLURM_TASKS_PER_NODE=two: part 'two' is not N"),
    ],
)
def test_a_garbled_allocation_is_one_line_naming_the_variable(
    change: dict[str, str], message: str
) -> None:
    with pytest.raises(PoprunError) as caught:
        read_allocation({**SALLOC, **change})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


# --- the host source and the plan ----------------------------------------------------------


def test_the_allocation_is_a_host_source_and_explicit_hosts_win() -> None:
    allocation = read_allocation(SALLOC)
    assert allocation is not None
    source: HostSource | None = host_source({}, allocation)
    assert source == JobHosts(allocation) and source.hosts() == ("n1", "n2")
    named = host_source({"host": ["n2"]}, allocation)
    assert isinstance(named, WithinAllocation) and named.hosts() == ("n2",)


def test_no_host_list_and_no_instance_count_run_one_instance_per_task() -> None:
    config = _config(SALLOC, num_replicas="8")
    assert config.num_instances == 4 and config.hosts == ("n1", "n2")
    assert config.host_counts == (2, 2) and config.hosts_from_allocation
    topo = plan(config)
    got = [(p.index, p.host, p.local_index, p.num_local_instances) for p in topo.instances]
    assert got == [(0, "n1", 0, 2), (1, "n1", 1, 2), (2, "n2", 0, 2), (3, "n2", 1, 2)]
    assert [p.replica_offset for p in topo.instances] == [0, 2, 4, 6]
    assert [list(p.devices) for p in topo.instances] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_uneven_tasks_per_node_place_uneven_instances() -> None:
    env = {**SALLOC, "SLURM_JOB_NODELIST": "c[1-3]", "SLURM_TASKS_PER_NODE": "2,1(x2)"}
    topo = plan(_config(env, num_replicas="8"))
    got = [(p.host, p.local_index, p.num_local_instances, p.replica_offset) for p in topo.instances]
    assert got == [("c1", 0, 2, 0), ("c1", 1, 2, 2), ("c2", 0, 1, 4), ("c3", 0, 1, 6)]


def test_fewer_instances_than_tasks_fill_the_first_nodes() -> None:
    config = _config(SALLOC, num_replicas="6", num_instances="3")
    assert (config.hosts, config.host_counts) == (("n1", "n2"), (2, 1))
    two = _config(SALLOC, num_replicas="4", num_instances="2")
    assert (two.hosts, two.host_counts) == (("n1",), (2,))


def test_an_srun_started_poprun_plans_for_the_whole_job() -> None:
    config = _config(SRUN_STEP, num_replicas="8")
    assert config.num_instances == 4 and config.host_counts == (2, 2)


def test_explicit_hosts_inside_the_job_are_shared_evenly() -> None:
    config = _config(SALLOC, host=["n2"], num_instances="2", num_replicas="2")
    assert (config.hosts, config.host_counts, config.hosts_from_allocation) == (
        ("n2",),
        (2,),
        False,
    )
    assert config.allocation is not None  # still shown and still launched through srun


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        (
            {"num_instances": "6", "num_replicas": "6"},
            "--num-instances=6: is more than the 4 tasks of Slurm job 17 (nodes n[1-2], "
            "2(x2) tasks per node, 4 in all); fix: use --num-instances 4 or fewer",
        ),
        (
            {"host": ["n1,n3"], "num_instances": "2", "num_replicas": "2"},
            "--host=n3: is not a node of Slurm job 17 (nodes n[1-2]",
        ),
        (
            {"host": ["n1"], "num_instances": "4", "num_replicas": "4"},
            "--num-instances=4: puts 4 instances on n1, which has 2 task(s) in Slurm job 17",
        ),
        (
            {"num_replicas": "6"},
            "--num-replicas=6: cannot be shared by one instance per task of Slurm job 17",
        ),
    ],
)
def test_impossible_requests_are_one_line_naming_both_sides(
    cli: dict[str, Any], message: str
) -> None:
    with pytest.raises(PoprunError) as caught:
        _config(SALLOC, **cli)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_host_file_inside_the_job_is_checked_too(tmp_path: Any) -> None:
    path = tmp_path / "hosts"
    path.write_text("n1\nn9\n")
    with pytest.raises(PoprunError, match=r"^--host-file=n9: is not a node of Slurm job 17"):
        _config(SALLOC, host_file=str(path), num_instances="2", num_replicas="2")


UNEVEN = {**SALLOC, "SLURM_TASKS_PER_NODE": "3,1", "SLURM_JOB_CPUS_PER_NODE": "3,1"}


def test_a_host_file_with_slots_inside_the_job_is_checked_by_its_own_placement(
    tmp_path: Any,
) -> None:
    """The file's slots place the instances (3 on n1, 1 on n2); each count is checked
    against that node's tasks, not an even share."""
    path = tmp_path / "hosts"
    path.write_text("n1 slots=3\nn2 slots=1\n")
    config = _config(UNEVEN, host_file=str(path), num_instances="4", num_replicas="4")
    assert config.host_counts == (3, 1)
    with pytest.raises(PoprunError, match=r"^--num-instances=4: puts 3 instances on n1, which "):
        _config(SALLOC, host_file=str(path), num_instances="4", num_replicas="4")


def test_oversubscribe_is_offered_for_a_host_file_not_for_a_job() -> None:
    """A job's tasks are the scheduler's: --oversubscribe does not lift them, nor is it
    suggested."""
    cli = {"num_instances": "8", "num_replicas": "8", "mpi_global_args": ["--oversubscribe"]}
    with pytest.raises(PoprunError, match=r"more than the 4 tasks of Slurm job 17") as caught:
        _config(SALLOC, **cli)
    assert "--oversubscribe" not in str(caught.value)


def test_the_exported_configuration_leaves_out_the_job_nodes() -> None:
    config = _config(SALLOC, num_replicas="8")
    assert "host" not in config.to_file_values()
    assert (
        "host" in _config(SALLOC, host=["n1"], num_replicas="2", num_instances="2").to_file_values()
    )


# --- what mpirun gets, and what --print-topology shows ---------------------------------------


def _argv(config: cfg.RunConfig) -> list[str]:
    return build_argv(
        config,
        plan(config),
        mpirun="mpirun",
        forwarded=["HOME", "PATH"],
        is_root=True,
        local_cpus=2,
    )


def test_mpirun_gets_the_nodes_with_their_counts_and_may_oversubscribe() -> None:
    argv = _argv(_config(SALLOC, num_replicas="8"))
    hosts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-H"]
    assert hosts == ["n1:2,n2:2"]  # one context: its instances derive their values
    assert "--oversubscribe" in argv  # Open MPI counts CPUs; poprun checked the tasks
    at = argv.index(INSTANCE_WRAPPER[2])  # n1, n2 are not this machine's names: LOCAL 0
    assert argv[at + 2 : at + 4] == ["0 0 2 0 0", "n1:2,n2:2"]
    assert STEP_MCA[0] not in argv
    # Open MPI counts the job's slots, not the step's: the -H counts place the ranks
    at = argv.index(RAS_MCA[0])
    assert argv[at - 1 : at + 2] == ["--mca", *RAS_MCA]
    launch = plan_launch(_config(SALLOC, num_replicas="8"), plan(_config(SALLOC, num_replicas="8")))
    offsets = [instance_values(launch, r)["POPDIST_REPLICA_INDEX_OFFSET"] for r in range(4)]
    assert offsets == ["0", "2", "4", "6"]


def test_inside_an_srun_step_the_daemons_srun_overlaps() -> None:
    argv = _argv(_config(SRUN_STEP, num_replicas="8"))
    at = argv.index(STEP_MCA[0])
    assert argv[at - 1 : at + 2] == ["--mca", *STEP_MCA]
    # the step's own tasks (SLURM_TASKS_PER_NODE=1) would misplace the ranks: -H counts rule
    at = argv.index(RAS_MCA[0])
    assert argv[at - 1 : at + 2] == ["--mca", *RAS_MCA]
    chosen = _argv(
        _config(SRUN_STEP, num_replicas="8", mpi_global_args=["--mca plm_slurm_args --exact"])
    )
    assert "--overlap" not in chosen  # the user's choice stands
    theirs = _argv(
        _config(SRUN_STEP, num_replicas="8",
                mpi_global_args=["--mca ras_slurm_use_entire_allocation 0"])
    )  # fmt: skip
    assert theirs.count(RAS_MCA[0]) == 1  # the user's choice stands


def test_slurm_variables_are_not_forwarded_to_other_nodes() -> None:
    from poprun.plan.environment import forwarded_names

    assert forwarded_names({**SRUN_STEP, "MY_SETTING": "1"}) == ["HOME", "MY_SETTING", "PATH"]


def test_print_topology_shows_the_allocation_read() -> None:
    text = render(plan(_config(SRUN_STEP, num_replicas="8")))
    line = text.splitlines()[1]
    assert line.startswith("Slurm allocation: job 17, nodes n[1-2] (SLURM_JOB_NODELIST), ")
    assert "tasks per node 2(x2) (SLURM_JOB_CPUS_PER_NODE): n1:2, n2:2" in line
    assert "srun step" in line


def test_min_hosts_inside_a_slurm_job_and_readmit_refused() -> None:
    """--min-hosts works inside a Slurm job (its nodes probed by steps of the job); --readmit
    does not (a lost node goes back to Slurm), refused in one line (docs/elastic.md)."""
    config = _config(SALLOC, min_hosts="1", num_replicas="4")
    assert config.min_hosts == 1 and config.hosts == ("n1", "n2")
    # the job again on n1 only: its daemons' step overlaps the lost node's, which Slurm
    # completes only once it declares the node down
    argv = _argv(config)
    at = argv.index(STEP_MCA[0])
    assert argv[at - 1 : at + 2] == ["--mca", *STEP_MCA]
    with pytest.raises(PoprunError, match=r"^--readmit=yes: is not supported inside a Slurm job"):
        _config(SALLOC, min_hosts="1", readmit="yes", num_replicas="4")


def test_node_addresses_from_scontrol() -> None:
    from poprun.plan.slurm import node_addresses

    text = (
        "NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.0.0.1 NodeHostName=vm Port=7001\n"
        "NodeName=n2 Arch=x86_64 NodeAddr=10.0.0.2 NodeHostName=vm State=DOWN*\n"
        "garbage\n"
    )
    assert node_addresses(text) == {"n1": "10.0.0.1", "n2": "10.0.0.2"}
