"""Validated settings at the edge (flags, Helm values); the core gets frozen dataclasses.

Each error names the field, the value and the rule, because pydantic's messages are rewritten
into one line per problem before they reach the user.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.names import ResourceNames
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.defragmenting import all_policies


class ConfigError(ValueError):
    """Settings that cannot be used, with one line per problem."""


class SchedulingConfig(BaseModel):
    """What an operator sets for the scheduler side."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_memory_unit: str = Field(default="1GiB", description="1GiB (default) or 128MiB.")
    policy: str = Field(
        default="gpushare",
        description="Node-level policy: gpushare (default), binpack, spread or fgd.",
    )
    max_pods_per_gpu: Annotated[int, Field(ge=1, le=64)] | None = Field(
        default=None, description="Pods per GPU under isolation; default 20 (16 at 128MiB)."
    )
    mem_resource: str = "aliyun.com/gpu-mem"
    core_resource: str = "aliyun.com/gpu-core.percentage"
    count_resource: str = "aliyun.com/gpu-count"

    @field_validator("gpu_memory_unit")
    @classmethod
    def _unit(cls, value: str) -> str:
        MemoryUnit.parse(value)
        return value

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        all_policies().get(value)
        return value

    def settings(self) -> Settings:
        """The core's settings."""
        return Settings(
            unit=MemoryUnit.parse(self.gpu_memory_unit),
            max_pods_per_gpu=self.max_pods_per_gpu,
            policy=self.policy,
            names=ResourceNames(
                mem=self.mem_resource, core=self.core_resource, count=self.count_resource
            ),
        )


def load(**values: object) -> SchedulingConfig:
    """Validate settings, turning pydantic's report into a ConfigError."""
    try:
        return SchedulingConfig.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as err:
        lines = []
        for problem in err.errors():
            field = ".".join(str(p) for p in problem["loc"])
            message = str(problem["msg"]).removeprefix("Value error, ")
            lines.append(f"{field}={problem.get('input')!r}: {message}")
        raise ConfigError("; ".join(lines)) from None
