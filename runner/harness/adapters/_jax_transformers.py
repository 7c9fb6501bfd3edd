"""The transformers of ``models.TRANSFORMERS`` in JAX / Flax (used by ``jax.py``).

The same networks as ``_torch_transformers`` (models.py "transformers" fixes them): one Flax
module per network, its variables ``{"params": …}`` (no BatchNorm statistics).  GPT returns
logits as (batch, T, vocab); ViT takes images in the adapter's NCHW arrays and returns
(batch, classes).

``attention``: "explicit" is softmax(QKᵀ/√d)V written with ``einsum`` (what Flax's own
``nn.MultiHeadDotProductAttention`` does, so it is JAX's default here); "fused" is
``jax.nn.dot_product_attention`` with the implementation left to JAX (cuDNN's fused kernel on
a GPU that takes the shapes, else XLA's composition).  XLA compiles either into one program:
JAX has no eager mode that matrun measures.
"""

from __future__ import annotations

import math
from typing import Any

from ..models import INIT_STD, LN_EPSILON, TRANSFORMERS, vit_patches

_MODULES: dict[str, Any] = {}


def _modules() -> dict[str, Any]:
    """The Flax modules, defined once Flax is imported (``jax.configure``)."""
    if _MODULES:
        return _MODULES
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    normal = nn.initializers.normal(stddev=INIT_STD)
    zeros = nn.initializers.zeros

    def dense(features: int, name: str) -> Any:
        return nn.Dense(features, kernel_init=normal, bias_init=zeros, name=name)

    class Attention(nn.Module):
        width: int
        heads: int
        causal: bool
        fused: bool

        @nn.compact
        def __call__(self, x: Any) -> Any:
            b, n, d = x.shape
            hd = d // self.heads
            qkv = dense(3 * d, "qkv")(x).reshape(b, n, 3, self.heads, hd)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (batch, T, heads, head width)
            if self.fused:
                y = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal)
            else:
                scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
                if self.causal:
                    mask = jnp.tril(jnp.ones((n, n), bool))
                    scores = jnp.where(mask, scores, -jnp.inf)
                y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
            return dense(d, "proj")(y.reshape(b, n, d))

    class Block(nn.Module):
        width: int
        heads: int
        mlp: int
        causal: bool
        fused: bool

        @nn.compact
        def __call__(self, x: Any) -> Any:
            ln = lambda name: nn.LayerNorm(epsilon=LN_EPSILON, name=name)  # noqa: E731
            x = x + Attention(self.width, self.heads, self.causal, self.fused, name="attn")(ln("ln1")(x))
            h = dense(self.mlp, "fc")(ln("ln2")(x))
            return x + dense(self.width, "out")(jax.nn.gelu(h, approximate=False))

    class GPT(nn.Module):
        name_: str
        fused: bool

        @nn.compact
        def __call__(self, idx: Any) -> Any:
            t = TRANSFORMERS[self.name_]
            tok = nn.Embed(t.vocab, t.width, embedding_init=normal, name="tok")
            pos = nn.Embed(t.positions, t.width, embedding_init=normal, name="pos")
            h = tok(idx) + pos(jnp.arange(idx.shape[1]))[None]
            for i in range(t.layers):
                h = Block(t.width, t.heads, t.mlp, True, self.fused, name=f"block{i}")(h)
            h = nn.LayerNorm(epsilon=LN_EPSILON, name="ln_f")(h)
            return tok.attend(h)  # the tied head: h @ embedding.T

    class ViT(nn.Module):
        name_: str
        classes: int
        fused: bool

        @nn.compact
        def __call__(self, x: Any) -> Any:
            t = TRANSFORMERS[self.name_]
            x = jnp.transpose(x, (0, 2, 3, 1))  # NCHW arrays -> NHWC for nn.Conv
            h = nn.Conv(t.width, (t.patch, t.patch), strides=(t.patch, t.patch), padding="VALID",
                        kernel_init=normal, bias_init=zeros, name="patch")(x)
            b = h.shape[0]
            h = h.reshape(b, -1, t.width)
            cls = self.param("cls", zeros, (1, 1, t.width))
            pos = self.param("pos", normal, (1, h.shape[1] + 1, t.width))
            h = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, t.width)).astype(h.dtype), h], axis=1) + pos
            for i in range(t.layers):
                h = Block(t.width, t.heads, t.mlp, False, self.fused, name=f"block{i}")(h)
            h = nn.LayerNorm(epsilon=LN_EPSILON, name="ln_f")(h)
            return nn.Dense(self.classes, kernel_init=normal, bias_init=zeros, name="head")(h[:, 0])

    _MODULES.update(GPT=GPT, ViT=ViT)
    return _MODULES


class TransformerNetwork:
    """A transformer with the interface of ``jax.Network``: ``input_shape``, ``init``, ``apply``
    (no units: the layer profile does not time transformers yet)."""

    def __init__(self, name: str, shape: tuple[int, ...], classes: int, *, fused: bool) -> None:
        import jax.numpy as jnp

        self.name, self.shape, self.classes, self.fused = name, tuple(shape), classes, fused
        t = TRANSFORMERS[name]
        self.tokens = t.kind == "gpt"
        mods = _modules()
        if self.tokens:
            self.module = mods["GPT"](name, fused)
            self.input_dtype = jnp.int32
            self.target_tail: tuple[int, ...] = (self.shape[0],)  # a target per position
        else:
            vit_patches(name, self.shape)  # type: ignore[arg-type]  # ValueError when the patch does not divide
            self.module = mods["ViT"](name, classes, fused)
            self.input_dtype = jnp.float32
            self.target_tail = ()

    def units(self) -> list[tuple[str, Any]]:
        return []

    def input_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shape)

    def init(self, key: Any) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp

        x = jnp.zeros(self.input_shape(2), self.input_dtype)
        variables = jax.jit(self.module.init)(key, x)
        return {"params": variables["params"], "batch_stats": {}}

    def apply(self, variables: dict[str, Any], x: Any, *, train: bool, rng: Any = None,
              mutable: bool = False) -> Any:
        logits = self.module.apply({"params": variables["params"]}, x)
        return (logits, {}) if mutable else logits


def attention_kernel(device: str, dtype: Any, model: str, seq: int) -> str:
    """What ``jax.nn.dot_product_attention`` runs for the cell: "cudnn" when cuDNN's fused
    kernel takes these shapes on this GPU (tried once, on one sample), else "xla"."""
    if device != "gpu":
        return "xla"
    import jax
    import jax.numpy as jnp

    t = TRANSFORMERS[model]
    q = jnp.zeros((1, seq, t.heads, t.head_width), dtype)
    try:
        jax.block_until_ready(jax.nn.dot_product_attention(q, q, q, is_causal=t.kind == "gpt",
                                                           implementation="cudnn"))
        return "cudnn"
    except Exception:  # noqa: BLE001  (not supported for these shapes, dtype or GPU)
        return "xla"
