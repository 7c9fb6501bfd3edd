"""The transformers of the zoo as data (models.TRANSFORMERS), the token data (harness/text.py),
the cell keys that go with them (seq_len, synthetic_vocab, compile, attention) and what the
host refuses before anything runs.  The frameworks' own builds are tested against these
numbers in tests/test_transformers_torch.py (and each framework's file)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from matrun.runner.harness import datasets, models, text
from matrun.runner.harness.errors import DataError
from matrun.errors import MatrixError
from matrun.runner.harness.spec import PARAMS, transformer_problem, unused_keys
from matrun.runner.planning.matrix import load_matrix


def base(**over):
    values = {name: p.default for name, p in PARAMS.items()}
    values.update(framework="torch")
    values.update(over)
    return values


# --- the models as data --------------------------------------------------------------------

def test_the_published_sizes_have_their_published_parameter_counts():
    # GPT-2 small: 124,439,808 (Radford et al. 2019; Hugging Face's GPT2LMHeadModel, tied head)
    assert models.transformer_param_count("gpt2-small") == 124_439_808
    # ViT-B/16 at 224 × 224 with 1,000 classes: 86,567,656 (torchvision's vit_b_16)
    assert models.transformer_param_count("vit-b16", shape=(3, 224, 224), classes=1000) == 86_567_656


def test_the_tiny_models_counted_by_hand():
    d, m, v, p = 64, 256, 256, 128
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * m + m) + (m * d + d)
    assert models.transformer_param_count("gpt-tiny") == v * d + p * d + 2 * block + 2 * d
    patches = 49  # 28 × 28 in 4 × 4 patches
    vit = (1 * 4 * 4 * d + d) + d + (patches + 1) * d + 2 * block + 2 * d + (d * 10 + 10)
    assert models.transformer_param_count("vit-tiny", shape=(1, 28, 28), classes=10) == vit


def test_units_fall_into_the_layer_groups_and_flops_grow_with_the_sequence():
    units = list(models.transformer_walk("gpt-tiny", seq_len=64))
    assert [u["group"] for u in units[:5]] == ["embedding", "norm", "attention", "norm", "mlp"]
    assert {u["group"] for u in units} == set(models.TRANSFORMER_GROUPS)
    attention = {n: sum(u["flops"] for u in models.transformer_walk("gpt-tiny", seq_len=n) if u["group"] == "attention")
                 for n in (32, 64, 128)}
    mlp = {n: sum(u["flops"] for u in models.transformer_walk("gpt-tiny", seq_len=n) if u["group"] == "mlp")
           for n in (32, 64, 128)}
    # the MLP is linear in the tokens; attention's T × T products make its share grow
    assert mlp[128] == 4 * mlp[32]
    assert attention[128] / mlp[128] > attention[64] / mlp[64] > attention[32] / mlp[32]


def test_a_patch_that_does_not_divide_the_image_and_a_sequence_past_the_positions_are_refused():
    with pytest.raises(ValueError, match="not a multiple of 16"):
        models.transformer_param_count("vit-b16", shape=(1, 28, 28), classes=10)
    with pytest.raises(ValueError, match="128 positions"):
        list(models.transformer_walk("gpt-tiny", seq_len=129))
    assert "vocabulary mismatch" in models.sequence_problem("gpt-tiny", 64, 1000)
    assert models.sequence_problem("gpt2-small", 1024, 256) is None  # bytes fit GPT-2's vocabulary


# --- token data ----------------------------------------------------------------------------

def test_synthetic_text_depends_on_the_seed_alone_and_overlaps_by_one_token():
    a_train, a_test = text.synthetic_text(vocab=50, seq_len=16, train=20, test=5, seed=3)
    b_train, _ = text.synthetic_text(vocab=50, seq_len=16, train=20, test=5, seed=3)
    c_train, _ = text.synthetic_text(vocab=50, seq_len=16, train=20, test=5, seed=4)
    assert a_train.tokens == b_train.tokens and a_train.tokens != c_train.tokens
    assert a_train.count == 20 and a_test.count == 5 and len(a_train.tokens) == 20 * 16 + 1
    assert max(a_train.tokens) < 50
    np = pytest.importorskip("numpy")
    x, y = a_train.arrays(np)
    assert x.shape == y.shape == (20, 16)
    assert (x[1:, 0] == y[:-1, -1]).all()  # the last target of a sequence is the next one's first input
    assert (x[:, 1:] == y[:, :-1]).all()


def test_synthetic_text_follows_its_chain_so_it_can_be_learned():
    vocab = 64
    table = text.successor_table(vocab, 0)
    train, _ = text.synthetic_text(vocab=vocab, seq_len=32, train=400, test=1, seed=0)
    tokens = train.tokens
    follows = sum(tokens[i + 1] in table[tokens[i]] for i in range(len(tokens) - 1))
    assert follows == len(tokens) - 1
    first = sum(tokens[i + 1] == table[tokens[i]][0] for i in range(len(tokens) - 1)) / (len(tokens) - 1)
    assert 0.5 < first < 0.62  # the most likely successor, drawn with p = 141/256 (duplicates add a little)


def test_large_vocabularies_are_stored_wide():
    train, _ = text.synthetic_text(vocab=70_000, seq_len=4, train=3, test=1, seed=0)
    assert train.tokens.typecode == "I"


def fortune_dir(tmp_path: Path, n: int = 25) -> Path:
    root = tmp_path / "fortunes"
    root.mkdir()
    body = "\n%\n".join(f"Cookie number {i}.\n\t-- someone" for i in range(n))
    (root / "a-quotes").write_text(body + "\n%\n", encoding="utf-8")
    (root / "b-more").write_text("Ünïcode cookie\n%\nlast one\n", encoding="utf-8")
    (root / "a-quotes.dat").write_bytes(b"\x00\x00\x00\x02binary index")  # strfile's index: skipped
    (root / "a-quotes.u8").symlink_to(root / "a-quotes")  # Debian's .u8 links: skipped
    return root


def test_fortunes_are_read_in_their_own_format_with_every_tenth_cookie_for_test(tmp_path):
    root = fortune_dir(tmp_path)
    train, test, n = text.read_fortunes(root)
    assert n == 27
    assert test.count(b"\n\n") == 2 and b"Cookie number 9." in test and b"Cookie number 19." in test
    assert b"Cookie number 9." not in train and b"Cookie number 8." in train
    assert "Ünïcode".encode() in train  # bytes: UTF-8 is tokenised byte by byte
    splits = text.load_fortunes(root, 8)
    assert all(max(s.tokens) < 256 for s in splits)


def test_broken_fortune_directories_say_what_to_do(tmp_path):
    with pytest.raises(DataError, match="apt-get install fortunes"):
        text.fortune_files(tmp_path / "fortunes")
    (tmp_path / "fortunes").mkdir()
    with pytest.raises(DataError, match="no fortune files"):
        text.fortune_files(tmp_path / "fortunes")
    (tmp_path / "fortunes" / "bin").write_bytes(b"abc\x00def")
    with pytest.raises(DataError, match="NUL bytes"):
        text.read_fortunes(tmp_path / "fortunes")
    (tmp_path / "fortunes" / "bin").write_text("one\n%\ntwo\n")
    with pytest.raises(DataError, match="at least 10"):
        text.read_fortunes(tmp_path / "fortunes")


def test_a_language_model_cell_loads_sequences_with_limits_and_a_validation_split(tmp_path):
    params = base(model="gpt-tiny", dataset="synthetic-text", seq_len=32, synthetic_vocab=100,
                  synthetic_train=50, synthetic_test=10, train_limit=40, validation=5)
    ds = datasets.load(params, tmp_path)
    assert ds.shape == (32,) and ds.classes == 100
    assert (ds.train.count, ds.validation.count, ds.test.count) == (35, 5, 10)
    root = fortune_dir(tmp_path)
    ds = datasets.load(base(model="gpt-tiny", dataset="fortunes", seq_len=16), root.parent)
    assert ds.classes == 256 and ds.train.count == (len(text.read_fortunes(root)[0]) - 1) // 16
    with pytest.raises(DataError, match="too little text"):
        datasets.load(base(model="gpt-tiny", dataset="fortunes", seq_len=128), _tiny_fortunes(tmp_path))


def _tiny_fortunes(tmp_path: Path) -> Path:
    root = tmp_path / "tiny" / "fortunes"
    root.mkdir(parents=True)
    (root / "f").write_text("\n%\n".join("ab" for _ in range(12)))
    return root.parent


# --- the cell keys -------------------------------------------------------------------------

def test_transformer_keys_leave_every_other_cell_as_it_was():
    cnn = base()
    unused = unused_keys(cnn)
    assert {"seq_len", "synthetic_vocab"} <= unused and "layout" not in unused
    gpt = base(model="gpt-tiny", dataset="synthetic-text")
    assert "layout" in unused_keys(gpt) and "seq_len" not in unused_keys(gpt)
    assert {"synthetic_shape", "synthetic_classes"} <= unused_keys(gpt)
    assert not {"synthetic_vocab", "synthetic_train", "synthetic_test"} & unused_keys(gpt)  # its sequences
    fortunes = base(model="gpt-tiny", dataset="fortunes")
    assert {"synthetic_vocab", "synthetic_train", "synthetic_test"} <= unused_keys(fortunes)


@pytest.mark.parametrize("over, key, words", [
    ({"model": "gpt-tiny"}, "dataset", "needs token data"),
    ({"dataset": "fortunes"}, "dataset", "is token data"),
    ({"model": "gpt-tiny", "dataset": "fortunes", "seq_len": 4096}, "seq_len", "128 positions"),
    ({"model": "gpt-tiny", "dataset": "synthetic-text", "synthetic_vocab": 1000}, "synthetic_vocab",
     "vocabulary mismatch"),
    ({"model": "vit-b16", "dataset": "fashion-mnist"}, "model", "not a multiple of 16"),
    ({"model": "vit-tiny", "dataset": "synthetic", "synthetic_shape": [3, 30, 30]}, "synthetic_shape",
     "not a multiple of 4"),
    ({"model": "vit-tiny", "layout": "nhwc"}, "layout", "image layout"),
    ({"model": "vit-tiny", "input_pipeline": "loader"}, "input_pipeline", "preloaded"),
    ({"attention": "fused"}, "attention", "has no attention"),
])
def test_what_does_not_fit_a_transformer_is_named_by_its_key(over, key, words):
    found = transformer_problem(base(**over))
    assert found is not None and found[0] == key and words in found[1], found


def matrix(tmp_path: Path, body: str):
    path = tmp_path / "matrix.toml"
    path.write_text(body)
    return load_matrix(path)


@pytest.mark.parametrize("fixed, words", [
    ('framework = "theano"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"', "Theano 1.0.5 predates"),
    ('framework = "chainer"\nmodel = "vit-tiny"', "Chainer 7.8.1"),
    ('model = "gpt-tiny"\ndataset = "fortunes"\nlayout = "nhwc"', "layout is an image layout"),
    ('model = "gpt-tiny"\ndataset = "fortunes"\nseq_len = 129', "seq_len gpt-tiny has 128 positions"),
    ('compile = "fast"', 'compile'),
    ('framework = "mxnet"\nmodel = "vit-tiny"\nlayer_profile = true', "transformer_layer_profile = true"),
    ('framework = "jax"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\ncompile = "eager"', "no eager mode"),
    ('framework = "tensorflow"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nattention = "fused"',
     "no fused scaled-dot-product kernel"),
    ('attention = "fused"', "attention lenet5 has no attention"),
    ('framework = "theano"\ncompile = "eager"', "Theano compiles every graph into C"),
    ('framework = "chainer"\ncompile = "compiled"', "Chainer runs define-by-run"),
    ('framework = "jax"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nworkers = 2',
     "JAX transformers run on one device in one process"),
    ('framework = "tensorflow"\nmodel = "vit-tiny"\ndevice = "gpu"\nvariant = "cuda"\ngpus = 2',
     "TensorFlow transformers run on one device in one process"),
    ('framework = "mxnet"\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nprecision = "bf16"',
     "MXNet transformers run in fp32"),
])
def test_the_host_refuses_them_before_anything_runs(tmp_path, fixed, words):
    with pytest.raises(MatrixError) as caught:
        matrix(tmp_path, f"[fixed]\n{fixed}\n")
    assert words in str(caught.value)
    assert "Traceback" not in str(caught.value)


def test_a_transformer_cell_plans_with_its_keys_and_cnn_cells_keep_their_identity(tmp_path):
    m = matrix(tmp_path, '[fixed]\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nseq_len = 64\n'
                         '[axes]\ncompile = ["eager", "compiled"]\nattention = ["explicit", "fused"]\n')
    assert len(m.cells) == 4
    cell = m.cells[0]
    assert cell.values["layout"] is None and cell.values["seq_len"] == 64
    assert cell.values["synthetic_train"] == 2048 and cell.values["synthetic_test"] == 512  # what the cell reads
    assert cell.identity["seq_len"] == 64 and "layout" not in cell.identity
    plain = matrix(tmp_path, '[fixed]\nmodel = "lenet5"\n')
    assert not {"compile", "attention", "seq_len", "synthetic_vocab"} & set(plain.cells[0].identity)


def test_what_a_framework_refuses_for_transformers_alone_leaves_its_other_cells_alone(tmp_path):
    """The [[unsupported]] rules on derived facts: JAX's CNNs still run over two workers and
    MXNet's in bf16; PyTorch's transformers run over two workers (DistributedDataParallel)."""
    assert len(matrix(tmp_path, '[fixed]\nframework = "jax"\nmodel = "lenet5"\nworkers = 2\n').cells) == 1
    assert len(matrix(tmp_path, '[fixed]\nframework = "mxnet"\nprecision = "bf16"\n').cells) == 1
    assert len(matrix(tmp_path, '[fixed]\nmodel = "gpt-tiny"\ndataset = "synthetic-text"\nworkers = 2\n').cells) == 1



# --- staging the fortunes ------------------------------------------------------------------

def test_matrun_data_import_fortunes_copies_the_text_files_and_lists_them(tmp_path):
    from typer.testing import CliRunner

    from matrun.runner.cli.data import data_app

    source = fortune_dir(tmp_path)
    out = CliRunner().invoke(data_app, ["import", "fortunes", str(source), "--data-dir", str(tmp_path / "data")])
    assert out.exit_code == 0, out.output
    assert "train tokens" in out.output and "vocabulary 256" in out.output
    staged = tmp_path / "data" / "fortunes"
    assert sorted(p.name for p in staged.iterdir()) == ["a-quotes", "b-more", "matrun-import.json"]
    assert text.read_fortunes(staged)[:2] == text.read_fortunes(source)[:2]
    listed = CliRunner().invoke(data_app, ["list", "--data-dir", str(tmp_path / "data")])
    assert listed.exit_code == 0 and "fortunes" in listed.output
    datasets.require(tmp_path / "data", "fortunes")  # the sweep's preflight finds it


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "nothing-here", "no such file or directory"),
    (lambda p: (p / "f.txt").write_text("x") and p / "f.txt", "not a fortunes source"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no fortune files"),
])
def test_a_bad_fortunes_source_is_a_clear_error_and_stages_nothing(tmp_path, make, words):
    from typer.testing import CliRunner

    from matrun.runner.cli.data import data_app

    source = make(tmp_path)
    out = CliRunner().invoke(data_app, ["import", "fortunes", str(source), "--data-dir", str(tmp_path / "data")])
    assert out.exit_code == 2, out.output
    assert "Error:" in out.output and words in out.output and "Traceback" not in out.output
    assert not (tmp_path / "data" / "fortunes").exists()


# --- in the warehouse ----------------------------------------------------------------------

def test_a_language_model_run_shows_its_tokens_perplexity_and_compile_time_in_run_overview(tmp_path):
    from bundle_factory import make_bundle

    from matrun.warehouse.ingest import ingest
    from matrun.warehouse.query import run_query

    results = tmp_path / "results"
    params = {"model": "gpt-tiny", "dataset": "synthetic-text", "seq_len": 64, "compile": "compiled",
              "attention": "fused", "layout": None}
    make_bundle(results, sweep="lm", cell_id="1234567890abcdef", params=params, throughput=50.0,
                summary_extra={"seq_len": 64, "tokens_per_second": 3200.0, "test_loss": 1.5,
                               "perplexity": math.exp(1.5), "compilation": {"mode": "compiled", "seconds": 12.5}})
    make_bundle(results, sweep="lm", cell_id="fedcba0987654321", throughput=500.0)  # a CNN run beside it
    warehouse = tmp_path / "w.duckdb"
    ingest([results], warehouse=warehouse)
    columns, rows = run_query("SELECT model, compile, attention, seq_len, tokens_per_second, perplexity, "
                              "compile_seconds, layout FROM run_overview ORDER BY model", warehouse=warehouse)
    got = [dict(zip(columns, row)) for row in rows]
    assert got[0] == {"model": "gpt-tiny", "compile": "compiled", "attention": "fused", "seq_len": 64,
                      "tokens_per_second": 3200.0, "perplexity": pytest.approx(math.exp(1.5)),
                      "compile_seconds": 12.5, "layout": None}
    assert got[1]["tokens_per_second"] is None and got[1]["compile_seconds"] is None


def test_compilations_are_counted_inside_a_step_only_between_its_start_and_end():
    from matrun.runner.harness.events import inside_steps

    steps = [(0, 1.0, 2.0, 16), (0, 2.5, 3.0, 16), (1, 10.0, 11.0, 8)]
    assert inside_steps([], steps) == 0
    assert inside_steps([0.5, 2.2, 3.5, 9.9, 11.5], steps) == 0  # before, between and after the steps
    assert inside_steps([1.0, 2.0, 2.7, 10.5], steps) == 4  # a step's own start and end count
    assert inside_steps([1.5], []) == 0


def test_tokens_per_second_and_perplexity_are_cell_statistics_a_finding_can_test(tmp_path):
    """A language model's tokens/s and perplexity get a median in cell_stats and are metrics a
    study's findings test: tokens_per_second larger-is-better, perplexity smaller-is-better."""
    from bundle_factory import make_bundle
    from matrun.warehouse.db import open_warehouse
    from matrun.warehouse.findings import parse_study, register_study
    from matrun.warehouse.ingest import ingest
    from matrun.warehouse.query import run_query

    results = tmp_path / "results"
    cells = {"eager": ("e000000000000001", [1000.0, 1010.0, 1020.0, 1030.0], [3.50, 3.52, 3.54, 3.56]),
             "compiled": ("c000000000000001", [1500.0, 1510.0, 1520.0, 1530.0], [3.51, 3.53, 3.55, 3.57])}
    for mode, (cell_id, rates, ppl) in cells.items():
        for i, (rate, p) in enumerate(zip(rates, ppl)):
            make_bundle(results, sweep="lm", cell_id=cell_id, repeat=i, throughput=rate / 64,
                        params={"model": "gpt-tiny", "dataset": "synthetic-text", "compile": mode, "layout": None},
                        summary_extra={"seq_len": 64, "tokens_per_second": rate, "test_loss": math.log(p),
                                       "perplexity": p})
    warehouse = tmp_path / "w.duckdb"
    ingest([results], warehouse=warehouse)
    errors: list = []
    option = {"check": "option", "x": "compile", "value": "compiled", "ref": "eager"}
    decl = parse_study({"study": {"id": "lm", "title": "lm"}, "findings": [
        {"id": "faster", "claim": "c", "cite": "ours", **option, "metric": "tokens_per_second", "expect": "increases"},
        {"id": "lower-ppl", "claim": "c", "cite": "ours", **option, "metric": "perplexity", "expect": "decreases"},
        {"id": "same-ppl", "claim": "c", "cite": "ours", "check": "bounded", "x": "compile", "ref": "eager",
         "metric": "perplexity", "at_most": 0.05}]}, lambda where, message: errors.append((where, message)))
    assert not errors and decl is not None, errors
    with open_warehouse(warehouse) as wh:
        register_study(wh.con, decl, profile="quick", matrix="studies/lm.toml",
                       cell_ids=[c for c, _, _ in cells.values()])
    columns, rows = run_query("SELECT cell_id, tokens_per_second_median, perplexity_median FROM cell_stats "
                              "ORDER BY cell_id", warehouse=warehouse)
    assert rows == [("c000000000000001", 1515.0, pytest.approx(3.54)), ("e000000000000001", 1015.0,
                                                                         pytest.approx(3.53))]
    columns, rows = run_query("SELECT finding, verdict FROM findings WHERE study = 'lm' ORDER BY finding",
                              warehouse=warehouse)
    # 1.49x more tokens/s (reproduced); perplexity 0.3 % higher: not lower (no significant
    # change at 4 against 4), and within 5 % of eager (the bound's interval inside it)
    assert dict(rows) == {"faster": "reproduced", "lower-ppl": "not significant", "same-ppl": "reproduced"}


