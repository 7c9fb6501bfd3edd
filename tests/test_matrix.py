"""matrix.toml: expansion, include / exclude, zip, identity, and malformed or hostile files."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrun.errors import MatrixError
from matrun.runner.planning.matrix import load_matrix
from matrun.runner.planning.identity import cell_id, plan_cells
from matrun.runner.planning.selection import parse_where, select


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(text, encoding="utf-8")
    return path


def labels(path: Path) -> list[dict]:
    return [{k: c.values[k] for k in ("threads", "batch_size", "lr")} for c in load_matrix(path).cells]


def test_cartesian_product_in_order(tmp_path):
    m = load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2]\nbatch_size = [64, 128, 256]\n"))
    assert [(c.values["threads"], c.values["batch_size"]) for c in m.cells] == [
        (1, 64), (1, 128), (1, 256), (2, 64), (2, 128), (2, 256)]
    assert m.cells[0].varying == ("batch_size", "threads")
    assert m.cells[0].label == "batch_size=64 threads=1"


def test_defaults_sweep_settings_and_paths_relative_to_file(tmp_path):
    m = load_matrix(write(tmp_path, '[sweep]\nname = "s1"\nrepeats = 3\ntimeout = 90\n'))
    assert m.sweep.name == "s1" and m.sweep.repeats == 3 and m.sweep.timeout == 90.0
    assert m.sweep.results == tmp_path / "results"
    assert m.sweep.warehouse == tmp_path / "matrun.duckdb"
    (cell,) = m.cells
    assert cell.values["timeout"] == 90.0
    assert cell.values["threads"] == "unset" and cell.values["model"] == "lenet5"


def test_fixed_values_apply_to_every_cell(tmp_path):
    m = load_matrix(write(tmp_path, '[fixed]\nepochs = 3\noptimizer = "adam"\n[axes]\nthreads = [1, 2]\n'))
    assert {c.values["epochs"] for c in m.cells} == {3}
    assert {c.values["momentum"] for c in m.cells} == {None}  # adam has no momentum: canonicalised away


def test_zip_moves_values_together(tmp_path):
    path = write(tmp_path, "[axes]\nthreads = [1, 2]\n[[zip]]\nbatch_size = [64, 512]\nlr = [0.01, 0.05]\n")
    assert labels(path) == [
        {"threads": 1, "batch_size": 64, "lr": 0.01}, {"threads": 1, "batch_size": 512, "lr": 0.05},
        {"threads": 2, "batch_size": 64, "lr": 0.01}, {"threads": 2, "batch_size": 512, "lr": 0.05}]


def test_exclude_and_include(tmp_path):
    path = write(tmp_path, """
