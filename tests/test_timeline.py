"""The one timeline module: event columns, Chrome trace, Gantt and memory charts."""

import ast
import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from merak_sim import timeline  # noqa: E402
from merak_sim.timeline import EVENT_COLUMNS, IDLE, KIND_COLORS, TP_KIND  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# rank, stage, chunk, stream, kind, action, microbatch, start_s, end_s, bytes
ROWS = [
    (0, 0, 0, "compute", "FORWARD", "F0", 0, 0.0, 0.001, 0),
    (0, 0, 0, "p2p", "SEND_ACT", "sA0", 0, 0.001, 0.0015, 64),
    (1, 1, 0, "compute", "BACKWARD", "B0", 0, 0.002, 0.004, 0),
    (1, 1, 0, "collective", TP_KIND, "B0", 0, 0.003, 0.004, 128.0),
    (1, 1, 0, "collective", "ALL_REDUCE", "AR", -1, 0.004, 0.005, 256.0),
]


def _legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_event_columns_are_defined_once_in_the_packages():
    assert EVENT_COLUMNS == ("rank", "stage", "chunk", "stream", "kind", "action",
                             "microbatch", "start_s", "end_s", "bytes")
    defs, traces = [], []
    for pkg in ("merak_sim", "merak_exec"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    tgts = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(isinstance(t, ast.Name) and t.id == "EVENT_COLUMNS" for t in tgts):
                        defs.append(f.relative_to(ROOT).as_posix())
                if isinstance(node, ast.Dict) and any(  # a trace being built, not read
                        isinstance(k, ast.Constant) and k.value == "traceEvents"
                        for k in node.keys):
                    traces.append(f.relative_to(ROOT).as_posix())
    assert defs == ["merak_sim/timeline.py"]
    assert traces == ["merak_sim/timeline.py"]


def test_every_events_table_uses_the_shared_columns():
    from merak_sim.config import ParallelConfig
    from merak_sim.validation.rundir import MeasuredRun
    from merak_sim.sim import simulate, uniform_table

    cfg = ParallelConfig(pp=2, global_batch_size=4, micro_batch_size=1)
    res = simulate(config=cfg, cost_table=uniform_table(2, comm=0.1))
    assert tuple(res.events().columns) == EVENT_COLUMNS
    run = MeasuredRun(path=Path("x"), config={}, model={}, seq_len=8,
                      events=[dict(zip(EVENT_COLUMNS, r, strict=True), step=0) for r in ROWS],
                      wall_s=[], losses=[], memory=[], profile={})
    assert tuple(run.events_frame(0).columns) == EVENT_COLUMNS


def test_chrome_trace_of_a_known_event_list():
    rows = [ROWS[0], ROWS[3]]
    doc = timeline.chrome_trace(rows, {"what": "test"})
    threads = [("compute", 0), ("p2p", 1), ("collective", 2), ("collective (tp)", 3)]

    def meta(rank, stage):
        return [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                 "args": {"name": f"GPU {rank} (stage {stage})"}}] + [
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": n}}
            for n, t in threads]

    assert doc == {
        "traceEvents": meta(0, 0) + meta(1, 1) + [
            {"name": "F0", "cat": "FORWARD", "ph": "X", "pid": 0, "tid": 0, "ts": 0.0,
             "dur": pytest.approx(1000.0),
             "args": {"stage": 0, "chunk": 0, "microbatch": 0, "bytes": 0}},
            {"name": "B0", "cat": TP_KIND, "ph": "X", "pid": 1, "tid": 3,
             "ts": pytest.approx(3000.0), "dur": pytest.approx(1000.0),
             "args": {"stage": 1, "chunk": 0, "microbatch": 0, "bytes": 128.0}}],
        "displayTimeUnit": "ms",
        "otherData": {"what": "test"},
    }
    # Dicts and a DataFrame give the same trace as tuples.
    import pandas as pd

    dicts = [dict(zip(EVENT_COLUMNS, r, strict=True)) for r in rows]
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    assert timeline.chrome_trace(dicts) == timeline.chrome_trace(frame)
    assert json.loads(json.dumps(timeline.chrome_trace(frame))) == timeline.chrome_trace(rows)


def test_write_chrome_trace_is_atomic(tmp_path):
    p = tmp_path / "t.json"
    timeline.write_chrome_trace(ROWS, p, {"n": 1})
    good = p.read_text()
    assert json.loads(good)["otherData"] == {"n": 1}
    bad = [(*ROWS[0][:9], object())]  # bytes that JSON cannot serialise
    with pytest.raises(TypeError):
        timeline.write_chrome_trace(bad, p)
    assert p.read_text() == good
    with pytest.raises(TypeError):
        timeline.write_chrome_trace(bad, tmp_path / "new.json")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.json"]


def test_colour_map_tells_the_kinds_apart():
    groups = ["FORWARD", "FORWARD_NOGRAD", "RECOMPUTE", "BACKWARD", "BACKWARD_INPUT",
              "BACKWARD_WEIGHT", "SEND_ACT", "ALL_REDUCE", "OPTIMIZER", IDLE]
    assert len({KIND_COLORS[k] for k in groups}) == len(groups)
    assert {KIND_COLORS[k] for k in ("SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD",
                                     TP_KIND)} == {KIND_COLORS["SEND_ACT"]}


