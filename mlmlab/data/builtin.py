"""The built-in offline corpus and downstream tasks: a generated, deterministic "review" language.

Why a generated language: tests and the default run need a corpus that needs no download, is identical on every
machine, and carries structure that masked-language modelling can discover in minutes on a CPU -- and a downstream task
whose labels depend on exactly that structure, so a pretrained encoder measurably beats a randomly initialised one.

The language. Pseudo-words are built from syllables (so WordPiece splits the rarer ones into several pieces and
whole-word ids matter). A document is a short review with a latent *topic* (one of ``n_topics``) and a latent
*polarity* (positive / negative). Its nouns and topic verbs come from the topic's lists, its opinion adjectives and
verbs from the polarity's lists; neutral adjectives and English function words fill the templates. Word choice within
a list is Zipfian. Nothing in a word's spelling says what class it belongs to; the evidence is distributional: which
words co-occur inside documents, and -- the part a small encoder learns within minutes -- local cues: in unlabelled
text an adjective is usually modified by one of its polarity's adverbs ("<pos-adverb> <adj>") and a noun is usually
preceded by one of its topic's measure words ("the <clf> <noun>"). Predicting a masked adjective (or adverb) from its
neighbour forces the MLM to give all adjectives of one polarity similar representations; same for nouns and topics.

The tasks. ``builtin_sentiment`` (label = polarity) and ``builtin_topic`` (label = topic) are short reviews whose
labelled training examples use only the *seen* half of the opinion words (resp. nouns), while the evaluation split uses
only the *held-out* half; task examples contain no cue words (no polar adverbs or verbs, no measure words, no topic
verbs), so the label is carried by the adjectives (resp. nouns) alone. A model fine-tuned from scratch sees no label evidence for held-out words and sits near chance
there; a pretrained encoder has learnt from unlabelled text that held-out words behave like seen words of the same class,
and transfers. The gap between the two is the quantity the harness exists to measure.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "pl", "st", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "l", "k"]

FUNCTION_WORDS = ["the", "a", "this", "it", "was", "is", "and", "but", "i", "my", "so", "with", "of", "very"]
N_POLAR_ADJ = 12  # per polarity; half seen by labelled training data, half held out
N_POLAR_CUE = 3  # per polarity: adverbs that modify that polarity's adjectives ("truly great", "barely fine")
N_POLAR_VERB = 4  # per polarity: document-level cue words ("i loved it")
N_NEUTRAL_ADJ = 30
N_INTENSIFIERS = 6  # neutral adverbs, used with any adjective
N_NOUNS = 16  # per topic; half seen, half held out
N_CLASSIFIERS = 2  # per topic: measure words that precede that topic's nouns ("the <clf> <noun>")
N_TOPIC_VERBS = 4  # per topic
CUE_PROB = 0.85  # how often an adjective / noun in unlabelled text carries its class cue


@dataclass(frozen=True)
class Lexicon:
    pos_adj: tuple[str, ...]
    neg_adj: tuple[str, ...]
    pos_cue: tuple[str, ...]
    neg_cue: tuple[str, ...]
    pos_verb: tuple[str, ...]
    neg_verb: tuple[str, ...]
    neutral_adj: tuple[str, ...]
    intensifiers: tuple[str, ...]
    nouns: tuple[tuple[str, ...], ...]  # [topic][i]
    classifiers: tuple[tuple[str, ...], ...]
    topic_verbs: tuple[tuple[str, ...], ...]

    def polar_adj(self, polarity: int) -> tuple[str, ...]:
        return self.pos_adj if polarity == 1 else self.neg_adj

    def polar_cue(self, polarity: int) -> tuple[str, ...]:
        return self.pos_cue if polarity == 1 else self.neg_cue

    def polar_verb(self, polarity: int) -> tuple[str, ...]:
        return self.pos_verb if polarity == 1 else self.neg_verb


@lru_cache(maxsize=8)
def make_lexicon(seed: int, n_topics: int) -> Lexicon:
    """Disjoint pseudo-word lists for every word class, deterministic in (seed, n_topics)."""
    rng = random.Random(f"lexicon/{seed}/{n_topics}")
    used = set(FUNCTION_WORDS)

    def word() -> str:
        while True:
            n_syll = rng.choice([1, 2, 2, 2, 3, 3])
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n_syll)) + rng.choice(_CODAS)
            if w not in used and len(w) >= 3:
                used.add(w)
                return w

    def words(n: int) -> tuple[str, ...]:
        return tuple(word() for _ in range(n))

    return Lexicon(
        pos_adj=words(N_POLAR_ADJ),
        neg_adj=words(N_POLAR_ADJ),
        pos_cue=words(N_POLAR_CUE),
        neg_cue=words(N_POLAR_CUE),
        pos_verb=words(N_POLAR_VERB),
        neg_verb=words(N_POLAR_VERB),
        neutral_adj=words(N_NEUTRAL_ADJ),
        intensifiers=words(N_INTENSIFIERS),
        nouns=tuple(words(N_NOUNS) for _ in range(n_topics)),
        classifiers=tuple(words(N_CLASSIFIERS) for _ in range(n_topics)),
        topic_verbs=tuple(words(N_TOPIC_VERBS) for _ in range(n_topics)),
    )


def _zipf_weights(n: int, exponent: float = 0.7) -> list[float]:
    return [1.0 / (r + 1) ** exponent for r in range(n)]


def _seen(words: tuple[str, ...]) -> tuple[str, ...]:
    """The half of a word list that labelled training data may use (every other rank: frequent and rare alike)."""
    return words[0::2]


def _held_out(words: tuple[str, ...]) -> tuple[str, ...]:
    return words[1::2]


class _Writer:
    """Draws sentences for one (topic, polarity) document.

    ``cues=True`` (unlabelled corpus): adjectives are usually modified by their polarity's adverbs and nouns preceded by
    their topic's measure words -- the local, first-order evidence from which MLM learns each word's class quickly.
    ``cues=False`` (task examples): only neutral adverbs and no measure words, so the label is carried by the
    adjectives / nouns alone.
    """

    def __init__(self, rng: random.Random, lex: Lexicon, topic: int, polarity: int, nouns, adjs, cues: bool):
        self.rng, self.lex, self.cues = rng, lex, cues
        self.nouns, self.adjs = nouns, adjs
        self.pcues, self.verbs = lex.polar_cue(polarity), lex.polar_verb(polarity)
        self.clfs, self.tverbs = lex.classifiers[topic], lex.topic_verbs[topic]
        self._w = {id(x): _zipf_weights(len(x)) for x in (nouns, adjs, self.tverbs, lex.neutral_adj)}

    def pick(self, words) -> str:
        return self.rng.choices(words, weights=self._w[id(words)])[0] if id(words) in self._w else self.rng.choice(words)

    def adv(self) -> str:
        cue = self.cues and self.rng.random() < CUE_PROB
        return self.rng.choice(self.pcues if cue else self.lex.intensifiers)

    def noun(self) -> str:
        n = self.pick(self.nouns)
        if self.cues and self.rng.random() < CUE_PROB:
            return f"{self.rng.choice(self.clfs)} {n}"
        return n

    def opinion(self) -> str:
        n, a, p = self.noun(), self.pick(self.adjs), self.pick
        return self.rng.choice(
            [
                f"the {n} was {self.adv()} {a} .",
                f"{self.adv()} {a} {n} .",
                f"it is a {self.adv()} {a} and {p(self.lex.neutral_adj)} {n} .",
                f"my {n} was so {a} , {self.adv()} {p(self.adjs)} .",
            ]
        )

    def verb_opinion(self) -> str:
        v, n, a = self.rng.choice(self.verbs), self.noun(), self.pick(self.adjs)
        return self.rng.choice(
            [
                f"i {v} this {n} , so {self.adv()} {a} .",
                f"{self.adv()} {a} {n} , i {v} it .",
                f"i {v} the {a} {n} and i {self.rng.choice(self.verbs)} it .",
            ]
        )

    def neutral(self) -> str:
        n1, n2, v = self.noun(), self.noun(), self.pick(self.tverbs)
        adj = self.pick(self.lex.neutral_adj)
        return self.rng.choice(
            [
                f"the {adj} {n1} {v} the {n2} .",
                f"it {v} a {n1} with the {n2} .",
                f"this {n1} {v} my {adj} {n2} .",
            ]
        )


def generate_corpus(n_docs: int, seed: int, n_topics: int = 8, lexicon_seed: int = 0) -> list[str]:
    """Unlabelled documents of the built-in language; ``seed`` picks the documents, ``lexicon_seed`` the words."""
    lex = make_lexicon(lexicon_seed, n_topics)
    rng = random.Random(f"corpus/{seed}")
    docs = []
    for _ in range(n_docs):
        topic, polarity = rng.randrange(n_topics), rng.randrange(2)
        w = _Writer(rng, lex, topic, polarity, lex.nouns[topic], lex.polar_adj(polarity), cues=True)
        kinds = [w.opinion, w.verb_opinion, w.neutral]
        sentences = [rng.choices(kinds, weights=[3, 3, 1])[0]() for _ in range(rng.randint(3, 7))]
        docs.append(" ".join(sentences))
    return docs


TASK_NAMES = ("builtin_sentiment", "builtin_topic")


def generate_task(name: str, split: str, n: int, seed: int, n_topics: int = 8, lexicon_seed: int = 0):
    """Labelled examples ``[{"text": str, "label": int}]`` for a built-in task.

    ``split="train"`` draws the label-bearing words from the seen half of their lists, ``split="test"`` from the
    held-out half (see module docstring). Class cues (polar adverbs and verbs, measure words, topic verbs) never appear
    in task examples, and the other class of words (nouns for sentiment, adjectives for topic) is drawn from its full
    list in both splits, so it carries no label information.
    """
    if name not in TASK_NAMES:
        raise ValueError(f"unknown built-in task {name!r}; allowed: {', '.join(TASK_NAMES)}")
    if split not in ("train", "test"):
        raise ValueError(f"unknown split {split!r} for task {name!r}; allowed: train, test")
    lex = make_lexicon(lexicon_seed, n_topics)
    part = _seen if split == "train" else _held_out
    rng = random.Random(f"task/{name}/{split}/{seed}")
    out = []
    for _ in range(n):
        topic, polarity = rng.randrange(n_topics), rng.randrange(2)
        if name == "builtin_sentiment":
            label, nouns, adjs = polarity, lex.nouns[topic], part(lex.polar_adj(polarity))
        else:
            label, nouns, adjs = topic, part(lex.nouns[topic]), lex.polar_adj(polarity)
        w = _Writer(rng, lex, topic, polarity, nouns, adjs, cues=False)
        sentences = [w.opinion() for _ in range(rng.randint(1, 2))]
        out.append({"text": " ".join(sentences), "label": label})
    return out


def task_num_labels(name: str, n_topics: int = 8) -> int:
    return 2 if name == "builtin_sentiment" else n_topics
