"""The PE-fusion classifier: every allowed (pe_type, fusion) pair, the PE tables against their closed forms, the
fusion operators, and equivalence with PyTorch's nn.TransformerEncoderLayer. Tiny sizes: runs in seconds."""
from __future__ import annotations

import dataclasses
import io
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pefusion import ConfigError, ModelConfig, build_model, build_model_from_config
from pefusion.fusion.config import FUSIONS, PAPER_PE_TYPES, PE_TYPES
from conftest import allowed_pairs
from study_names import PAPER_FUSIONS
from pefusion.fusion.model import EncoderLayer, SelfAttention
from pefusion.fusion.operators import build_fusion
from pefusion.fusion.positional import ALiBi, PaperRelative, PaperRope, Rotary, Sinusoidal, build_positional

V, C, D, NHEAD, FF, LAYERS, MAX_LEN, KERNEL = 50, 3, 16, 2, 24, 2, 20, 3
PAIRS = allowed_pairs()
PAIR_IDS = [f"{pe}-{fu}" for pe, fu in PAIRS]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and spinning threads crawl when the other core is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(pe_type: str, fusion: str, seed: int = 0, **overrides) -> nn.Module:
    torch.manual_seed(seed)
    hp = dict(d_model=D, nhead=NHEAD, num_layers=LAYERS, dim_ff=FF, dropout=0.1, max_len=MAX_LEN,
              gate_kernel=KERNEL, pe_type=pe_type, fusion=fusion) | overrides
    return build_model(V, C, **hp)


def documents(*lengths: int, T: int, seed: int = 1) -> torch.Tensor:
    """Right-padded token ids (len(lengths), T), ids in 1..V-1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        x[row, :n] = torch.randint(1, V, (n,), generator=g)
    return x


# ---------------------------------------------------------------------------------------------------------
# every allowed pair
# ---------------------------------------------------------------------------------------------------------


def test_allowed_pairs_cover_the_study():
    assert len(PAIRS) == 42  # 4 paper PEs × 8 input fusions + none × 8 + rotary + alibi
    assert {(pe, fu) for pe in PAPER_PE_TYPES for fu in PAPER_FUSIONS} <= set(PAIRS)


@pytest.mark.parametrize("pe_type,fusion", PAIRS, ids=PAIR_IDS)
def test_forward_backward_shapes_and_finite(pe_type, fusion):
    model = tiny_model(pe_type, fusion).train()
    x = documents(20, 13, 5, T=20)
    logits = model(x)
    assert logits.shape == (3, C) and torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert model.head.weight.grad.abs().sum() > 0 and model.layers[0].self_attn.in_proj_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("pe_type,fusion", PAIRS, ids=PAIR_IDS)
def test_padding_does_not_change_logits(pe_type, fusion):
    model = tiny_model(pe_type, fusion).eval()
    short, long = documents(7, 12, T=12), documents(7, 12, T=20)
    with torch.no_grad():
        alone = model(short[:1, :7])  # no padding at all
        a, b = model(short), model(long)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(a[:1], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pe_type,fusion", PAIRS, ids=PAIR_IDS)
def test_token_order_matters_exactly_when_there_is_a_position_signal(pe_type, fusion):
    model = tiny_model(pe_type, fusion).eval()
    x = documents(15, T=15)
    with torch.no_grad():
        logits, shuffled = model(x), model(x[:, torch.randperm(15, generator=torch.Generator().manual_seed(3))])
    if pe_type == "none":  # the order-blind ablation: attention + mean pooling are permutation invariant
        torch.testing.assert_close(logits, shuffled, atol=1e-5, rtol=0)
    else:
        assert (logits - shuffled).abs().max() > 1e-4


def expected_param_count(pe_type: str, fusion: str, V: int, C: int, d: int, ff: int, layers: int, max_len: int,
                         kernel: int) -> int:
    """The paper model's parameter count, written out by hand (not read from any module)."""
    pe = max_len * d if pe_type in ("learned", "relative") else 0
    mlp = (2 * d * d + d) + (d * d + d)
    fuse = {"add": 0, "mul": 0, "none": 0, "concat": 2 * d * d + d, "gate_scalar": 2 * d + 1,
            "gate_vector": 2 * d * d + d, "mlp": mlp, "mlp_gate": mlp, "gate_cnn": d * kernel + d}[fusion]
    layer = (4 * d * d + 4 * d) + (2 * d * ff + ff + d) + 4 * d  # attention, feed-forward, two LayerNorms
    return V * d + pe + fuse + layers * layer + (d * C + C)


