"""The forward-only scoring program: the shipped model minimised by ``fleet`` as a PS
trainer (in a child process: fleet's role is process-wide), then pruned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# a trainer of a 1-server, 2-worker job; nothing listens there: building needs no server
_ROLE = {
    "TRAINING_ROLE": "TRAINER",
    "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:1",
    "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:2,127.0.0.1:3",
    "PADDLE_TRAINERS_NUM": "2",
    "PADDLE_TRAINER_ID": "0",
    "POD_IP": "127.0.0.1",
    "PADDLE_PORT": "2",
    "FLAGS_LAUNCH_BARRIER": "0",
}

_BUILD = """
import json, sys
from streamrec.config import load_config
from trainers.worker.scoring_program import op_types, scoring_program
from trainers.worker.strategy import build_distributed_program
import paddle  # after pyarrow: the other order fails pyarrow's import (a zlib error)

build_distributed_program(load_config(sys.argv[1]))
main = paddle.static.default_main_program()
scoring = scoring_program(main)
print(json.dumps({
    "main": op_types(main),
    "scoring": op_types(scoring),
    "main_trainer": [main._fleet_opt[k] for k in ("trainer", "device_worker")],
    "scoring_trainer": [scoring._fleet_opt[k] for k in ("trainer", "device_worker")],
    "scoring_configs": "program_configs" in scoring._fleet_opt,
    "same_options": scoring._fleet_opt is main._fleet_opt,
}))
"""


def _built() -> dict:
    env = {**os.environ, **_ROLE, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", _BUILD, str(REPO / "configs" / "pipeline.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_scoring_keeps_the_forward_pass_on_a_trainer_of_its_own() -> None:
    built = _built()
    main, scoring = built["main"], built["scoring"]
    assert any(t.endswith("_grad") for t in main) and "send" in main  # what is pruned
    assert not [t for t in scoring if t.endswith("_grad") or t == "send"]
    # the forward ops, in order: the training program begins with them
    assert main[: len(scoring)] == scoring
    assert "distributed_lookup_table" in scoring and "auc" in scoring
    # scoring on the plain trainer (no PS client flush after each read); training keeps its own
    assert built["scoring_trainer"] == ["MultiTrainer", "Hogwild"]
    assert built["main_trainer"] == ["DistMultiTrainer", "DownpourLite"]
    assert not built["scoring_configs"]
    assert not built["same_options"]  # a dump pointed at one program leaves the other