def test_a_layer_kinds_share_is_a_metric_so_attentions_growth_with_the_sequence_can_be_a_finding(tmp_path):
    """metric = "share:attention": the attention layers' share of each ok run's layer-profile
    time, tested like any metric (here a trend over seq_len)."""
    from bundle_factory import make_bundle
    from matrun.warehouse.db import open_warehouse
    from matrun.warehouse.findings import parse_study, register_study
    from matrun.warehouse.ingest import ingest
    from matrun.warehouse.query import run_query

    results = tmp_path / "results"
    cells = {16: ("5000000000000016", [0.10, 0.11, 0.12, 0.13]), 128: ("5000000000000128", [0.40, 0.42, 0.44, 0.46])}
    for seq_len, (cell_id, attention) in cells.items():
        for i, share in enumerate(attention):
            layers = [{"name": "block0.attn", "kind": "attention", "forward_seconds": share / 2,
                       "backward_seconds": share / 2},
                      {"name": "block0.mlp", "kind": "mlp", "forward_seconds": (1 - share) / 2,
                       "backward_seconds": (1 - share) / 2}]
            make_bundle(results, sweep="lm", cell_id=cell_id, repeat=i, layers=layers,
                        params={"model": "gpt-tiny", "dataset": "synthetic-text", "seq_len": seq_len,
                                "layout": None, "layer_profile": True})
    warehouse = tmp_path / "w.duckdb"
    ingest([results], warehouse=warehouse)
    errors: list = []
    decl = parse_study({"study": {"id": "lm", "title": "lm"}, "findings": [
        {"id": "grows", "claim": "c", "cite": "ours", "check": "trend", "x": "seq_len",
         "metric": "share:attention", "expect": "increases"},
        {"id": "shrinks", "claim": "c", "cite": "ours", "check": "trend", "x": "seq_len",
         "metric": "share:mlp", "expect": "increases"}]}, lambda where, message: errors.append((where, message)))
    assert not errors and decl is not None, errors
    with open_warehouse(warehouse) as wh:
        register_study(wh.con, decl, profile="quick", matrix="studies/lm.toml", cell_ids=[c for c, _ in cells.values()])
    columns, rows = run_query("SELECT finding, verdict, ratio, observed FROM findings WHERE study = 'lm' "
                              "ORDER BY finding", warehouse=warehouse)
    got = {r[0]: r for r in rows}
    assert got["grows"][1] == "reproduced" and got["grows"][2] == pytest.approx(0.43 / 0.115)
    assert "43.0 % of layer time" in got["grows"][3]
    assert got["shrinks"][1] == "contradicted"  # the MLP's share falls as attention's grows


