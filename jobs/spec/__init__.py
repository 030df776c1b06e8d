"""Pipeline spec v1, shared by the control plane and the Spark job (plain Python only)."""

from .model import (
    SPEC_VERSION,
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    KafkaSource,
    NoRestart,
    PipelineSpec,
    RestartPolicy,
    Transform,
    Trigger,
)
from .validate import FieldError, SpecError, parse_restart_policy, parse_spec

__all__ = [
    "SPEC_VERSION",
    "ExponentialDelay",
    "FailureRate",
    "FieldError",
    "FixedDelay",
    "KafkaSource",
    "NoRestart",
    "PipelineSpec",
    "RestartPolicy",
    "SpecError",
    "Transform",
    "Trigger",
    "parse_restart_policy",
    "parse_spec",
]
