"""The forward-only program a worker scores with: the training program without its
backward, optimizer and communication ops.

Paddle 2.6.2's asynchronous device worker (``DownpourLite``) runs an ``infer_from_dataset``
over the whole training program and skips only ``feed``, the push ops and ``send``: every
``*_grad`` op still runs, so a scoring read cost what training does per row
(docs/decisions/, "A steady model"). This program keeps the ops whose role is the
forward pass (the sparse pulls, the network, the metric accumulators), none of the pushes,
and fleet options of its own (a read's dump fields are set there).

It runs on Paddle's plain ``MultiTrainer`` and ``Hogwild`` device worker, not on the
training program's ``DistMultiTrainer``: that trainer's ``Finalize`` flushes the PS client
(``BrpcPsClient::Flush``), which sleeps 100 ms before it first looks whether anything is
queued, so every scoring read paid at least 0.1 s after its last row (a 12,000-row pass's
sampled score 0.15 s, its refit 0.21 s; with ``Hogwild`` 0.05 s and 0.10 s, the predictions
bit-identical). A forward-only read pushes nothing to flush. ``Hogwild`` does not pull the
dense tables as the asynchronous worker does at its start: the caller pulls them into the
scope first (``dense_tables.pull``); the sparse lookups pull from the servers either way.
"""

from __future__ import annotations

from typing import Any

# the sparse push the PS pass appends after the backward ops carries the forward role
_PUSHES = {"distributed_push_sparse", "push_sparse", "push_sparse_v2", "push_dense"}


def scoring_program(main: Any) -> Any:
    """A copy of ``main`` (built and minimised by ``fleet``) with only its forward ops, for
    ``infer_from_dataset``; the variables are shared through the scope, so it scores with
    the parameters the training program pulls and trains."""
    from paddle.base.core import op_proto_and_checker_maker

    role_attr = op_proto_and_checker_maker.kOpRoleAttrName()
    roles = op_proto_and_checker_maker.OpRole
    # an op with any of these bits in its role is not part of the forward pass
    not_forward = int(roles.Backward) | int(roles.Optimize) | int(roles.RPC) | int(roles.Dist)
    program = main.clone()
    for block in program.blocks:
        for index in reversed(range(len(block.ops))):
            op = block.ops[index]
            role = int(op.attr(role_attr)) if op.has_attr(role_attr) else 0
            if role & not_forward or op.type in _PUSHES:
                block._remove_op(index, sync=False)
    program._sync_with_cpp()
    # the asynchronous worker's dense tables by program id (``program_configs``) are for a
    # trainer this program does not run on
    options = {k: v for k, v in main._fleet_opt.items() if k != "program_configs"}
    program._fleet_opt = {**options, "trainer": "MultiTrainer", "device_worker": "Hogwild"}
    return program


def op_types(program: Any) -> list[str]:
    """The program's op types in order (block 0): what a log shows of it."""
    return [op.type for op in program.global_block().ops]
