"""What a %%gpu body reads, assigns and displays, and how its values travel (no kernel, no Ray)."""
from __future__ import annotations

import types
import threading
import traceback

import pytest
import torch

from gpusession.notebook import cellrun
from gpusession.run.rank import context as context_module
from gpusession.notebook.cellcode import analyze, ends_with_semicolon, parse_names, split_last_expression



# ----- analysis --------------------------------------------------------------------------------
def test_reads_are_the_global_names_used_anywhere_in_the_body_but_not_locals_of_its_functions():
    code = analyze(
        "def f(a):\n    return a + scale\n"
        "class C:\n    size = width\n"
        "squares = [k * factor for k in range(n)]\n"
        "model = prepare(model)\n"
    )
    assert {"scale", "width", "factor", "n", "model", "prepare", "range"} <= code.reads
    assert not {"a", "k", "size"} & code.reads


def test_assigns_are_top_level_bindings_in_source_order():
    code = analyze(
        "import numpy as np\nimport os.path\n"
        "x = 1\nfor i in range(2):\n    y = i\n"
        "def helper():\n    inner = 1\n    global counted\n    counted = inner\n"
        "class Net: pass\n"
        "if (z := 3):\n    pass\n"
        "with open(__file__) as handle:\n    pass\n"
    )
    assert code.assigns == ("np", "os", "x", "i", "y", "helper", "counted", "Net", "z", "handle")
    assert "inner" not in code.assigns


def test_the_last_expression_is_the_value_unless_silenced_by_a_semicolon():
    assert analyze("x = 1\nx + 1").has_value
    assert not analyze("x = 1\nx + 1;").has_value
    assert not analyze("x = 1\nx + 1;  # quiet").has_value
    assert not analyze("x = 1").has_value
    assert not analyze("for i in range(3):\n    i").has_value
    assert ends_with_semicolon("a = [1, 2];\n") and not ends_with_semicolon("s = ';'\n")


def test_split_keeps_the_line_numbers_of_the_cell():
    body, last = split_last_expression("a = 1\n\nb = 2\na + b\n", "<cell>")
    assert [statement.lineno for statement in body.body] == [1, 3]
    assert last.body.lineno == 4
    body, last = split_last_expression("a = 1\na;\n", "<cell>")
    assert last is None and len(body.body) == 2


def test_a_body_that_does_not_compile_raises_syntax_error_with_its_line():
    with pytest.raises(SyntaxError) as error:
        analyze("x = 1\ny = (\n", "<cell>")
    assert error.value.lineno == 2


def test_out_names_must_be_identifiers():
    assert parse_names("model, losses") == ("model", "losses")
    with pytest.raises(ValueError, match="'2x' is not a variable name"):
        parse_names("model,2x")
    with pytest.raises(ValueError, match="at least one"):
        parse_names(" , ")


# ----- packing ----------------------------------------------------------------------------------
def test_pack_skips_and_names_what_cannot_be_pickled_and_ships_modules_by_name():
    packed = cellrun.pack({"lock": threading.Lock(), "n": 3, "torch": torch})
    assert [name for name, _ in packed.skipped] == ["lock"]
    assert "pickle" in packed.skipped[0][1]
    values = cellrun.unpack(packed)
    assert values == {"n": 3, "torch": torch}


def test_pack_keeps_an_optimizer_pointing_at_its_model():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values = cellrun.unpack(cellrun.pack({"model": model, "opt": optimizer}))
    assert values["opt"].param_groups[0]["params"][0] is values["model"].weight


def test_to_cpu_detaches_graph_tensors_and_keeps_shared_objects_shared():
    leaf = torch.ones(2, requires_grad=True)
    derived = leaf * 2  # has a graph: could not be pickled as is
    state = {"w": leaf, "nested": [derived]}
    memo: dict = {}
    moved = cellrun.to_cpu(state, memo)
    assert moved["w"] is leaf and not moved["nested"][0].requires_grad
    assert cellrun.to_cpu(state, memo) is moved
    restored = cellrun.unpack(cellrun.pack({"state": moved}))["state"]  # picklable now, values intact
    assert restored["w"].tolist() == [1.0, 1.0] and restored["nested"][0].tolist() == [2.0, 2.0]


# ----- running a body as rank 0 ----------------------------------------------------------------------
@pytest.fixture
def as_rank(request):
    def enter(rank: int):
        ctx = context_module.RunContext(
            rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0,
            device=torch.device("cpu"), devices=(torch.device("cpu"),), backend="gloo", lease_id=1,
            scratch_dir="/tmp", gpu_ids=("0",), logical_gpus=True)
        context_module._current = context_module._Run(ctx, channel=types.SimpleNamespace(send=lambda *items: None))

    yield enter
    context_module._current = None


def _payload(source: str, wanted: tuple[str, ...], **inputs) -> cellrun.CellPayload:
    return cellrun.CellPayload(source, "<%%gpu cell In[7]>", cellrun.pack(inputs).data, wanted)


def test_rank_0_sends_back_the_wanted_names_and_the_last_expression(as_rank):
    as_rank(0)
    result = cellrun.run_cell(_payload(
        "import threading\ny = base * 2\nlock = threading.Lock()\nunwanted = 1\ny + 1", ("y", "lock"), base=20))
    assert cellrun.unpack(result.values) == {"y": 40}
    assert [name for name, _ in result.values.skipped] == ["lock"]
    assert cellrun.unpack(result.value) == {"value": 41}


def test_other_ranks_run_the_body_but_send_nothing(as_rank):
    as_rank(1)
    assert cellrun.run_cell(_payload("y = 1\ny", ("y",))) is None


def test_an_unpicklable_last_expression_is_shown_by_its_repr(as_rank):
    as_rank(0)
    result = cellrun.run_cell(_payload("import threading\nthreading.Lock()", ()))
    assert result.value is None and "lock" in result.value_text


def test_an_error_in_the_body_points_at_the_cell_line(as_rank):
    as_rank(0)
    with pytest.raises(ZeroDivisionError) as error:
        cellrun.run_cell(_payload("x = 1\nx / 0\n", ()))
    frames = [(frame.filename, frame.lineno, frame.line) for frame in traceback.extract_tb(error.tb)]
    assert ("<%%gpu cell In[7]>", 2, "x / 0") in frames  # the source line too, as a local cell shows


def test_a_state_dict_comes_back_loadable():
    model = torch.nn.BatchNorm1d(3)
    state = cellrun.to_cpu(model.state_dict())
    assert hasattr(state, "_metadata")
    torch.nn.BatchNorm1d(3).load_state_dict(cellrun.unpack(cellrun.pack({"s": state}))["s"])
