"""The validated campaign spec: one frozen spec per section of a campaign file (spaces.schema, and each section's
own beside its table: spaces.fields.section_spec), built only by spaces.loader; ``load_campaign(spec.to_dict())
== spec``."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qkvsearch.spaces.measure import MeasureSpec
from qkvsearch.spaces.schema import (
    Constraint,
    DataSpec,
    FrozenMap,
    ModelSpec,
    Objective,
    Space,
    StagesSpec,
    constraints_file,
    objectives_file,
    plain,
    violations,
)
from qkvsearch.spaces.search_options import SearchSpec
from qkvsearch.spaces.sections import CheckpointsSpec, ResourcesSpec, SchedulerSpec
from qkvsearch.spaces.supernet import SupernetSpec


@dataclass(frozen=True)
class CampaignSpec:
    name: str
    model: ModelSpec
    data: DataSpec
    train: Any                          # TrainSpec
    space: Space
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...] = ()
    search: SearchSpec = field(default_factory=lambda: SearchSpec("random", 1))
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)
    storage: str = "results/"
    description: str = ""
    source: str | None = field(default=None, compare=False)   # the file it came from, for messages
    checkpoints: CheckpointsSpec = field(default_factory=CheckpointsSpec)
    tracking: FrozenMap = field(default_factory=FrozenMap)  # tracker -> its settings (spaces.tracking.TRACKERS)
    stages: StagesSpec = field(default_factory=StagesSpec)  # empty: none (spaces.stages parses it)
    measure: MeasureSpec = field(default_factory=MeasureSpec)
    supernet: SupernetSpec = field(default_factory=SupernetSpec)
    targets: tuple = ()                 # spaces.targets.TargetSpec: the deployment targets a supernet serves

    def to_dict(self) -> dict:
        """Plain JSON-able dict in the YAML grammar; load_campaign(spec.to_dict()) == spec."""
        return {
            "name": self.name,
            "description": self.description,
            "model": self.model.as_dict(),
            "data": self.data.as_dict(),
            "train": self.train.as_dict(),
            "space": self.space.to_dict(),
            "objectives": objectives_file(self.objectives),
            "constraints": constraints_file(self.constraints),
            "search": self.search.to_dict(),
            "scheduler": self.scheduler.to_dict(),
            "resources": self.resources.to_dict(),
            "checkpoints": self.checkpoints.to_dict(),
            "storage": self.storage,
            **({"tracking": plain(self.tracking)} if self.tracking else {}),
            **({"measure": self.measure.to_dict()} if self.measure != MeasureSpec() else {}),
            **({"stages": self.stages.to_dict()} if self.stages else {}),
            **({"supernet": self.supernet.to_dict()} if self.supernet else {}),
            **({"targets": [t.to_dict() for t in self.targets]} if self.targets else {}),
        }

    def violations(self, cost: Mapping[str, float]) -> list[str]:
        """Constraint violations of one trial's cost (trainers.model.cost.model_cost output); [] = feasible."""
        return violations(self.constraints, cost)
