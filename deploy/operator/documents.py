"""Documents from files to the controller: read and validated once, where they are (so an
error names the file, :func:`profiles.schema.load_documents`), every file path the schema marks
(:data:`profiles.schema.PATH`: a variant's profile, an artifact's uri, the Gateway's certificate
and key files, ...) made absolute against its file's folder, then sent as one YAML stream.

The paths are found by walking the models, so a path field the schema gains is resolved here
without a change to this module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from profiles.schema import Documents, absolute_path, is_path, load_documents


def _models(value: Any) -> Iterator[BaseModel]:
    """The models ``value`` is or holds (in a list, tuple or dict)."""
    if isinstance(value, BaseModel):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _models(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _models(v)


def resolve_paths(model: BaseModel, base: Path) -> None:
    """Every path field of ``model`` and of the models it holds made absolute against
    ``base``, in place."""
    for name, f in type(model).model_fields.items():
        value = getattr(model, name)
        if isinstance(value, str) and is_path(f):
            setattr(model, name, absolute_path(value, base))
        else:
            for m in _models(value):
                resolve_paths(m, base)


def resolve_documents(docs: Documents) -> None:
    """Every document's path fields made absolute against its file's folder (a document
    that came from no file, e.g. one the admin API received, is left as it is)."""
    for doc in (*docs.pools, *docs.deployments, *docs.gateways):
        base = docs.base_dir.get(id(doc))
        if base is not None:
            resolve_paths(doc, base)


def stream(docs: Documents) -> str:
    """The documents as one YAML stream of the fields each gives (what the controller
    receives, keeps per generation and serves back)."""
    return yaml.safe_dump_all([d.model_dump(mode="json", exclude_unset=True)
                               for d in (*docs.pools, *docs.deployments, *docs.gateways)], sort_keys=False)


def resolved_stream(paths: list[str] | list[Path]) -> str:
    """The files' documents, read and validated once, as one YAML stream with absolute paths."""
    docs = load_documents(*paths)
    resolve_documents(docs)
    return stream(docs)
