"""A running Ray cluster the sweep joins (`--address`), and what runs on its nodes before any trial: the GPU probe of
`--gpus-per-trial auto` (`probe_on_cluster`), on a GPU node of each kind of card the cluster reports, so that a
driver on a head node without a GPU packs the trials for the cards they will run on.

Ray labels a node's GPUs with their kind as a resource (`accelerator_type:H100`, which `ray start` detects from the
node's cards, or declared with `--resources`); nodes with GPUs but no such label are one kind of their own.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from pefusion.errors import ConfigError
from pefusion.sweep.gpus import CardMemory, CardReading, GpuProbe, ProbeSite, measure, out_of_memory_refused

ACCELERATOR = "accelerator_type:"  # the prefix of Ray's resource naming a node's kind of GPU
UNLABELLED = "unlabelled GPU"
# How long the probe may wait for a GPU of each kind to be free (a cluster busy with another job's tasks).
PROBE_WAIT_S = 600


# The dashboard's URL of each cluster this process joined: the GPU probe may join before the sweep starts Ray,
# and the sweep still prints the URL.
_DASHBOARDS: dict[str, str] = {}


def join(address: str, verbose: int) -> str:
    """Join the Ray cluster at `address` (nothing if this process already has Ray); returns the dashboard's URL
    (the one it got when it joined, if it already had; "" for a Ray this process started otherwise)."""
    import ray

    if ray.is_initialized():
        return _DASHBOARDS.get(address, "")
    try:
        ctx = ray.init(address=address, log_to_driver=verbose > 1, configure_logging=True, logging_level="WARNING")
    except (ConnectionError, RuntimeError) as exc:
        raise ConfigError(f"cannot join the Ray cluster at --address {address}: "
                          f"{str(exc).splitlines()[0]} (start one with `ray start --head`)") from None
    url = ctx.dashboard_url or ""
    _DASHBOARDS[address] = url if not url or url.startswith("http") else "http://" + url
    return _DASHBOARDS[address]


def gpu_kinds(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each kind of card among the live nodes of `nodes` (`ray.nodes()`), mapped to the id of the first node with
    GPUs of that kind, in the nodes' order."""
    kinds: dict[str, str] = {}
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive") or resources.get("GPU", 0.0) <= 0:
            continue
        kind = next((k[len(ACCELERATOR):] for k in sorted(resources) if k.startswith(ACCELERATOR)), UNLABELLED)
        kinds.setdefault(kind, node["NodeID"])
    return kinds


def probe_on_cluster(address: str, verbose: int = 1) -> ProbeSite:
    """Where `--gpus-per-trial auto` measures on a joined cluster: one Ray task holding one GPU on a node of each
    kind of card (`gpu_kinds`), run in a worker that exits with the task (its CUDA context and cached memory leave
    the card before the trials come). No GPU node: no reading, and the trials run on CPU."""
    def site(probe: GpuProbe, card: CardMemory, points: Sequence[dict[str, Any]]) -> list[CardReading]:
        join(address, verbose)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        kinds = gpu_kinds(ray.nodes())
        if not kinds:
            return []
        print(f"--gpus-per-trial auto: measuring the sweep's largest trial on a GPU node of the cluster "
              f"({', '.join(kinds)}) ...", flush=True)
        task = ray.remote(num_gpus=1, max_calls=1, max_retries=0)(_measure_on_node)
        refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                .remote(probe, card, list(points)) for node in kinds.values()]
        _, waiting = ray.wait(refs, num_returns=len(refs), timeout=PROBE_WAIT_S)
        if waiting:
            for ref in waiting:
                ray.cancel(ref, force=True)
            raise ConfigError(f"--gpus-per-trial auto: no GPU free to measure on within {PROBE_WAIT_S} s on a node "
                              f"of each kind ({', '.join(kinds)}); pass a fraction such as --gpus-per-trial 0.25")
        return [out_of_memory_refused(lambda ref=ref: ray.get(ref)) for ref in refs]

    return site


def _measure_on_node(probe: GpuProbe, card: CardMemory, points: list[dict[str, Any]]) -> CardReading:
    import ray

    return measure(probe, card, points, node=ray.get_runtime_context().get_node_id())
