"""TESTING.md trap 1 for real data parallel: two gloo processes running the module's own update
under Lightning's DDP strategy give the gradient of the single-process full batch, for every
aggregation mode, with and without micro-batching (ranks holding different numbers of
micro-batches, and mini-batches in which a rank holds no row at all).

Each rank gets its own share of whole groups (3 and 2 prompts of a 5-prompt step: 6 and 4 rows),
collated on its own (other padding widths), with uneven trained-token counts (reset-style
``trainable_from``, one row with no trained token). The optimizer records every gradient it is
asked to apply (lr 0, no clipping); the reference is plain autograd on the whole batch in this
process. Both processes are started once and run every scenario.
"""

from __future__ import annotations

import functools
import os
import socket

import pytest
import torch
from creditlab.step.aggregation import AGG_MODES, MiniBatchStats
from creditlab.step.losses import LossConfig, gather_logprobs, policy_loss
from creditlab.step.rollout import collate
from creditlab.types import Completion, Problem, Trajectory

from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.slow, pytest.mark.numerics]  # two processes importing Lightning: ~20-40 s

WORLD = 2
PROMPTS, GROUP = 5, 2
#: (agg, micro_batch_size, updates_per_batch): micro 4 gives rank 0 two micro-batches and rank 1
#: one; 5 updates leave rank 1 (4 rows) without a row in its last mini-batch.
SCENARIOS = [(agg, micro, 1) for agg in AGG_MODES for micro in (0, 4)] + [
    ("token-mean", 2, 5), ("seq-mean-token-mean", 0, 5),
]


def _trajectories() -> list[Trajectory]:
    """The step's rows (the same in every process): 5 prompts x 2 completions."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for p in range(PROMPTS):
        prompt = tuple(torch.randint(5, 60, (3 + p % 3,), generator=gen).tolist())
        problem = Problem(f"p{p}", f"prompt {p}", "1")
        for g in range(GROUP):
            n = 3 + int(torch.randint(0, 9, (1,), generator=gen))
            resp = tuple(torch.randint(5, 60, (n,), generator=gen).tolist())
            start = 0 if (p + g) % 3 else min(2, n)  # a reset-style suffix: fewer trained tokens
            if p == 4 and g == 1:
                start = n  # no trained token at all
            c = Completion(prompt, resp, (0.0,) * n, "eos", "")
            out.append(Trajectory(problem, c, float(g), p, start))
    return out


def _advantages(trajs: list[Trajectory], width: int) -> torch.Tensor:
    """(B, width) per-token advantages, a fixed function of each trajectory (any padding)."""
    rows = []
    for t in trajs:
        seed = hash((t.completion.prompt_ids, t.completion.response_ids)) % (2**31)
        vals = torch.randn(len(t.completion.response_ids), generator=torch.Generator().manual_seed(seed))
        rows.append(torch.nn.functional.pad(vals, (0, width - len(vals))))
    return torch.stack(rows)


def _rank_share(trajs: list[Trajectory], rank: int) -> list[Trajectory]:
    from creditlab.step.distributed import shard

    prompts = shard(list(range(PROMPTS)), rank, WORLD)
    return [t for t in trajs if t.group_id in prompts]


class _RecordingSGD(torch.optim.SGD):
    """SGD with lr 0 that records, at each ``step``, every parameter's gradient."""

    record: list[dict[str, torch.Tensor]] = []
    names: dict[int, str] = {}

    def step(self, closure=None):  # noqa: D102
        grads = {}
        for group in self.param_groups:
            for p in group["params"]:
                grads[self.names[id(p)]] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        self.record.append(grads)
        return super().step(closure)


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD),
                      NODE_RANK="0", LOCAL_RANK=str(rank), RANK=str(rank), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    import lightning as L
    from creditlab.step.evaluation import EvalConfig
    from creditlab.step.module import CreditAssignmentModule
    from creditlab.step.rollout import RolloutConfig
    from lightning.pytorch.strategies import DDPStrategy
    from torch.utils.data import DataLoader

    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    _RecordingSGD.names = {id(p): n for n, p in model.named_parameters()}
    mine = _rank_share(_trajectories(), rank)

    class Module(CreditAssignmentModule):
        def training_step(self, batch, batch_idx):
            rollout = collate(mine, tok.pad_token_id)
            adv = _advantages(mine, rollout.loss_mask.shape[1]) * rollout.loss_mask
            for agg, micro, updates in SCENARIOS:
                self.loss_cfg = LossConfig(agg=agg, micro_batch_size=micro, updates_per_batch=updates,
                                           norm_constant=8.0 if agg.endswith("norm") else None)
                self.update(rollout, adv)

    module = Module(model, tok, None, None, [], LossConfig(), RolloutConfig(temperature=1.0),
                    EvalConfig(every=0), functools.partial(_RecordingSGD, lr=0.0), seed=3, grad_clip=0.0)
    trainer = L.Trainer(
        accelerator="cpu", devices=WORLD, strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
    )
    trainer.fit(module, DataLoader(list(range(1)), batch_size=None))
    torch.save(_RecordingSGD.record, os.path.join(out_dir, f"rank{rank}.pt"))


