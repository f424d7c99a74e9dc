"""The kernel library: PE programs (``*.s``) with the host-side drivers that
lay data out over any mesh, route it and fill it, and the references to check
them bit for bit.

Each kernel documents the order of its float operations; its reference
computes exactly that order with :mod:`wse.numerics`, so a run is
either bit exact or wrong. A kernel drives any device through the host API
(:class:`wse.sim.api.Device`); :func:`wse.sim.runner.run_kernel` (and
``wse kernel``) runs one on a device and checks it.

=================  ================================================================
``gemv``           y = W x, weights stationary (:mod:`.gemv`)
``axpy``           y = a x + y, x streamed through the mesh (:mod:`.axpy`)
``dot``            x . y, x streamed, scalars reduced to one (:mod:`.dot`)
``broadcast``      copy a vector along every row or column (:mod:`.lines`)
``reduce``         sum the vectors of every row or column (:mod:`.lines`)
``spgemm``         Y = W X, W sparse: only non-zeros streamed, index-tagged (:mod:`.spgemm`)
``spmv``           y = W x, the one-token ``spgemm``
``gelu``           GELU of tokens x features, forward or backward, erf or tanh form (:mod:`.gelu`)
``softmax``        causal softmax of one head's scores, forward or backward (:mod:`.softmax`)
``layernorm``      LayerNorm forward of tokens x features (:mod:`.layernorm`)
``layernorm_bwd``  LayerNorm backward: dx, dgamma, dbeta (:mod:`.layernorm_bwd`)
``attention``      one causal head's products (scores, p v) and their backward (:mod:`.attention`)
``residual``       y = add(a, b) of tokens x features: residuals, gradient sums (:mod:`.residual`)
=================  ================================================================
"""

from __future__ import annotations

from wse.config import UsageError

from .common import Kernel
from .gemv import Gemv
from .axpy import Axpy
from .dot import Dot
from .lines import Broadcast, Reduce
from .spgemm import Spgemm, Spmv
from .gelu import Gelu
from .softmax import Softmax
from .layernorm import LayerNorm
from .layernorm_bwd import LayerNormBackward
from .attention import Attention
from .residual import Residual

__all__ = ["KERNELS", "Kernel", "get_kernel"]

#: Every library kernel by name.
KERNELS: dict[str, Kernel] = {k.name: k for k in (Gemv(), Axpy(), Dot(), Broadcast(), Reduce(), Spgemm(), Spmv(), Gelu(), Softmax(), LayerNorm(), LayerNormBackward(), Attention(),
                                       Residual())}


def get_kernel(name: str) -> Kernel:
    """The kernel called ``name``; raises :class:`UsageError` for an unknown name."""
    kernel = KERNELS.get(name)
    if kernel is None:
        raise UsageError(f"unknown kernel {name!r}; expected one of {', '.join(KERNELS)}")
    return kernel
