"""The model zoo as data: one framework-neutral description per network.

Every adapter builds its network from these layer lists, so "the same model in every
framework" is true by construction, and the tests prove it by comparing each framework's
own count of trainable parameters with ``param_count`` computed here.

Layers (tuples; the first item is the kind, the name is for layer-wise timing):

    ("conv", name, out_channels, kernel, stride, pad, bias)   symmetric zero padding
    ("bn", name)                                               BatchNorm over channels
    ("relu", name)
    ("maxpool", name, kernel, stride, pad)
    ("gap", name)                                              global average pool → C
    ("flatten", name)
    ("dense", name, out_features)                              classes: out_features = 0
    ("dropout", name, rate)
    ("block", name, kind, out_channels, stride)                ResNet basic / bottleneck

A ResNet block is conv-bn-relu-conv-bn (basic) or 1×1-3×3-1×1 with bn and relu (bottleneck,
expansion 4), plus a 1×1 conv + bn projection shortcut when the stride or the channel count
changes, then the sum and a ReLU.  Convolutions in ResNets have no bias.  Stride sits on the
3×3 conv of a bottleneck (the "v1.5" placement used by PyTorch's and Keras' ResNet-50).

FLOPs count multiply-adds × 2 of convolutions and dense layers for one sample's forward pass;
element-wise layers are left out (they are < 1 % for these networks).

Standard library only: this module runs inside framework environments.
"""

from __future__ import annotations

from typing import Any, Iterator

Layer = tuple[Any, ...]

LENET5: list[Layer] = [
    ("conv", "conv1", 6, 5, 1, 2, True), ("relu", "relu1"), ("maxpool", "pool1", 2, 2, 0),
    ("conv", "conv2", 16, 5, 1, 0, True), ("relu", "relu2"), ("maxpool", "pool2", 2, 2, 0),
    ("flatten", "flatten"),
    ("dense", "fc1", 120), ("relu", "relu3"),
    ("dense", "fc2", 84), ("relu", "relu4"),
    ("dense", "fc3", 0),
]

# The Keras CIFAR-10 example network ("cifar10_cnn"), 'same' padding written out.
CIFAR_CNN: list[Layer] = [
    ("conv", "conv1", 32, 3, 1, 1, True), ("relu", "relu1"),
    ("conv", "conv2", 32, 3, 1, 0, True), ("relu", "relu2"), ("maxpool", "pool1", 2, 2, 0),
    ("dropout", "drop1", 0.25),
    ("conv", "conv3", 64, 3, 1, 1, True), ("relu", "relu3"),
    ("conv", "conv4", 64, 3, 1, 0, True), ("relu", "relu4"), ("maxpool", "pool2", 2, 2, 0),
    ("dropout", "drop2", 0.25),
    ("flatten", "flatten"),
    ("dense", "fc1", 512), ("relu", "relu5"), ("dropout", "drop3", 0.5),
    ("dense", "fc2", 0),
]

# AlexNet as in STUDIES.md E, Table II: no LRN, single tower, 224×224 input.
ALEXNET: list[Layer] = [
    ("conv", "conv1", 96, 11, 4, 2, True), ("relu", "relu1"), ("maxpool", "pool1", 3, 2, 0),
    ("conv", "conv2", 256, 5, 1, 2, True), ("relu", "relu2"), ("maxpool", "pool2", 3, 2, 0),
    ("conv", "conv3", 384, 3, 1, 1, True), ("relu", "relu3"),
    ("conv", "conv4", 384, 3, 1, 1, True), ("relu", "relu4"),
    ("conv", "conv5", 256, 3, 1, 1, True), ("relu", "relu5"), ("maxpool", "pool3", 3, 2, 0),
    ("flatten", "flatten"),
    ("dense", "fc1", 4096), ("relu", "relu6"), ("dropout", "drop1", 0.5),
    ("dense", "fc2", 4096), ("relu", "relu7"), ("dropout", "drop2", 0.5),
    ("dense", "fc3", 0),
]


