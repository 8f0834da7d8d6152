"""A question's few tokens, or one decoding step, through the whole decoder in one library call (kvengine/native/layers.c).

``native_pass(model)`` wraps a Llama-style model whose linear layers run on kvengine.fused's few-row kernels (f32
weights over f32 KV, or f32w8's and bf16w8's int8 codes): called as the model is (``input_ids``, ``cache``,
``use_cache``, ``logits_to_keep``), a pass of at most ``max_tokens`` tokens of one sequence over a CartridgeCache runs
every decoder layer in C, with no Python between the layers' ops (a question of up to twice that in two parts); the
embedding, the rotary table, the final norm and the LM head stay the model's own modules. Any other call goes to the
model unchanged. None for a model it does not take (bf16, bf16r, f16, another architecture, hooks, biases, a GPU, no
kernels).

The products and the attention are the kernels the model's forward calls for up to 32 rows, so they are its results
bit for bit given the same inputs (33-42 rows the model sends to torch's matmul: int8 the same bits, f32 each row's
one-row bits); the RMSNorms' sums and SiLU's exp are C's, not torch's vectorized ones, so logits agree with the
model's to float rounding, not bit for bit. Cartridges and re-reading both decode through it
(TransformersKvBackend). Design and figures: docs/design/attention.md, "The decoder's pass in one call".
"""
from __future__ import annotations

import ctypes

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from . import fused
from .kvcache import BufferLayer, CartridgeCache

# the projections in layers.c's order (its enum), as attribute paths of a LlamaDecoderLayer
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
ENABLED = True  # bench/question_pass_ab.py's other arm turns it off: every pass through the model's own forward
CHUNKS = 2  # a question of up to this many times max_tokens runs in as many parts; a longer prompt (a re-read memory
# text) is the model's own prefill, its products over all its rows at once


class _Layer(ctypes.Structure):
    """layers.c's struct mnesio_layer."""

    _fields_ = [("norm_in", ctypes.c_void_p), ("norm_post", ctypes.c_void_p), ("w", ctypes.c_void_p * len(PROJECTIONS)),
                ("scales", ctypes.c_void_p * len(PROJECTIONS)), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p)]


def _module(layer: torch.nn.Module, path: str) -> torch.nn.Module:
    for name in path.split("."):
        layer = getattr(layer, name)
    return layer


def _hooked(model: torch.nn.Module) -> bool:
    """Whether a forward hook sits on any of the model's modules (the pass would not call it)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def _held(module: torch.nn.Module, name: str) -> tuple[dict, str, torch.Tensor]:
    """The dict that holds a module's parameter or buffer ``name``, the name, and the tensor: what _same_operands
    compares without nn.Module's attribute lookup."""
    holder = module._parameters if name in module._parameters else module._buffers
    return holder, name, holder[name]


def _global_hooks() -> bool:
    return bool(torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)


