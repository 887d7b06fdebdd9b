"""Attention variants written as their authors write them, in plain PyTorch.

The demo, the tests and the benchmarks share these programs; none of them knows fxflash.
Each ``Variant`` has the function and an input maker: ``variant.inputs(shape, dtype, device)``
returns the positional arguments for one call.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of one attention call: batch, query heads, key/value heads, query and key
    lengths, head dims of q/k and of v."""

    B: int = 2
    H: int = 4
    Hkv: int = 4
    M: int = 33
    N: int = 47
    D: int = 16
    Dv: int = 16


# ---------------------------------------------------------------- the softmax family
def vanilla(q, k, v, mask=None):
    """The Flashlight paper's Listing 1: in-place scaling, optional masked_fill."""
    attn_scores = torch.matmul(q, k.transpose(-2, -1))
    attn_scores *= 1 / math.sqrt(q.size(-1))
    if mask is not None:
        attn_scores = attn_scores.masked_fill(mask == 0, float("-inf"))
    attn_weights = F.softmax(attn_scores, dim=-1)
    return torch.matmul(attn_weights, v)


def scale_q_first(q, k, v):
    """Scale applied to q before the matmul."""
    q = q * q.size(-1) ** -0.5
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def manual_softmax(q, k, v):
    """A hand-written stable softmax."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = (s - s.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def bshd(q, k, v):
    """Inputs laid out ``[B, S, H, D]``, transposed inside; output ``[B, S, H, Dv]``."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = torch.softmax(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, dim=-1) @ v
    return out.transpose(1, 2)


def einsum(q, k, v):
    """Both contractions written with ``torch.einsum`` (traced as permutes of size-one axes,
    which capture.layout_chains collapses)."""
    s = torch.einsum("bhmd,bhnd->bhmn", q, k) * q.size(-1) ** -0.5
    return torch.einsum("bhmn,bhnd->bhmd", torch.softmax(s, dim=-1), v)


def einsum_bshd(q, k, v):
    """``torch.einsum`` over ``[B, S, H, D]`` inputs, heads moved before the sequence inside the
    contraction; output ``[B, S, H, Dv]``."""
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.size(-1) ** -0.5
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def gqa_repeat_interleave(q, k, v):
    """Grouped-query attention: k and v have fewer heads, repeated with repeat_interleave."""
    group = q.size(1) // k.size(1)
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1) @ v


def gqa_expand(q, k, v):
    """Grouped-query attention through expand + reshape (the Llama way)."""
    b, hkv, n, d = k.shape
    group = q.size(1) // hkv
    k = k[:, :, None].expand(b, hkv, group, n, d).reshape(b, hkv * group, n, d)
    v = v[:, :, None].expand(b, hkv, group, n, v.size(-1)).reshape(b, hkv * group, n, v.size(-1))
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v


def alibi(q, k, v):
    """ALiBi: a per-head linear bias on the query-key distance."""
    h, m, n = q.size(1), q.size(2), k.size(2)
    slopes = torch.exp2(-8.0 * torch.arange(1, h + 1, device=q.device) / h)
    dist = torch.arange(n, device=q.device)[None, :] - torch.arange(m, device=q.device)[:, None]
    bias = (slopes[:, None, None] * dist).to(q.dtype)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias
    return torch.softmax(s, dim=-1) @ v