[axes]
threads = [1, 2]
batch_size = [64, 512]
[[exclude]]
threads = 1
batch_size = [512]
[[include]]
threads = 2
batch_size = 1024
lr = 0.1
[[include]]
threads = 2
batch_size = 64
""")
    assert labels(path) == [
        {"threads": 1, "batch_size": 64, "lr": 0.01},
        {"threads": 2, "batch_size": 64, "lr": 0.01},
        {"threads": 2, "batch_size": 512, "lr": 0.01},
        {"threads": 2, "batch_size": 1024, "lr": 0.1},
    ]  # the second include repeats an existing cell and is kept once


def test_iterations_make_epochs_irrelevant_to_identity(tmp_path):
    a = load_matrix(write(tmp_path, "[fixed]\niterations = 50\nepochs = 1\n")).cells[0]
    b = load_matrix(write(tmp_path, "[fixed]\niterations = 50\nepochs = 7\n")).cells[0]
    assert a.values["epochs"] is None
    assert cell_id(a.identity, "env") == cell_id(b.identity, "env")


def test_identity_is_stable_and_sensitive(tmp_path):
    one = load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2]\n")).cells
    again = load_matrix(write(tmp_path, "# comment\n[axes]\nthreads = [1, 2]\n[sweep]\ntimeout = 5\n")).cells
    ids = [cell_id(c.identity, "torch-cpu-aaaa") for c in one]
    # Same parameters → same ids, whatever the file's layout, and the timeout is not identity.
    assert ids == [cell_id(c.identity, "torch-cpu-aaaa") for c in again]
    assert len(set(ids)) == 2
    # A golden value: changing the canonical form would silently re-run every user's sweep.
    assert ids[0] == cell_id(dict(one[0].identity), "torch-cpu-aaaa")
    assert len(ids[0]) == 16 and all(ch in "0123456789abcdef" for ch in ids[0])
    # Another environment → another id.
    assert cell_id(one[0].identity, "torch-cpu-bbbb") != ids[0]
    changed = load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2]\n[fixed]\nseed = 1\n")).cells
    assert cell_id(changed[0].identity, "torch-cpu-aaaa") != ids[0]


def test_cell_id_golden():
    assert cell_id({"threads": 1, "batch_size": 64}, "torch-cpu-000000000000") == \
        cell_id({"batch_size": 64, "threads": 1}, "torch-cpu-000000000000")


def test_where_selects_a_slice(tmp_path):
    m = load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2]\nbatch_size = [64, 512]\nonednn = [true, false]\n"))
    planned = plan_cells(m, lambda fw, v: "env")
    chosen = select(planned, parse_where(["threads=2", "batch_size=64,512", "onednn=false"]))
    assert [(p.params["threads"], p.params["batch_size"], p.params["onednn"]) for p in chosen] == [
        (2, 64, False), (2, 512, False)]
    by_id = select(planned, parse_where([f"cell={planned[0].cell_id[:6]}"]))
    assert by_id == [planned[0]]


@pytest.mark.parametrize("where, message", [
    (["threads"], "--where 'threads': expected KEY=VALUE[,VALUE…], e.g. threads=1,2"),
    (["colour=red"], "--where 'colour=red': unknown parameter 'colour'"),
    (["threads=64"], "--where matches no cell of the matrix"),
])
def test_bad_where(tmp_path, where, message):
    m = load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2]\n"))
    with pytest.raises(Exception) as info:
        select(plan_cells(m, lambda fw, v: "env"), parse_where(where))
    assert str(info.value).startswith(message)
    assert info.value.exit_code == 2


BAD = [
    ("unknown section", "[axis]\nthreads = [1]\n",
     "matrix.toml: [axis] unknown section; expected one of sweep, fixed, axes, zip, include, exclude"),
    ("unknown parameter", "[axes]\ncolour = [1]\n",
     "matrix.toml: [axes -> colour] unknown parameter; known: "),
    ("wrong type in an axis", '[axes]\nbatch_size = [64, 128, "big"]\n',
     'matrix.toml: [axes -> batch_size -> 2] expected a positive integer, got "big"'),
    ("negative batch", "[fixed]\nbatch_size = -8\n",
     "matrix.toml: [fixed -> batch_size] expected a positive integer at most 1,048,576, got -8"),
    ("boolean for an integer", "[fixed]\nepochs = true\n",
     "matrix.toml: [fixed -> epochs] expected a positive integer, got true"),
    ("empty axis", "[axes]\nthreads = []\n",
     "matrix.toml: [axes -> threads] is empty: an axis needs at least one value"),
    ("axis not a list", "[axes]\nthreads = 2\n",
     "matrix.toml: [axes -> threads] expected a list of values, got 2"),
    ("empty product", "[axes]\nthreads = [1]\n[[exclude]]\nthreads = 1\n",
     "matrix.toml: [exclude] every combination is excluded: the matrix expands to no cells"),
    ("huge product", "[axes]\nseed = [" + ", ".join(map(str, range(200))) + "]\nbatch_size = ["
     + ", ".join(map(str, range(1, 201))) + "]\n",
     "matrix.toml: [axes] the matrix expands to 40,000 cells, over the limit of 10,000; "
     "narrow the axes or raise [sweep] max_cells"),
    ("shell metacharacters in a choice", '[fixed]\nmodel = "lenet5; rm -rf ~"\n',
     'matrix.toml: [fixed -> model] expected one of "lenet5", "cifar_cnn", "alexnet", "resnet18", "resnet50", '
     '"gpt-tiny", "gpt2-small", "vit-tiny", "vit-b16", got "lenet5; rm -rf ~"'),
    ("shell metacharacters in a cpuset", '[fixed]\ncpuset = "0-1 $(touch /tmp/pwned)"\n',
     'matrix.toml: [fixed -> cpuset] expected a CPU list such as "0-3,6" (or "" for no pinning), '
     'got "0-1 $(touch /tmp/pwned)"'),
    ("path traversal in the sweep name", '[sweep]\nname = "../../etc"\n',
     "matrix.toml: [sweep -> name] expected a name of letters, digits, '.', '_' or '-' (at most 64, "
     'not starting with \'.\' or \'-\'), got "../../etc"'),
    ("backquotes in the variant", '[fixed]\nvariant = "cpu`id`"\n',
     "matrix.toml: [fixed -> variant] expected a variant name of lower-case letters, digits, '.', '_' "
     'or \'-\', got "cpu`id`"'),
    ("unknown variant", '[fixed]\nvariant = "rocm"\n',
     'matrix.toml: [fixed] torch has no variant "rocm"; known: cpu, cuda, cuda-pypi, cpu-openblas, cpu-blis, '
     "cpu-reference (images/torch/framework.toml)"),
    ("gpu cell of a cpu variant", '[fixed]\nframework = "mxnet"\ndevice = "gpu"\n',
     'matrix.toml: [fixed] variant "cpu" of mxnet is a CPU build; a gpu cell needs one of: cu117'),
    ("memory limit with a shell", '[fixed]\nmemory_limit = "1g; reboot"\n',
     'matrix.toml: [fixed -> memory_limit] expected a memory size such as "512m" or "2g" (0: no limit), '
     'got "1g; reboot"'),
    ("memory limit below the engine's minimum", '[fixed]\nmemory_limit = "1m"\n',
     'matrix.toml: [fixed -> memory_limit] expected a memory limit from 6m to 1024t (0: no limit), got "1m"'),
    ("negative memory limit", "[fixed]\nmemory_limit = -5\n",
     "matrix.toml: [fixed -> memory_limit] expected a memory limit from 6m to 1024t (0: no limit), got -5"),
    ("boolean memory limit", "[fixed]\nmemory_limit = true\n",
     'matrix.toml: [fixed -> memory_limit] expected a memory size such as "512m" or "2g" (0: no limit), got true'),
    ("NaN learning rate", "[fixed]\nlr = nan\n",
     "matrix.toml: [fixed -> lr] expected a positive learning rate, got nan"),
    ("momentum out of range", "[axes]\nmomentum = [0.9, 1.5]\n",
     "matrix.toml: [axes -> momentum -> 1] expected a momentum in [0, 1), got 1.5"),
    ("threads zero", "[axes]\nthreads = [0]\n",
     'matrix.toml: [axes -> threads -> 0] expected a thread count from 1 to 1024 or "unset", got 0'),
    ("same key in fixed and axes", "[fixed]\nthreads = 1\n[axes]\nthreads = [1, 2]\n",
     "matrix.toml: [axes -> threads] is also set in [fixed -> threads]; set it in one place"),
    ("zip lengths differ", "[[zip]]\nbatch_size = [64, 512]\nlr = [0.01]\n",
     "matrix.toml: [zip -> 0] zipped lists must have the same length: batch_size has 2, lr has 1"),
    ("duplicate axis values", "[axes]\nthreads = [2, 2]\n",
     "matrix.toml: [axes -> threads] lists the same value twice"),
    ("unknown sweep key", "[sweep]\nresult = 'x'\n",
     "matrix.toml: [sweep -> result] unknown key; expected one of name, results, warehouse, data_dir, "
     "repeats, timeout, executor, max_cells"),
    ("repeats zero", "[sweep]\nrepeats = 0\n",
     "matrix.toml: [sweep -> repeats] expected a repeat count from 1 to 1000, or a table { min, max, max_time } "
     "(adaptive repeats), got 0"),
    ("unknown executor", '[sweep]\nexecutor = "kubernetes"\n',
     'matrix.toml: [sweep -> executor] expected one of auto, local, docker, slurm, got "kubernetes"'),
    ("no timed steps", "[fixed]\niterations = 5\nwarmup_steps = 5\n",
     "matrix.toml: [fixed] warmup_steps = 5 leaves no timed steps"),
    ("bad include", "[[include]]\ndataset = \"imagenet\"\n",
     'matrix.toml: [include -> 0 -> dataset] expected one of "fashion-mnist", "mnist", "cifar10", "synthetic", '
     '"synthetic-text", "fortunes", got "imagenet"'),
    ("synthetic shape", "[fixed]\ndataset = \"synthetic\"\nsynthetic_shape = [1, 28]\n",
     "matrix.toml: [fixed -> synthetic_shape] expected [channels, height, width], three integers from 1 to 4096, got [1, 28]"),
    ("section of the wrong type", "fixed = 3\n",
     "matrix.toml: [fixed] expected a table of parameter = value, got 3"),
    ("cpuset backwards", '[fixed]\ncpuset = "3-1"\n',
     'matrix.toml: [fixed -> cpuset] CPU range "3-1" runs backwards'),
]


@pytest.mark.parametrize("name, text, message", BAD, ids=[b[0] for b in BAD])
def test_malformed_matrix(tmp_path, name, text, message):
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, text))
    assert str(info.value).startswith(message)
    assert info.value.exit_code == 2


def test_toml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, "[axes]\nthreads = [1, 2\nbatch_size = 3\n"))
    assert str(info.value).startswith("matrix.toml: invalid TOML: ")
    assert "line 3" in str(info.value)


def test_all_errors_reported_together(tmp_path):
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, '[fixed]\nepochs = 0\nbatch_size = "x"\n'))
    assert str(info.value).splitlines() == [
        "matrix.toml: [fixed -> epochs] expected a positive integer at most 100,000, got 0",
        'matrix.toml: [fixed -> batch_size] expected a positive integer, got "x"',
    ]


def test_missing_and_unreadable_file(tmp_path):
    with pytest.raises(MatrixError, match="no such matrix file"):
        load_matrix(tmp_path / "nope.toml")
    bad = tmp_path / "bin.toml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(MatrixError, match="cannot read"):
        load_matrix(bad)


def test_repository_matrix_is_valid():
    repo_matrix = Path(__file__).resolve().parents[1] / "matrix.toml"
    m = load_matrix(repo_matrix)
    assert len(m.cells) == 12 and m.sweep.repeats == 4
    assert m.study is not None and m.study.id == "demo" and [f.id for f in m.study.findings] == ["threads-speed-up"]
    assert {c.values["framework"] for c in m.cells} == {"torch", "tensorflow", "mxnet", "jax"}
    # each framework once at its own defaults, for `matrun advise` (the default_cells view's rule)
    defaults = {c.values["framework"]: c.values for c in m.cells if c.values["threads"] == "unset"}
    assert sorted(defaults) == ["jax", "mxnet", "tensorflow", "torch"]
    assert all(v["preset"] == "framework-default" for v in defaults.values())
    assert {fw: v["layout"] for fw, v in defaults.items()} == {
        "torch": "nchw", "tensorflow": "nhwc", "mxnet": "nchw", "jax": "nhwc"}


# -- knobs, presets and what a framework cannot do -------------------------------------------


def test_framework_default_preset_fills_only_what_the_matrix_leaves_open(tmp_path):
    m = load_matrix(write(tmp_path, '[fixed]\npreset = "framework-default"\ndataset = "fashion-mnist"\n'
                                    "epochs = 2\n"))
    (cell,) = m.cells
    # pytorch/examples mnist: Adadelta, lr 1.0, batch 64 — but the matrix's own epochs win.
    assert (cell.values["optimizer"], cell.values["lr"], cell.values["batch_size"], cell.values["epochs"]) == \
        ("adadelta", 1.0, 64, 2)
    assert cell.values["momentum"] is None  # not an SGD cell


def test_preset_without_an_example_for_the_dataset(tmp_path):
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, '[fixed]\npreset = "framework-default"\ndataset = "synthetic"\n'))
    assert str(info.value) == ('matrix.toml: [fixed] preset "framework-default" has no torch example for '
                               "dataset 'synthetic' (it has: mnist, fashion-mnist, cifar10)")


def test_inference_cells_drop_training_settings(tmp_path):
    (cell,) = load_matrix(write(tmp_path, '[fixed]\nmode = "inference"\nlr = 0.5\n')).cells
    assert [cell.values[k] for k in ("optimizer", "lr", "momentum", "weight_decay", "epochs")] == [None] * 5


IMPOSSIBLE = [
    ("fp16 on the CPU", '[fixed]\nprecision = "fp16"\n',
     "matrix.toml: [fixed] torch cannot run this cell: PyTorch has no fp16 mixed-precision training on the "
     "CPU (autocast on the CPU is bf16)"),
    ("tf32 on the CPU", '[axes]\nprecision = ["fp32", "tf32"]\n',
     'matrix.toml: [axes] {precision = "tf32"}: torch cannot run this cell: TF32 is a feature of NVIDIA '
     "Ampere and later GPUs"),
    ("autotune on the CPU", '[fixed]\nconv_algo = "autotune"\n',
     'matrix.toml: [fixed] conv_algo = "autotune" needs device = "gpu" (it selects cuDNN convolution algorithms)'),
    ("layer profile of a residual network", '[fixed]\nmodel = "resnet18"\nlayer_profile = true\n',
     "matrix.toml: [fixed] layer_profile needs a sequential network (lenet5, cifar_cnn, alexnet) or a transformer, not resnet18"),
]


@pytest.mark.parametrize("name, text, message", IMPOSSIBLE, ids=[i[0] for i in IMPOSSIBLE])
def test_impossible_cells_fail_at_plan_time(tmp_path, name, text, message):
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, text))
    assert str(info.value) == message


def test_gpu_cells_are_planned_with_their_gpu_count(tmp_path):
    cells = load_matrix(write(tmp_path, '[fixed]\ndevice = "gpu"\nvariant = "cuda"\nconv_algo = "autotune"\n'
                                        'precision = "fp16"\n[axes]\ngpus = [1, 2]\n')).cells
    assert [(c.values["gpus"], c.values["precision"]) for c in cells] == [(1, "fp16"), (2, "fp16")]
    (cpu,) = load_matrix(write(tmp_path, "[fixed]\ngpus = 4\n")).cells
    assert cpu.values["gpus"] is None  # a CPU cell has no GPU count: it does not split identity


def test_gpu_cells_left_unset_run_at_each_frameworks_own_conv_algo_and_layout(tmp_path):
    """Issue 26: a GPU cell that does not name conv_algo / layout gets the framework's own
    default ([defaults] of its framework.toml), resolved when the matrix is read; an explicit
    value is kept; CPU cells keep matrun's defaults (and their ids)."""
    text = ('[fixed]\ndevice = "gpu"\n[[zip]]\nframework = ["torch", "jax", "tensorflow", "mxnet"]\n'
            'variant = ["cuda", "cuda", "cuda", "cu117"]\n')
    got = {c.values["framework"]: (c.values["conv_algo"], c.values["layout"])
           for c in load_matrix(write(tmp_path, text)).cells}
    assert got == {"torch": ("heuristic", "nchw"), "jax": ("autotune", "nhwc"),
                   "tensorflow": ("autotune", "nhwc"), "mxnet": ("autotune", "nchw")}
    explicit = text.replace('device = "gpu"\n', 'device = "gpu"\nconv_algo = "heuristic"\nlayout = "nchw"\n')
    assert {c.values["framework"]: (c.values["conv_algo"], c.values["layout"])
            for c in load_matrix(write(tmp_path, explicit)).cells} == dict.fromkeys(got, ("heuristic", "nchw"))
    # an axis names it too: only the values written run
    (cell,) = load_matrix(write(tmp_path, '[fixed]\ndevice = "gpu"\nvariant = "cuda"\nframework = "jax"\n'
                                          '[axes]\nconv_algo = ["heuristic"]\n')).cells
    assert (cell.values["conv_algo"], cell.values["layout"]) == ("heuristic", "nhwc")
    # the resolved value is the cell's: in its identity (JAX's GPU cell id moved), torch's unchanged
    cells = {c.values["framework"]: c for c in load_matrix(write(tmp_path, text)).cells}
    assert cells["jax"].identity["conv_algo"] == "autotune" and cells["jax"].identity["layout"] == "nhwc"
    assert "conv_algo" not in cells["torch"].identity and "layout" not in cells["torch"].identity
    cpu = {c.values["framework"]: (c.values["conv_algo"], c.values["layout"]) for c in load_matrix(write(
        tmp_path, '[axes]\nframework = ["torch", "jax", "tensorflow", "mxnet"]\n')).cells}
    assert cpu == dict.fromkeys(cpu, ("heuristic", "nchw")) and len(cpu) == 4


