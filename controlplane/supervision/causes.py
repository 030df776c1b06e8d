"""Why a run ended: the one list of end causes (Run.cause, Run.end_cause, Failure.cause).

Pure (no Django): the catalogue of explanations (explain) reads it as well as the modules that
end runs (endings, reconciler, applications, hosts, controls). A `StrEnum`, so a member is the
string stored in the database, and `choices` has Django's shape for a form or a field."""

from __future__ import annotations

from enum import StrEnum


class EndCause(StrEnum):
    # The driver's own end, by its exit code.
    EXITED = "exited"
    CRASHED = "crashed"
    # Asked for: an operator's stop or kill, a recycle of the run's shared application.
    STOPPED = "stopped"
    KILLED = "killed"
    RECYCLED = "recycled"
    # Seen by the control plane.
    APPLICATION_LOST = "application-lost"
    HOST_LOST = "host-lost"
    VANISHED = "vanished"
    LAUNCH_LOST = "launch-lost"
    LAUNCH_FAILED = "launch-failed"
    # Decided by the control plane (the driver is killed for it).
    NO_HEARTBEAT = "lost-heartbeat"
    STALLED = "stalled"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        return [(c.value, c.label) for c in cls]


_LABELS = {
    EndCause.EXITED: "exited",
    EndCause.CRASHED: "crashed",
    EndCause.STOPPED: "stopped as asked",
    EndCause.KILLED: "killed",
    EndCause.RECYCLED: "stopped for a recycle of its shared application",
    EndCause.APPLICATION_LOST: "its shared application's process ended",
    EndCause.HOST_LOST: "its control-plane host was lost",
    EndCause.VANISHED: "the driver's process disappeared without an exit report",
    EndCause.LAUNCH_LOST: "its launch never completed",
    EndCause.LAUNCH_FAILED: "it could not be launched",
    EndCause.NO_HEARTBEAT: "no heartbeat in time",
    EndCause.STALLED: "stalled: no batch completed in time",
}

# Ends that are no failure: asked for by an operator, or a recycle of the run's application
# (the pipeline starts again as soon as it is back).
AS_ASKED = frozenset({EndCause.STOPPED, EndCause.KILLED, EndCause.RECYCLED})
