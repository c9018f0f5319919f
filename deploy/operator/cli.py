"""``headrace up / apply / status / down / rollback``: the operator's commands.

``up`` runs the controller (and the gateway, a process of its own) in the foreground until
Ctrl-C, SIGTERM or ``headrace down``; ``--detach`` leaves it running in its own session under
a supervisor that starts it again if it dies (:mod:`deploy.operator.supervisor`);
``--dry-run`` checks the documents and the state directory, plans, prints what it would start
and starts nothing. Every
command refuses a state directory whose ``state.json`` is corrupt (one line, exit 2), before it
starts or stops anything (:mod:`deploy.operator.state`). The other commands talk
to the running controller's admin API, found through the state directory; over HTTPS (the
Gateway's ``spec.admin.tls``) they verify its certificate with ``--admin-ca`` or
``$HEADRACE_ADMIN_CA``, else with the certificate the controller recorded in the state
directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from rich.console import Console

from deploy.commands import run
from deploy.operator.client import ADMIN_CA_ENV, CliError, admin_context, call
from deploy.operator.desired import admin_tls, validate
from deploy.operator.state import STATE_ENV, DirStateStore, StateError, same_process
from deploy.operator.status import changes, print_endpoints, print_status

WIDTH = 120

if TYPE_CHECKING:
    from deploy.operator.desired import Desired
    from profiles.profile import ProfileSet

HELP = """examples:
  headrace up -f deploy/examples/quickstart            # foreground; Ctrl-C stops everything
  headrace up -f deploy/examples/quickstart --detach   # leave it running
  headrace up -f deploy/examples/quickstart --dry-run  # check and plan; start nothing
  headrace status -o table
  headrace apply -f models.yaml --dry-run              # print the diff, and whether it would be refused
  headrace apply -f models.yaml                        # roll it out, make-before-break; wait for it
  headrace apply -f models.yaml --allow-disruption     # accept a change that drops capacity for a while
  headrace rollback [--to N]                           # restore generation N's fleet
  headrace down
