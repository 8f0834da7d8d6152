"""Moving post-RoPE keys by a position delta gives the keys computed at the new positions, layer by layer (f32).

Tolerances: the moved key and the key computed at the shifted position differ only by float32 rounding of the
rotation angles (position * frequency, up to 1e-3 rad of ulp at position ~8k, ~3e-5 below 512) and of the
attention sums over the shifted positions (RoPE attention depends only on position differences). At the
positions used here that is below 2e-4 of the keys' largest magnitude per layer. Measured on the real model,
largest error over all layers relative to the largest key: 1e-6 at a delta of 40, 1.8e-5 at 900, 1.7e-4 at 7000
(the angle's ulp, the same at every layer).
"""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvengine.errors import ConfigError
from kvengine.routed import assemble, compile_chunk, reread_token_ids, rerotate, rotary_of, shared_prefix

RELATIVE_TOLERANCE = 2e-4  # of the largest |key| in the layer (module docstring)
MEMORIES = [
    "[8 May, 2023] Dana: I joined the chess club at the library yesterday and it was so much fun.",
    "[9 June, 2023] Bob: My dog Rex is three years old and loves the beach in Lisbon.",
    "[1 July, 2023] Alice: I moved to Porto for a new job as a baker.",
]


def _keys(model, ids: list[int], first_position: int) -> list[torch.Tensor]:
    """Every layer's post-RoPE keys [H, T, D] of one prefill of ``ids`` at positions ``first_position`` on."""
    cache = DynamicCache(config=model.config)
    positions = torch.arange(first_position, first_position + len(ids))[None]  # (1, T)
    with torch.inference_mode():
        model.base_model(input_ids=torch.tensor([ids]), position_ids=positions, cache=cache, use_cache=True)
    return [layer.keys[0].float() for layer in cache.layers]


def _assert_close_per_layer(moved: list[torch.Tensor], computed: list[torch.Tensor]) -> None:
    assert len(moved) == len(computed)
    for layer, (a, b) in enumerate(zip(moved, computed, strict=True)):
        error = float((a - b).abs().max())
        assert error <= RELATIVE_TOLERANCE * float(b.abs().max()), f"layer {layer}: max |moved - computed| {error}"


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10000.0, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("delta", [1, 37, 300, 1500])
def test_it_moves_keys_of_a_tiny_llama_to_where_a_shifted_prefill_computes_them(tiny_llama, delta):
    ids = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(delta)).tolist()
    at_zero = _keys(tiny_llama, ids, 0)
    moved = [rerotate(k, delta, rotary_of(tiny_llama)) for k in at_zero]
    _assert_close_per_layer(moved, _keys(tiny_llama, ids, delta))
    assert float((moved[0] - at_zero[0]).abs().max()) > 1e-2  # the move did rotate them


def test_it_moves_keys_back_with_a_negative_delta(tiny_llama):
    ids = list(range(3, 33))
    moved = [rerotate(k, -200, rotary_of(tiny_llama)) for k in _keys(tiny_llama, ids, 250)]
    _assert_close_per_layer(moved, _keys(tiny_llama, ids, 50))


def test_it_keeps_the_keys_dtype_and_computes_the_rotation_in_f32(tiny_llama):
    keys = _keys(tiny_llama, list(range(10)), 0)[1]
    moved = rerotate(keys.to(torch.bfloat16), 100, rotary_of(tiny_llama))
    assert moved.dtype == torch.bfloat16
    exact = rerotate(keys, 100, rotary_of(tiny_llama))
    assert float((moved.float() - exact).abs().max()) <= 2 ** -7 * float(exact.abs().max())  # one bf16 rounding


def test_it_refuses_a_rope_whose_frequencies_depend_on_the_length():
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=256,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ConfigError, match="dynamic"):
        rotary_of(LlamaForCausalLM(config))


@pytest.mark.parametrize("delta", [40, 900])
def test_it_moves_a_real_chunk_to_where_a_shifted_prefill_of_the_real_model_computes_it(real_backend, delta):
    chunk = compile_chunk(real_backend, MEMORIES[1])
    prefix = shared_prefix(real_backend)
    ids = list(prefix.token_ids) + list(chunk.token_ids)
    shifted = [k[:, prefix.num_tokens :] for k in _keys(real_backend.model, ids, delta)]  # the chunk at |P| + delta on
    moved = [rerotate(k, delta, rotary_of(real_backend.model)) for k in chunk.keys]
    _assert_close_per_layer(moved, shifted)


def test_it_assembles_real_chunks_whose_first_layer_keys_are_the_rereadings(real_backend):
    # layer 0's keys depend only on the token and its position: after the move, every position of the assembly must
    # hold exactly what re-reading the same ids computes there (deeper layers differ: chunks did not see each other)
    chunks = [compile_chunk(real_backend, text) for text in MEMORIES]
    assembly = assemble(shared_prefix(real_backend), chunks, rotary_of(real_backend.model), room=0)
    ids, _ = reread_token_ids(real_backend, chunks, "Who moved to Porto?")
    assert list(assembly.token_ids) == ids[: len(assembly.token_ids)]
    reread = _keys(real_backend.model, list(assembly.token_ids), 0)
    held = assembly.state.prefix(0)[0][0].float()  # (H, T, D)
    error = float((held - reread[0]).abs().max())
    assert error <= RELATIVE_TOLERANCE * float(reread[0].abs().max())
    begin, end = assembly.spans[1]
    assert float((held[:, begin:end] - chunks[1].keys[0].float()).abs().max()) > 1e-2  # the second chunk was moved
