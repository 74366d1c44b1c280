"""ragkit.generation: RAG prompts, teacher-forced answer scoring and batched generation.

>>> from ragkit.generation import Generator          # doctest: +SKIP
>>> gen = Generator()                                 # embedded SmolLM2-135M-Instruct
>>> gen.score([gen.build_prompt(q, passages)], ["Arthur's Magazine"]).mean
"""

from __future__ import annotations

from ragkit.generation.base import GeneratorLike, OrderingRun, ScoreResult
from ragkit.generation.generator import Generator
from ragkit.generation.prompts import TEMPLATES, PromptTemplate, get_template

__all__ = ["Generator", "GeneratorLike", "OrderingRun", "ScoreResult", "PromptTemplate", "TEMPLATES", "get_template"]