The state directory is --state-dir, else $HEADRACE_STATE_DIR, else ./.headrace. The admin token
comes from $HEADRACE_ADMIN_TOKEN, else the state directory's token file (made by up, mode 0600).
An admin API over HTTPS is verified with --admin-ca FILE, else $HEADRACE_ADMIN_CA, else the
certificate up recorded in the state directory.
"""


def _client(args: argparse.Namespace) -> tuple[str, str, ssl.SSLContext | None]:
    """The admin URL, token and (over HTTPS) how its certificate is verified."""
    store = DirStateStore.default(args.state_dir)
    st = store.read()
    url = args.admin or st.get("admin_url")
    if not url or not st.get("running"):
        raise CliError(f"no running controller in {store.path} (start one with headrace up)", 1)
    try:
        token = store.token(st.get("token_file"))
    except OSError as e:
        raise CliError(f"admin token: {e}", 1) from None
    ca = getattr(args, "admin_ca", None) or os.environ.get(ADMIN_CA_ENV)
    return url, token, admin_context(ca, st.get("admin_tls_cert")) if url.startswith("https:") else None


# --------------------------------------------------------------------------- up


def _not_running(store: DirStateStore) -> dict:
    """The state, where no controller runs on it (a corrupt state file: :class:`StateError`)."""
    st = store.read()
    pid = st.get("controller_pid")
    if pid and same_process(pid, st.get("controller_started")) and pid != os.getpid():
        raise CliError(f"a controller is already running on {store.path} (pid {pid}); "
                       "use headrace status / apply, or headrace down first", 2)
    return st


def _cleanup_leftovers(store: DirStateStore, out: Console) -> None:
    """A controller that died left processes: stop exactly those (pid and start time match)."""
    st = _not_running(store)
    left = _left(st)
    if left:
        _stop_left(store, st)
        for name, p in left.items():
            out.print(f"stopped {name} (pid {p['pid']}), left by a previous controller")


async def _serve(args: argparse.Namespace, want: Desired | None, base: ProfileSet, store: DirStateStore,
                 out: Console) -> int:
    """Run the controller until it is stopped: ``up`` of ``want``, or (``want`` None) taking
    over the fleet the state records (:func:`deploy.operator.takeover.take_over`)."""
    from deploy.operator.admin import serve_admin  # noqa: PLC0415
    from deploy.operator.controller import Controller  # noqa: PLC0415
    from deploy.operator.desired import prepare  # noqa: PLC0415
    from deploy.operator.gateway_workers import gateway_factory  # noqa: PLC0415
    from deploy.operator.state import start_time  # noqa: PLC0415
    from deploy.operator.takeover import AdoptError, check_adoptable, take_over  # noqa: PLC0415
    from placement.apply.executors import ExecutorError  # noqa: PLC0415
    from placement.plan import PlanError  # noqa: PLC0415
    from placement.solve.solver import SolverError  # noqa: PLC0415

    st = store.read()
    was = dict(st)
    if want is None:
        try:
            check_adoptable(st)
            want = prepare(store.generation(int(st["observed_generation"])), base, "adopt")
        except (AdoptError, OSError, ValueError) as e:
            raise CliError(f"cannot take the fleet over: {e}", 2) from None
    settings = want.settings
    token = store.token(settings.admin.token_file, settings.admin.token_env)
    tls = admin_tls(want.docs)
    start_gateway, adopt_gateway = gateway_factory(store, settings.workers)
    ctl = Controller(store, base, method=args.method, tick=args.tick, start_gateway=start_gateway,
                     adopt_gateway=adopt_gateway)
    st.update(controller_pid=os.getpid(), controller_started=start_time(os.getpid()),
              token_file=settings.admin.token_file, running=False,
              admin_tls_cert=None if tls is None else str(tls.cert_path.resolve()))
    store.write(st)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = None
    try:
        try:
            if args.adopt:
                try:
                    await take_over(ctl, was, want)
                except AdoptError as e:
                    raise CliError(f"cannot take the fleet over: {e}", 2) from None
            else:
                await ctl.up(want)
            runner, ctl.admin_url = await serve_admin(ctl, token, settings.admin.host, settings.admin.port,
                                                      None if tls is None else tls.ssl_context())
        except (ExecutorError, SolverError, PlanError, OSError, RuntimeError) as e:
            raise CliError(str(e).splitlines()[0] if isinstance(e, SolverError | PlanError) else str(e),
                           2 if isinstance(e, SolverError | PlanError) else 1) from None
        ctl.save()
        # the plan, profiles and gateway live as long as the controller: keep them out of the
        # collector's full passes, which would otherwise stall the event loop serving requests
        gc.collect()
        gc.freeze()
        print_endpoints(ctl.status(), out)
        print_status(ctl.status(), out)
        out.print("serving; Ctrl-C or `headrace down` stops everything", highlight=False)
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(ctl.stopped.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
    finally:
        if runner is not None:
            await runner.cleanup()
        if not ctl.stopped.is_set():
            await ctl.down()
        st = store.read()
        st.update(running=False, controller_pid=None, processes={})
        store.write(st)
    out.print("stopped", highlight=False)
    return 0


def up(args: argparse.Namespace) -> int:
    out = Console(width=WIDTH)
    store = DirStateStore.default(args.state_dir)
    if args.adopt:  # the supervisor's restart: the fleet the state records, not the files
        from deploy.operator.desired import base_profiles  # noqa: PLC0415
        from gateway.serving import run_on_serve_loop  # noqa: PLC0415

        _not_running(store)
        return run_on_serve_loop(_serve(args, None, base_profiles(), store, out))
    if not args.file:
        raise CliError("-f FILE|DIR is required (the deployment documents)", 2)
    text, want, base = validate(args.file, check_security=True)
    if args.dry_run:
        return _dry_run(want, base, store, args.method, out)
    _cleanup_leftovers(store, out)
    if args.ray is not None or single_pool_runtime(want) == "ray":
        from deploy.ray.launch import up_on_ray  # noqa: PLC0415

        return up_on_ray(args, text, want, store, out)
    if args.gateways:
        raise CliError(f"--gateways ({args.gateways}) needs --ray (or runtime: ray in the GpuPool)", 2)
    if args.detach:
        return _detach(args, store, out)
    from gateway.serving import run_on_serve_loop  # noqa: PLC0415

    return run_on_serve_loop(_serve(args, want, base, store, out))


def single_pool_runtime(want: Desired) -> str:
    return want.docs.pools[0].spec.runtime


def _dry_run(want: Desired, base: ProfileSet, store: DirStateStore, method: str, out: Console) -> int:
    """What ``up`` would start, from the documents already checked; nothing runs, nothing is written."""
    from deploy.operator.controller import Controller  # noqa: PLC0415
    from placement.plan import PlanError  # noqa: PLC0415
    from placement.solve.solver import SolverError  # noqa: PLC0415

    _not_running(store)
    try:
        res = Controller(store, base, method=method).preview(want)
    except (SolverError, PlanError) as e:
        raise CliError(str(e).splitlines()[0], 2) from None
    out.print(f"would start {len(res['started'])} replicas on {res['gpus']} GPUs "
              f"({len(res['steps'])} steps); nothing started", highlight=False)
    for s in res["steps"]:
        out.print(f"  {s}", highlight=False)
    return 0


def _detach(args: argparse.Namespace, store: DirStateStore, out: Console) -> int:
    """The controller under its supervisor (:mod:`deploy.operator.supervisor`), in a session of
    their own; returns once it serves."""
    argv = [sys.executable, "-m", "deploy.operator.supervisor", "--state-dir", str(store.path), "--",
            sys.executable, "-m", "deploy.operator.cli", "up", "--state-dir", str(store.path), "--method", args.method,
            "--tick", str(args.tick)]
    for f in args.file:
        argv += ["-f", str(Path(f).resolve())]
    st = store.read()
    st.update(running=False, admin_url=None)
    store.write(st)
    with open(store.log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = store.log_path.read_text(errors="replace")[-3000:]
            raise CliError(f"the controller exited with code {proc.returncode}; {store.log_path}:\n{tail}", 1)
        st = store.read()
        if st.get("running") and st.get("admin_url"):
            url, token, ctx = _client(args)
            status = call(url, token, "GET", "/v1/status", context=ctx)
            print_endpoints(status, out)
            print_status(status, out)
            out.print(f"controller pid {st.get('controller_pid')} under its supervisor (pid {proc.pid}), log "
                      f"{store.log_path}; `headrace down` stops it", highlight=False)
            return 0
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    raise CliError(f"the controller was not up after {args.timeout:g} s; see {store.log_path}", 1)


# --------------------------------------------------------------------------- the others


def _query(**flags: object) -> str:
    on = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in flags.items() if v is not None]
    return "?" + "&".join(on) if on else ""


def _print_change(res: dict, dry_run: bool) -> int:
    out = Console(width=WIDTH)
    head = "would execute" if dry_run else f"generation {res['generation']}: " + (
        "rolling out" if res.get("rolling") else "executed")
    out.print(f"{head} {len(res['steps'])} steps", highlight=False)
    for s in res["steps"]:
        out.print(f"  {s}", highlight=False)
    if res.get("refused"):
        out.print(f"refused: {res['refused']}", highlight=False)
    else:
        for d in res.get("capacity_dips", []):
            out.print(f"  note: {d}", highlight=False)
    return 0


def apply(args: argparse.Namespace) -> int:
    text, _, _ = validate(args.file)
    url, token, ctx = _client(args)
    q = _query(dry_run=args.dry_run or None, allow_disruption=args.allow_disruption or None,
               wait=None if args.wait else False)
    return _print_change(call(url, token, "POST", "/v1/apply" + q, text.encode(), context=ctx), args.dry_run)


def rollback(args: argparse.Namespace) -> int:
    url, token, ctx = _client(args)
    q = _query(to=args.to, dry_run=args.dry_run or None, allow_disruption=args.allow_disruption or None)
    return _print_change(call(url, token, "POST", "/v1/rollback" + q, b"", context=ctx), args.dry_run)


def _controller_down(st: dict) -> bool:
    """Whether the state says a local controller runs whose process is gone (killed, crashed)."""
    pid = st.get("controller_pid")
    return bool(st.get("running")) and not st.get("ray_address") and pid is not None \
        and not same_process(pid, st.get("controller_started"))


def _left(st: dict) -> dict[str, dict]:
    """The recorded processes still running (pid and start time both match)."""
    return {k: p for k, p in (st.get("processes") or {}).items() if same_process(p["pid"], p.get("started"))}


def _supervisor(st: dict) -> int | None:
    """The pid of the controller's supervisor, if it runs."""
    pid = st.get("supervisor_pid")
    return pid if pid and same_process(pid, st.get("supervisor_started")) else None


