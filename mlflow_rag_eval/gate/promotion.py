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
the winner and the command that clears its lease: gate again, against the new champion. A lease
past its expiry is a gate that died holding it: the next gate deletes it and takes its own. So
is a lease whose expiry cannot be read or lies further ahead than any gate writes
(:func:`lease_expiry`: not a number, not finite, more than 100 TTLs ahead): the registered model
is editable by any writer of the registry, and the decision's notes name it (model, holder,
value); it never surfaces as an OS or parsing error.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import socket
import time
import uuid

__all__ = ["DECISION_FILE", "DECISIONS_DIR", "LEASE_SUFFIX", "LEASE_TTL_S", "PromotionConflict", "lease_expiry",
           "lease_name", "promotion_lease", "record_decision"]

DECISION_FILE = "rag_eval/gate_decision.json"
DECISIONS_DIR = "rag_eval/gate_decisions"

LEASE_SUFFIX = ".rag_eval-promotion-lease"
#: how long a lease holds before another gate may take it over (a gate records in seconds)
LEASE_TTL_S = 300.0
_TAG = "rag_eval.lease"


class PromotionConflict(Exception):
    """Another gate is promoting the model, or the alias moved since this decision read it.

    ``recorded``: the decision was recorded (tags ``aborted``) before the move was aborted."""

    def __init__(self, message: str, recorded: bool = False):
        super().__init__(message)
        self.recorded = recorded


def lease_name(model: str) -> str:
    return f"{model}{LEASE_SUFFIX}"


def _iso(epoch_s: float) -> str:
    return _dt.datetime.fromtimestamp(epoch_s, _dt.timezone.utc).isoformat(timespec="seconds")


#: the latest expiry a lease may name: a gate writes now + its TTL; anything further is no gate's
_MAX_AHEAD_S = 100 * LEASE_TTL_S


def lease_expiry(tags: dict[str, str]) -> tuple[float | None, str]:
    """The lease's expiry (epoch seconds), or None with why it cannot be read: missing, not a
    number, not finite, or further ahead than any gate writes (:data:`LEASE_TTL_S`), which no
    gate's clock explains. Never raises: a lease is a registered model anyone may edit."""
    raw = tags.get(f"{_TAG}.expires_at")
    if raw is None:
        return None, "no expires_at tag"
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None, f"expires_at {raw[:80]!r} is not a number"
    if not math.isfinite(value) or value < 0:
        return None, f"expires_at {raw[:80]!r} is not a time"
    if value > time.time() + _MAX_AHEAD_S:
        return None, (f"expires_at {raw[:80]!r} is further ahead than any gate writes (a lease lasts "
                      f"{LEASE_TTL_S:g} s)")
    return value, ""


def _clear_command(name: str) -> str:
    return f"MlflowClient().delete_registered_model({name!r})"


def _held_by(name: str, tags: dict[str, str]) -> str:
    expires, why = lease_expiry(tags)
    until = _iso(expires) if expires is not None else f"an unreadable expiry ({why})"
    return (f"the gate of v{tags.get(f'{_TAG}.version', '?')} ({tags.get(f'{_TAG}.owner', '?')}, holder "
            f"{tags.get(f'{_TAG}.holder', '?')}) holds its promotion lease {name!r} until {until}; if that gate "
            f"died, clear it: {_clear_command(name)}")


def _unreadable(model: str, name: str, tags: dict[str, str], why: str) -> str:
    return (f"the promotion lease {name!r} of {model!r} (holder {tags.get(f'{_TAG}.holder', '?')}, "
            f"owner {tags.get(f'{_TAG}.owner', '?')}) was unreadable ({why}): no gate writes such a lease, so it "
            "was taken as expired and replaced")