def softcap(q, k, v, cap=20.0):
    """Tanh soft-capping of the scores (Gemma 2)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    s = cap * torch.tanh(s / cap)
    return torch.softmax(s, dim=-1) @ v


def causal(q, k, v):
    """Causal mask built from a lower-triangular boolean matrix, aligned to the last query."""
    m, n = q.size(-2), k.size(-2)
    keep = torch.ones(m, n, dtype=torch.bool, device=q.device).tril(n - m)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sliding_window(q, k, v, window=8):
    """Causal sliding-window attention over the last ``window`` keys."""
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = (j <= i) & (i - j < window)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = torch.where(keep, s, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def prefix_lm(q, k, v, prefix=8):
    """Prefix-LM: bidirectional over the first ``prefix`` keys, causal after."""
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = (j <= i) | (j < prefix)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def block_causal(q, k, v, block=8):
    """Block-causal: a query sees every key of its own block of ``block`` positions and of the
    blocks before it."""
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(j // block > i // block, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def dilated_window(q, k, v, window=12, dilation=3):
    """Dilated sliding window: keys within ``window`` positions whose distance is a multiple
    of ``dilation``."""
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = ((i - j).abs() <= window) & ((i - j) % dilation == 0)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def neighbourhood_2d(q, k, v, width=6, radius=1):
    """Neighbourhood attention on a 2-D canvas ``width`` tokens wide (token t at row t // width,
    column t % width): a query sees the keys within ``radius`` rows and columns of it."""
    i = torch.arange(q.size(-2), device=q.device)[:, None]
    j = torch.arange(k.size(-2), device=q.device)[None, :]
    keep = ((i // width - j // width).abs() <= radius) & ((i % width - j % width).abs() <= radius)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


def document_mask(q, k, v, doc_ids):
    """Packed documents: a query sees only keys of its own document (ids ``[N]``)."""
    same = doc_ids[:, None] == doc_ids[None, :]
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(~same, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def key_padding(q, k, v, key_mask):
    """Key-padding mask ``[B, 1, 1, N]``, True where a key is real."""
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(~key_mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def key_lengths(q, k, v, lengths):
    """Padded batches given by per-batch lengths ``[B]``: keys at or past a sequence's length
    are padding."""
    keep = torch.arange(k.size(-2), device=k.device)[None, :] < lengths[:, None]
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sdpa_key_lengths(q, k, v, lengths):
    """``scaled_dot_product_attention`` with a boolean key mask from per-batch lengths, as fxflash
    reads the call (capture/sdpa.py's math form: fp32 scores, a fully masked row gives 0)."""
    from .capture.sdpa import math_form

    keep = torch.arange(k.size(-2), device=k.device)[None, :] < lengths[:, None]
    return math_form(q, k, v, attn_mask=keep[:, None, None, :])


def additive_mask(q, k, v, bias):
    """A float mask ``[B, 1, M, N]`` added to the scores."""
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5 + bias
    return torch.softmax(s, dim=-1) @ v


# ---------------------------------------------------------------- beyond the template
def _attention(q, k, v):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return torch.softmax(s, dim=-1) @ v


def diff_attention(q, k, v, lambda_full=0.5):
    """Differential attention as the Diff Transformer's code writes it (Ye et al., 2024):
    q, k hold ``2H`` heads, v holds ``H`` heads of width ``2D``; one softmax over the ``2H``
    score maps, viewed as ``H`` pairs, and the pair's second map subtracted with weight λ."""
    b, h2, m, _ = q.shape
    attn = torch.softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, dim=-1)
    attn = attn.view(b, h2 // 2, 2, m, k.size(-2))
    attn = attn[:, :, 0] - lambda_full * attn[:, :, 1]
    return attn @ v


def diff_attention_causal(q, k, v, lambda_full=0.5):
    """Differential attention in a decoder (the Diff Transformer's language models): both
    streams' scores under the causal mask aligned to the last query, as ``causal`` builds it."""
    b, h2, m, n = q.size(0), q.size(1), q.size(-2), k.size(-2)
    keep = torch.ones(m, n, dtype=torch.bool, device=q.device).tril(n - m)
    s = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5
    attn = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
    attn = attn.view(b, h2 // 2, 2, m, n)
    return (attn[:, :, 0] - lambda_full * attn[:, :, 1]) @ v


def diff_transformer(q, k, v, lambda_q1, lambda_k1, lambda_q2, lambda_k2, subln_weight,
                     lambda_init=0.8, eps=1e-5):
    """The Diff Transformer's attention after its projections, as its code writes it: λ from
    four parameter vectors, the pair difference, then ``subln`` (an RMSNorm of each head's
    2D-wide output) and the ``1 - λ_init`` scale, heads merged at the end."""
    lambda_full = (torch.exp(torch.sum(lambda_q1 * lambda_k1, dim=-1))
                   - torch.exp(torch.sum(lambda_q2 * lambda_k2, dim=-1)) + lambda_init)
    b, h2, m, _ = q.shape
    attn = torch.softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, dim=-1)
    attn = attn.view(b, h2 // 2, 2, m, k.size(-2))
    attn = attn[:, :, 0] - lambda_full * attn[:, :, 1]
    o = attn @ v
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * subln_weight
    o = o * (1 - lambda_init)
    return o.transpose(1, 2).reshape(b, m, -1)


def diff_attention_chunked(q, k, v, lambda_full=0.5):
    """Differential attention written as two attention calls on the halves of the heads."""
    q0, q1 = q.chunk(2, dim=1)
    k0, k1 = k.chunk(2, dim=1)
    return _attention(q0, k0, v) - lambda_full * _attention(q1, k1, v)


INF = 1e9  # AlphaFold's "inf": masked keys get a bias of -1e9


def evoformer_row(q, k, v, mask, pair_bias, gate):
    """AlphaFold's gated row attention (OpenFold's ``Attention`` with a mask bias and a pair
    bias): q, k, v, gate ``[B, N_seq, S, H, D]``, mask ``[B, N_seq, S]`` (1 = present),
    pair_bias ``[B, 1, H, S, S]``."""
    mask_bias = (INF * (mask - 1))[..., :, None, None, :]         # [B, N_seq, 1, 1, S]
    q = q.transpose(-2, -3) / math.sqrt(q.size(-1))
    k, v = k.transpose(-2, -3), v.transpose(-2, -3)
    a = q @ k.transpose(-1, -2) + mask_bias + pair_bias
    a = torch.softmax(a, dim=-1)
    o = (a @ v).transpose(-2, -3)
    return o * torch.sigmoid(gate)


def evoformer_col(q, k, v, mask, gate):
    """AlphaFold's gated column attention: attends along N_seq for each residue, no pair
    bias. q, k, v, gate ``[B, N_seq, S, H, D]``, mask ``[B, N_seq, S]``."""
    q, k, v = (t.transpose(-4, -3).transpose(-2, -3) for t in (q, k, v))  # [B, S, H, N_seq, D]
    mask_bias = (INF * (mask.transpose(-1, -2) - 1))[..., :, None, None, :]  # [B, S, 1, 1, N_seq]
    a = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + mask_bias
    a = torch.softmax(a, dim=-1)
    o = (a @ v).transpose(-2, -3).transpose(-4, -3)              # [B, N_seq, S, H, D]
    return o * torch.sigmoid(gate)


def invariant_point_attention(q, k, qp, kp, v, pair_bias, head_weights, points=4):
    """AlphaFold's invariant point attention with its squared point distances expanded:
    ``|x_i − y_j|² = |x_i|² + |y_j|² − 2·x_i·y_j`` turns the point term into a second
    contraction of the scores. q, k ``[B, H, S, C]``; qp, kp ``[B, H, S, 3·P]`` (points in
    the global frame); pair_bias ``[B, H, S, S]``; head_weights ``[H]`` (softplus → γ)."""
    w_c = math.sqrt(2.0 / (9.0 * points))
    w_l = math.sqrt(1.0 / 3.0)
    gamma = F.softplus(head_weights)[:, None, None] * w_c / 2
    sq_dist = (qp * qp).sum(-1, keepdim=True) + (kp * kp).sum(-1)[..., None, :] - 2 * qp @ kp.transpose(-1, -2)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)) + pair_bias - gamma * sq_dist
    return torch.softmax(w_l * s, dim=-1) @ v


