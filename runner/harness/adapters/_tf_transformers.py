"""The transformers of ``models.TRANSFORMERS`` in TensorFlow / Keras 3 (used by ``tensorflow.py``).

The same networks as ``_torch_transformers`` (models.py "transformers" fixes them), as
subclassed Keras models built on a dummy batch: GPT returns logits (batch, T, vocab) through
the token embedding transposed (tied); ViT takes the adapter's image tensors (NCHW, or NHWC
when the layout says so) and cuts patches with a stride-``patch`` convolution on NHWC.

``attention``: "explicit" only.  TensorFlow has no fused scaled-dot-product kernel of its own
(Keras 3's ``ops.dot_product_attention`` runs its flash path on the JAX and PyTorch back ends
only), so ``fused`` is refused (``tensorflow.check`` and framework.toml).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from ..models import INIT_STD, LN_EPSILON, TRANSFORMERS, vit_patches

_CLASSES: dict[str, Any] = {}


def _classes() -> dict[str, Any]:
    if _CLASSES:
        return _CLASSES
    import keras
    import tensorflow as tf

    def normal() -> Any:
        return keras.initializers.RandomNormal(stddev=INIT_STD)

    def dense(units: int, name: str) -> Any:
        return keras.layers.Dense(units, kernel_initializer=normal(), bias_initializer="zeros", name=name)

    def layer_norm(name: str) -> Any:
        return keras.layers.LayerNormalization(epsilon=LN_EPSILON, name=name)

    class Attention(keras.layers.Layer):
        def __init__(self, width: int, heads: int, causal: bool, **kw: Any) -> None:
            super().__init__(**kw)
            self.width, self.heads, self.causal = width, heads, causal
            self.qkv = dense(3 * width, "qkv")
            self.proj = dense(width, "proj")

        def call(self, x: Any) -> Any:
            b, n = tf.shape(x)[0], tf.shape(x)[1]
            hd = self.width // self.heads
            qkv = tf.reshape(self.qkv(x), (b, n, 3, self.heads, hd))
            qkv = tf.transpose(qkv, (2, 0, 3, 1, 4))  # (3, batch, heads, T, head width)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = tf.matmul(q, k, transpose_b=True) * tf.cast(1.0 / math.sqrt(hd), q.dtype)
            if self.causal:
                mask = tf.linalg.band_part(tf.ones((n, n), tf.bool), -1, 0)
                scores = tf.where(mask, scores, tf.cast(-math.inf, scores.dtype))
            y = tf.matmul(tf.nn.softmax(scores, axis=-1), v)
            y = tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (b, n, self.width))
            return self.proj(y)

    class Block(keras.layers.Layer):
        def __init__(self, width: int, heads: int, mlp: int, causal: bool, **kw: Any) -> None:
            super().__init__(**kw)
            self.ln1, self.ln2 = layer_norm("ln1"), layer_norm("ln2")
            self.attn = Attention(width, heads, causal, name="attn")
            self.fc, self.out = dense(mlp, "fc"), dense(width, "out")

        def call(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + mlp(self, self.ln2(x))

    # The pieces the networks and their units (the layer profile's) share: functions of a
    # built block / model and an input, so a unit computes exactly what the network does.
    def mlp(block: Any, x: Any) -> Any:
        return block.out(keras.activations.gelu(block.fc(x), approximate=False))

    def embed_tokens(gpt: Any, idx: Any) -> Any:
        return gpt.tok(idx) + gpt.pos(tf.range(tf.shape(idx)[1]))[None]

    def tied_head(gpt: Any, h: Any) -> Any:
        return tf.matmul(h, tf.cast(gpt.tok.embeddings, h.dtype), transpose_b=True)

    def embed_patches(vit: Any, x: Any) -> Any:
        if vit.channels_first:
            x = tf.transpose(x, (0, 2, 3, 1))
        h = vit.patch(x)
        b = tf.shape(h)[0]
        h = tf.reshape(h, (b, -1, vit.t.width))
        cls = tf.cast(tf.broadcast_to(vit.cls, (b, 1, vit.t.width)), h.dtype)
        return tf.concat([cls, h], axis=1) + tf.cast(vit.pos, h.dtype)

    def class_head(vit: Any, h: Any) -> Any:
        return vit.head(h[:, 0])

    class GPT(keras.Model):
        def __init__(self, model: str, **kw: Any) -> None:
            super().__init__(name=model, **kw)
            t = TRANSFORMERS[model]
            self.tok = keras.layers.Embedding(t.vocab, t.width, embeddings_initializer=normal(), name="tok")
            self.pos = keras.layers.Embedding(t.positions, t.width, embeddings_initializer=normal(), name="pos")
            self.blocks = [Block(t.width, t.heads, t.mlp, True, name=f"block{i}") for i in range(t.layers)]
            self.ln_f = layer_norm("ln_f")

        def call(self, idx: Any, training: bool = False) -> Any:
            h = embed_tokens(self, idx)
            for block in self.blocks:
                h = block(h)
            return tied_head(self, self.ln_f(h))

    class ViT(keras.Model):
        def __init__(self, model: str, shape: tuple[int, int, int], classes: int, channels_first: bool,
                     **kw: Any) -> None:
            super().__init__(name=model, **kw)
            t = TRANSFORMERS[model]
            self.t, self.channels_first = t, channels_first
            tokens = vit_patches(model, shape) + 1
            self.patch = keras.layers.Conv2D(t.width, t.patch, strides=t.patch, padding="valid",
                                             data_format="channels_last", kernel_initializer=normal(),
                                             bias_initializer="zeros", name="patch")
            self.cls = self.add_weight(shape=(1, 1, t.width), initializer="zeros", name="cls")
            self.pos = self.add_weight(shape=(1, tokens, t.width), initializer=normal(), name="pos")
            self.blocks = [Block(t.width, t.heads, t.mlp, False, name=f"block{i}") for i in range(t.layers)]
            self.ln_f = layer_norm("ln_f")
            self.head = dense(classes, "head")

        def call(self, x: Any, training: bool = False) -> Any:
            h = embed_patches(self, x)
            for block in self.blocks:
                h = block(h)
            return class_head(self, self.ln_f(h))

    _CLASSES.update(GPT=GPT, ViT=ViT, mlp=mlp, embed_tokens=embed_tokens, tied_head=tied_head,
                    embed_patches=embed_patches, class_head=class_head)
    return _CLASSES


def build(model: str, shape: tuple[int, ...], classes: int, layout: str | None) -> Any:
    """The Keras model, built (its variables made) on a batch of 2."""
    import tensorflow as tf

    t = TRANSFORMERS[model]
    cls = _classes()
    if t.kind == "gpt":
        net = cls["GPT"](model)
        net(tf.zeros((2, shape[0]), tf.int32))
        return net
    channels_first = layout != "nhwc"
    net = cls["ViT"](model, tuple(shape), classes, channels_first)
    c, h, w = shape
    net(tf.zeros((2, c, h, w) if channels_first else (2, h, w, c), tf.float32))
    return net


class Unit:
    """One unit of the layer profile: ``fn(x)`` through layers of the built network, with the
    trainable variables it reads (``_layer_op`` calls ``unit(x, training=…)`` and differentiates
    with respect to ``trainable_variables``).  ``reads``: "residual" (a LayerNorm reads the
    residual stream) or "previous" (the output of the unit before); ``adds``: its output is
    added to the residual stream (attention, MLP) rather than replacing it."""

    def __init__(self, name: str, fn: Callable[[Any], Any], variables: Callable[[], list[Any]], *,
                 reads: str = "previous", adds: bool = False) -> None:
        self.name, self.fn, self._variables, self.reads, self.adds = name, fn, variables, reads, adds

    def __call__(self, x: Any, training: bool = False) -> Any:
        return self.fn(x)

    @property
    def trainable_variables(self) -> list[Any]:
        return list(self._variables())


def units(net: Any) -> list[Unit]:
    """The built transformer's units in ``models.transformer_walk`` order."""
    cls = _classes()
    gpt = isinstance(net, cls["GPT"])
    weights = lambda *layers: (lambda: [v for layer in layers for v in layer.trainable_variables])  # noqa: E731
    if gpt:
        out = [Unit("embed", lambda x: cls["embed_tokens"](net, x), weights(net.tok, net.pos))]
    else:
        out = [Unit("embed", lambda x: cls["embed_patches"](net, x),
                    lambda: [*net.patch.trainable_variables, net.cls, net.pos])]
    for i, block in enumerate(net.blocks):
        out += [Unit(f"block{i}_ln1", block.ln1, weights(block.ln1), reads="residual"),
                Unit(f"block{i}_attn", block.attn, weights(block.attn), adds=True),
                Unit(f"block{i}_ln2", block.ln2, weights(block.ln2), reads="residual"),
                Unit(f"block{i}_mlp", lambda x, b=block: cls["mlp"](b, x), weights(block.fc, block.out), adds=True)]
    out.append(Unit("ln_f", net.ln_f, weights(net.ln_f), reads="residual"))
    if gpt:
        out.append(Unit("head", lambda h: cls["tied_head"](net, h), lambda: [net.tok.embeddings]))
    else:
        out.append(Unit("head", lambda h: cls["class_head"](net, h), weights(net.head)))
    return out


def unit_inputs(listed: list[Unit], x: Any) -> tuple[list[Any], list[Any]]:
    """One connected forward pass through ``units(net)``: each unit's input and output on ``x``.
    A block is ``r = r + attn(ln1(r))``, ``r = r + mlp(ln2(r))``."""
    inputs, outputs = [], []
    h = residual = x
    for i, unit in enumerate(listed):
        inp = residual if unit.reads == "residual" else h
        out = unit(inp)
        inputs.append(inp)
        outputs.append(out)
        if unit.adds:
            residual = h = residual + out
        elif i == 0:  # the embedding starts the residual stream
            residual = h = out
        else:
            h = out
    return inputs, outputs