@contextlib.contextmanager
def promotion_lease(client, model: str, version: str, ttl_s: float = LEASE_TTL_S, notes: list | None = None):
    """Hold ``model``'s promotion lease while the block runs (see the module docstring).

    A lease whose expiry cannot be read, or lies further ahead than any gate writes
    (:func:`lease_expiry`), is taken as expired, and ``notes`` (when given) gets a line naming
    it (model, holder, value).

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
            expires, why = lease_expiry(held)
            if attempt or (expires is not None and expires > time.time()):
                raise PromotionConflict(f"another gate is promoting {model!r}: {_held_by(name, held)}") from None
            if expires is None and notes is not None:
                notes.append(_unreadable(model, name, held, why))
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


def _refuse_moved(client, decision, when: str) -> None:
    """Compare-and-set: the alias must still point where the decision read it
    (``decision.alias_holder``); else :class:`PromotionConflict` naming who holds it now."""
    from mlflow_rag_eval.tracking import search as lookup

    current = lookup.champion_version(client, decision.model, decision.champion_alias)
    now = None if current is None else str(current.version)
    read = decision.alias_holder
    if now == read:
        return
    holder = "no version" if now is None else f"v{now}"
    if current is not None and current.tags.get("rag_eval.gate_decided_at"):
        holder += f" (promoted by the gate at {current.tags['rag_eval.gate_decided_at']})"
    elif current is not None:
        holder += " (not by a gate: the version has no rag_eval.gate_decided_at tag; a person or another tool moved it)"
    was = "no version" if read is None else f"v{read}"
    raise PromotionConflict(f"alias {decision.champion_alias!r} of {decision.model!r} moved to {holder} {when}, "
                            f"after this gate read it on {was}")


def record_decision(client, decision, champion) -> None:
    """Record ``decision`` (a :class:`~mlflow_rag_eval.gate.decision.GateDecision`) and, on a pass,
    move the alias; call it holding the model's promotion lease.

    The alias is compared and set at the moment of the move: re-read before anything is recorded
    and again right before it is set, so a person who moved it meanwhile is never overwritten.
    A passing version's tags say ``rag_eval.gate=pending`` until the alias has moved, then
    ``passed``: a gate killed in between leaves ``pending``, never a ``passed`` version that does
    not hold the alias. Aborted at the move, the tags say ``aborted``.

    Raises:
        PromotionConflict: the alias moved since the decision read it (nothing moved by this gate).
    """
    _refuse_moved(client, decision, "before this decision was recorded (nothing recorded)")
    model, version, run_id = decision.model, decision.candidate_version, decision.candidate_run_id
    payload = decision.as_dict()
    stamp = re.sub(r"[^0-9A-Za-z]", "", decision.decided_at)
    name = re.sub(r"[^0-9A-Za-z_.-]", "_", model)
    verdict = "pending" if decision.passed else decision.verdict
    _tag(client, decision, verdict)
    for key, value in {"rag_eval.gate_run_id": run_id, "rag_eval.gate_policy_sha256": decision.policy_hash,
                       "rag_eval.gate_decided_at": decision.decided_at}.items():
        client.set_model_version_tag(model, version, key, value)
    client.log_dict(run_id, payload, DECISION_FILE)
    client.log_dict(run_id, payload, f"{DECISIONS_DIR}/{stamp}_{name}_v{version}.json")
    for key, value in {"rag_eval.gate.model": model, "rag_eval.gate.version": version,
                       "rag_eval.gate.decided_at": decision.decided_at}.items():
        client.set_tag(run_id, key, value)
    if not decision.passed:
        return
    try:
        _refuse_moved(client, decision, "while this gate recorded (the move was aborted)")
    except PromotionConflict as exc:
        _tag(client, decision, "aborted")
        raise PromotionConflict(str(exc), recorded=True) from None
    if champion is not None:
        client.set_registered_model_alias(model, f"previous_{decision.champion_alias}", str(champion.version))
    client.set_registered_model_alias(model, decision.champion_alias, version)
    from mlflow_rag_eval.tracking.search import GATED_ALIAS_TAG

    # what the alias should point at, should its version be deleted (see the decision's _champion)
    client.set_registered_model_tag(model, f"{GATED_ALIAS_TAG}.{decision.champion_alias}", version)
    _tag(client, decision, "passed")


def _tag(client, decision, verdict: str) -> None:
    """``rag_eval.gate`` on the candidate version and its evaluation run."""
    client.set_model_version_tag(decision.model, decision.candidate_version, "rag_eval.gate", verdict)
    client.set_tag(decision.candidate_run_id, "rag_eval.gate", verdict)
