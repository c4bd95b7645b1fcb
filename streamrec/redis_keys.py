"""Every Redis key streamrec uses, composed and parsed here and nowhere else.

All keys of one pipeline live under ``streamrec:<pipeline name>:``::

    commands                       STREAM  cluster commands in order (fields: id, kind, pass_id)
    command:<command_id>           HASH    kind, pass_id, status (queued|done|failed), result
                                           (JSON), error, and per worker ack:<rank>, result:<rank>
    pass:<pass_id>                 HASH    per-pass status, a field per step that finished on
                                           the pass (``contracts.pass_status.PassField``: train,
                                           maintain, export, gate, delivered, caught_up,
                                           superseded), each its contract's JSON
    heartbeat:<role>:<rank>        STRING  JSON {rank, pid, node, generation, state, ts}, expires
                                           after a few periods
    cursor:cluster                 STRING  id of the last command the cluster finished (one
                                           for every worker: moved with the command's outcome)
    done:<kind>:<pass_id>          STRING  the command id that completed <kind> for the pass;
                                           train/maintain markers past the model a restarted
                                           cluster restored are dropped (trained again)
    cluster:generation             HASH    the cluster generation the node agents agree on: gen,
                                           state (forming|started), cause, by, at_ms, started_ms
    cluster:ready:<gen>            HASH    node -> agent incarnation, for the nodes that joined
                                           a forming generation
    cluster:node:<node>            STRING  JSON heartbeat of a node agent (its generation, state,
                                           members), expires after cluster.node_timeout_seconds
    cluster:history                LIST    JSON of each generation that started, newest first
    cluster:storage                STRING  JSON {node, token} of the shared-storage marker the
                                           first node wrote (trainers.hosts.shared_storage)
    registry:<model>:versions      HASH    version -> artifact MANIFEST.json
    registry:<model>:serving       STRING  the version serving reads
    registry:<model>:history       LIST    JSON records of every pointer switch, newest first
    registry:<model>:candidate     STRING  the version on canary (serving.canary_share), if any
    registry:<model>:withdrawn     HASH    version -> JSON {reason, at} of a version the online
                                           alarm rolled back: never promoted again
    registry:<model>:online        HASH    version -> JSON list of its online metrics per
                                           task (ops.online), as `streamrec online` last saw
    registry:<model>:replica:<id>  STRING  JSON {replica, host, version, loaded_at, ts} of a
                                           running `streamrec serve`, expires unless renewed
    sparse:<model>:<version>:<table>  HASH  the embeddings of one sparse table a version's
                                           artifact carries (every key of a full version, the
                                           changed keys of a delta): field = feature sign as
                                           8 bytes little-endian, value = float32
                                           little-endian embedding
    sparse:<model>:layers          HASH    version -> JSON {kind, parent, keys, tables: {table:
                                           {keys, dim}}}: set only once every table's hash of
                                           that version is completely written
"""

from __future__ import annotations

from dataclasses import dataclass

KEY_VERSION = 1
RESULT_FIELD = "result:"  # + rank: a worker's result in a command's hash
ACK_FIELD = "ack:"  # + rank: when that worker acknowledged the command


def worker_results(command: dict[str, str]) -> dict[int, str]:
    """Each worker's result (JSON text) in a command's hash, by rank."""
    return {
        int(field.removeprefix(RESULT_FIELD)): value
        for field, value in command.items()
        if field.startswith(RESULT_FIELD)
    }


@dataclass(frozen=True)
class RedisKeys:
    """Key names of one pipeline."""

    pipeline: str

    @property
    def prefix(self) -> str:
        return f"streamrec:{self.pipeline}"

    @property
    def commands(self) -> str:
        return f"{self.prefix}:commands"

    def command(self, command_id: str) -> str:
        return f"{self.prefix}:command:{command_id}"

    def pass_status(self, pass_id: str) -> str:
        return f"{self.prefix}:pass:{pass_id}"

    @staticmethod
    def pass_of(key: str) -> str:
        """The pass a ``pass_status`` or ``done`` key is of (its last part)."""
        return key.rsplit(":", 1)[1]

    def heartbeat(self, role: str, rank: int) -> str:
        return f"{self.prefix}:heartbeat:{role}:{rank}"

    def heartbeat_pattern(self, role: str) -> str:
        return f"{self.prefix}:heartbeat:{role}:*"

    @property
    def cursor(self) -> str:
        return f"{self.prefix}:cursor:cluster"

    def done(self, kind: str, pass_id: str) -> str:
        return f"{self.prefix}:done:{kind}:{pass_id}"

    @property
    def cluster_generation(self) -> str:
        return f"{self.prefix}:cluster:generation"

    def cluster_ready(self, generation: int) -> str:
        return f"{self.prefix}:cluster:ready:{generation}"

    def cluster_node(self, node: str) -> str:
        return f"{self.prefix}:cluster:node:{node}"

    @property
    def cluster_history(self) -> str:
        return f"{self.prefix}:cluster:history"

    @property
    def cluster_restore(self) -> str:
        """The newest generation's restore (``RestoreNote``), written by its first worker."""
        return f"{self.prefix}:cluster:restore"

    @property
    def pass_follower(self) -> str:
        """The lease of the node whose pass follower leads (``ops.pass_follower``)."""
        return f"{self.prefix}:cluster:follower"

    @property
    def cluster_storage(self) -> str:
        return f"{self.prefix}:cluster:storage"

    def registry_versions(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:versions"

    def registry_serving(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:serving"

    def registry_history(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:history"

    def registry_moves(self, model: str) -> str:
        """The channel each move of the serving pointer or the candidate is published on."""
        return f"{self.prefix}:registry:{model}:moves"

    def registry_candidate(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:candidate"

    def registry_withdrawn(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:withdrawn"

    def registry_online(self, model: str) -> str:
        return f"{self.prefix}:registry:{model}:online"

    def registry_replica(self, model: str, replica: str) -> str:
        return f"{self.prefix}:registry:{model}:replica:{replica}"

    def sparse_layer(self, model: str, version: str, table: str) -> str:
        return f"{self.prefix}:sparse:{model}:{version}:{table}"

    def sparse_layer_pattern(self, model: str, version: str) -> str:
        """Every table's layer of a version (a SCAN pattern; versions are plain names)."""
        return f"{self.prefix}:sparse:{model}:{version}:*"

    def sparse_layers(self, model: str) -> str:
        return f"{self.prefix}:sparse:{model}:layers"
