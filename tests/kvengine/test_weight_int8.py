"""Weight-only int8 ("f32w8" over f32 KV, "bf16w8" over bf16 KV; kvengine.precision.weight_int8): the layers, the
configuration, and parity on the real model."""
from __future__ import annotations

import pytest
import torch

from kvengine import DTYPES, KvConfig
from kvengine.config import WEIGHT_PRECISIONS
from kvengine.precision import TORCH_DTYPES, Int8WeightLinear, cast_model, load_dtype, weight_int8

MEMORIES = [
    "Alice lives in Lisbon and works as a baker.",
    "Bob keeps the spare key under the blue flower pot.",
    "The team meeting moved to Thursday at 3 pm in room 4B.",
    "Carol's cat is called Pixel and she is allergic to peanuts.",
]
QUESTIONS = ["Where does Alice live?", "Where is the spare key?", "When is the team meeting?", "What is Carol allergic to?"]


@pytest.fixture(scope="module", params=["f32w8", "bf16w8"])
def f32w8(request, real_backend):
    """The real model's int8-weight variants (int8 weights on bf16 activations, f32 or bf16 KV), each made once."""
    return real_backend.variant(dtype=request.param)


def _tiny_llama(num_layers: int = 2):
    """A float32 Llama of random weights (seeded) with kvengine's attention and a head tied to the embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvengine.attention import ATTN_IMPLEMENTATION

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    config._attn_implementation = ATTN_IMPLEMENTATION
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16])
def test_an_int8_linear_computes_with_its_codes_times_scales(act_dtype):
    linear = torch.nn.Linear(96, 40, bias=True)
    layer = Int8WeightLinear(linear, act_dtype=act_dtype)
    assert layer.weight.dtype == torch.int8 and layer.weight.shape == (40, 96)
    assert layer.weight.abs().amax() <= 127 and layer.weight.abs().amax(dim=1).min() >= 126  # each row uses its range
    # every scale is a bf16 value, so both activation dtypes compute with the same weights
    assert torch.equal(layer.scales.float().to(torch.bfloat16).float(), layer.scales.float())
    weights = layer.dequantized()
    assert (weights - linear.weight).abs().max() <= layer.scales.float().max() * 0.5 + 1e-6  # rounding to the nearest code
    x = torch.randn(3, 5, 96, generator=torch.Generator().manual_seed(2))
    expected = torch.nn.functional.linear(x, weights, linear.bias)
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (3, 5, 40)
    tolerance = 1e-4 if act_dtype == torch.float32 else 2e-2 * expected.abs().max().item()  # bf16 inputs and output
    assert (y - expected).abs().max().item() <= tolerance
    assert (torch.nn.functional.linear(x, linear.weight.detach(), linear.bias) - y).abs().max() > 0  # not the f32 layer


def test_an_int8_linear_can_return_the_kv_dtype_with_its_kernels_own_rounding():
    """bf16w8's value projection returns bf16: the same bits as the float32 output, rounded once (the kernel's own)."""
    linear = torch.nn.Linear(64, 48, bias=False)
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(4))
    f32_out, bf16_out = Int8WeightLinear(linear), Int8WeightLinear(linear, out_dtype=torch.bfloat16)
    y = bf16_out(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 7, 48)
    assert torch.equal(y.float(), f32_out(x))  # bf16 activations: the kernel's output is bf16 already, f32 only casts it
    biased = torch.nn.Linear(64, 48, bias=True)  # with a bias: the f32 sum, rounded once
    assert torch.equal(Int8WeightLinear(biased, out_dtype=torch.bfloat16)(x), Int8WeightLinear(biased)(x).to(torch.bfloat16))


def test_a_row_gives_the_same_bits_alone_or_among_others():
    """A question decoded alone or in a batch, a prefix read in one pass or by blocks: each row's result is its own."""
    layer = Int8WeightLinear(torch.nn.Linear(64, 48, bias=False))
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3))
    together = layer(x)
    assert all(torch.equal(layer(x[i : i + 1]), together[i : i + 1]) for i in range(9))


