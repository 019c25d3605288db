"""A data plane's parts that a setting turns off, each an explicit object in the part's
place (never None): it runs no task, does nothing when asked, and says what it is and
why it is off, which the core logs once at start (``core.py``), so that no feature is
off silently. Admission control's is ``admission_gate.AdmissionOff``."""

from __future__ import annotations


class Off:
    """A part that is off: ``what`` it is, ``why`` (the setting that turned it off).
    Its background task (``run``) ends at once."""

    def __init__(self, what: str, why: str) -> None:
        self.what, self.why = what, why

    def __str__(self) -> str:
        return f"{self.what} ({self.why})"

    async def run(self) -> None:
        return None


class ReportsOff(Off):
    """No health reports to the control plane: the votes are dropped."""

    def __init__(self, why: str) -> None:
        super().__init__("health reports", why)
        self.observer = ""  # the name reports would have gone under

    def record(self, region: str, ok: bool, status: int = 0) -> None:
        return None

    async def close(self) -> None:
        return None


class ExportOff(Off):
    """No prefix export to etcd: the control plane's leader pre-warms nothing from this
    process's traffic."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(what, why)
        self.gateway_id = ""  # the name the export would have gone under


class CapacityOff(Off):
    """The ``capacity/`` watch that bounds admission control is not run."""

    def __init__(self, why: str) -> None:
        super().__init__("the capacity/ watch", why)

    async def rechecks(self) -> None:
        return None
