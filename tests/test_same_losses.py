"""The restructure guard: python -m pytest -q tests/test_same_losses.py

Four fixed runs (plain, grown, a two-source mixture, the defaults; tests/same_losses.py) must log
the losses recorded in tests/same_losses.json: the first three before train.py, data.py and the
others were split into files of one concept each, the fourth (today's defaults: Muon, a linear
decay, depth growth at 20%) when record 6 joined them. A change that means to change what training
computes records them again with `python tests/same_losses.py --save tests/same_losses.json` and
says why in its commit.
"""
import json
import math

import same_losses


def close(got, want):
    """Equal records; floats within 1e-5 relative.

    A difference that small is one only a different CPU's summation order explains."""
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(close(g, w) for g, w in zip(got, want))
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-5)
    return got == want


def test_the_plain_grown_mixture_and_default_runs_log_the_recorded_losses(tmp_path):
    with open(same_losses.RECORD) as f:
        recorded = json.load(f)
    found = same_losses.run_all(str(tmp_path))
    assert found.keys() == recorded.keys()
    for name in recorded:
        assert len(found[name]) == len(recorded[name]), name
        for got, want in zip(found[name], recorded[name]):
            assert close(got, want), (name, got, want)
    # the record is not trivially satisfied: the runs learn and the grown run grew
    assert recorded["plain"][-1][2]["val_loss"] < recorded["plain"][0][2]["val_loss"] - 0.3
    assert any(kind == "grow" for kind, _, _ in recorded["grown"])
    assert recorded["defaults"][-1][2]["val_loss"] < recorded["defaults"][0][2]["val_loss"] - 0.3
    assert any(kind == "grow" for kind, _, _ in recorded["defaults"])