def native_pass(model: torch.nn.Module) -> NativePass | None:
    """The model's one-call pass (module docstring), or None where it does not take the model."""
    config = model.config.get_text_config()
    base = getattr(model, "model", None)
    if (getattr(config, "model_type", None) != "llama" or getattr(config, "hidden_act", None) != "silu" or base is None
            or any(p.device.type != "cpu" for p in model.parameters())
            or getattr(config, "attention_bias", True) or getattr(config, "mlp_bias", True) or fused.kernel() is None
            or _hooked(model)):
        return None
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if (getattr(config, "head_dim", None) or config.hidden_size // heads) != fused.HEAD_DIM or heads % kv_heads:
        return None
    layers = list(base.layers)
    bits = {fused.row_weight_bits(_module(layer, path)) for layer in layers for path in PROJECTIONS}
    if len(bits) != 1 or None in bits:
        return None
    w_bits = bits.pop()
    kv_dtype = layers[0].self_attn.v_proj.out_dtype if w_bits == 8 else torch.float32  # the value projection's: the KV's
    if w_bits == 8 and any(layer.self_attn.v_proj.out_dtype != kv_dtype for layer in layers):
        return None
    return NativePass(model, w_bits=w_bits, kv_dtype=kv_dtype)


class NativePass:
    """A model's passes of a few tokens in one call (module docstring); built by native_pass()."""

    def __init__(self, model: torch.nn.Module, *, w_bits: int, kv_dtype: torch.dtype):
        config = model.config.get_text_config()
        base = model.model
        self.model, self.w_bits, self.kv_dtype = model, w_bits, kv_dtype
        # hooks added or weights replaced since: checked at every pass of several tokens (each answer's first), not
        # at every decoding step; then every pass goes to the model
        self._changed = False
        self.config = model.config
        self.embed, self.rotary, self.norm, self.lm_head = base.embed_tokens, base.rotary_emb, base.norm, model.lm_head
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.hidden, self.inter = config.hidden_size, config.intermediate_size
        self.eps = float(base.layers[0].input_layernorm.variance_epsilon)
        self.scale = float(base.layers[0].self_attn.scaling)
        # a question's pass: rows the linear kernels take, packed attention rows (tokens x query heads per KV head)
        self.max_tokens = min(fused.KERNEL_LINEAR_ROWS, fused.MAX_ROWS // (self.heads // self.kv_heads))
        self._weights = (_Layer * len(base.layers))()
        self._keep = []  # the float32 norm weights handed to C by address
        self._operands = []  # (holder, name, tensor) of each tensor handed to C by address (held: never freed under C)
        for entry, layer in zip(self._weights, base.layers, strict=True):
            norms = [layer.input_layernorm.weight.detach().float().contiguous(), layer.post_attention_layernorm.weight.detach().float().contiguous()]
            self._keep.extend(norms)
            entry.norm_in, entry.norm_post = norms[0].data_ptr(), norms[1].data_ptr()
            for i, path in enumerate(PROJECTIONS):
                linear = _module(layer, path)
                entry.w[i] = linear.weight.data_ptr()
                entry.scales[i] = linear.scales.data_ptr() if w_bits == 8 else None
                self._operands.append(_held(linear, "weight"))
                if w_bits == 8:
                    self._operands.append(_held(linear, "scales"))
            self._operands += [_held(layer.input_layernorm, "weight"), _held(layer.post_attention_layernorm, "weight")]
        # every module's hook dicts (register_forward_hook adds to them in place): looked at per question, not walked
        self._hook_dicts = [d for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]

    def __call__(self, *, input_ids: torch.Tensor, cache=None, use_cache: bool = True, logits_to_keep: int | None = None, **kwargs):
        if input_ids.dim() != 2 or input_ids.shape[1] != 1:  # a question's or a prompt's pass: check the model again
            self._changed = any(self._hook_dicts) or not self._same_operands()
        out = (self._run(input_ids, cache, logits_to_keep)
               if ENABLED and not kwargs and use_cache and not self._changed and not _global_hooks() else None)
        if out is not None:
            return out
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        return self.model(input_ids=input_ids, cache=cache, use_cache=use_cache, **kwargs)

    def _same_operands(self) -> bool:
        """Whether the model still holds the weight tensors whose addresses the pass hands to C."""
        return all(holder.get(name) is tensor for holder, name, tensor in self._operands)

    def _table(self, cache: CartridgeCache) -> _Layer * int | None:
        """The layers' operands with this cache's buffers (kept on the cache for this pass: its buffers are fixed for its
        life; another pass over the same cache, another model's weights, builds its own)."""
        owner, table = getattr(cache, "mnesio_native_table", (None, None))
        if owner is not self:
            layers = cache.layers
            shape = layers[0].kbuf.shape
            if (len(layers) != len(self._weights) or not all(type(layer) is BufferLayer for layer in layers)
                    or shape[:2] != (1, self.kv_heads) or shape[3] != fused.HEAD_DIM
                    or any(b.dtype != self.kv_dtype or b.shape != shape or not b.is_contiguous() or b.device.type != "cpu"
                           for layer in layers for b in (layer.kbuf, layer.vbuf))):
                return None
            table = (_Layer * len(layers))()
            ctypes.memmove(table, self._weights, ctypes.sizeof(table))
            for entry, layer in zip(table, layers, strict=True):
                entry.k, entry.v = layer.kbuf.data_ptr(), layer.vbuf.data_ptr()
            cache.mnesio_native_table = (self, table)
        return table

    def _run(self, input_ids: torch.Tensor, cache, logits_to_keep: int | None) -> CausalLMOutputWithPast | None:
        """The pass in one call, or None where it does not take it (the model runs it)."""
        if not isinstance(cache, CartridgeCache) or input_ids.dim() != 2 or input_ids.shape[0] != 1 or torch.compiler.is_compiling():
            return None
        m = input_ids.shape[1]
        keep = logits_to_keep if type(logits_to_keep) is int else None  # a tensor (positions to keep): the model's
        last_only = keep == 1 or (m == 1 and (logits_to_keep is None or keep == 0))  # what the pass returns
        if not 1 <= m <= CHUNKS * self.max_tokens or not last_only:
            return None
        if (table := self._table(cache)) is None:
            return None
        layers = cache.layers
        length, capacity = layers[0].length, layers[0].kbuf.shape[2]
        if any(layer.length != length for layer in layers) or length + m > capacity:
            return None
        h = self.embed(input_ids)[0].float().contiguous()  # [m, hidden], the residual stream, updated in place
        cos, sin = self.rotary(h[None], torch.arange(length, length + m, device=h.device)[None])
        cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        parts = -(-m // self.max_tokens)
        size = -(-m // parts)  # a longer question in even parts, each part through all the layers before the next
        for start in range(0, m, size):
            rows = min(size, m - start)
            rc = fused.kernel().mnesio_layers_pass(
                table, len(layers), self.w_bits, fused.KV_BITS[self.kv_dtype], self.hidden, self.heads, self.kv_heads,
                self.inter, self.eps, self.scale, capacity, length + start, rows, cos[start].data_ptr(),
                sin[start].data_ptr(), torch.get_num_threads(), h[start].data_ptr())
            if rc != 0:  # before any write of this part; the model's pass rewrites the earlier parts' positions
                return None
        end = length + m
        for layer in layers:  # BufferLayer.update's bookkeeping: the new positions are written
            layer.length, layer.keys, layer.values = end, layer.kbuf[:, :, :end], layer.vbuf[:, :, :end]
        logits = self.lm_head(self.norm(h[-1:][None]))  # [1, 1, vocab]
        return CausalLMOutputWithPast(logits=logits, cache=cache)
