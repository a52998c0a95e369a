"""Downstream evaluation: for each task, each learning rate of the grid and each fine-tuning seed, fine-tune a fresh
copy of the encoder; choose the lr on validation, report the test split where the task has labelled test data
(otherwise validation, and say so).

Metric keys: ``downstream/<task>/<metric>`` (mean over seeds at the chosen lr), ``..._std`` (sample std), ``..._ci95``
(half-width of the t-distribution 95% interval; with 2+ seeds), ``downstream/<task>/seed_<s>/<metric>`` and
``downstream/score`` (mean over tasks of each task's primary metric). What was reported where (split, chosen lr, the
whole grid) goes to results.json under ``downstream``.

Long inputs: a single text longer than ``max_seq_len`` becomes overlapping windows (``downstream.finetune.stride``
tokens of overlap); each window is a training example with the text's label, and at evaluation the window logits are
averaged. Sentence pairs are truncated, longer side first (as BERT). Token classification (NER) labels the first
sub-token of each word; every word is predicted once, from the window in which it is most central.

The package, by concern: :mod:`.encoding` (examples as inputs), :mod:`.finetuning` (the loop), :mod:`.probes` (linear
probes), :mod:`.minimal_pairs` (zero-shot tasks), :mod:`.scoring` (metrics, intervals over fine-tuning seeds, paired
gains), :mod:`.protocol` (tasks x label budgets x lrs x seeds, the lr choice, the report) and :mod:`.predictions`
(per-item prediction files).
"""

from mlmlab.downstream.encoding import (
                                       IGNORE,
                                       LengthBucketBatches,
                                       collate,
                                       encode_examples,
                                       encode_split,
                                       encode_tokens,
                                       windows,
)
from mlmlab.downstream.finetuning import (
                                       BestOnValidation,
                                       evaluate,
                                       finetune_one,
                                       predict,
                                       predict_logits,
                                       resolve_pooling,
)
from mlmlab.downstream.minimal_pairs import subsample_pairs, zeroshot_task
from mlmlab.downstream.predictions import save_predictions
from mlmlab.downstream.probes import PROBE_CS, pooled_features, probe_task, word_features
from mlmlab.downstream.protocol import (
                                       PROTOCOL_VERSION,
                                       PROTOCOLS,
    Protocol,
                                       check_label_budgets,
                                       curve_evaluator,
                                       label_budgets,
                                       learning_rates,
                                       run_downstream,
                                       run_task,
                                       selection_from_train,
                                       task_runs,
)
from mlmlab.downstream.scoring import classification_metrics, entity_f1, mean_ci95, paired_gain, split_metrics

__all__ = ["IGNORE", "PROBE_CS", "PROTOCOLS", "PROTOCOL_VERSION", "BestOnValidation", "Protocol", "LengthBucketBatches",
           "check_label_budgets", "classification_metrics", "collate", "curve_evaluator", "encode_examples",
           "encode_split", "encode_tokens", "entity_f1", "evaluate", "finetune_one", "label_budgets", "learning_rates",
           "mean_ci95", "paired_gain", "pooled_features", "predict", "predict_logits", "probe_task", "resolve_pooling",
           "run_downstream", "run_task", "save_predictions", "selection_from_train", "split_metrics",
           "subsample_pairs", "task_runs", "windows", "word_features", "zeroshot_task"]
