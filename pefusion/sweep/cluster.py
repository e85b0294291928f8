"""The sweep's Ray cluster: started here or joined (`--address`), and checked for a node that holds one trial
(`start_cluster`); and what runs on a joined cluster's nodes before any trial: the GPU probe of
`--gpus-per-trial auto` (`probe_on_cluster`), on a GPU node of each kind of card the cluster has, so that a
driver on a head node without a GPU packs the trials for the cards they will run on.

Ray labels a node's GPUs with their kind as a resource (`accelerator_type:H100`, which `ray start` detects from the
node's cards, or declared with `--resources`); nodes with GPUs but no such label are one kind of their own. The
label does not say the card's memory (A100 40 GB and 80 GB are both `A100`): a kind is a label and a total memory.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from pefusion.errors import ConfigError
from pefusion.sweep.gpus import GIB, CardReading, ProbeSite, check_resources, measure, out_of_memory_refused
from pefusion.sweep.options import SweepOptions
from pefusion.sweep.study import CardMemory, GpuProbe
from pefusion.tracking.store import import_client_in_background

ACCELERATOR = "accelerator_type:"  # the prefix of Ray's resource naming a node's kind of GPU
UNLABELLED = "unlabelled GPU"
# How long the probe may wait for a GPU of each kind to be free (a cluster busy with another job's tasks).
PROBE_WAIT_S = 600
# With --autoscaling and no GPU node yet: how long to wait for the cluster to add one (a cloud's GPU node takes
# minutes to boot and pull an image of several GB).
AUTOSCALE_WAIT_S = 900


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


def start_ray(opts: SweepOptions) -> str:
    """Join `--address` or start a local cluster with the dashboard on 127.0.0.1; returns the dashboard URL."""
    import ray

    if opts.address:  # joined already by `--gpus-per-trial auto`'s probe, or now
        return join(opts.address, opts.verbose)
    if ray.is_initialized():
        return ""
    ctx = ray.init(num_cpus=opts.num_cpus, num_gpus=opts.num_gpus, include_dashboard=opts.dashboard,
                   dashboard_host="127.0.0.1", log_to_driver=opts.verbose > 1, configure_logging=True,
                   logging_level="WARNING")
    url = ctx.dashboard_url or ""
    return url if not url or url.startswith("http") else "http://" + url


def cluster_gpus() -> float:
    """The GPUs of the running Ray cluster's live nodes."""
    import ray

    return float(sum(n.get("Resources", {}).get("GPU", 0.0) for n in ray.nodes() if n.get("Alive")))


