"""What a supernet is trained over (plain data, built by the campaign's driver, carried to every rank and every
scoring actor): its space, its teacher, each branch's sandwich, the configurations its tensors are sized for.

    {"format": 2, "space": SubnetSpace.to_data(), "teacher": config, "teacher_keys": its space keys,
     "smallest": config, "sandwich": [[branch, largest config, smallest config], ...], "covers": [configs],
     "varying": [keys], "random_subnets": n, "distill": bool}

A plan of an earlier version (no "format") listed the candidates instead: {"configs", "gmacs", "branches",
"random_subnets", "distill"}, the teacher and the sandwich taken over them and the random students drawn among
them. Such a plan reads back as it was trained (``from_dict``): a supernet it sized has the same tensors, a
resumed training draws the same students.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from qkvsearch.spaces.keys import identity, model_keys

FORMAT = 2


@dataclass(frozen=True)
class SupernetPlan:
    """teacher: the largest configuration by counted MACs, trained on the labels every update; smallest: the
    smallest; sandwich: (branch, its largest, its smallest) in a fixed order, one branch per update in turn;
    covers and varying: what the supernet's tensors are sized and split by (weights.Supernet); space: where
    random students are drawn (trainers.supernet.space.SubnetSpace data); random_subnets: random students per
    update; distill: students learn the teacher's soft labels (else the labels)."""

    teacher: dict
    smallest: dict
    sandwich: tuple[tuple[str, dict, dict], ...]
    covers: tuple[dict, ...]
    varying: frozenset
    space: dict | None = None
    teacher_keys: dict = field(default_factory=dict)
    random_subnets: int = 2
    distill: bool = True
    listed: dict | None = None   # an earlier version's plan, as it was written (its candidates listed)

    @classmethod
    def from_dict(cls, d: dict) -> SupernetPlan:
        if "format" not in d:
            return cls._listed(d)
        return cls(d["teacher"], d["smallest"], tuple((b, lg, sm) for b, lg, sm in d["sandwich"]),
                   tuple(d["covers"]), frozenset(d["varying"]), d["space"], d.get("teacher_keys") or {},
                   int(d["random_subnets"]), bool(d["distill"]))

    @classmethod
    def _listed(cls, d: dict) -> SupernetPlan:
        from qkvsearch.trainers.supernet.weights import varying, widest

        configs, gmacs, branches = list(d["configs"]), list(d["gmacs"]), list(d["branches"])
        sandwich = []
        for b in sorted(set(branches)):
            idx = [i for i, x in enumerate(branches) if x == b]
            sandwich.append((b, configs[max(idx, key=lambda i: gmacs[i])], configs[min(idx, key=lambda i: gmacs[i])]))
        return cls(configs[int(np.argmax(gmacs))], configs[int(np.argmin(gmacs))], tuple(sandwich),
                   tuple(widest(configs)), varying(configs), None, {}, int(d["random_subnets"]), bool(d["distill"]),
                   listed=dict(d))

    def as_dict(self) -> dict:
        if self.listed is not None:
            return dict(self.listed)
        return {"format": FORMAT, "space": self.space, "teacher": self.teacher, "teacher_keys": self.teacher_keys,
                "smallest": self.smallest, "sandwich": [list(s) for s in self.sandwich], "covers": list(self.covers),
                "varying": sorted(self.varying), "random_subnets": self.random_subnets, "distill": self.distill}

    def supernet(self, seed: int = 0, init: bool = True):
        """The supernet this plan sizes (weights.Supernet)."""
        from qkvsearch.trainers.supernet.weights import Supernet

        return Supernet(list(self.covers), seed=seed, init=init, varying=self.varying)

    def students(self, update: int, seed: int) -> list[dict]:
        """The configurations update ``update`` trains besides the teacher, the same on every rank: its
        branch's largest and smallest (branches in turn) and ``random_subnets`` drawn (seeded by the seed and
        the update) from the whole space, one per model."""
        _, largest, smallest = self.sandwich[update % len(self.sandwich)]
        rng = np.random.default_rng([seed, update])
        if self.listed is not None:
            configs = self.listed["configs"]
            drawn = [configs[i] for i in rng.choice(len(configs), size=self.random_subnets, replace=True).tolist()]
        else:
            space = self._space()
            drawn = [space.draw(rng)[1] for _ in range(self.random_subnets)]
        teacher = _model(self.teacher)
        out = {}
        for cfg in (largest, smallest, *drawn):
            if _model(cfg) != teacher:
                out.setdefault(_model(cfg), cfg)
        return list(out.values())

    def _space(self):
        if getattr(self, "_subnet_space", None) is None:
            from qkvsearch.trainers.supernet.space import SubnetSpace

            object.__setattr__(self, "_subnet_space", SubnetSpace.from_data(self.space))
        return self._subnet_space


def _model(cfg: dict) -> str:
    return identity(model_keys(cfg, "width"))


def plan_dict(space, *, random_subnets: int, distill: bool) -> dict:
    """The plan of a supernet over ``space`` (trainers.supernet.space.SubnetSpace), as plain data."""
    facts = space.summary()
    return {"format": FORMAT, "space": space.to_data(), "teacher": facts["teacher"]["config"],
            "teacher_keys": facts["teacher"]["keys"], "smallest": facts["smallest"]["config"],
            "sandwich": [[b, lg["config"], sm["config"]] for b, lg, sm in facts["branches"]],
            "covers": facts["covers"], "varying": facts["varying"], "random_subnets": random_subnets,
            "distill": distill}


def plan_text(plan: dict) -> str:
    """One line of what a plan holds, for the driver's log."""
    p = SupernetPlan.from_dict(plan)
    return (f"teacher {json.dumps(p.teacher_keys, sort_keys=True)}; {len(p.sandwich)} branch(es); tensors sized "
            f"for {len(p.covers)} configuration(s)")
