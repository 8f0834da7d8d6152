"""The decoder's pass in one call (kvengine.native_pass, kvengine/native/layers.c) on the real model: what it computes
against the model's own forward, where it hands a pass back to the model, and what the library refuses."""
from __future__ import annotations

import ctypes

import pytest
import torch
from transformers.models.llama import modeling_llama

from kvengine import fused, native_pass
from kvengine.kvcache import CartridgeCache
from kvengine.native_pass import NativePass
from tests.support.cpu import AVX512F

pytestmark = pytest.mark.skipif(not AVX512F, reason="the fused kernels need AVX-512F (torch's kernels serve)")

MEMORIES = [f"Fact {i}: person {i} lives in city {i * 7} and likes the colour number {i % 5}." for i in range(24)]
QUESTION = "Where does person 3 live?"
STEPS = 6


@pytest.fixture(scope="module", params=["f32", "f32w8", "bf16w8"])
def backend(request, real_backend):
    return real_backend if request.param == "f32" else real_backend.variant(dtype=request.param)


def _state(backend):
    state = backend._payload(backend.compile(MEMORIES)).state
    state.ensure_capacity(state.num_tokens + 128)  # room for the longest question below and its steps
    return state


def _question(backend) -> list[int]:
    return backend.layout.encode(backend.layout.suffix_text(backend.layout.clean_question(QUESTION)))


def _greedy(forward, state, ids):
    """The question's pass and STEPS greedy steps over a fresh cache: per pass the logits, the tokens, and the cache."""
    cache = CartridgeCache(state)
    logits = [forward(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()]
    tokens = [int(logits[-1].argmax())]
    for _ in range(STEPS):
        logits.append(forward(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[0, -1].float())
        tokens.append(int(logits[-1].argmax()))
    return logits, tokens, cache


def _c_norm(self, hidden):
    """LlamaRMSNorm as layers.c computes it (the f32 squares summed in double)."""
    x = hidden.float()
    variance = ((x * x).double().sum(-1, keepdim=True) / x.shape[-1]).float()
    return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


def test_the_backend_serves_questions_and_steps_through_it(backend):
    step = backend._decode_step
    assert isinstance(step, NativePass) and backend._prompt_pass is step
    assert step.w_bits == (32 if backend.dtype == "f32" else 8)
    assert step.kv_dtype == backend.torch_dtype
    assert isinstance(backend._fresh_cache(8), CartridgeCache), "re-reading decodes through the same pass"
    assert step.max_tokens == 42  # 128 packed attention rows over SmolLM2's 3 query heads per KV head


def test_the_pass_answers_as_the_model_does(backend):
    state, ids = _state(backend), _question(backend)
    with torch.inference_mode():
        ours, our_tokens, our_cache = _greedy(backend._decode_step, state, ids)
        our_keys = [layer.kbuf[:, :, : layer.length].clone() for layer in our_cache.layers]
        our_values = [layer.vbuf[:, :, : layer.length].clone() for layer in our_cache.layers]
        our_lengths = {layer.length for layer in our_cache.layers}
        our_cache.crop_back()
        theirs, their_tokens, their_cache = _greedy(backend.model, state, ids)
    assert our_tokens == their_tokens
    assert our_lengths == {state.num_tokens + len(ids) + STEPS}
    # f32: float rounding (the norms' sums, SiLU's exp); int8: a bf16 rounding of an activation may tip the other way
    tolerance = 1e-3 if backend.dtype == "f32" else 1.0
    assert max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True)) < tolerance
    if backend.dtype == "f32":  # the control: the pass ran (it sums the norms in another order than torch)
        assert not all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    for layer, keys, values in zip(their_cache.layers, our_keys, our_values, strict=True):
        assert torch.equal(keys[:, :, : state.num_tokens], layer.kbuf[:, :, : state.num_tokens]), "the cartridge is never written"
        atol = 1e-3 if backend.dtype == "f32" else 0.5
        torch.testing.assert_close(keys, layer.kbuf[:, :, : layer.length], atol=atol, rtol=0.05)
        torch.testing.assert_close(values, layer.vbuf[:, :, : layer.length], atol=atol, rtol=0.05)


