"""The substitution table: `inputs/<inputs key>.json` says which wheel (and build record) a build's inputs made.

A consumer looks a build up by its inputs key, as Nix asks a substituter for `<hash>.narinfo`: the key is the
lookup, the entry pins every file it names by sha256, and an entry may be signed (ed25519, over the canonical
JSON of the entry without its signature) so that a cache configured with the publisher's public key takes
nothing else. Paths in an entry are relative to the index root, so the folder can be moved or served anywhere.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pydantic

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path
from toolkit.base.typed import adapter

TABLE_SCHEMA = 1
TABLE_KIND = "fa-envkit-substitution"
INPUTS_DIR = "inputs"
FILES_DIR = "files"
SHA256 = re.compile(r"[0-9a-f]{64}")
# FA4's kernel caches: their entries kernel-caches/<key>.json, artifacts and records beside them
KERNEL_CACHES_DIR = "kernel-caches"
KERNEL_CACHE_KIND = "fa-envkit-kernel-cache"
_NAME = "[A-Za-z0-9][A-Za-z0-9._+-]*"
# where an entry's files may lie: plain names only, so no entry can point a consumer outside the index
PUBLISHED_PATHS = {
    FILES_DIR: re.compile(rf"{FILES_DIR}/{_NAME}/{_NAME}"),  # files/<wheelhouse folder>/<file>
    KERNEL_CACHES_DIR: re.compile(rf"{KERNEL_CACHES_DIR}/{_NAME}"),
}


@dataclass(frozen=True)
class Signature:
    public_key: str  # base64 of the raw 32-byte ed25519 public key
    value: (
        str  # base64 of the 64-byte signature over the entry's canonical JSON without `signature`
    )


class SignedEntry:
    """What every signed entry of the index shares (a wheel's TableEntry, FA4's KernelCacheEntry): one canonical
    form that the signature covers, so signing and checking are written once."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    signature: Signature | None

    def unsigned(self) -> dict[str, Any]:
        data = asdict(self)
        del data["signature"]
        return data

    def signed_bytes(self) -> bytes:
        """What a signature covers: the canonical JSON of the entry without its signature."""
        return json.dumps(self.unsigned(), sort_keys=True, separators=(",", ":")).encode()

    def text(self) -> str:
        data = self.unsigned() if self.signature is None else asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


Entry = TypeVar("Entry", bound=SignedEntry)


