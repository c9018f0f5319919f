"""``RayStateStore``: the controller's state in a detached named actor, so it outlives the
controller's process and the driver that started it (same :class:`StateStore` interface as the
state directory)."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any

import ray

from deploy.ray.resources import HEAD, PIN

NAMESPACE = "headrace"
STATE_ACTOR = "headrace-state"


class StateActorImpl:
    """Holds the state, the generations' documents and the admin token."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.generations: dict[int, str] = {}
        self.admin_token = ""
        self.values: dict[str, Any] = {}  # what other actors keep across their restarts

    def put(self, key: str, value: Any) -> None:
        self.values[key] = value

    def get(self, key: str) -> Any:
        return self.values.get(key)

    def read(self) -> dict[str, Any]:
        return dict(self.state)

    def write(self, state: dict[str, Any]) -> None:
        self.state = dict(state)

    def save_generation(self, generation: int, documents: str) -> None:
        self.generations[generation] = documents

    def generation(self, generation: int) -> str:
        if generation not in self.generations:
            raise KeyError(f"no generation {generation} in the Ray state store")
        return self.generations[generation]

    def token(self, given: str | None = None) -> str:
        if given:
            self.admin_token = given
        elif not self.admin_token:
            self.admin_token = secrets.token_urlsafe(32)
        return self.admin_token


StateActor = ray.remote(num_cpus=0)(StateActorImpl)


def state_actor(namespace: str = NAMESPACE) -> Any:
    """The cluster's state actor (created detached on first use)."""
    return StateActor.options(name=STATE_ACTOR, namespace=namespace, lifetime="detached",
                              get_if_exists=True, resources={HEAD: PIN}).remote()


class RayStateStore:
    """:class:`deploy.operator.state.StateStore` on the state actor; ``run_dir`` is local to the
    controller's node (model repositories, the gateway's profiles)."""

    def __init__(self, namespace: str = NAMESPACE, run_dir: str | Path | None = None, timeout: float = 30.0) -> None:
        self.actor = state_actor(namespace)
        self.timeout = timeout
        self._run_dir = Path(run_dir or tempfile.mkdtemp(prefix="headrace-ray-"))

    @property
    def run_dir(self) -> Path:
        return self._run_dir

    def read(self) -> dict[str, Any]:
        return ray.get(self.actor.read.remote(), timeout=self.timeout)

    def write(self, state: dict[str, Any]) -> None:
        ray.get(self.actor.write.remote(state), timeout=self.timeout)

    def save_generation(self, generation: int, documents: str) -> None:
        ray.get(self.actor.save_generation.remote(generation, documents), timeout=self.timeout)

    def generation(self, generation: int) -> str:
        return ray.get(self.actor.generation.remote(generation), timeout=self.timeout)

    def token(self, token_file: str | None = None, env: str = "HEADRACE_ADMIN_TOKEN") -> str:
        """The token the driver handed over at ``up`` (the admin API checks it)."""
        return ray.get(self.actor.token.remote(), timeout=self.timeout)