def test_identity_leaves_out_defaults_so_new_parameters_keep_old_ids(tmp_path):
    (cell,) = load_matrix(write(tmp_path, "[fixed]\nthreads = 2\nbatch_size = 128\n")).cells
    assert cell.identity == {"threads": 2, "batch_size": 128}
    (explicit,) = load_matrix(write(tmp_path, '[fixed]\nthreads = 2\nbatch_size = 128\nlayout = "nchw"\n')).cells
    assert cell_id(explicit.identity, "e") == cell_id(cell.identity, "e")


def test_zip_values_may_repeat_but_rows_may_not(tmp_path):
    cells = load_matrix(write(tmp_path, "[[zip]]\nbatch_size = [64, 64, 128]\nlr = [0.01, 0.05, 0.05]\n")).cells
    assert [(c.values["batch_size"], c.values["lr"]) for c in cells] == [(64, 0.01), (64, 0.05), (128, 0.05)]
    with pytest.raises(MatrixError) as info:
        load_matrix(write(tmp_path, "[[zip]]\nbatch_size = [64, 64]\nlr = [0.01, 0.01]\n"))
    assert str(info.value) == "matrix.toml: [zip -> 0] lists the same combination twice"


def test_every_study_in_the_repository_is_valid():
    studies = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.toml"))
    assert studies
    for path in studies:
        assert load_matrix(path).cells, path


