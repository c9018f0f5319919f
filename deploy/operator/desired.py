"""What one generation of documents asks for, validated against the profiles and the
operator's limits (:class:`Desired`), and the documents read from files for a command
(:func:`validate`), checked against the measured base profiles."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from deploy.operator.client import CliError
from deploy.operator.documents import resolve_documents, stream
from gateway.config import scheduler_config
from gateway.errors import ConfigError
from placement.llm import LlmChoice, choose, llm_profiles
from placement.plan import Demand
from placement.spec import check_profiles, classic, demand, inventory, profiles_for, single_pool
from profiles.catalogue import HOST
from profiles.profile import ProfileError, ProfileSet
from profiles.schema import (
    Documents,
    GatewaySpec,
    SpecError,
    load_documents,
    parse_documents,
)
from profiles.triton.sources import SourceError, VariantSource, revision

if TYPE_CHECKING:
    from gateway.frontdoor.tls import ServerTls


@dataclass
class Desired:
    """One generation's documents, validated, with what planning needs."""

    text: str
    docs: Documents
    profiles: ProfileSet
    sources: dict[tuple[str, str], VariantSource]
    settings: GatewaySpec
    llm: list[LlmChoice] = field(default_factory=list)  # the generative deployments, sized
    # what each (model, variant) serves (:func:`profiles.triton.sources.revision`)
    revisions: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def surge(self) -> dict[str, int]:
        """Model -> successors its rollouts start at once (``rollout.max_surge``)."""
        return {md.spec.model: md.spec.rollout.max_surge for md in classic(self.docs)}

    def demands(self, rates: dict[str, float]) -> list[Demand]:
        out = []
        n = self.settings.workers  # each gateway worker batches for replicas of its own
        for md in classic(self.docs):
            d = demand(md)
            d = replace(d, rate=rates[d.model]) if d.model in rates else d
            out.append(replace(d, min_count=n) if n > 1 else d)
        return out


def prepare(text: str, base: ProfileSet, where: str = "apply") -> Desired:
    """Validate a YAML stream of documents against the schema and the profiles."""
    docs = Documents()
    parse_documents(text, where, docs)
    return desired(docs, base, [where], text)


def desired(docs: Documents, base: ProfileSet, names: list[str], text: str | None = None) -> Desired:
    """Validated documents (``names``: where they came from, for errors) checked against the
    profiles and the operator's limits, with what planning needs. Once checked (errors quote
    the paths as given), every path field is made absolute against its file's folder;
    ``text``: the stream the documents were parsed from, else written from them."""
    where = ", ".join(names)
    pool = single_pool(docs, names)
    if len(docs.gateways) > 1:
        raise SpecError(f"{where}: at most one Gateway document, found {len(docs.gateways)}")
    profiles = profiles_for(docs, base)
    check_profiles(docs, profiles)
    if not pool.spec.emulate and any(g.model != HOST for n in pool.spec.nodes for g in n.gpus):
        raise SpecError(f"{docs.origin(pool)}: spec.emulate: the operator serves GPU pools on emulated "
                        "GPUs (emulate: true) and the host; real GPUs are configured by "
                        "`headrace plan --apply --executor nvml` (got False)")
    llm = choose(docs.deployments, docs.origin, inventory(pool), llm_profiles(docs))
    if llm and pool.spec.runtime != "local":
        raise SpecError(f"{docs.origin(pool)}: spec.runtime: LLM deployments run on the local runtime "
                        f"(got {pool.spec.runtime!r})")
    resolve_documents(docs)
    sources = {}
    for md in classic(docs):
        for v in md.spec.variant_specs():
            if md.spec.source == "artifact" and v.artifact is not None:
                sources[(md.spec.model, v.name)] = VariantSource("artifact", v.artifact.uri, v.artifact.version)
            else:
                sources[(md.spec.model, v.name)] = VariantSource(md.spec.source)
        if not md.spec.variants:
            for p in profiles.find(model=md.spec.model):
                sources.setdefault((md.spec.model, p.variant), VariantSource(md.spec.source))
    try:
        revisions = {k: revision(k[1], src) for k, src in sources.items()}
    except (SourceError, OSError) as e:
        raise SpecError(f"{where}: {e}") from None
    settings = docs.gateways[0].spec if docs.gateways else GatewaySpec()
    try:  # the scheduler's settings are checked before any replica starts, not when the gateway does
        scheduler_config(settings.scheduler, f"{docs.origin(docs.gateways[0]) if docs.gateways else where}: spec")
    except ConfigError as e:
        raise SpecError(str(e)) from None
    return Desired(stream(docs) if text is None else text, docs, profiles, sources, settings, llm, revisions)


def base_profiles() -> ProfileSet:
    """The measured profiles every deployment is checked against (with derived ones)."""
    from placement.problem import load_profile_set  # noqa: PLC0415
    from profiles.digits.family import MEASURED_DIR  # noqa: PLC0415

    return load_profile_set([str(MEASURED_DIR)])


def validate(files: list[str], check_security: bool = False) -> tuple[str, Desired, ProfileSet]:
    """The documents (read and parsed once) as one YAML stream with absolute paths, what they
    ask for, and the base profile set it was checked against; validated here so errors name
    their file (exit 2).
    ``check_security``: also read the Gateway's certificates and tenants' keys, as the gateway
    will when it starts (``up``; ``apply`` does not change them)."""
    try:
        docs = load_documents(*files)
        if check_security:
            _check_security(docs)
        base = base_profiles()
        want = desired(docs, base, files)
        return want.text, want, base
    except (SpecError, ProfileError, ConfigError) as e:
        raise CliError(str(e), 2) from None


def _check_security(docs: Documents) -> None:
    """The Gateway document's TLS files and tenants' keys read and checked; a
    :class:`ConfigError` names file, document and field."""
    from gateway.frontdoor.security import load_security  # noqa: PLC0415

    if docs.gateways:
        gw = docs.gateways[0]
        load_security(gw.spec, f"{docs.origin(gw)}: spec.", docs.base_dir.get(id(gw)))
        admin_tls(docs)


def admin_tls(docs: Documents) -> ServerTls | None:
    """The admin API's certificate and key (``spec.admin.tls``), read and checked; None: plain HTTP."""
    from gateway.frontdoor.tls import load_tls  # noqa: PLC0415

    gw = docs.gateways[0] if docs.gateways else None
    if gw is None or gw.spec.admin.tls is None:
        return None
    t = gw.spec.admin.tls
    return load_tls(t.cert_file, t.key_file, None, f"{docs.origin(gw)}: spec.admin.tls", docs.base_dir.get(id(gw)))
