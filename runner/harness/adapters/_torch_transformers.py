"""The transformers of ``models.TRANSFORMERS`` in PyTorch (used by ``torch.py``).

GPT: token + position embeddings, pre-LayerNorm blocks with causal multi-head attention and a
GELU MLP, a final LayerNorm and the token embedding as the (tied, bias-free) output head.  The
forward pass takes (batch, T) token ids and returns logits as (batch, vocab, T): the class
dimension second, as ``nn.CrossEntropyLoss`` takes a sequence's targets (batch, T).
ViT: a stride-``patch`` convolution into patches, a class token, position embeddings, the same
blocks without the mask, a final LayerNorm and a dense head on the class token.

``attention``: "explicit" is softmax(QKᵀ/√d)V written out (the causal mask a -inf fill);
"fused" is ``torch.nn.functional.scaled_dot_product_attention``, which picks a kernel (flash,
memory-efficient, cuDNN or the math fallback) at run time; ``fused_backend`` names the one it
can use for the cell's shapes and dtype.  Parameter initialisation: models.py ("transformers").
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..models import INIT_STD, LN_EPSILON, TRANSFORMERS, Transformer, vit_patches


class Attention(nn.Module):
    def __init__(self, t: Transformer, *, causal: bool, fused: bool) -> None:
        super().__init__()
        self.heads, self.head_width, self.causal, self.fused = t.heads, t.head_width, causal, fused
        self.qkv = nn.Linear(t.width, 3 * t.width)
        self.proj = nn.Linear(t.width, t.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_width).permute(2, 0, 3, 1, 4)
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_width))
            if self.causal:
                mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
                scores = scores.masked_fill(mask, float("-inf"))
            y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, t: Transformer, *, causal: bool, fused: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(t.width, eps=LN_EPSILON)
        self.attn = Attention(t, causal=causal, fused=fused)
        self.ln2 = nn.LayerNorm(t.width, eps=LN_EPSILON)
        self.mlp = nn.Sequential(nn.Linear(t.width, t.mlp), nn.GELU(), nn.Linear(t.mlp, t.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, t: Transformer, *, fused: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(t.vocab, t.width)
        self.pos = nn.Embedding(t.positions, t.width)
        self.blocks = nn.ModuleList(Block(t, causal=True, fused=fused) for _ in range(t.layers))
        self.ln_f = nn.LayerNorm(t.width, eps=LN_EPSILON)
        _initialise(self)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        h = self.tok(idx) + self.pos(positions)
        for block in self.blocks:
            h = block(h)
        logits = self.ln_f(h) @ self.tok.weight.t()  # the tied head
        return logits.transpose(1, 2)  # (batch, vocab, T)


class ViT(nn.Module):
    def __init__(self, t: Transformer, shape: tuple[int, int, int], classes: int, *, fused: bool) -> None:
        super().__init__()
        tokens = vit_patches_checked(t, shape) + 1
        self.patch = nn.Conv2d(shape[0], t.width, t.patch, stride=t.patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, t.width))
        self.pos = nn.Parameter(torch.zeros(1, tokens, t.width))
        self.blocks = nn.ModuleList(Block(t, causal=False, fused=fused) for _ in range(t.layers))
        self.ln_f = nn.LayerNorm(t.width, eps=LN_EPSILON)
        self.head = nn.Linear(t.width, classes)
        _initialise(self)
        nn.init.normal_(self.pos, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x).flatten(2).transpose(1, 2)  # (batch, patches, width)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)[:, 0])


def vit_patches_checked(t: Transformer, shape: tuple[int, int, int]) -> int:
    name = next(n for n, v in TRANSFORMERS.items() if v is t)
    return vit_patches(name, shape)


def _initialise(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
            nn.init.normal_(module.weight, std=INIT_STD)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def build(name: str, shape: tuple[int, ...], classes: int, *, fused: bool) -> nn.Module:
    t = TRANSFORMERS[name]
    if t.kind == "gpt":
        return GPT(t, fused=fused)
    return ViT(t, tuple(shape), classes, fused=fused)  # type: ignore[arg-type]


def fused_backend(device: torch.device, dtype: torch.dtype, heads: int, seq: int, head_width: int,
                  causal: bool) -> str:
    """The kernel ``scaled_dot_product_attention`` runs for these shapes: on a GPU the first of
    flash, memory-efficient and cuDNN whose ``can_use`` check passes (PyTorch's own order), else
    "math"; on the CPU the flash-attention CPU kernel when its check passes, else "math"."""
    try:
        from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
    except ImportError:
        return "unknown (this torch has no SDPAParams)"
    q = torch.empty(1, heads, seq, head_width, device=device, dtype=dtype)
    try:
        sdpa = SDPAParams(q, q, q, None, 0.0, causal, False)
    except TypeError:  # older signature without enable_gqa
        sdpa = SDPAParams(q, q, q, None, 0.0, causal)
    if device.type == "cuda":
        if can_use_flash_attention(sdpa, False):
            return "flash"
        if can_use_efficient_attention(sdpa, False):
            return "efficient"
        cudnn = getattr(torch.backends.cuda, "can_use_cudnn_attention", None)
        if cudnn is not None and cudnn(sdpa, False):
            return "cudnn"
        return "math"
    # CPU: torch's CPU flash kernel takes float / bfloat16 inputs without a mask or dropout
    return "flash (cpu)" if dtype in (torch.float32, torch.bfloat16, torch.float64) else "math"


def in_force(params: dict[str, Any], device: torch.device, model_name: str, seq: int) -> dict[str, Any]:
    t = TRANSFORMERS[model_name]
    attention = params.get("attention") or "default"
    fused = attention in ("default", "fused")
    out: dict[str, Any] = {"attention": "fused" if fused else "explicit"}
    if fused:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params["precision"], torch.float32)
        out["attention_kernel"] = fused_backend(device, dtype, t.heads, seq, t.head_width, t.kind == "gpt")
    return out


class _Embed(nn.Module):
    """GPT's token + position embedding as one unit (the layer profile's ``embed``)."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class _PatchEmbed(nn.Module):
    """ViT's patches, class token and position embedding as one unit."""

    def __init__(self, vit: ViT) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.vit
        h = v.patch(x).flatten(2).transpose(1, 2)
        return torch.cat([v.cls.expand(h.shape[0], -1, -1), h], dim=1) + v.pos

    def parameters(self, recurse: bool = True):  # type: ignore[no-untyped-def,override]
        v = self.vit
        return iter([*v.patch.parameters(), v.cls, v.pos])


