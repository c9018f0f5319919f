"""``headrace explain``: the documents' fields, their types, defaults, bounds and meaning.

Reads the pydantic models themselves (:mod:`profiles.schema`, and the gateway's
:class:`SchedulerConfig` for ``Gateway.spec.scheduler``), so it never drifts from validation.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.policy.config import SchedulerConfig
from profiles.schema import KINDS, dump_json_schemas, is_path, json_schema

HELP = """Explain a document kind or one of its fields, like kubectl explain.

examples:
  headrace explain                          # the kinds
  headrace explain ModelDeployment.spec     # a nested object's fields
  headrace explain ModelDeployment.spec.slo_ms
  headrace explain Scheduler                # Gateway.spec.scheduler
  headrace explain GpuPool --schema         # its JSON Schema
  headrace explain --schema-dir docs/schema # every kind's JSON Schema, one file each
"""

SUMMARY = {
    "GpuPool": "the nodes and GPUs the planner may place models on",
    "ModelDeployment": "one served model: expected rate, latency SLO, variants and where they come from",
    "Gateway": "the gateway's listen addresses, limits, TLS, tenants, scheduler settings and admin API",
}
SCHEDULER = "Scheduler"  # alias of Gateway.spec.scheduler, whose dict the gateway validates as SchedulerConfig
# fields typed as a plain dict that another model validates
DELEGATED: dict[tuple[str, str], type[BaseModel]] = {("GatewaySettings", "scheduler"): SchedulerConfig,
                                                     ("GatewaySpec", "scheduler"): SchedulerConfig}
BOUNDS = ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern")


class ExplainError(ValueError):
    """An unknown kind or field; the message lists the known ones."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("explain", help="document kinds and fields: types, defaults, bounds",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", metavar="KIND[.field...]", help="e.g. ModelDeployment.spec.variants")
    p.add_argument("--schema", action="store_true", help="print the kind's JSON Schema")
    p.add_argument("--schema-dir", metavar="DIR", help="write every kind's JSON Schema into DIR")
    p.set_defaults(func=run)


def type_name(tp: Any) -> str:
    """``int``, ``str | None``, ``list[VariantSpec]``, ``Literal['a','b']``."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "None"
    if origin is Literal:
        return f"Literal[{','.join(repr(a) for a in args)}]"
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp).removeprefix("typing."))


def _number(v: Any) -> str:
    return format(v, "g") if isinstance(v, float) else str(v)


def bounds(f: FieldInfo) -> str:
    out = []
    for m in f.metadata:
        for b in BOUNDS:
            v = getattr(m, b, None)
            if v is not None:
                out.append(f"{b} {v!r}" if b == "pattern" else f"{b} {_number(v)}")
    return ", ".join(out)


def default(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    v = f.get_default(call_default_factory=True)
    return "defaults below" if isinstance(v, BaseModel) else f"default {v!r}"


def nested_model(owner: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model a field holds (through ``| None``, ``list[...]`` and ``dict[..., ...]``), if any."""
    if (owner.__name__, name) in DELEGATED:
        return DELEGATED[(owner.__name__, name)]
    todo = [owner.model_fields[name].annotation]
    while todo:
        tp = todo.pop(0)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
        todo += get_args(tp)
    return None


def resolve(path: str) -> tuple[str, type[BaseModel], FieldInfo | None, type[BaseModel] | None]:
    """(shown path, owner model, the field or None for the kind itself, the model to list)."""
    head, *rest = path.split(".")
    kinds = {k.lower(): k for k in (*KINDS, SCHEDULER)}
    kind = kinds.get(head.lower())
    if kind is None:
        raise ExplainError(f"unknown kind {head!r}; known: {', '.join(kinds.values())}")
    model: type[BaseModel] | None = SchedulerConfig if kind == SCHEDULER else KINDS[kind]
    shown, field, owner = [kind], None, model
    for name in rest:
        if model is None:
            raise ExplainError(f"{'.'.join(shown)} ({type_name(field.annotation)}) has no fields; "
                               f"cannot explain {name!r}")
        if name not in model.model_fields and "spec" in model.model_fields and len(shown) == 1:
            shown.append("spec")  # Gateway.scheduler: spec is implied
            model = nested_model(model, "spec")
        if name not in model.model_fields:
            raise ExplainError(f"{'.'.join(shown)} has no field {name!r}; known: {', '.join(model.model_fields)}")
        owner, field = model, model.model_fields[name]
        shown.append(name)
        model = nested_model(owner, name)
    return ".".join(shown), owner, field, model


def _wrap(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=" " * indent, subsequent_indent=" " * indent) or []


def summary(name: str, owner: type[BaseModel], f: FieldInfo) -> str:
    """``name <type>  default ...; bounds`` (and ``a file path`` for a field the schema marks
    as one: relative to its YAML file's folder)."""
    delegated = DELEGATED.get((owner.__name__, name))
    tp = delegated.__name__ if delegated else type_name(f.annotation)
    extra = "; ".join(x for x in (default(f), bounds(f), "a file path" if is_path(f) else "") if x)
    return f"{name} <{tp}>  {extra}"


def explain(path: str) -> str:
    shown, owner, field, model = resolve(path)
    kind, _, sub = shown.partition(".")
    lines = [f"KIND:     {kind}"]
    if field is not None:
        lines.append(f"FIELD:    {sub.rpartition('.')[0] + '.' if '.' in sub else ''}"
                     f"{summary(sub.rpartition('.')[2], owner, field)}")
    about = field.description if field is not None else SUMMARY.get(kind)
    about = about or (model.__doc__ if model is not None else None)
    if about:
        lines += ["", "DESCRIPTION:", *_wrap(" ".join(about.split()), 2)]
    if model is not None:
        lines += ["", f"FIELDS ({model.__name__}):"]
        for name, f in model.model_fields.items():
            lines += [f"  {summary(name, model, f)}", *_wrap(f.description or "", 6)]
    return "\n".join(lines)


def kinds_overview() -> str:
    rows = [(k, SUMMARY.get(k, "")) for k in KINDS] + [(SCHEDULER, "the gateway's scheduler settings "
                                                        "(Gateway.spec.scheduler)")]
    width = max(len(k) for k, _ in rows)
    return "\n".join([f"{k:<{width}}  {s}" for k, s in rows]
                     + ["", "headrace explain KIND[.field...] for its fields; --schema for its JSON Schema"])


def schema(path: str) -> dict[str, Any]:
    shown, _owner, field, _model = resolve(path)
    if field is not None:
        raise ExplainError(f"--schema takes a kind, not a field ({shown}); "
                           f"known: {', '.join((*KINDS, SCHEDULER))}")
    return SchedulerConfig.model_json_schema() if shown == SCHEDULER else json_schema(shown)


def run(args: argparse.Namespace) -> int:
    try:
        if args.schema_dir:
            try:
                written = dump_json_schemas(Path(args.schema_dir))
            except OSError as e:
                raise ExplainError(f"--schema-dir {args.schema_dir}: {e.strerror}") from None
            print("\n".join(map(str, written)))
        elif args.path is None:
            if args.schema:
                raise ExplainError(f"--schema needs a kind; known: {', '.join((*KINDS, SCHEDULER))}")
            print(kinds_overview())
        elif args.schema:
            print(json.dumps(schema(args.path), indent=2))
        else:
            print(explain(args.path))
    except ExplainError as e:
        print(f"headrace explain: {e}", file=sys.stderr)
        return 2
    return 0