# ---------------------------------------------------------------- other normalizations
def sigmoid_attention(q, k, v):
    """Sigmoid attention (Ramapuram et al., 2024): ``sigmoid(QKᵀ/√d + b)·V`` with b = -log N."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) - math.log(k.size(-2))
    return torch.sigmoid(s) @ v


def relu_attention(q, k, v):
    """ReLU attention (Wortsman et al., 2023): ``relu(QKᵀ/√d) / N · V``."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    return (torch.relu(s) / k.size(-2)) @ v


def softmax_one(q, k, v):
    """Quiet softmax, softmax₁(x) = exp(x) / (1 + Σ exp(x)), in its stable form."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    m = s.amax(-1, keepdim=True).clamp(min=0)
    e = torch.exp(s - m)
    return (e / (torch.exp(-m) + e.sum(-1, keepdim=True))) @ v


def retention_norm(q, k, v):
    """Retention-style normalization (RetNet): scores divided by ``clamp(Σ|s|, min=1)``."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    s = s / s.abs().sum(-1, keepdim=True).clamp(min=1)
    return s @ v


# ---------------------------------------------------------------- not attention chains
def mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def layer_norm(x, weight, bias):
    return F.layer_norm(x, x.shape[-1:], weight, bias)


def softmax_over_queries(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v


# ---------------------------------------------------------------- inputs
def _qkv(s: Shape, dtype, device, layout="bhsd", hq=None, hkv=None):
    hq, hkv = hq or s.H, hkv or s.Hkv
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    if layout == "bshd":
        return rnd(s.B, s.M, hq, s.D), rnd(s.B, s.N, hkv, s.D), rnd(s.B, s.N, hkv, s.Dv)
    return rnd(s.B, hq, s.M, s.D), rnd(s.B, hkv, s.N, s.D), rnd(s.B, hkv, s.N, s.Dv)


def _mha(s, dtype, device):
    return _qkv(s, dtype, device, hkv=s.H)


def _gqa(s, dtype, device):
    return _qkv(s, dtype, device)


def _bshd(s, dtype, device):
    return _qkv(s, dtype, device, layout="bshd", hkv=s.H)


def _with_doc_ids(s, dtype, device):
    ids = torch.sort(torch.randint(0, 4, (s.N,), generator=torch.Generator().manual_seed(1)))[0]
    return (*_mha(s, dtype, device)[:3], ids.to(device)) if s.M == s.N else None


def _with_key_mask(s, dtype, device):
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(s.B, 1, 1, s.N, generator=g) > 0.3
    mask[..., 0] = True
    return (*_mha(s, dtype, device), mask.to(device))


def _with_lengths(s, dtype, device):
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, s.N + 1, (s.B,), generator=g)
    lengths[0] = s.N
    return (*_mha(s, dtype, device), lengths.to(device))