def _reference(model, trajs: list[Trajectory], agg: str, pad_id: int) -> dict[str, torch.Tensor]:
    """Plain autograd of the loss of ``trajs`` as one batch, in one process."""
    from creditlab.step.forward import response_logits

    model.zero_grad(set_to_none=True)
    cfg = LossConfig(agg=agg, norm_constant=8.0 if agg.endswith("norm") else None)
    batch = collate(trajs, pad_id)
    adv = _advantages(trajs, batch.loss_mask.shape[1]) * batch.loss_mask
    logits = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
    logprobs = gather_logprobs(logits, batch.response_ids, 1.0)
    stats = MiniBatchStats.from_mask(batch.loss_mask, cfg)
    loss, _ = policy_loss(logprobs, None, adv, batch.loss_mask, cfg, stats)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _mini_batches(updates: int, rl_step: int) -> list[list[Trajectory]]:
    """The global mini-batches of a DDP update: the union of each rank's k-th mini-batch (each
    rank permutes its own rows with its own seed, as ``CreditAssignmentModule.update``)."""
    from creditlab.step.module import step_seed

    trajs, out = _trajectories(), [[] for _ in range(updates)]
    for rank in range(WORLD):
        mine = _rank_share(trajs, rank)
        order = torch.randperm(len(mine), generator=torch.Generator().manual_seed(step_seed(3, rl_step, 3, rank)))
        for k, rows in enumerate(torch.tensor_split(order, updates)):
            out[k].extend(mine[int(i)] for i in rows)
    return out


@pytest.fixture(scope="module")
def ddp_records(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ddp")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a free port for the group
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    mp.spawn(_worker, args=(port, str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def test_two_process_gradients_equal_the_single_process_gradient(ddp_records):
    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    records = ddp_records[0]
    assert len(records) == sum(updates for *_, updates in SCENARIOS)
    for rank_record in ddp_records[1:]:  # DDP leaves the same averaged gradient on every rank
        for a, b in zip(records, rank_record):
            for name in a:
                torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    i = 0
    for agg, micro, updates in SCENARIOS:
        rl_step = i // updates  # the module counts RL steps as optimizer steps // updates
        minis = _mini_batches(updates, rl_step) if updates > 1 else [_trajectories()]
        for mini in minis:
            want = _reference(model, mini, agg, tok.pad_token_id)
            got = records[i]
            i += 1
            scale = max(float(g.abs().max()) for g in want.values())
            assert scale > 1e-4, "the scenario must have a real gradient"
            seq = max(len(t.completion.prompt_ids) + len(t.completion.response_ids) for t in mini)
            tokens = sum(len(t.completion.prompt_ids) + len(t.completion.response_ids) for t in mini)
            n = lm_length(model.config, seq, backward=True, tokens=tokens)
            for name, g in want.items():  # each against its own tensor's scale
                assert_close_fp(got[name], g, length=n, msg=f"{agg}, micro {micro}, updates {updates}: {name}")
