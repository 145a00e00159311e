"""Activation recomputation: ``model.gradient_checkpointing`` and ``model.recompute_num_layers``
(Megatron-LM's block method: the first N decoder layers recompute, the rest keep activations)."""

from __future__ import annotations

import pytest
import torch

from reinforge.config import ConfigError, load_config
from reinforge.models.loading import set_gradient_checkpointing


def tiny_model(num_layers: int = 3):
    from transformers import AutoConfig

    from reinforge.models.transformer import CausalLM

    cfg = AutoConfig.for_model(
        "llama",
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = CausalLM(cfg)
    model.init_weights()
    model.init_rope()
    return model.train()


def grads_and_layer_calls(model, ids):
    """Parameter gradients of a sum-of-logits loss, and how often each decoder layer's forward ran
    (forward + recomputation in backward; pre-hooks: a recomputation stops early, after its last
    saved tensor)."""
    calls = [0] * len(model.model.layers)
    hooks = [
        layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, layer in enumerate(model.model.layers)
    ]
    model.zero_grad(set_to_none=True)
    model(ids).float().logsumexp(-1).sum().backward()
    for h in hooks:
        h.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, calls


@pytest.mark.parametrize(
    "recompute, expected_calls",
    [((False, None), [1, 1, 1]), ((True, None), [2, 2, 2]), ((True, 1), [2, 1, 1]), ((True, 0), [1, 1, 1])],
)
def test_recompute_num_layers_recomputes_the_first_layers_with_equal_gradients(recompute, expected_calls):
    model = tiny_model()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    reference, _ = grads_and_layer_calls(model, ids)
    set_gradient_checkpointing(model, *recompute)
    grads, calls = grads_and_layer_calls(model, ids)
    assert calls == expected_calls
    for name, g in reference.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_recompute_num_layers_needs_gradient_checkpointing():
    with pytest.raises(ConfigError, match="model.recompute_num_layers=2 applies with model.gradient_checkpointing"):
        load_config(None, ["model.recompute_num_layers=2"])
    assert (
        load_config(
            None, ["model.recompute_num_layers=2", "model.gradient_checkpointing=true"]
        ).model.recompute_num_layers
        == 2
    )
    with pytest.raises(ValueError, match="needs model.gradient_checkpointing=true"):
        set_gradient_checkpointing(tiny_model(), False, 2)


def test_recompute_num_layers_is_refused_for_a_transformers_model():
    model = torch.nn.Linear(2, 2)  # not reinforge's CausalLM
    with pytest.raises(ValueError, match="reinforge's own model code"):
        set_gradient_checkpointing(model, True, 1)
