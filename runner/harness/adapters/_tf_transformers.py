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
from typing import Any

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
            return x + self.out(keras.activations.gelu(self.fc(self.ln2(x)), approximate=False))

    class GPT(keras.Model):
        def __init__(self, model: str, **kw: Any) -> None:
            super().__init__(name=model, **kw)
            t = TRANSFORMERS[model]
            self.tok = keras.layers.Embedding(t.vocab, t.width, embeddings_initializer=normal(), name="tok")
            self.pos = keras.layers.Embedding(t.positions, t.width, embeddings_initializer=normal(), name="pos")
            self.blocks = [Block(t.width, t.heads, t.mlp, True, name=f"block{i}") for i in range(t.layers)]
            self.ln_f = layer_norm("ln_f")

        def call(self, idx: Any, training: bool = False) -> Any:
            h = self.tok(idx) + self.pos(tf.range(tf.shape(idx)[1]))[None]
            for block in self.blocks:
                h = block(h)
            h = self.ln_f(h)
            return tf.matmul(h, tf.cast(self.tok.embeddings, h.dtype), transpose_b=True)  # the tied head

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
            if self.channels_first:
                x = tf.transpose(x, (0, 2, 3, 1))
            h = self.patch(x)
            b = tf.shape(h)[0]
            h = tf.reshape(h, (b, -1, self.t.width))
            cls = tf.cast(tf.broadcast_to(self.cls, (b, 1, self.t.width)), h.dtype)
            h = tf.concat([cls, h], axis=1) + tf.cast(self.pos, h.dtype)
            for block in self.blocks:
                h = block(h)
            return self.head(self.ln_f(h)[:, 0])

    _CLASSES.update(GPT=GPT, ViT=ViT)
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
