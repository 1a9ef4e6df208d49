"""FLOP and parameter accounting: the Nemotron 3 Super shape (about 120B parameters, 12B
active), the LatentMoE per-token formulas, and counts equal to the built models'."""

from __future__ import annotations

import pytest
from flax import nnx

from jaxlib_ext.models import LMConfig, build_lm, param_count
from jaxlib_ext.models.accounting import (
    NEMOTRON_3_SUPER,
    hybrid_cost,
    lm_cost,
    moe_cost,
)


def test_nemotron_3_super_is_120b_total_12b_active():
    acc = hybrid_cost(NEMOTRON_3_SUPER)
    assert 115e9 < acc.params < 125e9
    assert 11.5e9 < acc.active_params < 13.5e9
    assert acc.components["moe routed"].params > 0.9 * acc.params  # the experts hold the bulk
    assert "| total |" in acc.table()


def test_latent_moe_formulas_per_token():
    d, ell, m, ms, n, k = 64, 16, 24, 40, 12, 3
    parts = moe_cost(d, num_experts=n, top_k=k, expert_dim=m, latent_dim=ell,
                     shared_expert_dim=ms)
    assert parts["routed"].flops == k * 2 * (2 * ell * m)
    assert parts["latent"].flops == 2 * (2 * d * ell)
    assert parts["shared"].flops == 2 * (2 * d * ms)
    assert parts["router"].flops == 2 * d * n
    assert parts["routed"].params == n * 2 * ell * m
    assert parts["routed"].active_params == k * 2 * ell * m
    # without latent: experts in full width, no projections
    std = moe_cost(d, num_experts=n, top_k=k, expert_dim=m)
    assert set(std) == {"routed", "router"} and std["routed"].flops == k * 2 * (2 * d * m)
    with pytest.raises(ValueError, match="top_k"):
        moe_cost(d, num_experts=2, top_k=3, expert_dim=m)


SMALL = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=2, head_dim=8, max_seq_len=32,
             mlp_multiple_of=16, num_experts=4, top_k=2, expert_dim=16)


@pytest.mark.parametrize("ffn", ["swiglu", "moe", "latent_moe"])
@pytest.mark.parametrize("mixer", ["attention", "mdn", "gdn", "mlstm"])
def test_counts_equal_the_built_models(mixer, ffn):
    extra = {"latent_dim": 8, "shared_expert_dim": 24} if ffn == "latent_moe" else {}
    cfg = LMConfig.from_flat(mixer=mixer, ffn=ffn, **SMALL, **extra)
    model = nnx.eval_shape(lambda: build_lm(cfg, rngs=nnx.Rngs(0)))
    acc = lm_cost(cfg)
    assert acc.params == param_count(model)
    assert acc.active_params <= acc.params and acc.flops_per_token > acc.active_params
    with pytest.raises(TypeError, match="cfg"):
        lm_cost(model)
