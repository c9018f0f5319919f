"""How the EDF scheduler serves sequence requests (a mixin of
:class:`gateway.policy.scheduler.EdfScheduler`): a request of a sequence waits for the replica
its sequence is bound to (:mod:`gateway.policy.sequences`) and goes out alone, in order."""

from __future__ import annotations

from typing import Any

from gateway.policy.replica import Replica
from gateway.policy.sequences import Sequences
from gateway.policy.types import Batch, Priority, Reject, RejectReason, Request


class SequenceScheduling:
    """Needs the scheduler's state and helpers declared here."""

    config: Any
    policy: Any
    _sequences: Sequences
    _replicas: dict[str, Replica]
    _pending: dict[int, Request]
    _retried: set[int]
    _order: Any
    _variant_infos: Any
    _reject: Any

    def _submit_in_sequence(self, model: Any, request: Request, live: dict[str, list[Replica]],
                            now: float) -> Reject | None:
        """A request of a sequence waits for the replica its sequence is bound to; a new
        sequence binds to a replica of the model's preferred variant, the one holding fewest
        sequences (see :mod:`gateway.policy.sequences`)."""
        seqs = self._sequences
        rid = seqs.replica_of(request)
        if rid is None:
            order = [v for v in self._order(model, self._variant_infos(model, live), request)
                     if request.size <= max(r.info.max_batch for r in live[v])]
            if not order:
                return self._reject(request, RejectReason.INFEASIBLE, self.config.min_retry_after_s,
                                    f"no variant of model {request.model!r} takes this sequence request")
            rid = seqs.least_bound([r.info.id for r in live[order[0]]])
        rep = self._replicas.get(rid)
        if rep is None or not rep.healthy:
            return self._reject(request, RejectReason.NO_REPLICA, self.config.no_replica_retry_after_s,
                                f"the replica holding sequence {request.sequence!r} of model "
                                f"{request.model!r} is not serving; start the sequence again")
        if self.policy.deadline_aware:
            ahead = sum(r.size for r in seqs.waiting(rid))
            finish = rep.start(now) + rep.latency(min(ahead + request.size, rep.info.max_batch)) * (
                1 + ahead // rep.info.max_batch)
            if finish > request.deadline:
                reason = RejectReason.SHED if request.priority == Priority.BEST_EFFORT else RejectReason.INFEASIBLE
                return self._reject(
                    request, reason, max(self.config.min_retry_after_s, finish - request.deadline),
                    f"predicted finish {(finish - now) * 1e3:.1f} ms from now is past the deadline "
                    f"{(request.deadline - now) * 1e3:.1f} ms from now")
        seqs.bind(request, rid, now)
        self._pending[request.id] = request
        return None

    def _poll_sequences(self, now: float, batches: list[Batch], rejects: list[Reject]) -> None:
        """Send each replica's next sequence request while it has a slot, each alone; answer
        those whose replica is gone or unhealthy, or that can no longer finish in time."""
        seqs = self._sequences
        for rid in seqs.replicas_waited_on():
            rep = self._replicas.get(rid)
            if rep is None or not rep.healthy:
                for r in seqs.drop_waiting(rid):
                    rejects.append(self._reject(
                        r, RejectReason.FAILED if r.id in self._retried else RejectReason.NO_REPLICA,
                        self.config.no_replica_retry_after_s,
                        f"the replica holding sequence {r.sequence!r} of model {r.model!r} is not serving"))
                continue
            while rep.has_slot() and (r := seqs.next(rid)) is not None:
                seqs.take(rid, r)
                start = rep.start(now)
                finish = start + rep.latency(r.size)
                if self.policy.deadline_aware and finish > r.deadline:
                    rejects.append(self._reject(
                        r, RejectReason.EXPIRED, self.config.min_retry_after_s,
                        f"no replica can finish it by its deadline ({(r.deadline - now) * 1e3:.1f} ms from now)"))
                    continue
                seqs.started(r)
                batch = Batch(rid, rep.info.variant, (r,), now, finish)
                rep.dispatch(batch)
                batches.append(batch)
