"""The CDT network: shapes, bounds, causality and padding (training/learn/model.py)."""

from __future__ import annotations

import pytest
import torch

from training.learn.model import (
    DETERMINISTIC_LOG_STD,
    ConstrainedDecisionTransformer,
    ModelConfig,
    ScalarEmbedding,
    dropout,
)

BATCH, SEQ_LEN, STATE_DIM, ACTION_DIM = 3, 5, 4, 2


def make_model(**overrides: object) -> ConstrainedDecisionTransformer:
    torch.manual_seed(0)
    values: dict[str, object] = {
        "state_dim": STATE_DIM,
        "action_dim": ACTION_DIM,
        "seq_len": SEQ_LEN,
        "max_episode_len": 50,
        "embedding_dim": 16,
        "num_layers": 2,
        "num_heads": 2,
        "dropout": 0.0,
    }
    values.update(overrides)
    return ConstrainedDecisionTransformer(ModelConfig(**values)).eval()  # type: ignore[arg-type]


def make_inputs(seed: int = 0, pads: tuple[int, ...] = (0, 2, 4)) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    padding = torch.arange(SEQ_LEN).unsqueeze(0) < torch.tensor(pads).unsqueeze(1)
    return {
        "states": torch.randn(BATCH, SEQ_LEN, STATE_DIM, generator=generator) * 3,
        "actions": torch.rand(BATCH, SEQ_LEN, ACTION_DIM, generator=generator) * 2 - 1,
        "returns_to_go": torch.randn(BATCH, SEQ_LEN, generator=generator) * 5,
        "costs_to_go": torch.rand(BATCH, SEQ_LEN, generator=generator) * 5,
        "time_steps": torch.randint(0, 50, (BATCH, SEQ_LEN), generator=generator),
        "padding_mask": padding,  # [batch, seq_len], True = padding
    }


def test_forward_shapes_and_bounds():
    model = make_model(cost_prediction=True)
    output = model(**make_inputs())
    assert output.action_mean.shape == (BATCH, SEQ_LEN, ACTION_DIM)
    assert output.action_log_std.shape == (BATCH, SEQ_LEN, ACTION_DIM)
    assert output.cost_logits is not None and output.cost_logits.shape == (BATCH, SEQ_LEN)
    assert output.action_mean.abs().max() <= 1.0
    assert output.action_log_std.min() >= -5.0 and output.action_log_std.max() <= 2.0
    assert torch.isfinite(output.action_mean).all()


def test_prediction_at_t_ignores_the_action_at_t_and_the_future():
    model = make_model()
    inputs = make_inputs(pads=(0, 0, 0))
    base = model(**inputs).action_mean
    changed = {key: value.clone() for key, value in inputs.items()}
    changed["actions"][:, 2] += 0.5  # a_2, then everything after step 2
    changed["states"][:, 3:] += 1.0
    out = model(**changed).action_mean
    torch.testing.assert_close(out[:, :3], base[:, :3])  # steps 0..2 unaffected
    assert not torch.allclose(out[:, 3], base[:, 3])  # step 3 sees a_2


def test_padding_contents_do_not_leak_into_real_positions():
    model = make_model()
    inputs = make_inputs()
    base = model(**inputs).action_mean
    noisy = {key: value.clone() for key, value in inputs.items()}
    pad = inputs["padding_mask"]
    noisy["states"][pad] = 1e3
    noisy["returns_to_go"][pad] = -1e3
    noisy["time_steps"][pad] = 49
    out = model(**noisy).action_mean
    torch.testing.assert_close(out[~pad], base[~pad])


