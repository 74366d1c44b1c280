"""Training against position and wording bias: CORD, PS-GRPO and MoI distillation.

Each method is a config dataclass beside its trainer, the TRL way:

* :mod:`ragkit.training.cord`: ``CORDConfig`` (a ``transformers.TrainingArguments``) and
  ``CORDTrainer`` (a ``transformers.Trainer``);
* :mod:`ragkit.training.psgrpo`: ``PSGRPOConfig`` (a ``trl.GRPOConfig``) and ``PSGRPOTrainer``
  (a ``trl.GRPOTrainer``; importing it needs ``pip install "ragkit[train]"``);
* :mod:`ragkit.training.distill`: MoI labels -> a cross-encoder reranker.

Shared parts: :mod:`~ragkit.training.models` (the one model loader, LoRA),
:mod:`~ragkit.training.config` (config files, unknown keys, warm-up ratio, resume checks) and
:mod:`~ragkit.training.checkpoint` (run folders, checkpoint checks, the final model's atomic save).
"""
