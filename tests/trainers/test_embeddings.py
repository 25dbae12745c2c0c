"""The q/k/v embedding modules: layout, factored F-SNE (their counts: tests/trainers/test_choices.py)."""
import pytest
import torch
import torch.nn.functional as F

from qkvsearch.trainers.model.choices import EMBEDDINGS
from qkvsearch.trainers.model.embeddings import FSNE, PSNE, SNE, make_codes

B, N, D, H = 2, 5, 16, 12


def _randomize(module):
    """Non-zero biases, so that a bias landing in the wrong slot would show."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    return module


def _mlp(x, w1, b1, w2, b2, act=F.relu):
    """σ(x W1ᵀ + b1) W2 + b2 with W1 as (h, d) and W2 as (h, d_out)."""
    return act(x @ w1.T + b1) @ w2 + b2


@pytest.mark.parametrize("dim_out", [D, 8])
def test_sne_matches_three_separate_mlps_in_qkv_order(dim_out):
    torch.manual_seed(0)
    m = _randomize(SNE(D, H, dim_out))
    x = torch.randn(B, N, D)
    out = m(x)
    assert out.shape == (B, N, 3 * dim_out)
    w1, b1 = m.fc1.weight.view(3, H, D), m.fc1.bias.view(3, H)
    for i in range(3):  # q, k, v in this order along the last dim
        ref = _mlp(x, w1[i], b1[i], m.fc2.weight[i], m.fc2.bias[i])
        torch.testing.assert_close(out[..., i * dim_out:(i + 1) * dim_out], ref)


def test_psne_shares_the_second_layer():
    torch.manual_seed(0)
    m = _randomize(PSNE(D, H, activation="gelu"))
    x = torch.randn(B, N, D)
    out = m(x)
    w1, b1 = m.fc1.weight.view(3, H, D), m.fc1.bias.view(3, H)
    for i in range(3):
        ref = _mlp(x, w1[i], b1[i], m.fc2.weight.T, m.fc2.bias, act=F.gelu)
        torch.testing.assert_close(out[..., i * D:(i + 1) * D], ref)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("code_size", [1, 8])
def test_fsne_factored_equals_literal_concatenation(activation, code_size):
    torch.manual_seed(0)
    m = _randomize(FSNE(D, H, code_size, activation=activation))
    x = torch.randn(B, N, D, requires_grad=True)
    fast, lit = m(x), m.forward_literal(x)
    torch.testing.assert_close(fast, lit, rtol=1e-5, atol=1e-5)
    # gradients agree too (weights, codes and input)
    g = torch.randn_like(fast)
    grads_fast = torch.autograd.grad(fast, [x, *m.parameters()], g)
    grads_lit = torch.autograd.grad(m.forward_literal(x), [x, *m.parameters()], g)
    for a, b in zip(grads_fast, grads_lit):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_fsne_codes_differentiate_q_k_v():
    torch.manual_seed(0)
    m = FSNE(D, H, 8)
    q, k, v = m(torch.randn(B, N, D)).chunk(3, dim=-1)
    assert not torch.allclose(q, k) and not torch.allclose(k, v)


def test_fsne_uses_given_codes_object():
    codes = make_codes(4)
    a, b = FSNE(D, H, 4, codes=codes), FSNE(D, H, 4, codes=codes)
    assert a.codes is codes and b.codes is codes
    with pytest.raises(ValueError, match="codes"):
        FSNE(D, H, 5, codes=codes)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="activation.*'tanh'"):
        SNE(D, H, activation="tanh")
    with pytest.raises(ValueError, match='embedding: expected one of linear, sne, psne, fsne, given "mlp"'):
        EMBEDDINGS["mlp"]
    with pytest.raises(ValueError, match="code_size.*0"):
        make_codes(0)