def start_cluster(opts: SweepOptions) -> None:
    """Ray for the sweep: the tracking client imported while Ray starts or joins `--address`, and the cluster
    checked for a node that holds one trial's request (a ConfigError; the cluster this stopped, if it started it).
    Call after `console.quiet`: Ray and MLflow set up their loggers as they start."""
    import ray

    import_client_in_background()  # while Ray starts
    started_here = not ray.is_initialized()
    dashboard = start_ray(opts)
    try:  # what the cluster really has (a joined one, or a sweep inside a running ray.init)
        check_resources(opts, [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")])
    except ConfigError:
        if started_here:
            ray.shutdown()  # only what this command started
        raise
    if dashboard and opts.verbose:
        print(f"Ray dashboard: {dashboard}  (token: `ray get-auth-token`)", flush=True)


def gpu_nodes(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The live nodes of `nodes` (`ray.nodes()`) that have GPUs: node id -> the label of their kind of card, in
    the nodes' order."""
    out: dict[str, str] = {}
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive") or resources.get("GPU", 0.0) <= 0:
            continue
        out[node["NodeID"]] = next((k[len(ACCELERATOR):] for k in sorted(resources) if k.startswith(ACCELERATOR)),
                                   UNLABELLED)
    return out


def card_groups(labels: Mapping[str, str],
                cards: Mapping[str, tuple[int, int, str]]) -> dict[tuple[str, float], list[str]]:
    """The GPU nodes grouped by kind of card: their Ray label AND their card's total memory (GiB, to 0.1), since
    Ray labels an A100 of 40 GB and one of 80 GB both `A100` (V100 16/32 GB, H100 and H100 NVL likewise).
    `cards`: node id -> its card's (free, total bytes, name). Each group's node ids in `labels`' order."""
    groups: dict[tuple[str, float], list[str]] = {}
    for node, label in labels.items():
        groups.setdefault((label, round(cards[node][1] / GIB, 1)), []).append(node)
    return groups


def probe_on_cluster(address: str, verbose: int = 1, autoscaling: bool = False) -> ProbeSite:
    """Where `--gpus-per-trial auto` measures on a joined cluster. Every GPU node's card is read (its total memory:
    one Ray task holding one GPU per node), the nodes are grouped by label and memory (`card_groups`) and the
    probe runs on one node of each group; every task runs in a worker that exits with it (its CUDA context and
    cached memory leave the card before the trials come). A GPU node whose card could not be read (busy past
    PROBE_WAIT_S) is refused in one line: trials could land on a card nobody measured.

    No GPU node: no reading, and the trials run on CPU; with `autoscaling` a GPU task is asked for first (which
    makes an autoscaler add a GPU node) and waited for AUTOSCALE_WAIT_S, then refused in one line."""
    def site(probe: GpuProbe, card: CardMemory, points: Sequence[dict[str, Any]]) -> list[CardReading]:
        join(address, verbose)
        import ray

        labels = gpu_nodes(ray.nodes())
        if not labels and autoscaling:
            _wait_for_a_gpu_node(card)
            labels = gpu_nodes(ray.nodes())
        if not labels:
            return []
        cards = _on_nodes(_read_card, list(labels), card, what="read the card")
        if missing := [n for n in labels if n not in cards]:
            raise ConfigError(f"--gpus-per-trial auto: no GPU free within {PROBE_WAIT_S} s to read the card of "
                              f"node{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which could receive "
                              f"trials; pass a fraction such as --gpus-per-trial 0.25")
        groups = card_groups(labels, cards)
        kinds = [f"{label} {total:g} GiB" for label, total in groups]
        print(f"--gpus-per-trial auto: measuring the sweep's largest trial on a GPU node of each kind of card "
              f"({', '.join(kinds)}) ...", flush=True)
        firsts = [nodes[0] for nodes in groups.values()]
        readings = _on_nodes(_measure_on_node, firsts, probe, card, list(points), what="measure")
        if missing := [kind for kind, node in zip(kinds, firsts) if node not in readings]:
            raise ConfigError(f"--gpus-per-trial auto: no GPU free to measure on within {PROBE_WAIT_S} s on a node "
                              f"of each kind ({', '.join(missing)}); pass a fraction such as --gpus-per-trial 0.25")
        return [readings[node] for node in firsts]

    return site


def _on_nodes(fn: Callable[..., Any], nodes: list[str], *args: Any, what: str) -> dict[str, Any]:
    """fn(*args) as a Ray task holding one GPU on each of `nodes`: node id -> its result, for those that ran within
    PROBE_WAIT_S (the others cancelled). A probe out of card memory ends the sweep with CUDA's message."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_gpus=1, max_calls=1, max_retries=0)(fn)
    refs = {node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(*args)
            for node in nodes}
    _, waiting = ray.wait(list(refs.values()), num_returns=len(refs), timeout=PROBE_WAIT_S)
    for ref in waiting:
        ray.cancel(ref, force=True)
    return {node: out_of_memory_refused(lambda ref=ref: ray.get(ref)) for node, ref in refs.items()
            if ref not in waiting}


def _wait_for_a_gpu_node(card: CardMemory) -> None:
    """Ask for one GPU (an autoscaler adds a node of a GPU group scaled to zero) and wait AUTOSCALE_WAIT_S for it."""
    import ray

    print(f"--gpus-per-trial auto: no GPU node yet; --autoscaling: waiting up to {AUTOSCALE_WAIT_S} s for the "
          f"cluster to add one ...", flush=True)
    ref = ray.remote(num_gpus=1, max_calls=1, max_retries=0)(_read_card).remote(card)
    done, _ = ray.wait([ref], timeout=AUTOSCALE_WAIT_S)
    if not done:
        ray.cancel(ref, force=True)
        raise ConfigError(f"--gpus-per-trial auto with --autoscaling: no GPU node joined within {AUTOSCALE_WAIT_S} s "
                          f"to measure on; check the cluster's GPU group (its maxReplicas, quota, pending pods), or "
                          f"pass --gpus-per-trial 0 to run on CPUs, or a fraction such as 0.25 to start unmeasured")


def _read_card(card: CardMemory) -> tuple[int, int, str]:
    return card()


def _measure_on_node(probe: GpuProbe, card: CardMemory, points: list[dict[str, Any]]) -> CardReading:
    import ray

    return measure(probe, card, points, node=ray.get_runtime_context().get_node_id())
