"""Precision: bf16 with an f32 residual stream ("bf16r"), weight-only int8 ("f32w8" over f32 KV, "bf16w8" over bf16
KV), and each engine dtype's torch dtype.

bf16r keeps in float32 the residual stream, every RMSNorm, the rotary embedding of queries and keys, the
SwiGLU product and the LM head, and casts to bf16 only at the matmuls' inputs; the KV state and attention
are bf16. The q/k/o/gate/up/down projections return their exact f32 accumulator (EXACT_OUTPUTS,
bf16_linear_f32_out). It is wired with forward hooks on the standard modules of Llama-style models, and
needs kvengine's attention for the mixed query/value dtypes.

Design and the measurements behind each choice: docs/design/precision.md.
"""
from __future__ import annotations

import functools
import types

import torch

# the KV state's (and activations') torch dtype per engine dtype
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "bf16r": torch.bfloat16, "f16": torch.float16, "f32w8": torch.float32,
                "bf16w8": torch.bfloat16}
RESIDUAL_F32_DTYPES = frozenset({"bf16r"})  # dtypes whose hidden stream stays float32 (module docstring)
# f32 residual stream, weight-only int8 linear layers (weight_int8); the KV in TORCH_DTYPES' dtype (f32 or bf16)
WEIGHT_INT8_DTYPES = frozenset({"f32w8", "bf16w8"})
INT8_HEAD = False  # f32w8 keeps the LM head in f32: quantizing it too raised the mean KL and parted more answers (BENCHMARKS.md)
# the LM head's weights where it is not int8: f32w8's is the f32 embedding table itself; bf16w8's a bf16 copy of it with
# an exact f32 output (exact_output_forward), half the bytes each decoding step reads for it (BENCHMARKS.md)
INT8_HEAD_DTYPES = {"f32w8": torch.float32, "bf16w8": torch.bfloat16}
INT8_ACT_DTYPE = torch.bfloat16  # f32w8's matmuls take bf16 activations (Int8WeightLinear)
# outputs cast up to f32 (rope, the SwiGLU product) when they are not in EXACT_OUTPUTS: the bf16r with rounded
# outputs that bench/precision_speed.py and tune_bf16r.py build (EXACT_OUTPUTS emptied) to compare against
F32_OUTPUTS = ("q_proj", "k_proj", "gate_proj", "up_proj")
# linear layers whose f32 output is the matmul's own f32 accumulator, not its bf16 rounding (module docstring);
# v_proj is left out: its output is the bf16 KV, one rounding either way
EXACT_OUTPUTS = ("q_proj", "k_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# -- bf16 with an f32 residual stream ---------------------------------------------------------------
def _cast_input(dtype: torch.dtype):
    def hook(module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() and args[0].dtype != dtype:
            return (args[0].to(dtype), *args[1:])
        return None

    return hook


def _cast_output(dtype: torch.dtype):
    def hook(module, args, output):
        if isinstance(output, torch.Tensor):
            return output.to(dtype) if output.is_floating_point() else output
        if isinstance(output, tuple):
            return tuple(o.to(dtype) if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in output)
        return output

    return hook


def bf16_linear_f32_out(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` from bf16 ``x`` and ``weight``, returned in float32 without rounding to bf16.

    A bf16 matmul accumulates in f32 and rounds its output to bf16. On CUDA, torch.mm's ``out_dtype`` returns
    the f32 accumulator. The CPU has no such kernel in torch, so the output is compensated: oneDNN's linear
    with a fused "add" post-op, which is applied to the f32 accumulator before the output is rounded, gives
    ``r = bf16(x W^T - y)`` for the rounded output ``y``; ``y + r`` is the accumulator to ~2^-17 of |y|
    instead of 2^-9. Two bf16 matmuls, still cheaper than one in f32 (measured 0.24 + 0.20 ms against 0.75 ms
    for a [13, 576] x [576, 1536] product on one core). Deterministic: the same kernels on the same shapes.
    """
    if x.device.type == "cuda" and x.dtype == weight.dtype == torch.bfloat16:
        y = torch.mm(x.reshape(-1, x.shape[-1]), weight.T, out_dtype=torch.float32).reshape(*x.shape[:-1], weight.shape[0])
        return y if bias is None else y + bias.float()
    if x.device.type == "cpu" and x.dtype == weight.dtype == torch.bfloat16 and _onednn_bf16():
        y = torch.nn.functional.linear(x, weight, bias)
        r = torch.ops.mkldnn._linear_pointwise.binary(x, y.neg(), weight, bias, "add")
        return y.float() + r.float()
    # elsewhere: the same products (bf16 values are exact in f32) accumulated by an f32 matmul, only slower
    return torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())


@functools.cache
def _onednn_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls on this CPU (it needs AVX512 or AMX)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def exact_output_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """An exact-output linear's forward, bound to it as a method (so a deep copy of the model binds its copy)."""
    return bf16_linear_f32_out(x.to(self.weight.dtype), self.weight, self.bias)


def residual_f32(model: torch.nn.Module, *, matmul_dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """Make a float32 ``model`` a bf16r model in place (module docstring) and return it.

    Linear layers (except the LM head) get ``matmul_dtype`` weights and cast their input to it; norms and
    the embedding stay float32; the rotary tables are cast to ``matmul_dtype`` so the KV state is in it.
    """
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("residual_f32() needs a float32 model (it keeps the norms and the stream in float32)")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            module.to(matmul_dtype)
            if name.endswith(EXACT_OUTPUTS):
                module.forward = types.MethodType(exact_output_forward, module)
                continue
            module.register_forward_pre_hook(_cast_input(matmul_dtype))
            if name.endswith(F32_OUTPUTS):
                module.register_forward_hook(_cast_output(torch.float32))
    return model


# -- loading --------------------------------------------------------------------------------------------
def load_dtype(dtype: str) -> torch.dtype:
    """The torch dtype a model is loaded in for the engine dtype ``dtype`` (bf16r and f32w8 start from float32)."""
    return torch.float32 if dtype in RESIDUAL_F32_DTYPES | WEIGHT_INT8_DTYPES else TORCH_DTYPES[dtype]


def cast_model(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """``model`` (float32, or already in ``dtype``) made ready to serve in the engine dtype ``dtype``."""
    if dtype in RESIDUAL_F32_DTYPES:
        return residual_f32(model)
    if dtype in WEIGHT_INT8_DTYPES:
        return weight_int8(model, kv_dtype=TORCH_DTYPES[dtype], head_dtype=INT8_HEAD_DTYPES[dtype])
    return model.to(dtype=TORCH_DTYPES[dtype])


# -- weight-only int8 ("f32w8", "bf16w8") ------------------------------------------------------------
class Int8WeightLinear(torch.nn.Module):
    """A linear layer with int8 weights and one scale per output channel (symmetric), through torch's own kernel.

    The scale is ``max|w| / 127`` rounded to bf16 and the codes are ``round(w / scale)``, so the weights computed
    with are exactly ``codes * scale`` whichever activation dtype the kernel runs in. ``forward`` is
    ``torch._weight_int8pack_mm`` (the int8 weights dequantized inside the matmul, accumulated in float32) on
    activations cast to ``act_dtype``; its output is returned in ``out_dtype`` (float32; bf16w8's v_proj: the bf16
    KV). torch 2.13's CPU kernel is vectorized for bf16 activations only: with float32 ones it is several times
    slower than the float32 matmul it replaces.
    """

    def __init__(self, linear: torch.nn.Linear, *, act_dtype: torch.dtype = torch.bfloat16, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.bfloat16).tiny).to(torch.bfloat16).float()
        codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.in_features, self.out_features, self.act_dtype, self.out_dtype = linear.in_features, linear.out_features, act_dtype, out_dtype
        self.register_buffer("weight", codes.contiguous())  # [out, in] int8
        self.register_buffer("scales", scales.to(act_dtype).contiguous())  # [out], exact in bf16
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(self.act_dtype).contiguous()
        y = torch._weight_int8pack_mm(rows, self.weight, self.scales)
        if self.bias is not None:
            y = y.float() + self.bias
        return y.to(self.out_dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weights this layer computes with (codes times scales)."""
        return self.weight.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        out = "" if self.out_dtype == torch.float32 else f", out={str(self.out_dtype).removeprefix('torch.')}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, weights=int8{out}"


def weight_int8(model: torch.nn.Module, *, head: bool | None = None, act_dtype: torch.dtype | None = None,
                kv_dtype: torch.dtype = torch.float32, head_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Make a float32 ``model`` an f32w8 (or bf16w8) model in place (every nn.Linear an Int8WeightLinear) and return it.

    ``head``: the LM head too (default: INT8_HEAD). A head tied to the input embedding (SmolLM2's) is replaced
    on its own: the embedding keeps its float32 table for the lookups; a head left out of int8 is in ``head_dtype``
    (float32: the table itself; bf16: an untied bf16 copy, exact f32 logits). ``act_dtype``: the matmuls' activation dtype
    (default: INT8_ACT_DTYPE). ``kv_dtype``: the KV state's dtype; with bf16 the value projections (``v_proj``, as in
    Llama-style models) return bf16, so attention casts queries and keys to it (attention.py) and a prefix's
    attention sees the very KV a cartridge stores, as under bf16r.
    """
    act_dtype = INT8_ACT_DTYPE if act_dtype is None else act_dtype
    if next(model.parameters()).dtype != torch.float32:
        raise ValueError("weight_int8() needs a float32 model (it quantizes the float32 weights)")
    head = INT8_HEAD if head is None else head
    lm_head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and (head or child is not lm_head):
                out_dtype = kv_dtype if name == "v_proj" else torch.float32
                setattr(module, name, Int8WeightLinear(child, act_dtype=act_dtype, out_dtype=out_dtype))
    if not head and isinstance(lm_head, torch.nn.Linear) and head_dtype != torch.float32:
        copied = torch.nn.utils.skip_init(torch.nn.Linear, lm_head.in_features, lm_head.out_features, bias=lm_head.bias is not None,
                                          dtype=head_dtype, device=lm_head.weight.device)
        with torch.no_grad():
            copied.weight.copy_(lm_head.weight)
            if lm_head.bias is not None:
                copied.bias.copy_(lm_head.bias)
        copied.requires_grad_(False)
        copied.forward = types.MethodType(exact_output_forward, copied)
        model.set_output_embeddings(copied)
    return model