def _with_bias(s, dtype, device):
    g = torch.Generator().manual_seed(3)
    bias = torch.randn(s.B, 1, s.M, s.N, generator=g).to(dtype=dtype, device=device)
    return (*_mha(s, dtype, device), bias)


def _diff(s, dtype, device):
    q, k, _ = _qkv(s, dtype, device, hq=2 * s.H, hkv=2 * s.H)
    v = _qkv(dataclasses.replace(s, Dv=2 * s.Dv), dtype, device, hkv=s.H)[2]
    return q, k, v


def _diff_transformer(s, dtype, device):
    g = torch.Generator().manual_seed(7)
    lambdas = tuple((0.1 * torch.randn(s.D, generator=g)).to(dtype=dtype, device=device) for _ in range(4))
    weight = (1 + 0.1 * torch.randn(2 * s.Dv, generator=g)).to(dtype=dtype, device=device)
    return _diff(s, dtype, device) + lambdas + (weight,)


def _diff_chunked(s, dtype, device):
    return _qkv(s, dtype, device, hq=2 * s.H, hkv=2 * s.H)[:2] + (
        _qkv(s, dtype, device, hkv=s.H)[2],
    )


def _evoformer(s, dtype, device):
    """Evoformer inputs with N_seq = 3 and S = N: q, k, v, mask, pair_bias, gate."""
    g = torch.Generator().manual_seed(4)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    n_seq, length = 3, s.N
    q, k, v, gate = (rnd(s.B, n_seq, length, s.H, s.D) for _ in range(4))
    mask = torch.rand(s.B, n_seq, length, generator=g) > 0.2
    mask[:, 0, :] = mask[:, :, 0] = True  # every row and column sees a key, as in real MSAs
    mask = mask.to(dtype=dtype, device=device)
    pair_bias = rnd(s.B, 1, s.H, length, length)
    return q, k, v, mask, pair_bias, gate


