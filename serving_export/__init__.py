"""From a raw cluster export to the model serving reads.

One pass through this stage: ``delivery.evaluate`` judges the pass (``quality_gate``);
``delivery.publish`` packages the raw export (``artifact``: inference program, sparse
embeddings from ``sparse_table``, MANIFEST with checksums, published by rename) and
registers it; ``delivery.deliver`` switches the serving pointer (``registry``); the
``predictor`` loads the serving version and scores events.
"""

from serving_export.artifact import package_export, verify_artifact
from serving_export.delivery import deliver, evaluate, publish, registry_for
from serving_export.errors import ExportInvalid, NothingServing, RegistryConflict, ServingError
from serving_export.predictor import Predictor
from serving_export.quality_gate import GateDecision, judge
from serving_export.registry import ModelRegistry

__all__ = [
    "ExportInvalid",
    "GateDecision",
    "ModelRegistry",
    "NothingServing",
    "Predictor",
    "RegistryConflict",
    "ServingError",
    "deliver",
    "evaluate",
    "judge",
    "package_export",
    "publish",
    "registry_for",
    "verify_artifact",
]
