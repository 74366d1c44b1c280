"""ragkit.generation: RAG prompts, teacher-forced answer scoring and batched generation.

>>> from ragkit.generation import Generator          # doctest: +SKIP
>>> gen = Generator()                                 # embedded SmolLM2-135M-Instruct
>>> gen.score([gen.build_prompt(q, passages)], ["Arthur's Magazine"]).mean
"""

from __future__ import annotations

from ragkit.generation.base import GeneratorLike, OrderingRun, ScoreResult
from ragkit.generation.generator import Generator
from ragkit.generation.loading import load_generator
from ragkit.generation.prompts import TEMPLATES, PromptTemplate, QuestionPromptTemplate, get_template, question_template
from ragkit.generation.remote import RemoteGenerator

__all__ = ["Generator", "RemoteGenerator", "load_generator",
           "GeneratorLike", "OrderingRun", "ScoreResult", "PromptTemplate", "QuestionPromptTemplate", "TEMPLATES",
           "get_template", "question_template"]