def test_memory_limits_are_bytes_and_spellings_of_one_limit_are_one_value(tmp_path):
    cells = load_matrix(write(tmp_path, '[axes]\nmemory_limit = ["512m", "2G", 100000000, 0]\n')).cells
    assert [c.values["memory_limit"] for c in cells] == [512 * 2**20, 2 * 2**30, 100_000_000, 0]
    assert "memory_limit" not in cells[-1].identity  # 0 is the default: old cell ids stay
    with pytest.raises(MatrixError) as err:
        load_matrix(write(tmp_path, '[axes]\nmemory_limit = ["512m", 536870912]\n'))
    assert str(err.value) == "matrix.toml: [axes -> memory_limit] lists the same value twice"


# --- one declaration of the parameters (runner/harness/spec.py) ------------------------------


def test_the_hosts_registry_is_the_harness_declaration():
    from dataclasses import replace

    from matrun.frameworks import default_framework, frameworks
    from matrun.runner.harness import spec
    from matrun.runner.planning.params import HOST_BOUNDED, MAX_LIMIT, MAX_TIMEOUT, PARAMS

    assert list(PARAMS) == list(spec.PARAMS)
    for name, param in PARAMS.items():
        if name in HOST_BOUNDED:  # the same declaration, with a bound the harness need not check
            assert param == replace(spec.PARAMS[name], check=param.check)
        elif name != "framework":
            assert param is spec.PARAMS[name]
    for name, inside, beyond in [("train_limit", MAX_LIMIT, MAX_LIMIT + 1),
                                 ("test_limit", MAX_LIMIT, MAX_LIMIT + 1),
                                 ("timeout", MAX_TIMEOUT, MAX_TIMEOUT + 0.5)]:
        assert PARAMS[name].check(inside) == spec.PARAMS[name].check(inside)
        spec.PARAMS[name].check(beyond)
        with pytest.raises(spec.ParamError):
            PARAMS[name].check(beyond)
    # the host adds only what it knows: the frameworks it can build, and the default one
    # (the framework.toml that says default = true); spec.json always names it
    assert PARAMS["framework"].choices == tuple(frameworks())
    assert PARAMS["framework"].default == default_framework() == "torch"
    assert spec.PARAMS["framework"].default == ""
    assert spec.PARAMS["dataset"].choices == ("fashion-mnist", "mnist", "cifar10", "synthetic", "synthetic-text",
                                              "fortunes")