def test_weight_int8_replaces_every_linear_layer_and_keeps_the_embedding_f32():
    model = _tiny_llama()
    embedding = model.get_input_embeddings().weight.detach().clone()
    weight_int8(model, head=True)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    int8 = [m for m in model.modules() if isinstance(m, Int8WeightLinear)]
    assert linears == [] and len(int8) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert model.get_output_embeddings() is int8[-1]
    assert torch.equal(model.get_input_embeddings().weight, embedding) and embedding.dtype == torch.float32
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_weight_int8_can_leave_the_head_f32_and_refuses_a_model_not_in_f32():
    model = weight_int8(_tiny_llama(), head=False)
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    with pytest.raises(ValueError, match="float32 model"):
        weight_int8(_tiny_llama().to(torch.bfloat16))


def test_bf16w8_serves_a_bf16_copy_of_the_tied_head_with_f32_logits():
    model = cast_model(_tiny_llama(), "bf16w8")
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    assert isinstance(head, torch.nn.Linear) and head.weight.dtype == torch.bfloat16 and embedding.weight.dtype == torch.float32
    assert torch.equal(head.weight, embedding.weight.to(torch.bfloat16))  # the table rounded once, untied from the lookups
    x = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        logits = head(x)
    assert logits.dtype == torch.float32
    exact = x.to(torch.bfloat16).double() @ head.weight.double().T  # the products of the rounded inputs, summed exactly
    assert (logits.double() - exact).abs().max().item() < 1e-5 < (logits.double() - x.double() @ embedding.weight.double().T).abs().max().item()


def test_bf16w8s_head_copy_is_made_on_the_models_device():
    model = cast_model(_tiny_llama().to("meta"), "bf16w8")  # "meta": no data, but every tensor's device is checked
    head = model.get_output_embeddings()
    assert head.weight.device.type == "meta" and head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype, kv_dtype", [("f32w8", torch.float32), ("bf16w8", torch.bfloat16)])
def test_an_int8_dtype_loads_in_f32_and_is_its_own_configuration(dtype, kv_dtype):
    assert dtype in DTYPES and load_dtype(dtype) == torch.float32 and TORCH_DTYPES[dtype] == kv_dtype
    model = cast_model(_tiny_llama(), dtype).model
    layer = model.layers[0]
    assert isinstance(layer.mlp.up_proj, Int8WeightLinear) and layer.mlp.up_proj.out_dtype == torch.float32
    assert layer.self_attn.v_proj.out_dtype == kv_dtype  # the values come out in the KV's dtype
    assert {layer.self_attn.k_proj.out_dtype, layer.self_attn.q_proj.out_dtype} == {torch.float32}  # rotated in f32
    config = KvConfig(backend="transformers", model="smollm2-135m-instruct", dtype=dtype, quant="q8")
    assert config.key == f"transformers:smollm2-135m-instruct:{dtype}:q8" and KvConfig.from_key(config.key) == config
    assert config.weights == "int8"
    assert {d: KvConfig("fake", "m", d, "none").weights for d in DTYPES} == WEIGHT_PRECISIONS
    assert WEIGHT_PRECISIONS["f32"] == "f32" and WEIGHT_PRECISIONS["bf16r"] == "bf16"


