"""Splitting one fleet over N gateways so that every replica belongs to exactly one of them.

A gateway's batcher plans each replica's next batch from what *it* has sent there. Two
gateways sending batches to one replica would each plan as if they were alone: the replica
would run both batches back to back and both deadlines would be missed. So N gateways in front
of one fleet split the replicas, never share them (:meth:`Partition.verify`).

The rule, pure and deterministic (every worker and every host computes the same split):

- a model with at least N replicas is split by replica over all N gateways: each gateway holds
  ⌊r/N⌋ or ⌈r/N⌉ of them, replicas of one variant and profile dealt round-robin so each
  gateway gets the same mix;
- a model with fewer replicas than N is split over r gateways, one replica each (one gateway
  when it has one replica), chosen among the least loaded; the others do not serve it, and
  :attr:`Partition.owners` says where it lives (a load balancer routes by model, or a gateway
  forwards to an owner);
- a model with no replica (a best-effort model a partial plan sheds) is in every gateway, with
  none: each answers it with the no-replica refusal.

Load is counted in replicas: a gateway's work grows with the batches it forms and sends.

Generative models (``llm_models``) are not split: every gateway relays to all their engines. An
engine batches continuously, so requests from several gateways share it as they would from one
(its load gauges, which the picker reads, count them all); dealing engines out instead would
leave a model on one engine unanswerable by the gateways without it, where the kernel spreads
clients over workers by connection, not by model. A config of generative models only is
served by any number of gateways.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.errors import ConfigError
from profiles.gateway_config import GatewayConfig, ModelConfig, ReplicaConfig


def replica_id(r: ReplicaConfig) -> str:
    """The id the gateway gives a replica: its configured one, else the one its
    :class:`GatewayConfig` gave it when validated (``variant#k``,
    :func:`~profiles.gateway_config.default_replica_id`; never its url)."""
    if r.id is None:
        raise ConfigError(f"replica of {r.variant} has no id: it is not part of a validated gateway config")
    return r.id



@dataclass(frozen=True)
class Partition:
    """N gateway configs over one fleet. ``configs[i]`` holds only gateway i's replicas;
    ``owners[model]`` lists the gateways (ascending) that serve ``model``."""

    configs: tuple[GatewayConfig, ...]
    owners: dict[str, tuple[int, ...]]

    @property
    def n(self) -> int:
        return len(self.configs)

    def everywhere(self) -> bool:
        """Every gateway serves every model (no request needs routing by model)."""
        return all(len(o) == self.n for o in self.owners.values())

    def partial(self) -> dict[str, tuple[int, ...]]:
        """The models some gateway does not serve, with the gateways that do."""
        return {m: o for m, o in self.owners.items() if len(o) < self.n}

    def verify(self, cfg: GatewayConfig) -> None:
        """:class:`ConfigError` unless each of ``cfg``'s replicas is in exactly one gateway,
        under the same model, and the gateways hold nothing else."""
        home: dict[str, list[int]] = {}
        for i, part in enumerate(self.configs):
            for m in part.models:
                for r in m.replicas:
                    home.setdefault(f"{m.name}/{replica_id(r)}", []).append(i)
        want = {f"{m.name}/{replica_id(r)}" for m in cfg.models for r in m.replicas}
        missing = sorted(want - home.keys())
        extra = sorted(home.keys() - want)
        shared = sorted(k for k, at in home.items() if len(at) > 1)
        if missing or extra or shared:
            raise ConfigError(f"partition over {self.n} gateways: replicas in no gateway {missing}, "
                              f"not in the fleet {extra}, in several gateways {shared}")


def partition(cfg: GatewayConfig, n: int) -> Partition:
    """``cfg``'s replicas split over ``n`` gateways (see the module's rule). Every gateway
    keeps ``cfg``'s settings (listen, scheduler, TLS, tenants, ...); callers give each its
    own ports where it needs them. :class:`ConfigError` when ``n`` is below 1 or above the
    fleet's replica count (a gateway would serve nothing)."""
    total = sum(len(m.replicas) for m in cfg.models)
    if n < 1:
        raise ConfigError(f"gateway count ({n}) must be at least 1")
    if n > total and not cfg.llm_models:
        raise ConfigError(f"gateway count ({n}) exceeds the fleet's replicas ({total}): a gateway would serve nothing")
    load = [0] * n
    per_gateway: list[list[ModelConfig]] = [[] for _ in range(n)]
    owners: dict[str, tuple[int, ...]] = {}
    # the models with the fewest replicas are placed last, on whatever is lightest by then
    for m in sorted(cfg.models, key=lambda m: -len(m.replicas)):
        # a model with no replica (shed by a partial plan) is in every gateway, each refusing it
        shares = _deal(m.replicas, _lightest(load, min(n, len(m.replicas)) or n))
        for i, reps in shares.items():
            per_gateway[i].append(m.model_copy(update={"replicas": reps}, deep=True))
            load[i] += len(reps)
        owners[m.name] = tuple(sorted(shares))
    order = {m.name: k for k, m in enumerate(cfg.models)}  # each gateway lists models as cfg does
    configs = tuple(
        cfg.model_copy(update={"models": sorted(ms, key=lambda m: order[m.name])}, deep=True) for ms in per_gateway
    )
    for c in configs:
        c.base_dir = cfg.base_dir  # excluded from copies' fields; profiles resolve from the same folder
    out = Partition(configs, {m.name: owners[m.name] for m in cfg.models})
    out.verify(cfg)
    return out


def _lightest(load: Sequence[int], k: int) -> list[int]:
    """The ``k`` least-loaded gateways, lightest first (ties: lowest index)."""
    return sorted(range(len(load)), key=lambda i: (load[i], i))[:k]


def _deal(replicas: Sequence[ReplicaConfig], gateways: Sequence[int]) -> dict[int, list[ReplicaConfig]]:
    """Replicas dealt round-robin over ``gateways`` (lightest first, so a remainder lands on
    the lightest), grouped by variant and profile so each gateway gets the same mix."""
    kinds = sorted(replicas, key=lambda r: (r.variant, r.profile))  # stable: config order within a kind
    out: dict[int, list[ReplicaConfig]] = {g: [] for g in gateways}
    for k, r in enumerate(kinds):
        out[gateways[k % len(gateways)]].append(r)
    return out
