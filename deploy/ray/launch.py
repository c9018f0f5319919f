"""``headrace up --ray ADDRESS``: start the detached controller actor on a Ray cluster and record
where its admin API is, so ``headrace status / apply / down`` reach it as they reach a local one."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import TYPE_CHECKING

from rich.console import Console

from deploy.operator.client import CliError
from deploy.operator.state import DirStateStore
from deploy.operator.status import print_endpoints, print_status

if TYPE_CHECKING:
    from deploy.operator.desired import Desired


def connect(address: str | None) -> str:
    """Join the cluster at ``address`` (None or "auto": $RAY_ADDRESS, else a local one)."""
    import ray  # noqa: PLC0415

    from deploy.ray.runtime import NAMESPACE  # noqa: PLC0415

    address = address if address not in (None, "auto") else os.environ.get("RAY_ADDRESS", "auto")
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING, log_to_driver=False)
        except (ConnectionError, RuntimeError) as e:
            raise CliError(f"cannot join the Ray cluster at {address}: {str(e).splitlines()[0]}", 1) from None
    return address


def wait_gone(address: str, timeout: float) -> None:
    """Wait until the controller actor has stopped what it ran and exited."""
    import ray  # noqa: PLC0415

    from deploy.ray.controller import CONTROLLER_ACTOR  # noqa: PLC0415
    from deploy.ray.runtime import NAMESPACE  # noqa: PLC0415

    connect(address)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(CONTROLLER_ACTOR, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)
    raise CliError(f"the controller actor is still stopping after {timeout:g} s", 1)


def up_on_ray(args: argparse.Namespace, text: str, want: Desired, store: DirStateStore, out: Console) -> int:
    import ray  # noqa: PLC0415

    from deploy.ray.controller import CONTROLLER_ACTOR, controller_actor  # noqa: PLC0415
    from deploy.ray.runtime import NAMESPACE  # noqa: PLC0415

    gw = want.docs.gateways[0] if want.docs.gateways else None
    if gw is not None and gw.spec.admin.tls is not None:
        raise CliError(f"{want.docs.origin(gw)}: spec.admin.tls: the controller actor on Ray serves its admin "
                       "API over plain HTTP for now; remove admin.tls to run with --ray", 2)
    if gw is not None and gw.spec.workers > 1:
        raise CliError(f"{want.docs.origin(gw)}: spec.workers: gateway workers share one host's ports; on Ray, "
                       "more gateways are actors of their own: remove workers and use --gateways N", 2)
    if args.gateways < 0:
        raise CliError(f"--gateways ({args.gateways}) must be 0 or more", 2)
    address = connect(args.ray)
    try:
        ray.get_actor(CONTROLLER_ACTOR, namespace=NAMESPACE)
    except ValueError:
        pass
    else:
        raise CliError(f"a headrace controller is already running on the Ray cluster at {address}; "
                       "use headrace status / apply, or headrace down first", 2)
    settings = want.settings
    token = store.token(settings.admin.token_file, settings.admin.token_env)
    actor = controller_actor(NAMESPACE)
    try:
        status = ray.get(actor.up.remote(text, token, args.method, args.tick, args.gateways), timeout=args.timeout)
    except Exception as e:  # noqa: BLE001  (a failed up leaves nothing running)
        ray.kill(actor, no_restart=True)
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise CliError(f"the controller actor could not start: {lines[-1] if lines else e}", 1) from None
    st = store.read()
    st.update(running=True, admin_url=status["admin"], gateway=status["gateway"], ray_address=address,
              controller_pid=None, processes={}, token_file=settings.admin.token_file, admin_tls_cert=None)
    store.write(st)
    print_endpoints(status, out)
    for g in status["ray"]["gateways"]:
        out.print(f"gateway actor {g.get('index')}: http {g.get('http')}  grpc {g.get('grpc')}  "
                  f"replicas {', '.join(g.get('replicas', []))}", highlight=False)
    print_status(status, out)
    out.print(f"controller: Ray actor {CONTROLLER_ACTOR!r} (namespace {NAMESPACE}) on {address}; "
              "`headrace down` stops it", highlight=False)
    return 0
