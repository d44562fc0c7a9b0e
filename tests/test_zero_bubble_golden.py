"""Golden S=4, M=8 programs of the zero-bubble family (every rank, lowered).

Regenerate after an intended change with::

    python -c "from merak_sim.schedule import generate, format_program as f; \
[print(n, r, f(generate(n, 4, 8).programs[r], True)) for n in GOLDEN for r in range(4)]"

(GOLDEN's names) and paste each rank's line; review the diff as a schedule change.
"""

import pytest

from merak_sim.schedule import format_program, generate

GOLDEN = {
    "1f1b-split": (
        "F0 sA0 F1 sA1 F2 sA2 F3 [sA3/rG0] I0 W0 F4 [sA4/rG1] I1 W1 F5 [sA5/rG2] I2 W2 F6 "
         "[sA6/rG3] I3 W3 F7 [sA7/rG4] I4 W4 rG5 I5 W5 rG6 I6 W6 rG7 I7 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 sA1 rA2 F2 [sA2/rG0] I0 sG0 W0 rA3 F3 [sA3/rG1] I1 sG1 W1 rA4 F4 "
         "[sA4/rG2] I2 sG2 W2 rA5 F5 [sA5/rG3] I3 sG3 W3 rA6 F6 [sA6/rG4] I4 sG4 W4 rA7 F7 "
         "[sA7/rG5] I5 sG5 W5 rG6 I6 sG6 W6 rG7 I7 sG7 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 [sA1/rG0] I0 sG0 W0 rA2 F2 [sA2/rG1] I1 sG1 W1 rA3 F3 [sA3/rG2] I2 sG2 "
         "W2 rA4 F4 [sA4/rG3] I3 sG3 W3 rA5 F5 [sA5/rG4] I4 sG4 W4 rA6 F6 [sA6/rG5] I5 sG5 W5 rA7 "
         "F7 [sA7/rG6] I6 sG6 W6 rG7 I7 sG7 W7 AR OPT",
        "rA0 F0 I0 sG0 W0 rA1 F1 I1 sG1 W1 rA2 F2 I2 sG2 W2 rA3 F3 I3 sG3 W3 rA4 F4 I4 sG4 W4 rA5 "
         "F5 I5 sG5 W5 rA6 F6 I6 sG6 W6 rA7 F7 I7 sG7 W7 AR OPT",
    ),
    "zb-h1": (
        "F0 sA0 F1 sA1 F2 sA2 F3 [sA3/rG0] I0 W0 F4 [sA4/rG1] I1 W1 F5 [sA5/rG2] I2 W2 F6 "
         "[sA6/rG3] I3 W3 F7 [sA7/rG4] I4 W4 rG5 I5 W5 rG6 I6 W6 rG7 I7 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 sA1 rA2 F2 [sA2/rG0] I0 [sG0/rA3] F3 [sA3/rG1] I1 sG1 W0 rA4 F4 "
         "[sA4/rG2] I2 sG2 W1 rA5 F5 [sA5/rG3] I3 sG3 W2 rA6 F6 [sA6/rG4] I4 sG4 W3 rA7 F7 "
         "[sA7/rG5] I5 sG5 W4 rG6 I6 sG6 W5 rG7 I7 sG7 W6 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 [sA1/rG0] I0 [sG0/rA2] F2 [sA2/rG1] I1 [sG1/rA3] F3 [sA3/rG2] I2 sG2 "
         "W0 rA4 F4 [sA4/rG3] I3 sG3 W1 rA5 F5 [sA5/rG4] I4 sG4 W2 rA6 F6 [sA6/rG5] I5 sG5 W3 rA7 "
         "F7 [sA7/rG6] I6 sG6 W4 rG7 I7 sG7 W5 W6 W7 AR OPT",
        "rA0 F0 I0 [sG0/rA1] F1 I1 [sG1/rA2] F2 I2 [sG2/rA3] F3 I3 sG3 W0 rA4 F4 I4 sG4 W1 rA5 F5 "
         "I5 sG5 W2 rA6 F6 I6 sG6 W3 rA7 F7 I7 sG7 W4 W5 W6 W7 AR OPT",
    ),
    "zb-h2": (
        "F0 sA0 F1 sA1 F2 sA2 F3 sA3 F4 sA4 F5 sA5 F6 [sA6/rG0] I0 W0 rG1 I1 F7 [sA7/rG2] I2 W1 "
         "rG3 I3 W2 rG4 I4 W3 rG5 I5 W4 rG6 I6 W5 W6 rG7 I7 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 sA1 rA2 F2 sA2 rA3 F3 sA3 rA4 F4 [sA4/rG0] I0 [sG0/rA5] F5 [sA5/rG1] "
         "I1 [sG1/rA6] F6 [sA6/rG2] I2 sG2 W0 rG3 I3 [sG3/rA7] F7 [sA7/rG4] I4 sG4 W1 rG5 I5 sG5 "
         "W2 rG6 I6 sG6 W3 W4 rG7 I7 sG7 W5 W6 W7 AR OPT",
        "rA0 F0 sA0 rA1 F1 sA1 rA2 F2 [sA2/rG0] I0 [sG0/rA3] F3 [sA3/rG1] I1 [sG1/rA4] F4 "
         "[sA4/rG2] I2 [sG2/rA5] F5 [sA5/rG3] I3 [sG3/rA6] F6 [sA6/rG4] I4 sG4 W0 rG5 I5 [sG5/rA7] "
         "F7 [sA7/rG6] I6 sG6 W1 W2 rG7 I7 sG7 W3 W4 W5 W6 W7 AR OPT",
        "rA0 F0 I0 [sG0/rA1] F1 I1 [sG1/rA2] F2 I2 [sG2/rA3] F3 I3 [sG3/rA4] F4 I4 [sG4/rA5] F5 "
         "I5 [sG5/rA6] F6 I6 sG6 W0 rA7 F7 I7 sG7 W1 W2 W3 W4 W5 W6 W7 AR OPT",
    ),
    "zb-scp": (
        "F*0 sA0 F*1 sA1 F2 sA2 F3 sA3 R0 rG0 I0 W0 F4 sA4 R1 rG1 I1 W1 F*5 [sA5/rG2] I2 W2 F*6 "
         "[sA6/rG3] I3 W3 F*7 [sA7/rG4] I4 W4 R5 rG5 I5 W5 R6 rG6 I6 W6 R7 rG7 I7 W7 AR OPT",
        "rA0 F*0 sA0 rA1 F*1 sA1 rA2 F2 sA2 R0 rG0 I0 [sG0/rA3] F3 sA3 R1 rG1 I1 sG1 W0 rA4 F4 "
         "[sA4/rG2] I2 sG2 W1 rA5 F5 [sA5/rG3] I3 sG3 W2 rA6 F*6 [sA6/rG4] I4 sG4 W3 rA7 F*7 "
         "[sA7/rG5] I5 sG5 W4 R6 rG6 I6 sG6 W5 R7 rG7 I7 sG7 W6 W7 AR OPT",
        "rA0 F*0 sA0 rA1 F1 sA1 R0 rG0 I0 [sG0/rA2] F2 [sA2/rG1] I1 [sG1/rA3] F3 [sA3/rG2] I2 sG2 "
         "W0 rA4 F4 [sA4/rG3] I3 sG3 W1 rA5 F5 [sA5/rG4] I4 sG4 W2 rA6 F6 [sA6/rG5] I5 sG5 W3 rA7 "
         "F7 [sA7/rG6] I6 sG6 W4 rG7 I7 sG7 W5 W6 W7 AR OPT",
        "rA0 F0 I0 [sG0/rA1] F1 I1 [sG1/rA2] F2 I2 [sG2/rA3] F3 I3 sG3 W0 rA4 F4 I4 sG4 W1 rA5 F5 "
         "I5 sG5 W2 rA6 F6 I6 sG6 W3 rA7 F7 I7 sG7 W4 W5 W6 W7 AR OPT",
    ),
}


@pytest.mark.parametrize("name", GOLDEN)
@pytest.mark.parametrize("rank", range(4))
def test_golden_s4_m8(name, rank):
    assert format_program(generate(name, 4, 8).programs[rank], brackets=True) == \
        GOLDEN[name][rank]


def test_zb_auto_at_unit_costs_is_zb_h1():
    """Without costs the cost-aware schedule keeps ZB-H1's order (ties keep it)."""
    assert generate("zb-auto", 4, 8).programs == generate("zb-h1", 4, 8).programs
