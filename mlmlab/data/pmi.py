"""PMI units (``mask.unit=pmi``; Levine et al. 2021, "PMI-Masking"): word n-grams (2..``mask.pmi.max_n`` words)
whose pointwise mutual information in the training corpus is high are masked as one unit; every other word is its own
unit, as in whole-word masking.

The table is counted once over the packed training blocks and cached (like the unigram counts): words are the
tokenizer's words (the blocks' ``word_ids``), identified by a hash of their piece ids; an n-gram is n consecutive
words of one document (never across a ``[SEP]`` or a block edge). Its score is Levine et al.'s PMI_n with the
segmentations restricted to two parts::

    PMI_n(w_1..w_n) = log p(w_1..w_n) - max_{0<s<n} [log p(w_1..w_s) + log p(w_{s+1}..w_n)]

with ``p`` of a k-gram its count over the number of k-gram positions. The ``top_k`` n-grams by score among those seen
at least ``min_count`` times become units. In each block the matches are merged longest first, left to right within a
length (an n-gram that overlaps an earlier match of the same length, or any longer one, is not merged), and the
result is a new ``word_ids`` array: the masker's word path then selects whole PMI units.

numpy over the whole corpus (hashes in wrapping uint64 arithmetic), no Python loop over blocks: IMDB's 97,000 blocks
take a few seconds.
"""

from __future__ import annotations

import numpy as np

_P = np.uint64(1_000_003)  # piece-id hash base
_Q = np.uint64(0x9E3779B97F4A7C15)  # n-gram combine multiplier


def _flat_words(input_ids: np.ndarray, word_ids: np.ndarray):
    """Per word, in corpus order: its hash, block, first and last token position (flat), and per token its word index
    (-1: none)."""
    n, length = word_ids.shape
    w = word_ids.reshape(-1).astype(np.int64)
    ids = input_ids.reshape(-1).astype(np.uint64)
    valid = w >= 0
    pos = np.nonzero(valid)[0]
    blk = pos // length
    wv = w[valid]
    start = np.ones(len(pos), dtype=bool)
    start[1:] = (blk[1:] != blk[:-1]) | (wv[1:] != wv[:-1])
    word_index = np.cumsum(start) - 1  # per valid token
    starts = np.nonzero(start)[0]
    j = np.arange(len(pos)) - starts[word_index]  # position within its word
    powers = np.ones(length + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, length + 1):
            powers[i] = powers[i - 1] * _P
    with np.errstate(over="ignore"):
        contrib = (ids[valid] + np.uint64(1)) * powers[j]
    h = np.add.reduceat(contrib, starts) if len(starts) else np.zeros(0, dtype=np.uint64)
    ends = np.append(starts[1:], len(pos)) - 1
    tok_word = np.full(n * length, -1, dtype=np.int64)
    tok_word[pos] = word_index
    return h.astype(np.uint64), blk[starts], pos[starts], pos[ends], tok_word