class _TiedHead(nn.Module):
    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.weight = gpt.tok.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight.t()


class _ClassHead(nn.Module):
    def __init__(self, vit: ViT) -> None:
        super().__init__()
        self.head = vit.head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h[:, 0])


def units(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    """The transformer's units in ``models.transformer_walk`` order, each with whether its
    output is added to the residual stream (attention and MLP) or replaces it."""
    out: list[tuple[nn.Module, bool]] = [(_Embed(model) if isinstance(model, GPT) else _PatchEmbed(model), False)]
    for block in model.blocks:
        out += [(block.ln1, False), (block.attn, True), (block.ln2, False), (block.mlp, True)]
    out.append((model.ln_f, False))
    out.append((_TiedHead(model) if isinstance(model, GPT) else _ClassHead(model), False))
    return out


def unit_inputs(listed: list[tuple[nn.Module, bool]], x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One connected forward pass through ``units(model)``: each unit's input and output on ``x``.  A block is
    ``r = r + attn(ln1(r))``, ``r = r + mlp(ln2(r))``: ln1 and ln2 read the residual stream,
    attention and the MLP read their norm's output."""
    inputs, outputs = [], []
    h = x
    residual = None
    for unit, adds in listed:
        inp = residual if isinstance(unit, nn.LayerNorm) and residual is not None else h
        out = unit(inp)
        inputs.append(inp)
        outputs.append(out)
        if adds:
            residual = residual + out
            h = residual
        elif isinstance(unit, (_Embed, _PatchEmbed)):
            residual = h = out
        else:
            h = out
    return inputs, outputs
