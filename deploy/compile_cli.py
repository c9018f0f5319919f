"""``headrace compile``: build the compiled core with Cython, every module the packages declare
compiled (:mod:`profiles.compiled`): the policy core, the simulator's event loop and the load
statistics."""

from __future__ import annotations

import argparse
import sys
import sysconfig

from profiles import compiled


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="build the compiled core (the scheduler and simulator) with Cython",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=None, help="parallel C compiles (default: CPUs)")
    p.add_argument("--if-available", action="store_true",
                   help="without Cython or a C compiler, say so and exit 0 (headrace runs as Python)")
    p.set_defaults(func=_cmd)


def modules() -> tuple[str, ...]:
    """Every module declared compiled: importing the packages that own them declares them."""
    import gateway.policy  # noqa: F401
    import loadgen.sim  # noqa: F401  (loadgen, its parent, declares its own)

    return compiled.declared()


def _cmd(a: argparse.Namespace) -> int:
    names = modules()
    try:
        done = compiled.build(names, jobs=a.jobs)
    except Exception as e:  # noqa: BLE001  (a missing compiler raises setuptools' own errors)
        if not a.if_available:
            raise
        print(f"headrace runs its core as pure Python: could not compile it ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 0
    print(f"compiled core: {len(done)} module(s) built, {len(names) - len(done)} up to date in "
          f"{compiled.cache_dir()} ({sysconfig.get_platform()})")
    return 0
