"""The contracts between stages and processes: frozen typed models, each with one pair of
wire functions (``to_json``/``to_wire`` and ``from_wire``), and the per-pass status they
make up. Part of the shared core: every stage may read them, none owns them."""

from streamrec.lazy import lazy_exports

_EXPORTS = {
    "CatchUp": "streamrec.contracts.catch_up",
    "CaughtUp": "streamrec.contracts.catch_up",
    "Contract": "streamrec.contracts.wire",
    "DayEnd": "streamrec.contracts.day_end",
    "Delivery": "streamrec.contracts.delivery",
    "Member": "streamrec.contracts.cluster",
    "ExportReply": "streamrec.contracts.training",
    "Generation": "streamrec.contracts.cluster",
    "GateDecision": "streamrec.contracts.delivery",
    "LayerSummary": "streamrec.contracts.delivery",
    "MaintainReply": "streamrec.contracts.training",
    "MaturedMetrics": "streamrec.contracts.training",
    "NodeBeat": "streamrec.contracts.cluster",
    "PassField": "streamrec.contracts.pass_status",
    "PassMetrics": "streamrec.contracts.training",
    "PassStatus": "streamrec.contracts.pass_status",
    "RedisPush": "streamrec.contracts.delivery",
    "RetentionRun": "streamrec.contracts.day_end",
    "SaveSummary": "streamrec.contracts.training",
    "ScoreReply": "streamrec.contracts.training",
    "Superseded": "streamrec.contracts.catch_up",
    "TaskResult": "streamrec.contracts.training",
    "TrainResult": "streamrec.contracts.training",
    "WorkerBeat": "streamrec.contracts.cluster",
}
__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
