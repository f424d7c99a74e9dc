"""A character-level GPT, written the usual PyTorch way.

Two pre-LayerNorm decoder blocks (``d_model`` 64, 4 heads, context 32, GELU
MLP of width 256), token and position ``nn.Embedding``, a final LayerNorm and
a linear head over the characters; trained with next-token softmax
cross-entropy on the ``pydoc`` corpus (Python's help topics, which ship with
Python: ``wse.host.data.load_text_corpus``, ``docs/transformer.md`` section 6).

Train it with ``wse train examples/char_gpt.py`` (``docs/transformer.md``
section 10): the front end captures the model into typed nodes
(``wse.host.compiler.transformer_capture.capture``), MemoryX keeps the weights
and the Adam state, and the functional model of the transformer's float order
(``wse.host.runtime.transformer_reference.TransformerReference``) runs each
step; ``wse generate RUN --prompt "..."`` samples text from the run's
checkpoint. On a device backend (``--backend golden`` ...) each step runs as
the compiled fabric phases instead (``docs/transformer.md`` section 11; slow
at this size, made for tiny configs). ``ATTENTION = "sdpa"`` uses
``F.scaled_dot_product_attention(is_causal=True)`` instead of the written-out
scores, causal mask and softmax (the same bits in the functional model).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

DATASET = "pydoc"
OPTIMIZER = {"name": "adam", "lr": 3e-3}
BATCH = 16          # sequences per step (16 x 32 = 512 tokens)
EPOCHS = 1
LAYERS, D_MODEL, HEADS, CONTEXT = 2, 64, 4, 32
#: "manual": q @ k^T * scale, causal masked_fill, softmax, @ v; "sdpa": scaled_dot_product_attention.
ATTENTION = "manual"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q, k, v and output projections."""

    def __init__(self, d_model: int, heads: int, context: int, attention: str = ATTENTION):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.scale = 1.0 / math.sqrt(d_model // heads)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        hd = c // self.heads
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, hd).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * self.scale
            causal = torch.ones_like(scores, dtype=torch.bool).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
            y = F.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.o(y)


class Block(nn.Module):
    """``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, heads: int, context: int, attention: str = ATTENTION):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, context, attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(self.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    """Decoder-only transformer over character ids ``[B, T]``; returns logits ``[B, T, vocab]``."""

    def __init__(self, vocab: int, layers: int = LAYERS, d_model: int = D_MODEL, heads: int = HEADS,
                 context: int = CONTEXT, attention: str = ATTENTION):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, heads, context, attention) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx):
        t = idx.size(1)
        positions = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        x = self.blocks(x)
        return self.head(self.ln_f(x))


def model(vocab: int, context: int = CONTEXT) -> nn.Module:
    """The network for a corpus of ``vocab`` characters and sequences of ``context`` positions."""
    return CharGPT(vocab, LAYERS, D_MODEL, HEADS, context, ATTENTION)