@pytest.mark.parametrize("metric", ["share:", "share:Attention", "share:a b", "shares:attention"])
def test_a_share_metric_names_a_layer_kind(metric):
    from matrun.warehouse.findings import parse_study

    errors: list = []
    parse_study({"study": {"id": "lm", "title": "lm"}, "findings": [
        {"id": "f", "claim": "c", "cite": "ours", "check": "trend", "x": "seq_len", "metric": metric,
         "expect": "increases"}]}, lambda where, message: errors.append((where, message)))
    assert errors and "share:<layer kind>" in errors[0][1]


def test_the_studys_gpu_profile_plans_gpt2_small_on_each_frameworks_cuda_build():
    """The gpu profile (no GPU here: planned, not run): GPT-2 small × compile × attention ×
    precision on one GPU, MXNet in fp32 only; the two layer-profile cells stay on the CPU."""
    from collections import Counter

    root = Path(__file__).resolve().parents[1] / "studies" / "transformers.toml"
    gpu, quick = load_matrix(root, profile="gpu"), load_matrix(root, profile="quick")
    on_gpu = [c.values for c in gpu.cells if c.values["device"] == "gpu"]
    assert len(on_gpu) == 18 and {v["model"] for v in on_gpu} == {"gpt2-small"}
    assert Counter((v["framework"], v["variant"]) for v in on_gpu) == {
        ("torch", "cuda"): 8, ("tensorflow", "cuda"): 4, ("jax", "cuda"): 4, ("mxnet", "cu117"): 2}
    assert {v["precision"] for v in on_gpu if v["framework"] == "mxnet"} == {"fp32"}
    assert all(v["seq_len"] == 1024 and v["synthetic_vocab"] == 50257 and v["gpus"] == 1 for v in on_gpu)
    on_cpu = [c.values for c in gpu.cells if c.values["device"] == "cpu"]
    assert sorted((v["model"], v["framework"], v["variant"], v["seq_len"], v["layer_profile"]) for v in on_cpu) == [
        ("gpt-tiny", "torch", "cpu", 16, True), ("gpt-tiny", "torch", "cpu", 128, True)]
    assert len(quick.cells) == 12 and all(c.values["device"] == "cpu" for c in quick.cells)