def test_left_padded_window_equals_the_short_window():
    model = make_model()
    inputs = make_inputs(pads=(3, 3, 3))
    padded = model(**inputs).action_mean[:, 3:]
    short = {key: value[:, 3:] for key, value in inputs.items()}
    unpadded = model(**short).action_mean
    torch.testing.assert_close(padded, unpadded, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cost_prediction", [False, True])
def test_newest_only_matches_the_full_forward(cost_prediction: bool):
    model = make_model(cost_prediction=cost_prediction)
    inputs = make_inputs()
    full = model(**inputs)
    newest = model(**inputs, newest_only=True)
    torch.testing.assert_close(newest.action_mean[:, 0], full.action_mean[:, -1])
    torch.testing.assert_close(newest.action_log_std[:, 0], full.action_log_std[:, -1])


@pytest.mark.parametrize("seq_len", [1, SEQ_LEN])
@pytest.mark.parametrize("cost_prediction", [False, True])
@pytest.mark.parametrize("newest_only", [False, True])
def test_computing_only_read_tokens_changes_no_output_or_gradient(
    seq_len: int, cost_prediction: bool, newest_only: bool
):
    inputs = {key: value[:, -seq_len:] for key, value in make_inputs().items()}  # left-padded
    outputs, gradients = [], []
    for skip in (False, True):
        settings = {"seq_len": seq_len, "cost_prediction": cost_prediction}
        model = make_model(**settings, skip_unread_outputs=skip)
        output = model(**inputs, newest_only=newest_only)
        loss = output.action_mean.sum() + output.action_log_std.sum()
        if output.cost_logits is not None:
            loss = loss + output.cost_logits.sum()
        loss.backward()
        outputs.append(output)
        gradients.append([p.grad.clone() for p in model.blocks[0].parameters()])
    full, read_only = outputs
    torch.testing.assert_close(read_only.action_mean, full.action_mean, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(read_only.action_log_std, full.action_log_std, atol=1e-6, rtol=1e-5)
    if full.cost_logits is not None:
        torch.testing.assert_close(read_only.cost_logits, full.cost_logits, atol=1e-6, rtol=1e-5)
    for full_grad, read_grad in zip(*gradients, strict=True):
        torch.testing.assert_close(read_grad, full_grad, atol=1e-6, rtol=1e-4)


def test_fused_and_written_out_attention_agree():
    inputs = make_inputs()
    fused = make_model(fused_attention=True)(**inputs)
    manual = make_model(fused_attention=False)(**inputs)
    torch.testing.assert_close(fused.action_mean, manual.action_mean, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cost_prediction", [False, True])  # 3 keys, or 4 with the cost head
def test_short_attention_agrees_with_the_kernel_at_context_one(cost_prediction: bool):
    inputs = {name: value[:, -1:] for name, value in make_inputs(pads=(0, 0, 0)).items()}
    results = []
    for short in (True, False):
        model = make_model(seq_len=1, short_attention=short, cost_prediction=cost_prediction)
        output = model.train()(**inputs)
        loss = output.action_mean.sum() + output.action_log_std.sum()
        if output.cost_logits is not None:
            loss = loss + output.cost_logits.sum()
        loss.backward()
        newest = model.eval()(**inputs, newest_only=True).action_mean
        results.append((output, newest, [p.grad.clone() for p in model.parameters()]))
    (short_out, short_newest, short_grads), (kernel_out, kernel_newest, kernel_grads) = results
    torch.testing.assert_close(short_out.action_mean, kernel_out.action_mean)
    torch.testing.assert_close(short_out.action_log_std, kernel_out.action_log_std)
    torch.testing.assert_close(short_newest, kernel_newest)
    for short_grad, kernel_grad in zip(short_grads, kernel_grads, strict=True):
        torch.testing.assert_close(short_grad, kernel_grad, atol=1e-6, rtol=1e-4)


def test_short_attention_under_bf16_autocast_stays_near_fp32():
    inputs = {name: value[:, -1:] for name, value in make_inputs(pads=(0, 0, 0)).items()}
    model = make_model(seq_len=1)
    exact = model(**inputs).action_mean
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = model(**inputs).action_mean
    torch.testing.assert_close(rounded.float(), exact, atol=3e-2, rtol=0)


def test_cost_transform_is_applied_to_costs_to_go():
    inputs = make_inputs()
    transformed = make_model(cost_to_go_offset=50.0)(**inputs).action_mean
    flipped = {**inputs, "costs_to_go": 50.0 - inputs["costs_to_go"]}
    plain = make_model()(**flipped).action_mean
    torch.testing.assert_close(transformed, plain)


def test_unconstrained_dt_ignores_the_cost_budget():
    inputs = make_inputs()
    other_budget = {**inputs, "costs_to_go": inputs["costs_to_go"] + 3.0}
    blind = make_model(cost_conditioned=False)
    torch.testing.assert_close(blind(**inputs).action_mean, blind(**other_budget).action_mean)
    seeing = make_model()
    assert not torch.allclose(seeing(**inputs).action_mean, seeing(**other_budget).action_mean)


def test_deterministic_head_reports_a_constant_log_std():
    output = make_model(stochastic=False)(**make_inputs())
    assert torch.all(output.action_log_std == DETERMINISTIC_LOG_STD)
    assert output.action_mean.abs().max() <= 1.0


def test_dropout_is_active_in_training_only():
    model = make_model(dropout=0.5)
    inputs = make_inputs()
    torch.testing.assert_close(model(**inputs).action_mean, model(**inputs).action_mean)
    model.train()
    assert not torch.allclose(model(**inputs).action_mean, model(**inputs).action_mean)


def test_backward_is_finite_with_padding():
    model = make_model(cost_prediction=True).train()
    output = model(**make_inputs())
    assert output.cost_logits is not None
    (output.action_mean.sum() + output.cost_logits.sum()).backward()
    for parameter in model.parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all()


def test_fast_dropout_drops_the_requested_fraction_and_keeps_the_mean():
    torch.manual_seed(0)
    x = torch.ones(400, 500, requires_grad=True)
    out = dropout(x, 0.1, fast=True)
    assert out.shape == x.shape
    assert float((out == 0).float().mean()) == pytest.approx(0.1, abs=0.003)
    assert float(out.detach().mean()) == pytest.approx(1.0, abs=0.005)
    assert torch.unique(out.detach()).tolist() == [0.0, pytest.approx(1 / 0.9)]
    out.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, out.detach())  # gradient flows through kept units only


@pytest.mark.parametrize("fast", [False, True])
def test_dropout_paths_share_eval_outputs(fast: bool):
    inputs = make_inputs()
    model = make_model(dropout=0.1, fast_dropout=fast, fused_attention=True)
    reference = make_model(dropout=0.0)
    torch.testing.assert_close(model(**inputs).action_mean, reference(**inputs).action_mean)


def test_layer_normalised_linear_return_token_keeps_only_its_sign():
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    linear, basis = ScalarEmbedding(16, 0, (0.0, 100.0)), ScalarEmbedding(16, 8, (0.0, 100.0))
    for embedding in (linear, basis):
        embedding.apply(ConstrainedDecisionTransformer._init_weights)  # the model's own init
    values = torch.tensor([[20.0, 90.0]])  # cost-to-go as the earlier recipes fed it (scale 1)
    plain = norm(linear(values))
    assert (plain[0, 0] - plain[0, 1]).abs().max() < 1e-3  # LayerNorm(x * w) does not see x
    coded = norm(basis(values))
    assert (coded[0, 0] - coded[0, 1]).abs().max() > 0.1


def test_scalar_embedding_loads_checkpoints_of_the_bare_linear():
    old = torch.nn.Linear(1, 16)
    embedding = ScalarEmbedding(16, 4, (0.0, 2.0))
    embedding.load_state_dict({**old.state_dict(), "basis.weight": torch.zeros(16, 4)})
    torch.testing.assert_close(embedding.linear.weight, old.weight)


def test_return_basis_model_exports_the_same_shapes():
    model = make_model(return_basis=6, reward_token_range=(0.0, 1.2), cost_token_range=(0.0, 1.5))
    output = model(**make_inputs())
    assert output.action_mean.shape == (BATCH, SEQ_LEN, ACTION_DIM)