@pytest.mark.parametrize("pe_type,fusion", PAIRS, ids=PAIR_IDS)
def test_parameter_count_matches_the_formula(pe_type, fusion):
    model = tiny_model(pe_type, fusion)
    assert sum(p.numel() for p in model.parameters()) == expected_param_count(
        pe_type, fusion, V, C, D, FF, LAYERS, MAX_LEN, KERNEL)


def test_paper_arxiv_model_size():
    # The ArXiv preset's sinusoidal+add model with an 11-class head and a 50 000-word vocabulary.
    model = build_model(50_000, 11)
    assert sum(p.numel() for p in model.parameters()) == 50_000 * 128 + 2 * (4 * 128**2 + 4 * 128 + 2 * 128 * 256
                                                                             + 256 + 128 + 4 * 128) + 128 * 11 + 11
    layer_formula = 4 * D * D + 4 * D + 2 * D * FF + FF + D + 4 * D
    assert sum(p.numel() for p in nn.TransformerEncoderLayer(D, NHEAD, FF).parameters()) == layer_formula


# ---------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pe_type,fusion", sorted(set(itertools.product(PE_TYPES, FUSIONS)) - set(PAIRS)))
def test_disallowed_pairs_are_rejected(pe_type, fusion):
    with pytest.raises(ConfigError):
        tiny_model(pe_type, fusion)


@pytest.mark.parametrize("pe_type,fusion,fix", [("rotary", "add", "fusion='none'"), ("alibi", "gate_cnn", "fusion='none'"),
                                                 ("learned", "none", "'add'"), ("none", "mul", "'add'")])
def test_rejection_names_the_fix(pe_type, fusion, fix):
    with pytest.raises(ConfigError, match=fix):
        tiny_model(pe_type, fusion)


def test_unknown_hyperparameter_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown model hyperparameter 'd_modle'"):
        build_model(V, C, d_modle=16)


def test_model_keeps_what_a_checkpoint_needs_and_rebuilds_from_it():
    model = tiny_model("relative", "gate_cnn").eval()
    buffer = io.BytesIO()
    torch.save({"state_dict": model.state_dict(), "config": dataclasses.asdict(model.config),
                "vocab_size": model.vocab_size, "num_classes": model.num_classes}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    rebuilt = build_model_from_config(ModelConfig(**saved["config"]), saved["vocab_size"], saved["num_classes"])
    rebuilt.load_state_dict(saved["state_dict"])
    x = documents(9, 4, T=10)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), model(x))


def test_fixed_tables_stay_out_of_the_checkpoint():
    keys = tiny_model("sinusoidal", "add").state_dict().keys()
    assert not any(k.startswith("positional.") for k in keys)
    assert "positional.table" in tiny_model("relative", "add").state_dict()


@pytest.mark.parametrize("pe_type,fusion", [("sinusoidal", "add"), ("learned", "add"), ("relative", "concat"),
                                            ("rotary", "none"), ("alibi", "none"), ("none", "none")])
def test_sequences_longer_than_max_len_are_refused(pe_type, fusion):
    model = tiny_model(pe_type, fusion)
    model(documents(MAX_LEN, T=MAX_LEN))  # exactly max_len is fine
    with pytest.raises(ValueError, match=f"exceeds the model's max_len={MAX_LEN}"):
        model(documents(5, T=MAX_LEN + 1))


@pytest.mark.parametrize("pe_type,fusion", [("sinusoidal", "gate_cnn"), ("learned", "mlp_gate"), ("alibi", "none"),
                                            ("rotary", "none")])
def test_all_padding_document_gives_finite_logits(pe_type, fusion):
    model = tiny_model(pe_type, fusion).train()
    x = documents(0, 6, T=8)
    logits = model(x)
    assert torch.isfinite(logits).all()
    logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x)[0], model.head.bias)  # pooled vector of nothing = 0


