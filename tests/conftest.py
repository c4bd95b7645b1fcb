"""Shared fixtures. The rule (see tests/README.md): ``tests/unit`` needs no services;
``tests/integration`` runs on real ones (a Kafka-protocol broker, redis-server, a fleetrun
cluster, Airflow) started here and torn down after, and is marked ``integration``."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cpu_report import CpuReport
from hypothesis import settings

from devservices.local_services import LocalServices, local_services
from serving_export.manifest import ARTIFACT_VERSION, ArtifactManifest
from streaming.feature_signs import SIGN_VERSION
from streamrec.config import (
    DEFAULT_SPARSE_TABLE,
    PathConfig,
    PipelineConfig,
    derived,
    load_config,
    with_services,
)
from streamrec.contracts.delivery import GateDecision
from streamrec.contracts.training import PassMetrics, TrainResult
from streamrec.ports import PORT_RANGE_ENV, port_range
from trainers.network_loader import network_path

REPO = Path(__file__).resolve().parent.parent


WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # pytest-xdist's worker id, if any
_SESSION_ENV = {
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "STREAMREC_LOG_LEVEL": "INFO",
    # Airflow's default loop, not the live demo's 0.25 s (ops/airflow_local.py TUNING): the
    # idle scheduler then takes 6% of a core instead of 18%, on a suite bound by its CPU;
    # no test measures the time between tasks
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "1",
}
# seconds, for tests without a timeout mark: {integration?: timeout}. The slow modules mark
# their own (pytestmark); each is about three times what the test takes under the parallel
# suite on the 2-core CI machine.
DEFAULT_TIMEOUT = {False: 60, True: 180}

# Hypothesis' 200 ms deadline per example measures the machine, not the code: on the
# 2-core CI box, busy with the integration tests beside it, a 0.3 ms example once took
# 301 ms and failed the run. Every test has a timeout (above); property tests keep theirs.
settings.register_profile("streamrec", deadline=None)
settings.load_profile("streamrec")
# Modules whose tests SIGKILL or SIGTERM a process at a chosen moment and assert where it
# landed: one worker runs them one after another, so no two of them load the machine at once.
TOGETHER = {
    "timed_kills": (
        "test_cluster_restore",
        "test_cluster_modes",
        "test_streaming_guarantees",
        "test_shutdown",
    )
}
_saved_env: dict[str, str | None] = {}
_airflow_home: list[str] = []


def _worker_ports() -> str:
    """This worker's slice of the ports below the ephemeral range, so concurrent workers
    (and the services they start, which inherit it) never pick the same port."""
    ports = port_range()
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = len(ports) // count
    low = ports.start + int(WORKER.removeprefix("gw")) * size
    return f"{low}-{low + size - 1}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        type=Path,
        metavar="DIR",
        help="record each test's CPU in DIR and print it per module at the end (cpu_report.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if folder := config.getoption("--cpu-report"):
        config.pluginmanager.register(CpuReport(folder), "cpu_report")
    # Airflow reads its settings at import: each worker gets its own home (and so its own
    # sqlite database), made here and removed at the end of the session.
    home = tempfile.mkdtemp(prefix=f"streamrec-airflow-{WORKER}-")
    _airflow_home.append(home)
    session = {**_SESSION_ENV, "AIRFLOW_HOME": home, PORT_RANGE_ENV: _worker_ports()}
    for key, value in session.items():
        _saved_env[key] = os.environ.get(key)
        os.environ[key] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for home in _airflow_home:
        shutil.rmtree(home, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark integration tests, give every test a timeout (its own or its module's mark, else
    the default for its kind), and put the worker groups that take longest first, so that
    workers start on them."""
    cost: dict[str, float] = {}
    for item in items:
        integration = bool({"integration", "soak"} & set(item.path.parts))
        if integration:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT[integration]))
        group = worker_group(item.nodeid)
        # an integration test's timeout bounds what it takes; a unit test takes a second or
        # so whatever its timeout, and many of them must not rank a module above a long one
        seconds = item.get_closest_marker("timeout").args[0] if integration else 1
        cost[group] = cost.get(group, 0) + seconds
    items.sort(key=lambda item: -cost[worker_group(item.nodeid)])  # stable: groups stay whole


