"""The Ray actors that score subnets: each loads the supernet's checkpoint once (trainers.supernet.scoring.
SubnetScorer) on the device Ray gives it (its reserved GPU where that GPU is a CUDA device, bf16 autocast as a
trial evaluates; the CPU where it has none, as with logical GPUs), and scores or exports the subnets it is sent.

The pool is sized by what the cluster has: at most as many actors as its CPUs hold at ``cpus_per_worker`` each
and its GPUs at ``gpus_per_worker`` each (``pool_size``). Each actor is waited for at most PLACE_S once
started: one Ray cannot place (no node with its resources) is named, not waited for forever.
"""
from __future__ import annotations

import os

import ray

from qkvsearch.search.cluster.capacity import ResourceError

PLACE_S = float(os.environ.get("QKVSEARCH_PLACE_S", "300"))   # an actor not placed by then is refused, named
SCORERS_PER_SLOT = 4   # actors per trial slot at most: scoring is many short calls, a few actors keep them busy


def pool_size(resources, cluster, concurrency) -> int:
    """Scorer actors one-shot scoring starts: what the cluster's CPUs and GPUs hold at the campaign's
    per-worker resources, at most SCORERS_PER_SLOT per trial slot, at least one."""
    caps = [SCORERS_PER_SLOT * max(1, concurrency or 1)]
    for have, each in ((cluster.cpus, resources.cpus_per_worker), (cluster.gpus, resources.gpus_per_worker)):
        if each > 0:
            caps.append(int(have // each))
    return max(1, min(caps))


class _Scorer:
    """A Ray actor: one supernet loaded once (``load``), subnets scored one after another (an error scoring one
    is that subnet's, returned with it). Its constructor does nothing: that it runs says it was placed."""

    def placed(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def load(self, plan: dict, checkpoint: str, cfg: dict, bn_batches: int, threads: int) -> dict:
        """Load the supernet; -> where it runs: {"device", "node"}."""
        import torch

        from qkvsearch.trainers.supernet.plan import SupernetPlan
        from qkvsearch.trainers.supernet.scoring import SubnetScorer
        from qkvsearch.trainers.training.engine import load_state

        torch.set_num_threads(threads)
        self.scorer = SubnetScorer(SupernetPlan.from_dict(plan), load_state(checkpoint), cfg, bn_batches,
                                   device=scoring_device())
        return {"device": str(self.scorer.device), "node": self.placed()}

    def score(self, configs: list[dict]) -> list[dict]:
        """[{"metrics": {...}} or {"error": text}] for each config."""
        from qkvsearch.search.campaign.driver import error_text

        out = []
        for cfg in configs:
            try:
                out.append({"metrics": self.scorer.score(cfg)})
            except Exception as exc:  # noqa: BLE001  (one subnet's failure, not the campaign's)
                out.append({"error": error_text(exc)})
        return out

    def export(self, configs: list[dict], paths: list[str], supernet_id: str) -> None:
        """Each subnet as a stand-alone checkpoint (search.records.inherited.subnet_file)."""
        import io

        import torch

        from qkvsearch.storage import write_bytes

        for cfg, path in zip(configs, paths):
            buf = io.BytesIO()
            weights = {k: v.cpu() for k, v in self.scorer.extract(cfg).items()}   # loadable where no GPU is
            torch.save({"model": weights, "config": cfg, "supernet": supernet_id}, buf)
            write_bytes(path, buf.getvalue())


def scoring_device():
    """The CUDA device of the GPU Ray reserved for this process, else the CPU (no GPU reserved, or a logical
    one that is no CUDA device)."""
    import torch

    if ray.get_gpu_ids() and torch.cuda.is_available():
        return torch.device("cuda", 0)   # Ray sets CUDA_VISIBLE_DEVICES to the reserved GPUs
    return torch.device("cpu")


class ScorerPool:
    """Scorer actors over one trained supernet, started when first asked for (a resumed driver past the scoring
    starts one only if it still has subnets to export), each waited for at most ``place_s``, and killed on
    close (``with``): their CPUs and GPUs go back before the retraining's trials start."""

    def __init__(self, spec, plan: dict, checkpoint: str, teacher_cfg: dict, size: int, place_s: float = PLACE_S):
        res = spec.resources
        self.each = {"num_cpus": res.cpus_per_worker, "num_gpus": res.gpus_per_worker}
        self._load = (plan, checkpoint, teacher_cfg, spec.supernet.bn_batches, max(1, int(res.cpus_per_worker)))
        self.size, self.place_s = max(1, size), place_s
        self.actors: list = []
        self.where: list[dict] = []   # each actor's ready(): its device and node

    def get(self, n: int | None = None) -> list:
        """The first ``n`` actors (default: the pool's size), started as needed and placed."""
        n = self.size if n is None else n
        new = [ray.remote(**self.each)(_Scorer).remote() for _ in range(n - len(self.actors))]
        if new:
            refs = [a.placed.remote() for a in new]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.place_s)
            if len(ready) < len(refs):
                late = [i for i, ref in enumerate(refs) if ref not in ready]
                for actor in new:
                    ray.kill(actor)
                first = len(self.actors) + late[0] + 1
                raise ResourceError(
                    f"scoring: expected scorer actor {first} of {n} ({self.each['num_cpus']:g} CPU, "
                    f"{self.each['num_gpus']:g} GPU: resources.cpus_per_worker, resources.gpus_per_worker) to be "
                    f"placed within {self.place_s:g} s, given a cluster with no free node for it "
                    f"({len(late)} actor(s) not placed); free resources or lower the per-worker resources")
            self.where += ray.get([a.load.remote(*self._load) for a in new])
            self.actors += new
        return self.actors[:n]

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.where = [], []

    def __enter__(self) -> ScorerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
