"""examples/wan_fused_attention.py checks --nproc before any rank starts (in this process:
example_runner; every example's rank option is --nproc, test_examples.py)."""

from __future__ import annotations

import pytest
from example_runner import refuse


@pytest.mark.parametrize(
    "value,message",
    [
        ("0", "'0' is out of range: it must be in [1, 8] (e.g. 3)"),
        ("-1", "'-1' is out of range: it must be in [1, 8] (e.g. 3)"),
        ("9", "'9' is out of range: it must be in [1, 8] (e.g. 3)"),
        (str(2**63), f"'{2**63}' is out of range: it must be in [1, 8] (e.g. 3)"),
        ("2.0", "'2.0' is not an integer (e.g. 3)"),
    ],
)
def test_wan_fused_attention_refuses_a_bad_rank_count(value, message):
    """Exit 2 with argparse's one error line naming --nproc; no rank spawned, no traceback (0
    is not taken as the default, and a negative count never reaches the spawn)."""
    result = refuse("wan_fused_attention.py", "--nproc", value)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"wan_fused_attention.py: error: argument --nproc: {message}"
    )
