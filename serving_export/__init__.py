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

from typing import TYPE_CHECKING

from streamrec.lazy import lazy_exports

if TYPE_CHECKING:  # what type checkers see; at run time a name's module loads on first use
    from serving_export.artifact import (
        lineage as lineage,
        package_export as package_export,
        verify_artifact as verify_artifact,
    )
    from serving_export.delivery import (
        deliver as deliver,
        evaluate as evaluate,
        promote as promote,
        publish as publish,
        registry_for as registry_for,
        rollback as rollback,
        sparse_store_for as sparse_store_for,
        withdraw as withdraw,
        withdraw_candidate as withdraw_candidate,
    )
    from serving_export.errors import (
        ExportInvalid as ExportInvalid,
        NothingServing as NothingServing,
        RegistryConflict as RegistryConflict,
        ServingError as ServingError,
    )
    from serving_export.http_app import create_app as create_app
    from serving_export.manifest import ArtifactManifest as ArtifactManifest
    from serving_export.predictor import Predictor as Predictor
    from serving_export.quality_gate import GateDecision as GateDecision, judge as judge
    from serving_export.registry import ModelRegistry as ModelRegistry
    from serving_export.served_log import ServedLog as ServedLog
    from serving_export.sparse_store import (
        InProcessStore as InProcessStore,
        RedisStore as RedisStore,
    )


_EXPORTS = {
    "ArtifactManifest": "serving_export.manifest",
    "ExportInvalid": "serving_export.errors",
    "GateDecision": "serving_export.quality_gate",
    "InProcessStore": "serving_export.sparse_store",
    "RedisStore": "serving_export.sparse_store",
    "create_app": "serving_export.http_app",
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
