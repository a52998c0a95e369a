"""The encoder matches transformers' BertForMaskedLM (norm=post) and RobertaPreLayerNormForMaskedLM (norm=pre, through
mlmlab.export's name mapping) parameter-for-parameter and logit-for-logit."""

import dataclasses

import pytest
import torch

from mlmlab.config import ConfigError
from mlmlab.export import hf_config, to_prelayernorm
from mlmlab.models.encoder import BertForMLM, EncoderConfig, SequenceClassifier

transformers = pytest.importorskip("transformers")

CFG = EncoderConfig(vocab_size=211, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=96,
                    max_position_embeddings=64)
PRE = dataclasses.replace(CFG, norm="pre")


def hf_model():
    c = transformers.BertConfig(vocab_size=CFG.vocab_size, hidden_size=CFG.hidden_size,
                                num_hidden_layers=CFG.num_layers, num_attention_heads=CFG.num_heads,
                                intermediate_size=CFG.intermediate_size, max_position_embeddings=CFG.max_position_embeddings,
                                type_vocab_size=CFG.type_vocab_size, layer_norm_eps=CFG.layer_norm_eps)
    return transformers.BertForMaskedLM(c).eval()


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, CFG.vocab_size, (4, 40), generator=g)
    am = torch.ones_like(ids)
    am[1, 30:] = 0
    am[3, 12:] = 0
    types = torch.zeros_like(ids)
    types[:, 20:] = 1
    return ids, am, types


def test_state_dict_keys_and_shapes_match():
    ours, theirs = BertForMLM(CFG).state_dict(), hf_model().state_dict()
    assert set(ours) == set(theirs)
    assert all(ours[k].shape == theirs[k].shape for k in ours)


@pytest.mark.parametrize("direction", ["ours_to_hf", "hf_to_ours"])
def test_same_logits(direction):
    torch.manual_seed(0)
    ours, hf = BertForMLM(CFG).eval(), hf_model()
    if direction == "ours_to_hf":
        hf.load_state_dict(ours.state_dict(), strict=True)
    else:
        ours.load_state_dict(hf.state_dict(), strict=True)
    ids, am, types = batch()
    with torch.no_grad():
        a = ours(ids, am, types)
        b = hf(input_ids=ids, attention_mask=am, token_type_ids=types).logits
    keep = am.bool()  # padded query positions are don't-care in both
    torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=0)