def _evoformer_col(s, dtype, device):
    q, k, v, mask, _, gate = _evoformer(s, dtype, device)
    return q, k, v, mask, gate


def _ipa(s, dtype, device):
    g = torch.Generator().manual_seed(9)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)

    q, k, v = _qkv(s, dtype, device, hkv=s.H)
    qp, kp = rnd(s.B, s.H, s.M, 12), rnd(s.B, s.H, s.N, 12)
    return q, k, qp, kp, v, rnd(s.B, s.H, s.M, s.N), rnd(s.H)


def _mlp(s, dtype, device):
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(*sh, generator=g).to(dtype=dtype, device=device)
                 for sh in ((s.M, s.D), (s.D, 4 * s.D), (4 * s.D, s.D)))


def _layer_norm(s, dtype, device):
    g = torch.Generator().manual_seed(6)
    return tuple(torch.randn(*sh, generator=g).to(dtype=dtype, device=device)
                 for sh in ((s.B, s.M, s.D), (s.D,), (s.D,)))


@dataclasses.dataclass(frozen=True)
class Variant:
    """A program, its input maker, and how many attention chains it holds."""

    name: str
    fn: Callable
    make_inputs: Callable
    chains: int = 1
    square: bool = False  # needs M == N

    def inputs(self, shape: Shape = Shape(), dtype=torch.float32, device="cpu") -> tuple:
        if self.square:
            shape = dataclasses.replace(shape, M=shape.N)
        return self.make_inputs(shape, dtype, device)


VARIANTS = {
    v.name: v
    for v in [
        Variant("vanilla", vanilla, _mha),
        Variant("scale_q_first", scale_q_first, _mha),
        Variant("manual_softmax", manual_softmax, _mha),
        Variant("bshd", bshd, _bshd),
        Variant("einsum", einsum, _mha),
        Variant("einsum_bshd", einsum_bshd, _bshd),
        Variant("gqa_repeat_interleave", gqa_repeat_interleave, _gqa),
        Variant("gqa_expand", gqa_expand, _gqa),
        Variant("alibi", alibi, _mha),
        Variant("softcap", softcap, _mha),
        Variant("causal", causal, _mha),
        Variant("sliding_window", sliding_window, _mha),
        Variant("prefix_lm", prefix_lm, _mha),
        Variant("block_causal", block_causal, _mha),
        Variant("dilated_window", dilated_window, _mha),
        Variant("neighbourhood_2d", neighbourhood_2d, _mha),
        Variant("document_mask", document_mask, _with_doc_ids, square=True),
        Variant("key_padding", key_padding, _with_key_mask),
        Variant("key_lengths", key_lengths, _with_lengths),
        Variant("additive_mask", additive_mask, _with_bias),
        Variant("sdpa_key_lengths", sdpa_key_lengths, _with_lengths),
        Variant("diff_attention", diff_attention, _diff),
        Variant("diff_attention_causal", diff_attention_causal, _diff),
        Variant("diff_transformer", diff_transformer, _diff_transformer),
        Variant("diff_attention_chunked", diff_attention_chunked, _diff_chunked, chains=2),
        Variant("evoformer_row", evoformer_row, _evoformer, square=True),
        Variant("evoformer_col", evoformer_col, _evoformer_col, square=True),
        Variant("invariant_point_attention", invariant_point_attention, _ipa),
        Variant("sigmoid_attention", sigmoid_attention, _mha),
        Variant("relu_attention", relu_attention, _mha),
        Variant("softmax_one", softmax_one, _mha),
        Variant("retention_norm", retention_norm, _mha),
        Variant("mlp", mlp, _mlp, chains=0),
        Variant("layer_norm", layer_norm, _layer_norm, chains=0),
        Variant("softmax_over_queries", softmax_over_queries, _mha, chains=0),
    ]
}
