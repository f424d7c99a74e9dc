"""The issue's fidelity figure for the GPT: the validation loss after a fixed
training budget agrees with plain PyTorch fp32's within 1% (``bench/gpt_reference.py
--validation``, ``docs/transformer.md`` section 7). Both sides train
``examples/char_gpt.py`` from the same initial weights on the same batches with
Adam (the functional model with MemoryX's Adam, PyTorch with
``torch.optim.Adam``) and are evaluated on the same validation sequences."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpt_reference.py"


def _bench():
    spec = importlib.util.spec_from_file_location("_gpt_reference_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_validation_loss_after_a_fixed_budget_is_within_one_percent_of_pytorch():
    evaluations = []
    result = _bench().validation_budget(120, batch=16, sequences=64, report=40, emit=evaluations.append)
    assert [e["step"] for e in evaluations] == [40, 80, 120]
    # trained: clearly below the corpus's unigram entropy, on both sides
    assert result["validation_loss"] < result["unigram_entropy_nats"] - 0.3
    assert result["torch_validation_loss"] < result["unigram_entropy_nats"] - 0.3
    assert all(e["rel_diff"] <= 0.01 for e in evaluations)
    assert result["rel_diff"] <= 0.01
