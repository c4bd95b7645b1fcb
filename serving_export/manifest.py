"""The artifact's contract: ``MANIFEST.json`` of a published model version.

Written once, when a version is packaged (``serving_export.artifact``); the registry keeps
a copy per version in Redis and stamps ``freshness.served_at`` on it when the version
begins serving. Read through ``ArtifactManifest.parse`` only, by the predictor, the
service's ``/version``, the sparse stores and retention: a field missing, renamed or of
the wrong type fails there, naming the artifact, instead of as a KeyError in a request.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from serving_export.errors import ExportInvalid
from streamrec.config import SchemaConfig
from streamrec.contracts.delivery import GateDecision
from streamrec.errors import broken_fields
from trainers.export_spec import OnnxTwin

# 3: the network and the sequence feeds; 4: several sparse tables; 5: a head per task
ARTIFACT_VERSION = 5
ARTIFACT_MANIFEST_NAME = "MANIFEST.json"


class _Frozen(BaseModel):
    # NaN and infinity stay numbers in the JSON (Python's json reads them back)
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class SparsePart(_Frozen):
    """The version's embeddings in ``sparse/``: every key, or the keys changed since
    ``parent``."""

    kind: Literal["full", "delta"]
    parent: str | None  # the version a delta builds on; None for a full version
    keys: int  # rows in sparse/, every table's
    table_keys: int  # keys of the whole model at this version, every table's

    @model_validator(mode="after")
    def _delta_has_parent(self) -> SparsePart:
        if (self.kind == "delta") != (self.parent is not None):
            raise ValueError(f"a {self.kind} version has parent {self.parent!r}")
        return self


class TablePart(_Frozen):
    """One sparse table of the version, in ``sparse/<table>/``."""

    dim: int  # the embedding a lookup returns
    slots: tuple[str, ...]  # the slots whose keys it holds
    keys: int  # rows in sparse/<table>/


class Freshness(_Frozen):
    """When the version's data ended (event time), became a complete pass, was trained,
    and (in the registry's copy) began serving; ISO 8601 UTC."""

    window_end: str
    pass_completed_at: str
    trained_at: str | None
    served_at: str | None = None


class ArtifactMetrics(_Frozen):
    """What the quality gate measured and decided for the version."""

    auc: float
    gate: GateDecision


class ArtifactManifest(_Frozen):
    """One published version: what its program feeds on, its embeddings, its files."""

    artifact_version: int
    model: str
    version: str  # the pass id it was trained through
    pass_id: str
    created_at: str  # when it was published
    metrics: ArtifactMetrics
    network: str  # the network's import path the version was trained with
    slot_feeds: dict[str, str]  # pooled slot -> the program's pooled-embedding feed
    sequence_feeds: dict[str, tuple[str, str]]  # sequence slot -> (values, mask) feeds
    dense_feed: str | None
    # the program's outputs, each task's probability by label name (a version before 5 has
    # one, its schema's first label: ``tasks``)
    outputs: tuple[str, ...] = ()
    sparse_tables: dict[str, TablePart]  # by name
    sign_version: int  # streaming.feature_signs.SIGN_VERSION it hashes features with
    feature_schema: SchemaConfig
    sparse: SparsePart
    chain: tuple[str, ...]  # the checkpoint saves it is built from, oldest first
    onnx: OnnxTwin
    freshness: Freshness
    files: dict[str, str]  # path inside the artifact -> sha256

    @classmethod
    def parse(cls, text: str | bytes, where: str) -> ArtifactManifest:
        """The manifest in ``text`` (read from ``where``); ExportInvalid naming the field."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as e:
            raise ExportInvalid(
                f"{where} breaks the artifact manifest: {broken_fields(e)}"
            ) from None

    @property
    def tasks(self) -> tuple[str, ...]:
        """The label each output of the program predicts, in output order."""
        return self.outputs or (self.feature_schema.labels[0].name,)

    @property
    def table_of_slot(self) -> dict[str, str]:
        """Each sparse slot's table."""
        return {slot: name for name, t in self.sparse_tables.items() for slot in t.slots}

    def served(self, at: str) -> ArtifactManifest:
        """This manifest as the registry keeps it once the version serves from ``at``."""
        return self.model_copy(
            update={"freshness": self.freshness.model_copy(update={"served_at": at})}
        )

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)
