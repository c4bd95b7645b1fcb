"""From a raw cluster export to the model serving reads, and the service that serves it.

One pass through this stage: ``delivery.evaluate`` judges the pass (``quality_gate``);
``delivery.publish`` packages the raw export (``artifact``: inference program and its ONNX
twin, the embeddings the pass changed read from the checkpoint saves by ``sparse_table``,
its ``manifest`` with freshness and checksums, published by rename) and registers it;
``delivery.deliver`` writes its embeddings to the Redis store when that is the one in use
(``sparse_store``) and switches the serving pointer (``registry``). ``service`` (``streamrec
serve``) follows the pointer, rebuilds each version from its lineage and scores events with
a ``predictor``; with a served log (``served_log``) it logs what it scored, and a
candidate or the predecessor answer their shares of requests.
"""

from streamrec.lazy import lazy_exports

_EXPORTS = {
    "ArtifactManifest": "serving_export.manifest",
    "ExportInvalid": "serving_export.errors",
    "GateDecision": "serving_export.quality_gate",
    "InProcessStore": "serving_export.sparse_store",
    "RedisStore": "serving_export.sparse_store",
    "create_app": "serving_export.service",
    "lineage": "serving_export.artifact",
    "rollback": "serving_export.delivery",
    "sparse_store_for": "serving_export.delivery",
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
    "promote": "serving_export.delivery",
    "withdraw": "serving_export.delivery",
    "withdraw_candidate": "serving_export.delivery",
    "ServedLog": "serving_export.served_log",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