def _stop_supervisor(st: dict, timeout: float = 60.0) -> None:
    """SIGTERM to the supervisor (it passes it on to a controller it runs, which stops its
    fleet) and wait until it has exited, so it starts no controller again."""
    pid = _supervisor(st)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + timeout
    while same_process(pid, st.get("supervisor_started")) and time.monotonic() < end:
        time.sleep(0.1)


def _stop_left(store: DirStateStore, st: dict, grace: float = 10.0) -> int:
    """Stop what a dead controller left, from its state: its supervisor first (it would start
    the controller again), then SIGTERM to each recorded process group, SIGKILL after ``grace``
    s to what remains (matched by pid and start time, never by name). Returns how many were
    running."""
    _stop_supervisor(st)
    now = store.read()  # a controller it had just started may have recorded more
    st = {**now, "processes": {**(st.get("processes") or {}), **(now.get("processes") or {})}}
    left = _left(st)
    for p in left.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p["pid"], signal.SIGTERM)
    end = time.monotonic() + grace
    while _left({"processes": left}) and time.monotonic() < end:
        time.sleep(0.1)
    for p in _left({"processes": left}).values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p["pid"], signal.SIGKILL)
    store.write({**st, "running": False, "processes": {}, "admin_url": None})
    return len(left)


def down(args: argparse.Namespace) -> int:
    store = DirStateStore.default(args.state_dir)
    st = store.read()
    if _controller_down(st):
        n = _stop_left(store, st)
        Console(width=WIDTH).print(f"stopped: the controller (pid {st['controller_pid']}) was down; "
                                   f"{n} processes it left stopped", highlight=False)
        return 0
    url, token, ctx = _client(args)
    call(url, token, "POST", "/v1/down", b"", context=ctx)
    st = store.read()
    if st.get("ray_address"):  # the controller actor stops its actors, then exits
        from deploy.ray.launch import wait_gone  # noqa: PLC0415

        wait_gone(st["ray_address"], args.timeout)
        st.update(running=False, admin_url=None)
        store.write(st)
    pid = st.get("controller_pid")
    deadline = time.monotonic() + args.timeout
    while pid and same_process(pid, st.get("controller_started")) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid and same_process(pid, st.get("controller_started")):
        raise CliError(f"the controller (pid {pid}) is still stopping after {args.timeout:g} s", 1)
    _stop_supervisor(st, timeout=10.0)  # it ends with its controller; if not, it is stopped
    Console(width=WIDTH).print("stopped", highlight=False)
    return 0


