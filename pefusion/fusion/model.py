"""The PE-fusion classifier (docs/model.md): embed, fuse position, encode, mean-pool, classify.

    E = Embedding(V, d, padding_idx=0)(x) · √d          # (B, T, d)
    H = fuse(E, P)                                      # P (1, T, d) from the input PE
    H = EncoderLayer^L(H, key padding mask x == 0)      # nn.TransformerEncoderLayer semantics
    logits = Linear(d, C)(Dropout(mean of H over non-pad tokens))   # head_dropout, 0 unless the preset sets it

`EncoderLayer` has exactly the parameters of nn.TransformerEncoderLayer (same names, so state_dicts are
interchangeable) but runs attention through F.scaled_dot_product_attention, with hooks for the attention-level
PEs (`rotary` on q/k, `alibi` on the logits). Like nn.TransformerEncoder with its default `norm=None`, there is
no final LayerNorm after the stack by default, also with pre-LN; this keeps the parameter count equal to the
paper's model. `final_norm` adds it (nn.TransformerEncoder's `norm=LayerNorm(d)`) for pre-LN stacks, whose
residual stream otherwise reaches the pooling unnormalised; `embed_dropout` drops features of the fused H and
`embed_scale=False` leaves out the √d.

The same classes run S seeds' models as one (`pefusion.fusion.stacked`): with every parameter stacked to
(S, ...) (`pefusion.fusion.layers`), the input is (S, B, T) and the logits (S, B, C); attention sees the seeds
folded into its batch, (S·B, H, T, hd), ordinary tensors for whichever SDPA kernel the device has. Every shape
comment below is a plain model's; a stack puts S in front.

Training on a CPU, dropout runs through `pefusion.fusion.attention` (`attention` for the attention
probabilities, instead of SDPA's math path, and `Dropout` for activations).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pefusion.errors import ConfigError
from pefusion.fusion.attention import Dropout, attention
from pefusion.fusion.config import ModelConfig
from pefusion.fusion.layers import Embedding, LayerNorm, Linear, linear
from pefusion.fusion.operators import build_fusion
from pefusion.fusion.positional import ALiBi, Rotary, build_positional

# A saved best model (a trial's checkpoint/ folder): its state_dict, and the config that rebuilds it.
MODEL_WEIGHTS = "model.pt"
MODEL_CONFIG = "model_config.json"


class SelfAttention(nn.Module):
    """nn.MultiheadAttention's parameters (packed in_proj (3d, d) + bias, out_proj Linear(d, d)), SDPA inside."""

    def __init__(self, d: int, nhead: int, dropout: float):
        super().__init__()
        self.nhead, self.dropout = nhead, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d, d))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d))
        self.out_proj = Linear(d, d)
        # nn.MultiheadAttention's init
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        """x (B, T, d); attn_mask bool (B, 1, 1, T) True = attend, or float logit bias (B, H, T, T) in q's dtype
        (`PEFusionClassifier.forward` builds it in the compute dtype). Stacked,
        x (S, B, T, d) and the mask's batch S·B: the seeds' documents are one batch of S·B to SDPA."""
        T, d = x.shape[-2:]
        qkv = linear(x, self.in_proj_weight, self.in_proj_bias)  # (B, T, 3d)
        q, k, v = qkv.reshape(-1, T, 3, self.nhead, d // self.nhead).permute(2, 0, 3, 1, 4)  # each (B, H, T, hd)
        if rotary is not None:
            q, k = rotary(q), rotary(k)
        y = attention(q, k, v, attn_mask, self.dropout if self.training else 0.0)  # (B, H, T, hd)
        return self.out_proj(y.transpose(1, 2).reshape(x.shape))


class EncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer(d, nhead, dim_ff, dropout, activation, batch_first=True, norm_first), rebuilt.

    Dropout sits where PyTorch puts it: on the attention probabilities, after out_proj (dropout1), inside the
    feed-forward after the activation (dropout) and after linear2 (dropout2).
    """

    def __init__(self, d: int, nhead: int, dim_ff: int, dropout: float, activation: str, norm_first: bool,
                 attn_dropout: float | None = None):
        super().__init__()
        self.self_attn = SelfAttention(d, nhead, dropout if attn_dropout is None else attn_dropout)
        self.linear1, self.linear2 = Linear(d, dim_ff), Linear(dim_ff, d)
        self.norm1, self.norm2 = LayerNorm(d), LayerNorm(d)
        self.dropout, self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = F.gelu if activation == "gelu" else F.relu
        self.norm_first = norm_first

    def _attend(self, x: torch.Tensor, attn_mask: torch.Tensor, rotary: Rotary | None) -> torch.Tensor:
        return self.dropout1(self.self_attn(x, attn_mask, rotary))

    def _feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d); attn_mask as in `SelfAttention.forward`."""
        if self.norm_first:
            x = x + self._attend(self.norm1(x), attn_mask, rotary)
            return x + self._feed_forward(self.norm2(x))
        x = self.norm1(x + self._attend(x, attn_mask, rotary))
        return self.norm2(x + self._feed_forward(x))


class PEFusionClassifier(nn.Module):
    """Document classifier of the PE-fusion study. Keeps `config`, `vocab_size` and `num_classes` so that a
    checkpoint (state_dict + these three) rebuilds it with `build_model_from_config`."""

    def __init__(self, config: ModelConfig, vocab_size: int, num_classes: int):
        super().__init__()
        self.config, self.vocab_size, self.num_classes = config, vocab_size, num_classes
        d = config.d_model
        self.embed = Embedding(vocab_size, d, padding_idx=0)
        self.positional = build_positional(config)
        self.fuse = build_fusion(config)
        self.layers = nn.ModuleList(
            EncoderLayer(d, config.nhead, config.dim_ff, config.dropout, config.activation, config.norm_first,
                         config.attn_dropout)
            for _ in range(config.num_layers)
        )
        self.final_norm = LayerNorm(d) if config.final_norm else None
        self.embed_dropout = Dropout(config.embed_dropout) if config.embed_dropout > 0 else None
        self.head_dropout = Dropout(config.head_dropout) if config.head_dropout > 0 else None
        self.head = Linear(d, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T) token ids, 0 = padding -> logits (B, C); stacked, (S, B, T) -> (S, B, C)."""
        T = x.shape[-1]
        if T > self.config.max_len:
            raise ValueError(f"input length {T} exceeds the model's max_len={self.config.max_len}: "
                             f"truncate documents to at most max_len tokens or build the model with a larger max_len")
        pad = x == 0  # (B, T)
        h = self.embed(x)  # (B, T, d)
        if self.config.embed_scale:
            h = h * math.sqrt(self.config.d_model)
        if self.config.fusion != "none":
            h = self.fuse(h, self.positional(T), pad)
        if self.embed_dropout is not None:
            h = self.embed_dropout(h)
        # A document of padding only would give all-masked softmax rows (NaN): let it attend everywhere; its
        # pooled vector is zero anyway.
        attend = ~pad | pad.all(dim=-1, keepdim=True)  # (B, T)
        attn_mask = attend.reshape(-1, T)[:, None, None, :]  # (B, 1, 1, T), broadcast over heads and queries
        if isinstance(self.positional, ALiBi):
            # One logit bias for every layer, in the dtype attention computes in (bf16 under autocast), -inf at each
            # document's padding: (B, H, T, T), kept once for backward. Built for every batch, padded or not:
            # asking whether it has padding would make the host wait for the device.
            dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else h.dtype
            attn_mask = self.positional(T, dtype).masked_fill(~attn_mask, float("-inf"))  # (B, H, T, T)
        rotary = self.positional if isinstance(self.positional, Rotary) else None
        for layer in self.layers:
            h = layer(h, attn_mask, rotary)
        if self.final_norm is not None:
            h = self.final_norm(h)
        keep = (~pad).unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        pooled = (h * keep).sum(dim=-2) / keep.sum(dim=-2).clamp(min=1.0)  # (B, d)
        if self.head_dropout is not None:
            pooled = self.head_dropout(pooled)
        return self.head(pooled)


def build_model_from_config(cfg: ModelConfig, vocab_size: int, num_classes: int) -> PEFusionClassifier:
    """The classifier for an already validated ModelConfig."""
    if vocab_size < 2 or num_classes < 2:
        raise ConfigError(f"vocab_size={vocab_size} and num_classes={num_classes} must both be >= 2")
    return PEFusionClassifier(cfg, vocab_size, num_classes)


def build_model(vocab_size: int, num_classes: int, **hparams) -> PEFusionClassifier:
    """The classifier for ModelConfig field values (`d_model`, `pe_type`, `fusion`, ...); defaults = the paper's
    ArXiv model. Unknown names and incompatible choices raise ConfigError naming the fix."""
    allowed = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown model hyperparameter {unknown[0]!r}; allowed: {', '.join(allowed)}")
    return build_model_from_config(ModelConfig(**hparams), vocab_size, num_classes)


def load_checkpoint(folder: str | Path) -> torch.nn.Module:
    """Rebuild a saved best model from its checkpoint folder (`model.pt` + `model_config.json`), in eval mode."""
    folder = Path(folder)
    cfg = json.loads((folder / MODEL_CONFIG).read_text())
    model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
    model = build_model_from_config(ModelConfig(**{k: v for k, v in cfg.items() if k in model_keys}),
                                    cfg["vocab_size"], cfg["num_classes"])
    model.load_state_dict(torch.load(folder / MODEL_WEIGHTS, weights_only=True, map_location="cpu"))
    return model.eval()