# ---------------------------------------------------------------------------------------------------------
# positional schemes against their closed forms
# ---------------------------------------------------------------------------------------------------------


def test_sinusoidal_table_closed_form():
    P = Sinusoidal(max_len=100, d=D)(60)
    assert P.shape == (1, 60, D)
    for t, i in [(0, 0), (1, 0), (7, 3), (59, 7), (33, 5)]:
        angle = t / 10000 ** (2 * i / D)
        assert P[0, t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert P[0, t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_paper_rope_is_concat_of_sin_and_cos_not_a_rotation():
    P = PaperRope(max_len=100, d=D)(60)
    assert P.shape == (1, 60, D)
    for t, i in [(0, 0), (1, 0), (7, 3), (59, 7), (33, 5)]:
        f = 10000 ** (-2 * i / D)
        assert P[0, t, i].item() == pytest.approx(math.sin(t * f), abs=1e-6)
        assert P[0, t, D // 2 + i].item() == pytest.approx(math.cos(t * f), abs=1e-6)


def test_paper_relative_table_is_standard_normal_and_sliced():
    torch.manual_seed(0)
    pe = PaperRelative(max_len=4096, d=64)
    assert pe.table.shape == (4096, 64)
    assert abs(pe.table.mean().item()) < 0.01 and abs(pe.table.std().item() - 1) < 0.01
    torch.testing.assert_close(pe(10), pe.table[:10].unsqueeze(0))


def test_learned_and_none_positions():
    cfg = ModelConfig(d_model=D, nhead=NHEAD, max_len=MAX_LEN, pe_type="learned")
    pe = build_positional(cfg)
    torch.testing.assert_close(pe(7), pe.embed(torch.arange(7)).unsqueeze(0))
    zeros = build_positional(dataclasses.replace(cfg, pe_type="none"))(7)
    assert zeros.shape == (1, 7, D) and not zeros.any()


def test_rotary_scores_depend_on_relative_position_only():
    hd, T = 8, 20
    rotary = Rotary(max_len=32, head_dim=hd)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(hd, generator=g), torch.randn(hd, generator=g)
    Q, K = rotary(q.expand(T, hd)), rotary(k.expand(T, hd))  # row t: the vector rotated to position t
    torch.testing.assert_close(Q.norm(dim=-1), q.norm().expand(T))  # a rotation
    scores = Q @ K.T  # (T, T): score of query at m with key at n
    for shift in (1, 5, 11):
        torch.testing.assert_close(scores[shift:, shift:], scores[:-shift, :-shift], atol=1e-5, rtol=0)
    assert (scores[0] - scores[0, 0]).abs().max() > 1e-2  # but it does depend on m - n
    torch.testing.assert_close(scores[0, 0], q @ k)  # position 0 is the identity


def reference_rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding written out (the "rotate half" layout of pefusion.fusion.positional.Rotary), x (..., T, hd):
    out[t, j] = x_j cos(t f_j) − x_{j+hd/2} sin(t f_j), out[t, j + hd/2] = x_{j+hd/2} cos(t f_j) + x_j sin(t f_j),
    f_j = 10000^(−2j/hd), j < hd/2."""
    T, hd = x.shape[-2:]
    half = hd // 2
    t = torch.arange(T, dtype=torch.float64)[:, None]
    angle = t * 10000.0 ** (-2 * torch.arange(half, dtype=torch.float64) / hd)  # (T, hd/2)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()), -1)


def test_rotary_is_the_closed_form_rotation_of_each_head():
    x = torch.randn(2, NHEAD, MAX_LEN, D // NHEAD, dtype=torch.float64)
    rotary = Rotary(max_len=MAX_LEN, head_dim=D // NHEAD)
    # the cos/sin tables are float32 buffers, hence 1e-6
    torch.testing.assert_close(rotary(x), reference_rotate(x), atol=1e-6, rtol=0)
    torch.testing.assert_close(rotary(x[..., :7, :]), reference_rotate(x[..., :7, :]), atol=1e-6, rtol=0)


def test_rotary_acts_per_head_on_queries_and_keys():
    """SelfAttention with rotary = softmax(R(q) R(k)ᵀ / √hd) v per head, q, k, v from in_proj by parameter name:
    queries and keys are rotated, values are not."""
    torch.manual_seed(0)
    B, T, hd = 2, 9, D // NHEAD
    attn = SelfAttention(D, NHEAD, dropout=0.1).double().eval()
    w = {name: p.detach() for name, p in attn.named_parameters()}
    x = torch.randn(B, T, D, dtype=torch.float64)
    attend = torch.arange(T)[None, :] < torch.tensor([[T], [5]])  # (B, T): document 2 has 5 tokens
    with torch.no_grad():
        got = attn(x, attend[:, None, None, :], Rotary(max_len=MAX_LEN, head_dim=hd))
    heads = lambda y: y.view(B, T, NHEAD, hd).transpose(1, 2)  # (B, H, T, hd)
    q, k, v = (heads(x @ W.T + b) for W, b in zip(w["in_proj_weight"].chunk(3), w["in_proj_bias"].chunk(3)))
    q, k = reference_rotate(q), reference_rotate(k)
    logits = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~attend[:, None, None, :], float("-inf"))
    y = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(B, T, D)
    torch.testing.assert_close(got, y @ w["out_proj.weight"].T + w["out_proj.bias"], atol=1e-6, rtol=0)


def test_alibi_bias_is_minus_slope_times_distance():
    T = 9
    for nhead, slopes in [(2, [2**-4, 2**-8]), (8, [2.0**-h for h in range(1, 9)]),
                          (6, [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])]:
        bias = ALiBi(nhead)(T)
        assert bias.shape == (1, nhead, T, T)
        i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
        for h, m in enumerate(slopes):
            torch.testing.assert_close(bias[0, h], -m * (i - j).abs().float())
            for n in range(T):  # a function of |i - j| alone
                assert torch.unique(bias[0, h][(i - j).abs() == n]).numel() == 1


def test_alibi_bias_is_built_once_per_batch_in_the_compute_dtype_and_shared_by_the_layers(monkeypatch):
    """Under bf16 autocast, every layer's attention gets the same (B, H, T, T) bf16 tensor (one copy kept for
    backward, not one per layer), -inf exactly at each document's padded keys and the ALiBi bias elsewhere."""
    import torch.nn.functional as F

    sdpa, masks = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = build_model(V, C, d_model=D, nhead=NHEAD, num_layers=3, dim_ff=FF, dropout=0.0, max_len=MAX_LEN,
                        pe_type="alibi", fusion="none")
    tokens = torch.randint(1, V, (2, 12), generator=torch.Generator().manual_seed(0))
    tokens[1, 7:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens)
    assert len(masks) == 3 and all(m is masks[0] for m in masks)
    mask = masks[0]
    assert mask.dtype == torch.bfloat16 and mask.shape == (2, NHEAD, 12, 12)
    expected = ALiBi(NHEAD)(12).expand(2, -1, -1, -1).clone()
    expected[1, :, :, 7:] = float("-inf")
    torch.testing.assert_close(mask.float(), expected.bfloat16().float(), rtol=0, atol=0)


# Ops that hand a tensor's value to the host: on a card each makes the host wait for the device.
HOST_READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.nonzero.default",
              "aten.masked_select.default", "aten.item.default"}


@pytest.mark.parametrize("pe_type,fusion", PAIRS, ids=PAIR_IDS)
def test_a_training_step_reads_no_value_back_from_the_device(pe_type, fusion, monkeypatch):
    """The trainers' own `step` — `Trainer.step` of a separate trial and `StackedTrainer.step` of 2 stacked seeds,
    fed by their own `train_steps` (the text preset shrunk: pre-LN, AdamW with warm-up, clipping at 1) — dispatches
    no op that hands a tensor's value to the host (`.item()`, `bool(tensor)`, `nonzero`, boolean indexing). The
    optimiser is fused, as `make_optimizer` builds it on a card: the CPU's unfused Adam reads its step count, a
    host tensor there. Dropout 0: on a CPU, pefusion's dropout kernels seed a numpy generator from torch's (a read
    of a host tensor); a card runs PyTorch's dropout."""
    import functools

    from torch.utils._python_dispatch import TorchDispatchMode

    from pefusion.fusion import check
    from pefusion.fusion.stacked import StackedTrainer
    from pefusion.fusion.training import Trainer

    class Reads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func) in HOST_READS:
                self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    seen: list[tuple[str, str]] = []

    def watched(name, step):
        def run(batch):
            with Reads() as mode:
                out = step(batch)
            seen.extend((name, op) for op in mode.seen)
            return out
        return run

    for name in ("Adam", "AdamW"):
        monkeypatch.setattr(torch.optim, name, functools.partial(getattr(torch.optim, name), fused=True))
    preset = check.check_preset("text", tiny=True)
    model = dataclasses.replace(preset.model, pe_type=pe_type, fusion=fusion, dropout=0.0, attn_dropout=0.0,
                                embed_dropout=0.0, head_dropout=0.0)
    train = dataclasses.replace(preset.train, device="cpu", precision="fp32")
    assert train.grad_clip > 0 and train.warmup > 0  # clipping and the schedule are in the step
    corpus = check.check_corpus(preset, 2, check.TINY_VOCAB)
    separate = Trainer(model, train, corpus, torch.device("cpu"))
    stacked = StackedTrainer(model, train, corpus, [0, 1], torch.device("cpu"))
    separate.step, stacked.step = watched("separate", separate.step), watched("stacked", stacked.step)
    steps = [len(list(separate.train_steps())), len(list(stacked.train_steps()))]
    assert steps == [check.STEPS, check.STEPS] and seen == [], seen


