"""A lease on an experiment, held in one of its tags: one scoring job at a time per checkpoint.

MLflow has no lock, and two cron runs scoring the same traces would judge and write every
trace twice. A lease is the tag ``<name>`` = ``{"owner", "expires_ms"}`` (JSON) on the
experiment: a run takes it when it is free or expired, waits ``settle_s`` and reads it back
(tags are last-writer-wins, and a SQL store may refuse the second of two writes at once: of
two runs that took it together, the one whose write is read back holds it), and :meth:`ExperimentLease.check` reads it again before each write, renewing it, so a
run whose lease expired and was taken stops before writing anything more. :meth:`release`
deletes the tag. An owner is ``host:pid:random``, so a message can name who holds it.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time

from mlflow.exceptions import MlflowException

__all__ = ["ExperimentLease", "LeaseHeld"]


class LeaseHeld(RuntimeError):
    """Another run holds the lease (its owner and expiry in the message)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class ExperimentLease:
    """The lease ``name`` on ``experiment_id``, for ``ttl_s`` seconds at a time."""

    def __init__(self, client, experiment_id: str, name: str, *, ttl_s: float = 600.0, settle_s: float = 1.0):
        self.client, self.experiment_id, self.name = client, experiment_id, name
        self.ttl_ms, self.settle_s = int(ttl_s * 1000), settle_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._expires_ms = 0

    def _held(self) -> dict | None:
        raw = self.client.get_experiment(self.experiment_id).tags.get(self.name)
        try:
            held = json.loads(raw) if raw else None
        except ValueError:
            return None
        return held if isinstance(held, dict) and isinstance(held.get("expires_ms"), int) else None

    def _write(self) -> None:
        self._expires_ms = _now_ms() + self.ttl_ms
        self.client.set_experiment_tag(self.experiment_id, self.name,
                                       json.dumps({"owner": self.owner, "expires_ms": self._expires_ms}))

    @staticmethod
    def _describe(held: dict | None) -> str:
        if held is None:
            return "another run, which released it meanwhile"
        left = (held["expires_ms"] - _now_ms()) / 1000
        return f"{held.get('owner')!s} (expires in {left:.0f} s)"

    def acquire(self, wait_s: float = 0.0, poll_s: float = 2.0) -> None:
        """Take the lease, waiting up to ``wait_s`` for another holder to release it or expire;
        :class:`LeaseHeld` naming the holder when it does not."""
        deadline = time.monotonic() + wait_s
        while True:
            held = self._held()
            if held is None or held.get("owner") == self.owner or held["expires_ms"] <= _now_ms():
                try:
                    self._write()
                except MlflowException:  # a store refusing two writes of the tag at once: one won
                    pass
                time.sleep(self.settle_s)
                held = self._held()
                if held is not None and held.get("owner") == self.owner:
                    return
            if time.monotonic() + poll_s > deadline:
                raise LeaseHeld(f"another run scores these traces: experiment {self.experiment_id} tag {self.name} "
                                f"is held by {self._describe(held)}; it is released when that run ends "
                                "(or expires if it was killed)")
            time.sleep(poll_s)

    def check(self) -> None:
        """Before a write: still ours (renewed when half its time is gone), else :class:`LeaseHeld`."""
        held = self._held()
        if held is None or held.get("owner") != self.owner:
            taken = f"now held by {self._describe(held)}" if held else "released by someone else"
            raise LeaseHeld(f"this run lost its lease {self.name} on experiment {self.experiment_id} ({taken}); "
                            "it stopped before writing more")
        if self._expires_ms - _now_ms() < self.ttl_ms // 2:
            self._write()

    def release(self) -> None:
        """Delete the tag if it is still ours."""
        held = self._held()
        if held is not None and held.get("owner") == self.owner:
            try:
                self.client.delete_experiment_tag(self.experiment_id, self.name)
            except MlflowException:  # a server without DeleteExperimentTag: the lease expired now
                self.client.set_experiment_tag(self.experiment_id, self.name,
                                               json.dumps({"owner": self.owner, "expires_ms": 0}))