def _resnet(kind: str, blocks: tuple[int, int, int, int]) -> list[Layer]:
    layers: list[Layer] = [
        ("conv", "conv1", 64, 7, 2, 3, False), ("bn", "bn1"), ("relu", "relu1"),
        ("maxpool", "pool1", 3, 2, 1),
    ]
    for stage, (count, width) in enumerate(zip(blocks, (64, 128, 256, 512)), start=2):
        for i in range(count):
            stride = 2 if i == 0 and stage > 2 else 1
            layers.append(("block", f"res{stage}{chr(ord('a') + i)}", kind, width, stride))
    layers += [("gap", "gap"), ("dense", "fc", 0)]
    return layers


RESNET18 = _resnet("basic", (2, 2, 2, 2))
RESNET50 = _resnet("bottleneck", (3, 4, 6, 3))

MODELS: dict[str, list[Layer]] = {
    "lenet5": LENET5, "cifar_cnn": CIFAR_CNN, "alexnet": ALEXNET,
    "resnet18": RESNET18, "resnet50": RESNET50,
}
# The networks whose layer-wise forward / backward times the studies report (D, E).
LAYERWISE = ("lenet5", "alexnet")


def sequential_models() -> tuple[str, ...]:
    """Models without residual blocks: the ones whose layers can be timed one by one
    (``layer_profile``)."""
    return tuple(name for name, layers in MODELS.items() if all(layer[0] != "block" for layer in layers))


def block_layers(name: str, kind: str, in_ch: int, width: int, stride: int) -> tuple[list[Layer], list[Layer]]:
    """(main path, shortcut path) of a ResNet block; the shortcut is empty for identity."""
    if kind == "basic":
        out_ch = width
        main: list[Layer] = [
            ("conv", f"{name}_conv1", width, 3, stride, 1, False), ("bn", f"{name}_bn1"), ("relu", f"{name}_relu1"),
            ("conv", f"{name}_conv2", width, 3, 1, 1, False), ("bn", f"{name}_bn2"),
        ]
    else:
        out_ch = width * 4
        main = [
            ("conv", f"{name}_conv1", width, 1, 1, 0, False), ("bn", f"{name}_bn1"), ("relu", f"{name}_relu1"),
            ("conv", f"{name}_conv2", width, 3, stride, 1, False), ("bn", f"{name}_bn2"), ("relu", f"{name}_relu2"),
            ("conv", f"{name}_conv3", out_ch, 1, 1, 0, False), ("bn", f"{name}_bn3"),
        ]
    shortcut: list[Layer] = []
    if stride != 1 or in_ch != out_ch:
        shortcut = [("conv", f"{name}_proj", out_ch, 1, stride, 0, False), ("bn", f"{name}_proj_bn")]
    return main, shortcut


def block_out_channels(kind: str, width: int) -> int:
    return width if kind == "basic" else width * 4