def ensure_down(state_dir: str | Path) -> None:
    """Stop the controller on ``state_dir`` and all it started, whatever state it is in:
    ``headrace down``; if that fails, SIGTERM to the controller (it stops its children); last,
    every process it recorded (pid and start time must match)."""
    store = DirStateStore(state_dir)
    try:
        down(argparse.Namespace(state_dir=str(state_dir), admin=None, admin_ca=None, timeout=60.0))
        return
    except CliError:
        pass
    except StateError as e:
        raise CliError(str(e), 2) from None
    st = store.read()
    pid = st.get("controller_pid")
    if pid and same_process(pid, st.get("controller_started")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 60
        while same_process(pid, st.get("controller_started")) and time.monotonic() < end:
            time.sleep(0.2)
    _stop_left(store, store.read(), grace=0.0)


def watch(fetch, before: dict, interval: float, emit, sleep=time.sleep, polls: int | None = None) -> int:  # noqa: ANN001
    """``status --watch``: every ``interval`` s, what changed since ``before``
    (:func:`deploy.operator.status.changes`), a line each through ``emit``, until Ctrl-C (exit
    0) or the controller stops answering (one line, exit 1). ``polls``: stop after that many."""
    n = 0
    try:
        while polls is None or n < polls:
            sleep(interval)
            now = fetch()
            for line in changes(before, now):
                emit(line)
            sys.stdout.flush()
            before, n = now, n + 1
        return 0
    except KeyboardInterrupt:
        return 0
    except CliError as e:
        raise CliError(f"the controller stopped answering: {e}", 1) from None


def _offline(st: dict) -> dict:
    """What the state says while its controller is down: the generation, and which of the
    processes it recorded still run (the gateway among them)."""
    left = _left(st)
    sup = _supervisor(st)
    again = (f"its supervisor (pid {sup}) is starting it again, to take the fleet over" if sup else
             "nothing restarts it (headrace down stops what it left; headrace up starts it again)")
    return {"controller": "down", "message": f"the controller (pid {st['controller_pid']}) is not running; "
            f"{again}. This is its last recorded state, and the processes it recorded:",
            "supervisor": sup,
            "generation": st.get("generation"), "observedGeneration": st.get("observed_generation"),
            "history": st.get("history"),
            "processes": {k: {"pid": p["pid"], "running": k in left} for k, p in (st.get("processes") or {}).items()}}


def status(args: argparse.Namespace) -> int:
    st = DirStateStore.default(args.state_dir).read()
    if _controller_down(st):
        off = _offline(st)
        if args.output == "json":
            sys.stdout.write(json.dumps(off, indent=1) + "\n")
        elif args.output == "yaml":
            sys.stdout.write(yaml.safe_dump(off, sort_keys=False))
        else:
            out = Console(width=WIDTH)
            out.print(f"{off['message']}\ngeneration {off['generation']} (observed {off['observedGeneration']})",
                      highlight=False)
            for k, p in off["processes"].items():
                out.print(f"  {k}  pid {p['pid']}  {'running' if p['running'] else 'gone'}", highlight=False)
        return 0
    url, token, ctx = _client(args)
    st = call(url, token, "GET", "/v1/status", context=ctx)
    if args.output == "json":
        sys.stdout.write(json.dumps(st, indent=1) + "\n")
    elif args.output == "yaml":
        sys.stdout.write(yaml.safe_dump(st, sort_keys=False))
    else:
        print_status(st, Console(width=WIDTH))
    if args.watch:
        return watch(lambda: call(url, token, "GET", "/v1/status", context=ctx), st, args.interval,
                     print if args.output == "table" else lambda line: print(json.dumps({"change": line})))
    return 0


# --------------------------------------------------------------------------- wiring


def _run(fn):  # noqa: ANN001, ANN202
    def go(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except CliError as e:
            print(f"headrace {args.command}: {e}", file=sys.stderr)
            return e.code
        except StateError as e:
            print(f"headrace {args.command}: {e}", file=sys.stderr)
            return 2
    return go


def register(sub: argparse._SubParsersAction) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", default=None, help=f"controller state (default ${STATE_ENV} or ./.headrace)")
        p.add_argument("--admin", default=None, help="admin API URL (default: from the state directory)")
        p.add_argument("--admin-ca", default=None, metavar="FILE",
                       help=f"CA certificate(s) that verify an HTTPS admin API (default ${ADMIN_CA_ENV}, else "
                       "the certificate recorded in the state directory)")
        p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the controller")

    p = sub.add_parser("up", help="plan, start and serve model deployments from YAML (the operator)",
                       description=__doc__, epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", action="append", default=[], metavar="FILE|DIR",
                   help="GpuPool / ModelDeployment / Gateway YAML (repeatable; a folder: its *.yaml)")
    p.add_argument("--detach", action="store_true",
                   help="leave the controller running in the background, under a supervisor that restarts it")
    p.add_argument("--adopt", action="store_true",
                   help="take over the fleet the state directory records, restarting nothing (what the "
                   "supervisor runs when the controller died)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the documents and the state directory, plan, print what it would start; start nothing")
    p.add_argument("--method", choices=("greedy", "milp"), default="greedy", help="placement solver")
    p.add_argument("--tick", type=float, default=1.0, help="controller loop period, seconds")
    p.add_argument("--ray", default=None, metavar="ADDRESS", nargs="?", const="auto",
                   help="run on the Ray cluster at ADDRESS (a detached controller actor; docs/ray.md)")
    p.add_argument("--gateways", type=int, default=0, metavar="N",
                   help="with --ray: N gateway actors beside the controller's gateway, the replicas split among them")
    common(p)
    p.set_defaults(func=_run(up))

    p = sub.add_parser("apply", help="change the running deployment live (re-plan, make-before-break)",
                       epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-f", "--file", action="append", required=True, metavar="FILE|DIR")
    p.add_argument("--dry-run", action="store_true",
                   help="print the diff it would execute, and whether it would be refused; change nothing")
    disruption(p)
    p.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="return when the rollout is done (exit 0) or failed and rolled back (exit 1); "
                   "--no-wait returns once it has begun (headrace status follows it)")
    common(p)
    p.set_defaults(func=_run(apply))

    p = sub.add_parser("status", help="conditions, replicas, capacity vs observed rate, attainment")
    p.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")
    p.add_argument("--watch", "-w", action="store_true",
                   help="then print each change (generation, conditions, events) as it happens, until Ctrl-C")
    p.add_argument("--interval", type=_interval, default=1.0, help="--watch: seconds between looks (default 1)")
    common(p)
    p.set_defaults(func=_run(status))

    p = sub.add_parser("down", help="stop the gateway and every process the controller started")
    common(p)
    p.set_defaults(func=_run(down))

    p = sub.add_parser("rollback", help="restore an earlier generation's fleet (placement, variants, artifacts)")
    p.add_argument("--to", type=int, default=None, metavar="N", help="the generation to restore (default: the "
                   "one before the current)")
    p.add_argument("--dry-run", action="store_true", help="print the steps it would execute, change nothing")
    disruption(p)
    common(p)
    p.set_defaults(func=_run(rollback))


def _interval(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = float("nan")
    if not 0.1 <= x <= 3600:
        raise argparse.ArgumentTypeError(f"seconds between 0.1 and 3600 (got {v!r})")
    return x


def disruption(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-disruption", action="store_true",
                   help="apply a change that takes a model's capacity below its need for a while (the pool "
                   "has no room to start the new replicas beside the old); refused without it (exit 2)")


def main(argv: list[str] | None = None) -> int:
    """The operator's commands on their own: ``headrace demo`` drives them, and the controller
    ``up --detach`` leaves running is ``python -m deploy.operator.cli up ...``."""
    parser = argparse.ArgumentParser(prog="headrace")
    register(parser.add_subparsers(dest="command", required=True))
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