def _ngrams(h: np.ndarray, adjacent: np.ndarray, max_n: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """n -> (hash of the n-gram starting at each word, valid) for n = 1..max_n."""
    m = len(h)
    out = {1: (h, np.ones(m, dtype=bool))}
    g, ok = h.copy(), np.ones(m, dtype=bool)
    for n in range(2, max_n + 1):
        nxt = np.zeros(m, dtype=np.uint64)
        nxt[: m - n + 1] = h[n - 1:]
        adj = np.zeros(m, dtype=bool)
        adj[: m - n + 1] = adjacent[n - 2: m - 1]
        with np.errstate(over="ignore"):
            g = g * _Q + nxt + np.uint64(n)
        ok = ok & adj
        out[n] = (g.copy(), ok.copy())
    return out


def _lookup(keys: np.ndarray, table_keys: np.ndarray, table_vals: np.ndarray) -> np.ndarray:
    i = np.searchsorted(table_keys, keys)
    i = np.clip(i, 0, max(len(table_keys) - 1, 0))
    hit = (table_keys[i] == keys) if len(table_keys) else np.zeros(len(keys), dtype=bool)
    return np.where(hit, table_vals[i] if len(table_vals) else 0, 0)


def pmi_units(input_ids: np.ndarray, word_ids: np.ndarray, max_n: int = 5, min_count: int = 5,
              top_k: int = 20000) -> tuple[np.ndarray, dict]:
    """The blocks' ``word_ids`` with high-PMI n-grams merged into one unit, and a report (table size, the share of
    words inside a merged unit, units per block)."""
    n_blocks, length = word_ids.shape
    h, blk, first, last, tok_word = _flat_words(input_ids, word_ids)
    m = len(h)
    adjacent = np.zeros(max(m - 1, 0), dtype=bool)
    if m > 1:
        adjacent = (blk[1:] == blk[:-1]) & (first[1:] == last[:-1] + 1)  # same block, no [SEP] between
    grams = _ngrams(h, adjacent, max_n)
    counts, totals = {}, {}
    for n, (g, ok) in grams.items():
        keys, c = np.unique(g[ok], return_counts=True)
        counts[n], totals[n] = (keys, c), max(int(ok.sum()), 1)
    logp = lambda n, g: np.log(np.maximum(_lookup(g, *counts[n]), 1) / totals[n])  # noqa: E731
    scored_keys, scored_pmi, scored_n = [], [], []
    for n in range(2, max_n + 1):
        g, ok = grams[n]
        keys, c = counts[n]
        keep = c >= min_count
        if not keep.any():
            continue
        # one occurrence of each kept n-gram, to read its parts' hashes
        sel = np.nonzero(ok)[0]
        uniq, idx = np.unique(g[sel], return_index=True)
        at = sel[idx]
        want = np.isin(uniq, keys[keep])
        uniq, at = uniq[want], at[want]
        best = np.full(len(uniq), -np.inf)
        for s in range(1, n):
            left = grams[s][0][at]
            right = grams[n - s][0][at + s]
            best = np.maximum(best, logp(s, left) + logp(n - s, right))
        pmi = np.log(_lookup(uniq, *counts[n]) / totals[n]) - best
        scored_keys.append(uniq)
        scored_pmi.append(pmi)
        scored_n.append(np.full(len(uniq), n))
    if scored_keys:
        allk, allp, alln = np.concatenate(scored_keys), np.concatenate(scored_pmi), np.concatenate(scored_n)
        order = np.argsort(-allp, kind="stable")[:top_k]
        table = {n: np.sort(allk[order][alln[order] == n]) for n in range(2, max_n + 1)}
        n_table = len(order)
    else:
        table, n_table = {}, 0
    # merge: longest first; within a length, an overlap with an earlier match drops the later one
    covered = np.zeros(m, dtype=bool)
    unit = np.arange(m)
    merged_words = 0
    for n in range(max_n, 1, -1):
        if n not in table or not len(table[n]):
            continue
        g, ok = grams[n]
        match = ok & np.isin(g, table[n])
        cov_cum = np.concatenate([[0], np.cumsum(covered)])
        idx = np.arange(m)
        end = np.minimum(idx + n, m)
        span_cov = (cov_cum[end] - cov_cum[idx]) > 0  # a word of the span is in a longer match already
        cand = match & ~span_cov
        earlier = np.zeros(m, dtype=bool)
        for j in range(1, n):
            earlier[j:] |= cand[:-j]
        acc = cand & ~earlier
        for j in range(n):
            tgt = np.nonzero(acc)[0] + j
            covered[tgt] = True
            unit[tgt] = np.nonzero(acc)[0]
        merged_words += int(acc.sum()) * n
    unit_start = unit == np.arange(m)
    # renumber per block from 0
    new_id = np.cumsum(unit_start) - 1  # global unit index, per word
    block_first_unit = np.zeros(n_blocks, dtype=np.int64)
    if m:
        first_word_of_block = np.searchsorted(blk, np.arange(n_blocks))
        has = first_word_of_block < m
        block_first_unit[has] = new_id[first_word_of_block[has]]
    per_word = new_id[unit] - block_first_unit[blk]
    out = np.full(n_blocks * length, -1, dtype=np.int32)
    tw = tok_word >= 0
    out[tw] = per_word[tok_word[tw]]
    report = {"ngrams_in_table": int(n_table), "words": int(m), "words_in_pmi_units": int(merged_words),
              "share_of_words_in_pmi_units": merged_words / max(m, 1),
              "table_by_n": {int(n): int(len(v)) for n, v in table.items() if len(v)}}
    return out.reshape(n_blocks, length), report


def cached_pmi_units(d, t, cache_dir: str, tok, train: dict, pmi) -> tuple[dict, dict]:
    """``mask.unit=pmi``: the training blocks (``train``) with their ``word_ids`` replaced by PMI units, computed once
    per corpus, tokenizer, block shape and ``mask.pmi.*`` (``pmi``) and cached under ``<cache_dir>/pmi_units/``."""
    import json
    from pathlib import Path

    import torch

    from mlmlab.data.cache import cached_file, plain
    from mlmlab.data.vocab_stats import train_blocks_key

    key = {**train_blocks_key(d, t, tok, train), "pmi": plain(pmi), "pmi_version": 1}

    def build(tmp: Path) -> None:
        tmp.mkdir()
        ids, report = pmi_units(train["input_ids"].numpy(), train["word_ids"].numpy(), pmi.max_n, pmi.min_count,
                                pmi.top_k)
        np.save(tmp / "word_ids.npy", ids)
        (tmp / "report.json").write_text(json.dumps(report))

    where = cached_file(cache_dir, "pmi_units", key, "units", build)
    blocks = {**train, "word_ids": torch.from_numpy(np.load(where / "word_ids.npy", mmap_mode="c"))}
    return blocks, json.loads((where / "report.json").read_text())
