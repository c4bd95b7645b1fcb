"""Typed config: the shipped files load; mistakes fail at start naming the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamrec.config import derived, dump_config, load_config, with_services
from streamrec.errors import ConfigError


def _write(tmp_path: Path, repo: Path, **changes) -> Path:
    raw = yaml.safe_load((repo / "configs" / "pipeline.yaml").read_text())
    raw["schema"] = str(repo / "configs" / "schema.yaml")
    raw["model"] = str(repo / "configs" / "models" / "ctr_dnn.yaml")
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = raw
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_shipped_configs_load(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(repo / "configs" / "pipeline.yaml")
    assert cfg.uses_embedded_services
    assert cfg.paths.data_root.is_absolute()
    assert [s.name for s in cfg.feature_schema.sparse][:2] == ["user_id", "item_id"]
    monkeypatch.setenv("REDIS_PASSWORD", "s3cret")
    docker = load_config(repo / "configs" / "pipeline.docker.yaml")
    assert not docker.uses_embedded_services
    assert docker.redis.url == "redis://redis:6379/0"  # the secret is not in the YAML
    assert docker.redis.password() == "s3cret"  # but read from the environment


def test_missing_environment_variable_is_named_with_its_key(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_PASSWORD", raising=False)
    docker = load_config(repo / "configs" / "pipeline.docker.yaml")  # checked where it is read
    with pytest.raises(ConfigError, match=r"redis\.password_env names \$REDIS_PASSWORD"):
        docker.redis.password()
    monkeypatch.delenv("SR_BROKERS", raising=False)
    path = _write(tmp_path, repo, kafka__bootstrap_servers="${SR_BROKERS}")
    with pytest.raises(
        ConfigError, match=r"key 'kafka\.bootstrap_servers' refers to \$\{SR_BROKERS\}"
    ):
        load_config(path)
    monkeypatch.setenv("SR_BROKERS", "k1:9092,k2:9092")
    assert load_config(path).kafka.bootstrap_servers == "k1:9092,k2:9092"


def test_schedule_start_needs_a_zone_and_retention_keeps_records_longer(
    tmp_path: Path, repo: Path
) -> None:
    with pytest.raises(ConfigError, match=r"schedule\.start.*UTC"):
        load_config(_write(tmp_path, repo, schedule__start="2026-11-23T08:00:00"))
    with pytest.raises(ConfigError, match="raise redis_days"):
        load_config(_write(tmp_path, repo, retention__redis_days=3))


def test_missing_key_is_named_with_its_meaning(tmp_path: Path, repo: Path) -> None:
    path = _write(tmp_path, repo, passes__pass_seconds=None)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value)
    assert "missing key 'passes.pass_seconds'" in str(e.value)
    assert "pass window" in str(e.value)


def test_unknown_key_is_named(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'kafka\.bootstrap_server'"):
        load_config(_write(tmp_path, repo, kafka__bootstrap_server="x:1"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("passes__pass_seconds", 420, "divide a day"),
        ("passes__pass_seconds", 45, "10, 12, 15, 20 or 30"),
        ("passes__pass_seconds", 5, "10, 12, 15, 20 or 30"),
        ("cluster__workers", 0, "cluster.workers"),
        ("passes__join_memory_mib", 0, "passes.join_memory_mib"),
        ("name", "Bad Name", "'name'"),
    ],
)
def test_bad_values_fail_with_the_key(
    tmp_path: Path, repo: Path, key: str, value, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, repo, **{key: value}))


def test_bad_sync_mode_lists_the_choices(tmp_path: Path, repo: Path) -> None:
    raw = yaml.safe_load((repo / "configs" / "models" / "ctr_dnn.yaml").read_text())
    raw["runner"]["sync_mode"] = "fast"
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(raw))
    path = _write(tmp_path, repo, model=str(tmp_path / "m.yaml"))
    with pytest.raises(ConfigError, match=r"model\.runner\.sync_mode.*'async', 'sync' or 'geo'"):
        load_config(path)


def _runner(tmp_path: Path, repo: Path, **runner) -> Path:
    raw = yaml.safe_load((repo / "configs" / "models" / "ctr_dnn.yaml").read_text())
    raw["runner"].update(runner)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(raw))
    return _write(tmp_path, repo, model=str(tmp_path / "m.yaml"))


def test_geo_fails_with_the_reason(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.runner\.sync_mode.*fixed-size.*Use 'async'"):
        load_config(_runner(tmp_path, repo, sync_mode="geo"))


def test_sync_needs_one_reader_thread(tmp_path: Path, repo: Path) -> None:
    assert load_config(_runner(tmp_path, repo, sync_mode="sync")).model.runner.thread_num == 1
    with pytest.raises(ConfigError, match=r"model\.runner.*thread_num is 2.*thread_num: 1"):
        load_config(_runner(tmp_path, repo, sync_mode="sync", thread_num=2))


def test_progressive_defaults_to_a_sampled_read(tmp_path: Path, repo: Path) -> None:
    assert load_config(_runner(tmp_path, repo)).model.runner.progressive == "sample"
    with pytest.raises(
        ConfigError, match=r"model\.runner\.progressive.*'separate', 'sample' or 'in_train'"
    ):
        load_config(_runner(tmp_path, repo, progressive="twice"))


def test_reserved_and_duplicate_feature_names_are_rejected(tmp_path: Path, repo: Path) -> None:
    schema = {"version": 1, "sparse": [{"name": "label"}, {"name": "a"}], "dense": [{"name": "a"}]}
    with pytest.raises(ConfigError, match="unique"):
        load_config(_write(tmp_path, repo, schema=schema))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_dumped_config_is_self_contained(tmp_path: Path, repo: Path) -> None:
    cfg = load_config(repo / "configs" / "pipeline.yaml")
    copy = load_config(dump_config(cfg, tmp_path / "elsewhere" / "resolved.yaml"))
    assert copy == cfg


@pytest.mark.parametrize(
    "module", ["demo", "streaming.producer", "streaming.pass_builder", "trainers.launcher"]
)
def test_clis_fail_at_start_naming_the_key(tmp_path: Path, repo: Path, module: str) -> None:
    import subprocess
    import sys

    path = _write(tmp_path, repo, redis=None)
    args = [sys.executable, "-m", module, "--config", str(path)]
    if module == "streaming.producer":
        args.append("--synthetic")
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "missing key 'redis'" in out.stderr


def _model(tmp_path: Path, repo: Path, section: str, **values) -> Path:
    raw = yaml.safe_load((repo / "configs" / "models" / "ctr_dnn.yaml").read_text())
    target = raw["hyper_parameters"]
    for key in section.split("."):
        target = target[key]
    target.update(values)
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(raw))
    return _write(tmp_path, repo, model=str(tmp_path / "m.yaml"))


def test_settings_the_cluster_cannot_run_fail_at_start(tmp_path: Path, repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"optimizer\.class.*SGD or Adam only.*use adam or sgd"):
        load_config(_model(tmp_path, repo, "optimizer", **{"class": "adagrad"}))
    with pytest.raises(ConfigError, match=r"embedx_threshold.*differ in width.*use 0"):
        load_config(_model(tmp_path, repo, "sparse_table", embedx_threshold=5))


def test_a_derived_config_is_validated_as_a_loaded_one(shipped_config) -> None:
    """``model_copy`` checks nothing: a config derived in code goes through ``derived``,
    which fails as loading would, naming the key."""
    cfg = with_services(shipped_config, "127.0.0.1:9092", "redis://127.0.0.1:6379/0")
    assert (cfg.kafka.bootstrap_servers, cfg.redis.url) == (
        "127.0.0.1:9092",
        "redis://127.0.0.1:6379/0",
    )
    assert cfg.passes == shipped_config.passes  # the rest as it was
    two = derived(cfg, "two passes an hour", passes={"pass_seconds": 1800})
    assert two.passes.clock.seconds == 1800 and two.passes.allowed_lateness_seconds == 60
    with pytest.raises(ConfigError, match=r"(?s)the demo's config.*passes\.pass_seconds"):
        derived(cfg, "the demo's config", passes={"pass_seconds": 420})
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_servers"):
        with_services(cfg, 9092, "redis://127.0.0.1:6379/0")


def test_a_derived_config_changes_only_the_keys_it_names(shipped_config) -> None:
    """A mapping changes the keys it names, in sub-sections too; a mapping field (the
    synthetic cardinalities) and a model are replaced whole; an unknown key is an error."""
    cfg = derived(
        shipped_config,
        "a test's config",
        name="other",
        model={
            "runner": {"sync_mode": "sync"},
            "hyper_parameters": {"optimizer": {"class": "sgd"}},
        },
        synthetic={"cardinality": {"user_id": 5}},
    )
    model = shipped_config.model
    assert cfg.name == "other" and cfg.model.runner.sync_mode == "sync"
    assert cfg.model.runner.batch_size == model.runner.batch_size
    assert cfg.model.hyper_parameters.optimizer.class_ == "sgd"
    assert cfg.model.hyper_parameters.optimizer.learning_rate == (
        model.hyper_parameters.optimizer.learning_rate
    )
    assert cfg.synthetic.cardinality == {"user_id": 5}
    assert derived(cfg, "a test's config", model=model).model == model
    with pytest.raises(ConfigError, match=r"model\.runner\.sync_mod"):
        derived(cfg, "a test's config", model={"runner": {"sync_mod": "sync"}})


TWO_LABELS = [
    {"name": "click", "source": "topic", "topic": "clicks", "window_seconds": 600},
    {
        "name": "conversion",
        "source": "topic",
        "topic": "conversions",
        "window_seconds": 3600,
        "requires": "click",
    },
]


def _two_labels(shipped_config, **schema):
    fs = shipped_config.feature_schema.model_dump(mode="json")
    return derived(
        shipped_config,
        "a two-label config",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": TWO_LABELS, **schema},
        synthetic={"conversion": {}},
    )


def test_labels_are_a_list_with_their_own_topics_and_windows(shipped_config, tmp_path) -> None:
    cfg = _two_labels(shipped_config)
    assert [x.name for x in cfg.topic_labels] == ["click", "conversion"]
    assert cfg.feature_schema.label_columns == ["label", "label_conversion"]
    assert cfg.label_wait_seconds == 3600
    assert load_config(dump_config(cfg, tmp_path / "two.yaml")) == cfg
    # the one-label shorthand: join's clicks are the same single label column
    assert shipped_config.join.mode == "click_join"
    assert [(x.name, x.topic) for x in shipped_config.labels] == [("click", "clicks")]
    assert shipped_config.feature_schema.label_columns == ["label"]


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([{"name": "click"}, {"name": "click"}], "unique"),
        ([{"name": "click", "source": "topic", "topic": "c"}], "required there"),
        ([{"name": "click", "topic": "c"}], "for source: topic"),
        (
            [
                {"name": "click", "source": "topic", "topic": "t", "window_seconds": 1},
                {"name": "conversion", "source": "topic", "topic": "t", "window_seconds": 1},
            ],
            "topic of its own",
        ),
        (
            [
                {"name": "click"},
                {
                    "name": "conversion",
                    "source": "topic",
                    "topic": "t",
                    "window_seconds": 1,
                    "requires": "view",
                },
            ],
            "must name another label",
        ),
        ([{"name": "click"}, {"name": "conversion", "requires": "click"}], "drop requires"),
        # a label is never read from a field that names another label
        (
            [{"name": "conversion", "field": "label"}],
            r"schema\.labels\.0\.field.*names the label 'click': leave field out "
            r"\(it reads 'label_conversion'\)",
        ),
        ([{"name": "click"}, {"name": "view", "field": "label_click"}], "names the label 'click'"),
        ([{"name": "click", "field": "event_time"}], "impression's own field"),
        (
            [{"name": "click", "field": "y"}, {"name": "conversion", "field": "y"}],
            r"same impression field: \['y'\]",
        ),
        (
            [
                {"name": "click"},
                {"name": "c", "source": "topic", "topic": "t", "window_seconds": 1, "field": "c"},
            ],
            "field is for source: impression",
        ),
    ],
)
def test_unsound_labels_fail_naming_the_fix(shipped_config, labels, match) -> None:
    with pytest.raises(ConfigError, match=match):
        _two_labels(shipped_config, labels=labels)


JOINED = {"source": "topic", "topic": "t", "window_seconds": 600}


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ({"emit": "soon", **JOINED}, r"schema\.labels\.0\.emit"),
        ({"emit": "at_once"}, "emit 'at_once' is for source: topic"),
        ({"emit": "after_wait", **JOINED}, "wait_seconds is for emit: after_wait, and required"),
        ({"wait_seconds": 60, **JOINED}, "wait_seconds is for emit: after_wait"),
        (
            {"emit": "after_wait", "wait_seconds": 600, **JOINED},
            r"wait_seconds \(600\) must be below window_seconds \(600\)",
        ),
    ],
)
def test_an_unsound_emit_policy_fails_naming_the_key(shipped_config, label, match) -> None:
    with pytest.raises(ConfigError, match=match):
        _two_labels(shipped_config, labels=[{"name": "click", **label}])


def test_emit_policies_give_the_trainer_each_row_kind(shipped_config) -> None:
    labels = [
        {**TWO_LABELS[0], "emit": "at_once"},
        {**TWO_LABELS[1], "emit": "after_wait", "wait_seconds": 300},
    ]
    schema = _two_labels(shipped_config, labels=labels).feature_schema
    assert [x.name for x in schema.fresh_labels] == ["click", "conversion"]
    assert schema.row_columns == ["kind_click", "kind_conversion", "delay_ms_conversion"]
    assert _two_labels(shipped_config).feature_schema.row_columns == []
    fs = shipped_config.feature_schema.model_dump(mode="json")
    dense = [*fs["dense"], {"name": "kind_click"}]
    with pytest.raises(ConfigError, match=r"\['kind_click'\] are the labels' row columns"):
        _two_labels(shipped_config, labels=labels, dense=dense)


def test_labels_said_twice_fail_with_the_way_to_say_it_once(shipped_config) -> None:
    fs = shipped_config.feature_schema.model_dump(mode="json")
    with pytest.raises(ConfigError, match=r"list the click in schema\.labels.*leave join out"):
        derived(shipped_config, "both", schema={**fs, "labels": TWO_LABELS})


def test_a_feature_named_like_a_label_column_is_rejected(shipped_config) -> None:
    fs = shipped_config.feature_schema.model_dump(mode="json")
    dense = [*fs["dense"], {"name": "label_conversion"}]
    with pytest.raises(ConfigError, match=r"\['label_conversion'\] are label columns"):
        _two_labels(shipped_config, dense=dense)


def test_gate_bounds_name_tasks_of_the_labels(shipped_config) -> None:
    fs = shipped_config.feature_schema.model_dump(mode="json")
    cfg = derived(
        shipped_config,
        "two labels",
        join={"mode": "label_in_impression"},
        schema={**fs, "labels": TWO_LABELS},
        gate={"tasks": {"conversion": {"min_auc": 0.7}, "conversion|click": {}}},
    )
    assert cfg.gate.tasks["conversion"].min_auc == 0.7
    with pytest.raises(ConfigError, match=r"gate\.tasks\.purchase: name a label"):
        derived(cfg, "a gate on no label", gate={"tasks": {"purchase": {}}})


def test_passes_cut_from_the_served_log_take_every_label_from_a_topic(shipped_config) -> None:
    served = derived(
        shipped_config,
        "training from what was served",
        passes={"cut_from": "served_log"},
        serving={"log_topic": "served"},
    )
    assert served.join.mode == "click_join"  # the clicks come from their topic: fine
    with pytest.raises(ConfigError, match=r"carries no label; join \['click'\]"):
        derived(served, "labels in the impression", join={"mode": "label_in_impression"})
    assert served.served_tasks == ("click",)  # each row keeps what scored it
    assert served.pass_topic == "served" and served.kafka.impressions_topic == "impressions"
    own = derived(served, "its own impressions", passes={"cut_from": "impressions"})
    assert own.served_tasks == () and own.pass_topic == "impressions"


def test_the_closed_loop_is_named_not_implied_by_two_topics(shipped_config) -> None:
    with pytest.raises(ConfigError, match=r"set passes\.cut_from: served_log"):
        derived(
            shipped_config,
            "the served log as the impressions topic",
            kafka={"impressions_topic": "served"},
            serving={"log_topic": "served"},
        )
    with pytest.raises(ConfigError, match=r"needs the served log: set serving\.log_topic"):
        derived(shipped_config, "no log to cut from", passes={"cut_from": "served_log"})


def test_the_online_alarm_needs_passes_cut_from_the_served_log(shipped_config) -> None:
    with pytest.raises(ConfigError, match=r"online\.rollback needs passes cut from the served"):
        derived(shipped_config, "an alarm without the log", online={"rollback": True})
    served = derived(
        shipped_config,
        "training from what was served",
        passes={"cut_from": "served_log"},
        serving={"log_topic": "served"},
        online={"rollback": True},
    )
    assert served.online.rollback
    with pytest.raises(ConfigError, match=r"online\.task: name a label"):
        derived(served, "an alarm on no label", online={"task": "purchase"})
    with pytest.raises(ConfigError, match=r"holdout_share"):
        derived(served, "everything held out", serving={"holdout_share": 1.0})


def test_steps_divide_the_pass_and_need_rows_final_when_read(shipped_config) -> None:
    ok = {"join_memory_mib": None}
    cfg = derived(
        shipped_config,
        "steps",
        join={"mode": "label_in_impression"},
        cluster={"follow_passes": True},
        passes={**ok, "pass_seconds": 60, "step_seconds": 15},
    )
    assert cfg.passes.step_seconds == 15
    for passes, sections, match in [
        ({"step_seconds": 25}, {}, r"step_seconds 25 must divide passes\.pass_seconds \(60\)"),
        ({"step_seconds": 60}, {}, r"into two or more steps"),
        ({"step_seconds": 15}, {"join": {"mode": "click_join"}}, r"carry the labels"),
        ({"step_seconds": 15, "join_memory_mib": 64}, {}, r"join_memory_mib: null"),
        ({"step_seconds": 15}, {"cluster": {"follow_passes": False}}, r"follow_passes: true"),
    ]:
        with pytest.raises(ConfigError, match=match):
            derived(cfg, "bad steps", passes={**ok, "pass_seconds": 60, **passes}, **sections)