def test_the_host_nulls_exactly_the_unused_keys():
    """matrix.canonical and the harness share one rule (spec.unused_keys): every null of every
    cell of the repository's matrices is an unused key, and every unused key is null."""
    from matrun.runner.harness.spec import unused_keys

    root = Path(__file__).resolve().parents[1]
    for path in [root / "matrix.toml", *sorted((root / "studies").glob("*.toml"))]:
        for cell in load_matrix(path).cells:
            nulls = {k for k, v in cell.values.items() if v is None}
            assert nulls == unused_keys(cell.values), (path.name, cell.label)


def test_unused_keys_follow_the_cell(tmp_path):
    text = ('[fixed]\ndataset = "synthetic"\n[[include]]\nmode = "inference"\n'
            '[[include]]\noptimizer = "adam"\niterations = 50\n[[include]]\nframework = "mxnet"\n')
    base, inference, adam, mxnet = load_matrix(write(tmp_path, text)).cells
    cnn = {"seq_len", "synthetic_vocab"}  # the language models' keys
    assert {k for k, v in base.values.items() if v is None} == {"gpus", "kvstore"} | cnn
    assert {k for k, v in inference.values.items() if v is None} == {
        "optimizer", "lr", "momentum", "weight_decay", "epochs", "gpus", "kvstore"} | cnn
    assert {k for k, v in adam.values.items() if v is None} == {"momentum", "epochs", "gpus", "kvstore"} | cnn
    assert {k for k, v in mxnet.values.items() if v is None} == {"gpus"} | cnn


def test_relative_paths_are_normalised(tmp_path):
    # A container sees only the folders mounted into it: `study/../results` must reach the
    # docker and slurm executors as `results` (the studies/ files use "../results").
    study = tmp_path / "studies"
    study.mkdir()
    (study / "m.toml").write_text('[sweep]\nname = "n"\nresults = "../results"\nwarehouse = "../w.duckdb"\n'
                                  '[fixed]\nframework = "torch"\n')
    m = load_matrix(study / "m.toml")
    assert m.sweep.results == tmp_path.resolve() / "results"
    assert m.sweep.warehouse == tmp_path.resolve() / "w.duckdb"
