"""``StudentConfig``: everything needed to rebuild the dual-head student (LUNA-AD Sec. III-C, IV-B)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from luna_core.student.errors import StudentConfigError
from luna_core.geometry import AUTOCASTS
from luna_core.types import NUM_ACTIONS

#: How a prompt that does not fit ``max_context_tokens`` is shortened (see ``student.context``).
TRUNCATION_POLICIES = ("drop_examples_then_objects",)
PROMPT_FORMS = ("compact", "brief", "rounded")  # how the traffic states read (student.context)
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "nf4")


@dataclass
class StudentConfig:
    """Hyper-parameters of the student; saved as JSON next to the adapter and head weights.

    ``base_model`` is a packaged model name known to ``luna_core.model_cache`` (default
    SmolLM2-135M-Instruct) or a local HF folder (e.g. Qwen3-1.7B on a vehicle).
    """

    base_model: str = "smollm2-135m-instruct"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    head_hidden: int = 1024
    # 0: the head reads h_{i*} only (Eq. 16); else also this many scene values, one of the parts of
    # ``luna_core.scene.HEAD_SCENE_PARTS`` (all of xi_t, its ego-and-road part, or that with the objects'
    # timing; ``DecisionHead``), which ``predict`` then needs.
    head_scene_dim: int = 0
    # An ensemble of heads on the same h_{i*} (``student.head.HeadEnsemble``): the scene values each member
    # reads, as head_scene_dim (0 = h_{i*} only); head_scene_dim is then the ensemble's, all of the values
    # where any member reads some, else 0. Empty: one head.
    head_members: list[int] = field(default_factory=list)
    num_actions: int = NUM_ACTIONS
    max_context_tokens: int = 2048  # prompt budget of predict(); long prompts are shortened first
    truncation_policy: str = "drop_examples_then_objects"
    explanation_max_new_tokens: int = 256
    explanation_prefill_chunk: int = 64  # prompt tokens per explanation step (a decision waits <= 1 step)
    explanation_max_yield: float = 1.0  # s an explanation step waits for pending decisions at most
    device: str = "auto"  # "auto" = CUDA when available, else CPU
    dtype: str = "auto"  # "auto" = bfloat16 on CUDA, float32 on CPU
    # The base's matrix products in this dtype (torch autocast) while its weights, norms and residual
    # stream keep ``dtype``: on a CPU with AVX512-BF16 or AMX about half the time of a float32 pass, at
    # a tenth of the output change of bfloat16 weights (docs/benchmarks.md).
    autocast: str = "none"
    quantization: str = "none"  # "nf4" = bitsandbytes 4-bit base (CUDA)
    reuse_prefix_cache: bool = True  # keep the KV cache of the prefix shared with the previous prompt
    # The prompt's length (student.context): objects kept in each retrieved example (those its answer names
    # and this many nearest; 0 = all), nearest objects kept in the current query (0 = all), and the form of
    # the traffic states ("compact"; "brief": fixed words stated once in the system message; "rounded": brief,
    # with the object lines' numbers in whole units).
    example_objects: int = 0
    query_objects: int = 0
    prompt_form: str = "compact"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> StudentConfigError:
            return StudentConfigError(f"StudentConfig.{name}: {why}")

        if not self.base_model:
            raise bad("base_model", "empty")
        for name in ("lora_r", "lora_alpha", "head_hidden", "max_context_tokens",
                     "explanation_max_new_tokens", "explanation_prefill_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad(name, f"must be a positive integer, got {value!r}")
        if not isinstance(self.head_scene_dim, int) or isinstance(self.head_scene_dim, bool) \
                or self.head_scene_dim < 0:
            raise bad("head_scene_dim", f"must be an integer >= 0 (0 = h_i* only), got {self.head_scene_dim!r}")
        if not isinstance(self.head_members, list) or len(self.head_members) == 1 \
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in self.head_members):
            raise bad("head_members", f"must be empty (one head) or a list of at least 2 integers >= 0, "
                                      f"got {self.head_members!r}")
        if self.head_members and self.head_scene_dim != self.ensemble_scene_dim(self.head_members):
            raise bad("head_scene_dim", f"an ensemble whose members read {self.head_members} scene values reads "
                                        f"{self.ensemble_scene_dim(self.head_members)}, got {self.head_scene_dim}")
        for name in ("example_objects", "query_objects"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise bad(name, f"must be an integer >= 0 (0 = every object), got {value!r}")
        if not isinstance(self.explanation_max_yield, (int, float)) or not self.explanation_max_yield > 0.0:
            raise bad("explanation_max_yield", f"must be a positive number of seconds, got "
                                               f"{self.explanation_max_yield!r}")
        if self.num_actions != NUM_ACTIONS:
            raise bad("num_actions", f"must be {NUM_ACTIONS} (the action space), got {self.num_actions}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise bad("lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        if not self.lora_targets or not all(isinstance(t, str) and t for t in self.lora_targets):
            raise bad("lora_targets", f"must be a non-empty list of module names, got {self.lora_targets!r}")
        for name, allowed in (("truncation_policy", TRUNCATION_POLICIES), ("device", DEVICES),
                              ("dtype", DTYPES), ("quantization", QUANTIZATIONS), ("autocast", AUTOCASTS),
                              ("prompt_form", PROMPT_FORMS)):
            if getattr(self, name) not in allowed:
                raise bad(name, f"{getattr(self, name)!r} is not one of {', '.join(allowed)}")

    @staticmethod
    def ensemble_scene_dim(head_members: list[int]) -> int:
        """The scene values an ensemble of heads reading ``head_members`` reads: all of them where a member
        reads some, else 0."""
        from luna_core.scene import HEAD_SCENE_VALUES_DIM

        return HEAD_SCENE_VALUES_DIM if any(head_members) else 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str = "config") -> "StudentConfig":
        if not isinstance(data, dict):
            raise StudentConfigError(f"{where}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise StudentConfigError(f"{where}: unknown StudentConfig keys {unknown}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise StudentConfigError(f"{where}: {exc}") from exc

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> "StudentConfig":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise StudentConfigError(f"{path}: missing") from exc
        except (OSError, ValueError) as exc:
            raise StudentConfigError(f"{path}: unreadable JSON ({exc})") from exc
        return cls.from_dict(data, where=str(path))
