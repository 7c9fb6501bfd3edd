"""The transformers of ``models.TRANSFORMERS`` in MXNet 1.9.1 Gluon (used by ``mxnet.py``).

The same networks as ``_torch_transformers`` (models.py "transformers" fixes them), as Gluon
``HybridBlock`` s with every input size given (no deferred initialisation), so that
``hybridize`` compiles them into one static graph (the adapter's default, as for its CNNs) or
they run op by op (``compile = "eager"``).  GPT keeps its token embedding as its own parameter
(``tok_weight``), used both to embed and, transposed, as the tied head; its logits are
(batch, T, vocab).  ViT takes NCHW images.  GELU is ``LeakyReLU(act_type="gelu")``, MXNet's
erf form.

``attention``: "explicit" only: softmax(QKᵀ/√d)V with ``batch_dot``.  MXNet's fused
self-attention operators (``contrib.interleaved_matmul_selfatt_*``) take their own
interleaved layout and are not wired here, so ``fused`` is refused (``mxnet.check``).
"""

from __future__ import annotations

import math
from typing import Any

from ..models import INIT_STD, LN_EPSILON, TRANSFORMERS, vit_patches

_CLASSES: dict[str, Any] = {}


def _classes() -> dict[str, Any]:
    if _CLASSES:
        return _CLASSES
    import mxnet as mx

    nn = mx.gluon.nn
    normal = mx.init.Normal(INIT_STD)

    def dense(units: int, in_units: int, prefix: str) -> Any:
        return nn.Dense(units, in_units=in_units, flatten=False, weight_initializer=normal,
                        bias_initializer="zeros", prefix=prefix)

    def layer_norm(width: int, prefix: str) -> Any:
        return nn.LayerNorm(epsilon=LN_EPSILON, in_channels=width, prefix=prefix)

    class Attention(mx.gluon.HybridBlock):
        def __init__(self, width: int, heads: int, causal: bool, **kw: Any) -> None:
            super().__init__(**kw)
            self.width, self.heads, self.causal = width, heads, causal
            with self.name_scope():
                self.qkv = dense(3 * width, width, "qkv_")
                self.proj = dense(width, width, "proj_")

        def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803  (Gluon's name)
            hd = self.width // self.heads
            qkv = self.qkv(x).reshape((0, 0, 3, self.heads, hd))  # (batch, T, 3, heads, hd)
            qkv = F.transpose(qkv, axes=(2, 0, 3, 1, 4))  # (3, batch, heads, T, hd)
            q, k, v = F.split(qkv, num_outputs=3, axis=0, squeeze_axis=True)
            q = q.reshape((-3, 0, 0))  # (batch·heads, T, hd)
            k = k.reshape((-3, 0, 0))
            v = v.reshape((-3, 0, 0))
            scores = F.batch_dot(q, k, transpose_b=True) * (1.0 / math.sqrt(hd))
            if self.causal:
                steps = F.contrib.arange_like(scores, axis=1)
                mask = F.broadcast_lesser_equal(steps.reshape((1, -1)), steps.reshape((-1, 1)))  # key <= query
                scores = F.where(F.broadcast_like(mask.expand_dims(0), scores), scores,
                                 F.ones_like(scores) * -1e30)
            y = F.batch_dot(F.softmax(scores, axis=-1), v)  # (batch·heads, T, hd)
            y = y.reshape((-4, -1, self.heads, 0, 0))  # (batch, heads, T, hd)
            y = F.transpose(y, axes=(0, 2, 1, 3)).reshape((0, 0, -3))
            return self.proj(y)

    class Block(mx.gluon.HybridBlock):
        def __init__(self, width: int, heads: int, mlp: int, causal: bool, **kw: Any) -> None:
            super().__init__(**kw)
            with self.name_scope():
                self.ln1, self.ln2 = layer_norm(width, "ln1_"), layer_norm(width, "ln2_")
                self.attn = Attention(width, heads, causal, prefix="attn_")
                self.fc, self.out = dense(mlp, width, "fc_"), dense(width, mlp, "out_")

        def hybrid_forward(self, F: Any, x: Any) -> Any:  # noqa: N803
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.LeakyReLU(self.fc(self.ln2(x)), act_type="gelu"))

    class GPT(mx.gluon.HybridBlock):
        def __init__(self, model: str, **kw: Any) -> None:
            super().__init__(prefix=f"{model.replace('-', '_')}_", **kw)
            t = self.t = TRANSFORMERS[model]
            with self.name_scope():
                self.tok_weight = self.params.get("tok_weight", shape=(t.vocab, t.width), init=normal)
                self.pos_weight = self.params.get("pos_weight", shape=(t.positions, t.width), init=normal)
                self.blocks = nn.HybridSequential(prefix="blocks_")
                for i in range(t.layers):
                    self.blocks.add(Block(t.width, t.heads, t.mlp, True, prefix=f"block{i}_"))
                self.ln_f = layer_norm(t.width, "ln_f_")

        def hybrid_forward(self, F: Any, idx: Any, tok_weight: Any, pos_weight: Any) -> Any:  # noqa: N803
            t = self.t
            h = F.Embedding(idx, tok_weight, input_dim=t.vocab, output_dim=t.width)
            positions = F.contrib.arange_like(idx, axis=1)
            h = F.broadcast_add(h, F.Embedding(positions, pos_weight, input_dim=t.positions,
                                               output_dim=t.width).expand_dims(0))
            h = self.ln_f(self.blocks(h))
            return F.dot(h, tok_weight, transpose_b=True)  # the tied head: (batch, T, vocab)

    class ViT(mx.gluon.HybridBlock):
        def __init__(self, model: str, shape: tuple[int, int, int], classes: int, **kw: Any) -> None:
            super().__init__(prefix=f"{model.replace('-', '_')}_", **kw)
            t = self.t = TRANSFORMERS[model]
            tokens = vit_patches(model, shape) + 1
            with self.name_scope():
                self.patch = nn.Conv2D(t.width, t.patch, strides=t.patch, in_channels=shape[0],
                                       weight_initializer=normal, bias_initializer="zeros", prefix="patch_")
                self.cls = self.params.get("cls", shape=(1, 1, t.width), init="zeros")
                self.pos = self.params.get("pos", shape=(1, tokens, t.width), init=normal)
                self.blocks = nn.HybridSequential(prefix="blocks_")
                for i in range(t.layers):
                    self.blocks.add(Block(t.width, t.heads, t.mlp, False, prefix=f"block{i}_"))
                self.ln_f = layer_norm(t.width, "ln_f_")
                self.head = dense(classes, t.width, "head_")

        def hybrid_forward(self, F: Any, x: Any, cls: Any, pos: Any) -> Any:  # noqa: N803
            h = self.patch(x).reshape((0, 0, -1))  # (batch, width, patches)
            h = F.transpose(h, axes=(0, 2, 1))  # (batch, patches, width)
            first = F.broadcast_like(cls, h, lhs_axes=(0,), rhs_axes=(0,))
            h = F.broadcast_add(F.concat(first, h, dim=1), pos)
            h = self.ln_f(self.blocks(h))
            return self.head(F.slice_axis(h, axis=1, begin=0, end=1).reshape((0, -1)))

    _CLASSES.update(GPT=GPT, ViT=ViT)
    return _CLASSES


def build(model: str, shape: tuple[int, ...], classes: int) -> Any:
    t = TRANSFORMERS[model]
    cls = _classes()
    if t.kind == "gpt":
        return cls["GPT"](model)
    return cls["ViT"](model, tuple(shape), classes)  # type: ignore[arg-type]
