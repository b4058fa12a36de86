"""The provenance statement published beside each wheel: in-toto Statement v1 with a SLSA provenance v1
predicate, made with the in-toto project's own models (`in-toto-attestation`: its protobuf messages and
Statement wrapper), so the field names and shape are the format's, not a copy of them.

Subject: the wheel, by name and sha256. buildDefinition.externalParameters: the build's inputs exactly as
the build record keys them (spec hash, lock digest, source pins, patches, toolchain fingerprint) and their
inputs key; resolvedDependencies: the source archive and patch files by sha256; internalParameters: the
machine and how the build ran on it; runDetails: the builder and when. It is made offline and checked by
anyone with the wheel (PEP 740 attestations would need Sigstore's network service). The inputs key is
`sha256` of the canonical JSON (sorted keys, no spaces) of externalParameters.inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from toolkit.base.errors import ToolkitError

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:fa-envkit:toolkit-build:v1"  # docs/binary-cache.md says what its parameters are
BUILDER_ID = "urn:fa-envkit:toolkit-build"


@dataclass(frozen=True)
class Dependency:
    name: str
    sha256: str
    uri: str = ""


@dataclass(frozen=True)
class BuildFacts:
    """What a build record says about one wheel, as the statement needs it."""

    wheel_name: str
    wheel_sha256: str
    inputs_key: str
    inputs: dict[str, Any]
    dependencies: list[Dependency]
    machine: dict[str, Any]  # arch, cores, memory, GPUs, driver
    run: dict[str, Any]  # parallelism and the build environment's variables
    started: str  # ISO 8601
    finished: str
    recipe: str = ""  # the build recipe's version (builder.RECIPE_VERSION)
    substituted_from: str = ""


def statement(facts: BuildFacts) -> dict[str, Any]:
    """The statement as JSON data (in-toto's JSON field names: `_type`, `predicateType`, camelCase). Its models
    (protobuf) are imported here, where a statement is made: every verb's module imports this one, and a build
    or GPU machine that never publishes need not have them."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
    from in_toto_attestation.v1.statement import Statement

    provenance = provenance_pb2.Provenance()
    definition = provenance.build_definition
    definition.build_type = BUILD_TYPE
    external = {"inputs": facts.inputs, "inputsKey": facts.inputs_key}
    internal = {"machine": facts.machine, "run": facts.run}
    definition.external_parameters.update(external)
    definition.internal_parameters.update(internal)
    for dep in facts.dependencies:
        definition.resolved_dependencies.append(
            ResourceDescriptor(name=dep.name, uri=dep.uri, digest={"sha256": dep.sha256}).pb
        )
    details = provenance.run_details
    details.builder.id = BUILDER_ID
    if facts.recipe:
        details.builder.version["recipe"] = facts.recipe
    details.metadata.invocation_id = facts.inputs_key
    try:
        details.metadata.started_on.FromJsonString(_utc(facts.started))
        details.metadata.finished_on.FromJsonString(_utc(facts.finished))
    except ValueError as exc:
        raise ToolkitError(
            f"{facts.wheel_name}: its record's start or finish time is not a timestamp ({exc}; "
            f"rebuild it with --force)"
        ) from None
    if facts.substituted_from:  # a wheel re-published from a cache: where it came from
        details.byproducts.append(
            ResourceDescriptor(name="substituted-from", uri=facts.substituted_from).pb
        )
    made = Statement(
        [ResourceDescriptor(name=facts.wheel_name, digest={"sha256": facts.wheel_sha256}).pb],
        PREDICATE_TYPE,
        json_format.MessageToDict(provenance),
    )
    made.validate()
    data = json_format.MessageToDict(made.pb)
    # protobuf's Struct holds every number as a double (recipe 2 -> 2.0); the parameters go back exactly as the
    # record has them, so anyone can check sha256 of externalParameters.inputs' canonical JSON == inputsKey
    definition_data = data["predicate"]["buildDefinition"]
    definition_data["externalParameters"], definition_data["internalParameters"] = (
        external,
        internal,
    )
    return data


def statement_text(facts: BuildFacts) -> str:
    return json.dumps(statement(facts), indent=2, sort_keys=True) + "\n"


def _utc(stamp: str) -> str:
    """'2026-11-29T10:00:00+00:00' (the record's isoformat) -> '2026-11-29T10:00:00Z' (protobuf's form)."""
    return stamp.removesuffix("+00:00") + "Z" if stamp.endswith("+00:00") else stamp