def worker_group(nodeid: str) -> str:
    """The tests one pytest-xdist worker runs one after another: a module (its fixtures are
    built once), or a group of modules in ``TOGETHER``."""
    module = nodeid.split("::", 1)[0]
    stem = Path(module).stem
    return next((name for name, stems in TOGETHER.items() if stem in stems), module)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's load-scope scheduling, by ``worker_group``, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ByGroup(config, log)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shipped_config() -> PipelineConfig:
    """configs/pipeline.yaml as users get it."""
    return load_config(REPO / "configs" / "pipeline.yaml")


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServices]:
    """A real broker and redis-server on loopback for the whole session."""
    with local_services(tmp_path_factory.mktemp("services")) as svc:
        yield svc


ManifestFactory = Callable[..., ArtifactManifest]


@pytest.fixture(scope="session")
def artifact_manifest(shipped_config: PipelineConfig) -> ManifestFactory:
    """``artifact_manifest("0110", parent="0100", chain=[...], files={...})``: a complete
    manifest of a version of the shipped model, as packaging writes it, for tests that
    publish artifacts or register versions by hand."""

    def make(
        version: str,
        *,
        parent: str | None = None,
        chain: tuple[str, ...] | list[str] = (),
        files: dict[str, str] | None = None,
        embedding_dim: int = 1,
        keys: int = 0,
        auc: float = 0.7,
    ) -> ArtifactManifest:
        now = "2026-01-01T00:00:00+00:00"
        return ArtifactManifest(
            artifact_version=ARTIFACT_VERSION,
            model=shipped_config.model.model,
            version=version,
            pass_id=version,
            created_at=now,
            metrics={"auc": auc, "gate": GateDecision(passed=True, auc=auc, serving_auc=None)},
            network=network_path(shipped_config.model),
            slot_feeds={s.name: f"{s.name}_pooled" for s in shipped_config.feature_schema.sparse},
            sequence_feeds={},
            dense_feed="dense",
            sparse_tables={
                DEFAULT_SPARSE_TABLE: {
                    "dim": embedding_dim,
                    "slots": [s.name for s in shipped_config.feature_schema.sparse],
                    "keys": keys,
                }
            },
            sign_version=SIGN_VERSION,
            feature_schema=shipped_config.feature_schema,
            sparse={
                "kind": "delta" if parent else "full",
                "parent": parent,
                "keys": keys,
                "table_keys": keys,
            },
            chain=tuple(chain),
            onnx={"file": None, "error": "not converted in this test"},
            freshness={"window_end": now, "pass_completed_at": now, "trained_at": now},
            files=files or {},
        )

    return make


ConfigFactory = Callable[..., PipelineConfig]


@pytest.fixture(scope="session")
def make_config(
    shipped_config: PipelineConfig,
    services: LocalServices,
    tmp_path_factory: pytest.TempPathFactory,
) -> ConfigFactory:
    """Configs on the session's services, each with its own directories, Redis prefix and
    topics; ``make_config(passes={"parts_per_pass": 2})`` overrides keys of a section."""

    def make(**sections: dict) -> PipelineConfig:
        suffix = uuid.uuid4().hex[:8]
        root = tmp_path_factory.mktemp(f"pipeline-{suffix}")
        cfg = with_services(shipped_config, services.bootstrap_servers, services.redis_url)
        cfg = derived(
            cfg,
            "the test's config",
            name=f"t{suffix}",
            kafka={"impressions_topic": f"impressions-{suffix}"},
            join={"clicks_topic": f"clicks-{suffix}"},
            # the tests send the cluster its commands: a follower would train their passes
            # first (those that test it ask for it)
            cluster={"follow_passes": False},
            paths=PathConfig.under(root),
        )
        return derived(cfg, "the test's config", **sections)

    return make


