"""One promotion at a time: a lease on the registered model, and the alias moved only if it
still points where the decision read it.

Two gates started together both read the champion, both decide, and both move the alias: the
second then promotes a version it compared with a champion that is no longer the champion. So a
gate that records its decision first takes the model's *promotion lease*: a registered model
named ``<model>.rag_eval-promotion-lease``, created by ``create_registered_model``, which the
store refuses when the name exists (a unique key in the SQL stores, on every backend, so the
creation is the compare-and-swap). Its tags name the holder, the version being promoted and
the lease's expiry (:data:`LEASE_TTL_S` after it was taken). Holding it, the gate re-reads the
alias, compares it with what its decision read, records and moves the alias, then deletes the
lease. A gate that finds the lease held, or the alias moved, decides nothing (exit 2) and names
the winner: gate again, against the new champion. A lease past its expiry is a gate that died
holding it: the next gate deletes it and takes its own.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import time
import uuid

__all__ = ["LEASE_SUFFIX", "LEASE_TTL_S", "PromotionConflict", "lease_name", "promotion_lease"]

LEASE_SUFFIX = ".rag_eval-promotion-lease"
#: how long a lease holds before another gate may take it over (a gate records in seconds)
LEASE_TTL_S = 300.0
_TAG = "rag_eval.lease"


class PromotionConflict(Exception):
    """Another gate is promoting the model, or has moved the alias since this decision read it."""


def lease_name(model: str) -> str:
    return f"{model}{LEASE_SUFFIX}"


def _iso(epoch_s: float) -> str:
    return _dt.datetime.fromtimestamp(epoch_s, _dt.timezone.utc).isoformat(timespec="seconds")


def _held_by(tags: dict[str, str]) -> str:
    expires = float(tags.get(f"{_TAG}.expires_at", 0) or 0)
    return (f"the gate of v{tags.get(f'{_TAG}.version', '?')} ({tags.get(f'{_TAG}.owner', '?')}) holds its "
            f"promotion lease until {_iso(expires)}")


@contextlib.contextmanager
def promotion_lease(client, model: str, version: str, ttl_s: float = LEASE_TTL_S):
    """Hold ``model``'s promotion lease while the block runs (see the module docstring).

    Raises:
        PromotionConflict: another gate holds a lease that has not expired.
    """
    from mlflow.exceptions import MlflowException

    name, holder = lease_name(model), uuid.uuid4().hex
    tags = {f"{_TAG}.holder": holder, f"{_TAG}.model": model, f"{_TAG}.version": str(version),
            f"{_TAG}.owner": f"{socket.gethostname()} pid {os.getpid()}",
            f"{_TAG}.expires_at": f"{time.time() + ttl_s:.3f}"}
    for attempt in range(2):
        try:
            client.create_registered_model(name, tags=tags, description=(
                f"Promotion lease of {model!r}, held by a gate promoting v{version} (mlflow-rag-eval); "
                "it is deleted when the gate ends. Delete it only if that gate died."))
            break
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            try:
                held = dict(client.get_registered_model(name).tags or {})
            except MlflowException:
                continue  # released meanwhile: try again
            if attempt or float(held.get(f"{_TAG}.expires_at", 0) or 0) > time.time():
                raise PromotionConflict(f"another gate is promoting {model!r}: {_held_by(held)}") from None
            _delete_if_held(client, name, held.get(f"{_TAG}.holder"))  # expired: its gate died
    else:
        raise PromotionConflict(f"another gate is promoting {model!r}: its promotion lease {name!r} keeps changing")
    try:
        yield
    finally:
        _delete_if_held(client, name, holder)


def _delete_if_held(client, name: str, holder: str | None) -> None:
    """Delete the lease if ``holder`` still holds it (never another gate's)."""
    from mlflow.exceptions import MlflowException

    try:
        if (client.get_registered_model(name).tags or {}).get(f"{_TAG}.holder") == holder:
            client.delete_registered_model(name)
    except MlflowException:
        pass  # gone already
