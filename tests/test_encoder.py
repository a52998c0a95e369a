"""The encoder matches transformers' BertForMaskedLM parameter-for-parameter and logit-for-logit."""

import pytest
import torch

from mlmlab.models.encoder import BertForMLM, EncoderConfig, SequenceClassifier

transformers = pytest.importorskip("transformers")

CFG = EncoderConfig(vocab_size=211, hidden_size=48, num_layers=3, num_heads=4, intermediate_size=96,
                    max_position_embeddings=64)


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