# ---------------------------------------------------------------------------------------------------------
# fusion operators
# ---------------------------------------------------------------------------------------------------------


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return x @ w.T + b


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + torch.exp(-z))


def _mlp(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """Linear(2d, d) -> ReLU -> Linear(d, d), from the parameters alone."""
    return _linear(_linear(x, w["net.0.weight"], w["net.0.bias"]).clamp(min=0), w["net.2.weight"], w["net.2.bias"])


# What each operator's parameters are called, and their shapes (d = D, K = KERNEL): the reference below reads them
# by these names, so an operator that renamed or reshaped them fails here rather than in the formula.
FUSION_PARAMETERS = {
    "add": {}, "mul": {}, "none": {},
    "concat": {"net.weight": (D, 2 * D), "net.bias": (D,)},
    "gate_scalar": {"net.weight": (1, 2 * D), "net.bias": (1,)},
    "gate_vector": {"net.weight": (D, 2 * D), "net.bias": (D,)},
    "mlp": {"net.0.weight": (D, 2 * D), "net.0.bias": (D,), "net.2.weight": (D, D), "net.2.bias": (D,)},
    "mlp_gate": {"net.0.weight": (D, 2 * D), "net.0.bias": (D,), "net.2.weight": (D, D), "net.2.bias": (D,)},
    "gate_cnn": {"conv.weight": (D, 1, KERNEL), "conv.bias": (D,)},
}


def reference_fuse(fusion: str, w: dict[str, torch.Tensor], E: torch.Tensor, P: torch.Tensor,
                   pad: torch.Tensor | None = None, order: str = "EP") -> torch.Tensor:
    """H = fuse(E, P) of docs/model.md in plain tensor algebra on the operator's parameters `w` (never its modules).

    `order="PE"` feeds [P; E] instead of [E; P] to the sub-network: the test uses it to show that its random
    weights tell the two orders apart. gate_cnn: the paper's depthwise Conv1d over the positions of P with "same"
    (zero) padding, K odd, written as a cross-correlation (PyTorch's Conv1d, no kernel flip):
        z[b, t, c] = bias[c] + Σ_k weight[c, 0, k] · P̃[b, t + k − K//2, c]
    with one deliberate addition to the paper (pefusion/fusion/operators.py, ConvGate): P̃ is P with the batch's padding
    positions zeroed as well as the positions outside 0..T−1, so a document's gates near its end do not depend on how
    much padding its batch has.
    """
    P = P.expand_as(E)
    if fusion == "add":
        return E + P
    if fusion == "mul":
        return E * P
    if fusion == "none":
        return E
    EP = torch.cat([E, P] if order == "EP" else [P, E], dim=-1)  # (B, T, 2d)
    if fusion == "concat":
        return _linear(EP, w["net.weight"], w["net.bias"])
    if fusion == "mlp":
        return _mlp(EP, w)
    if fusion in ("gate_scalar", "gate_vector"):
        z = _linear(EP, w["net.weight"], w["net.bias"])  # (B, T, 1) or (B, T, d)
    elif fusion == "mlp_gate":
        z = _mlp(EP, w)
    elif fusion == "gate_cnn":
        kernel, T = w["conv.weight"].shape[-1], E.shape[1]
        P_tilde = P if pad is None else P.masked_fill(pad[..., None], 0.0)
        zeros = P.new_zeros(P.shape[0], kernel // 2, P.shape[2])
        padded = torch.cat([zeros, P_tilde, zeros], dim=1)  # (B, T + K - 1, d): position t sits at t + K//2
        z = w["conv.bias"] + sum(w["conv.weight"][:, 0, k] * padded[:, k:k + T] for k in range(kernel))
    else:
        raise AssertionError(f"no reference for fusion {fusion!r}")
    g = _sigmoid(z)
    return g * E + (1 - g) * P


def float64_fusion(fusion: str, seed: int = 0) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The operator in float64, and its parameters by name (checked against FUSION_PARAMETERS)."""
    torch.manual_seed(seed)
    op = build_fusion(ModelConfig(d_model=D, nhead=NHEAD, pe_type="rotary" if fusion == "none" else "sinusoidal",
                                  fusion=fusion, gate_kernel=KERNEL)).double()
    w = dict(op.named_parameters())
    assert {name: tuple(p.shape) for name, p in w.items()} == FUSION_PARAMETERS[fusion]
    return op, {name: p.detach() for name, p in w.items()}


@pytest.mark.parametrize("fusion", FUSIONS)
def test_fusion_operator_values(fusion):
    """Each operator equals its formula (docs/model.md) computed from its parameters, in float64, with random E and
    P and a batch of a full and a padded document."""
    op, w = float64_fusion(fusion)
    gen = torch.Generator().manual_seed(1)
    E = torch.randn(2, 6, D, dtype=torch.float64, generator=gen)
    P = torch.randn(1, 6, D, dtype=torch.float64, generator=gen)
    pad = torch.arange(6)[None, :] >= torch.tensor([[6], [4]])  # document 2: 4 tokens, 2 pads
    with torch.no_grad():
        H = op(E, P, pad)
    assert H.shape == (2, 6, D)
    expected = reference_fuse(fusion, w, E, P, pad)
    # gate_cnn's H at padding positions is masked out downstream and no formula defines it: compare real ones
    compared = ~pad if fusion == "gate_cnn" else torch.ones_like(pad)
    torch.testing.assert_close(H[compared], expected[compared], atol=1e-12, rtol=1e-12)
    if fusion in ("concat", "mlp", "gate_scalar", "gate_vector", "mlp_gate"):  # the operators fed [E; P]: their
        # random weights tell [E; P] from [P; E], so the comparison above would catch a swapped order
        assert (reference_fuse(fusion, w, E, P, pad, order="PE") - expected)[compared].abs().max() > 1e-2


def test_gate_scalar_has_one_gate_per_position():
    op, _ = float64_fusion("gate_scalar")
    E, P = torch.randn(1, 4, D, dtype=torch.float64), torch.randn(1, 4, D, dtype=torch.float64)
    with torch.no_grad():
        g = (op(E, P) - P) / (E - P)  # (1, 4, D): the gate, the same in every feature
    torch.testing.assert_close(g, g[..., :1].expand_as(g), atol=1e-9, rtol=1e-9)
    assert (g[0, :, 0] - g[0, 0, 0]).abs().max() > 1e-3  # but not the same at every position


def test_gate_cnn_ignores_positions_behind_padding():
    torch.manual_seed(0)
    op = build_fusion(ModelConfig(d_model=D, nhead=NHEAD, fusion="gate_cnn", gate_kernel=5))
    E, P = torch.randn(1, 10, D), torch.randn(1, 10, D)
    pad = torch.arange(10)[None, :] >= 6
    torch.testing.assert_close(op(E, P, pad)[:, :6], op(E[:, :6], P[:, :6], None))
    assert (op(E, P, None)[:, 5] - op(E[:, :6], P[:, :6], None)[:, 5]).abs().max() > 1e-4  # the mask is needed


# ---------------------------------------------------------------------------------------------------------
# equivalence with PyTorch's encoder
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
@pytest.mark.parametrize("grad_enabled", [True, False], ids=["slow_path", "fast_path"])
def test_encoder_layer_equals_torch_transformer_encoder_layer(norm_first, activation, grad_enabled):
    torch.manual_seed(0)
    reference = nn.TransformerEncoderLayer(D, NHEAD, FF, 0.1, activation=activation, batch_first=True,
                                           norm_first=norm_first).eval()
    layer = EncoderLayer(D, NHEAD, FF, 0.1, activation, norm_first).eval()
    layer.load_state_dict(reference.state_dict())  # same names and shapes, strictly
    x, pad = torch.randn(3, 11, D), documents(11, 7, 3, T=11) == 0
    with torch.set_grad_enabled(grad_enabled):
        expected = reference(x, src_key_padding_mask=pad)
        got = layer(x, (~pad)[:, None, None, :])
    real = ~pad  # PyTorch's fast path (no grad) leaves padded positions undefined
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def reference_positions(pe_type: str, w: dict[str, torch.Tensor], T: int) -> torch.Tensor:
    """P (T, d) of docs/model.md: the fixed tables written out, the learned ones read from the model's parameters."""
    t = torch.arange(T, dtype=torch.float64)[:, None]
    angle = t / 10000.0 ** (2 * torch.arange(D // 2, dtype=torch.float64) / D)  # (T, d/2): t·f_i
    if pe_type == "sinusoidal":  # interleaved: P[t, 2i] = sin, P[t, 2i + 1] = cos
        return torch.stack((angle.sin(), angle.cos()), dim=-1).reshape(T, D).float()
    if pe_type == "rope":  # the paper's variant: sin block, then cos block
        return torch.cat((angle.sin(), angle.cos()), dim=-1).float()
    if pe_type == "learned":
        return w["positional.embed.weight"][:T]
    if pe_type == "relative":
        return w["positional.table"][:T]
    assert pe_type == "none"
    return torch.zeros(T, D)


# The text preset's recipe (pefusion.fusion.config): pre-LN + GELU with nn.TransformerEncoder's final norm, and
# the embedding without √d.
TEXT_RECIPE = dict(norm_first=True, activation="gelu", final_norm=True, embed_scale=False)


@pytest.mark.parametrize("pe_type,fusion,recipe", [
    ("learned", "gate_scalar", dict(norm_first=False, activation="relu")),
    ("learned", "gate_scalar", dict(norm_first=True, activation="gelu")),
    ("sinusoidal", "concat", dict(norm_first=False, activation="relu")),
    ("rope", "mlp_gate", dict(norm_first=False, activation="relu")),
    ("relative", "gate_cnn", dict(norm_first=False, activation="relu")),
    ("none", "add", dict(norm_first=False, activation="relu")),
    ("sinusoidal", "add", TEXT_RECIPE), ("learned", "gate_vector", dict(TEXT_RECIPE, embed_scale=True))])
def test_classifier_equals_paper_model_built_from_torch_modules(pe_type, fusion, recipe):
    """Logits = head(mean over real tokens of TransformerEncoder(fuse(Embedding(x)·√d, P))), with PyTorch's own
    encoder stack (and its final LayerNorm for final_norm) and everything else from the formulas of docs/model.md on
    the model's parameters by name."""
    model = tiny_model(pe_type, fusion, **recipe).eval()
    final = nn.LayerNorm(D) if recipe.get("final_norm") else None
    stack = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, NHEAD, FF, 0.1, activation=recipe["activation"], batch_first=True,
                                   norm_first=recipe["norm_first"]),
        num_layers=LAYERS, norm=final, enable_nested_tensor=False).eval()
    for ours, theirs in zip(model.layers, stack.layers):
        theirs.load_state_dict(ours.state_dict())
    w = {name: p.detach() for name, p in model.named_parameters()}
    if final is not None:
        final.load_state_dict({"weight": w["final_norm.weight"].uniform_(0.5, 1.5), "bias": w["final_norm.bias"]})
    x = documents(20, 9, 14, T=20)
    pad = x == 0
    with torch.no_grad():
        E = w["embed.weight"][x] * (math.sqrt(D) if recipe.get("embed_scale", True) else 1.0)
        fuse = {name.removeprefix("fuse."): p for name, p in w.items() if name.startswith("fuse.")}
        H = reference_fuse(fusion, fuse, E, reference_positions(pe_type, w, 20)[None], pad)
        out = stack(H, src_key_padding_mask=pad)
        mask = (~pad).unsqueeze(-1).float()
        expected = (out * mask).sum(1) / mask.sum(1) @ w["head.weight"].T + w["head.bias"]
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)


class NotebookClassifier(nn.Module):
    """The AG News / IMDB notebook's model as the paper's Table 1 ran it, written from its description: token
    embedding (padding id 0) × √d, the sinusoidal PE over all max_len positions, add / concat / per-feature gate,
    post-LN nn.TransformerEncoder with GELU, mean pooling over non-pad tokens, dropout on the pooled vector, then
    Linear(d, C)."""

    def __init__(self, vocab: int, classes: int, d: int, nhead: int, layers: int, ff: int, max_len: int, fusion: str,
                 dropout: float = 0.1):
        super().__init__()
        self.d, self.fusion = d, fusion
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
        pe = torch.zeros(max_len, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.mix = nn.Linear(2 * d, d) if fusion in ("concat", "gate") else None
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, nhead, ff, dropout, activation="gelu", batch_first=True), layers,
            enable_nested_tensor=False)
        self.drop, self.fc = nn.Dropout(dropout), nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = x == 0
        E = self.emb(x) * math.sqrt(self.d)
        P = self.pe[: x.shape[1]].unsqueeze(0).expand_as(E)
        if self.fusion == "add":
            H = E + P
        elif self.fusion == "concat":
            H = self.mix(torch.cat([E, P], dim=-1))
        else:
            g = torch.sigmoid(self.mix(torch.cat([E, P], dim=-1)))
            H = g * E + (1 - g) * P
        H = self.encoder(H, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.fc(self.drop((H * keep).sum(1) / keep.sum(1).clamp(min=1)))


@pytest.mark.parametrize("fusion,notebook", [("add", "add"), ("concat", "concat"), ("gate_vector", "gate")])
def test_imdb_preset_model_equals_the_notebook_model(fusion, notebook):
    """The `imdb` preset's model at tiny sizes, the notebook's model above with the same weights: equal logits
    in eval mode on documents padded to max_len, as the notebook padded them."""
    from pefusion.fusion.config import PRESETS

    cfg = dataclasses.replace(PRESETS["imdb"].model, d_model=D, nhead=NHEAD, num_layers=LAYERS, dim_ff=FF,
                              max_len=MAX_LEN, fusion=fusion)
    assert (cfg.pe_type, cfg.activation, cfg.norm_first, cfg.dropout, cfg.head_dropout) == \
        ("sinusoidal", "gelu", False, 0.1, 0.1)
    torch.manual_seed(0)
    ours = build_model_from_config(cfg, V, C).eval()
    theirs = NotebookClassifier(V, C, D, NHEAD, LAYERS, FF, MAX_LEN, notebook).eval()
    w = dict(ours.state_dict())
    theirs.emb.weight.data.copy_(w["embed.weight"])
    if theirs.mix is not None:
        theirs.mix.load_state_dict({"weight": w["fuse.net.weight"], "bias": w["fuse.net.bias"]})
    for mine, torch_layer in zip(ours.layers, theirs.encoder.layers):
        torch_layer.load_state_dict(mine.state_dict())
    theirs.fc.load_state_dict({"weight": w["head.weight"], "bias": w["head.bias"]})
    x = documents(MAX_LEN, 3, 11, T=MAX_LEN)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)


def test_head_dropout_drops_the_pooled_vector_in_training_only():
    """head_dropout is the only dropout here: training draws a fresh mask on the pooled vector (two passes
    differ), eval leaves it out (logits equal the model's without the key)."""
    model = tiny_model("sinusoidal", "add", dropout=0.0, head_dropout=0.5)
    plain = tiny_model("sinusoidal", "add", dropout=0.0)
    x = documents(8, 4, 12, T=12)
    with torch.no_grad():
        assert not torch.allclose(model.train()(x), model(x))
        torch.testing.assert_close(model.eval()(x), plain.eval()(x), atol=0, rtol=0)
