"""A network's declared needs (``streamrec.network.NetworkNeeds``) are checked against the
feature schema before any work: a DIN whose history slot is not a sequence fails with
exit 2 naming the slot and the fix, in ``streamrec schema`` as at the cluster's start,
instead of a ``KeyError`` in the cluster's first build. No Paddle is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrec.config import derived, load_config
from streamrec.errors import ConfigError
from trainers.network_loader import check_network_fits, network_needs

ROOT = Path(__file__).resolve().parents[2]
DIN = ROOT / "examples" / "din"
CONVERSIONS = ROOT / "examples" / "conversions"
CLI = str(Path(sys.executable).with_name("streamrec"))


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DIN))
    monkeypatch.syspath_prepend(str(CONVERSIONS))


def _din_schema(tmp_path: Path, **history: object) -> Path:
    """The DIN example with its history slot changed; the config's path."""
    schema = yaml.safe_load((DIN / "schema.yaml").read_text())
    slot = next(s for s in schema["sparse"] if s["name"] == "clicked_items")
    slot.update(history)
    for key in [k for k, v in slot.items() if v is None]:
        del slot[key]
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    config = yaml.safe_load((DIN / "pipeline.yaml").read_text())
    config["model"] = str(DIN / "model.yaml")
    del config["synthetic"]["interest"]  # its generator needs a sequence too
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "pipeline.yaml"


def test_the_din_example_fits_its_schema(on_path: None) -> None:
    cfg = load_config(DIN / "pipeline.yaml")
    needs = network_needs(cfg.model)
    assert (needs.sequences, needs.pooled) == (("clicked_items",), ("item_id",))
    check_network_fits(cfg.feature_schema, cfg.model)


def test_a_history_that_is_no_sequence_fails_naming_the_slot(on_path: None, tmp_path) -> None:
    cfg = load_config(_din_schema(tmp_path, pooling="sum", max_length=None, keep=None))
    with pytest.raises(ConfigError) as e:
        check_network_fits(cfg.feature_schema, cfg.model)
    assert str(e.value).startswith("schema.sparse.clicked_items.pooling: din:Din reads")
    assert "set pooling: sequence and max_length on it" in str(e.value)


def test_a_missing_slot_or_label_fails_naming_it(on_path: None) -> None:
    cfg = load_config(DIN / "pipeline.yaml")
    elsewhere = derived(
        cfg, "history elsewhere", model={"hyper_parameters": {"history": "viewed_items"}}
    )
    with pytest.raises(ConfigError, match=r"slot 'viewed_items' as a sequence, and the schema"):
        check_network_fits(elsewhere.feature_schema, elsewhere.model)
    pooled = derived(cfg, "target a sequence", model={"hyper_parameters": {"target": "x"}})
    with pytest.raises(ConfigError, match=r"reads the slot 'x' pooled"):
        check_network_fits(pooled.feature_schema, pooled.model)
    esmm = load_config(CONVERSIONS / "pipeline.yaml")
    check_network_fits(esmm.feature_schema, esmm.model)
    fs = esmm.feature_schema.model_dump(mode="json")
    clicks_only = derived(esmm, "clicks only", schema={**fs, "labels": fs["labels"][:1]})
    with pytest.raises(ConfigError, match=r"heads the label 'conversion'"):
        check_network_fits(clicks_only.feature_schema, clicks_only.model)


def test_streamrec_schema_exits_2_naming_the_slot(tmp_path: Path) -> None:
    config = _din_schema(tmp_path, pooling="mean", max_length=None, keep=None)
    env = {"PYTHONPATH": str(DIN), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [CLI, "schema", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "schema.sparse.clicked_items.pooling" in done.stderr
    fits = subprocess.run(
        [CLI, "schema", "--config", str(DIN / "pipeline.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert fits.returncode == 0, fits.stderr
