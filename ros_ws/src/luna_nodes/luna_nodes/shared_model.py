"""The student model shared by ``decision_inference`` and ``explainer``: their model parameters and one
heuristic system (student + prompt manager + memory bank, built by ``luna_core.stack``) per process."""

from __future__ import annotations

import threading

from luna_core.heuristic import HeuristicSystem
from luna_core.lessons import DEFAULT_LESSON_WEIGHT
from luna_core.stack import HeuristicStackConfig, build_heuristic_system
from luna_nodes.params import ParamSpec

MODEL_PARAMS = [
    ParamSpec("student_model", str, "", "Folder of the trained student (adapter + head); empty = bundled."),
    ParamSpec("base_model", str, "", "Base LM folder or packaged name overriding the student's saved base "
              "(e.g. a local Qwen3-1.7B copy on a vehicle); must be the base it was trained on."),
    ParamSpec("memory_bank", str, "", "Memory bank directory; empty = the live bank in $LUNA_DATA (seeded from "
              "the bundled one); 'none' = no retrieval."),
    ParamSpec("device", str, "auto", "Torch device.", choices=("auto", "cpu", "cuda")),
    ParamSpec("autocast", str, "", "The base model's matrix products in this dtype (torch autocast; weights, "
              "norms and residual stream stay as loaded); empty = the student's own (none). bfloat16 on a CPU "
              "with AVX512-BF16 or AMX: faster decisions, probabilities within a few hundredths of float32's "
              "(docs/benchmarks.md).", choices=("", "none", "bfloat16")),
    ParamSpec("max_context_tokens", int, 0, "Prompt budget of the student in tokens; 0 = the one it was "
              "trained with. A longer prompt drops retrieved examples (least similar first), then the "
              "farthest objects; never the instructions, the task or the answer format.", min=0),
    ParamSpec("k", int, 3, "Retrieved memory items per decision (K).", min=0, max=10),
    ParamSpec("gamma_p", float, 0.1, "Candidate-set threshold gamma_p (Eq. 19).", min=0.0, max=1.0),
    ParamSpec("retrieval_margin", float, 0.005, "Keep the previous decision's retrieved items while their mean "
              "cosine similarity is within this of the best K's (their KV cache is reused); 0 = always the "
              "top K.", min=0.0, max=1.0),
    ParamSpec("min_similarity", float, -1.0, "Retrieved items whose cosine similarity to the scene is below this "
              "are not shown: a scene far from every item decides with fewer examples or none; -1 = every "
              "retrieved item (the paper's).", min=-1.0, max=1.0),
    ParamSpec("lesson_weight", float, DEFAULT_LESSON_WEIGHT, "Weight w of the retrieved reflection items' "
              "recommended decisions in the published distribution, pi' = (1 - w) pi_hat + w q "
              "(luna_core.lessons); with w > 0 a reflection item is used only where the scene has its cause; 0 = the "
              "paper's behaviour: every retrieved reflection item is only an example in the prompt.",
              min=0.0, max=1.0),
]


def model_key(params: dict) -> tuple:
    """The model parameters' values: what a loaded heuristic system depends on."""
    return tuple(params[spec.name] for spec in MODEL_PARAMS)


class SharedHeuristic:
    """One HeuristicSystem per process, loaded on first use by whichever node configures first (in the
    composed process: decision_inference, so its model parameters apply). ``error`` keeps why the last
    load failed (every node sharing it reports it), None once one succeeded.

    A standby process ``preload``s it before its nodes exist; the first ``get`` then takes it if the
    node's model parameters are those it was preloaded with (else loads anew), and first reads what
    reflection appended to the bank since, so the node decides on the bank as it is at configure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.system: HeuristicSystem | None = None
        self.error: str | None = None
        self._preloaded: tuple | None = None  # model_key of a preloaded system not yet taken by a node
        self.from_standby = False  # the system in use was preloaded by the standby (for the log)

    def preload(self, params: dict) -> None:
        self.get(params)
        self._preloaded = model_key(params)

    def get(self, params: dict) -> HeuristicSystem:
        with self._lock:
            if self._preloaded is not None:
                if self._preloaded != model_key(params):
                    self.system = None
                elif self.system is not None:
                    self.system.refresh_memory()
                    self.from_standby = True
                self._preloaded = None
            if self.system is None:
                try:
                    self.system = load_heuristic(params)
                except Exception as exc:  # noqa: BLE001 - recorded for diagnostics, then raised as it was
                    self.error = f"cannot load the heuristic system: {exc}"
                    raise
                self.error = None
            return self.system


def heuristic_config(params: dict) -> HeuristicStackConfig:
    """The node's model parameters as the stack's config ("" bank = the live one the vehicle learns into)."""
    return HeuristicStackConfig(student=params["student_model"], base_model=params["base_model"],
                                memory_bank=params["memory_bank"], default_bank="live", device=params["device"],
                                autocast=params["autocast"],
                                max_context_tokens=params["max_context_tokens"], k=params["k"],
                                gamma_p=params["gamma_p"], retrieval_margin=params["retrieval_margin"],
                                min_similarity=params["min_similarity"],
                                lesson_weight=params["lesson_weight"])


def load_heuristic(params: dict) -> HeuristicSystem:
    """Student + prompt manager + memory bank from node parameters (raises on missing/corrupt files)."""
    return build_heuristic_system(heuristic_config(params))
