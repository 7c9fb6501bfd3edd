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
from dataclasses import dataclass
from typing import Any, Callable

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
            return x + mlp(ln("ln2")(x), self.width, self.mlp)

    # The pieces the networks and their units (the layer profile's) share.  Called inside a
    # compact method, each makes its submodules / parameters in the caller's scope, under the
    # same names: a unit's variables are a subtree of the network's, taken as they are.
    def mlp(x: Any, width: int, hidden: int) -> Any:
        return dense(width, "out")(jax.nn.gelu(dense(hidden, "fc")(x), approximate=False))

    def token_embedding(t: Any) -> Any:
        return nn.Embed(t.vocab, t.width, embedding_init=normal, name="tok")

    def embed_tokens(t: Any, tok: Any, idx: Any) -> Any:
        pos = nn.Embed(t.positions, t.width, embedding_init=normal, name="pos")
        return tok(idx) + pos(jnp.arange(idx.shape[1]))[None]

    def embed_patches(module: Any, t: Any, x: Any) -> Any:
        x = jnp.transpose(x, (0, 2, 3, 1))  # NCHW arrays -> NHWC for nn.Conv
        h = nn.Conv(t.width, (t.patch, t.patch), strides=(t.patch, t.patch), padding="VALID",
                    kernel_init=normal, bias_init=zeros, name="patch")(x)
        b = h.shape[0]
        h = h.reshape(b, -1, t.width)
        cls = module.param("cls", zeros, (1, 1, t.width))
        pos = module.param("pos", normal, (1, h.shape[1] + 1, t.width))
        return jnp.concatenate([jnp.broadcast_to(cls, (b, 1, t.width)).astype(h.dtype), h], axis=1) + pos

    def class_head(classes: int, h: Any) -> Any:
        return nn.Dense(classes, kernel_init=normal, bias_init=zeros, name="head")(h[:, 0])

    class GPT(nn.Module):
        name_: str
        fused: bool

        @nn.compact
        def __call__(self, idx: Any) -> Any:
            t = TRANSFORMERS[self.name_]
            tok = token_embedding(t)
            h = embed_tokens(t, tok, idx)
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
            h = embed_patches(self, t, x)
            for i in range(t.layers):
                h = Block(t.width, t.heads, t.mlp, False, self.fused, name=f"block{i}")(h)
            h = nn.LayerNorm(epsilon=LN_EPSILON, name="ln_f")(h)
            return class_head(self.classes, h)

    # --- the units of the layer profile (models.transformer_walk), each applied alone on
    # its subtree of the network's parameters

    class TokenEmbed(nn.Module):  # GPT: token + position embedding ({"tok", "pos"})
        name_: str

        @nn.compact
        def __call__(self, idx: Any) -> Any:
            t = TRANSFORMERS[self.name_]
            return embed_tokens(t, token_embedding(t), idx)

    class TiedHead(nn.Module):  # GPT: h @ the token embedding's transpose ({"tok"})
        name_: str

        @nn.compact
        def __call__(self, h: Any) -> Any:
            return token_embedding(TRANSFORMERS[self.name_]).attend(h)

    class PatchEmbed(nn.Module):  # ViT: patches, class token, positions ({"patch", "cls", "pos"})
        name_: str

        @nn.compact
        def __call__(self, x: Any) -> Any:
            return embed_patches(self, TRANSFORMERS[self.name_], x)

    class ClassHead(nn.Module):  # ViT: the dense head on the class token ({"head"})
        classes: int

        @nn.compact
        def __call__(self, h: Any) -> Any:
            return class_head(self.classes, h)

    class MLP(nn.Module):  # a block's fc, GELU, out ({"fc", "out"})
        width: int
        hidden: int

        @nn.compact
        def __call__(self, x: Any) -> Any:
            return mlp(x, self.width, self.hidden)

    _MODULES.update(GPT=GPT, ViT=ViT, Attention=Attention, TokenEmbed=TokenEmbed, TiedHead=TiedHead,
                    PatchEmbed=PatchEmbed, ClassHead=ClassHead, MLP=MLP,
                    LayerNorm=lambda: nn.LayerNorm(epsilon=LN_EPSILON))
    return _MODULES


@dataclass
class Unit:
    """One unit of the layer profile: ``apply(params, x)`` on its ``params`` (a subtree of the
    network's); ``reads``: "residual" (a LayerNorm reads the residual stream) or "previous"
    (the output of the unit before); ``adds``: its output is added to the residual stream
    (attention, MLP) rather than replacing it."""

    name: str
    apply: Callable[[Any, Any], Any]
    params: Any
    reads: str = "previous"
    adds: bool = False


class TransformerNetwork:
    """A transformer with the interface of ``jax.Network``: ``input_shape``, ``init``, ``apply``;
    ``transformer_units`` lists its units for the layer profile."""

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
        return []  # not a sequential network: the layer profile takes ``transformer_units``

    def transformer_units(self, params: dict[str, Any]) -> list[Unit]:
        """The units in ``models.transformer_walk`` order, each bound to its subtree of
        ``params`` (the network's ``{"params": …}`` contents)."""
        t = TRANSFORMERS[self.name]
        mods = _modules()

        def bound(module: Any) -> Callable[[Any, Any], Any]:
            return lambda p, x: module.apply({"params": p}, x)

        norm = bound(mods["LayerNorm"]())
        if self.tokens:
            out = [Unit("embed", bound(mods["TokenEmbed"](self.name)), {"tok": params["tok"], "pos": params["pos"]})]
        else:
            out = [Unit("embed", bound(mods["PatchEmbed"](self.name)),
                        {k: params[k] for k in ("patch", "cls", "pos")})]
        attention = bound(mods["Attention"](t.width, t.heads, self.tokens, self.fused))
        mlp = bound(mods["MLP"](t.width, t.mlp))
        for i in range(t.layers):
            block = params[f"block{i}"]
            out += [Unit(f"block{i}_ln1", norm, block["ln1"], reads="residual"),
                    Unit(f"block{i}_attn", attention, block["attn"], adds=True),
                    Unit(f"block{i}_ln2", norm, block["ln2"], reads="residual"),
                    Unit(f"block{i}_mlp", mlp, {"fc": block["fc"], "out": block["out"]}, adds=True)]
        out.append(Unit("ln_f", norm, params["ln_f"], reads="residual"))
        if self.tokens:
            out.append(Unit("head", bound(mods["TiedHead"](self.name)), {"tok": params["tok"]}))
        else:
            out.append(Unit("head", bound(mods["ClassHead"](self.classes)), {"head": params["head"]}))
        return out

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


def unit_inputs(units: list[Unit], params: list[Any], x: Any,
                deltas: list[Any] | None = None) -> tuple[list[Any], list[Any]]:
    """One connected forward pass through ``units`` (with ``params[i]`` for unit i): each
    unit's input and output on ``x``.  A block is ``r = r + attn(ln1(r))``, ``r = r + mlp(ln2(r))``.
    ``deltas``: added to each unit's output (zeros: the gradient of a loss with respect to
    them is its gradient with respect to the outputs, all in one backward pass)."""
    inputs, outputs = [], []
    h = residual = x
    for i, unit in enumerate(units):
        inp = residual if unit.reads == "residual" else h
        out = unit.apply(params[i], inp)
        if deltas is not None:
            out = out + deltas[i]
        inputs.append(inp)
        outputs.append(out)
        if unit.adds:
            residual = h = residual + out
        elif i == 0:  # the embedding starts the residual stream
            residual = h = out
        else:
            h = out
    return inputs, outputs


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
