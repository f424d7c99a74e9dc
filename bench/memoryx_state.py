"""MemoryX's optimizer state under sparse weight streaming: bytes kept against dense state.

For FC-MNIST (``examples/fc_mnist.py``, its initial weights; the hidden
layers masked by magnitude as ``wse train --sparsity S`` masks them, the
classifier dense) prints one JSON line per optimizer and sparsity: the bytes
of optimizer state MemoryX keeps once every tensor has been stepped
(``MemoryX.state_bytes()``: a masked weight's state over its kept weights
only), the same state kept dense (the baseline) and their ratio.

    .venv/bin/python bench/memoryx_state.py [--sparsity 0.5 0.9 0.99] [--dataset mnist]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wse.host.appliance import TrainConfig, load_job, resolve_settings
from wse.host.appliance.preparation import load_run
from wse.host.appliance.sparsity import run_masks
from wse.host.memoryx import MemoryX

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"


def state_sizes(optimizer: str, sparsity: float, dataset: str | None) -> dict:
    """``MemoryX.state_bytes()`` of FC-MNIST's MemoryX with ``optimizer`` at ``sparsity``."""
    config = TrainConfig(EXAMPLE, out=Path("unused"), sparsity=sparsity, optimizer=optimizer, dataset=dataset,
                         progress="none")
    job = load_job(EXAMPLE)
    settings = resolve_settings(config, job)
    _, _, model = load_run(job, settings)
    memoryx = MemoryX.from_state_dict({name: value.detach().numpy().copy()
                                       for name, value in model.state_dict().items()}, settings.optimizer_config)
    memoryx.set_masks(run_masks(model, settings.sparsity))
    return memoryx.state_bytes()


def main() -> None:
    """Print the JSON lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsity", type=float, nargs="+", default=[0.5, 0.9, 0.99])
    parser.add_argument("--dataset", default=None, help="the job file's data set by default (MNIST)")
    args = parser.parse_args()
    for optimizer in ("sgd", "adam"):
        for sparsity in args.sparsity:
            sizes = state_sizes(optimizer, sparsity, args.dataset)
            print(json.dumps({"model": "fc_mnist", "optimizer": optimizer, "sparsity": sparsity, **sizes,
                              "ratio": round(sizes["state_bytes"] / sizes["dense_state_bytes"], 4)}), flush=True)


if __name__ == "__main__":
    main()