@pytest.mark.model
def test_an_int8_cartridge_is_its_own_configuration_and_deterministic(real_backend, f32w8):
    """An int8 cartridge is never served by f32 weights nor the reverse, and compiles to the same bytes every time."""
    from kvengine import IncompatibleCartridgeError

    dtype = f32w8.dtype
    assert f32w8.describe().config.weights == "int8" and f32w8.describe().compat_key()["dtype"] == dtype
    assert any(isinstance(m, Int8WeightLinear) for m in f32w8.model.modules())
    assert not any(isinstance(m, Int8WeightLinear) for m in real_backend.model.modules())  # the f32 weights are untouched
    cartridge = f32w8.compile(MEMORIES)
    assert cartridge.header.dtype == dtype
    data = f32w8.dumps(cartridge)
    assert f32w8.dumps(f32w8.loads(data)) == data and f32w8.dumps(f32w8.compile(MEMORIES)) == data
    with pytest.raises(IncompatibleCartridgeError):
        real_backend.loads(data)
    with pytest.raises(IncompatibleCartridgeError):
        f32w8.loads(real_backend.dumps(real_backend.compile(MEMORIES)))
    other = real_backend.variant(dtype="bf16r" if dtype == "bf16w8" else "bf16w8")  # the same KV dtype or the same weights
    with pytest.raises(IncompatibleCartridgeError):
        other.loads(data)


@pytest.mark.model
def test_a_bf16w8_cartridge_holds_bf16_kv_in_half_the_bytes(real_backend):
    """bf16w8 serves the int8 layers over bf16 KV: its state is bf16 and its cartridge about half of f32w8's."""
    f32_kv, bf16_kv = real_backend.variant(dtype="f32w8"), real_backend.variant(dtype="bf16w8")
    data = bf16_kv.dumps(bf16_kv.compile(MEMORIES))
    state = bf16_kv._payload(bf16_kv.loads(data)).state
    assert {k.dtype for k in state.keys + state.values} == {torch.bfloat16}
    assert 0.45 < len(data) / len(f32_kv.dumps(f32_kv.compile(MEMORIES))) < 0.55


@pytest.mark.model
def test_an_int8_cartridge_and_re_reading_agree_token_for_token_on_f32_activations(real_backend, monkeypatch):
    """Inside one configuration, with f32 activations: the cartridge and re-reading answer token for token alike."""
    import kvengine.precision as precision

    monkeypatch.setattr(precision, "INT8_ACT_DTYPE", torch.float32)  # exact but slow (~65 ms a token to prefill here)
    memories = MEMORIES[1:2]  # one memory and one short answer
    int8 = real_backend.variant(dtype="f32w8")
    loaded = int8.loads(int8.dumps(int8.compile(memories)))
    from_text = int8.answer_from_text(memories, QUESTIONS[1], max_new_tokens=8)
    assert int8.answer(loaded, QUESTIONS[1], max_new_tokens=8).token_ids == from_text.token_ids


@pytest.mark.model
def test_an_f32w8_cartridge_and_re_reading_agree_on_the_first_token(f32w8):
    """With bf16 activations (the int8 kernel's) the first token agrees (the gate's fidelity check) and whole answers may
    part after it: the bf16 rounding of the matmuls' inputs and outputs magnifies the last-bit differences between the
    prefix's and the re-reading's attention (one of these four parted at its third token with the head quantized too)."""
    loaded = f32w8.loads(f32w8.dumps(f32w8.compile(MEMORIES)))
    identical = 0
    for question in QUESTIONS:
        from_cartridge = f32w8.answer(loaded, question, max_new_tokens=12)
        from_text = f32w8.answer_from_text(MEMORIES, question, max_new_tokens=12)
        assert from_cartridge.token_ids and from_cartridge.token_ids[0] == from_text.token_ids[0], question
        identical += from_cartridge.token_ids == from_text.token_ids
    assert identical >= len(QUESTIONS) - 1


@pytest.mark.model
def test_f32w8_computes_close_to_f32_but_not_as_f32(real_backend, f32w8):
    """Another arithmetic than f32's, close to it (the gate's divergence check judges how close on real scopes)."""
    from kvengine.divergence import kl_divergence

    reference = real_backend.compile(MEMORIES)
    ids = real_backend.answer(reference, QUESTIONS[0], max_new_tokens=8).token_ids
    kl = kl_divergence(real_backend.answer_logprobs(reference, QUESTIONS[0], ids), f32w8.answer_logprobs(f32w8.compile(MEMORIES), QUESTIONS[0], ids))
    assert 0 < kl.mean().item() < 0.05
