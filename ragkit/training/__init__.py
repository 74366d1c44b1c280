"""Training against position and wording bias: CORD, PS-GRPO and MoI distillation.

Heavy dependencies (``peft``, ``trl``) are imported lazily by each method module; install them
with ``pip install "ragkit[train]"``.
"""
