"""From a raw cluster export to the model serving reads.

One pass through this stage: ``delivery.evaluate`` judges the pass (``quality_gate``);
``delivery.publish`` packages the raw export (``artifact``: inference program, sparse
embeddings from ``sparse_table``, MANIFEST with checksums, published by rename) and
registers it; ``delivery.deliver`` switches the serving pointer (``registry``); the
``predictor`` loads the serving version and scores events.
"""

from streamrec.lazy import lazy_exports

_EXPORTS = {
    "ExportInvalid": "serving_export.errors",
    "GateDecision": "serving_export.quality_gate",
    "ModelRegistry": "serving_export.registry",
    "NothingServing": "serving_export.errors",
    "Predictor": "serving_export.predictor",
    "RegistryConflict": "serving_export.errors",
    "ServingError": "serving_export.errors",
    "deliver": "serving_export.delivery",
    "evaluate": "serving_export.delivery",
    "judge": "serving_export.quality_gate",
    "package_export": "serving_export.artifact",
    "publish": "serving_export.delivery",
    "registry_for": "serving_export.delivery",
    "verify_artifact": "serving_export.artifact",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