def _conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def walk(model: str, shape: tuple[int, int, int], classes: int) -> Iterator[dict[str, Any]]:
    """Every parameterised or shape-changing layer with its input / output shape, trainable
    parameters and forward FLOPs per sample.  Raises ValueError for an input too small."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    c, h, w = shape
    flat: int | None = None
    for layer in MODELS[model]:
        yield from _walk_layer(layer, classes, state := {"c": c, "h": h, "w": w, "flat": flat})
        c, h, w, flat = state["c"], state["h"], state["w"], state["flat"]
        if h <= 0 or w <= 0:
            raise ValueError(f"{model} needs a larger input than {shape[1]}×{shape[2]} "
                             f"(the feature map vanishes at {layer[1]})")


def _walk_layer(layer: Layer, classes: int, s: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind, name = layer[0], layer[1]
    if kind == "conv":
        _, _, out, k, stride, pad, bias = layer
        ho, wo = _conv_out(s["h"], k, stride, pad), _conv_out(s["w"], k, stride, pad)
        params = s["c"] * out * k * k + (out if bias else 0)
        yield {"name": name, "kind": kind, "in": (s["c"], s["h"], s["w"]), "out": (out, ho, wo),
               "params": params, "flops": 2 * s["c"] * out * k * k * max(ho, 0) * max(wo, 0)}
        s.update(c=out, h=ho, w=wo)
    elif kind == "bn":
        yield {"name": name, "kind": kind, "in": (s["c"], s["h"], s["w"]), "out": (s["c"], s["h"], s["w"]),
               "params": 2 * s["c"], "flops": 0}
    elif kind == "maxpool":
        _, _, k, stride, pad = layer
        ho, wo = _conv_out(s["h"], k, stride, pad), _conv_out(s["w"], k, stride, pad)
        yield {"name": name, "kind": kind, "in": (s["c"], s["h"], s["w"]), "out": (s["c"], ho, wo),
               "params": 0, "flops": 0}
        s.update(h=ho, w=wo)
    elif kind in ("flatten", "gap"):
        flat = s["c"] * s["h"] * s["w"] if kind == "flatten" else s["c"]
        yield {"name": name, "kind": kind, "in": (s["c"], s["h"], s["w"]), "out": (flat,), "params": 0, "flops": 0}
        s.update(flat=flat, c=flat, h=1, w=1)
    elif kind == "dense":
        out = layer[2] or classes
        yield {"name": name, "kind": kind, "in": (s["flat"],), "out": (out,),
               "params": s["flat"] * out + out, "flops": 2 * s["flat"] * out}
        s.update(flat=out, c=out)
    elif kind == "block":
        _, _, bkind, width, stride = layer
        main, shortcut = block_layers(name, bkind, s["c"], width, stride)
        start = dict(s)
        for sub in main:
            yield from _walk_layer(sub, classes, s)
        end = dict(s)
        s.update(start)
        for sub in shortcut:
            yield from _walk_layer(sub, classes, s)
        s.update(end)
    # relu and dropout change nothing that is counted


def param_count(model: str, shape: tuple[int, int, int], classes: int) -> int:
    return sum(layer["params"] for layer in walk(model, shape, classes))


def forward_flops(model: str, shape: tuple[int, int, int], classes: int) -> int:
    return sum(layer["flops"] for layer in walk(model, shape, classes))


# --- transformers ----------------------------------------------------------------------------
#
# A transformer is described by its sizes rather than a layer list: every framework builds the
# same pre-LayerNorm stack from them, and ``transformer_walk`` lists its units with their
# parameters and FLOPs, as ``walk`` does for the networks above.
#
# GPT (decoder): token embedding (vocab × width) + learned position embedding (positions ×
# width); ``layers`` blocks of x + attn(ln1(x)), x + mlp(ln2(x)) with causal multi-head
# attention (one fused q/k/v projection with bias, an output projection with bias) and a GELU
# MLP (width → mlp → width, biases); a final LayerNorm; the output head is the token
# embedding's transpose (tied, no bias).  GPT-2 small: 124,439,808 parameters.
#
# ViT (encoder): a patch × patch convolution of stride patch (with bias) into width channels,
# a learned class token, a learned position embedding for the patches and the class token, the
# same blocks without the causal mask, a final LayerNorm and a dense head on the class token.
# ViT-B/16 on 224 × 224 × 3 with 1,000 classes: 86,567,656 parameters.
#
# LayerNorm: epsilon 1e-5, scale and bias.  GELU: the exact (erf) form.  Initialisation, in
# every framework: weights of dense layers, embeddings and the patch convolution normal with
# std 0.02 (GPT-2's), biases 0, LayerNorm scale 1 and bias 0, the class token 0.
#
# FLOPs (multiply-adds × 2, one sample's forward pass) count the projections, the MLP, the
# head and the attention's two products over the full T × T (the causal mask's half is not
# subtracted: the kernels compute the full square); element-wise work (softmax, GELU,
# LayerNorm) is left out.

from dataclasses import dataclass  # noqa: E402  (kept beside the code that uses it)

TRANSFORMER_KINDS = ("gpt", "vit")
LN_EPSILON = 1e-5
INIT_STD = 0.02


@dataclass(frozen=True)
class Transformer:
    kind: str  # "gpt" (causal decoder over tokens) or "vit" (encoder over image patches)
    layers: int
    width: int  # the model (residual) width
    heads: int
    mlp: int  # the MLP's hidden width
    positions: int = 0  # gpt: the longest sequence its position embedding covers
    vocab: int = 0  # gpt: the token vocabulary (ids 0 .. vocab - 1)
    patch: int = 0  # vit: the side of a square patch

    @property
    def head_width(self) -> int:
        return self.width // self.heads


TRANSFORMERS: dict[str, Transformer] = {
    # trains on 2 CPU cores in about a minute (docs/TRANSFORMERS.md); byte-level vocabulary
    "gpt-tiny": Transformer("gpt", layers=2, width=64, heads=4, mlp=256, positions=128, vocab=256),
    # GPT-2 small (124 M): the sizes of Radford et al. 2019's smallest model
    "gpt2-small": Transformer("gpt", layers=12, width=768, heads=12, mlp=3072, positions=1024, vocab=50257),
    # 28 × 28 → 7 × 7 patches of 4 × 4; 32 × 32 → 8 × 8
    "vit-tiny": Transformer("vit", layers=2, width=64, heads=4, mlp=256, patch=4),
    # ViT-B/16 (Dosovitskiy et al. 2021), 86 M at 224 × 224
    "vit-b16": Transformer("vit", layers=12, width=768, heads=12, mlp=3072, patch=16),
}
LANGUAGE_MODELS = tuple(name for name, t in TRANSFORMERS.items() if t.kind == "gpt")
#: The groups the units of a transformer fall into (``layer_profile`` and the layer views).
TRANSFORMER_GROUPS = ("embedding", "attention", "mlp", "norm", "head")


def is_transformer(model: str) -> bool:
    return model in TRANSFORMERS


def is_language_model(model: str) -> bool:
    return model in LANGUAGE_MODELS


def vit_patches(model: str, shape: tuple[int, int, int]) -> int:
    """The number of patches of a ViT on a (C, H, W) input; ValueError when the patch does not
    divide the image."""
    t = TRANSFORMERS[model]
    _, h, w = shape
    if h % t.patch or w % t.patch:
        raise ValueError(f"{model} cuts images into {t.patch}×{t.patch} patches: {h}×{w} is not a multiple "
                         f"of {t.patch} (use images whose sides are)")
    return (h // t.patch) * (w // t.patch)


def sequence_problem(model: str, seq_len: int, vocab: int | None) -> str | None:
    """Why a language model cannot take sequences of ``seq_len`` tokens of a ``vocab``-token
    vocabulary, or None."""
    t = TRANSFORMERS[model]
    if seq_len > t.positions:
        return (f"{model} has {t.positions:,} positions: a sequence of {seq_len:,} tokens is longer than its "
                f"position embedding (use seq_len <= {t.positions:,})")
    if vocab is not None and vocab > t.vocab:
        return (f"vocabulary mismatch: the data has {vocab:,} token ids, {model}'s embedding has {t.vocab:,} "
                "rows (a token id past the last row has no embedding)")
    return None


def _block_units(t: Transformer, i: int, tokens: int) -> Iterator[dict[str, Any]]:
    d, m = t.width, t.mlp
    shape = (tokens, d)
    yield {"name": f"block{i}_ln1", "kind": "layernorm", "group": "norm", "in": shape, "out": shape,
           "params": 2 * d, "flops": 0}
    attention = 2 * tokens * 3 * d * d + 2 * tokens * d * d + 2 * 2 * tokens * tokens * d
    yield {"name": f"block{i}_attn", "kind": "attention", "group": "attention", "in": shape, "out": shape,
           "params": 3 * d * d + 3 * d + d * d + d, "flops": attention}
    yield {"name": f"block{i}_ln2", "kind": "layernorm", "group": "norm", "in": shape, "out": shape,
           "params": 2 * d, "flops": 0}
    yield {"name": f"block{i}_mlp", "kind": "mlp", "group": "mlp", "in": shape, "out": shape,
           "params": d * m + m + m * d + d, "flops": 2 * tokens * 2 * d * m}


def transformer_walk(model: str, *, seq_len: int = 0, shape: tuple[int, int, int] | None = None,
                     classes: int = 0) -> Iterator[dict[str, Any]]:
    """Every unit of a transformer, in order, with its input / output shape (tokens × width),
    group, trainable parameters and forward FLOPs per sample.  GPT: ``seq_len`` tokens (0: its
    positions); ViT: images of ``shape`` into ``classes``."""
    if model not in TRANSFORMERS:
        raise ValueError(f"unknown transformer {model!r} (known: {', '.join(TRANSFORMERS)})")
    t = TRANSFORMERS[model]
    d = t.width
    if t.kind == "gpt":
        tokens = seq_len or t.positions
        problem = sequence_problem(model, tokens, None)
        if problem:
            raise ValueError(problem)
        yield {"name": "embed", "kind": "embedding", "group": "embedding", "in": (tokens,), "out": (tokens, d),
               "params": t.vocab * d + t.positions * d, "flops": 0}
    else:
        if shape is None:
            raise ValueError(f"{model} needs the image shape")
        c = shape[0]
        patches = vit_patches(model, shape)
        tokens = patches + 1
        yield {"name": "embed", "kind": "embedding", "group": "embedding", "in": tuple(shape), "out": (tokens, d),
               "params": c * t.patch * t.patch * d + d + d + tokens * d,
               "flops": 2 * patches * c * t.patch * t.patch * d}
    for i in range(t.layers):
        yield from _block_units(t, i, tokens)
    yield {"name": "ln_f", "kind": "layernorm", "group": "norm", "in": (tokens, d), "out": (tokens, d),
           "params": 2 * d, "flops": 0}
    if t.kind == "gpt":  # tied: the embedding's rows are the head's weights
        yield {"name": "head", "kind": "head", "group": "head", "in": (tokens, d), "out": (tokens, t.vocab),
               "params": 0, "flops": 2 * tokens * d * t.vocab}
    else:
        out = classes or 1000
        yield {"name": "head", "kind": "head", "group": "head", "in": (d,), "out": (out,),
               "params": d * out + out, "flops": 2 * d * out}


def transformer_param_count(model: str, *, seq_len: int = 0, shape: tuple[int, int, int] | None = None,
                            classes: int = 0) -> int:
    return sum(u["params"] for u in transformer_walk(model, seq_len=seq_len, shape=shape, classes=classes))


def transformer_flops(model: str, *, seq_len: int = 0, shape: tuple[int, int, int] | None = None,
                      classes: int = 0) -> int:
    return sum(u["flops"] for u in transformer_walk(model, seq_len=seq_len, shape=shape, classes=classes))


def units(model: str, shape: tuple[int, ...], classes: int) -> Iterator[dict[str, Any]]:
    """Any model's units as the dataset gives its input: ``walk`` for a CNN, ``transformer_walk``
    for a transformer (``shape``: (seq_len,) for a language model, (C, H, W) for a ViT)."""
    if is_language_model(model):
        return transformer_walk(model, seq_len=shape[0])
    if is_transformer(model):
        return transformer_walk(model, shape=shape, classes=classes)  # type: ignore[arg-type]
    return walk(model, shape, classes)  # type: ignore[arg-type]


def model_flops(model: str, shape: tuple[int, ...], classes: int) -> int:
    """Forward FLOPs per sample of any model (``units``)."""
    return sum(u["flops"] for u in units(model, shape, classes))
