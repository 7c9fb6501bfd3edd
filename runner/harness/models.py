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
