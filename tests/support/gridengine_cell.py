"""The files of the Grid Engine test cell (:mod:`tests.support.gridengine_cluster`).

Each function returns the text Grid Engine 8.1.9 reads, in its own formats: the bootstrap
file, the scheduler's configuration as the classic spool stores it (numbers where
``qconf -ssconf`` shows words), and the templates ``spooldefaults`` turns into the spool
(global configuration, admin, submit and execution hosts, the parallel environment), plus
the queue, which goes through ``qconf -Aq`` (a queue spooled before the qmaster starts gets
no queue instances).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

#: Debian's global configuration, the template ``spooldefaults configuration`` reads.
DEFAULT_CONFIGURATION = Path("/usr/share/gridengine/default-configuration")


def bootstrap(spooling_params: str, qmaster_spool: Path) -> str:
    """The cell's bootstrap: classic spooling, daemons as root (``admin_user none``), short
    host names (``ignore_fqdn``), Debian's binaries."""
    return (
        "\n".join(
            [
                "admin_user              none",
                "default_domain          none",
                "ignore_fqdn             true",
                "spooling_method         classic",
                "spooling_lib            libspoolc",
                f"spooling_params         {spooling_params}",
                "binary_path             /usr/lib/gridengine",
                f"qmaster_spool_dir       {qmaster_spool}",
                "security_mode           none",
                "listener_threads        2",
                "worker_threads          2",
                "scheduler_threads       1",
            ]
        )
        + "\n"
    )


#: The scheduler, as the classic spool stores it: a pass every second and at each submit
#: and job end (``flush_*_sec``), queues in their sequence order, no load adjustments (the
#: hosts share two cores: load must not hold jobs back).
SCHEDULER = """\
algorithm default
schedule_interval 0:0:1
maxujobs 0
queue_sort_method 1
job_load_adjustments NONE
load_adjustment_decay_time 0:0:0
load_formula slots
schedd_job_info true
flush_submit_sec 1
flush_finish_sec 1
params none
reprioritize_interval 0:0:0
halftime 168
usage_weight_list cpu=1.000000 mem=0.000000 io=0.000000
compensation_factor 5.000000
weight_user 0.250000
weight_project 0.250000
weight_department 0.250000
weight_job 0.250000
weight_tickets_functional 0
weight_tickets_share 0
weight_tickets_override 0
share_override_tickets TRUE
share_functional_shares TRUE
max_functional_jobs_to_schedule 200
report_pjob_tickets TRUE
max_pending_tasks_per_job 50
halflife_decay_list none
policy_hierarchy OFS
weight_ticket 0.500000
weight_waiting_time 0.000000
weight_deadline 3600000.000000
weight_urgency 0.500000
weight_priority 0.000000
max_reservation 0
default_duration INFINITY
"""


def configuration(cell_dir: Path) -> str:
    """Debian's global configuration with: jobs of root allowed (``min_uid 0``), execd
    spools in the cell, no mail, load reports every 2 s, accounting written at once."""
    changes = {
        "execd_spool_dir": str(cell_dir / "spool"),
        "mailer": "/bin/true",
        "min_uid": "0",
        "min_gid": "0",
        "load_report_time": "00:00:02",
        "max_unheard": "00:00:30",
        "reporting_params": "accounting=true reporting=false flush_time=00:00:01 "
        "joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00",
    }
    lines = []
    for line in DEFAULT_CONFIGURATION.read_text().splitlines():
        key = line.split()[0] if line.split() else ""
        lines.append(f"{key} {changes[key]}" if key in changes else line)
    return "\n".join(lines) + "\n"


def _exec_host(host: str) -> str:
    fields = ("load_scaling", "complex_values", "user_lists", "xuser_lists", "projects",
              "xprojects", "usage_scaling", "report_variables")  # fmt: skip
    return f"hostname {host}\n" + "".join(f"{field} NONE\n" for field in fields)


def parallel_environment(name: str) -> str:
    """Open MPI's tight integration: its daemons are the job's slave tasks (started by
    ``qrsh -inherit``); the job script is not one of its slots; slots dealt host by host."""
    return (
        "\n".join(
            [
                f"pe_name            {name}",
                "slots              99999",
                "user_lists         NONE",
                "xuser_lists        NONE",
                "start_proc_args    NONE",
                "stop_proc_args     NONE",
                "allocation_rule    $round_robin",
                "control_slaves     TRUE",
                "job_is_first_task  FALSE",
                "urgency_slots      min",
                "accounting_summary FALSE",
                "qsort_args         NONE",
            ]
        )
        + "\n"
    )


def templates(directory: Path, hosts: Sequence[str], cell_dir: Path) -> dict[str, Path]:
    """Write ``spooldefaults``' templates into ``directory``; kind -> file or folder."""
    out = {"configuration": directory / "global"}
    out["configuration"].write_text(configuration(cell_dir))
    for kind in ("adminhosts", "submithosts", "exechosts", "pes"):
        out[kind] = directory / kind
        out[kind].mkdir(exist_ok=True)
    for host in hosts:
        (out["adminhosts"] / host).write_text(f"hostname {host}\n")
        (out["submithosts"] / host).write_text(f"hostname {host}\n")
        (out["exechosts"] / host).write_text(_exec_host(host))
    (out["pes"] / "mpi").write_text(parallel_environment("mpi"))
    return out


def queue(name: str, hosts: Sequence[str], slots: int, pe: str, tmp: Path) -> str:
    """A queue on ``hosts`` with ``slots`` each, batch and interactive (``qrsh -inherit``
    needs the latter), no load thresholds, and a job ``TMPDIR`` of each host's own."""
    per_host = ",".join(f"[{host}={tmp / host}]" for host in hosts)
    lines = [
        f"qname {name}",
        f"hostlist {' '.join(hosts)}",
        "seq_no 0",
        "load_thresholds NONE",
        "suspend_thresholds NONE",
        "nsuspend 1",
        "suspend_interval 00:05:00",
        "priority 0",
        "min_cpu_interval 00:05:00",
        "processors UNDEFINED",
        "qtype BATCH INTERACTIVE",
        "ckpt_list NONE",
        f"pe_list {pe}",
        "rerun FALSE",
        f"slots {slots}",
        f"tmpdir /tmp,{per_host}",
        "shell /bin/sh",
        "prolog NONE",
        "epilog NONE",
        "shell_start_mode posix_compliant",
        "starter_method NONE",
        "suspend_method NONE",
        "resume_method NONE",
        "terminate_method NONE",
        "notify 00:00:05",
        "owner_list NONE",
        "user_lists NONE",
        "xuser_lists NONE",
        "subordinate_list NONE",
        "complex_values NONE",
        "projects NONE",
        "xprojects NONE",
        "calendar NONE",
        "initial_state default",
    ]
    limits = ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem")
    lines += [f"{kind}_{limit} INFINITY" for limit in limits for kind in ("s", "h")]
    return "\n".join(lines) + "\n"
