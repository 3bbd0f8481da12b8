"""Which short jobs share one SLURM job (a "pack"), and how many to each.

Why: one SLURM job per short step is what cluster admins forbid (a 1,000-item DVC `foreach`
made 1,000 `sbatch` calls and scheduling waits, each for a second of work). A job that declares
a runtime of at most `pack-runtime` minutes is packed with the other such jobs that are ready at
the same time (within Executor's PACK_GATHER_S) and ask for the same kind of allocation
(partition, account, extra sbatch flags, attempt): one `sbatch` for up to `pack-size` of them. The pack is a Snakemake
group job built on the submit host (Executor.run_jobs): Snakemake sizes it as it sizes any group
(its jobs side by side on the profile's `cores`, memory for those that run at once, the runtimes
of what runs one after another added up), and one Snakemake in the job runs them all with
--keep-going. Snakemake still sees each job on its own: its log, its outputs, its success or
failure, its retry (Executor.report_job_submission, Executor._report_pack_member).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# Resources that differ between a pack's members without stopping them sharing one job:
# Snakemake's group sizing combines them (adds runtimes, sums what runs side by side).
SIZED = frozenset(
    {"runtime", "mem_mb", "mem_mib", "mem", "disk_mb", "disk_mib", "disk", "tmpdir", "_cores", "_nodes", "threads"}
)


def packable(job: Any, max_runtime: int, gpus: Callable[[Any], int], max_threads: int | None = None) -> bool:
    """Whether ``job`` may share a SLURM job: it declares a runtime (minutes) of at most
    ``max_runtime``, runs on one node without GPUs or MPI, needs no more threads than a pack has
    CPUs (``max_threads``, the profile's `cores`: Snakemake would give it fewer), and is not a group already."""
    if max_runtime <= 0 or job.is_group():
        return False
    if max_threads is not None and job.threads > max_threads:
        return False
    resources = job.resources
    runtime = resources.get("runtime")
    if isinstance(runtime, bool) or not isinstance(runtime, int | float) or not 0 < runtime <= max_runtime:
        return False
    nodes = resources.get("nodes") or 1
    # keys(): job.resources is a Namedlist, whose `in` looks at values.
    return isinstance(nodes, int) and nodes <= 1 and not gpus(job) and "mpi" not in resources.keys()  # noqa: SIM118


def shape(job: Any) -> tuple[Any, ...]:
    """What two jobs must share to share a SLURM job: the attempt (a retry's resources may differ)
    and every resource that is not sized per job."""
    kept = sorted((name, repr(value)) for name, value in job.resources.items() if name not in SIZED)
    return (job.attempt, tuple(kept))


def even_chunks(items: list[Any], size: int) -> list[list[Any]]:
    """``items`` in as few chunks of at most ``size`` as possible, of sizes that differ by at most one
    (60 by 50: 30 and 30, not 50 and 10)."""
    if not items:
        return []
    count = math.ceil(len(items) / size)
    base, extra = divmod(len(items), count)
    chunks, start = [], 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks
