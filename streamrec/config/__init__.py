"""Typed pipeline configuration: one loader, unknown keys fail, errors name the file and key.

The sections live by what they configure: ``services`` (Kafka, the click join, Redis),
``stream`` (passes, the feature schema, the synthetic stream), ``cluster`` (paths, nodes,
the cluster, checkpoints), ``model`` (the PaddleRec-style model file), ``delivery`` (the
gate, serving, the schedule, retention), and ``pipeline`` (the whole file, loading and
dumping it). Import them from here.
"""

from streamrec.config.base import (
    ELAPSED_COLUMN,
    EMBEDDED,
    RESERVED_COLUMNS,
    SERVED_VERSION,
    delay_column,
    kind_column,
    served_p_column,
)
from streamrec.config.cluster import CheckpointConfig, ClusterConfig, NodeConfig, PathConfig
from streamrec.config.delivery import GateConfig, RetentionConfig, ScheduleConfig, ServingConfig
from streamrec.config.model import (
    DEFAULT_SPARSE_TABLE,
    HyperParameters,
    ModelConfig,
    OptimizerConfig,
    RunnerConfig,
    SlotTableConfig,
    SparseTableConfig,
)
from streamrec.config.pipeline import (
    PipelineConfig,
    derived,
    dump_config,
    load_config,
    with_services,
)
from streamrec.config.services import JoinConfig, KafkaConfig, RedisConfig
from streamrec.config.stream import (
    LABELS_OBJECT,
    ConversionConfig,
    DenseFeature,
    LabelSpec,
    PassConfig,
    SchemaConfig,
    SparseSlot,
    SyntheticConfig,
    label_column,
)
from streamrec.config.tables import SparseTableSpec, admission_on, sparse_tables, table_of_slot

__all__ = [
    "DEFAULT_SPARSE_TABLE",
    "ELAPSED_COLUMN",
    "EMBEDDED",
    "LABELS_OBJECT",
    "RESERVED_COLUMNS",
    "SERVED_VERSION",
    "CheckpointConfig",
    "ClusterConfig",
    "ConversionConfig",
    "DenseFeature",
    "GateConfig",
    "HyperParameters",
    "JoinConfig",
    "KafkaConfig",
    "LabelSpec",
    "ModelConfig",
    "NodeConfig",
    "OptimizerConfig",
    "PassConfig",
    "PathConfig",
    "PipelineConfig",
    "RedisConfig",
    "RetentionConfig",
    "RunnerConfig",
    "ScheduleConfig",
    "SchemaConfig",
    "ServingConfig",
    "SlotTableConfig",
    "SparseSlot",
    "SparseTableConfig",
    "SparseTableSpec",
    "SyntheticConfig",
    "admission_on",
    "delay_column",
    "derived",
    "dump_config",
    "kind_column",
    "label_column",
    "load_config",
    "served_p_column",
    "sparse_tables",
    "table_of_slot",
    "with_services",
]
