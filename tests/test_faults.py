"""A stalled or killed rank: every other rank ends within MERAK_TIMEOUT_S + 10 s with
exactly one line and no traceback (``merak-exec train``, one process per rank, gloo)."""

import pytest

from support.workers import cli_fault

TIMEOUT_S = 5
MODEL = ["--layers", "2", "--hidden", "16", "--heads", "2", "--vocab", "32", "--seq", "8",
         "--steps", "100000", "--microbatches", "2"]
LAYOUTS = {"pp2": (2, ["--pp", "2"]), "tp2": (2, ["--tp", "2"]), "dp2": (2, ["--dp", "2"]),
           "tp2xpp2": (4, ["--tp", "2", "--pp", "2"])}


@pytest.mark.parametrize("mode", ["stall", "kill"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lost_rank_ends_the_others_with_one_line(tmp_path, layout, mode):
    world, degrees = LAYOUTS[layout]
    res = cli_fault(world, MODEL + degrees, victim=world - 1, mode=mode,
                    timeout_s=TIMEOUT_S, cwd=str(tmp_path))
    for r, got in res.items():
        assert got["after_s"] < TIMEOUT_S + 10, (r, got)
        assert got["code"] == 1, (r, got)
        assert len(got["stderr"]) == 1, (r, got["stderr"])
        line = got["stderr"][0]
        assert line.startswith("merak-exec: error: merak_exec: rank "), line
        assert f"rank {r} " in line and "Traceback" not in line
        assert "rank" in line.split(f"rank {r} ", 1)[1], line  # names the peer