def test_a_layer_is_the_models_bit_for_bit_given_its_norm(backend, monkeypatch):
    """With the model's RMSNorm summing as layers.c does, the pass's first layers give the model's layers' outputs bit
    for bit: projections, rotary embedding, cache write, attention, residuals (only SiLU's exp is libm's here)."""
    if backend.dtype == "f32":
        pytest.skip("f32 activations carry SiLU's last-bit differences on; the int8 layers round them to bf16")
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _c_norm)
    state, ids, step = _state(backend), _question(backend), backend._decode_step
    caught = {}
    handles = [layer.register_forward_hook(lambda module, args, out, i=i: caught.__setitem__(i, out.detach().clone()))
               for i, layer in enumerate(backend.model.model.layers[:2])]
    try:
        with torch.inference_mode():
            cache = CartridgeCache(state)
            backend.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
            theirs_k = cache.layers[1].kbuf[:, :, state.num_tokens : cache.layers[1].length].clone()
            cache.crop_back()
    finally:
        for handle in handles:
            handle.remove()
    with torch.inference_mode():
        for num_layers in (1, 2):
            cache = CartridgeCache(state)
            h = _run_c(step, cache, ids, num_layers)
            assert torch.equal(h, caught[num_layers - 1][0]), f"the first {num_layers} layer(s)"
    assert torch.equal(cache.layers[1].kbuf[:, :, state.num_tokens : state.num_tokens + len(ids)], theirs_k)


def _run_c(step: NativePass, cache: CartridgeCache, ids: list[int], num_layers: int, **change) -> torch.Tensor | int:
    """layers.c's pass of ``ids`` through the first ``num_layers`` layers: the residual stream (or the return code)."""
    length, capacity = cache.layers[0].length, cache.layers[0].kbuf.shape[2]
    h = step.embed(torch.tensor([ids]))[0].float().contiguous()
    cos, sin = step.rotary(h[None], torch.arange(length, length + len(ids))[None])
    cos, sin = cos[0].contiguous(), sin[0].contiguous()
    args = dict(w_bits=step.w_bits, kv_bits=fused.KV_BITS[step.kv_dtype], heads=step.heads, kv_heads=step.kv_heads,
                capacity=capacity, length=length, m=len(ids), hidden=step.hidden)
    args.update(change)
    rc = fused.kernel().mnesio_layers_pass(step._table(cache), num_layers, args["w_bits"], args["kv_bits"], args["hidden"],
                                           args["heads"], args["kv_heads"], step.inter, step.eps, step.scale, args["capacity"],
                                           args["length"], args["m"], cos.data_ptr(), sin.data_ptr(), torch.get_num_threads(),
                                           h.data_ptr())
    return h if not change else rc


def test_a_longer_question_runs_in_two_parts(backend):
    """A question of 43 to 84 tokens: two parts through the one-call pass, each part through all the layers before the
    next; its logits are the two calls' bit for bit, its greedy tokens the model's."""
    state, step = _state(backend), backend._decode_step
    ids = (_question(backend) * 8)[: 2 * step.max_tokens - 1]
    with torch.inference_mode():
        ours, our_tokens, cache = _greedy(step, state, ids)
        assert {layer.length for layer in cache.layers} == {state.num_tokens + len(ids) + STEPS}
        cache.crop_back()
        cache = CartridgeCache(state)
        step(input_ids=torch.tensor([ids[: step.max_tokens]]), cache=cache, use_cache=True, logits_to_keep=1)
        parts = step(input_ids=torch.tensor([ids[step.max_tokens :]]), cache=cache, use_cache=True, logits_to_keep=1)
        cache.crop_back()
        theirs, their_tokens, _ = _greedy(backend.model, state, ids)
    assert torch.equal(ours[0], parts.logits[0, -1].float())
    assert our_tokens == their_tokens
    tolerance = 1e-3 if backend.dtype == "f32" else 1.0
    assert max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True)) < tolerance
    if backend.dtype == "f32":  # the control: the parts ran in the pass, not in the model's forward
        assert not torch.equal(ours[0], theirs[0])