def parse_entry(
    adapter: pydantic.TypeAdapter[Entry],
    data: object,
    where: str,
    kind: str,
    hashes: tuple[str, ...],
    paths: tuple[str, ...],
    root: str,
    then: str = "the build compiles instead",
) -> Entry:
    """An entry of `kind`, every field typed, each of `hashes` a sha256 and each of `paths` a file of the index
    (`root`/<name>, or files/<folder>/<name>): one line naming the first field that is not."""
    fix = f"the cache serves a broken entry: tell its publisher; {then}"
    if not isinstance(data, dict) or data.get("kind") != kind or data.get("schema") != TABLE_SCHEMA:
        raise ToolkitError(
            f"{where}: not a substitution table entry of schema {TABLE_SCHEMA} ({fix})"
        )
    try:
        entry = adapter.validate_python(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise ToolkitError(
            f"{where}: table entry field {'.'.join(str(p) for p in first['loc'])}: "
            f"{first['msg'].lower()} ({fix})"
        ) from None
    for name in hashes:
        if not SHA256.fullmatch(getattr(entry, name)):
            raise ToolkitError(f"{where}: table entry field {name}: not a sha256 ({fix})")
    for name in paths:
        value = getattr(entry, name)
        if not PUBLISHED_PATHS[root].fullmatch(value) or ".." in value:
            raise ToolkitError(
                f"{where}: table entry field {name}: {value!r} is not a path under {root}/ ({fix})"
            )
    return entry


@dataclass(frozen=True)
class TableEntry(SignedEntry):
    """One build's inputs -> the published wheel and the files that vouch for it, each by sha256."""

    inputs_key: str
    wheel: str  # files/<folder>/<wheel>, relative to the index root
    wheel_sha256: str
    wheel_size: int
    record: str  # the build record, beside the wheel
    record_sha256: str
    provenance: str  # the in-toto statement, beside the wheel
    provenance_sha256: str
    kind: str = TABLE_KIND
    schema: int = TABLE_SCHEMA
    signature: Signature | None = None

    @property
    def wheel_name(self) -> str:
        return self.wheel.rsplit("/", 1)[-1]

    @classmethod
    def from_json(cls, data: object, where: str) -> TableEntry:
        return parse_entry(
            adapter(TableEntry),
            data,
            where,
            TABLE_KIND,
            ("inputs_key", "wheel_sha256", "record_sha256", "provenance_sha256"),
            ("wheel", "record", "provenance"),
            FILES_DIR,
        )


@dataclass(frozen=True)
class KernelCacheEntry(SignedEntry):
    """FA4's warmed kernel cache for one key (GPU arch, FA4 and cutlass-dsl pins, torch, python): the artifact
    `toolkit fa4 warm` packed and its kernel-cache record, each by sha256 (published by cache/publish.py, taken by
    cache/kernel_cache.py)."""

    key: str  # sha256 of the canonical JSON of the record's key, as an inputs key is of a build's inputs
    artifact: str  # kernel-caches/<artifact>.tar.gz, relative to the index root
    artifact_sha256: str
    artifact_size: int
    record: str  # kernel-caches/<key id>.kernel-cache.json, beside the artifact
    record_sha256: str
    kind: str = KERNEL_CACHE_KIND
    schema: int = TABLE_SCHEMA
    signature: Signature | None = None

    @property
    def artifact_name(self) -> str:
        return self.artifact.rsplit("/", 1)[-1]

    @classmethod
    def from_json(cls, data: object, where: str, then: str) -> KernelCacheEntry:
        return parse_entry(
            adapter(KernelCacheEntry),
            data,
            where,
            KERNEL_CACHE_KIND,
            ("key", "artifact_sha256", "record_sha256"),
            ("artifact", "record"),
            KERNEL_CACHES_DIR,
            then,
        )


def entry_path(key: str, table: str = INPUTS_DIR) -> str:
    """<table>/<key>.json, relative to the index root: inputs/ for wheels, kernel-caches/ for FA4's caches."""
    if not SHA256.fullmatch(key):
        raise ToolkitError(f"{key!r}: not an inputs key (64 lowercase hex digits)")
    return f"{table}/{key}.json"


# ---------------------------------------------------------------- signing


def _ed25519() -> Any:
    """cryptography's ed25519 module: a dependency of conda-lock's keyring here, imported only to sign or check."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ToolkitError(
            "signing and checking cache entries needs the Python package cryptography "
            "(pip install cryptography into the toolkit's environment)"
        ) from None
    return ed25519


def public_key_text(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Signer:
    """An ed25519 private key read from a PEM file (`openssl genpkey -algorithm ed25519 -out key.pem`)."""

    key: Any  # ed25519.Ed25519PrivateKey
    public_key: str

    @classmethod
    def from_pem(cls, path: Path) -> Signer:
        from cryptography.hazmat.primitives import serialization

        ed25519 = _ed25519()
        fix = "make one with `openssl genpkey -algorithm ed25519 -out KEY.pem`"
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ToolkitError(
                f"{display_path(path)}: not an unencrypted PEM private key ({exc}; {fix})"
            ) from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise ToolkitError(f"{display_path(path)}: not an ed25519 key ({fix})")
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(key, public_key_text(raw))

    def sign(self, entry: Entry) -> Entry:
        value = base64.b64encode(self.key.sign(entry.signed_bytes())).decode()
        return replace(entry, signature=Signature(self.public_key, value))


def check_signature(
    entry: SignedEntry,
    trusted_key: str | None,
    where: str,
    then: str = "the build compiles instead",
) -> None:
    """Nothing to check for a cache configured without a key; with one, the entry must be signed by exactly it.
    `then`: what happens next, for the reader's line (a build compiles; export and runtime locks stop)."""
    if trusted_key is None:
        return
    if entry.signature is None:
        raise ToolkitError(
            f"{where}: unsigned, but this cache is configured with public key {trusted_key} "
            f"(refused; {then})"
        )
    if entry.signature.public_key != trusted_key:
        raise ToolkitError(
            f"{where}: signed by key {entry.signature.public_key}, not by this cache's configured "
            f"key {trusted_key} (refused; {then})"
        )
    from cryptography.exceptions import InvalidSignature

    ed25519 = _ed25519()
    try:
        public = ed25519.Ed25519PublicKey.from_public_bytes(
            base64.b64decode(trusted_key, validate=True)
        )
        public.verify(base64.b64decode(entry.signature.value, validate=True), entry.signed_bytes())
    except (InvalidSignature, ValueError, binascii.Error):
        raise ToolkitError(
            f"{where}: its signature does not verify with the configured key {trusted_key} "
            f"(the entry was changed after it was signed; refused, {then})"
        ) from None
