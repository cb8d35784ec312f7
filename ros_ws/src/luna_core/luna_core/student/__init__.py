"""The dual-head student (LUNA-AD Sec. III-C): LoRA language model + decision-probability head."""

from luna_core.student.config import StudentConfig
from luna_core.student.context import FittedPrompt, PromptEncoder
from luna_core.student.errors import (BaseModelMismatchError, ContextOverflowError, PromptTemplateError,
                                      SceneVectorError, StudentConfigError, StudentError, StudentModelFileError)
from luna_core.student.model import DualHeadStudent, Explanation, PredictLatency

__all__ = ["BaseModelMismatchError", "ContextOverflowError", "DualHeadStudent", "Explanation",
           "FittedPrompt", "PredictLatency", "PromptEncoder", "PromptTemplateError", "SceneVectorError", "StudentConfig",
           "StudentConfigError", "StudentError", "StudentModelFileError"]