@pytest.mark.parametrize(("tokens", "calls"), [(42, 1), (43, 2)])
def test_a_question_of_up_to_42_tokens_is_one_call(backend, tokens, calls, monkeypatch):
    """42 tokens (126 packed attention rows) go through every layer in one library call, so every weight and the
    cache are read once for the question; one more token and the pass takes two parts."""
    state, step, lib = _state(backend), backend._decode_step, fused.kernel()
    ids, seen = (_question(backend) * 8)[:tokens], []
    whole = lib.mnesio_layers_pass

    def counted(*args):
        rc = whole(*args)
        seen.append((args[12], rc))  # args[12]: the part's tokens (m)
        return rc

    monkeypatch.setattr(lib, "mnesio_layers_pass", counted)
    with torch.inference_mode():
        cache = CartridgeCache(state)
        step(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
        cache.crop_back()
    assert [rc for _, rc in seen] == [0] * calls and sum(m for m, _ in seen) == tokens  # taken, not handed to the model


@pytest.mark.parametrize("change", [
    {"m": 43},  # 129 packed attention rows: more than the attention kernel takes
    {"m": 0}, {"w_bits": 16}, {"kv_bits": 8}, {"kv_heads": 2}, {"heads": 0}, {"hidden": 100},
    {"length": -1}, {"capacity": 10},  # the pass's positions past the buffers
])
def test_the_library_refuses_what_it_does_not_take(real_backend, change):
    state, ids, step = _state(real_backend), _question(real_backend), real_backend._decode_step
    with torch.inference_mode():
        cache = CartridgeCache(state)
        before = [layer.kbuf.clone() for layer in cache.layers[:2]]
        assert _run_c(step, cache, (ids * 4)[:43] if change.get("m") == 43 else ids, 2, **change) == -1
        # the bytes: the room past the cartridge is torch.empty's, where a NaN is not equal to itself
        assert all(torch.equal(a.view(torch.uint8), layer.kbuf.view(torch.uint8))
                   for a, layer in zip(before, cache.layers, strict=False)), "nothing written"


def _models_own(backend, input_ids, cache, **kwargs):
    return backend.model(input_ids=input_ids, cache=cache, use_cache=True, **kwargs).logits


@pytest.mark.parametrize("case", ["long", "dynamic", "all_logits", "positions", "disabled"])
def test_what_it_does_not_take_goes_to_the_model(real_backend, case, monkeypatch):
    """A pass the library does not run is the model's own, bit for bit (the pass's own f32 logits are not)."""
    state, ids, step = _state(real_backend), _question(real_backend), real_backend._decode_step
    kwargs = {"logits_to_keep": 1}
    if case == "long":
        ids = (ids * 8)[: native_pass.CHUNKS * step.max_tokens + 1]
    elif case == "all_logits":
        kwargs = {}
    elif case == "positions":  # a tensor: the positions whose logits to keep (here the second), not the last
        kwargs = {"logits_to_keep": torch.tensor([1])}
    elif case == "disabled":
        monkeypatch.setattr(native_pass, "ENABLED", False)
    input_ids = torch.tensor([ids])
    with torch.inference_mode():
        if case == "dynamic":
            from transformers import DynamicCache

            ours = step(input_ids=input_ids, cache=DynamicCache(config=real_backend.model.config), use_cache=True, **kwargs).logits
            theirs = _models_own(real_backend, input_ids, DynamicCache(config=real_backend.model.config), **kwargs)
        else:
            cache = CartridgeCache(state)
            ours = step(input_ids=input_ids, cache=cache, use_cache=True, **kwargs).logits
            cache.crop_back()
            theirs = _models_own(real_backend, input_ids, CartridgeCache(state), **kwargs)
    assert torch.equal(ours, theirs)
    if case in ("long", "disabled"):  # the control: the pass itself, on what it takes, is not the model's bit for bit
        monkeypatch.setattr(native_pass, "ENABLED", True)
        with torch.inference_mode():
            short = torch.tensor([_question(real_backend)])
            cache = CartridgeCache(state)
            own = step(input_ids=short, cache=cache, use_cache=True, logits_to_keep=1).logits
            cache.crop_back()
            assert not torch.equal(own, _models_own(real_backend, short, CartridgeCache(state), logits_to_keep=1))


def test_models_it_does_not_take(real_backend):
    """bf16r's hooks and a bf16 model's weights: the model's own forward serves them."""
    assert native_pass.native_pass(real_backend.variant(dtype="bf16r").model) is None
    assert native_pass.native_pass(real_backend.variant(dtype="bf16").model) is None


def test_the_table_holds_the_caches_buffers(real_backend):
    state, step = _state(real_backend), real_backend._decode_step
    cache = CartridgeCache(state)
    table = step._table(cache)
    assert step._table(cache) is table, "built once per cache"
    assert [entry.k for entry in table] == [k.data_ptr() for k in state.keys]
    assert [entry.v for entry in table] == [v.data_ptr() for v in state.values]
    assert ctypes.sizeof(table) == len(state.keys) * ctypes.sizeof(native_pass._Layer)


def test_another_pass_over_the_same_cache_uses_its_own_weights(real_backend):
    """A cache first passed through f32 weights, then through f32w8's (both over f32 KV): the second pass's table holds
    its own weights, and its answer is the one it gives over a cache of its own."""
    f32, f32w8 = real_backend._decode_step, real_backend.variant(dtype="f32w8")._decode_step
    state, ids = _state(real_backend), _question(real_backend)
    with torch.inference_mode():
        shared = CartridgeCache(state)
        assert f32._table(shared)[0].w[0] == f32.model.model.layers[0].self_attn.q_proj.weight.data_ptr()
        assert f32w8._table(shared)[0].w[0] == f32w8.model.model.layers[0].self_attn.q_proj.weight.data_ptr()
        after_f32 = f32w8(input_ids=torch.tensor([ids]), cache=shared, use_cache=True, logits_to_keep=1).logits
        shared.crop_back()
        alone = f32w8(input_ids=torch.tensor([ids]), cache=CartridgeCache(state), use_cache=True, logits_to_keep=1).logits
    assert torch.equal(after_f32, alone)


def test_passes_on_several_threads_at_once_answer_as_alone(backend):
    """Three answers' passes at once, each over its own cartridge, on three threads (the kernels' pool busy, callers
    running their parts themselves): each thread's logits are the lone run's bit for bit."""
    import threading

    step, ids = backend._decode_step, _question(backend)
    states = [_state(backend) for _ in range(3)]
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)  # the pass splits its kernels' work in two parts (the suite runs one thread)
    try:
        with torch.inference_mode():
            alone, alone_tokens, cache = _greedy(step, states[0], ids)
            cache.crop_back()
    finally:
        torch.set_num_threads(threads_before)
    got, errors = {}, []

    def run(i):
        try:
            torch.set_num_threads(2)
            with torch.inference_mode():
                for _ in range(3):
                    logits, tokens, c = _greedy(step, states[i], ids)
                    c.crop_back()
                    got.setdefault(i, []).append((logits, tokens))
        except Exception as exc:  # noqa: BLE001 - reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.set_num_threads(threads_before)  # MKL's count is process-wide
    assert not errors
    assert sorted(got) == [0, 1, 2]
    for runs in got.values():
        for logits, tokens in runs:
            assert tokens == alone_tokens
            assert all(torch.equal(a, b) for a, b in zip(logits, alone, strict=True))