def test_decoder_is_tied_and_sparse_loss_matches_dense():
    m = BertForMLM(CFG).eval()
    assert m.cls.predictions.decoder.weight is m.bert.embeddings.word_embeddings.weight
    assert m.cls.predictions.bias is m.cls.predictions.decoder.bias
    ids, am, _ = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 3:9] = ids[:, 3:9]
    with torch.no_grad():
        sparse, _, _ = m.mlm_loss(ids, am, labels)
        dense = torch.nn.functional.cross_entropy(m(ids, am).flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(sparse, dense, atol=1e-6, rtol=1e-6)


def test_classifier_loads_pretrained_encoder():
    mlm = BertForMLM(CFG)
    clf = SequenceClassifier(CFG, num_labels=3)
    clf.bert.load_state_dict(mlm.bert.state_dict())
    ids, am, _ = batch()
    assert clf.eval()(ids, am).shape == (4, 3)
    torch.testing.assert_close(clf.bert(ids, am), mlm.eval().bert(ids, am))


def test_pre_ln_trains_and_has_its_own_layernorms():
    torch.manual_seed(0)
    m = BertForMLM(PRE).train()
    ids, am, _ = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2:8] = ids[:, 2:8]
    loss, _, _ = m.mlm_loss(ids, am, labels)
    assert torch.isfinite(loss)
    loss.backward()
    no_grad = [n for n, p in m.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not no_grad
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    post = BertForMLM(CFG)
    assert m.bert.LayerNorm is not None and post.bert.LayerNorm is None  # the final LayerNorm is pre-LN's alone
    layer, post_layer = m.bert.encoder.layer[0], post.bert.encoder.layer[0]
    assert layer.attention.LayerNorm is not None and layer.intermediate.LayerNorm is not None
    assert layer.attention.output.LayerNorm is None and layer.output.LayerNorm is None
    assert post_layer.attention.LayerNorm is None and post_layer.intermediate.LayerNorm is None


def test_unknown_norm_is_refused():
    with pytest.raises(ValueError, match=r"model\.norm='sideways'.*allowed: post, pre"):
        EncoderConfig(vocab_size=10, norm="sideways")
    with pytest.raises(ConfigError, match=r"model\.norm='sideways'.*allowed: post, pre"):
        hf_config({**CFG.to_dict(), "norm": "sideways"})


ROPE = dataclasses.replace(PRE, position="rope")


def test_rope_attention_depends_on_relative_offsets_only():
    """Rotary positions: no position embedding; q_m . k_n depends on m - n only, so an encoder of a sequence of one
    repeated token gives every position the same output (learned positions would tell them apart), and the model
    trains with gradients everywhere."""
    from mlmlab.models.encoder import apply_rope, rope_tables

    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, 12, generator=g), torch.randn(1, 1, 1, 12, generator=g)
    cos, sin = rope_tables(30, 12)

    def dot(m, n):
        return (apply_rope(q, cos[m:m + 1], sin[m:m + 1]) * apply_rope(k, cos[n:n + 1], sin[n:n + 1])).sum()

    assert torch.allclose(dot(3, 1), dot(20, 18), atol=1e-5) and not torch.allclose(dot(3, 1), dot(3, 2), atol=1e-3)
    assert torch.allclose(apply_rope(q, cos[:1], sin[:1]), q)  # position 0 is not rotated
    torch.manual_seed(0)
    m = BertForMLM(ROPE).eval()
    assert m.bert.embeddings.position_embeddings is None
    assert not any("position_embeddings" in n for n in m.state_dict())
    same = m.bert(torch.full((1, 10), 7))
    assert torch.allclose(same[0, 0], same[0, 9], atol=1e-5)
    learned = BertForMLM(PRE).eval().bert(torch.full((1, 10), 7))
    assert not torch.allclose(learned[0, 0], learned[0, 9], atol=1e-3)
    m.train()
    ids, am, _ = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 2:8] = ids[:, 2:8]
    loss, _, _ = m.mlm_loss(ids, am, labels)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_rope_is_refused_where_it_cannot_go():
    with pytest.raises(ValueError, match=r"model\.position='alibi'.*allowed: learned, rope"):
        EncoderConfig(vocab_size=10, position="alibi")
    with pytest.raises(ConfigError, match=r"model\.position='rope' cannot be exported; allowed: learned"):
        hf_config(ROPE.to_dict())


def test_hf_config_follows_norm():
    old = {k: v for k, v in CFG.to_dict().items() if k != "norm"}  # a checkpoint from before model.norm: post-LN
    assert type(hf_config(old)) is transformers.BertConfig
    assert hf_config(old).max_position_embeddings == CFG.max_position_embeddings
    pre = hf_config(PRE.to_dict())
    assert type(pre) is transformers.RobertaPreLayerNormConfig
    assert pre.pad_token_id == 0 and pre.max_position_embeddings == PRE.max_position_embeddings + 1


def hf_pre_model():
    return transformers.RobertaPreLayerNormForMaskedLM(hf_config(PRE.to_dict())).eval()


def test_pre_ln_names_map_onto_roberta_prelayernorm():
    ours = BertForMLM(PRE).state_dict()
    mapped, theirs = to_prelayernorm(ours), hf_pre_model().state_dict()
    assert set(mapped) == set(theirs)
    assert all(mapped[k].shape == theirs[k].shape for k in mapped)
    pos = mapped["roberta_prelayernorm.embeddings.position_embeddings.weight"]
    torch.testing.assert_close(pos[1:], ours["bert.embeddings.position_embeddings.weight"], atol=0, rtol=0)


@pytest.mark.parametrize("with_types", [False, True])
def test_pre_ln_same_logits_as_roberta_prelayernorm(with_types):
    torch.manual_seed(0)
    ours, hf = BertForMLM(PRE).eval(), hf_pre_model()
    hf.load_state_dict(to_prelayernorm(ours.state_dict()), strict=True)
    ids, am, types = batch()
    ids = ids.masked_fill(am == 0, 0)  # right padding with [PAD] = 0, as our tokenizer pads
    types = types if with_types else None
    with torch.no_grad():
        a = ours(ids, am, types)
        b = hf(input_ids=ids, attention_mask=am, token_type_ids=types).logits
    keep = am.bool()
    torch.testing.assert_close(a[keep], b[keep], atol=1e-5, rtol=0)
