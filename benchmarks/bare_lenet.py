"""The bare training loop: LeNet-5 on Fashion-MNIST with torch only, no matrun at all.

Run in the same virtual environment as the harness, with the same threads, by
benchmarks/harness_overhead.py.  Prints one JSON line: the median over timed steps of
images/second, measured exactly as the harness defines throughput, and the median timed
step's seconds (what the benchmark classifies the process's speed mode by).

    python bare_lenet.py DATA_DIR THREADS BATCH STEPS WARMUP
"""

import gzip
import json
import statistics
import sys
import time

import torch
from torch import nn


def idx(path: str) -> torch.Tensor:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def main() -> None:
    data_dir, threads, batch, steps, warmup = sys.argv[1], *map(int, sys.argv[2:6])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = idx(f"{data_dir}/fashion-mnist/train-images-idx3-ubyte.gz").float().div(255).sub(0.5).div(0.5).unsqueeze(1)
    y = idx(f"{data_dir}/fashion-mnist/train-labels-idx1-ubyte.gz").long()
    model = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(len(x))
    xs, ys = x[order], y[order]  # shuffled once per epoch, then sliced: as the harness does
    rates, seconds_list = [], []
    for step in range(steps):
        start = (step * batch) % len(x)
        xb, yb = xs[start:start + batch], ys[start:start + batch]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        seconds = time.perf_counter() - t0
        if step >= warmup:
            rates.append(len(xb) / seconds)
            seconds_list.append(seconds)
    print(json.dumps({"throughput": statistics.median(rates), "timed_steps": len(rates),
                      "step_seconds_median": statistics.median(seconds_list)}))


if __name__ == "__main__":
    main()
