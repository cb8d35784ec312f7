"""Typed errors of the student package: each names what was wrong and where."""

from __future__ import annotations


class StudentError(Exception):
    """Base class of every student error."""


class StudentConfigError(StudentError, ValueError):
    """An invalid ``StudentConfig`` value or config file."""


class StudentModelFileError(StudentError, OSError):
    """A saved student directory is missing a file, or a file is corrupt or does not fit the model."""


class BaseModelMismatchError(StudentError):
    """The saved adapter and head were trained on a different base model than the one configured."""


class ContextOverflowError(StudentError, ValueError):
    """A prompt cannot be shortened enough to fit the context window."""


class PromptTemplateError(StudentError, ValueError):
    """The tokenizer's chat template or the prompt messages are not usable for the student."""


class SceneVectorError(StudentError, ValueError):
    """A student whose head reads the scene vector got none, or one of another length."""