def test_a_hook_or_a_weight_changed_after_it_was_built_sends_passes_to_the_model(real_backend):
    """Hooks and weights are looked at again at every pass of several tokens: a hook added since is called (the model
    runs the pass and the steps after it), and a layer whose weight tensor was replaced is not run from the old one."""
    state, ids = _state(real_backend), _question(real_backend)
    step = NativePass(real_backend.model, w_bits=32, kv_dtype=torch.float32)
    calls = []
    with torch.inference_mode():
        own, _, cache = _greedy(step, state, ids)
        cache.crop_back()
        model_logits, _, cache = _greedy(real_backend.model, state, ids)
        cache.crop_back()
        handle = real_backend.model.model.layers[3].register_forward_hook(lambda *a: calls.append(1))
        try:
            hooked, _, cache = _greedy(step, state, ids)
            cache.crop_back()
        finally:
            handle.remove()
        assert len(calls) == 1 + STEPS, "the question's pass and every step after it"
        assert all(torch.equal(a, b) for a, b in zip(hooked, model_logits, strict=True))
        again, _, cache = _greedy(step, state, ids)  # the hook gone: the pass again
        cache.crop_back()
        assert all(torch.equal(a, b) for a, b in zip(again, own, strict=True))
        # by hand, not monkeypatch: pytest 9 undoes an attribute missing from the instance's __dict__ (nn.Module keeps
        # parameters in _parameters) by deleting it, which would take the weight off the session's model
        linear = real_backend.model.model.layers[0].mlp.down_proj
        original = linear.weight
        linear.weight = torch.nn.Parameter(original.detach().clone(), requires_grad=False)
        try:
            replaced, _, cache = _greedy(step, state, ids)
            cache.crop_back()
        finally:
            linear.weight = original
    assert linear.weight is original
    assert all(torch.equal(a, b) for a, b in zip(replaced, model_logits, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(own, model_logits, strict=True)), "the control: the pass is not the model"


def test_a_layer_too_small_for_the_row_kernels_is_not_taken():
    small, large = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(576, 576, bias=False)
    fused.row_linears(torch.nn.Sequential(small, large))
    assert fused.row_weight_bits(large) == 32
    assert fused.row_weight_bits(small) is None, "its rows go to torch's product: the pass would not be the model's"
