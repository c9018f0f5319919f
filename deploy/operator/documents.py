"""Documents from files to the controller: validated where they are (so an error names the
file, :func:`profiles.schema.load_documents`), then sent as one YAML stream with every relative path (a variant's profile, an
artifact's uri, a Gateway's certificate and key files) made absolute against its file's folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from profiles.schema import SpecError, yaml_files


def _absolute(value: str, base: Path) -> str:
    scheme, sep, rest = value.partition("://")
    if sep:
        return value if Path(rest).is_absolute() else f"{scheme}://{(base / rest).resolve()}"
    return value if Path(value).is_absolute() else str((base / value).resolve())


def _resolve_gateway_paths(spec: dict, base: Path) -> None:
    """The Gateway's TLS files (its own and its admin API's) and tenants' key files."""
    admin = spec.get("admin")
    for tls in (spec.get("tls"), admin.get("tls") if isinstance(admin, dict) else None):
        if isinstance(tls, dict):
            for k in ("cert_file", "key_file", "client_ca_file"):
                if isinstance(tls.get(k), str):
                    tls[k] = _absolute(str(Path(tls[k]).expanduser()), base)
    for tenant in spec.get("tenants") or []:
        for key in (tenant.get("keys") or []) if isinstance(tenant, dict) else []:
            if isinstance(key, dict) and isinstance(key.get("file"), str):
                key["file"] = _absolute(str(Path(key["file"]).expanduser()), base)


def _resolve_paths(doc: Any, base: Path) -> Any:
    if isinstance(doc, dict) and doc.get("kind") == "Gateway" and isinstance(doc.get("spec"), dict):
        _resolve_gateway_paths(doc["spec"], base)
        return doc
    if not isinstance(doc, dict) or doc.get("kind") != "ModelDeployment":
        return doc
    for v in (doc.get("spec") or {}).get("variants") or []:
        if not isinstance(v, dict):
            continue
        if isinstance(v.get("profile"), str):
            v["profile"] = _absolute(v["profile"], base)
        art = v.get("artifact")
        if isinstance(art, dict) and isinstance(art.get("uri"), str):
            art["uri"] = _absolute(art["uri"], base)
    return doc


def resolved_stream(paths: list[str] | list[Path]) -> str:
    """The files' documents as one YAML stream with absolute paths (validate them first with
    :func:`profiles.schema.load_documents`, whose errors name file and document)."""
    out: list[Any] = []
    for path in yaml_files(list(paths)):
        base = path.parent.resolve()
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(f"{path}: {e}") from None
        out += [_resolve_paths(d, base) for d in docs]
    return yaml.safe_dump_all(out, sort_keys=False)