PassRun = Callable[[PipelineConfig, str, int], dict[str, Any]]


@pytest.fixture(scope="session")
def build_passes() -> PassRun:
    """``build_passes(cfg, first_pass, n)``: produce ``n`` synthetic passes on the real broker
    (``produce_synthetic``), then build them into pass directories with the real builder;
    the synthetic batches by pass id."""
    from streaming.pass_builder import PassBuilder
    from streaming.producer import produce_synthetic

    def build(cfg: PipelineConfig, first_pass: str, n: int) -> dict[str, Any]:
        batches = produce_synthetic(cfg, first_pass, n)
        builder = PassBuilder(cfg)
        try:
            builder.run(until_pass=list(batches)[n - 1], idle_timeout_s=60)
        finally:
            builder.close()
        return batches

    return build


def _wait_until_training(client: Any, pass_id: str, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while f"train {pass_id}: train" not in {w.state for w in client.live_workers()}:
        if time.monotonic() > deadline:
            pytest.fail(f"the workers never started training on {pass_id}")
        time.sleep(0.05)


def _train_result(pass_id: str, auc: float = 0.7, rows: int = 1000, **fields: Any) -> TrainResult:
    metrics = PassMetrics(rows, auc, 0.45, 1.0, 0.3, 0.4, 0.2, 0.2, 0.01)
    return TrainResult(
        **{
            "pass_id": pass_id,
            "rows": rows,
            "count_matches_manifest": True,
            "test": metrics,
            "train": metrics,
            "seconds": {"train": 1.0},
            "workers": 2,
            "reader": "QueueDataset",
            "progressive": "sample",
            "progressive_every": 1,
            "sync_mode": "async",
            "sync_rounds": None,
            "dense_average": None,
            "intercept": None,
            "started_at": 0.0,
            "trained_at": 1.0,
            **fields,
        }
    )


@pytest.fixture(scope="session")
def train_result() -> Callable[..., TrainResult]:
    """``train_result(pass_id, auc=0.7, rows=1000, **fields)``: a well-formed TrainResult
    of a pass, for tests of what reads one (status, the gate, the catch-up)."""
    return _train_result


@pytest.fixture(scope="session")
def wait_until_training() -> Callable[[Any, str], None]:
    """``wait_until_training(client, pass_id)``: block until a worker's heartbeat says it
    is in the ``train`` stage of ``pass_id``."""
    return _wait_until_training


KillMidPass = Callable[..., bool]


@pytest.fixture(scope="session")
def kill_mid_pass() -> KillMidPass:
    """``kill_mid_pass(cluster, command_id, pass_id, role, into_training_s=0.3)``: once the
    workers are training on ``pass_id`` (their heartbeats say so) and ``into_training_s``
    later, SIGKILL one ``role`` process ("PSERVER" or "TRAINER") before the command is
    done, wait for the launcher to see the cluster unhealthy, and restart it; True if it
    was restarted. The config needs short heartbeats (``cluster={"heartbeat_seconds":
    0.2}``)."""
    import signal
    import time

    from streamrec.redis_conn import connect
    from streamrec.redis_keys import RedisKeys

    def kill(
        cluster: Any, command_id: str, pass_id: str, role: str, into_training_s: float = 0.3
    ) -> bool:
        _wait_until_training(cluster.client, pass_id)
        time.sleep(into_training_s)
        victims = cluster.members(role)
        assert victims, f"no {role} process among {cluster.members()}"
        key = RedisKeys(cluster.cfg.name).command(command_id)
        status = connect(cluster.cfg.redis).hget(key, "status")
        assert status == "queued", "the pass finished before the kill: make it longer"
        victims[-1].send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while cluster.healthy and time.monotonic() < deadline:
            time.sleep(0.2)
        return cluster.ensure_healthy()

    return kill