def _rgb_distance(a: str, b: str) -> float:
    x, y = matplotlib.colors.to_rgb(a), matplotlib.colors.to_rgb(b)
    return sum((p - q) ** 2 for p, q in zip(x, y, strict=True)) ** 0.5


def test_zero_bubble_halves_differ_clearly_from_each_other_and_from_b():
    """I, W and B (and F) are told apart at a glance, not only by a shade: every pair
    at least 0.25 apart in RGB, and W's hue away from I's."""
    kinds = ("FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT")
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            assert _rgb_distance(KIND_COLORS[a], KIND_COLORS[b]) > 0.25, (a, b)
    hue = [matplotlib.colors.rgb_to_hsv(matplotlib.colors.to_rgb(KIND_COLORS[k]))[0]
           for k in ("BACKWARD_INPUT", "BACKWARD_WEIGHT")]
    assert abs(hue[0] - hue[1]) > 0.1


def test_schedule_gantt_of_a_split_backward_shows_i_and_w_in_the_legend(tmp_path):
    from merak_sim.schedule import generate, replay
    from merak_sim.schedule.render import plot_gantt

    ex = replay(generate("zb-h1", 4, 8), f=1, b=2, w=1).execution
    ax = plot_gantt(ex, tmp_path / "zb.png", title="zb-h1")
    labels = _legend_labels(ax)
    assert {"FORWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", IDLE} <= set(labels)
    handles = dict(zip(labels, ax.get_legend().legend_handles, strict=True))
    assert matplotlib.colors.to_hex(handles["BACKWARD_INPUT"].get_facecolor()) != \
        matplotlib.colors.to_hex(handles["BACKWARD_WEIGHT"].get_facecolor())
    bars = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert {KIND_COLORS["BACKWARD_INPUT"].lower(), KIND_COLORS["BACKWARD_WEIGHT"].lower()} <= bars
    assert (tmp_path / "zb.png").stat().st_size > 1000


def test_gantt_draws_a_legend_of_every_kind_present(tmp_path):
    ax = timeline.plot_gantt(ROWS, path=tmp_path / "g.png", title="t")
    assert _legend_labels(ax) == ["FORWARD", "BACKWARD", TP_KIND, "ALL_REDUCE", IDLE]
    assert len(ax.patches) == 4  # p2p left out by default
    colours = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
    assert colours == {KIND_COLORS[k].lower() for k in ("FORWARD", "BACKWARD", TP_KIND,
                                                         "ALL_REDUCE")}
    assert (tmp_path / "g.png").stat().st_size > 1000
    ax = timeline.plot_gantt(ROWS, streams=("compute", "p2p", "collective"))
    assert "SEND_ACT" in _legend_labels(ax) and len(ax.patches) == 5


def test_schedule_and_run_gantts_render_through_the_timeline(tmp_path):
    from merak_sim.schedule import generate
    from merak_sim.schedule.execute import execute
    from merak_sim.schedule.render import plot_gantt

    ex = execute(generate("1f1b", 2, 2), lambda a: 1.0)
    ax = plot_gantt(ex, tmp_path / "s.png")
    labels = _legend_labels(ax)
    assert {"FORWARD", "BACKWARD", IDLE} <= set(labels)
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_side_by_side_puts_measured_above_simulated(tmp_path):
    sim = [(*r[:7], r[7] * 1.1, r[8] * 1.1, r[9]) for r in ROWS]
    fig = timeline.plot_side_by_side(ROWS, sim, name="run", path=tmp_path / "v.png")
    top, bottom = fig.axes[:2]
    assert top.get_title() == "run: measured (5.0 ms)"
    assert bottom.get_title() == "run: simulated (5.5 ms)"
    assert IDLE in _legend_labels(top) and IDLE in _legend_labels(bottom)
    assert (tmp_path / "v.png").stat().st_size > 1000


def test_memory_plot_returns_a_figure(tmp_path):
    from matplotlib.figure import Figure

    from merak_sim.config import ParallelConfig
    from merak_sim.sim import simulate, uniform_table

    res = simulate(config=ParallelConfig(pp=2, global_batch_size=4, micro_batch_size=1),
                   cost_table=uniform_table(2, comm=0.1))
    fig = res.plot_memory(tmp_path / "m.png")
    assert isinstance(fig, Figure) and (tmp_path / "m.png").stat().st_size > 1000
    ax = timeline.plot_memory([(0, 0.0, 2**30), (0, 0.001, 2 * 2**30), (1, 0.0, 2**30)],
                              capacity_bytes=4 * 2**30, end_s=0.002)
    assert isinstance(ax.figure, Figure)
    assert _legend_labels(ax) == ["GPU 0", "GPU 1", "capacity"]
    x, y = ax.lines[0].get_data()
    assert list(x) == [0.0, 1.0, 2.0] and list(y) == [1.0, 2.0, 2.0]
